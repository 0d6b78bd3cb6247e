/* prequential.h - test-then-train scores of the stream (serve.prequential): every event is
 * scored with the model as it stands before it is learned, and the squared errors are kept
 * three ways (docs/STREAMING.md, "Accuracy while streaming"):
 *   interval   : since the last snapshot (meta prequential_rmse, as before);
 *   window     : the last serve.prequential_window events (meta prequential_window_rmse),
 *                to the granularity of one scored piece (a batch part);
 *   cumulative : every event since the model began (meta prequential_cumulative_rmse), kept
 *                across restarts through the snapshot.
 */
#ifndef MFS_PREQUENTIAL_H
#define MFS_PREQUENTIAL_H

#include <stddef.h>
#include <stdint.h>

typedef struct mfs_preq {
	uint64_t window;            /* events the window covers */
	double sse_total;           /* cumulative */
	uint64_t n_total;
	double sse_int;             /* since the last snapshot */
	uint64_t n_int;
	struct mfs_preq_piece {
		double sse;
		uint64_t n;
	} *ring;                    /* the window's pieces, oldest at head */
	size_t cap, head, count;
	double sse_win;
	uint64_t n_win;
} mfs_preq_t;

/** A window of `window` events (>= 1). */
void mfs_preq_init(mfs_preq_t *p, uint64_t window);
/** n events scored with squared-error sum sse. @return 0 or ENOMEM. */
int mfs_preq_add(mfs_preq_t *p, double sse, uint64_t n);
/** RMSEs (NaN without events) and the events behind them. */
double mfs_preq_window_rmse(const mfs_preq_t *p, uint64_t *n);
double mfs_preq_cumulative_rmse(const mfs_preq_t *p, uint64_t *n);
double mfs_preq_interval_rmse(const mfs_preq_t *p, uint64_t *n);
/** The interval starts again (a snapshot took it). */
void mfs_preq_interval_reset(mfs_preq_t *p);
/** Resume the cumulative score of a loaded snapshot (rmse over n events). */
void mfs_preq_resume(mfs_preq_t *p, double rmse, uint64_t n);
void mfs_preq_free(mfs_preq_t *p);

#endif
