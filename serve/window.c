/* window.c - see window.h. */
#include "serve/window.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "model_store/life.h"

/* Grow the arrays (doubling from 4096, at most cap) to hold `need` ratings. */
static int window_reserve(mfs_window_t *w, size_t need)
{
	if (need <= w->alloc)
		return 0;
	size_t na = w->alloc ? w->alloc * 2 : 4096;
	while (na < need)
		na *= 2;
	if (na > w->cap)
		na = w->cap;
	uint32_t *nu = realloc(w->u, na * sizeof *nu);
	if (nu)
		w->u = nu;
	uint32_t *ni = realloc(w->i, na * sizeof *ni);
	if (ni)
		w->i = ni;
	float *nr = realloc(w->r, na * sizeof *nr);
	if (nr)
		w->r = nr;
	uint8_t *ns = realloc(w->seen, na * sizeof *ns);
	if (ns)
		w->seen = ns;
	if (!nu || !ni || !nr || !ns)
		return ENOMEM;
	if (w->m) {
		uint16_t *ngu = realloc(w->gu, na * sizeof *ngu);
		if (ngu)
			w->gu = ngu;
		uint16_t *ngi = realloc(w->gi, na * sizeof *ngi);
		if (ngi)
			w->gi = ngi;
		if (!ngu || !ngi)
			return ENOMEM;
	}
	w->alloc = na;
	return 0;
}

int mfs_window_add(mfs_window_t *w, const mfs_batch_t *b)
{
	if (w->cap == 0)
		return 0;
	const uint32_t *u = b->u, *i = b->i;
	const float *r = b->r;
	size_t n = b->n;
	while (n) {
		size_t at, run;
		if (w->n < w->cap) { /* filling: append */
			run = n < w->cap - w->n ? n : w->cap - w->n;
			if (window_reserve(w, w->n + run))
				return ENOMEM;
			at = w->n;
			w->n += run;
		} else { /* full: overwrite the oldest, from pos on */
			at = w->pos;
			run = n < w->cap - at ? n : w->cap - at;
			w->pos = (at + run) % w->cap;
		}
		for (size_t j = at; w->stale && j < at + run; j++) /* stale slots overwritten */
			w->stale -= w->u[j] == MFS_ROW_NONE;
		memcpy(w->u + at, u, run * sizeof *u);
		memcpy(w->i + at, i, run * sizeof *i);
		memcpy(w->r + at, r, run * sizeof *r);
		memset(w->seen + at, 0, run * sizeof *w->seen);
		if (w->m && mfs_model_frees(w->m) == 0) { /* no row freed yet: every generation is 0 */
			memset(w->gu + at, 0, run * sizeof *w->gu);
			memset(w->gi + at, 0, run * sizeof *w->gi);
		} else if (w->m) {
			const uint16_t *gu = w->m->gen[0], *gi = w->m->gen[1];
			for (size_t j = 0; j < run; j++) {
				w->gu[at + j] = gu[u[j]];
				w->gi[at + j] = gi[i[j]];
			}
		}
		u += run;
		i += run;
		r += run;
		n -= run;
	}
	return 0;
}

int mfs_window_slot_ok(mfs_window_t *w, size_t j)
{
	if (w->u[j] == MFS_ROW_NONE)
		return 0;
	if (!w->m || mfs_model_frees(w->m) == 0)
		return 1;
	if (w->gu[j] == w->m->gen[0][w->u[j]] && w->gi[j] == w->m->gen[1][w->i[j]])
		return 1;
	w->u[j] = w->i[j] = MFS_ROW_NONE;
	w->stale++;
	return 0;
}

int mfs_window_live(mfs_window_t *w, mfs_batch_t *out)
{
	const uint64_t frees = w->m ? mfs_model_frees(w->m) : 0;
	if (frees != w->checked) { /* rows were freed since the last look: mark what they made stale */
		for (size_t j = 0; j < w->n; j++)
			(void)mfs_window_slot_ok(w, j);
		w->checked = frees;
	}
	if (!w->stale) {
		*out = mfs_window_batch(w);
		return 0;
	}
	if (mfs_grow((void **)&w->lu, &w->lcap, w->n, sizeof *w->lu))
		return ENOMEM;
	uint32_t *li = realloc(w->li, w->lcap * sizeof *li);
	if (li)
		w->li = li;
	float *lr = realloc(w->lr, w->lcap * sizeof *lr);
	if (lr)
		w->lr = lr;
	if (!li || !lr)
		return ENOMEM;
	size_t n = 0;
	for (size_t j = 0; j < w->n; j++)
		if (w->u[j] != MFS_ROW_NONE) {
			w->lu[n] = w->u[j];
			w->li[n] = w->i[j];
			w->lr[n++] = w->r[j];
		}
	*out = (mfs_batch_t){w->lu, w->li, w->lr, n};
	return 0;
}

void mfs_window_free(mfs_window_t *w)
{
	free(w->u);
	free(w->i);
	free(w->r);
	free(w->seen);
	free(w->gu);
	free(w->gi);
	free(w->lu);
	free(w->li);
	free(w->lr);
	*w = (mfs_window_t){0};
}
