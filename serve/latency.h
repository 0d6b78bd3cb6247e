/* latency.h - latency quantiles of the service without keeping samples.
 *
 * mfs_hist_t: a histogram of nb-1 fixed-width buckets, then buckets 2 % wide (geometric) from
 * there up to about 16 days, so a backlog's latencies of minutes are told as they are, not as
 * the top of the fixed range; its quantile is the middle of the bucket where it falls (error
 * half a fixed bucket, or 1 % beyond them).
 * mfs_pending_t: message create times waiting for the engine to apply their batch (a FIFO of
 * (create time, ticket)); mfs_pending_drain moves those whose ticket the engine's progress has
 * reached into a histogram (event -> applied latency, docs/METRICS.md).
 * DESIGN: both are the learner thread's; other threads read quantiles it copied into its stats.
 */
#ifndef MFS_LATENCY_H
#define MFS_LATENCY_H

#include <stddef.h>
#include <stdint.h>

#define MFS_HIST_LOG_BUCKETS 600 /* 1.02^600 ~ 1.4e5 times the fixed range */

typedef struct mfs_hist {
	uint64_t *b;
	int nb;
	double width_ms;
	uint64_t n;
	uint64_t *lb; /* beyond (nb - 1) x width_ms: bucket k holds [top 1.02^k, top 1.02^(k+1)) */
} mfs_hist_t;

/** nb buckets of width_ms each. @return 0 or ENOMEM. */
int mfs_hist_init(mfs_hist_t *h, int nb, double width_ms);
void mfs_hist_free(mfs_hist_t *h);
void mfs_hist_add(mfs_hist_t *h, double ms);
/** The q-quantile in ms (the middle of its bucket); NaN when empty, +inf beyond the last
 *  geometric bucket. */
double mfs_hist_quantile(const mfs_hist_t *h, double q);

typedef struct mfs_pending {
	struct mfs_pending_ts {
		int64_t ts;      /* message create time, ms since the epoch */
		uint64_t ticket; /* applied once the engine's progress reaches it */
	} *p;
	size_t head, n, cap;
} mfs_pending_t;

/** Queue the create times ts[0..n) of a batch that is applied at `ticket`. @return 0 or ENOMEM. */
int mfs_pending_push(mfs_pending_t *q, const int64_t *ts, size_t n, uint64_t ticket);
static inline int mfs_pending_empty(const mfs_pending_t *q) { return q->head == q->n; }
/** Every queued time whose ticket is <= applied: now_ms - ts goes to h and, when fn is not
 *  NULL, to fn(ctx, seconds >= 0). */
void mfs_pending_drain(mfs_pending_t *q, uint64_t applied, double now_ms, mfs_hist_t *h,
                       void (*fn)(void *ctx, double seconds), void *ctx);
void mfs_pending_free(mfs_pending_t *q);

#endif
