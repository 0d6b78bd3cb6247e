/* learner.h - the learner thread of `mfstream serve` (docs/STREAMING.md).
 *
 * It owns the model (model_store), the engine and the snapshot publisher, and consumes batches
 * of decoded events from the queue (serve/batcher.h) in order: ids -> rows (new ids get rows),
 * running mean, holdout split, test-then-train scoring, SGD, the retained windows; every
 * serve.fullpass_ms a full pass over the windows whose loss drives the learning-rate
 * controller; every serve.snapshot_ms (and at every barrier batch) ONE LMDB transaction with
 * the touched rows, meta and the next offset of every partition the applied batches cover,
 * then a commit of those offsets through the caller's mfs_commit_fn (the consumer's: Kafka).
 * No Kafka type reaches it: tests drive it with batches of their own.
 *
 * Owning the model on one thread keeps model_store lock-free and puts every snapshot at a
 * batch boundary by construction: the offsets in a snapshot are exactly those of the batches
 * applied before it.
 */
#ifndef MFS_LEARNER_H
#define MFS_LEARNER_H

#include <stddef.h>
#include <stdint.h>

#include "common/offsets.h"
#include "config/config.h"
#include "ops/catalog.h"
#include "serve/batcher.h"
#include "snapshots/snap_load.h"

typedef struct mfs_learner mfs_learner_t;

/* Where the learner thread's time goes (mfstream_learner_seconds{phase}, the progress log):
 * ops/catalog.def lists the label values in this order. */
enum mfs_learner_phase {
	MFS_LPH_WAIT = 0,  /* blocked on the queue: no batch to apply */
	MFS_LPH_ROWS,      /* ids -> rows (new ids get rows), running mean, holdout split */
	MFS_LPH_GROW,      /* the engine grows its tables to the model's rows */
	MFS_LPH_SCORE,     /* test-then-train scoring (serve.prequential) */
	MFS_LPH_SUBMIT,    /* SGD: the engine takes the batch (device ring publish, a launch, or the CPU's updates) */
	MFS_LPH_RECORD,    /* retained windows, offsets, message timestamps */
	MFS_LPH_REPLAY,    /* replay: sampled window chunks given to the engine (serve/replay.h) */
	MFS_LPH_FULL_PASS, /* the periodic full pass and the learning-rate update */
	MFS_LPH_SNAPSHOT,  /* quiesce, gather and stage touched rows; finish the writer's job */
	MFS_LPH_OTHER,     /* applied-latency polls, stats, logs */
	MFS_LPH__COUNT
};
/** "wait", "rows", ... (the label values; NULL out of range). */
const char *mfs_learner_phase_name(int phase);

/* Parts of the rows phase (mfstream_learner_rows_seconds{step}; serve/rows.h): the three
 * steps of a batch resolved on the pool, and the seen-items tracker. What the rows phase holds
 * beyond their sum runs on the learner alone (small batches, the holdout split, the mean). */
enum mfs_learner_rows_step {
	MFS_LRS_LOOKUP = 0, /* step 1: every id hashed and looked up */
	MFS_LRS_NEW_IDS,    /* step 2: the ids not found get rows */
	MFS_LRS_FINISH,     /* step 3: new slots name their rows, touched marks, new rows' values */
	MFS_LRS_SEEN_ITEMS, /* the seen-items tracker (snapshot.seen_items) */
	MFS_LRS__COUNT
};
/** "lookup", "new_ids", ... (the label values; NULL out of range). */
const char *mfs_learner_rows_step_name(int step);

typedef struct mfs_learner_stats {
	uint64_t events_applied, events_held_out, messages, batches, snapshots;
	uint64_t events_replayed;  /* replayed updates since the model began (serve.replay) */
	uint64_t events_dropped;   /* valid events dropped: a new id refused (model.max_*, model.admit_after) */
	uint64_t not_admitted[2];  /* sightings of new users / items refused by admission */
	uint64_t evicted[2], expired[2], deleted[2]; /* ids freed (model_store/life.h), users / items */
	uint32_t live_users, live_items; /* rows holding an id */
	double replay_owed;        /* replayed updates owed now */
	uint64_t rejected[MFS_REJ__COUNT];
	uint32_t n_users, n_items, cap_users, cap_items;
	double lr, prequential_rmse, holdout_rmse, window_rmse;
	double prequential_window_rmse, prequential_cumulative_rmse; /* serve/prequential.h */
	uint64_t snap_seq, snap_users, snap_items;
	double snap_wall_s;    /* Unix time of the last publish (0: none) */
	double snap_seconds;   /* duration of the last publish */
	double snap_time_s;    /* mfs_now_s() of the last publish (0: none) */
	double lat_p50_ms, lat_p99_ms; /* message create time -> snapshot commit, since start */
	uint64_t lat_n;
	double applied_p50_ms, applied_p99_ms; /* message create time -> applied by the engine */
	double gpu_mem_used, gpu_mem_total; /* bytes; 0 with a host engine */
	double phase_s[MFS_LPH__COUNT]; /* learner thread seconds per phase since start */
	double rows_step_s[MFS_LRS__COUNT]; /* of phase_s[MFS_LPH_ROWS], seconds per part */
	uint64_t rows_ahead_batches;        /* batches looked up ahead (serve/rows.h mfs_rows_ahead) */
	uint64_t xch_published_rows, xch_merged_rows, xch_items_added, xch_bad_messages,
	        xch_produce_errors;         /* exchange.topic (serve/exchange.h) */
} mfs_learner_stats_t;

/** Commits offsets a published snapshot stores to the broker (lag monitoring only: recovery
 *  seeks to the snapshot's own offsets). sync: wait for the broker (barriers). Called on the
 *  learner thread with the offsets that advanced since the last call. @return 0 or an error
 *  (the callee logs it; the learner goes on and does not resend what failed). */
typedef int (*mfs_commit_fn)(void *ctx, const mfs_offset_t *offs, size_t n, int sync);

/** Create the model, load the newest snapshot in snapshot.dir (if any) and open the publisher.
 *  @return 0, or an error (errstr says why). */
int mfs_learner_open(const mfs_conf_t *c, mfs_batchq_t *queue, mfs_learner_t **out, char *errstr,
                     size_t errstr_size);
/** What the loaded snapshot said (offsets to resume at, counters); zeroed when there was none. */
const mfs_snap_loaded_t *mfs_learner_loaded(const mfs_learner_t *l);
/** Metrics (optional, before mfs_learner_start): snapshot duration and message -> snapshot
 *  latency are observed into cat's histograms as they happen. */
void mfs_learner_set_metrics(mfs_learner_t *l, mfs_catalog_t *cat);
/** The bootstrap servers of exchange.topic's producer and reader (NULL: kafka.bootstrap.servers),
 *  before mfs_learner_start. @return 0 or ENOMEM. */
int mfs_learner_set_brokers(mfs_learner_t *l, const char *brokers);
/** Open the engine on the learner thread and start it. commit (may be NULL) receives the
 *  offsets of every published snapshot. @return 0, or the engine's error. */
int mfs_learner_start(mfs_learner_t *l, mfs_commit_fn commit, void *commit_ctx, char *errstr, size_t errstr_size);
/** Wait for the thread (after a FINAL barrier or mfs_batchq_close). @return its result. */
int mfs_learner_join(mfs_learner_t *l, char *errstr, size_t errstr_size);
void mfs_learner_get_stats(mfs_learner_t *l, mfs_learner_stats_t *out);
const char *mfs_learner_engine_name(const mfs_learner_t *l);
/** Seconds since the learner thread last ended a phase of its loop (mfstream_learner_seconds'
 *  phases: at least twice a second while idle, after each step of a batch while busy), and the
 *  name of that phase; 0 while it is not running. Any thread. */
double mfs_learner_stalled_s(mfs_learner_t *l, const char **last_phase);
void mfs_learner_close(mfs_learner_t *l);

#endif
