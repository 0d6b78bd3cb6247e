/* meta.h - the service's own records in a snapshot's meta (docs/SNAPSHOT_FORMAT.md, "keys of
 * mfstream serve"): what must survive a restart (running mean, holdout and digest counters,
 * rejections by reason) and the accuracy figures of the moment. The snapshot writer stores
 * them as extra records and the loader hands them back by key; this file is the one place that
 * writes and reads them, so a new key touches snapshots/snap_format.h (name, type) and here.
 */
#ifndef MFS_SERVE_META_H
#define MFS_SERVE_META_H

#include <stddef.h>
#include <stdint.h>

#include "ingest/event.h"
#include "snapshots/snap_load.h"
#include "snapshots/snap_writer.h"

typedef struct mfs_serve_meta {
	uint64_t mu_count;  /* ratings behind the running mean, and their sum */
	double mu_sum;
	uint64_t held_out;  /* valid events held out (scored, never trained) */
	uint64_t digest;    /* sum of mfs_event_digest() of every valid event */
	uint64_t replayed;  /* replayed updates (serve.replay): repeats, not events */
	uint64_t dropped;   /* valid events dropped: a new id found its table full (model.max_*) */
	uint64_t freed[2][3]; /* ids freed [users, items][evicted, expired, deleted] (model_store/life.h) */
	uint64_t rejected[MFS_REJ__COUNT];
	double pq_rmse;     /* prequential RMSE since the previous snapshot (NaN: none) */
	uint64_t pq_n;
	double pq_window_rmse;     /* over the last serve.prequential_window events */
	uint64_t pq_window_n;
	double pq_cumulative_rmse; /* over every event since the model began (restored on restart) */
	uint64_t pq_cumulative_n;
	double holdout_rmse, window_rmse; /* the last full pass (NaN: none) */
} mfs_serve_meta_t;

/** Meta keys of freed[e][w]: "users_evicted", ... "items_deleted" (u64). */
extern const char *const mfs_meta_freed_key[2][3];

/** The most records mfs_serve_meta_records writes. */
#define MFS_SERVE_META_MAX (20 + MFS_REJ__COUNT)

/** Buffers that outlive a publish of the records (their keys point into names). */
typedef struct mfs_serve_meta_buf {
	mfs_snap_extra_t ex[MFS_SERVE_META_MAX];
	char names[MFS_REJ__COUNT][64];
} mfs_serve_meta_buf_t;

/** Records for mfs_snap_info_t.extra: every counter, and each accuracy figure that is finite
 *  (the prequential one only with_pq). @return how many are in buf->ex. */
size_t mfs_serve_meta_records(const mfs_serve_meta_t *m, int with_pq, mfs_serve_meta_buf_t *buf);
/** The counters a loaded snapshot stores (0 where absent; accuracy figures NaN but the
 *  cumulative prequential score, which continues). */
void mfs_serve_meta_restore(const mfs_snap_loaded_t *ld, mfs_serve_meta_t *out);

#endif
