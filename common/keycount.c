/* keycount.c - see keycount.h. */
#include "common/keycount.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mfs_keycount_fill(mfs_keycount_t *t, const uint32_t *keys, size_t n)
{
	size_t slots = 1024;
	while (slots < 2 * n)
		slots *= 2;
	if (slots > t->cap) {
		free(t->slot);
		t->slot = calloc(slots, sizeof *t->slot);
		t->cap = t->slot ? slots : 0;
		t->mask = t->slot ? slots - 1 : 0;
		if (!t->slot)
			return ENOMEM;
	} else {
		/* a smaller batch uses the front of the table: slots and mask follow the batch, so
		 * a table that once grew for a large batch does not slow the small ones' clears */
		memset(t->slot, 0, (t->mask + 1) * sizeof *t->slot);
		t->mask = slots - 1;
	}
	for (size_t j = 0; j < n; j++) {
		const uint32_t key = keys[j];
		for (size_t s = ((uint64_t)key * 0x9E3779B97F4A7C15ull >> 32) & t->mask;; s = (s + 1) & t->mask) {
			const uint64_t v = t->slot[s];
			if (!v) {
				t->slot[s] = (uint64_t)key << 32 | 1;
				break;
			}
			if ((uint32_t)(v >> 32) == key) {
				t->slot[s] = v + 1;
				break;
			}
		}
	}
	return 0;
}

int mfs_keycount_bound(mfs_keycount_t *t, const uint32_t *keys, size_t n, uint32_t *bound)
{
	*bound = 0;
	if (!t->bucket && !(t->bucket = malloc(MFS_KEYCOUNT_BUCKETS * sizeof *t->bucket)))
		return ENOMEM;
	uint32_t *c = t->bucket, top = 0;
	memset(c, 0, MFS_KEYCOUNT_BUCKETS * sizeof *c);
	for (size_t j = 0; j < n; j++) {
		const uint32_t v = ++c[(uint64_t)keys[j] * 0x9E3779B97F4A7C15ull >> (64 - MFS_KEYCOUNT_BUCKET_BITS)];
		top = v > top ? v : top;
	}
	*bound = top;
	return 0;
}

void mfs_keycount_free(mfs_keycount_t *t)
{
	free(t->bucket);
	free(t->slot);
	*t = (mfs_keycount_t){0};
}
