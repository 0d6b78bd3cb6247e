/* sgd.cu - SGD over a batch of ratings: the deterministic kernel (sgd_kernel, the reference's
 * order), the Hogwild! kernel (sgd_hogwild_kernel) and their launcher (sgd_launch, also used by
 * resident epochs), the staging of streaming batches and their per-rating hot-row modes.
 *
 * DESIGN: a streaming batch (mfs_engine_sgd) goes to the persistent kernel's ring when it runs
 * (ring.cu), else it is staged in c->batch and launched here, synchronously on the engine's
 * stream. Every row of a batch takes atomic deltas (mode 1); rows that more than HOT_C warps
 * hold at once take sampled whole deltas (scales_into), as in resident epochs.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/cuda_int.h"
#include "gpu/cuda/step.cuh"

/* sgd_kernel: the deterministic kernel. For each rating (u, i, r), one warp computes
 *   e = r - (mu + bu[u] + bi[i] + p.q);  p += lr(e q - lp p);  q += lr(e p - lq q)
 *   bu += lr(e - lbu bu);  bi += lr(e - lbi bi)
 * in the forms and the rounding of the reference (gpu/cpu/sgd_ref.c: fmaf where it has fmaf,
 * __fmul_rn/__fadd_rn/__fsub_rn elsewhere, so nvcc contracts nothing; the dot product in
 * mfs_dot_lanes' order, dot_fold32).
 * Launch (sgd_launch): deterministic mode runs one block of one warp, so the ratings apply in
 * order; the kernel itself is grid-stride, 32 lanes per rating, lane l owns elements l + 32 j.
 * Bytes per update: 12 (rating) + p, q read and written (4 k sizeof(T)) + 16 (biases):
 * 16k + 28 in fp32, 8k + 28 in fp16. */
template <typename T, int V>
__global__ void sgd_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is,
                           const float *__restrict__ rs, size_t n, T *P, T *Q, float *bu, float *bi,
                           float mu, const mfs_hparams_t *hp, float lr_scale, unsigned long long *skipped)
{
	const int k = V * 32;
	const int lane = threadIdx.x & 31;
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t nwarps = (gridDim.x * (size_t)blockDim.x) >> 5;
	/* The reference's forms (gpu/cpu/sgd_ref.c), rounded the same way: __fmul_rn/__fsub_rn
	 * stop nvcc from contracting 1 - lr*lambda into an FMA the CPU does not do. */
	const float lr = __fmul_rn(hp->lr, lr_scale); /* the CPU engine's j->a.hp.lr *= lr_scale */
	const float dp = __fsub_rn(1.0f, __fmul_rn(lr, hp->lambda_p));
	const float dq = __fsub_rn(1.0f, __fmul_rn(lr, hp->lambda_q));
	const float dbu = __fsub_rn(1.0f, __fmul_rn(lr, hp->lambda_bu));
	const float dbi = __fsub_rn(1.0f, __fmul_rn(lr, hp->lambda_bi));
	for (size_t x = warp; x < n; x += nwarps) {
		const uint32_t u = __ldg(us + x), i = __ldg(is + x);
		const float r = __ldg(rs + x);
		if (u == MFS_ROW_NONE || i == MFS_ROW_NONE) /* unknown id in a set: scored, never trained */
			continue;
		T *p = P + (size_t)u * k, *q = Q + (size_t)i * k;
		float pv[V], qv[V];
		/* lane l accumulates elements l, l+32, ... then the butterfly 16, 8, 4, 2, 1: the one
		 * summation order of mfs_dot_lanes (cpu_ref.h), so both engines agree bit for bit */
		float dot = 0.f;
#pragma unroll
		for (int j = 0; j < V; j++) {
			pv[j] = stor<T>::ld(p + lane + 32 * j);
			qv[j] = stor<T>::ld(q + lane + 32 * j);
			dot = fmaf(pv[j], qv[j], dot);
		}
		dot = dot_fold32(dot);
		const float b_u = bu[u], b_i = bi[i];
		const float e = __fsub_rn(r, __fadd_rn(__fadd_rn(__fadd_rn(mu, b_u), b_i), dot));
		if (!isfinite(e)) { /* never let NaN/inf reach the factors */
			if (lane == 0)
				atomicAdd(skipped, 1ull);
			continue;
		}
		const float g = __fmul_rn(lr, e);
#pragma unroll
		for (int j = 0; j < V; j++) {
			stor<T>::st(p + lane + 32 * j, fmaf(g, qv[j], __fmul_rn(dp, pv[j])));
			stor<T>::st(q + lane + 32 * j, fmaf(g, pv[j], __fmul_rn(dq, qv[j])));
		}
		/* every lane holds the same e; lane 0 writes the biases after all lanes read them */
		__syncwarp();
		if (lane == 0) {
			bu[u] = fmaf(dbu, b_u, g);
			bi[i] = fmaf(dbi, b_i, g);
		}
		__syncwarp();
	}
}

/* sgd_hogwild_kernel: the Hogwild! kernel, one template for fp32 and fp16 storage and every k.
 * Math as sgd_kernel, per rating (u, i, r):
 *   e = r - (mu + bu + bi + p.q),  g = lr e
 *   plain rows:  p = (1 - lr lp) p + g q      atomic rows:  p += g q - lr lp p  (RED, in L2)
 *   (q alike with the old p), biases the same way from lane 0 of the group.
 * Launch: grid = SMs x occupancy blocks of 8 warps, grid-stride; a group of L lanes takes one
 * rating, so a warp holds 32 / L ratings at once; lane s of a group owns the 16-byte vectors
 * s, s + L, ... of p and of q (one 16-byte load and one 16-byte store or RED per vector: for
 * fp16 k=128, 16 lanes x 16 B = the 256-byte row). The dot's order (lane partial sums, then a
 * butterfly over the group) differs from the reference's: Hogwild is judged statistically.
 * The next rating's (u, i, r) is loaded before the current one is worked, so the index loads
 * leave the dependency chain. Row modes (cuda_int.h) come from md_u/md_i (per row, sets), mr_u/mr_i
 * (per rating, batches) or mode_u/mode_i (the whole side). Bytes per update: 16k + 28 in fp32,
 * 8k + 28 in fp16. */

template <typename T, int K>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)
	sgd_hogwild_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is, const float *__restrict__ rs,
	                   size_t n, T *P, T *Q, float *bu, float *bi, float mu, const mfs_hparams_t *hp,
	                   float lr_scale, unsigned long long *skipped, const float *__restrict__ md_u, const float *__restrict__ md_i,
	                   const float *__restrict__ mr_u, const float *__restrict__ mr_i, float mode_u, float mode_i,
	                   uint32_t salt)
{
	using S = hog_shape<T, K>;
	constexpr int L = S::L, G = S::G;
	const int lane = threadIdx.x & 31, sub = lane % L, grp = lane / L;
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t stride = ((gridDim.x * (size_t)blockDim.x) >> 5) * G;
	hog_coef co;
	co.load(hp, lr_scale);
	size_t x = warp * G + grp;
	uint32_t nu = MFS_ROW_NONE, ni = MFS_ROW_NONE;
	float nr = 0.f;
	if (x < n)
		nu = __ldg(us + x), ni = __ldg(is + x), nr = __ldg(rs + x);
	/* the loop bound is the warp's (x - grp), so all 32 lanes run the same iterations and
	 * meet at every shuffle; a group past n or with an unknown row just idles */
	for (; x - grp < n; x += stride) {
		const uint32_t u = nu, i = ni;
		const float r = nr;
		if (x + stride < n) /* prefetch the next rating's indices */
			nu = __ldg(us + x + stride), ni = __ldg(is + x + stride), nr = __ldg(rs + x + stride);
		else
			nu = ni = MFS_ROW_NONE;
		const bool live = u != MFS_ROW_NONE && i != MFS_ROW_NONE;
		float cu = 1.f, ci = 1.f;
		if (live) {
			cu = mr_u ? __ldg(mr_u + x) : md_u ? __ldg(md_u + u) : mode_u;
			ci = mr_i ? __ldg(mr_i + x) : md_i ? __ldg(md_i + i) : mode_i;
		}
		hog_step<T, K>(live, u, i, r, x, salt, cu, ci, sub, P, Q, bu, bi, mu, co, skipped);
	}
}

/* ---- host side ----------------------------------------------------------------------- */

template <typename T>
using hog_fn = void (*)(const uint32_t *, const uint32_t *, const float *, size_t, T *, T *, float *, float *, float,
                        const mfs_hparams_t *, float, unsigned long long *, const float *, const float *, const float *,
                        const float *, float, float, uint32_t);

/* The Hogwild kernel for k (a multiple of 32 in 32..256: cuda_can_implement) and its ratings per warp. */
template <typename T> static hog_fn<T> hog_kernel(int k, int *G)
{
	switch (k) {
#define HOG_CASE(K)                                                                                              \
	case K:                                                                                                      \
		*G = hog_shape<T, K>::G;                                                                                 \
		return sgd_hogwild_kernel<T, K>;
		HOG_CASE(32) HOG_CASE(64) HOG_CASE(96) HOG_CASE(128) HOG_CASE(160) HOG_CASE(192) HOG_CASE(224) HOG_CASE(256)
#undef HOG_CASE
	}
	*G = 1;
	return NULL;
}

int kernel_bps(const void *fn, int *bps)
{
	if (!fn)
		return MFS_EINVAL;
	int nb = 0;
	MFS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, 32 * WARPS_PER_BLOCK, 0));
	*bps = nb > 0 ? nb : 1;
	return 0;
}

size_t one_wave(size_t work, size_t per_block, size_t full)
{
	const size_t need = (work + per_block - 1) / per_block, b = need < full ? need : full;
	return b ? b : 1;
}

/* The grid of the Hogwild kernel is SMs x its occupancy; the hot-row estimates need the number
 * of ratings held at once (warps x ratings per warp). Computed once at open: k and the dtype
 * are fixed for the engine's life. */
int hog_setup(struct cuda_impl *c, int k)
{
	const void *fn = c->fp16 ? (const void *)hog_kernel<__half>(k, &c->hog_g) : (const void *)hog_kernel<float>(k, &c->hog_g);
	int rc = kernel_bps(fn, &c->hog_bps);
	if (rc)
		return rc;
	mfs_debug("cuda", "msg=\"hogwild kernel\" k=%d fp16=%d blocks_per_sm=%d ratings_per_warp=%d", k, c->fp16, c->hog_bps,
	          c->hog_g);
	return 0;
}

/* Blocks of the Hogwild launch for n ratings: SMs x occupancy (one wave), fewer for small
 * sets, or capped at rows / engine.cuda.rows_per_warp warps (experiments and tests). */
static size_t hog_blocks(mfs_engine_t *e, size_t n)
{
	const struct cuda_impl *c = impl_of(e);
	size_t b = one_wave(n, (size_t)WARPS_PER_BLOCK * c->hog_g, (size_t)c->sms * c->hog_bps);
	if (c->rows_per_warp) {
		const mfs_model_t *m = e->model;
		size_t rows = m->n_users < m->n_items ? m->n_users : m->n_items;
		size_t cap = (rows / c->rows_per_warp + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
		b = b < cap ? b : cap;
	}
	return b ? b : 1;
}

/* Ratings the Hogwild launch holds at once for a set or batch of n ratings. */
double hog_inflight(mfs_engine_t *e, size_t n)
{
	const struct cuda_impl *c = impl_of(e);
	const double held = (double)hog_blocks(e, n) * WARPS_PER_BLOCK * c->hog_g;
	return (double)n < held ? (double)n : held;
}

template <typename T>
static void sgd_launch_t(struct cuda_impl *c, const struct dev_set *s, int det, int blocks, int threads, float mu,
                         int k, uint32_t salt, float lr_scale)
{
	T *P = (T *)c->P, *Q = (T *)c->Q;
	if (det) {
#define SGD_CASE(V)                                                                                              \
	case V:                                                                                                      \
		sgd_kernel<T, V><<<blocks, threads, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu, c->bi, mu,     \
		                                                    c->d_hp, lr_scale, c->d_skipped);                  \
		break;
		switch (k / 32) {
			SGD_CASE(1) SGD_CASE(2) SGD_CASE(3) SGD_CASE(4) SGD_CASE(5) SGD_CASE(6) SGD_CASE(7) SGD_CASE(8)
		}
#undef SGD_CASE
		return;
	}
	int G;
	hog_fn<T> fn = hog_kernel<T>(k, &G);
	fn<<<blocks, threads, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu, c->bi, mu, c->d_hp, lr_scale, c->d_skipped, s->su,
	                                      s->si, s->ru, s->ri, s->du, s->di, salt);
}

/* One Hogwild (or deterministic) pass over s; salt varies the sampling coins between launches. */
int sgd_launch(mfs_engine_t *e, const struct dev_set *s, uint32_t salt, float lr_scale, int count)
{
	struct cuda_impl *c = impl_of(e);
	if (!s->n)
		return 0;
	int blocks, threads;
	const int det = e->conf.deterministic;
	if (s->runs && !det) { /* a resident set in the runs layout (runs.cu) */
		int rc = runs_launch(e, s, salt, lr_scale);
		if (rc)
			return rc;
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
		if (count)
			e->model->events_applied += s->n;
		return 0;
	}
	if (det) {
		blocks = 1; /* one warp walks the ratings in order: the reference's exact sequence */
		threads = 32;
	} else {
		/* Full grid (SMs x occupancy blocks of 8 warps): only rows that few warps hold take
		 * plain stores (row_modes), so the grid needs no cap against lost updates;
		 * engine.cuda.rows_per_warp caps it for experiments and tests. */
		threads = 32 * WARPS_PER_BLOCK;
		blocks = (int)hog_blocks(e, s->n);
	}
	const float mu = (float)e->model->mu;
	if (c->fp16)
		sgd_launch_t<__half>(c, s, det, blocks, threads, mu, e->model->k, salt, lr_scale);
	else
		sgd_launch_t<float>(c, s, det, blocks, threads, mu, e->model->k, salt, lr_scale);
	MFS_CUDA_LAUNCHED();
	MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	if (count)
		e->model->events_applied += s->n;
	return 0;
}

int upload(struct cuda_impl *c, struct dev_set *d, const mfs_batch_t *b)
{
	MFS_CUDA_TRY(cudaMemcpyAsync(d->u, b->u, b->n * sizeof(uint32_t), cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaMemcpyAsync(d->i, b->i, b->n * sizeof(uint32_t), cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaMemcpyAsync(d->r, b->r, b->n * sizeof(float), cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	d->n = b->n;
	return 0;
}

int alloc_set(struct dev_set *d, size_t n)
{
	if (n == 0)
		n = 1;
	MFS_CUDA_TRY(cudaMalloc(&d->u, n * sizeof(uint32_t)));
	MFS_CUDA_TRY(cudaMalloc(&d->i, n * sizeof(uint32_t)));
	MFS_CUDA_TRY(cudaMalloc(&d->r, n * sizeof(float)));
	return 0;
}

void free_set(struct dev_set *d)
{
	cudaFree(d->u);
	cudaFree(d->i);
	cudaFree(d->r);
	cudaFree(d->su);
	cudaFree(d->si);
	cudaFree(d->ru);
	cudaFree(d->ri);
	cudaFree(d->runs);
	memset(d, 0, sizeof *d);
}

int stage_batch(mfs_engine_t *e, const mfs_batch_t *b)
{
	struct cuda_impl *c = impl_of(e);
	if (b->n > c->batch_cap) {
		int rc = pk_stop(c); /* cudaFree would wait for it forever */
		if (rc)
			return rc;
		free_set(&c->batch);
		c->batch_cap = 0;
		if ((rc = alloc_set(&c->batch, b->n)))
			return rc;
		c->batch_cap = b->n;
	}
	return upload(c, &c->batch, b);
}

/* The concurrency above which a row is hot and sampled: HOT_C, or HOT_GAIN / lr where that is
 * lower. c deltas computed from one stale row sum to a step c lr times one rating's gradient
 * step; sampling caps c at the threshold, so the stale sum's gain is at most threshold x lr.
 * HOT_C alone let it grow with the rate: at lr 0.05 and 0.1 `train` diverged in the first
 * epoch on a Zipf 0.8 set (H100, 1M x 1M x 99M, fp16 k=128, user runs), where lr 0.03 (gain
 * 0.96) trained. Read when modes are made (set load: the rate then, the highest of a decaying
 * schedule; each streaming batch). */
double hot_c(const mfs_engine_t *e)
{
	const double lr = (double)e->hp.lr, byrate = lr > 0 ? HOT_GAIN / lr : HOT_C;
	return byrate < HOT_C ? byrate : HOT_C;
}

/* Per-rating row modes of batch b into ru/ri (n floats each): 1, or HOT_C / c for a row held by
 * c > HOT_C warps at once, with `inflight` ratings held at once. *hot: some row is hot (ru and
 * ri are left as they were when none is). The rows' counts in the batch come from tables sized
 * to the batch (common/keycount.h), not a counter per model row (three random reads per rating
 * over the whole user table); a side whose bucket bound says no row of it can be hot is not
 * counted exactly. */
int scales_into(mfs_engine_t *e, const mfs_batch_t *b, double inflight, float *ru, float *ri, int *hot)
{
	struct cuda_impl *c = impl_of(e);
	*hot = 0;
	int rc;
	const double k = inflight / (double)b->n, hc = hot_c(e); /* c_r = k * n_r */
	uint32_t bu, bi;
	if ((rc = mfs_keycount_bound(&c->cnt_u, b->u, b->n, &bu)) || (rc = mfs_keycount_bound(&c->cnt_i, b->i, b->n, &bi)))
		return rc;
	const int mu = k * bu > hc, mi = k * bi > hc;
	if (!mu && !mi)
		return 0;
	if ((mu && (rc = mfs_keycount_fill(&c->cnt_u, b->u, b->n))) || (mi && (rc = mfs_keycount_fill(&c->cnt_i, b->i, b->n))))
		return rc;
	for (size_t x = 0; x < b->n; x++) {
		double cu = mu ? k * mfs_keycount_get(&c->cnt_u, b->u[x]) : 0,
		       ci = mi ? k * mfs_keycount_get(&c->cnt_i, b->i[x]) : 0;
		ru[x] = cu > hc ? (float)(hc / cu) : 1.0f;
		ri[x] = ci > hc ? (float)(hc / ci) : 1.0f;
		*hot |= cu > hc || ci > hc;
	}
	return 0;
}

/* Streaming batches get the same hot-row treatment as sets (see row_modes), per rating:
 * count each row's ratings in the batch (counters are reset by walking the batch again, so
 * the cost is O(batch), not O(rows)), and when some row is held by more than HOT_C warps,
 * upload one scale per rating. Without it the hot rows of a skewed stream take summed deltas
 * and diverge (docs/BENCHMARKS.md, "Engine history"). */
static int batch_scales(mfs_engine_t *e, const mfs_batch_t *b, int *hot)
{
	struct cuda_impl *c = impl_of(e);
	int rc = 0;
	*hot = 0;
	if (b->n > c->h_r_cap) {
		float *nu = (float *)realloc(c->h_ru, b->n * sizeof *nu);
		if (nu)
			c->h_ru = nu;
		float *ni = (float *)realloc(c->h_ri, b->n * sizeof *ni);
		if (ni)
			c->h_ri = ni;
		if (!nu || !ni)
			return ENOMEM;
		c->h_r_cap = b->n;
	}
	if ((rc = scales_into(e, b, hog_inflight(e, b->n), c->h_ru, c->h_ri, hot)) || !*hot)
		return rc;
	struct dev_set *d = &c->batch;
	if (b->n > d->r_cap) {
		cudaFree(d->ru);
		cudaFree(d->ri);
		d->ru = d->ri = NULL;
		d->r_cap = 0;
		MFS_CUDA_TRY(cudaMalloc(&d->ru, b->n * sizeof(float)));
		MFS_CUDA_TRY(cudaMalloc(&d->ri, b->n * sizeof(float)));
		d->r_cap = b->n;
	}
	MFS_CUDA_TRY(cudaMemcpy(d->ru, c->h_ru, b->n * sizeof(float), cudaMemcpyHostToDevice));
	MFS_CUDA_TRY(cudaMemcpy(d->ri, c->h_ri, b->n * sizeof(float), cudaMemcpyHostToDevice));
	return 0;
}

int cuda_sgd(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale, int repeat)
{
	if (impl_of(e)->pk.on)
		return b->n ? pk_submit(e, b, lr_scale, repeat) : 0;
	int rc = stage_batch(e, b);
	if (rc)
		return rc;
	struct dev_set s = impl_of(e)->batch; /* per-rating scales only for this launch */
	s.ru = s.ri = NULL;
	/* every row of a batch takes atomic deltas (mode 1): classifying rows as plain would need
	 * a per-rating upload for every batch, and streaming is bound by the host, not the kernel */
	s.du = s.di = 1.f;
	if (!e->conf.deterministic && b->n) {
		int hot;
		if ((rc = batch_scales(e, b, &hot)))
			return rc;
		if (hot) {
			s.ru = impl_of(e)->batch.ru;
			s.ri = impl_of(e)->batch.ri;
		}
	}
	return sgd_launch(e, &s, mfs_coin_salt(++impl_of(e)->launches), lr_scale, !repeat);
}
