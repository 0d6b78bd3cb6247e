/* sgd_ref.c - the SGD update, the reference every CUDA SGD kernel is tested against.
 *
 *     r^ = ((mu + b_u) + b_i) + p.q    e = r - r^     g = lr e       (p.q: mfs_dot_lanes)
 *     p' = p + lr (e q - lambda_p p)  = fmaf(g, q, (1 - lr lambda_p) p)
 *     q' = q + lr (e p - lambda_q q)  = fmaf(g, p, (1 - lr lambda_q) q)     (p, q: old values)
 *     b_u' = fmaf(1 - lr lambda_bu, b_u, g)           b_i' = fmaf(1 - lr lambda_bi, b_i, g)
 *
 * The right-hand forms are the contract's formulas (engine.h) rearranged: one multiply and one
 * fused multiply-add per element instead of three multiplies and two adds. A CUDA kernel must
 * use the same forms, with fmaf exactly where this file has it and no other contraction, to
 * match bit for bit in deterministic mode.
 *
 * Bytes moved per update: p and q rows read and written (k=128 fp32: 512 B each, 2 KiB in
 * all when neither is cached), 2 biases, one 12-byte rating. Flops: 2k (dot) + 4k (update:
 * one multiply and one fma per element of p and of q). With random rows the op is bound by
 * memory latency, so what matters is which rows are in cache (the set layout in
 * engine_cpu.c) and how early they are requested (the prefetch below); with rows in cache it
 * is ~100 instructions on AVX-512 and bound by the dependency chain dot -> e -> update ->
 * next dot on the same row (the set layout interleaves two users to overlap two chains).
 *
 * DESIGN: plain loops, no intrinsics (fmaf is C99). Reproducibility across machines: the dot
 * product has one fixed summation order (32 lanes, then a fixed fold: cpu_ref.h), fmaf rounds
 * once everywhere, and C11 mode compiles no other contraction (-ffp-contract=off), so the
 * AVX-512, AVX2 and baseline variants produce the same bits. The hot loops get target_clones
 * so a portable build still runs AVX-512 on machines that have it.
 *
 * Threads: these functions touch only the rows of the ratings they are given. Hogwild! mode
 * calls them concurrently on overlapping rows (benign races by design: a lost update is
 * noise to SGD); the set scheduler in engine_cpu.c never does.
 */
#include "gpu/cpu/cpu_ref.h"

/* Ratings ahead whose rows are requested. Measured on the LIBMF-shaped set (k=128, Zen 4):
 * 0 -> 28 M updates/s per thread, 4 -> 38 M, 8 -> 39 M, 12 -> 39 M; 8 covers a DRAM miss
 * (~100 ns) at ~25 ns per update without evicting rows still in use. */
#define PREFETCH_DIST 8

/* Per-batch constants of the update (the decay factors do not depend on the rating). */
struct coef {
	float lr, dp, dq, dbu, dbi;
};

static inline struct coef coef_of(const mfs_hparams_t *hp)
{
	struct coef c = {hp->lr, 1.0f - hp->lr * hp->lambda_p, 1.0f - hp->lr * hp->lambda_q,
	                 1.0f - hp->lr * hp->lambda_bu, 1.0f - hp->lr * hp->lambda_bi};
	return c;
}

MFS_INLINE int step(const struct coef *c, int k, float mu, float *restrict p, float *restrict q,
                    float *bu, float *bi, float r)
{
	float e = r - (mu + *bu + *bi + mfs_dot_lanes(p, q, k));
	/* The non-finite guard: one compare on a value already in a register. A NaN or inf error
	 * (a factor that overflowed, an infinite bias) would otherwise spread to every row that
	 * shares a rating with this one. */
	if (!isfinite(e))
		return 0;
	float g = c->lr * e;
	for (int f = 0; f < k; f++) {
		float pf = p[f], qf = q[f];
		p[f] = fmaf(g, qf, c->dp * pf);
		q[f] = fmaf(g, pf, c->dq * qf);
	}
	*bu = fmaf(c->dbu, *bu, g);
	*bi = fmaf(c->dbi, *bi, g);
	return 1;
}

/* Request a row (k floats) into cache, for writing. */
MFS_INLINE void prefetch_row(const float *row, size_t bytes)
{
	for (size_t b = 0; b < bytes; b += 64)
		__builtin_prefetch((const char *)row + b, 1, 3);
}

/* The loops below are inlined with a constant k for the common ranks (MFS_FOR_K): the compiler
 * then unrolls the dot product and the update completely and keeps the 32 lanes in registers
 * (+10% in cache). Any other k runs the same loop with a variable k. */
#define MFS_FOR_K(k, call)                                                                   \
	switch (k) {                                                                             \
	case 32:                                                                                 \
		return call(32);                                                                     \
	case 64:                                                                                 \
		return call(64);                                                                     \
	case 128:                                                                                \
		return call(128);                                                                    \
	case 256:                                                                                \
		return call(256);                                                                    \
	default:                                                                                 \
		return call(k);                                                                      \
	}

MFS_CLONES float mfs_dot_ref(const float *p, const float *q, int k) { return mfs_dot_lanes(p, q, k); }

MFS_CLONES int mfs_sgd_step_ref(const mfs_hparams_t *hp, int k, float mu, float *p, float *q,
                                float *bu, float *bi, float r)
{
	struct coef c = coef_of(hp);
	return step(&c, k, mu, p, q, bu, bi, r);
}

/* A streaming batch: rows are random, so both rows of the rating PREFETCH_DIST ahead are
 * requested (the user row only when it changes: producers key by user, runs are common). */
MFS_INLINE uint64_t batch_loop(const mfs_sgd_args_t *a, const uint32_t *u, const uint32_t *i,
                               const float *r, size_t n, const int k)
{
	const struct coef c = coef_of(&a->hp);
	const size_t ks = (size_t)k, row_bytes = ks * sizeof(float);
	float *const P = a->P, *const Q = a->Q, *const bu = a->bu, *const bi = a->bi;
	uint64_t applied = 0;
	for (size_t j = 0; j < n; j++) {
		if (j + PREFETCH_DIST < n) {
			const size_t x = j + PREFETCH_DIST;
			if (u[x] != u[x - 1])
				prefetch_row(P + u[x] * ks, row_bytes);
			prefetch_row(Q + i[x] * ks, row_bytes);
		}
		applied += (uint64_t)step(&c, k, a->mu, P + u[j] * ks, Q + i[j] * ks, bu + u[j], bi + i[j], r[j]);
	}
	return applied;
}

MFS_CLONES uint64_t mfs_sgd_batch_ref(const mfs_sgd_args_t *a, const uint32_t *u,
                                      const uint32_t *i, const float *r, size_t n)
{
#define CALL(K) batch_loop(a, u, i, r, n, K)
	MFS_FOR_K(a->k, CALL)
#undef CALL
}

/* A set block: MFS_SET_STREAMS user-sorted runs interleaved (engine_cpu.c), so the user row
 * PREFETCH_DIST ahead is new only when it differs from the one MFS_SET_STREAMS before it. */
MFS_INLINE uint64_t ratings_loop(const mfs_sgd_args_t *a, const mfs_rating_t *rt, size_t n, const int k)
{
	const struct coef c = coef_of(&a->hp);
	const size_t ks = (size_t)k, row_bytes = ks * sizeof(float);
	float *const P = a->P, *const Q = a->Q, *const bu = a->bu, *const bi = a->bi;
	uint64_t applied = 0;
	for (size_t j = 0; j < n; j++) {
		if (j + PREFETCH_DIST < n) {
			const mfs_rating_t *ahead = &rt[j + PREFETCH_DIST];
			if (j + PREFETCH_DIST < (size_t)MFS_SET_STREAMS || ahead->u != ahead[-MFS_SET_STREAMS].u)
				prefetch_row(P + ahead->u * ks, row_bytes);
			prefetch_row(Q + ahead->i * ks, row_bytes);
		}
		const uint32_t u = rt[j].u, i = rt[j].i;
		applied += (uint64_t)step(&c, k, a->mu, P + u * ks, Q + i * ks, bu + u, bi + i, rt[j].r);
	}
	return applied;
}

MFS_CLONES uint64_t mfs_sgd_ratings_ref(const mfs_sgd_args_t *a, const mfs_rating_t *rt, size_t n)
{
#define CALL(K) ratings_loop(a, rt, n, K)
	MFS_FOR_K(a->k, CALL)
#undef CALL
}
