/* runs.cu - user runs: a resident set laid out by user, and the kernel that walks each user's
 * ratings in sequence with the user's row held in registers (the default of resident epochs;
 * engine.cuda.user_runs).
 *
 * DESIGN: the Hogwild kernel (sgd.cu) reads and writes both rows of every rating: at k = 128
 * fp16 that is 8k + 28 = 1052 bytes per update, and DRAM bandwidth caps it near 2.9 G/s on an
 * H100. Here a group of L lanes takes one *run* (up to run_max ratings of one user, in a random
 * order), loads p_u and b_u once, applies the run's updates one after another with p_u and b_u
 * in fp32 registers, and writes them back once: per update it moves q_i read and written
 * (4k sizeof(T)), b_i read and written (8), the rating's item and value (8), and 1 / run length
 * of the user's row. 4k + 16 = 528 bytes at k = 128 fp16 with runs of 100+, about half.
 * The order follows LIBMF's and the CPU engine's (a user's ratings in a run, like the CPU
 * engine's user-sorted blocks): SGD sees each user's updates in sequence, which is the
 * order the CPU reference trains in (gpu/cpu/engine_cpu.c), not the iid order of sgd.cu.
 *  - layout (mfs_runs_layout, host, at load): the set's shuffled ratings are grouped by user
 *    (stable, so a user's ratings keep their random order); each user's ratings are cut into
 *    runs of at most run_max (a heavy user becomes several runs of near equal length); the
 *    runs are shuffled; ratings with an unknown row go to the tail, scored, never trained.
 *    The set's u/i/r arrays are in this order, so the loss kernel reads them as before.
 *  - epoch: grid-stride over the shuffled runs; each run starts at a position drawn from
 *    (run, epoch salt) and wraps, so a user's ratings come in a different rotation each
 *    epoch. The next rating's item row is loaded while the current one is worked, and its
 *    index two ahead, so a group waits for one row load per update, not a chain of three.
 *  - item rows take the row modes of sgd.cu (plain, atomic deltas, sampled hot rows), with
 *    the concurrency counted as two rows per group (runs_inflight).
 *  - user rows: a user with one run is held by one group only, so p_u and b_u are written
 *    back with plain stores. By default every user is one run (up to 2^20 ratings): a user
 *    cut into several runs may be held by several groups at once, and their deltas
 *    (p_end - p_start, added with vector atomics) each nearly fit the same user from the same
 *    start, so c of them overshoot c-fold. Measured on the H100 (test_cuda_parity planted
 *    sets): 4000 x 2000 cut into runs of 16 at lr 0.01, test RMSE 0.7317 against 0.7172 with
 *    one run per user (CPU reference 0.7157); 20000 x 20000 cut into runs of 64 at lr 0.02
 *    diverged; weighting each delta by 1 / its expected holders learned too little (0.8166).
 *    engine.cuda.user_runs = N still cuts users into runs of at most N (experiments). The
 *    price of whole users is a tail: a group with a heavy user works past the others.
 * Deterministic mode never uses runs (sgd_kernel walks the reference's order).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "gpu/cuda/cuda_int.h"
#include "gpu/cuda/step.cuh"

/* Blocks per SM the runs kernel is compiled for: 4 caps it at 64 registers (fp16 k = 128
 * spills 4 bytes there; uncapped it takes 72, 3 blocks per SM). */
#ifndef RUNS_MIN_BLOCKS
#define RUNS_MIN_BLOCKS 4
#endif

/* sgd_runs_kernel: one epoch over a set's runs. Math per rating as hog_step (step.cuh), with
 * p_u and b_u the group's registers: e = r - (mu + b_u + b_i + p.q), g = lr e;
 * q by its row mode (plain: q = (1 - lr lq) q + g p; atomic: q += g p - lr lq q, RED; hot:
 * that delta with probability m), p = (1 - lr lp) p + g q from the old q, b_u, b_i alike.
 * Launch: runs_blocks() blocks of 8 warps, a group of L lanes per run (hog_shape), grid-stride
 * over the runs; every lane of a warp runs the loop while any group of it has a run. */
template <typename T, int K>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK, RUNS_MIN_BLOCKS)
	sgd_runs_kernel(const struct user_run *__restrict__ runs, size_t nruns, const uint32_t *__restrict__ is,
	                const float *__restrict__ rs, T *P, T *Q, float *bu, float *bi, float mu, const mfs_hparams_t *hp,
	                float lr_scale, unsigned long long *skipped, const float *__restrict__ md_i, float mode_i,
	                uint32_t salt)
{
	using S = hog_shape<T, K>;
	constexpr int L = S::L, G = S::G, V = S::V, E = vec16<T>::E;
	typedef typename vec16<T>::raw raw;
	const int lane = threadIdx.x & 31, sub = lane % L, grp = lane / L;
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t stride = ((gridDim.x * (size_t)blockDim.x) >> 5) * G;
	hog_coef co;
	co.load(hp, lr_scale);
	/* the run: user u's cnt ratings from base, worked from rotation off; split: shared user */
	size_t t = warp * G + grp;
	uint32_t u = 0, cnt = 0, off = 0, j = 0;
	unsigned long long base = 0;
	bool split = false, live = false;
	float pf[V * E], b_u = 0.f, b_u0 = 0.f;
	raw p0[V]; /* the row as loaded: a split run adds pf - p0 */
	/* the pipeline: the current rating (c*: row loaded), the next (n1*: row in flight once
	 * issued) and the one after (n2*: index and value only) */
	uint32_t ci = 0, n1i = 0, n2i = 0;
	float cr = 0.f, n1r = 0.f, n2r = 0.f, cbi = 0.f, n1bi = 0.f, cm = 1.f, n1m = 1.f;
	raw cq[V], n1q[V];
#define RUN_POS(jj) (base + ((off + (jj)) < cnt ? off + (jj) : off + (jj) - cnt))
#define ROW_LOAD(dst, dbi, dm, row)                                                                              \
	do {                                                                                                         \
		const T *q_ = Q + (size_t)(row) * K + sub * E;                                                          \
		_Pragma("unroll") for (int v_ = 0; v_ < V; v_++) dst[v_] = vec16<T>::ld(q_ + v_ * L * E);               \
		dbi = __ldcg(bi + (row));                                                                                \
		dm = md_i ? __ldg(md_i + (row)) : mode_i;                                                                \
	} while (0)
	/* begin run t: the user's row and bias, the first rating's row, the second's index */
#define RUN_BEGIN()                                                                                              \
	do {                                                                                                         \
		const struct user_run rr = runs[t];                                                                      \
		u = rr.u, cnt = rr.n & RUN_LEN_MASK, split = (rr.n & RUN_SPLIT) != 0, base = rr.start, j = 0;          \
		off = (uint32_t)(coin01(t, salt ^ 0x3Cu) * (float)cnt);                                                  \
		off = off < cnt ? off : cnt - 1;                                                                         \
		const T *p_ = P + (size_t)u * K + sub * E;                                                              \
		_Pragma("unroll") for (int v_ = 0; v_ < V; v_++)                                                        \
		{                                                                                                        \
			p0[v_] = vec16<T>::ld(p_ + v_ * L * E);                                                             \
			_Pragma("unroll") for (int e_ = 0; e_ < E; e_++) pf[v_ * E + e_] = vec16<T>::get(p0[v_], e_);      \
		}                                                                                                        \
		b_u0 = b_u = __ldcg(bu + u);                                                                             \
		const unsigned long long x0_ = RUN_POS(0);                                                               \
		ci = __ldg(is + x0_), cr = __ldg(rs + x0_);                                                              \
		if (cnt > 1) {                                                                                           \
			const unsigned long long x1_ = RUN_POS(1);                                                           \
			n1i = __ldg(is + x1_), n1r = __ldg(rs + x1_);                                                        \
		}                                                                                                        \
		ROW_LOAD(cq, cbi, cm, ci);                                                                               \
	} while (0)
	live = t < nruns;
	if (live)
		RUN_BEGIN();
	while (__any_sync(0xffffffffu, live)) {
		if (live && j + 1 < cnt) /* the next rating's row, in flight while this one is worked */
			ROW_LOAD(n1q, n1bi, n1m, n1i);
		if (live && j + 2 < cnt) {
			const unsigned long long x2 = RUN_POS(j + 2);
			n2i = __ldg(is + x2), n2r = __ldg(rs + x2);
		}
		float dot = 0.f;
		if (live)
#pragma unroll
			for (int v = 0; v < V; v++)
#pragma unroll
				for (int e = 0; e < E; e++)
					dot = fmaf(pf[v * E + e], vec16<T>::get(cq[v], e), dot);
#pragma unroll
		for (int o = L / 2; o; o >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, o);
		if (!live)
			continue;
		const float err = cr - (mu + b_u + cbi + dot);
		if (isfinite(err)) {
			const float g = co.lr * err;
			const unsigned long long x = RUN_POS(j);
			const bool wi = cm >= 1.f || coin01(x, salt ^ 0xA7u) < cm;
			T *q = Q + (size_t)ci * K + sub * E;
#pragma unroll
			for (int v = 0; v < V; v++) {
				float f[E];
				if (cm > 1.f) {
#pragma unroll
					for (int e = 0; e < E; e++)
						f[e] = fmaf(g, pf[v * E + e], co.dq * vec16<T>::get(cq[v], e));
					vec16<T>::st(q + v * L * E, f);
				} else if (wi) {
#pragma unroll
					for (int e = 0; e < E; e++)
						f[e] = g * pf[v * E + e] - co.aq * vec16<T>::get(cq[v], e);
					vec16<T>::red(q + v * L * E, f);
				}
				/* the user's row after the item's: both from the old values */
#pragma unroll
				for (int e = 0; e < E; e++)
					pf[v * E + e] = fmaf(g, vec16<T>::get(cq[v], e), co.dp * pf[v * E + e]);
			}
			b_u = fmaf(co.dbu, b_u, g);
			if (sub == 0) {
				if (cm > 1.f)
					bi[ci] = fmaf(co.dbi, cbi, g);
				else if (wi)
					atomicAdd(bi + ci, g - co.abi * cbi);
			}
		} else if (sub == 0) { /* never let NaN/inf reach the factors */
			atomicAdd(skipped, 1ull);
		}
		if (++j < cnt) {
			ci = n1i, cr = n1r, cbi = n1bi, cm = n1m;
#pragma unroll
			for (int v = 0; v < V; v++)
				cq[v] = n1q[v];
			n1i = n2i, n1r = n2r;
			continue;
		}
		/* the run is done: the user's row and bias go back once */
		T *p = P + (size_t)u * K + sub * E;
#pragma unroll
		for (int v = 0; v < V; v++) {
			if (split) {
				float f[E];
#pragma unroll
				for (int e = 0; e < E; e++)
					f[e] = pf[v * E + e] - vec16<T>::get(p0[v], e);
				vec16<T>::red(p + v * L * E, f);
			} else {
				vec16<T>::st(p + v * L * E, pf + v * E);
			}
		}
		if (sub == 0) {
			if (split)
				atomicAdd(bu + u, b_u - b_u0);
			else
				bu[u] = b_u;
		}
		t += stride;
		live = t < nruns;
		if (live)
			RUN_BEGIN();
	}
#undef RUN_BEGIN
#undef ROW_LOAD
#undef RUN_POS
}

/* ---- host side ----------------------------------------------------------------------- */

template <typename T>
using runs_fn = void (*)(const struct user_run *, size_t, const uint32_t *, const float *, T *, T *, float *, float *,
                         float, const mfs_hparams_t *, float, unsigned long long *, const float *, float, uint32_t);

template <typename T> static runs_fn<T> runs_kernel(int k)
{
	switch (k) {
#define RUNS_CASE(K)                                                                                             \
	case K:                                                                                                      \
		return sgd_runs_kernel<T, K>;
		RUNS_CASE(32) RUNS_CASE(64) RUNS_CASE(96) RUNS_CASE(128) RUNS_CASE(160) RUNS_CASE(192) RUNS_CASE(224)
		RUNS_CASE(256)
#undef RUNS_CASE
	}
	return NULL;
}

int runs_setup(struct cuda_impl *c, int k)
{
	const void *fn = c->fp16 ? (const void *)runs_kernel<__half>(k) : (const void *)runs_kernel<float>(k);
	int rc = kernel_bps(fn, &c->run_bps);
	if (rc)
		return rc;
	mfs_debug("cuda", "msg=\"runs kernel\" k=%d fp16=%d blocks_per_sm=%d run_max=%u", k, c->fp16, c->run_bps,
	          c->run_max);
	return 0;
}

/* Blocks of the runs launch: SMs x occupancy, fewer when there are fewer runs than groups. */
static size_t runs_blocks(const struct cuda_impl *c, size_t nruns)
{
	return one_wave(nruns, (size_t)WARPS_PER_BLOCK * c->hog_g, (size_t)c->sms * c->run_bps);
}

/* Item rows held at once: two per group working a run (the rating being worked, and the next
 * one's row, loaded a step early), so a hot row's deltas are as stale as two holders'. Counted
 * as one per group, the hot rows of a Zipf 0.8 set took twice the deltas HOT_C allows and
 * `train` diverged in the first epoch at lr 0.03 (H100, 1M x 1M x 99M, fp16 k=128). */
double runs_inflight(mfs_engine_t *e, size_t nruns)
{
	const struct cuda_impl *c = impl_of(e);
	const double groups = (double)runs_blocks(c, nruns) * WARPS_PER_BLOCK * c->hog_g;
	return 2.0 * ((double)nruns < groups ? (double)nruns : groups);
}

int runs_launch(mfs_engine_t *e, const struct dev_set *s, uint32_t salt, float lr_scale)
{
	struct cuda_impl *c = impl_of(e);
	const float mu = (float)e->model->mu;
	const int k = e->model->k, blocks = (int)runs_blocks(c, s->nruns), threads = 32 * WARPS_PER_BLOCK;
	if (c->fp16)
		runs_kernel<__half>(k)<<<blocks, threads, 0, c->stream>>>(s->runs, s->nruns, s->i, s->r, (__half *)c->P,
		                                                          (__half *)c->Q, c->bu, c->bi, mu, c->d_hp, lr_scale,
		                                                          c->d_skipped, s->si, s->di, salt);
	else
		runs_kernel<float>(k)<<<blocks, threads, 0, c->stream>>>(s->runs, s->nruns, s->i, s->r, (float *)c->P,
		                                                         (float *)c->Q, c->bu, c->bi, mu, c->d_hp, lr_scale,
		                                                         c->d_skipped, s->si, s->di, salt);
	MFS_CUDA_LAUNCHED();
	return 0;
}

extern "C" int mfs_runs_layout(const uint32_t *hu, const uint32_t *hi, const float *hr, size_t n, uint32_t rows,
                               uint32_t run_max, uint64_t seed, uint32_t *ou, uint32_t *oi, float *or_,
                               struct user_run **runs, size_t *nruns)
{
	*runs = NULL;
	*nruns = 0;
	uint64_t *at = (uint64_t *)calloc((size_t)rows + 1, sizeof *at);
	if (!at)
		return ENOMEM;
	size_t live = 0;
	for (size_t x = 0; x < n; x++)
		if (hu[x] < rows && hi[x] != MFS_ROW_NONE) {
			at[hu[x] + 1]++;
			live++;
		}
	size_t nr = 0;
	for (uint32_t r = 0; r < rows; r++)
		nr += (at[r + 1] + run_max - 1) / run_max;
	struct user_run *rv = (struct user_run *)malloc((nr ? nr : 1) * sizeof *rv);
	if (!rv) {
		free(at);
		return ENOMEM;
	}
	size_t k = 0;
	for (uint32_t r = 0; r < rows; r++) { /* at[r + 1] is user r's count; at[r] its start after this */
		const uint64_t c = at[r + 1], pieces = (c + run_max - 1) / run_max;
		uint64_t s = at[r];
		for (uint64_t p = 0; p < pieces; p++) {
			const uint64_t len = c / pieces + (p < c % pieces);
			rv[k].start = s;
			rv[k].u = r;
			rv[k].n = (uint32_t)len | (pieces > 1 ? RUN_SPLIT : 0u);
			s += len;
			k++;
		}
		at[r + 1] += at[r];
	}
	size_t tail = live;
	for (size_t x = 0; x < n; x++) { /* stable: a user's ratings keep the shuffled order */
		size_t y = (hu[x] < rows && hi[x] != MFS_ROW_NONE) ? at[hu[x]]++ : tail++;
		ou[y] = hu[x], oi[y] = hi[x], or_[y] = hr[x];
	}
	free(at);
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	for (size_t x = nr; x > 1; x--) {
		size_t y = (size_t)mfs_rng_below(&g, x);
		struct user_run tmp = rv[x - 1];
		rv[x - 1] = rv[y];
		rv[y] = tmp;
	}
	*runs = rv;
	*nruns = nr;
	return 0;
}

int runs_regroup(mfs_engine_t *e, uint32_t **hu, uint32_t **hi, float **hr, size_t n, struct user_run **runs,
                 size_t *nruns)
{
	const size_t m = n ? n : 1;
	uint32_t *ou = (uint32_t *)malloc(m * sizeof *ou), *oi = (uint32_t *)malloc(m * sizeof *oi);
	float *or_ = (float *)malloc(m * sizeof *or_);
	const struct cuda_impl *c = impl_of(e);
	const uint32_t run_max = c->run_max == RUN_MAX_AUTO ? RUN_LEN_MAX : c->run_max; /* whole users */
	int rc = ou && oi && or_ ? mfs_runs_layout(*hu, *hi, *hr, n, e->model->n_users, run_max,
	                                           e->conf.seed ^ 0x5E7B11ull, ou, oi, or_, runs, nruns)
	                         : ENOMEM;
	if (rc) {
		free(ou);
		free(oi);
		free(or_);
		return rc;
	}
	free(*hu);
	free(*hi);
	free(*hr);
	*hu = ou, *hi = oi, *hr = or_;
	mfs_debug("cuda", "msg=\"runs layout\" ratings=%zu runs=%zu run_max=%u", n, *nruns, run_max);
	return 0;
}

int runs_upload(struct dev_set *d, const struct user_run *h)
{
	MFS_CUDA_TRY(cudaMalloc(&d->runs, (d->nruns ? d->nruns : 1) * sizeof *h));
	MFS_CUDA_TRY(cudaMemcpy(d->runs, h, d->nruns * sizeof *h, cudaMemcpyHostToDevice));
	return 0;
}
