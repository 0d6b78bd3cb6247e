/* cpu_ref.h - the CPU reference ops (sgd_ref.c, loss_ref.c) shared by the CPU engine and the
 * CUDA parity tests. Only gpu/ and tests include it.
 *
 * Every op works on host arrays and reads what the CUDA kernels read: the factor matrices
 * (row r at P + r*k), the bias vectors, mu and the hyperparameters. The ops
 * trust their input: rows are in range and ratings finite (engine.c validates batches before
 * any engine sees them).
 */
#ifndef MFS_CPU_REF_H
#define MFS_CPU_REF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clones.h"
#include "gpu/engine.h"

/* Hot loops get one variant per x86-64 level (AVX-512, AVX2+FMA, baseline): common/clones.h. */
#define MFS_CLONES MFS_TARGET_CLONES("arch=x86-64-v4", "arch=x86-64-v3", "default")
#define MFS_INLINE static inline __attribute__((always_inline))

/** Lanes of the dot product: the summation order of the deterministic engines (the CPU's and
 *  the CUDA sgd_kernel, bit-equal in fp32: test_cuda_parity); Hogwild kernels sum otherwise. */
#define MFS_DOT_LANES 32

/** p . q in the one fixed order: lane l accumulates f = l, l+32, l+64, ... with fmaf, then
 *  the 32 lanes fold by halves (l += l+16, l += l+8, ..., l += l+1). That is exactly a CUDA
 *  warp (lane = f mod 32, then a shfl_xor butterfly 16, 8, 4, 2, 1), and on the CPU it is the
 *  same for 512-, 256- and 128-bit vectors, so every variant of every engine agrees. fmaf is
 *  one rounding (hardware FMA on x86-64-v3 and up, the CUDA default) and the build compiles
 *  C11 without other contraction (-std=c11 implies -ffp-contract=off).
 *  Inlined so each target_clones variant gets its own vector width. */
MFS_INLINE float mfs_dot_lanes(const float *restrict p, const float *restrict q, int k)
{
	float acc[MFS_DOT_LANES] = {0};
	int f = 0;
	for (; f + MFS_DOT_LANES <= k; f += MFS_DOT_LANES)
		for (int l = 0; l < MFS_DOT_LANES; l++)
			acc[l] = fmaf(p[f + l], q[f + l], acc[l]);
	for (; f < k; f++) /* tail (k not a multiple of 32): lane = f mod 32, as in the body */
		acc[f % MFS_DOT_LANES] = fmaf(p[f], q[f], acc[f % MFS_DOT_LANES]);
	/* the fold, spelled out level by level so it stays in registers */
	for (int l = 0; l < 16; l++)
		acc[l] += acc[l + 16];
	for (int l = 0; l < 8; l++)
		acc[l] += acc[l + 8];
	for (int l = 0; l < 4; l++)
		acc[l] += acc[l + 4];
	acc[0] += acc[2];
	acc[1] += acc[3];
	return acc[0] + acc[1];
}

/** One rating of a loaded set (array of structures: one stream for the prefetcher). */
typedef struct mfs_rating {
	uint32_t u, i;
	float r;
} mfs_rating_t;

/** What an SGD or loss op reads: the model arrays as of this batch and the hyperparameters. */
typedef struct mfs_sgd_args {
	int k;
	float mu;
	float *P, *Q;   /* row-major, row r at P + r*k */
	float *bu, *bi;
	mfs_hparams_t hp;
} mfs_sgd_args_t;

/** User-sorted runs interleaved in each block of a set: consecutive updates then belong to
 *  different users, so two dependency chains (dot -> update -> next dot on the same p_u)
 *  overlap. engine_cpu.c lays them out; sgd_ref.c's prefetch follows them. Measured (k=128,
 *  Zen 4, one thread): 1 -> 33.5 M updates/s, 2 -> 39 M, 4 -> 37.5 M. */
#define MFS_SET_STREAMS 2

/** Ratings per partial sum of a loss pass. Fixed, so the reduction order (partials in chunk
 *  order) never depends on how many threads computed the chunks. */
#define MFS_LOSS_CHUNK 4096

/* ---- sgd_ref.c ------------------------------------------------------------------------ */

/** mfs_dot_lanes() as a function (tests, other callers). */
float mfs_dot_ref(const float *p, const float *q, int k);

/** One SGD update on rating r for the rows p (k floats), q, *bu, *bi.
 *  @return 1 if applied, 0 if skipped because the error was not finite. */
int mfs_sgd_step_ref(const mfs_hparams_t *hp, int k, float mu, float *p, float *q, float *bu,
                     float *bi, float r);

/** Updates for ratings [0, n) of a structure-of-arrays batch, in order.
 *  @return the number applied (n minus those skipped by the non-finite guard). */
uint64_t mfs_sgd_batch_ref(const mfs_sgd_args_t *a, const uint32_t *u, const uint32_t *i,
                           const float *r, size_t n);

/** Updates for n ratings of a set, in order (prefetches the rows of ratings ahead).
 *  @return the number applied. */
uint64_t mfs_sgd_ratings_ref(const mfs_sgd_args_t *a, const mfs_rating_t *rt, size_t n);

/* ---- loss_ref.c ----------------------------------------------------------------------- */

/** Prediction clipped to [hp.clip_min, hp.clip_max]; a MFS_ROW_NONE row contributes no bias
 *  and no factors. A NaN prediction stays NaN (the clip must not hide a broken model). */
float mfs_predict_ref(const mfs_sgd_args_t *a, uint32_t u, uint32_t i);

/** Sums of squared and absolute errors of n ratings, accumulated in double in index order.
 *  Callers cut a pass into MFS_LOSS_CHUNK-sized calls and combine the partials in order. */
void mfs_loss_batch_ref(const mfs_sgd_args_t *a, const uint32_t *u, const uint32_t *i,
                        const float *r, size_t n, double *sse, double *sae);
void mfs_loss_ratings_ref(const mfs_sgd_args_t *a, const mfs_rating_t *rt, size_t n, double *sse,
                          double *sae);

/** Combine per-chunk partials (sse, sae interleaved: part[2c], part[2c+1]) in chunk order
 *  and fill out (rmse and mae are NaN when n is 0). */
void mfs_loss_combine_ref(const double *part, size_t n_chunks, uint64_t n, mfs_loss_t *out);

/* ---- merge_ref.c ---------------------------------------------------------------------- */

/** The merge of one item row held by S replicas (gpu/shard.h, enum mfs_shard_combine; the
 *  reference of gpu/cuda/merge.cu): b0 / q0 its value at the last merge, rep_b[s] / rep_q[s]
 *  (k floats) shard s's replica, cnt[s] the ratings shard s gave the row since. A row no shard
 *  changed keeps b0 / q0; one that one shard alone changed takes that replica's value exactly;
 *  otherwise SUM, MEAN or BLEND, shards in order (BLEND in double, with lb / lq from
 *  mfs_merge_logs). out: the bias then k factors; tq: k doubles of scratch.
 *  @return 1 where out holds a NaN or an infinity (the caller fails the merge: no NaN reaches
 *  the factors unseen), else 0. */
int mfs_merge_row_ref(int k, uint32_t S, int combine, const uint32_t *cnt, float b0, const float *q0,
                      const float *rep_b, const float *const *rep_q, double lb, double lq, float *out, double *tq);

/** Over rows[0, n), in order, in double: p2 = the sum of |P row|^2, pp = the sum of
 *  (P row j . P row (j + n / 2) mod n)^2 (BLEND's rho = pp / p2, gpu/shard.h mfs_shard_blend_gq: the
 *  shards' sums, each added in shard order). */
void mfs_norm2_pairs_ref(const float *P, int k, const uint32_t *rows, size_t n, double *p2, double *pp);

/** BLEND's log(1 - g) for the bias (lb: g = lr (1 + lambda_bi)) and the factors (lq: g = lr'
 *  (pp / p2 + lambda_q), mfs_shard_blend_gq, lr' = mfs_shard_blend_lr(lr, epoch_g)),
 *  gpu/shard.h; p2, pp the sums of mfs_norm2_pairs_ref; epoch_g: 0, or the epoch step's
 *  multiplier where the merge closes an epoch run as one piece. */
void mfs_merge_logs(const mfs_hparams_t *hp, double p2, double pp, double epoch_g, double *lb, double *lq);

#endif
