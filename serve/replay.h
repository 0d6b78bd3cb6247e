/* replay.h - the learner's spare capacity spent on the retained window (serve.replay;
 * docs/STREAMING.md, "Replay").
 *
 * Every training event the learner applies earns `share` replayed updates (a debt, capped at
 * share x the window's capacity); the learner spends the debt in chunks, only while no new
 * batch is waiting, by sampling runs of RUN consecutive ratings at random places in the window
 * and giving them to the engine like any batch. A replayed rating is a repeat of one already
 * applied, not a new event: offsets, events_applied, the running mean and the prequential
 * scores do not move; the rows it changes are written by the next snapshot like any others.
 *
 * With tau > 0 (forgetting, serve.replay_half_life_s) a run's place is drawn by its age instead, the
 * newest ratings likelier, density ~ e^(-age / tau): old evidence is replayed less.
 *
 * The learning rate of a chunk is the stream's times 1 / (1 + beta c^1.5), c = 1 + the mean
 * number of times its ratings were replayed before: `train`'s decay schedule (lr.beta) with
 * the passes counted per rating, so a rating's repeats take smaller and smaller steps as an
 * offline epoch's do, and a rating just streamed is replayed at nearly the stream's rate.
 */
#ifndef MFS_REPLAY_H
#define MFS_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "model_store/store.h"
#include "serve/window.h"

#define MFS_REPLAY_RUN 32  /* consecutive window ratings per sampled run */
#define MFS_REPLAY_AHEAD 8 /* runs between a run's prefetch and its copy */

typedef struct mfs_replay {
	double share;     /* replayed updates per new training event (0: off) */
	double beta;      /* decay of the learning rate with the passes over a rating */
	float lr_scale;   /* of the last chunk */
	double debt;      /* updates owed */
	double debt_cap;
	size_t chunk;     /* at most this many per chunk */
	double tau;       /* recency: runs are drawn at an age (ratings back from the newest) with
	                     density ~ e^(-age / tau), truncated to the window; 0: uniformly */
	uint64_t replayed;
	mfs_rng_t rng;
	uint32_t *u, *i;
	float *r;
	size_t *at; /* the chunk's run starts */
	size_t cap_u, cap_i, cap_r, cap_at;
} mfs_replay_t;

/** share >= 0; window_cap: the window's capacity; chunk: updates per chunk (>= RUN); beta:
 *  the learning rate's decay with passes (lr.beta). */
void mfs_replay_init(mfs_replay_t *rp, double share, size_t window_cap, size_t chunk, double beta, uint64_t seed);
/** n training events were applied: they earn share x n updates. */
void mfs_replay_credit(mfs_replay_t *rp, size_t n);
/** 1 when a chunk is owed and the window holds something to replay. */
int mfs_replay_due(const mfs_replay_t *rp, const mfs_window_t *w);
/** The next chunk, sampled from w (valid until the next call), and the scale of the learning
 *  rate it is to be applied at (rp->lr_scale); its slots count one more replay; the debt is
 *  paid by its size. @return 0 or ENOMEM. */
int mfs_replay_next(mfs_replay_t *rp, mfs_window_t *w, mfs_batch_t *out);
void mfs_replay_free(mfs_replay_t *rp);

#endif
