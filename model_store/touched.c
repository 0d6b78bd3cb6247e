/* touched.c - see touched.h. */
#include "model_store/touched.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mfs_touched_mark(mfs_touched_t *t, uint32_t row)
{
	size_t w = row / 64;
	if (w >= t->nwords) {
		size_t nw = t->nwords ? t->nwords : 64;
		while (nw <= w)
			nw *= 2;
		uint64_t *b = realloc(t->bits, nw * sizeof *b);
		if (!b)
			return ENOMEM;
		memset(b + t->nwords, 0, (nw - t->nwords) * sizeof *b);
		t->bits = b;
		t->nwords = nw;
	}
	uint64_t bit = (uint64_t)1 << (row % 64);
	if (t->bits[w] & bit)
		return 0;
	if (t->n == t->cap) {
		size_t nc = t->cap ? t->cap * 2 : 1024;
		uint32_t *r = realloc(t->rows, nc * sizeof *r);
		if (!r)
			return ENOMEM;
		t->rows = r;
		t->cap = nc;
	}
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
