/* rows.h - a batch's events to model rows (new ids get initialized rows), and the rows touched
 * since the last snapshot.
 *
 * A large batch is resolved over serve.rows_threads threads (a pool, common/par.h, the caller
 * counted) in three steps, and the rows are exactly those one thread would give:
 *   1. lookups: every event's user and item id, hashed and looked up in chunks on all threads
 *      (the maps are only read);
 *   2. the ids not found get rows, in the order a single thread would give them: the map's
 *      shards place them on all threads, a slot per new id and a repeat found at its first
 *      (mfs_idmap_add_*, model_store/store.h), then the caller numbers them in event order;
 *   3. the new slots name their rows, each side's rows are marked touched, and the new rows
 *      get their initial values (factors, zero bias), all on all threads.
 * A side whose new ids cannot simply take the next row (a bound, admission, rows freed for
 * reuse: mfs_model_add_many_ok) does step 2 in event order on one thread, one id after
 * another, and marks its rows there. A model with lifecycle tracking (TTL, eviction:
 * model_store/life.h), or a batch with deletions, takes the serial path per side instead (a
 * lookup there may touch, expire or evict rows), the two sides still on two threads. Below MFS_ROWS_SPLIT_MIN events
 * everything runs on the caller: a hand-over (~10-50 us) would cost more than it saves.
 *
 * Step 1 of the next batch may run ahead (mfs_rows_ahead): on the pool's workers, into arrays of
 * its own, while the caller goes on with the batch it resolved; mfs_rows_resolve of that batch
 * then starts at step 2. The lookups only read the maps, and the batch before has placed its
 * new ids, so the rows are the same as without; the caller promises that nothing changes the
 * maps in between (no other batch resolved, no deletion, eviction or renumbering).
 */
#ifndef MFS_ROWS_H
#define MFS_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "common/par.h"
#include "model_store/store.h"
#include "model_store/touched.h"
#include "serve/batcher.h"

#define MFS_ROWS_SPLIT_MIN 4096

typedef struct mfs_rows {
	mfs_model_t *m;
	uint32_t *u, *i;      /* the rows of the last batch's events, in event order */
	size_t cap_u, cap_i;
	float *r;             /* their ratings, copied where the ids are read (by the pool's lookups
	                         for a large batch): the learner reads 4 bytes an event, not 72 */
	size_t cap_r;
	mfs_touched_t tu, ti; /* rows touched since the last mfs_touched_clear (the snapshot's) */
	mfs_par_t *par;       /* the pool (NULL until mfs_rows_start: the caller's thread alone) */
	int threads;          /* the pool's size, the caller counted */
	/* the batch being resolved, for the pool's tasks */
	const mfs_ebatch_t *batch;
	struct {                  /* step 1's batch and where it writes (the pool's tasks) */
		const mfs_ebatch_t *b;
		uint32_t *u, *i;
		float *r;
		uint64_t *h[2];
	} look;
	/* step 1 begun ahead (mfs_rows_ahead) for batch `ahead`, into these arrays (swapped with
	 * u, i, r, h when that batch is resolved) */
	const mfs_ebatch_t *ahead;
	uint32_t *au, *ai;
	float *ar;
	uint64_t *ah[2];
	size_t cap_au, cap_ai, cap_ar, cap_ah[2];
	uint64_t aheads, ahead_used; /* batches whose lookups were begun ahead / taken up by resolve */
	uint64_t *h[2];       /* each side's id hashes (step 1) */
	size_t cap_h[2];
	uint32_t *miss[2];    /* each side's events whose id the lookups did not find (step 2) */
	size_t n_miss[2], cap_miss[2];
	int many[2];          /* the side's new ids placed many at once (step 2), not one by one */
	mfs_idmap_add_t add[2]; /* their candidates: the misses */
	uint32_t *fresh[2];   /* each side's new rows, values not written yet (step 2) */
	size_t n_fresh[2], cap_fresh[2];
	int rc[2];
	uint64_t placed_many; /* sides of batches whose new ids the map's shards placed (step 2) */
	uint64_t steps[3];    /* batches that took the three-step path / the two-sided serial one / the caller alone */
	double step_s[3];     /* seconds in the three steps (lookups, ids not found, slots / marks / values) */
	int sides_only;       /* benchmarks: the two-sided serial path for every large batch (as before the three steps) */
	int one_by_one;       /* benchmarks: step 2 one id after another for every side (as before the shards) */
} mfs_rows_t;

/** Resolve rows of model m with `threads` threads (>= 1, the caller counted) once started.
 *  @return 0. */
int mfs_rows_init(mfs_rows_t *r, mfs_model_t *m, int threads);
/** Start the pool (without it every batch resolves on the caller's thread). @return 0, ENOMEM
 *  or a pthread error (the caller's thread alone then). */
int mfs_rows_start(mfs_rows_t *r);
/** r->u / r->i = the rows of b's events, r->r their ratings; the rows are marked touched. @return 0, or the first
 *  error (ENOMEM, MFS_EFULL, MFS_EIDLEN) of either side. */
int mfs_rows_resolve(mfs_rows_t *r, const mfs_ebatch_t *b);
/** Begin step 1 of b (the batch the next mfs_rows_resolve will get) on the pool's workers and
 *  return: the caller goes on while they look up. Only for a batch the three steps take (large,
 *  no deletions, no lifecycle tracking) and a pool with workers, none busy with a step begun
 *  elsewhere (mfs_par_start: it would be waited for). b must stay as it is, and the maps
 *  unchanged, until resolve or mfs_rows_ahead_cancel. @return 1 begun, 0 not (resolve does it). */
int mfs_rows_ahead(mfs_rows_t *r, const mfs_ebatch_t *b);
/** Wait for lookups begun ahead for b (any batch: NULL) and forget them: before b is released
 *  without being resolved. */
void mfs_rows_ahead_cancel(mfs_rows_t *r, const mfs_ebatch_t *b);
/** Stop the pool (idle between batches). */
void mfs_rows_stop(mfs_rows_t *r);
void mfs_rows_free(mfs_rows_t *r);

#endif
