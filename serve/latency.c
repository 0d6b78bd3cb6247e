/* latency.c - see latency.h. */
#include "serve/latency.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common/grow.h"

int mfs_hist_init(mfs_hist_t *h, int nb, double width_ms)
{
	h->nb = nb;
	h->width_ms = width_ms;
	h->n = 0;
	h->b = calloc((size_t)nb, sizeof *h->b);
	h->lb = calloc(MFS_HIST_LOG_BUCKETS + 1, sizeof *h->lb); /* + one for beyond them all */
	if (h->b && h->lb)
		return 0;
	mfs_hist_free(h);
	return ENOMEM;
}

void mfs_hist_free(mfs_hist_t *h)
{
	free(h->b);
	free(h->lb);
	h->b = NULL;
	h->lb = NULL;
}

void mfs_hist_add(mfs_hist_t *h, double ms)
{
	double x = ms / h->width_ms;
	h->n++;
	if (!(x >= h->nb - 1)) { /* (NaN too: bucket 0) */
		h->b[x > 0 ? (int)x : 0]++;
		return;
	}
	const double g = log(x / (h->nb - 1)) / log(1.02);
	h->lb[g < MFS_HIST_LOG_BUCKETS ? (int)g : MFS_HIST_LOG_BUCKETS]++;
}

double mfs_hist_quantile(const mfs_hist_t *h, double q)
{
	if (!h->n)
		return NAN;
	uint64_t want = (uint64_t)ceil(q * (double)h->n), acc = 0;
	if (want < 1)
		want = 1;
	for (int k = 0; k < h->nb - 1; k++) {
		acc += h->b[k];
		if (acc >= want)
			return ((double)k + 0.5) * h->width_ms;
	}
	for (int k = 0; k < MFS_HIST_LOG_BUCKETS; k++) {
		acc += h->lb[k];
		if (acc >= want)
			return (h->nb - 1) * h->width_ms * pow(1.02, k + 0.5);
	}
	return INFINITY;
}

int mfs_pending_push(mfs_pending_t *q, const int64_t *ts, size_t n, uint64_t ticket)
{
	if (q->head == q->n) /* drained: start again at the front */
		q->head = q->n = 0;
	if (mfs_grow((void **)&q->p, &q->cap, q->n + n, sizeof *q->p))
		return ENOMEM;
	for (size_t j = 0; j < n; j++)
		q->p[q->n++] = (struct mfs_pending_ts){ts[j], ticket};
	return 0;
}

void mfs_pending_drain(mfs_pending_t *q, uint64_t applied, double now_ms, mfs_hist_t *h,
                       void (*fn)(void *ctx, double seconds), void *ctx)
{
	while (q->head < q->n && q->p[q->head].ticket <= applied) {
		double d = now_ms - (double)q->p[q->head++].ts;
		mfs_hist_add(h, d);
		if (fn)
			fn(ctx, (d < 0 ? 0 : d) / 1000.0);
	}
}

void mfs_pending_free(mfs_pending_t *q)
{
	free(q->p);
	*q = (mfs_pending_t){0};
}
