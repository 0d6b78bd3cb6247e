/* engine_int.h - the vtable behind engine.h; only engine implementations include it. */
#ifndef MFS_ENGINE_INT_H
#define MFS_ENGINE_INT_H

#include <pthread.h>
#include <string.h>

#include "gpu/engine.h"

struct mfs_merge_job;

struct mfs_engine_i {
	const char *name;
	/* (optional) 1 if this engine can run model m; else 0 and why. AUTO skips an engine that
	 * cannot (e.g. CUDA with k not a multiple of 32). */
	int (*can_implement)(const mfs_model_t *m, char *why, size_t why_size);
	int (*open)(mfs_engine_t *e, char *errstr, size_t errstr_size);
	void (*close)(mfs_engine_t *e);
	/* push hp where the engine's kernels read it; e->hp, the host copy, is kept by the caller
	 * (mfs_engine_set_hparams) once this returns 0 */
	int (*set_hparams)(mfs_engine_t *e, const mfs_hparams_t *hp);
	int (*grow)(mfs_engine_t *e); /* (optional) */
	/* lr_scale multiplies the learning rate for this batch (1: mfs_engine_sgd); repeat: not counted
	 * in events_applied (mfs_engine_replay) */
	int (*sgd)(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale, int repeat);
	int (*loss)(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *out);
	int (*resident_load)(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **out);
	void (*resident_free)(mfs_engine_t *e, mfs_resident_t *s);
	int (*sgd_epoch)(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch);
	int (*loss_resident)(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *out);
	int (*sync)(mfs_engine_t *e); /* (optional) */
	int (*memory)(mfs_engine_t *e, uint64_t *used, uint64_t *total); /* (optional) device memory */
	int (*drain)(mfs_engine_t *e);                                    /* (optional) */
	/* (optional; absent: both are the count of sgd calls) */
	void (*progress)(mfs_engine_t *e, uint64_t *ticket, uint64_t *applied);
	/* (optional, with capture_wait; rows already checked; absent: sync, then a copy of the host
	 * rows before returning) */
	int (*capture)(mfs_engine_t *e, const uint32_t *ur, size_t nu, float *du, const uint32_t *ir, size_t ni,
	               float *di);
	int (*capture_wait)(mfs_engine_t *e);
	/* (optional; absent: the engine works on the host arrays, nothing to take) */
	int (*reset_rows)(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, int in_flight);
	/* (optional; absent: the host draws every new row's values) */
	int (*take_new_rows)(mfs_engine_t *e);
	/* (optional, with merge_forget) the sharded engine's item merge (gpu/sharded.c) over S
	 * engines of this kind, each holding a replica of the item table and the table as of the
	 * last merge (conf.items_base): every batch given to them applied first, then each of the
	 * job's rows merged from the S replicas by mfs_merge_row_ref's rule (gpu/cpu/cpu_ref.h)
	 * into every replica and base, with BLEND's |p|^2 from the job's user rows. Absent: the
	 * engines work on their models' host arrays and the sharded engine merges there. */
	int (*merge)(mfs_engine_t *const *subs, uint32_t S, struct mfs_merge_job *job);
	void (*merge_forget)(mfs_engine_t *const *subs, uint32_t S, struct mfs_merge_job *job);
};

/* One merge of item rows across the shards of a sharded engine. */
typedef struct mfs_merge_job {
	const uint32_t *rows;  /* the item rows to merge */
	size_t n;
	const uint32_t *cnt;   /* n x S: ratings shard s gave rows[x] since its last merge */
	/* BLEND's |p|^2 = (the shards' sums of |p|^2 over these user rows of theirs (local rows),
	 * added in shard order) / (their number) */
	const uint32_t *p2_rows[MFS_SHARD_MAX];
	size_t p2_n[MFS_SHARD_MAX];
	int combine;           /* enum mfs_shard_combine */
	double epoch_g;        /* BLEND: 0, or (the merge closes an epoch run as one piece) the factor
	                          step's multiplier (mfs_shard_blend_lr) */
	mfs_hparams_t hp;
	int keep;              /* the job repeats (resident epochs): the kind may keep what it uploads in
	                          kept[] until merge_forget */
	void *kept[MFS_SHARD_MAX];
} mfs_merge_job_t;

struct mfs_engine {
	const struct mfs_engine_i *iface;
	mfs_engine_conf_t conf;
	mfs_model_t *model;
	mfs_hparams_t hp;   /* the last set by mfs_engine_set_hparams (the defaults before) */
	uint64_t sgd_calls; /* mfs_engine_sgd calls that succeeded */
	void *impl;         /* implementation state */
	/* captures and their waits, one at a time: the learner captures (snapshots, exchange.topic's
	 * publish, which also waits) while the snapshot writer waits for an earlier capture */
	pthread_mutex_t cap_mu;
};

/* Per row of rows, in order: b[row], then F's k factors of it, into dst (n x (1 + k)).
 * Inline so that an engine library (gpu/cuda/) needs nothing of engine.c, the floor above it. */
static inline void mfs_engine_copy_rows(const float *b, const float *F, int k, const uint32_t *rows, size_t n,
                                        float *dst)
{
	for (size_t j = 0; j < n; j++) {
		float *d = dst + j * (1 + (size_t)k);
		d[0] = b[rows[j]];
		memcpy(d + 1, F + (size_t)rows[j] * (size_t)k, (size_t)k * sizeof *F);
	}
}

#ifdef __cplusplus
extern "C" {
#endif
extern const struct mfs_engine_i mfs_engine_cpu_i;
extern const struct mfs_engine_i mfs_engine_sharded_i; /* gpu/sharded.c */
#ifdef MFS_HAVE_CUDA
extern const struct mfs_engine_i mfs_engine_cuda_i;
#endif
#ifdef __cplusplus
}
#endif

#endif
