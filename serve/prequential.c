/* prequential.c - see prequential.h. */
#include "serve/prequential.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void mfs_preq_init(mfs_preq_t *p, uint64_t window)
{
	memset(p, 0, sizeof *p);
	p->window = window ? window : 1;
}

int mfs_preq_add(mfs_preq_t *p, double sse, uint64_t n)
{
	if (!n || !isfinite(sse))
		return 0;
	p->sse_total += sse;
	p->n_total += n;
	p->sse_int += sse;
	p->n_int += n;
	if (p->count == p->cap) { /* grow the ring, unrolled so the oldest stays at head */
		size_t nc = p->cap ? 2 * p->cap : 64;
		struct mfs_preq_piece *r = malloc(nc * sizeof *r);
		if (!r)
			return ENOMEM;
		for (size_t j = 0; j < p->count; j++)
			r[j] = p->ring[(p->head + j) % p->cap];
		free(p->ring);
		p->ring = r;
		p->cap = nc;
		p->head = 0;
	}
	p->ring[(p->head + p->count++) % p->cap] = (struct mfs_preq_piece){sse, n};
	p->sse_win += sse;
	p->n_win += n;
	/* drop the oldest pieces while the rest still covers the window */
	while (p->count > 1 && p->n_win - p->ring[p->head].n >= p->window) {
		p->sse_win -= p->ring[p->head].sse;
		p->n_win -= p->ring[p->head].n;
		p->head = (p->head + 1) % p->cap;
		p->count--;
	}
	return 0;
}

static double rmse_of(double sse, uint64_t n, uint64_t *out)
{
	if (out)
		*out = n;
	return n ? sqrt((sse > 0 ? sse : 0) / (double)n) : NAN;
}

double mfs_preq_window_rmse(const mfs_preq_t *p, uint64_t *n) { return rmse_of(p->sse_win, p->n_win, n); }
double mfs_preq_cumulative_rmse(const mfs_preq_t *p, uint64_t *n) { return rmse_of(p->sse_total, p->n_total, n); }
double mfs_preq_interval_rmse(const mfs_preq_t *p, uint64_t *n) { return rmse_of(p->sse_int, p->n_int, n); }

void mfs_preq_interval_reset(mfs_preq_t *p)
{
	p->sse_int = 0;
	p->n_int = 0;
}

void mfs_preq_resume(mfs_preq_t *p, double rmse, uint64_t n)
{
	if (!n || !isfinite(rmse))
		return;
	p->sse_total = rmse * rmse * (double)n;
	p->n_total = n;
}

void mfs_preq_free(mfs_preq_t *p)
{
	free(p->ring);
	p->ring = NULL;
	p->cap = p->count = p->head = 0;
}
