/* keycount.h - how often each 32-bit key occurs in a batch, in a table sized to the batch
 * (open addressing, twice as many slots as keys at least), so that counting the rows of a
 * batch touches memory that fits in a cache however many rows the model has.
 *
 * Used for the hot-row scales of streaming batches (gpu/cuda/sgd.cu, scales_into): a counter
 * per model row meant three random reads per rating over tables of hundreds of MB on a stream
 * of new users. Most batches have no hot row, and mfs_keycount_bound says so first from
 * MFS_KEYCOUNT_BUCKETS counters that fit in a core's first cache (the exact counts take random
 * reads over a table of 16 bytes per key: ~50 ns per rating on this VM).
 */
#ifndef MFS_COMMON_KEYCOUNT_H
#define MFS_COMMON_KEYCOUNT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* (gpu/cuda's host code) */
#endif

#define MFS_KEYCOUNT_BUCKET_BITS 13
#define MFS_KEYCOUNT_BUCKETS (1u << MFS_KEYCOUNT_BUCKET_BITS)

typedef struct mfs_keycount {
	uint64_t *slot;   /* key << 32 | count; 0 = empty (a held key counts at least 1) */
	size_t mask;      /* slots - 1 */
	size_t cap;       /* slots allocated */
	uint32_t *bucket; /* mfs_keycount_bound's counters (MFS_KEYCOUNT_BUCKETS) */
} mfs_keycount_t;

/** *bound = a number no key of keys[0..n) occurs more often than: the largest count of keys
 *  hashed into MFS_KEYCOUNT_BUCKETS buckets (near n / buckets when no key is frequent). Leaves
 *  the exact counts (mfs_keycount_fill) as they were. @return 0 or ENOMEM. */
int mfs_keycount_bound(mfs_keycount_t *t, const uint32_t *keys, size_t n, uint32_t *bound);
/** Count keys[0..n) (any 32-bit values), after the counts of the last fill are forgotten.
 *  @return 0 or ENOMEM (the table empty then). */
int mfs_keycount_fill(mfs_keycount_t *t, const uint32_t *keys, size_t n);
/** The count of key in the last fill (0 when it was not there). */
static inline uint32_t mfs_keycount_get(const mfs_keycount_t *t, uint32_t key)
{
	for (size_t s = ((uint64_t)key * 0x9E3779B97F4A7C15ull >> 32) & t->mask;; s = (s + 1) & t->mask) {
		const uint64_t v = t->slot[s];
		if (!v)
			return 0;
		if ((uint32_t)(v >> 32) == key)
			return (uint32_t)v;
	}
}
void mfs_keycount_free(mfs_keycount_t *t);

#ifdef __cplusplus
}
#endif

#endif
