/* engine.h - the compute engine interface (CPU and CUDA implement it).
 *
 * The model (biased MF, Koren et al. 2009; docs/ENGINE.md):
 *     r^(u,i) = mu + b_u + b_i + p_u . q_i          e = r - r^
 *     p_u += lr (e q_i - lambda_p p_u)             q_i += lr (e p_u - lambda_q q_i)
 *     b_u += lr (e - lambda_bu b_u)                b_i += lr (e - lambda_bi b_i)
 * p_u and q_i are updated simultaneously (each update uses the other's old value).
 *
 * An engine works on an mfs_model_t (model_store). The CPU engine updates the host arrays in
 * place; a device engine keeps a mirror and writes back on mfs_engine_sync(). After rows are
 * added to the model, call mfs_engine_grow() before the next batch that uses them.
 *
 * Two ways to feed ratings: a batch (streaming: applied in the given order in deterministic
 * mode, split across workers in Hogwild mode), or resident ratings: a whole rating set loaded
 * once into the engine (offline epochs: the engine may keep it on the device).
 */
#ifndef MFS_ENGINE_H
#define MFS_ENGINE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/shard.h"
#include "model_store/store.h"

enum mfs_engine_kind { MFS_ENGINE_AUTO = 0, MFS_ENGINE_CPU = 1, MFS_ENGINE_CUDA = 2 };
enum mfs_dtype { MFS_DTYPE_FP32 = 0, MFS_DTYPE_FP16 = 1 };

typedef struct mfs_engine mfs_engine_t;
typedef struct mfs_resident mfs_resident_t;

/** Hyperparameters read by every SGD step (on a GPU: from device memory, so a running
 *  kernel sees a new learning rate without a relaunch). */
typedef struct mfs_hparams {
	float lr;
	float lambda_p, lambda_q, lambda_bu, lambda_bi;
	float clip_min, clip_max; /* predictions are clipped to this range when scored */
} mfs_hparams_t;

/** Result of a full pass: sums are reduced in a fixed order, so the result does not depend
 *  on the number of threads. */
typedef struct mfs_loss {
	double sse;   /* sum of squared errors of clipped predictions */
	double sae;   /* sum of absolute errors */
	uint64_t n;
	double rmse, mae;
} mfs_loss_t;

typedef struct mfs_engine_conf {
	int kind;          /* enum mfs_engine_kind */
	int threads;       /* CPU workers; 0 = number of cores */
	int deterministic; /* 1: one thread, ratings applied in order: bit-reproducible */
	int device;        /* CUDA device ordinal */
	uint64_t seed;     /* shuffling seed for resident epochs */
	int dtype;         /* factor storage on the device: MFS_DTYPE_FP32 or MFS_DTYPE_FP16 (the CPU
	                      engine and the host model are always fp32; arithmetic is fp32) */
	int persistent;    /* CUDA: streaming batches (mfs_engine_sgd) through the persistent kernel's ring */
	int frequent_loss; /* the caller scores (mfs_engine_loss) between most batches. CUDA persistent
	                      kernel: 1 = leave one loss block per SM free so loss and gather kernels run
	                      beside it; 0 = it takes every block slot of the GPU, and a loss or gather
	                      call stops it and the next batch relaunches it */
	/* Experiments and test hooks (the hidden engine.cuda.* and engine.cpu.* keys of the
	 * configuration table); 0 leaves each to the engine. */
	int cuda_rows_per_warp;    /* cap the Hogwild grid at rows / this many warps */
	double cuda_plain_c;       /* rows held by at most this many warps at once take plain stores:
	                              0 = the default (0.1), < 0 = none (atomic deltas everywhere) */
	int cuda_user_runs;        /* resident epochs: a user's ratings in runs of at most this many,
	                              0 = the default, -1 = off (iid order, one rating per group) */
	int cuda_pk_blocks_per_sm; /* the persistent kernel's blocks per SM */
	int cuda_pk_stop_for_loss; /* 1: no loss or gather kernel beside the running persistent kernel */
	int cuda_pk_carveout;      /* the persistent kernel's shared-memory carveout: percent, -1 = 0 % */
	int cuda_pk_oversubscribe; /* test hook: twice the blocks that fit, still beside */
	uint32_t cpu_grid_users, cpu_grid_items; /* resident epochs' user x item bands (both or neither) */
	/* One model over several engines of `kind` (gpu/sharded.c, engine.devices; docs/SCALE_OUT.md):
	 * user row r lives on shard r % S, items are replicated and merged (BLEND, gpu/shard.h). */
	uint32_t shards;            /* S: 0 or 1 = one engine; MFS_SHARDS_ALL = every CUDA device */
	int devices[MFS_SHARD_MAX]; /* CUDA: shard s's device (a device may repeat: tests) */
	uint32_t merge_batches;  /* streaming: every changed item row is merged every this many batches */
	uint32_t merge_hot;      /* and after each piece of a resident epoch (streaming batches: with
	                               merge_hot_stream) the rows one shard gave this many ratings in it;
	                               0 = none */
	int merge_hot_stream;    /* streaming: hot rows merged after every batch too */
	uint32_t merge_pieces;   /* resident epochs are cut into this many pieces, hot rows merged after
	                               each, every row at the epoch's end */
	double merge_epoch_g;    /* an epoch in one piece: its merge's BLEND factor step x this (0: by the
	                               shard count, mfs_shard_blend_epoch_g; 1: BLEND's own) */
	int items_base;             /* set by the sharded engine for its shards: keep the item table as of
	                               the last merge (the merge's q0) where the rows live */
	int batches_inline;         /* sharded: apply each streaming batch before sgd returns, on the
	                               caller's thread (tests compare it with the driver thread's) */
	double merge_pieces_share;  /* sharded, benchmarks: a set runs in merge_pieces pieces when at least
	                               this share of its ratings is on hot rows (0: the default, 0.8) */
} mfs_engine_conf_t;

#define MFS_SHARDS_ALL UINT32_MAX

/** What an engine uses until mfs_engine_set_hparams: the configuration table's sgd.* defaults
 *  (tests/unit/test_engine_cpu.c checks that they agree) and no clipping. */
#define MFS_HPARAMS_DEFAULT {0.1f, 0.04f, 0.04f, 0.02f, 0.02f, -INFINITY, INFINITY}

/** Open an engine on model m. AUTO picks CUDA when compiled in and a device answers, else CPU.
 *  @return 0, MFS_ENODEV (kind not available), MFS_EINVAL, ENOMEM, MFS_EGPU. */
int mfs_engine_open(const mfs_engine_conf_t *conf, mfs_model_t *m, mfs_engine_t **out,
                    char *errstr, size_t errstr_size);
void mfs_engine_close(mfs_engine_t *e);
const char *mfs_engine_name(const mfs_engine_t *e);
/** 1 when a CUDA engine is compiled in and a device answers. */
int mfs_engine_cuda_available(void);

int mfs_engine_set_hparams(mfs_engine_t *e, const mfs_hparams_t *hp);
/** Rows were added to the model since the last call. */
int mfs_engine_grow(mfs_engine_t *e);
/** Rows below the model's row count were given to new ids (model_store/life.h) and hold fresh
 *  values in the host model: the engine takes them before any batch given after this call.
 *  in_flight: a batch given before may name a row (its last id; mfs_model_reused_in_flight),
 *  so those batches are applied first; 0: none does, and the rows are written beside them.
 *  The CPU engine works on the host arrays: nothing to do. The CUDA engine writes them on the
 *  device, after its ring drains where in_flight says so.
 *  @return 0, MFS_EINVAL (entity not 0 or 1, row out of range), ENOMEM, MFS_EGPU. */
int mfs_engine_reset_rows(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, int in_flight);
/** From now on, rows new to the model (not reused ones) get their initial factors and zero bias
 *  from the engine at mfs_engine_grow, and the host model leaves their factors zero (until a
 *  sync): the CUDA engine draws them on the device with the host's formula
 *  (model_store/store.h engine_init_from). *taken = 1 then; 0 for an engine without it (the CPU
 *  engine works on the host rows). @return 0, MFS_EINVAL, MFS_EGPU. */
int mfs_engine_take_new_rows(mfs_engine_t *e, int *taken);
/** One SGD update per rating of b. Rows must be < model rows and ratings finite.
 *  @return 0, MFS_EINVAL (row out of range), MFS_ENAN. */
int mfs_engine_sgd(mfs_engine_t *e, const mfs_batch_t *b);
/** Replay (serve.replay): one SGD update per rating of b as mfs_engine_sgd, at the learning
 *  rate times lr_scale (> 0, finite), and not counted in the model's events_applied: b repeats
 *  ratings already applied. Progress (mfs_engine_progress) counts it like a batch.
 *  @return 0, MFS_EINVAL (row out of range, bad lr_scale), MFS_ENAN. */
int mfs_engine_replay(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale);
/** RMSE/MAE of b against the current model. */
int mfs_engine_loss(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *out);

/** Load a rating set into the engine as resident ratings (copied; b may be freed afterwards). */
int mfs_engine_resident_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **out);
void mfs_engine_resident_free(mfs_engine_t *e, mfs_resident_t *s);
/** One epoch of SGD over resident ratings; `epoch` seeds its order (same epoch, same order). */
int mfs_engine_sgd_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch);
int mfs_engine_loss_resident(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *out);

/** Wait until every batch given to mfs_engine_sgd has been applied. The CUDA engine with
 *  engine.persistent returns from mfs_engine_sgd once the batch is queued on its device ring;
 *  the other engines apply it before returning (drain is then a no-op). sync and the loss
 *  and resident calls drain as they need; reading the device tables any other way needs this. */
int mfs_engine_drain(mfs_engine_t *e);
/** Progress of mfs_engine_sgd calls: *ticket is the value the last call's batch is applied at,
 *  *applied how far the engine has got; a batch is applied once applied >= its ticket. The CUDA
 *  ring counts slots (a poll of mapped memory); other engines count calls and apply them
 *  before returning, so applied == ticket. */
void mfs_engine_progress(mfs_engine_t *e, uint64_t *ticket, uint64_t *applied);
/** Bring the host model up to date (device engines copy factors back). */
int mfs_engine_sync(mfs_engine_t *e);
/** Snapshots off the learner's path. Capture the values of the given rows as they are now
 *  (every batch given to mfs_engine_sgd applied, none given later) into dst_users / dst_items:
 *  per row, in the order given, the bias then the k factors (n x (1 + k) floats, fp32).
 *  It returns once later batches can no longer change what is captured; the values are in
 *  dst once mfs_engine_capture_wait has returned. The CUDA engine gathers the rows on the
 *  device (beside its persistent kernel), starts the copy to the host and returns: the copy
 *  and the fp16 conversion are left to the caller of capture_wait (the snapshot writer thread).
 *  Host engines bring the rows up to date and copy them before returning. The host model's
 *  rows are not updated (mfs_engine_sync does that). One capture at a time: a capture or
 *  close while one is outstanding waits for it first. Rows must be < the model's rows;
 *  repeats are allowed.
 *  @return 0, MFS_EINVAL (row out of range, NULL dst with rows), ENOMEM, MFS_EGPU. */
int mfs_engine_capture(mfs_engine_t *e, const uint32_t *user_rows, size_t n_users, float *dst_users,
                       const uint32_t *item_rows, size_t n_items, float *dst_items);
/** Wait for the last capture's values (a no-op without one outstanding). Any thread may call
 *  it, beside the thread that captures: captures and waits are serialized by the engine's
 *  capture lock, and when it returns every capture begun before the call has its values in
 *  dst, whichever thread copied them (the learner's next capture may have).
 *  @return 0, or MFS_EGPU (the copy failed: dst holds no values). */
int mfs_engine_capture_wait(mfs_engine_t *e);
/** Memory of the engine's device: in use (by every process) and total, in bytes.
 *  @return 0, MFS_ENODEV (a host engine has no device memory), MFS_EGPU. */
int mfs_engine_memory(mfs_engine_t *e, uint64_t *used, uint64_t *total);

#endif
