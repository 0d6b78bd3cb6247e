/* engine_cuda.cu - the CUDA engine: device-resident factors, warp-per-rating Hogwild! SGD,
 * a deterministic full-pass loss. Implements gpu/engine_int.h like the CPU engine.
 *
 * DESIGN: the host model (model_store) stays the source of truth for ids and new rows; the
 * device holds P, Q, bu, bi with their own capacities. grow() uploads rows the host added
 * since the last call (their initial values come from model_store, so CPU and GPU start from
 * the same numbers); sync() copies every row back. Hyperparameters live in device memory and
 * every launch reads them there, so a running kernel can be retuned without a relaunch.
 * Calls are synchronous on one stream: each returns with the work done and errors checked.
 *
 * Factor storage is fp32 or fp16 (model.dtype); arithmetic is always fp32, biases fp32. The
 * kernels are templated on the storage type T through `stor<T>` (load, store, atomic add), so
 * the fp16 path is the same code with half the bytes per update.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "gpu/cuda/cuda_try.h"
#include "gpu/engine_int.h"

#define LOSS_CHUNK 4096 /* ratings per loss block: fixed, so the reduction order is fixed */
#define WARPS_PER_BLOCK 8
#define HOT_C 32.0 /* a row held by more warps than this at once is "hot" (see row_scales) */

struct dev_set {
	uint32_t *u, *i;
	float *r;
	size_t n;
	float *su, *si; /* per-row step scale for Hogwild (sets; NULL = 1): see row_scales */
	float *ru, *ri; /* per-rating step scale (streaming batches with hot rows; NULL = none) */
	size_t r_cap;
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
	size_t part_cap;
	size_t rows_per_warp; /* optional Hogwild concurrency cap, 0 = none (see launch_sgd) */
	uint32_t *cnt_u, *cnt_i; /* host row counters for batch scales (kept zeroed between uses) */
	uint32_t cnt_cap_u, cnt_cap_i;
	float *h_ru, *h_ri;      /* host per-rating scales */
	size_t h_r_cap;
};

/* ---- storage traits: how a kernel reads, writes and atomically adds one factor ---------- */
template <typename T> struct stor;
template <> struct stor<float> {
	static __device__ __forceinline__ float ld(const float *p) { return *p; }
	static __device__ __forceinline__ float ldcg(const float *p) { return __ldcg(p); }
	static __device__ __forceinline__ void st(float *p, float v) { *p = v; }
	static __device__ __forceinline__ void add(float *p, float v) { atomicAdd(p, v); }
};
template <> struct stor<__half> {
	static __device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
	static __device__ __forceinline__ float ldcg(const __half *p) { return __half2float(__ldcg(p)); }
	static __device__ __forceinline__ void st(__half *p, float v) { *p = __float2half_rn(v); }
	static __device__ __forceinline__ void add(__half *p, float v) { atomicAdd(p, __float2half_rn(v)); }
};

/* A uniform number in [0, 1) from a rating's index: the coin of sampled hot-row updates. */
__device__ __forceinline__ float coin01(size_t x, uint32_t salt)
{
	uint32_t h = (uint32_t)x * 0x9E3779B1u ^ (uint32_t)(x >> 32) ^ salt;
	h ^= h >> 16;
	h *= 0x85EBCA6Bu;
	h ^= h >> 13;
	h *= 0xC2B2AE35u;
	h ^= h >> 16;
	return (float)(h >> 8) * (1.0f / 16777216.0f);
}

/* ---- kernels ------------------------------------------------------------------------- */

/* sgd_kernel: for each rating (u, i, r), one warp computes
 *   e = r - (mu + bu[u] + bi[i] + p.q);  p += lr(e q - lp p);  q += lr(e p - lq q)
 *   bu += lr(e - lbu bu);  bi += lr(e - lbi bi)
 * Launch: grid-stride over ratings, 32 lanes per rating, lane l owns elements l + 32 j.
 * Bytes per update: 12 (rating) + p, q read and written (4 k sizeof(T)) + 16 (biases):
 * 16k + 28 in fp32, 8k + 28 in fp16. */
template <typename T, int V>
__global__ void sgd_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is,
                           const float *__restrict__ rs, size_t n, T *P, T *Q, float *bu, float *bi,
                           float mu, const mfs_hparams_t *hp, unsigned long long *skipped)
{
	const int k = V * 32;
	const int lane = threadIdx.x & 31;
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t nwarps = (gridDim.x * (size_t)blockDim.x) >> 5;
	/* The reference's forms (gpu/cpu/sgd_ref.c), rounded the same way: __fmul_rn/__fsub_rn
	 * stop nvcc from contracting 1 - lr*lambda into an FMA the CPU does not do. */
	const float lr = hp->lr;
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
#pragma unroll
		for (int o = 16; o; o >>= 1)
			dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
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

/* sgd_atomic_kernel: the Hogwild! path. Same math as sgd_kernel, but each update is applied
 * as a delta with atomicAdd (compiled to RED.ADD: no return value, resolved in L2):
 *   dp = g q - lr lambda_p p,  dq = g p - lr lambda_q q,  p += dp,  q += dq  (p, q as read)
 * Two warps that hold the same row at once both land their deltas instead of the last store
 * winning, so a hot row (a popular item, an active user) is never starved of updates; what
 * remains is staleness (a delta computed from a row another warp is changing), which SGD
 * tolerates like a small mini-batch. That is why this kernel runs with the full grid, where
 * the plain-store kernel had to cap warps in flight (see launch_sgd).
 * Bytes per update as sgd_kernel: 16k + 28 (the RED traffic replaces the stores). */
template <typename T, int V>
__global__ void sgd_atomic_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is,
                                  const float *__restrict__ rs, size_t n, T *P, T *Q, float *bu,
                                  float *bi, float mu, const mfs_hparams_t *hp, unsigned long long *skipped,
                                  const float *__restrict__ su, const float *__restrict__ si,
                                  const float *__restrict__ ru, const float *__restrict__ ri)
{
	const int k = V * 32;
	const int lane = threadIdx.x & 31;
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t nwarps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const float lr = hp->lr;
	const float ap = lr * hp->lambda_p, aq = lr * hp->lambda_q;
	const float abu = lr * hp->lambda_bu, abi = lr * hp->lambda_bi;
	for (size_t x = warp; x < n; x += nwarps) {
		const uint32_t u = __ldg(us + x), i = __ldg(is + x);
		const float r = __ldg(rs + x);
		if (u == MFS_ROW_NONE || i == MFS_ROW_NONE) /* unknown id in a set: scored, never trained */
			continue;
		T *p = P + (size_t)u * k, *q = Q + (size_t)i * k;
		float pv[V], qv[V];
		float dot = 0.f;
#pragma unroll
		for (int j = 0; j < V; j++) {
			pv[j] = stor<T>::ldcg(p + lane + 32 * j); /* L2: other SMs' deltas land there */
			qv[j] = stor<T>::ldcg(q + lane + 32 * j);
			dot = fmaf(pv[j], qv[j], dot);
		}
#pragma unroll
		for (int o = 16; o; o >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, o);
		const float b_u = __ldcg(bu + u), b_i = __ldcg(bi + i);
		const float e = r - (mu + b_u + b_i + dot);
		if (!isfinite(e)) {
			if (lane == 0)
				atomicAdd(skipped, 1ull);
			continue;
		}
		const float g = lr * e;
		/* Hot rows (step scale s < 1, see row_scales): instead of adding s * delta on every
		 * rating, add the whole delta with probability s. Same expected step, and the atomic
		 * traffic on a row held by c warps drops by c / HOT_C -- the hottest rows are what
		 * bounds throughput under skew. The coin hashes the rating's index. */
		const float cu = ru ? __ldg(ru + x) : su ? __ldg(su + u) : 1.f;
		const float ci = ri ? __ldg(ri + x) : si ? __ldg(si + i) : 1.f;
		const bool wu = cu >= 1.f || coin01(x, 0x51u) < cu, wi = ci >= 1.f || coin01(x, 0xA7u) < ci;
#pragma unroll
		for (int j = 0; j < V; j++) {
			if (wu)
				stor<T>::add(p + lane + 32 * j, g * qv[j] - ap * pv[j]);
			if (wi)
				stor<T>::add(q + lane + 32 * j, g * pv[j] - aq * qv[j]);
		}
		if (lane == 0) {
			if (wu)
				atomicAdd(bu + u, g - abu * b_u);
			if (wi)
				atomicAdd(bi + i, g - abi * b_i);
		}
	}
}

/* sgd_atomic_h2_kernel: the Hogwild! kernel for fp16 storage when k is a multiple of 64.
 * Scalar 16-bit atomicAdd is slow (measured on an H200: fp16 MovieLens ran at 95 M updates/s
 * against 983 M in fp32), so here lane l owns the adjacent pairs 2(l + 32j), 2(l + 32j) + 1
 * and applies both deltas with one native __half2 atomic (RED.F16x2). Same math as
 * sgd_atomic_kernel; the dot product's order differs from the reference's, which fp16 (judged
 * with a tolerance) does not need. Bytes per update 8k + 28. VP = k / 64 pairs per lane. */
template <int VP>
__global__ void sgd_atomic_h2_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is,
                                     const float *__restrict__ rs, size_t n, __half2 *P, __half2 *Q, float *bu,
                                     float *bi, float mu, const mfs_hparams_t *hp, unsigned long long *skipped,
                                     const float *__restrict__ su, const float *__restrict__ si,
                                     const float *__restrict__ ru, const float *__restrict__ ri)
{
	const int k2 = VP * 32; /* half2 per row */
	const int lane = threadIdx.x & 31;
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t nwarps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const float lr = hp->lr;
	const float ap = lr * hp->lambda_p, aq = lr * hp->lambda_q;
	const float abu = lr * hp->lambda_bu, abi = lr * hp->lambda_bi;
	for (size_t x = warp; x < n; x += nwarps) {
		const uint32_t u = __ldg(us + x), i = __ldg(is + x);
		const float r = __ldg(rs + x);
		if (u == MFS_ROW_NONE || i == MFS_ROW_NONE)
			continue;
		__half2 *p = P + (size_t)u * k2, *q = Q + (size_t)i * k2;
		float2 pv[VP], qv[VP];
		float dot = 0.f;
#pragma unroll
		for (int j = 0; j < VP; j++) {
			pv[j] = __half22float2(__ldcg(p + lane + 32 * j));
			qv[j] = __half22float2(__ldcg(q + lane + 32 * j));
			dot = fmaf(pv[j].x, qv[j].x, dot);
			dot = fmaf(pv[j].y, qv[j].y, dot);
		}
#pragma unroll
		for (int o = 16; o; o >>= 1)
			dot += __shfl_xor_sync(0xffffffffu, dot, o);
		const float b_u = __ldcg(bu + u), b_i = __ldcg(bi + i);
		const float e = r - (mu + b_u + b_i + dot);
		if (!isfinite(e)) {
			if (lane == 0)
				atomicAdd(skipped, 1ull);
			continue;
		}
		const float g = lr * e;
		const float cu = ru ? __ldg(ru + x) : su ? __ldg(su + u) : 1.f;
		const float ci = ri ? __ldg(ri + x) : si ? __ldg(si + i) : 1.f;
		const bool wu = cu >= 1.f || coin01(x, 0x51u) < cu, wi = ci >= 1.f || coin01(x, 0xA7u) < ci;
#pragma unroll
		for (int j = 0; j < VP; j++) {
			if (wu)
				atomicAdd(p + lane + 32 * j, __floats2half2_rn(g * qv[j].x - ap * pv[j].x, g * qv[j].y - ap * pv[j].y));
			if (wi)
				atomicAdd(q + lane + 32 * j, __floats2half2_rn(g * pv[j].x - aq * qv[j].x, g * pv[j].y - aq * qv[j].y));
		}
		if (lane == 0) {
			if (wu)
				atomicAdd(bu + u, g - abu * b_u);
			if (wi)
				atomicAdd(bi + i, g - abi * b_i);
		}
	}
}

/* loss_kernel: block b scores ratings [b*CHUNK, (b+1)*CHUNK); each warp accumulates squared
 * and absolute errors of clipped predictions in double, then the block adds its warps in
 * warp order: part[2b] = sse, part[2b+1] = sae. The host adds blocks in order. Fixed chunking
 * makes the result bit-reproducible for a given set. Rows MFS_ROW_NONE contribute nothing. */
template <typename T, int V>
__global__ void loss_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is,
                            const float *__restrict__ rs, size_t n, const T *__restrict__ P,
                            const T *__restrict__ Q, const float *__restrict__ bu,
                            const float *__restrict__ bi, float mu, const mfs_hparams_t *hp, double *part)
{
	const int k = V * 32;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	__shared__ double s_sse[WARPS_PER_BLOCK], s_sae[WARPS_PER_BLOCK];
	const size_t begin = (size_t)blockIdx.x * LOSS_CHUNK;
	const size_t end = begin + LOSS_CHUNK < n ? begin + LOSS_CHUNK : n;
	const float lo = hp->clip_min, hi = hp->clip_max;
	double sse = 0, sae = 0;
	for (size_t x = begin + w; x < end; x += WARPS_PER_BLOCK) {
		const uint32_t u = us[x], i = is[x];
		/* the reference's predict (loss_ref.c): the same additions in the same order */
		float pred = mu;
		if (u != MFS_ROW_NONE)
			pred = __fadd_rn(pred, bu[u]);
		if (i != MFS_ROW_NONE)
			pred = __fadd_rn(pred, bi[i]);
		if (u != MFS_ROW_NONE && i != MFS_ROW_NONE) {
			float dot = 0.f;
#pragma unroll
			for (int j = 0; j < V; j++)
				dot = fmaf(stor<T>::ld(P + (size_t)u * k + lane + 32 * j),
				           stor<T>::ld(Q + (size_t)i * k + lane + 32 * j), dot);
#pragma unroll
			for (int o = 16; o; o >>= 1)
				dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
			pred = __fadd_rn(pred, dot);
		}
		/* compares, not fminf/fmaxf: a NaN prediction must stay NaN and show in the loss */
		if (pred < lo)
			pred = lo;
		if (pred > hi)
			pred = hi;
		const double e = (double)rs[x] - (double)pred;
		sse += e * e;
		sae += fabs(e);
	}
	if (lane == 0) {
		s_sse[w] = sse;
		s_sae[w] = sae;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		double a = 0, b = 0;
		for (int j = 0; j < WARPS_PER_BLOCK; j++) {
			a += s_sse[j];
			b += s_sae[j];
		}
		part[2 * blockIdx.x] = a;
		part[2 * blockIdx.x + 1] = b;
	}
}

/* ---- host side ----------------------------------------------------------------------- */

static struct cuda_impl *impl_of(mfs_engine_t *e) { return (struct cuda_impl *)e->impl; }

/* grow one device table to `need` rows (copy under the synchronous stream) */
static int dev_grow(struct cuda_impl *c, void **F, float **b, uint32_t *cap, uint32_t need, int k)
{
	if (need <= *cap)
		return 0;
	uint64_t nc = *cap ? *cap : 1024;
	while (nc < need)
		nc *= 2;
	void *nf = NULL;
	float *nb = NULL;
	MFS_CUDA_TRY(cudaMalloc(&nf, nc * (size_t)k * c->es));
	if (cudaMalloc(&nb, nc * sizeof(float)) != cudaSuccess) {
		cudaFree(nf);
		MFS_CUDA_TRY(cudaGetLastError());
		return MFS_EGPU;
	}
	if (*cap) {
		MFS_CUDA_TRY(cudaMemcpyAsync(nf, *F, (size_t)*cap * k * c->es, cudaMemcpyDeviceToDevice, c->stream));
		MFS_CUDA_TRY(cudaMemcpyAsync(nb, *b, (size_t)*cap * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	}
	cudaFree(*F);
	cudaFree(*b);
	*F = nf;
	*b = nb;
	*cap = (uint32_t)nc;
	return 0;
}

/* Host fp32 rows [a, a+n) -> device rows (converted to fp16 on the host when needed). */
static int put_rows(struct cuda_impl *c, void *dst, const float *src, size_t a, size_t n, int k)
{
	const size_t cnt = n * (size_t)k;
	char *d = (char *)dst + a * (size_t)k * c->es;
	if (!c->fp16) {
		MFS_CUDA_TRY(cudaMemcpy(d, src + a * k, cnt * sizeof(float), cudaMemcpyHostToDevice));
		return 0;
	}
	__half *h = (__half *)malloc(cnt * sizeof *h);
	if (!h)
		return ENOMEM;
	for (size_t x = 0; x < cnt; x++)
		h[x] = __float2half_rn(src[a * k + x]);
	cudaError_t err = cudaMemcpy(d, h, cnt * sizeof *h, cudaMemcpyHostToDevice);
	free(h);
	MFS_CUDA_TRY(err);
	return 0;
}

/* Device rows [0, n) -> host fp32. */
static int get_rows(struct cuda_impl *c, float *dst, const void *src, size_t n, int k)
{
	const size_t cnt = n * (size_t)k;
	if (!c->fp16) {
		MFS_CUDA_TRY(cudaMemcpy(dst, src, cnt * sizeof(float), cudaMemcpyDeviceToHost));
		return 0;
	}
	__half *h = (__half *)malloc((cnt ? cnt : 1) * sizeof *h);
	if (!h)
		return ENOMEM;
	cudaError_t err = cudaMemcpy(h, src, cnt * sizeof *h, cudaMemcpyDeviceToHost);
	if (err == cudaSuccess)
		for (size_t x = 0; x < cnt; x++)
			dst[x] = __half2float(h[x]);
	free(h);
	MFS_CUDA_TRY(err);
	return 0;
}

static int cuda_grow(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	mfs_model_t *m = e->model;
	const int k = m->k;
	int rc;
	if ((rc = dev_grow(c, &c->P, &c->bu, &c->cap_u, m->n_users, k)) ||
	    (rc = dev_grow(c, &c->Q, &c->bi, &c->cap_i, m->n_items, k)))
		return rc;
	/* upload rows the host added (initialized by model_store) */
	if (m->n_users > c->n_u) {
		size_t a = c->n_u, n = m->n_users - c->n_u;
		if ((rc = put_rows(c, c->P, m->P, a, n, k)))
			return rc;
		MFS_CUDA_TRY(cudaMemcpy(c->bu + a, m->bu + a, n * sizeof(float), cudaMemcpyHostToDevice));
		c->n_u = m->n_users;
	}
	if (m->n_items > c->n_i) {
		size_t a = c->n_i, n = m->n_items - c->n_i;
		if ((rc = put_rows(c, c->Q, m->Q, a, n, k)))
			return rc;
		MFS_CUDA_TRY(cudaMemcpy(c->bi + a, m->bi + a, n * sizeof(float), cudaMemcpyHostToDevice));
		c->n_i = m->n_items;
	}
	return 0;
}

static void cuda_close(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	if (!c)
		return;
	cudaFree(c->P);
	cudaFree(c->Q);
	cudaFree(c->bu);
	cudaFree(c->bi);
	cudaFree(c->d_hp);
	cudaFree(c->d_skipped);
	cudaFree(c->batch.u);
	cudaFree(c->batch.i);
	cudaFree(c->batch.r);
	cudaFree(c->d_part);
	free(c->cnt_u);
	free(c->cnt_i);
	free(c->h_ru);
	free(c->h_ri);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	free(c);
	e->impl = NULL;
}

static int cuda_can_implement(const mfs_model_t *m, char *why, size_t ws)
{
	if (m->k % 32 || m->k < 32 || m->k > 256) {
		mfs_errf(why, ws, MFS_EINVAL, "the CUDA engine needs model.k to be a multiple of 32 in 32..256 (got %d)", m->k);
		return 0;
	}
	return 1;
}

static int cuda_open(mfs_engine_t *e, char *errstr, size_t es)
{
	if (!cuda_can_implement(e->model, errstr, es))
		return MFS_EINVAL;
	struct cuda_impl *c = (struct cuda_impl *)calloc(1, sizeof *c);
	if (!c)
		return ENOMEM;
	e->impl = c;
	c->dev = e->conf.device;
	c->fp16 = e->conf.dtype == MFS_DTYPE_FP16;
	c->es = c->fp16 ? sizeof(__half) : sizeof(float);
	const char *rpw = getenv("MFS_CUDA_ROWS_PER_WARP"); /* tuning knob for benchmarks */
	c->rows_per_warp = rpw && atoi(rpw) > 0 ? (size_t)atoi(rpw) : 0;
	cudaError_t err = cudaSetDevice(c->dev);
	if (err == cudaSuccess)
		err = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->dev);
	if (err == cudaSuccess)
		err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (err == cudaSuccess)
		err = cudaMalloc(&c->d_hp, sizeof(mfs_hparams_t));
	if (err == cudaSuccess)
		err = cudaMalloc(&c->d_skipped, sizeof(unsigned long long));
	if (err == cudaSuccess)
		err = cudaMemset(c->d_skipped, 0, sizeof(unsigned long long));
	if (err != cudaSuccess) {
		mfs_errf(errstr, es, MFS_EGPU, "CUDA device %d: %s", c->dev, cudaGetErrorString(err));
		cuda_close(e);
		return MFS_EGPU;
	}
	int rc = cuda_grow(e);
	if (rc) {
		mfs_errf(errstr, es, rc, "CUDA device %d: cannot allocate the model", c->dev);
		cuda_close(e);
	}
	return rc;
}

static int cuda_set_hparams(mfs_engine_t *e, const mfs_hparams_t *hp)
{
	struct cuda_impl *c = impl_of(e);
	MFS_CUDA_TRY(cudaMemcpyAsync(c->d_hp, hp, sizeof *hp, cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return 0;
}

template <typename T>
static void launch_sgd_t(struct cuda_impl *c, const struct dev_set *s, int det, int blocks, int threads, float mu,
                         int k)
{
	T *P = (T *)c->P, *Q = (T *)c->Q;
	if (c->fp16 && !det && k % 64 == 0) { /* paired half2 atomics */
		__half2 *P2 = (__half2 *)c->P, *Q2 = (__half2 *)c->Q;
#define H2_CASE(VP)                                                                                              \
	case VP:                                                                                                     \
		sgd_atomic_h2_kernel<VP><<<blocks, threads, 0, c->stream>>>(s->u, s->i, s->r, s->n, P2, Q2, c->bu, c->bi, \
		                                                            mu, c->d_hp, c->d_skipped, s->su, s->si,    \
		                                                            s->ru, s->ri);                              \
		break;
		switch (k / 64) { H2_CASE(1) H2_CASE(2) H2_CASE(3) H2_CASE(4) }
#undef H2_CASE
		return;
	}
#define SGD_CASE(V)                                                                                              \
	case V:                                                                                                      \
		if (det)                                                                                                 \
			sgd_kernel<T, V><<<blocks, threads, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu, c->bi, mu, \
			                                                    c->d_hp, c->d_skipped);                        \
		else                                                                                                     \
			sgd_atomic_kernel<T, V><<<blocks, threads, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu,      \
			                                                           c->bi, mu, c->d_hp, c->d_skipped, s->su, \
			                                                           s->si, s->ru, s->ri);                   \
		break;
	switch (k / 32) {
		SGD_CASE(1) SGD_CASE(2) SGD_CASE(3) SGD_CASE(4) SGD_CASE(5) SGD_CASE(6) SGD_CASE(7) SGD_CASE(8)
	}
#undef SGD_CASE
}

static int launch_sgd(mfs_engine_t *e, const struct dev_set *s)
{
	struct cuda_impl *c = impl_of(e);
	if (!s->n)
		return 0;
	int blocks, threads;
	const int det = e->conf.deterministic;
	if (det) {
		blocks = 1; /* one warp walks the ratings in order: the reference's exact sequence */
		threads = 32;
	} else {
		/* Full grid (SMs x 8 blocks of 8 warps). The plain-store kernel lost updates when two
		 * warps held one row, and had to be capped at rows / rows_per_warp warps (measured on
		 * an H200, 4000 x 2000 planted problem: 16 rows/warp -> RMSE 0.7620, 256 -> 0.7190,
		 * reference 0.7185); the atomic kernel needs no cap unless MFS_CUDA_ROWS_PER_WARP asks
		 * for one (kept for experiments). */
		threads = 32 * WARPS_PER_BLOCK;
		size_t need = (s->n + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
		size_t full = (size_t)c->sms * 8;
		size_t b = need < full ? need : full;
		if (c->rows_per_warp) {
			const mfs_model_t *m = e->model;
			size_t rows = m->n_users < m->n_items ? m->n_users : m->n_items;
			size_t cap = (rows / c->rows_per_warp + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
			b = b < cap ? b : cap;
		}
		blocks = (int)(b ? b : 1);
	}
	const float mu = (float)e->model->mu;
	if (c->fp16)
		launch_sgd_t<__half>(c, s, det, blocks, threads, mu, e->model->k);
	else
		launch_sgd_t<float>(c, s, det, blocks, threads, mu, e->model->k);
	MFS_CUDA_LAUNCHED();
	MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	e->model->events_applied += s->n;
	return 0;
}

template <typename T>
static void launch_loss_t(struct cuda_impl *c, const struct dev_set *s, unsigned blocks, float mu, int k)
{
	const T *P = (const T *)c->P, *Q = (const T *)c->Q;
#define LOSS_CASE(V)                                                                                             \
	case V:                                                                                                      \
		loss_kernel<T, V><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu,  \
		                                                                  c->bi, mu, c->d_hp, c->d_part);      \
		break;
	switch (k / 32) {
		LOSS_CASE(1) LOSS_CASE(2) LOSS_CASE(3) LOSS_CASE(4) LOSS_CASE(5) LOSS_CASE(6) LOSS_CASE(7) LOSS_CASE(8)
	}
#undef LOSS_CASE
}

static int launch_loss(mfs_engine_t *e, const struct dev_set *s, mfs_loss_t *out)
{
	struct cuda_impl *c = impl_of(e);
	memset(out, 0, sizeof *out);
	if (!s->n)
		return 0;
	size_t blocks = (s->n + LOSS_CHUNK - 1) / LOSS_CHUNK;
	if (blocks > c->part_cap) {
		cudaFree(c->d_part);
		c->d_part = NULL;
		c->part_cap = 0;
		MFS_CUDA_TRY(cudaMalloc(&c->d_part, blocks * 2 * sizeof(double)));
		c->part_cap = blocks;
	}
	const float mu = (float)e->model->mu;
	if (c->fp16)
		launch_loss_t<__half>(c, s, (unsigned)blocks, mu, e->model->k);
	else
		launch_loss_t<float>(c, s, (unsigned)blocks, mu, e->model->k);
	MFS_CUDA_LAUNCHED();
	double *h = (double *)malloc(blocks * 2 * sizeof(double));
	if (!h)
		return ENOMEM;
	cudaError_t err = cudaMemcpyAsync(h, c->d_part, blocks * 2 * sizeof(double), cudaMemcpyDeviceToHost, c->stream);
	if (err == cudaSuccess)
		err = cudaStreamSynchronize(c->stream);
	if (err != cudaSuccess) {
		free(h);
		MFS_CUDA_TRY(err);
	}
	for (size_t b = 0; b < blocks; b++) {
		out->sse += h[2 * b];
		out->sae += h[2 * b + 1];
	}
	free(h);
	out->n = s->n;
	out->rmse = sqrt(out->sse / (double)s->n);
	out->mae = out->sae / (double)s->n;
	return 0;
}

static int upload(struct cuda_impl *c, struct dev_set *d, const mfs_batch_t *b)
{
	MFS_CUDA_TRY(cudaMemcpyAsync(d->u, b->u, b->n * sizeof(uint32_t), cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaMemcpyAsync(d->i, b->i, b->n * sizeof(uint32_t), cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaMemcpyAsync(d->r, b->r, b->n * sizeof(float), cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	d->n = b->n;
	return 0;
}

static int alloc_set(struct dev_set *d, size_t n)
{
	if (n == 0)
		n = 1;
	MFS_CUDA_TRY(cudaMalloc(&d->u, n * sizeof(uint32_t)));
	MFS_CUDA_TRY(cudaMalloc(&d->i, n * sizeof(uint32_t)));
	MFS_CUDA_TRY(cudaMalloc(&d->r, n * sizeof(float)));
	return 0;
}

static void free_set(struct dev_set *d)
{
	cudaFree(d->u);
	cudaFree(d->i);
	cudaFree(d->r);
	cudaFree(d->su);
	cudaFree(d->si);
	cudaFree(d->ru);
	cudaFree(d->ri);
	memset(d, 0, sizeof *d);
}

static int stage_batch(mfs_engine_t *e, const mfs_batch_t *b)
{
	struct cuda_impl *c = impl_of(e);
	if (b->n > c->batch_cap) {
		free_set(&c->batch);
		c->batch_cap = 0;
		int rc = alloc_set(&c->batch, b->n);
		if (rc)
			return rc;
		c->batch_cap = b->n;
	}
	return upload(c, &c->batch, b);
}

/* Grow a zeroed counter array to cover `rows`. */
static int grow_counts(uint32_t **cnt, uint32_t *cap, uint32_t rows)
{
	if (rows <= *cap)
		return 0;
	uint32_t nc = *cap ? *cap : 1024;
	while (nc < rows)
		nc = nc > UINT32_MAX / 2 ? rows : nc * 2;
	uint32_t *n = (uint32_t *)realloc(*cnt, (size_t)nc * sizeof *n);
	if (!n)
		return ENOMEM;
	memset(n + *cap, 0, (size_t)(nc - *cap) * sizeof *n);
	*cnt = n;
	*cap = nc;
	return 0;
}

/* Streaming batches get the same hot-row treatment as sets (see row_scales), per rating:
 * count each row's ratings in the batch (counters are reset by walking the batch again, so
 * the cost is O(batch), not O(rows)), and when some row is held by more than HOT_C warps,
 * upload one scale per rating. Measured on an H200 before this: `serve --engine cuda` on a
 * Zipf 0.8 stream (10 000 items) drove a user row to inf after 949 000 events. */
static int batch_scales(mfs_engine_t *e, const mfs_batch_t *b, int *hot)
{
	struct cuda_impl *c = impl_of(e);
	*hot = 0;
	const mfs_model_t *m = e->model;
	int rc;
	if ((rc = grow_counts(&c->cnt_u, &c->cnt_cap_u, m->n_users)) ||
	    (rc = grow_counts(&c->cnt_i, &c->cnt_cap_i, m->n_items)))
		return rc;
	for (size_t x = 0; x < b->n; x++) {
		c->cnt_u[b->u[x]]++;
		c->cnt_i[b->i[x]]++;
	}
	const double full = (double)c->sms * 8 * WARPS_PER_BLOCK;
	const double warps = (double)b->n < full ? (double)b->n : full;
	const double k = warps / (double)b->n; /* c_r = k * n_r */
	if (b->n > c->h_r_cap) {
		float *nu = (float *)realloc(c->h_ru, b->n * sizeof *nu);
		if (nu)
			c->h_ru = nu;
		float *ni = (float *)realloc(c->h_ri, b->n * sizeof *ni);
		if (ni)
			c->h_ri = ni;
		if (!nu || !ni)
			rc = ENOMEM;
		else
			c->h_r_cap = b->n;
	}
	for (size_t x = 0; x < b->n && !rc; x++) {
		double cu = k * c->cnt_u[b->u[x]], ci = k * c->cnt_i[b->i[x]];
		c->h_ru[x] = cu > HOT_C ? (float)(HOT_C / cu) : 1.0f;
		c->h_ri[x] = ci > HOT_C ? (float)(HOT_C / ci) : 1.0f;
		*hot |= cu > HOT_C || ci > HOT_C;
	}
	for (size_t x = 0; x < b->n; x++) /* reset what was counted */
		c->cnt_u[b->u[x]] = c->cnt_i[b->i[x]] = 0;
	if (rc || !*hot)
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

static int cuda_sgd(mfs_engine_t *e, const mfs_batch_t *b)
{
	int rc = stage_batch(e, b);
	if (rc)
		return rc;
	struct dev_set s = impl_of(e)->batch; /* per-rating scales only for this launch */
	s.ru = s.ri = NULL;
	if (!e->conf.deterministic && b->n) {
		int hot;
		if ((rc = batch_scales(e, b, &hot)))
			return rc;
		if (hot) {
			s.ru = impl_of(e)->batch.ru;
			s.ri = impl_of(e)->batch.ri;
		}
	}
	return launch_sgd(e, &s);
}

static int cuda_loss(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *out)
{
	int rc = stage_batch(e, b);
	return rc ? rc : launch_loss(e, &impl_of(e)->batch, out);
}

/* A set is uploaded in a seeded random order: files are often sorted by user or time, and
 * warps working on neighbouring ratings would then all hold the same row.
 * The shuffle is two passes with good locality (a plain Fisher-Yates over 100 M ratings is
 * ~6 cache misses per swap, tens of seconds): each rating draws one of SHUF_BUCKETS buckets
 * and is scattered there (4096 sequential write streams), then each bucket, small enough for
 * L2, gets a Fisher-Yates. The result is a uniform random permutation. */
#define SHUF_BUCKETS 4096
static int shuffled_copy(const mfs_batch_t *b, uint64_t seed, uint32_t *hu, uint32_t *hi, float *hr)
{
	const size_t n = b->n;
	uint16_t *bk = (uint16_t *)malloc((n ? n : 1) * sizeof *bk);
	size_t *start = (size_t *)calloc(SHUF_BUCKETS + 1, sizeof *start);
	if (!bk || !start) {
		free(bk);
		free(start);
		return ENOMEM;
	}
	mfs_rng_t r;
	mfs_rng_seed(&r, seed);
	for (size_t x = 0; x < n; x++) {
		bk[x] = (uint16_t)mfs_rng_below(&r, SHUF_BUCKETS);
		start[bk[x] + 1]++;
	}
	for (int j = 0; j < SHUF_BUCKETS; j++)
		start[j + 1] += start[j];
	for (size_t x = 0; x < n; x++) {
		size_t y = start[bk[x]]++;
		hu[y] = b->u[x], hi[y] = b->i[x], hr[y] = b->r[x];
	}
	/* start[j] is now the end of bucket j, i.e. the beginning of bucket j + 1 */
	for (int j = 0; j < SHUF_BUCKETS; j++) {
		size_t lo = j ? start[j - 1] : 0, hi_ = start[j];
		for (size_t x = hi_ - lo; x > 1; x--) {
			size_t a = lo + x - 1, c = lo + (size_t)mfs_rng_below(&r, x);
			uint32_t tu = hu[a], ti = hi[a];
			float tr = hr[a];
			hu[a] = hu[c], hi[a] = hi[c], hr[a] = hr[c];
			hu[c] = tu, hi[c] = ti, hr[c] = tr;
		}
	}
	free(bk);
	free(start);
	return 0;
}

/* Per-row step scales of a set for the atomic Hogwild kernel. With W warps in flight over N
 * iid-ordered ratings, row r (n_r ratings) is held by about c_r = W n_r / N warps at once;
 * each of their deltas is computed from the same stale row, so summing them takes a step up to
 * c_r times the intended one; SGD stays stable while c_r lr |p|^2 is well below 2. The kernel
 * scales row r's deltas by min(1, HOT_C / c_r): rows shared by fewer than HOT_C warps keep
 * the exact Hogwild step, hot rows take an averaged (mini-batch) step. Measured on an H200:
 * no scaling diverged at Zipf 1.2 (c ~ 1500 on the top item); scaling every row with c > 1
 * over-damped a 4000 x 2000 problem where c ~ 2-4 everywhere (RMSE 0.8176 vs 0.7197 unscaled,
 * reference 0.7185). A set without hot rows gets no scale array (no extra loads). */
static int row_scales(const mfs_batch_t *b, uint32_t rows, const uint32_t *col, double warps, float **dev)
{
	*dev = NULL;
	if (!rows || !b->n)
		return 0;
	uint32_t *cnt = (uint32_t *)calloc(rows, sizeof *cnt);
	float *sc = (float *)malloc((size_t)rows * sizeof *sc);
	if (!cnt || !sc) {
		free(cnt);
		free(sc);
		return ENOMEM;
	}
	for (size_t x = 0; x < b->n; x++)
		if (col[x] < rows)
			cnt[col[x]]++;
	size_t hot = 0;
	for (uint32_t r = 0; r < rows; r++) {
		double c = warps * (double)cnt[r] / (double)b->n;
		sc[r] = c > HOT_C ? (float)(HOT_C / c) : 1.0f;
		hot += c > HOT_C;
	}
	free(cnt);
	if (!hot) {
		free(sc);
		return 0;
	}
	cudaError_t err = cudaMalloc(dev, (size_t)rows * sizeof *sc);
	if (err == cudaSuccess)
		err = cudaMemcpy(*dev, sc, (size_t)rows * sizeof *sc, cudaMemcpyHostToDevice);
	free(sc);
	if (err != cudaSuccess) {
		cudaFree(*dev);
		*dev = NULL;
		MFS_CUDA_TRY(err);
	}
	mfs_debug("cuda", "msg=\"row scales\" rows=%u hot_rows=%zu warps=%.0f", rows, hot, warps);
	return 0;
}

static int cuda_set_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_set_t **out)
{
	struct dev_set *d = (struct dev_set *)calloc(1, sizeof *d);
	if (!d)
		return ENOMEM;
	mfs_batch_t sh = {NULL, NULL, NULL, b->n};
	uint32_t *hu = (uint32_t *)malloc((b->n ? b->n : 1) * sizeof *hu);
	uint32_t *hi = (uint32_t *)malloc((b->n ? b->n : 1) * sizeof *hi);
	float *hr = (float *)malloc((b->n ? b->n : 1) * sizeof *hr);
	int rc = (hu && hi && hr) ? shuffled_copy(b, e->conf.seed ^ 0xC0DA5E7ull, hu, hi, hr) : ENOMEM;
	if (!rc) {
		sh.u = hu, sh.i = hi, sh.r = hr;
		rc = alloc_set(d, b->n);
	}
	if (!rc)
		rc = upload(impl_of(e), d, &sh);
	free(hu);
	free(hi);
	free(hr);
	if (!rc && !e->conf.deterministic) {
		/* warps in flight as launch_sgd will run them (full grid, or fewer for small sets) */
		struct cuda_impl *c = impl_of(e);
		double full = (double)c->sms * 8 * WARPS_PER_BLOCK;
		double warps = (double)b->n < full ? (double)b->n : full;
		rc = row_scales(b, e->model->n_users, b->u, warps, &d->su);
		if (!rc)
			rc = row_scales(b, e->model->n_items, b->i, warps, &d->si);
	}
	if (rc) {
		free_set(d);
		free(d);
		return rc;
	}
	*out = (mfs_set_t *)d;
	return 0;
}

static void cuda_set_free(mfs_engine_t *e, mfs_set_t *s)
{
	(void)e;
	struct dev_set *d = (struct dev_set *)s;
	if (!d)
		return;
	free_set(d);
	free(d);
}

static int cuda_sgd_set(mfs_engine_t *e, mfs_set_t *s, uint64_t epoch)
{
	(void)epoch; /* the order is the set's (shuffled once when loaded by the caller) */
	return launch_sgd(e, (struct dev_set *)s);
}

static int cuda_loss_set(mfs_engine_t *e, mfs_set_t *s, mfs_loss_t *out)
{
	return launch_loss(e, (struct dev_set *)s, out);
}

static int cuda_sync(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	mfs_model_t *m = e->model;
	int rc;
	if ((rc = get_rows(c, m->P, c->P, c->n_u, m->k)) || (rc = get_rows(c, m->Q, c->Q, c->n_i, m->k)))
		return rc;
	MFS_CUDA_TRY(cudaMemcpy(m->bu, c->bu, (size_t)c->n_u * sizeof(float), cudaMemcpyDeviceToHost));
	MFS_CUDA_TRY(cudaMemcpy(m->bi, c->bi, (size_t)c->n_i * sizeof(float), cudaMemcpyDeviceToHost));
	return 0;
}

extern "C" const struct mfs_engine_i mfs_engine_cuda_i = {
	"cuda",        cuda_can_implement, cuda_open,     cuda_close,    cuda_set_hparams, cuda_grow,   cuda_sgd,
	cuda_loss,     cuda_set_load, cuda_set_free, cuda_sgd_set,     cuda_loss_set, cuda_sync,
};
