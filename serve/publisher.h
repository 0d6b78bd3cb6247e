/* publisher.h - the snapshot writer thread of the service: it publishes one staged snapshot at
 * a time to LMDB while the learner goes on learning (docs/STREAMING.md, "Snapshots").
 *
 * The learner fills the job at a batch boundary (the touched rows' ids into the stage, the
 * engine's capture of their values, the offsets and meta that describe exactly the batches
 * applied so far) and posts it; this thread waits for the capture's values
 * (mfs_engine_capture_wait), writes the stage in ONE LMDB transaction, and marks the job done;
 * the learner takes the result back on its own thread (freshness, metrics, the offset commit).
 * At most one job is in flight: the learner does not touch the job between post and take.
 */
#ifndef MFS_PUBLISHER_H
#define MFS_PUBLISHER_H

#include <stddef.h>
#include <stdint.h>

#include "common/offsets.h"
#include "gpu/engine.h"
#include "serve/meta.h"
#include "snapshots/snap_writer.h"

typedef struct mfs_pubjob {
	/* filled by the learner before mfs_publisher_post */
	mfs_snap_stage_t *stage;  /* ids by the learner, values by the engine's capture */
	mfs_offset_t *offs;       /* topic strings are the learner's */
	size_t n_offs, cap_offs;
	mfs_serve_meta_buf_t meta;
	size_t n_meta;
	double lr, last_loss;
	int64_t *pend_ts;         /* create times of the messages this snapshot newly covers */
	size_t n_pend, cap_pend;
	size_t users, items;
	uint64_t events_applied;
	const char *why;
	/* results, by the writer thread */
	int rc;
	char err[512];
	uint64_t seq;
	double t0, t1;     /* mfs_now_s() around the publish */
	double capture_s;  /* waiting for the engine's copy of the values (mfs_engine_capture_wait) */
	double phase_s[MFS_SNAP_PH__COUNT]; /* the publish's seconds by phase (mfs_snap_writer_phases) */
	double trim_s;     /* giving free heap pages back after the publish (malloc_trim) */
	int64_t commit_ms; /* wall time of the commit */
} mfs_pubjob_t;

typedef struct mfs_publisher_conf {
	const char *dir;
	size_t map_size;
	int sync;                  /* mfs_snap_sync_t */
	double rating_min, rating_max;
	int publish_delay_ms;      /* test.publish_delay_ms: sleep before each write (a slow disk) */
} mfs_publisher_conf_t;

typedef struct mfs_publisher mfs_publisher_t;

/** Open the LMDB writer on conf->dir. @return 0 or the writer's error (errstr says why). */
int mfs_publisher_open(const mfs_publisher_conf_t *conf, mfs_publisher_t **out, char *errstr, size_t errstr_size);
/** Start the thread; e is the engine whose captures it waits for. @return 0 or a pthread error. */
int mfs_publisher_start(mfs_publisher_t *p, mfs_engine_t *e);
/** The job to fill; the learner's while no job is posted. */
mfs_pubjob_t *mfs_publisher_job(mfs_publisher_t *p);
/** Hand the filled job to the thread. */
void mfs_publisher_post(mfs_publisher_t *p);
/** Is a posted job not yet written? */
int mfs_publisher_busy(mfs_publisher_t *p);
/** The written job, which is the caller's again (check its rc), or NULL when none is done;
 *  wait: block while one is posted. */
mfs_pubjob_t *mfs_publisher_take(mfs_publisher_t *p, int wait);
/** Stop the thread once idle (a posted job is written first). The engine may close after it. */
void mfs_publisher_stop(mfs_publisher_t *p);
/** Stop the thread if it still runs and close the writer. */
void mfs_publisher_close(mfs_publisher_t *p);

#endif
