/* cuda_int.h - the CUDA engine's internals, shared by its .cu files (gpu/cuda/) and the
 * benchmarks' ring feed (bench/ring_feed.cu); C++ linkage, never seen by C code. The C side sees
 * only the vtable mfs_engine_cuda_i (gpu/engine_int.h).
 *
 * DESIGN: one struct cuda_impl per engine (e->impl): the device tables, the engine's stream,
 * the batch staging, the persistent kernel's ring (struct pk_host) and the capture buffers.
 * One thread calls the engine (engine.h); capture_wait may run on another one while the engine
 * thread goes on, and touches only the cap_* fields, g_F/g_b and the pinned chunks g_st.
 *
 * Which file owns what:
 *   engine_cuda.cu  open, close, grow, hparams, memory, drain, progress; the vtable
 *   sgd.cu          the batch SGD kernels (deterministic, Hogwild) and launchers, batch
 *                   staging, per-batch row modes (streaming hot rows)
 *   epoch.cu        resident ratings: load (shuffle, per-row modes), free, one epoch, loss
 *   runs.cu         the runs layout of resident sets and the kernel that walks it
 *   ring.cu         the persistent kernel and its device ring (pk_*)
 *   loss.cu         the deterministic loss kernel, its launcher, the wait beside the ring
 *   capture.cu      the gather kernel, snapshot capture, whole-table sync
 *   step.cuh        the device step every kernel that updates or scores a rating uses
 */
#ifndef MFS_CUDA_INT_H
#define MFS_CUDA_INT_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common/keycount.h"
#include "gpu/cuda/cuda_try.h"
#include "gpu/cuda/runs_layout.h"
#include "gpu/engine_int.h"

#define WARPS_PER_BLOCK 8
#define MG_CHUNKS 8 /* a merge's rows are pushed and merged in up to this many chunks (merge.cu) */
#define MG_PEERS 8  /* the shards a device merge takes (gpu/shard.h MFS_SHARD_DEVICE_MAX) */
#define HOT_C 32.0 /* a row held by more warps than this at once is "hot" (see row_modes) */
#define HOT_GAIN 1.0 /* ... or by more than HOT_GAIN / lr: hot_c() */
#define PLAIN_C 0.1 /* default: rows held by at most this many warps at once take plain stores */

/* Row modes of the Hogwild kernel (per row in a set's mode arrays, per rating for batches):
 *   m > 1 (MODE_PLAIN): plain read-modify-write store -- the row is held by at most ~PLAIN_C
 *         warps at once, so a lost update is rare and Hogwild! tolerates it;
 *   m = 1: the delta lands with a vector atomic (RED) -- rows several warps hold at once;
 *   m < 1: hot row: the whole delta lands with probability m (sampled, see row_modes). */
#define MODE_PLAIN 2.0f

struct dev_set {
	uint32_t *u, *i;
	float *r;
	size_t n;
	float *su, *si; /* per-row mode of the Hogwild kernel (sets; NULL = du/di for every row): row_modes */
	float *ru, *ri; /* per-rating mode (streaming batches with hot rows; NULL = none) */
	float du, di;   /* the mode of every row of a side when su/si is NULL */
	size_t r_cap;
	struct user_run *runs; /* resident sets in the runs layout (runs.cu), else NULL */
	size_t nruns;
};

#define RUN_MAX_AUTO 0xFFFFFFFFu /* engine.cuda.user_runs = 0: whole users (runs.cu) */
#define RUN_LEN_MAX 1048576u     /* the longest run */

/* One ring slot's descriptor (host h_hdr[s] -> device d_hdr[s]), read by sgd_persistent_kernel. */
struct pk_hdr {
	unsigned long long first; /* first chunk number */
	uint32_t nchunks, n;      /* chunks, ratings */
	float mu;                 /* global mean when the batch was published */
	uint32_t salt;            /* sampling coins */
	float lr_scale;           /* the learning rate's multiplier for this batch (mfs_engine_replay) */
	/* the ratings: the slot's own buffers, or (bench/ring_feed.cu) device-resident ratings */
	const uint32_t *u, *i;
	const float *r;
	const float *mr_u, *mr_i; /* per-rating row modes, or NULL */
	const float *md_u, *md_i; /* per-row row modes (sets), or NULL: du / di for the whole side */
	float du, di;             /* 1: atomic deltas (streaming batches) */
};

/* Host side of the persistent kernel's device ring (see sgd_persistent_kernel). */
struct pk_host {
	int on;      /* streaming batches go through the ring (engine.persistent, not deterministic) */
	int running; /* the kernel is launched */
	int beside;  /* loss and gather kernels fit beside it (else they stop it first) */
	uint32_t S, cap; /* slots, ratings per slot */
	int grid;        /* blocks of the persistent kernel */
	cudaStream_t run, copy;
	cudaEvent_t up_ev; /* row uploads on `copy`, waited for by the engine's stream */
	struct pk_hdr *d_hdr, *h_hdr;
	unsigned long long *d_seq, *h_seq;
	uint32_t *d_u, *d_i, *h_u, *h_i;
	float *d_r, *d_su, *d_si, *h_r, *h_su, *h_si;
	unsigned int *d_done, *d_stop, *h_flag; /* h_flag = {0, 1}: sources for d_stop */
	unsigned long long *d_ticket, *d_consumed, *h_ticket;
	unsigned long long *h_consumed, *hd_consumed; /* mapped pinned {consumed, blocks resident};
	                                               * its device address */
	unsigned int *d_resident;                     /* blocks of this launch that started */
	uint64_t published, next_chunk; /* slots published, chunks published */
	uint64_t waits;                 /* submits that found the ring full */
	/* where pk_submit's time went (seconds; logged when the engine closes): waiting for a
	 * free slot, copying into pinned staging, the hot-row scales, queueing the copies */
	double wait_s, stage_s, scales_s, queue_s;
};

struct cuda_impl {
	int dev;
	int sms;
	cudaStream_t stream;
	void *P, *Q;   /* factors: float or __half (es bytes per element) */
	size_t es;
	int fp16;
	float *bu, *bi;
	uint32_t cap_u, cap_i, n_u, n_i; /* device capacity and rows uploaded */
	mfs_hparams_t *d_hp;
	unsigned long long *d_skipped;
	struct dev_set batch; /* staging for mfs_engine_sgd/loss batches */
	size_t batch_cap;
	double *d_part; /* loss partial sums: 2 per block */
	uint64_t loss_calls;            /* cuda_loss: calls, seconds uploading and computing (logged at close) */
	double loss_upload_s, loss_run_s;
	size_t part_cap;
	size_t rows_per_warp; /* optional Hogwild concurrency cap, 0 = none (see sgd_launch) */
	mfs_keycount_t cnt_u, cnt_i; /* a batch's rows' counts, for its scales (scales_into) */
	float *h_ru, *h_ri;      /* host per-rating scales */
	size_t h_r_cap;
	double plain_c; /* engine.cuda.plain_c: rows with expected concurrency <= this take plain stores */
	int hog_bps;    /* resident blocks per SM of the Hogwild kernel (occupancy) */
	int hog_g;      /* ratings a warp holds at once in the Hogwild kernel */
	int run_bps;      /* resident blocks per SM of the runs kernel */
	uint32_t run_max; /* ratings per run of resident sets, RUN_MAX_AUTO, or 0: no runs (iid, sgd.cu) */
	uint32_t launches; /* salts the sampling coins of streaming batches */
	struct pk_host pk;
	/* capture: rows to gather, gathered rows and biases (device, as many rows as the largest
	 * snapshot); two fixed pinned chunks the copy back goes through (g_st_rows rows each: their
	 * factors, then their biases) with an event each, and the stream of that copy */
	uint32_t *g_rows;
	void *g_F;
	float *g_b;
	size_t g_cap;
	void *g_st[2];
	cudaEvent_t g_st_ev[2];
	size_t g_st_rows;
	cudaStream_t cap_stream;
	/* the outstanding capture: gathered (the learner may go on); the writer copies it back in
	 * chunks and converts into cap_du/cap_di (cuda_capture_wait) */
	cudaEvent_t cap_gathered;
	int cap_pending;
	float *cap_du, *cap_di;
	size_t cap_nu, cap_ni;
	/* reset_rows: rows given to new ids, their values (device, and a host staging copy) */
	uint32_t *r_rows;
	void *r_F, *r_hF;
	float *r_b;
	size_t r_cap;
	cudaEvent_t r_done;
	/* the sharded engine's merge (merge.cu): the item table as of the last merge (conf.items_base),
	 * and the merge's scratch: rows, counts, user rows, S slots of packed rows, |p|^2 partials */
	int items_base;
	void *Q0;
	float *b0;
	uint32_t base_cap;
	uint32_t *mg_rows, *mg_cnt, *mg_p2;
	void *mg_F;
	float *mg_b;
	double *mg_part;
	void *mg_tab; /* BLEND's factors by count (merge.cu, struct blend_tab) */
	size_t mg_cap, mg_p2_cap;
	uint32_t mg_S;
	cudaStream_t mg_ps[MG_PEERS]; /* this device's pushes to shard d's device, beside the merge
	                                 kernels (a stream a peer: the copies to every peer at once) */
	cudaStream_t mg_cs;           /* MFS_MERGE_TRACE: joins the pushes to time them */
	cudaEvent_t mg_ev, mg_ready;  /* the merge done; this device's partials and rows ready to push */
	cudaEvent_t mg_pto[MG_PEERS][MG_CHUNKS]; /* chunk j of this device's rows pushed to shard d */
	cudaEvent_t mg_merged[MG_CHUNKS];        /* split merges: chunk j of this device's range merged */
	cudaEvent_t mg_bto[MG_PEERS][MG_CHUNKS]; /* split merges: and pushed to shard d */
	cudaEvent_t mg_t[4];          /* MFS_MERGE_TRACE: start, pushes begun, pushes done, merge done */
	unsigned int *mg_badh;        /* pinned: the last merge's non-finite rows on this device */
};

static inline struct cuda_impl *impl_of(mfs_engine_t *e) { return (struct cuda_impl *)e->impl; }

/* ---- sgd.cu ---- */
double hot_c(const mfs_engine_t *e);
/* Resident blocks per SM of kernel fn at 8 warps a block (at least 1); MFS_EINVAL for no fn. */
int kernel_bps(const void *fn, int *bps);
/* Blocks for `work` items at per_block a block, at most `full` (one wave), at least 1. */
size_t one_wave(size_t work, size_t per_block, size_t full);
int hog_setup(struct cuda_impl *c, int k);
double hog_inflight(mfs_engine_t *e, size_t n);
/* lr_scale multiplies the learning rate; count: add s->n to events_applied */
int sgd_launch(mfs_engine_t *e, const struct dev_set *s, uint32_t salt, float lr_scale, int count);
int upload(struct cuda_impl *c, struct dev_set *d, const mfs_batch_t *b);
int alloc_set(struct dev_set *d, size_t n);
void free_set(struct dev_set *d);
int stage_batch(mfs_engine_t *e, const mfs_batch_t *b);
int scales_into(mfs_engine_t *e, const mfs_batch_t *b, double inflight, float *ru, float *ri, int *hot);
int cuda_sgd(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale, int repeat);

/* ---- runs.cu ---- */
int runs_setup(struct cuda_impl *c, int k);
double runs_inflight(mfs_engine_t *e, size_t nruns);
int runs_launch(mfs_engine_t *e, const struct dev_set *s, uint32_t salt, float lr_scale);
/* mfs_runs_layout (runs_layout.h) of a load's shuffled arrays, which it replaces (freeing the old ones) */
int runs_regroup(mfs_engine_t *e, uint32_t **hu, uint32_t **hi, float **hr, size_t n, struct user_run **runs,
                 size_t *nruns);
int runs_upload(struct dev_set *d, const struct user_run *h);

/* ---- loss.cu ---- */
const void *loss_fn(int fp16, int k);
int beside_wait(struct cuda_impl *c, cudaEvent_t ev);
int loss_launch(mfs_engine_t *e, const struct dev_set *s, mfs_loss_t *out);
int cuda_loss(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *out);

/* ---- epoch.cu ---- */
int cuda_resident_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **out);
void cuda_resident_free(mfs_engine_t *e, mfs_resident_t *s);
int cuda_sgd_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch);
int cuda_loss_resident(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *out);

/* ---- merge.cu ---- */
int cuda_base_grow(struct cuda_impl *c, int k);
int cuda_base_open(struct cuda_impl *c);
void cuda_merge_free(struct cuda_impl *c);
/* merge.cu's kernels (which: 0 norm2, 1 pack, 2 merge at k, 3 lq, 4 table, 5 unpack), for pk_open's load beside the ring */
const void *merge_fn(int fp16, int k, int which);
extern "C" int cuda_merge(mfs_engine_t *const *subs, uint32_t S, mfs_merge_job_t *job);
extern "C" void cuda_merge_forget(mfs_engine_t *const *subs, uint32_t S, mfs_merge_job_t *job);

/* ---- ring.cu ---- */
int pk_open(mfs_engine_t *e);
void pk_free(struct cuda_impl *c);
uint64_t pk_consumed(const struct cuda_impl *c);
int pk_quiesce(struct cuda_impl *c);
int pk_stop(struct cuda_impl *c);
int pk_slot(mfs_engine_t *e, uint32_t *slot);
int pk_publish(mfs_engine_t *e, uint32_t s, size_t n, float lr_scale);
int pk_submit(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale, int repeat);

/* ---- init.cu ---- */
/* Rows [a, a+n) of side ent: mfs_model_init_row's values and a zero bias, drawn on stream s. */
int init_rows_launch(struct cuda_impl *c, const mfs_model_t *m, int ent, size_t a, size_t n, cudaStream_t s);
const void *init_rows_fn(int fp16);

/* ---- capture.cu ---- */
int cuda_sync(mfs_engine_t *e);
int cuda_capture(mfs_engine_t *e, const uint32_t *ur, size_t nu, float *du, const uint32_t *ir, size_t ni,
                 float *di);
int cuda_capture_wait(mfs_engine_t *e);
int cuda_reset_rows(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, int in_flight);
void reset_free(struct cuda_impl *c);
const void *gather_rows_fn(int fp16);
const void *scatter_rows_fn(int fp16);

#endif
