/* touched.c - see touched.h. */
#include "model_store/touched.h"

#include "common/grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mfs_touched_mark_many(mfs_touched_t *t, const uint32_t *rows, size_t n)
{
	enum { AHEAD = 16 }; /* rows between a bitmap word's prefetch and its test */
	if (!n)
		return 0;
	uint32_t top = 0;
	for (size_t j = 0; j < n; j++) /* (UINT32_MAX: MFS_ROW_NONE, an id without a row: skipped) */
		top = rows[j] > top && rows[j] != UINT32_MAX ? rows[j] : top;
	const size_t old = t->nwords;
	if (top / 64 >= old) {
		if (mfs_grow((void **)&t->bits, &t->nwords, top / 64 + 1, sizeof *t->bits))
			return ENOMEM;
		memset(t->bits + old, 0, (t->nwords - old) * sizeof *t->bits);
	}
	if (mfs_grow((void **)&t->rows, &t->cap, t->n + n, sizeof *t->rows))
		return ENOMEM;
	/* without a branch on the bit: whether a row is new is as good as random (a batch repeats
	 * rows the last ones touched), and a mispredicted branch costs more than the store */
	uint32_t *out = t->rows;
	size_t k = t->n;
	for (size_t j = 0; j < n; j++) {
		if (j + AHEAD < n && rows[j + AHEAD] != UINT32_MAX)
			__builtin_prefetch(t->bits + rows[j + AHEAD] / 64, 1);
		const uint32_t row = rows[j];
		if (row == UINT32_MAX)
			continue;
		const uint64_t bit = (uint64_t)1 << (row % 64), w = t->bits[row / 64];
		t->bits[row / 64] = w | bit;
		out[k] = row;
		k += (w & bit) == 0;
	}
	t->n = k;
	return 0;
}

int mfs_touched_mark(mfs_touched_t *t, uint32_t row)
{
	return mfs_touched_mark_many(t, &row, 1);
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
