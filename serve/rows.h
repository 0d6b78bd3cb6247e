/* rows.h - a batch's events to model rows (new ids get initialized rows), and the rows touched
 * since the last snapshot.
 *
 * A large batch is resolved on two threads: the users' side on the rows thread, the items'
 * on the caller's. The two halves of the model share nothing (model_store/store.h), and each
 * side adds its new ids in event order, so the rows are exactly those one thread would give.
 * Below MFS_ROWS_SPLIT_MIN events the hand-over (a condition-variable wake, ~10-50 us) would
 * cost more than it saves: one side of a batch that size is some 100 us of lookups.
 */
#ifndef MFS_ROWS_H
#define MFS_ROWS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "model_store/store.h"
#include "model_store/touched.h"
#include "serve/batcher.h"

#define MFS_ROWS_SPLIT_MIN 4096

typedef struct mfs_rows {
	mfs_model_t *m;
	uint32_t *u, *i;      /* the rows of the last batch's events, in event order */
	size_t cap_u, cap_i;
	mfs_touched_t tu, ti; /* rows touched since the last mfs_touched_clear (the snapshot's) */
	/* the rows thread: the users' side of a large batch, one job at a time */
	pthread_t thread;
	int started, quit, state;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const mfs_ebatch_t *batch;
	int rc;
} mfs_rows_t;

/** Resolve rows of model m. @return 0 or a pthread error. */
int mfs_rows_init(mfs_rows_t *r, mfs_model_t *m);
/** Start the rows thread (without it every batch resolves on the caller's thread). */
void mfs_rows_start(mfs_rows_t *r);
/** r->u / r->i = the rows of b's events; the rows are marked touched. @return 0, or the first
 *  error (ENOMEM, MFS_EFULL, MFS_EIDLEN) of either side. */
int mfs_rows_resolve(mfs_rows_t *r, const mfs_ebatch_t *b);
/** Stop the rows thread (idle between batches). */
void mfs_rows_stop(mfs_rows_t *r);
void mfs_rows_free(mfs_rows_t *r);

#endif
