/* loss_ref.c - the loss of a full pass (RMSE, MAE), the reference for the CUDA loss kernel.
 *
 *     r^ = clip(mu + [u known] b_u + [i known] b_i + [both known] p_u.q_i, clip_min, clip_max)
 *     sse = sum (r - r^)^2        sae = sum |r - r^|        rmse = sqrt(sse/n), mae = sae/n
 *
 * A row of MFS_ROW_NONE is an id the model has never seen (a cold user or item in a holdout):
 * it contributes neither a bias nor factors, so the prediction falls back to mu + the other
 * side's bias. The prediction is the same float expression as the SGD step's (same dot
 * product, same order of additions), so a loss pass scores exactly what SGD optimised.
 *
 * DESIGN: deterministic reduction. A pass is cut into chunks of MFS_LOSS_CHUNK ratings; each
 * chunk sums in double in index order, and the partials are combined in chunk order. Which
 * thread computed which chunk never matters, so the result is bit-identical for any thread
 * count (the CUDA kernel does the same with per-block partials and a fixed final pass).
 * Read-only on the model; safe to run concurrently with other loss chunks.
 */
#include "gpu/cpu/cpu_ref.h"

/* Rows this many ratings ahead are requested (a loss pass over a holdout is random access). */
#define LOSS_PREFETCH 8

MFS_INLINE float predict_k(const mfs_sgd_args_t *a, uint32_t u, uint32_t i, const int k)
{
	const size_t ks = (size_t)k;
	float pred = a->mu;
	if (u != MFS_ROW_NONE)
		pred += a->bu[u];
	if (i != MFS_ROW_NONE)
		pred += a->bi[i];
	if (u != MFS_ROW_NONE && i != MFS_ROW_NONE)
		pred += mfs_dot_lanes(a->P + u * ks, a->Q + i * ks, k);
	/* Compares, not fminf/fmaxf: those would turn a NaN prediction into a clip bound and hide
	 * a diverged model from the learning-rate controller. */
	if (pred < a->hp.clip_min)
		pred = a->hp.clip_min;
	if (pred > a->hp.clip_max)
		pred = a->hp.clip_max;
	return pred;
}

MFS_INLINE void prefetch_rows(const mfs_sgd_args_t *a, uint32_t u, uint32_t i, const int k)
{
	const size_t ks = (size_t)k;
	if (u == MFS_ROW_NONE || i == MFS_ROW_NONE) /* no factors read, and no pointer past the array */
		return;
	for (size_t b = 0; b < ks * sizeof(float); b += 64) {
		__builtin_prefetch((const char *)(a->P + u * ks) + b, 0, 3);
		__builtin_prefetch((const char *)(a->Q + i * ks) + b, 0, 3);
	}
}

MFS_CLONES float mfs_predict_ref(const mfs_sgd_args_t *a, uint32_t u, uint32_t i)
{
	return predict_k(a, u, i, a->k);
}

/* A constant k for the common ranks, as in sgd_ref.c. */
#define FOR_K(k, call)                                                                       \
	switch (k) {                                                                             \
	case 32:                                                                                 \
		call(32);                                                                            \
		break;                                                                               \
	case 64:                                                                                 \
		call(64);                                                                            \
		break;                                                                               \
	case 128:                                                                                \
		call(128);                                                                           \
		break;                                                                               \
	default:                                                                                 \
		call(k);                                                                             \
		break;                                                                               \
	}

MFS_INLINE void batch_loss(const mfs_sgd_args_t *a, const uint32_t *u, const uint32_t *i,
                           const float *r, size_t n, double *sse, double *sae, const int k)
{
	double s2 = 0, s1 = 0;
	for (size_t j = 0; j < n; j++) {
		if (j + LOSS_PREFETCH < n)
			prefetch_rows(a, u[j + LOSS_PREFETCH], i[j + LOSS_PREFETCH], k);
		double e = (double)r[j] - (double)predict_k(a, u[j], i[j], k);
		s2 += e * e;
		s1 += fabs(e);
	}
	*sse = s2;
	*sae = s1;
}

MFS_CLONES void mfs_loss_batch_ref(const mfs_sgd_args_t *a, const uint32_t *u, const uint32_t *i,
                                   const float *r, size_t n, double *sse, double *sae)
{
#define CALL(K) batch_loss(a, u, i, r, n, sse, sae, K)
	FOR_K(a->k, CALL)
#undef CALL
}

MFS_INLINE void ratings_loss(const mfs_sgd_args_t *a, const mfs_rating_t *rt, size_t n, double *sse,
                             double *sae, const int k)
{
	double s2 = 0, s1 = 0;
	for (size_t j = 0; j < n; j++) {
		if (j + LOSS_PREFETCH < n)
			prefetch_rows(a, rt[j + LOSS_PREFETCH].u, rt[j + LOSS_PREFETCH].i, k);
		double e = (double)rt[j].r - (double)predict_k(a, rt[j].u, rt[j].i, k);
		s2 += e * e;
		s1 += fabs(e);
	}
	*sse = s2;
	*sae = s1;
}

MFS_CLONES void mfs_loss_ratings_ref(const mfs_sgd_args_t *a, const mfs_rating_t *rt, size_t n,
                                     double *sse, double *sae)
{
#define CALL(K) ratings_loss(a, rt, n, sse, sae, K)
	FOR_K(a->k, CALL)
#undef CALL
}

void mfs_loss_combine_ref(const double *part, size_t n_chunks, uint64_t n, mfs_loss_t *out)
{
	double sse = 0, sae = 0;
	for (size_t c = 0; c < n_chunks; c++) {
		sse += part[2 * c];
		sae += part[2 * c + 1];
	}
	out->sse = sse;
	out->sae = sae;
	out->n = n;
	out->rmse = n ? sqrt(sse / (double)n) : NAN;
	out->mae = n ? sae / (double)n : NAN;
}
