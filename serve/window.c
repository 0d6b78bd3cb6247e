/* window.c - see window.h. */
#include "serve/window.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
		memcpy(w->u + at, u, run * sizeof *u);
		memcpy(w->i + at, i, run * sizeof *i);
		memcpy(w->r + at, r, run * sizeof *r);
		memset(w->seen + at, 0, run * sizeof *w->seen);
		u += run;
		i += run;
		r += run;
		n -= run;
	}
	return 0;
}

void mfs_window_free(mfs_window_t *w)
{
	free(w->u);
	free(w->i);
	free(w->r);
	free(w->seen);
	*w = (mfs_window_t){0};
}
