/* touched.c - see touched.h. */
#include "model_store/touched.h"

#include "common/grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mfs_touched_mark(mfs_touched_t *t, uint32_t row)
{
	size_t w = row / 64;
	if (w >= t->nwords) {
		size_t old = t->nwords;
		if (mfs_grow((void **)&t->bits, &t->nwords, w + 1, sizeof *t->bits))
			return ENOMEM;
		memset(t->bits + old, 0, (t->nwords - old) * sizeof *t->bits);
	}
	uint64_t bit = (uint64_t)1 << (row % 64);
	if (t->bits[w] & bit)
		return 0;
	if (mfs_grow((void **)&t->rows, &t->cap, t->n + 1, sizeof *t->rows))
		return ENOMEM;
	t->bits[w] |= bit;
	t->rows[t->n++] = row;
	return 0;
}

void mfs_touched_clear(mfs_touched_t *t)
{
	for (size_t j = 0; j < t->n; j++)
		t->bits[t->rows[j] / 64] = 0;
	t->n = 0;
}

void mfs_touched_free(mfs_touched_t *t)
{
	free(t->bits);
	free(t->rows);
	memset(t, 0, sizeof *t);
}
