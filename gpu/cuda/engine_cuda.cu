/* engine_cuda.cu - the CUDA engine: device-resident factors, Hogwild! SGD with 16-byte row
 * accesses and per-row store modes, a deterministic full-pass loss. Implements
 * gpu/engine_int.h like the CPU engine.
 *
 * DESIGN: the host model (model_store) stays the source of truth for ids and new rows; the
 * device holds P, Q, bu, bi with their own capacities. grow() uploads rows the host added
 * since the last call (their initial values come from model_store, so CPU and GPU start from
 * the same numbers); sync() copies every row back. Hyperparameters live in device memory and
 * every launch reads them there, so a running kernel can be retuned without a relaunch.
 * Calls are synchronous on one stream: each returns with the work done and errors checked.
 *
 * Factor storage is fp32 or fp16 (model.dtype); arithmetic is always fp32, biases fp32. The
 * kernels are templated on the storage type T, so the fp16 path is the same code with half the
 * bytes per update: `stor<T>` (one element) for the deterministic and loss kernels, `vec16<T>`
 * (16 bytes: load, store, vector RED) for the Hogwild kernel.
 *
 * Hogwild kernel (sgd_hogwild_kernel) and row modes (row_modes): at set load each row's
 * expected number of concurrent holders c = (ratings in flight) x (its share of the ratings)
 * picks how its updates land: plain stores (c <= PLAIN_C), atomic deltas (up to HOT_C), or
 * whole deltas with probability HOT_C / c (hot rows). Streaming batches take atomic deltas,
 * with per-rating sampling for hot rows. Measured side by side: docs/ENGINE.md.
 *
 * Knobs for experiments (environment, read at open): MFS_CUDA_PLAIN_C (the plain-store
 * threshold; 0 = atomic deltas for every row), MFS_CUDA_ROWS_PER_WARP (caps the grid).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "common/timeutil.h"
#include "gpu/cuda/cuda_try.h"
#include "gpu/engine_int.h"

#define LOSS_CHUNK 4096 /* ratings per loss block: fixed, so the reduction order is fixed */
#define WARPS_PER_BLOCK 8
#define HOT_C 32.0 /* a row held by more warps than this at once is "hot" (see row_modes) */
#define PLAIN_C 0.1 /* default: rows held by at most this many warps at once take plain stores */

struct dev_set {
	uint32_t *u, *i;
	float *r;
	size_t n;
	float *su, *si; /* per-row mode of the Hogwild kernel (sets; NULL = du/di for every row): row_modes */
	float *ru, *ri; /* per-rating mode (streaming batches with hot rows; NULL = none) */
	float du, di;   /* the mode of every row of a side when su/si is NULL */
	size_t r_cap;
};

/* Host side of the persistent kernel's device ring (see sgd_persistent_kernel). */
struct pk_dev;
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
	double plain_c; /* MFS_CUDA_PLAIN_C: rows with expected concurrency <= this take plain stores */
	int hog_bps;    /* resident blocks per SM of the Hogwild kernel (occupancy) */
	int hog_g;      /* ratings a warp holds at once in the Hogwild kernel */
	uint32_t launches; /* salts the sampling coins of streaming batches */
	struct pk_host pk;
	/* capture: rows to gather, gathered rows and biases (device, and pinned host) */
	uint32_t *g_rows;
	void *g_F, *g_hF;
	float *g_b, *g_hb;
	size_t g_cap;
	/* the outstanding capture: gathered (the learner may go on), copied to g_hF/g_hb (the
	 * writer converts into cap_du/cap_di) */
	cudaEvent_t cap_gathered, cap_copied;
	int cap_pending, cap_copy_done; /* copy_done: capture itself waited for the copy */
	float *cap_du, *cap_di;
	size_t cap_nu, cap_ni;
};

/* ---- storage traits: how the deterministic and loss kernels read and write one factor ---- */
template <typename T> struct stor;
template <> struct stor<float> {
	static __device__ __forceinline__ float ld(const float *p) { return *p; }
	static __device__ __forceinline__ void st(float *p, float v) { *p = v; }
};
template <> struct stor<__half> {
	static __device__ __forceinline__ float ld(const __half *p) { return __half2float(*p); }
	static __device__ __forceinline__ void st(__half *p, float v) { *p = __float2half_rn(v); }
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

/* The salt of a launch's coins: epoch (sets) or launch count (batches), mixed. */
static inline uint32_t mfs_coin_salt(uint64_t x)
{
	return (uint32_t)(mfs_mix64(0xC01Full, x) >> 16);
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

/* ---- 16-byte vectors: the unit of access of the Hogwild kernel ------------------------
 * A vector stays in its storage form (raw) in registers and is widened element by element
 * where the math uses it: fp16 rows cost half the registers, which is occupancy. */
template <typename T> struct vec16;
template <> struct vec16<float> {
	static constexpr int E = 4; /* elements per 16 bytes */
	typedef float4 raw;
	static __device__ __forceinline__ raw ld(const float *p)
	{
		return __ldcg(reinterpret_cast<const float4 *>(p)); /* L2: other SMs write there */
	}
	static __device__ __forceinline__ float get(const raw &v, int t)
	{
		return t == 0 ? v.x : t == 1 ? v.y : t == 2 ? v.z : v.w;
	}
	static __device__ __forceinline__ void st(float *p, const float *f)
	{
		*reinterpret_cast<float4 *>(p) = make_float4(f[0], f[1], f[2], f[3]);
	}
	/* one 16-byte reduction in L2 (sm_90: red.global.add.v4.f32) */
	static __device__ __forceinline__ void red(float *p, const float *f)
	{
		asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(f[0]), "f"(f[1]), "f"(f[2]),
		             "f"(f[3])
		             : "memory");
	}
};
template <> struct vec16<__half> {
	static constexpr int E = 8;
	typedef uint4 raw;
	static __device__ __forceinline__ uint32_t pack(float a, float b)
	{
		const __half2 h = __floats2half2_rn(a, b);
		uint32_t w;
		memcpy(&w, &h, sizeof w);
		return w;
	}
	static __device__ __forceinline__ raw ld(const __half *p) { return __ldcg(reinterpret_cast<const uint4 *>(p)); }
	static __device__ __forceinline__ float get(const raw &v, int t)
	{
		const uint32_t w = t < 2 ? v.x : t < 4 ? v.y : t < 6 ? v.z : v.w;
		__half2 h;
		memcpy(&h, &w, sizeof w);
		return t & 1 ? __high2float(h) : __low2float(h);
	}
	static __device__ __forceinline__ void st(__half *p, const float *f)
	{
		*reinterpret_cast<uint4 *>(p) = make_uint4(pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]), pack(f[6], f[7]));
	}
	/* one 16-byte reduction of four half2 pairs in L2 (sm_90: red.global.add.noftz.v4.f16x2) */
	static __device__ __forceinline__ void red(__half *p, const float *f)
	{
		asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(pack(f[0], f[1])),
		             "r"(pack(f[2], f[3])), "r"(pack(f[4], f[5])), "r"(pack(f[6], f[7]))
		             : "memory");
	}
};

/* How a row of K elements of T is cut for sgd_hogwild_kernel: NV 16-byte vectors, L lanes per
 * update (16, 8 or 4: the widest that divides NV), V vectors per lane, 32 / L updates per warp. */
template <typename T, int K> struct hog_shape {
	static constexpr int NV = K * (int)sizeof(T) / 16;
	static constexpr int L = NV % 16 == 0 ? 16 : NV % 8 == 0 ? 8 : 4;
	static constexpr int V = NV / L;
	static constexpr int G = 32 / L;
};

/* Row modes of the Hogwild kernel (per row in a set's mode arrays, per rating for batches):
 *   m > 1 (MODE_PLAIN): plain read-modify-write store -- the row is held by at most ~PLAIN_C
 *         warps at once, so a lost update is rare and Hogwild! tolerates it;
 *   m = 1: the delta lands with a vector atomic (RED) -- rows several warps hold at once;
 *   m < 1: hot row: the whole delta lands with probability m (sampled, see row_modes). */
#define MODE_PLAIN 2.0f

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
 * leave the dependency chain. Row modes (above) come from md_u/md_i (per row, sets), mr_u/mr_i
 * (per rating, batches) or mode_u/mode_i (the whole side). Bytes per update: 16k + 28 in fp32,
 * 8k + 28 in fp16. */
/* The learning-rate terms of one SGD step, read from the hyperparameters in device memory. */
struct hog_coef {
	float lr, ap, aq, abu, abi, dp, dq, dbu, dbi;
	__device__ __forceinline__ void load(const mfs_hparams_t *hp)
	{
		lr = __ldcg(&hp->lr); /* L2: the host retunes it while a persistent kernel runs */
		ap = lr * __ldcg(&hp->lambda_p), aq = lr * __ldcg(&hp->lambda_q);
		abu = lr * __ldcg(&hp->lambda_bu), abi = lr * __ldcg(&hp->lambda_bi);
		dp = 1.f - ap, dq = 1.f - aq, dbu = 1.f - abu, dbi = 1.f - abi;
	}
};

/* One Hogwild! update by a group of L lanes (lane `sub` of its group): rating (u, i, r) with row
 * modes cu, ci (see MODE_PLAIN), coin index x. Every lane of the warp must call it (the dot
 * product's butterfly is a warp shuffle); a group with live == false only takes part in it.
 * Shared by the batch kernel and the persistent kernel. */
template <typename T, int K>
__device__ __forceinline__ void hog_step(bool live, uint32_t u, uint32_t i, float r, size_t x, uint32_t salt, float cu,
                                         float ci, int sub, T *P, T *Q, float *bu, float *bi, float mu,
                                         const hog_coef &co, unsigned long long *skipped)
{
	using S = hog_shape<T, K>;
	constexpr int E = vec16<T>::E, L = S::L, V = S::V;
	T *p = P + (size_t)u * K + sub * E, *q = Q + (size_t)i * K + sub * E;
	typename vec16<T>::raw pv[V], qv[V];
	float dot = 0.f, b_u = 0.f, b_i = 0.f;
	if (live) {
#pragma unroll
		for (int j = 0; j < V; j++) {
			pv[j] = vec16<T>::ld(p + j * L * E);
			qv[j] = vec16<T>::ld(q + j * L * E);
		}
		b_u = __ldcg(bu + u), b_i = __ldcg(bi + i);
#pragma unroll
		for (int j = 0; j < V; j++)
#pragma unroll
			for (int t = 0; t < E; t++)
				dot = fmaf(vec16<T>::get(pv[j], t), vec16<T>::get(qv[j], t), dot);
	}
#pragma unroll
	for (int o = L / 2; o; o >>= 1)
		dot += __shfl_xor_sync(0xffffffffu, dot, o);
	if (!live)
		return;
	const float e = r - (mu + b_u + b_i + dot);
	if (!isfinite(e)) { /* never let NaN/inf reach the factors */
		if (sub == 0)
			atomicAdd(skipped, 1ull);
		return;
	}
	const float g = co.lr * e;
	/* sampled hot rows: the coin hashes the rating's index and the launch's salt */
	const bool wu = cu >= 1.f || coin01(x, salt ^ 0x51u) < cu;
	const bool wi = ci >= 1.f || coin01(x, salt ^ 0xA7u) < ci;
#define PV(t) vec16<T>::get(pv[j], t)
#define QV(t) vec16<T>::get(qv[j], t)
#pragma unroll
	for (int j = 0; j < V; j++) {
		float f[E];
		if (cu > 1.f) {
#pragma unroll
			for (int t = 0; t < E; t++)
				f[t] = fmaf(g, QV(t), co.dp * PV(t));
			vec16<T>::st(p + j * L * E, f);
		} else if (wu) {
#pragma unroll
			for (int t = 0; t < E; t++)
				f[t] = g * QV(t) - co.ap * PV(t);
			vec16<T>::red(p + j * L * E, f);
		}
		if (ci > 1.f) {
#pragma unroll
			for (int t = 0; t < E; t++)
				f[t] = fmaf(g, PV(t), co.dq * QV(t));
			vec16<T>::st(q + j * L * E, f);
		} else if (wi) {
#pragma unroll
			for (int t = 0; t < E; t++)
				f[t] = g * PV(t) - co.aq * QV(t);
			vec16<T>::red(q + j * L * E, f);
		}
	}
#undef PV
#undef QV
	if (sub == 0) {
		if (cu > 1.f)
			bu[u] = fmaf(co.dbu, b_u, g);
		else if (wu)
			atomicAdd(bu + u, g - co.abu * b_u);
		if (ci > 1.f)
			bi[i] = fmaf(co.dbi, b_i, g);
		else if (wi)
			atomicAdd(bi + i, g - co.abi * b_i);
	}
}

template <typename T, int K>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)
	sgd_hogwild_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is, const float *__restrict__ rs,
	                   size_t n, T *P, T *Q, float *bu, float *bi, float mu, const mfs_hparams_t *hp,
	                   unsigned long long *skipped, const float *__restrict__ md_u, const float *__restrict__ md_i,
	                   const float *__restrict__ mr_u, const float *__restrict__ mr_i, float mode_u, float mode_i,
	                   uint32_t salt)
{
	using S = hog_shape<T, K>;
	constexpr int L = S::L, G = S::G;
	const int lane = threadIdx.x & 31, sub = lane % L, grp = lane / L;
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t stride = ((gridDim.x * (size_t)blockDim.x) >> 5) * G;
	hog_coef co;
	co.load(hp);
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

/* ---- the persistent kernel and its device ring (streaming batches) -------------------------
 * The host publishes batches into S slots of device memory (pk_submit); one kernel launched
 * once (SMs x occupancy, less room for the loss and gather kernels) claims and applies them.
 *
 * Work is cut in chunks of PK_CHUNK ratings numbered across the whole stream. Slot q (the
 * q-th batch, in slot q % S) covers chunks [first, first + nchunks). A warp takes the next
 * chunk number t from one global ticket counter (never reset while the kernel runs), walks
 * its own slot cursor forward to the slot holding t (waiting if it is not published yet) and
 * applies the chunk with the same hog_step as the batch kernel. Why a ticket and not a claim
 * counter per slot: a late warp could otherwise claim from a slot already reused.
 *
 * Publish (host, copy stream, in order): the slot's ratings (and per-rating hot-row modes),
 * seq[s] = 0 (rewrite mark), its header, then seq[s] = q + 1 (a seqlock: a warp re-reads seq
 * after the header and retries if it moved). Stream order puts the data in device memory before seq;
 * the kernel reads seq with a volatile load, fences, then reads header and ratings through
 * L2 (__ldcg: L1 is not coherent and the slot is rewritten; the header into the warp's
 * shared-memory copy, see pk_cap). seq[s] > q + 1 means slot q
 * was consumed and reused, so chunk t lies beyond it; seq[s] < q + 1: not published yet.
 *
 * Completion: after its chunk a warp fences and counts it in done[s]; the warp that counts
 * the last chunk resets done[s], waits until the slots before it are consumed (consumed ==
 * q), and sets consumed = q + 1 in device memory and in mapped host memory (system fence).
 * The host reuses a slot, its staging buffer and the model (snapshots, growth) only after
 * `consumed` passed it: that is the quiesce handshake. Stop: the host sets *stop when
 * everything is consumed; warps waiting for a slot see it and return. */
#define PK_CHUNK 256 /* ratings per ticket */

struct pk_hdr {
	unsigned long long first; /* first chunk number */
	uint32_t nchunks, n;      /* chunks, ratings */
	float mu;                 /* global mean when the batch was published */
	uint32_t salt;            /* sampling coins */
	/* the ratings: the slot's own buffers, or (mfs_engine_sgd_epoch_stream) a device-resident set */
	const uint32_t *u, *i;
	const float *r;
	const float *mr_u, *mr_i; /* per-rating row modes, or NULL */
	const float *md_u, *md_i; /* per-row row modes (sets), or NULL: du / di for the whole side */
	float du, di;             /* 1: atomic deltas (streaming batches) */
};

struct pk_dev {
	const pk_hdr *hdr;
	const unsigned long long *seq;
	unsigned int *done;
	unsigned long long *ticket, *consumed;
	unsigned long long *consumed_host; /* mapped pinned host memory */
	unsigned int *resident;             /* blocks started (device) */
	unsigned long long *resident_host;  /* = gridDim.x once all have (mapped pinned) */
	const unsigned int *stop;
	uint32_t S, cap;
};

/* The register cap of the persistent kernel: the resident blocks per SM the batch kernel gets
 * for the same row shape (its occupancy on sm_90 at this compiler: 40-48 registers for one
 * 16-byte vector per lane, 56-64 for two or three, 72-80 for four or five, ~104 for seven).
 * Uncapped, the slot bookkeeping took the kernel to 80-88 registers: 3 blocks per SM for fp16
 * k=128 where the batch kernel runs 6, 2 for fp32 k=128 (1 once a loss kernel's room is left),
 * and the ring fell 11-15 % behind one launch (docs/BENCHMARKS.md). 24-40 bytes spill at some
 * k; measured only at fp16 k=128 (H100), where the cap of 6 (24 B spilled) beat the
 * spill-free variants beside it (cap 4, or no cap). Other shapes follow the same rule unmeasured. */
template <typename T, int K> struct pk_cap {
	static constexpr int V = hog_shape<T, K>::V;
	static constexpr int value = V == 1 ? (sizeof(T) == 2 ? 6 : 5) : V <= 3 ? 4 : V <= 5 ? 3 : 2;
};

template <typename T, int K>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK, (pk_cap<T, K>::value))
	sgd_persistent_kernel(pk_dev a, T *P, T *Q, float *bu, float *bi, const mfs_hparams_t *hp,
	                      unsigned long long *skipped, unsigned long long q0)
{
	using S = hog_shape<T, K>;
	constexpr int L = S::L, G = S::G;
	const int lane = threadIdx.x & 31, sub = lane % L, grp = lane / L;
	/* the warp's slot header, in shared memory: the chunk loop reads it from there (volatile,
	 * so no register copies), which keeps ~20 registers of pointers out of the loop */
	__shared__ pk_hdr sh[WARPS_PER_BLOCK];
	volatile pk_hdr *my = sh + (threadIdx.x >> 5);
	static_assert(sizeof(pk_hdr) % 4 == 0 && sizeof(pk_hdr) / 4 <= 32, "a header is one word per lane");
	if (threadIdx.x == 0) { /* residency (pk_launch): the last block to start tells the host */
		const unsigned int started = atomicAdd(a.resident, 1u) + 1u;
		if (started == gridDim.x) {
			*(volatile unsigned long long *)a.resident_host = started;
			__threadfence_system();
		}
	}
	unsigned long long q = q0; /* this warp's slot cursor */
	for (;;) {
		unsigned long long t = 0;
		if (lane == 0)
			t = atomicAdd(a.ticket, 1ull);
		t = __shfl_sync(0xffffffffu, t, 0);
		/* find the slot holding chunk t */
		uint32_t s, nchunks, n;
		unsigned long long first;
		for (;;) {
			s = (uint32_t)(q % a.S);
			const volatile unsigned long long *vs = a.seq + s;
			const unsigned long long v = *vs;
			if (v == q + 1) {
				__threadfence();
				/* every lane has read the header this warp held before (racecheck: a lane
				 * running ahead would overwrite it under a slower one) */
				__syncwarp();
				if (lane < (int)(sizeof(pk_hdr) / 4))
					((volatile uint32_t *)my)[lane] = __ldcg((const unsigned int *)(a.hdr + s) + lane);
				__syncwarp();
				first = my->first;
				nchunks = my->nchunks;
				n = my->n;
				__threadfence();
				if (*vs != v)
					continue; /* reused while we read it (a warp stalled a whole ring cycle) */
				if (t < first + nchunks)
					break;
				q++;
			} else if (v > q + 1) {
				q++; /* consumed and reused: t lies beyond it */
			} else {
				if (*(volatile const unsigned int *)a.stop)
					return;
				__nanosleep(256);
			}
		}
		hog_coef co;
		co.load(hp); /* per chunk: a new learning rate applies from the next chunk on */
		const size_t beg = (size_t)(t - first) * PK_CHUNK;
		const size_t end = beg + PK_CHUNK < n ? beg + PK_CHUNK : n;
		for (size_t x0 = beg; x0 < end; x0 += G) {
			const size_t x = x0 + grp;
			const bool in = x < end;
			uint32_t u = MFS_ROW_NONE, i = MFS_ROW_NONE;
			float r = 0.f, cu = 1.f, ci = 1.f;
			if (in) {
				u = __ldcg(my->u + x), i = __ldcg(my->i + x), r = __ldcg(my->r + x);
				if (u != MFS_ROW_NONE && i != MFS_ROW_NONE) {
					const float *ru = my->mr_u, *rw = my->md_u, *ri = my->mr_i, *rj = my->md_i;
					cu = ru ? __ldcg(ru + x) : rw ? __ldg(rw + u) : my->du;
					ci = ri ? __ldcg(ri + x) : rj ? __ldg(rj + i) : my->di;
				}
			}
			const bool live = in && u != MFS_ROW_NONE && i != MFS_ROW_NONE;
			hog_step<T, K>(live, u, i, r, (size_t)first * PK_CHUNK + x, my->salt, cu, ci, sub, P, Q, bu, bi, my->mu,
			               co, skipped);
		}
		__syncwarp();
		if (lane == 0) {
			__threadfence(); /* this chunk's updates before its count */
			const unsigned int d = atomicAdd(a.done + s, 1u) + 1u;
			if (d == nchunks) { /* the last chunk of slot q */
				a.done[s] = 0;
				while (*(volatile unsigned long long *)a.consumed != q)
					__nanosleep(64);
				__threadfence();
				*(volatile unsigned long long *)a.consumed = q + 1;
				__threadfence_system();
				*(volatile unsigned long long *)a.consumed_host = q + 1;
				__threadfence_system();
			}
		}
		__syncwarp();
	}
}

/* gather_rows_kernel: out row j = F row rows[j] (k elements), bout[j] = b[rows[j]]; one warp
 * per row, lanes stride the row. Reads through L2: a persistent kernel may have written it. */
template <typename T>
__global__ void gather_rows_kernel(const T *F, const float *b, const uint32_t *__restrict__ rows, size_t n, int k,
                                   T *out, float *bout)
{
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t warps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const int lane = threadIdx.x & 31;
	for (size_t j = warp; j < n; j += warps) {
		const size_t r = __ldg(rows + j);
		for (int x = lane; x < k; x += 32)
			out[j * (size_t)k + x] = F[r * (size_t)k + x];
		if (lane == 0)
			bout[j] = __ldcg(b + r);
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
static int hog_setup(struct cuda_impl *c, int k);
static int pk_stop(struct cuda_impl *c);
static int pk_quiesce(struct cuda_impl *c);
static int pk_open(mfs_engine_t *e);
static void pk_free(struct cuda_impl *c);

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

/* The stream new rows are uploaded on: with the persistent kernel, its copy stream, so a row
 * lands before any batch published after it can name it (a legacy-stream copy would not be
 * ordered with the ring). Copies from pageable memory are staged before the call returns. */
static cudaStream_t upload_stream(const struct cuda_impl *c)
{
	return c->pk.on ? c->pk.copy : c->stream;
}

/* Host fp32 rows [a, a+n) -> device rows (converted to fp16 on the host when needed), queued
 * on upload_stream (the caller synchronizes it when the kernel is not persistent). */
static int put_rows(struct cuda_impl *c, void *dst, const float *src, size_t a, size_t n, int k)
{
	const size_t cnt = n * (size_t)k;
	char *d = (char *)dst + a * (size_t)k * c->es;
	if (!c->fp16) {
		MFS_CUDA_TRY(cudaMemcpyAsync(d, src + a * k, cnt * sizeof(float), cudaMemcpyHostToDevice, upload_stream(c)));
		return 0;
	}
	__half *h = (__half *)malloc(cnt * sizeof *h);
	if (!h)
		return ENOMEM;
	for (size_t x = 0; x < cnt; x++)
		h[x] = __float2half_rn(src[a * k + x]);
	cudaError_t err = cudaMemcpyAsync(d, h, cnt * sizeof *h, cudaMemcpyHostToDevice, upload_stream(c));
	free(h); /* pageable: already staged */
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
	if ((m->n_users > c->cap_u || m->n_items > c->cap_i) && (rc = pk_stop(c)))
		return rc; /* new tables: the kernel restarts on them at the next batch */
	if ((rc = dev_grow(c, &c->P, &c->bu, &c->cap_u, m->n_users, k)) ||
	    (rc = dev_grow(c, &c->Q, &c->bi, &c->cap_i, m->n_items, k)))
		return rc;
	/* upload rows the host added (initialized by model_store) */
	if (m->n_users > c->n_u) {
		size_t a = c->n_u, n = m->n_users - c->n_u;
		if ((rc = put_rows(c, c->P, m->P, a, n, k)))
			return rc;
		MFS_CUDA_TRY(cudaMemcpyAsync(c->bu + a, m->bu + a, n * sizeof(float), cudaMemcpyHostToDevice,
		                             upload_stream(c)));
		c->n_u = m->n_users;
	}
	if (m->n_items > c->n_i) {
		size_t a = c->n_i, n = m->n_items - c->n_i;
		if ((rc = put_rows(c, c->Q, m->Q, a, n, k)))
			return rc;
		MFS_CUDA_TRY(cudaMemcpyAsync(c->bi + a, m->bi + a, n * sizeof(float), cudaMemcpyHostToDevice,
		                             upload_stream(c)));
		c->n_i = m->n_items;
	}
	if (!c->pk.on) {
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	} else { /* loss and gather kernels (c->stream) must see the new rows too */
		MFS_CUDA_TRY(cudaEventRecord(c->pk.up_ev, c->pk.copy));
		MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->pk.up_ev, 0));
	}
	return 0;
}

static void cuda_close(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	if (!c)
		return;
	pk_free(c);
	cudaFree(c->g_rows);
	cudaFree(c->g_F);
	cudaFree(c->g_b);
	cudaFreeHost(c->g_hF);
	cudaFreeHost(c->g_hb);
	if (c->cap_gathered)
		cudaEventDestroy(c->cap_gathered);
	if (c->cap_copied)
		cudaEventDestroy(c->cap_copied);
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
	/* experiments (bench_gpu_sgd --variants; hidden engine.cuda.* keys) */
	c->rows_per_warp = e->conf.cuda_rows_per_warp > 0 ? (size_t)e->conf.cuda_rows_per_warp : 0;
	c->plain_c = e->conf.cuda_plain_c > 0 ? e->conf.cuda_plain_c : e->conf.cuda_plain_c < 0 ? 0.0 : PLAIN_C;
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
	if (err == cudaSuccess)
		err = cudaEventCreateWithFlags(&c->cap_gathered, cudaEventDisableTiming);
	if (err == cudaSuccess)
		err = cudaEventCreateWithFlags(&c->cap_copied, cudaEventDisableTiming);
	if (err != cudaSuccess) {
		mfs_errf(errstr, es, MFS_EGPU, "CUDA device %d: %s", c->dev, cudaGetErrorString(err));
		cuda_close(e);
		return MFS_EGPU;
	}
	int rc = hog_setup(c, e->model->k);
	if (rc) {
		mfs_errf(errstr, es, rc, "CUDA device %d: cannot size the Hogwild kernel", c->dev);
		cuda_close(e);
		return rc;
	}
	rc = cuda_grow(e);
	if (rc) {
		mfs_errf(errstr, es, rc, "CUDA device %d: cannot allocate the model", c->dev);
		cuda_close(e);
		return rc;
	}
	if (e->conf.persistent && !e->conf.deterministic && (rc = pk_open(e))) {
		mfs_errf(errstr, es, rc, "CUDA device %d: cannot set up the persistent kernel's ring", c->dev);
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
using hog_fn = void (*)(const uint32_t *, const uint32_t *, const float *, size_t, T *, T *, float *, float *, float,
                        const mfs_hparams_t *, unsigned long long *, const float *, const float *, const float *,
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

/* The grid of the Hogwild kernel is SMs x its occupancy; the hot-row estimates need the number
 * of ratings held at once (warps x ratings per warp). Computed once at open: k and the dtype
 * are fixed for the engine's life. */
static int hog_setup(struct cuda_impl *c, int k)
{
	const void *fn = c->fp16 ? (const void *)hog_kernel<__half>(k, &c->hog_g) : (const void *)hog_kernel<float>(k, &c->hog_g);
	if (!fn)
		return MFS_EINVAL;
	int nb = 0;
	MFS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, 32 * WARPS_PER_BLOCK, 0));
	c->hog_bps = nb > 0 ? nb : 1;
	mfs_debug("cuda", "msg=\"hogwild kernel\" k=%d fp16=%d blocks_per_sm=%d ratings_per_warp=%d", k, c->fp16, c->hog_bps,
	          c->hog_g);
	return 0;
}

/* Blocks of the Hogwild launch for n ratings: SMs x occupancy (one wave), fewer for small
 * sets, or capped at rows / MFS_CUDA_ROWS_PER_WARP warps (experiments and tests). */
static size_t hog_blocks(mfs_engine_t *e, size_t n)
{
	const struct cuda_impl *c = impl_of(e);
	const size_t per_block = (size_t)WARPS_PER_BLOCK * c->hog_g;
	size_t need = (n + per_block - 1) / per_block;
	size_t full = (size_t)c->sms * c->hog_bps;
	size_t b = need < full ? need : full;
	if (c->rows_per_warp) {
		const mfs_model_t *m = e->model;
		size_t rows = m->n_users < m->n_items ? m->n_users : m->n_items;
		size_t cap = (rows / c->rows_per_warp + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
		b = b < cap ? b : cap;
	}
	return b ? b : 1;
}

/* Ratings the Hogwild launch holds at once for a set or batch of n ratings. */
static double hog_inflight(mfs_engine_t *e, size_t n)
{
	const struct cuda_impl *c = impl_of(e);
	const double held = (double)hog_blocks(e, n) * WARPS_PER_BLOCK * c->hog_g;
	return (double)n < held ? (double)n : held;
}

template <typename T>
static void launch_sgd_t(struct cuda_impl *c, const struct dev_set *s, int det, int blocks, int threads, float mu,
                         int k, uint32_t salt)
{
	T *P = (T *)c->P, *Q = (T *)c->Q;
	if (det) {
#define SGD_CASE(V)                                                                                              \
	case V:                                                                                                      \
		sgd_kernel<T, V><<<blocks, threads, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu, c->bi, mu,     \
		                                                    c->d_hp, c->d_skipped);                            \
		break;
		switch (k / 32) {
			SGD_CASE(1) SGD_CASE(2) SGD_CASE(3) SGD_CASE(4) SGD_CASE(5) SGD_CASE(6) SGD_CASE(7) SGD_CASE(8)
		}
#undef SGD_CASE
		return;
	}
	int G;
	hog_fn<T> fn = hog_kernel<T>(k, &G);
	fn<<<blocks, threads, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu, c->bi, mu, c->d_hp, c->d_skipped, s->su,
	                                      s->si, s->ru, s->ri, s->du, s->di, salt);
}

/* One Hogwild (or deterministic) pass over s; salt varies the sampling coins between launches. */
static int launch_sgd(mfs_engine_t *e, const struct dev_set *s, uint32_t salt)
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
		/* Full grid (SMs x occupancy blocks of 8 warps). The first (all plain-store) kernel lost
		 * updates when two warps held one row and had to be capped at rows / rows_per_warp
		 * warps (H200, 4000 x 2000 planted problem: 16 rows/warp -> RMSE 0.7620, 256 -> 0.7190,
		 * reference 0.7185); now only rows that few warps hold take plain stores (row_modes), so
		 * no cap is needed unless MFS_CUDA_ROWS_PER_WARP asks for one. */
		threads = 32 * WARPS_PER_BLOCK;
		blocks = (int)hog_blocks(e, s->n);
	}
	const float mu = (float)e->model->mu;
	if (c->fp16)
		launch_sgd_t<__half>(c, s, det, blocks, threads, mu, e->model->k, salt);
	else
		launch_sgd_t<float>(c, s, det, blocks, threads, mu, e->model->k, salt);
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

template <typename T> static const void *loss_fn(int k)
{
	switch (k / 32) {
#define LOSS_FN(V)                                                                                               \
	case V:                                                                                                      \
		return (const void *)loss_kernel<T, V>;
		LOSS_FN(1) LOSS_FN(2) LOSS_FN(3) LOSS_FN(4) LOSS_FN(5) LOSS_FN(6) LOSS_FN(7) LOSS_FN(8)
#undef LOSS_FN
	}
	return NULL;
}

/* Wait for the engine's stream, whose loss or gather kernel may run beside the persistent
 * kernel. If it has not finished after PK_BESIDE_MS, it most likely waits for an SM the
 * persistent kernel holds (a tool or an MPS share changed what fits, and the residency check
 * could not see it): stop the persistent kernel, which frees them, and stop it for loss and
 * gather calls from then on. */
#define PK_BESIDE_MS 2000
static int beside_wait(struct cuda_impl *c, cudaEvent_t ev)
{
	if (c->pk.running && c->pk.beside) {
		const double t0 = mfs_now_s();
		cudaError_t q;
		for (unsigned spins = 0; (q = ev ? cudaEventQuery(ev) : cudaStreamQuery(c->stream)) == cudaErrorNotReady;
		     spins++) {
			if (spins < 64) /* a loss pass takes tens of microseconds: spin first, as a sync would */
				continue;
			if (mfs_now_s() - t0 > PK_BESIDE_MS / 1e3) {
				mfs_warn("cuda", "msg=\"a kernel beside the persistent kernel did not finish: loss and gather "
				                 "kernels stop it from now on\" waited_ms=%d blocks=%d",
				         PK_BESIDE_MS, c->pk.grid);
				c->pk.beside = 0;
				int rc = pk_stop(c);
				if (rc)
					return rc;
				break;
			}
			struct timespec ts = {0, 2000};
			nanosleep(&ts, NULL);
		}
		if (q != cudaSuccess && q != cudaErrorNotReady)
			MFS_CUDA_TRY(q);
	}
	if (ev)
		MFS_CUDA_TRY(cudaEventSynchronize(ev));
	else
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return 0;
}

/* Wait for the engine's stream (see beside_wait). */
static int beside_sync(struct cuda_impl *c) { return beside_wait(c, NULL); }

static int launch_loss(mfs_engine_t *e, const struct dev_set *s, mfs_loss_t *out)
{
	struct cuda_impl *c = impl_of(e);
	memset(out, 0, sizeof *out);
	if (!s->n)
		return 0;
	size_t blocks = (s->n + LOSS_CHUNK - 1) / LOSS_CHUNK;
	int rc;
	if ((blocks > c->part_cap || !c->pk.beside) && (rc = pk_stop(c)))
		return rc;
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
	if (err != cudaSuccess) {
		free(h);
		MFS_CUDA_TRY(err);
	}
	if ((rc = beside_sync(c))) {
		free(h);
		return rc;
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

/* Per-rating row modes of batch b into ru/ri (n floats each): 1, or HOT_C / c for a row held by
 * c > HOT_C warps at once, with `inflight` ratings held at once. *hot: some row is hot. */
static int scales_into(mfs_engine_t *e, const mfs_batch_t *b, double inflight, float *ru, float *ri, int *hot)
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
	const double k = inflight / (double)b->n; /* c_r = k * n_r */
	for (size_t x = 0; x < b->n; x++) {
		double cu = k * c->cnt_u[b->u[x]], ci = k * c->cnt_i[b->i[x]];
		ru[x] = cu > HOT_C ? (float)(HOT_C / cu) : 1.0f;
		ri[x] = ci > HOT_C ? (float)(HOT_C / ci) : 1.0f;
		*hot |= cu > HOT_C || ci > HOT_C;
	}
	for (size_t x = 0; x < b->n; x++) /* reset what was counted */
		c->cnt_u[b->u[x]] = c->cnt_i[b->i[x]] = 0;
	return 0;
}

/* Streaming batches get the same hot-row treatment as sets (see row_modes), per rating:
 * count each row's ratings in the batch (counters are reset by walking the batch again, so
 * the cost is O(batch), not O(rows)), and when some row is held by more than HOT_C warps,
 * upload one scale per rating. Measured on an H200 before this: `serve --engine cuda` on a
 * Zipf 0.8 stream (10 000 items) drove a user row to inf after 949 000 events. */
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

/* ---- the persistent kernel: host side ------------------------------------------------------ */
#define PK_SLOTS 8
#define PK_SLOT_RATINGS (1u << 18) /* 256 Ki ratings (3 MiB, 5 with row modes) per slot */

template <typename T>
using pk_fn = void (*)(pk_dev, T *, T *, float *, float *, const mfs_hparams_t *, unsigned long long *,
                       unsigned long long);

template <typename T> static pk_fn<T> pk_kernel(int k)
{
	switch (k) {
#define PK_CASE(K)                                                                                               \
	case K:                                                                                                      \
		return sgd_persistent_kernel<T, K>;
		PK_CASE(32) PK_CASE(64) PK_CASE(96) PK_CASE(128) PK_CASE(160) PK_CASE(192) PK_CASE(224) PK_CASE(256)
#undef PK_CASE
	}
	return NULL;
}

template <typename T> static const void *loss_fn(int k);

static uint64_t pk_consumed(const struct cuda_impl *c)
{
	return __atomic_load_n(c->pk.h_consumed, __ATOMIC_ACQUIRE);
}

/* The kernel must still be running: it returns only when told to stop. */
static int pk_alive(struct cuda_impl *c)
{
	cudaError_t err = cudaStreamQuery(c->pk.run);
	if (err == cudaErrorNotReady)
		return 0;
	if (err == cudaSuccess) {
		mfs_error("cuda", "msg=\"persistent kernel exited without being stopped\"");
		c->pk.running = 0;
		return MFS_EGPU;
	}
	MFS_CUDA_TRY(err);
	return 0;
}

/* Poll a word of mapped host memory the kernel writes until it reaches want, checking every
 * few thousand polls that the kernel is alive. limit_s > 0: give up after that long and set
 * *late. A wait without a limit that lasts PK_STALL_S says so once (a kernel that stopped
 * consuming is otherwise a silent hang). */
#define PK_STALL_S 10.0
static int pk_poll(struct cuda_impl *c, const unsigned long long *word, uint64_t want, double limit_s, int *late)
{
	const double t0 = mfs_now_s();
	int said = 0;
	for (unsigned spins = 0; __atomic_load_n(word, __ATOMIC_ACQUIRE) < want; spins++) {
		if ((spins & 4095) == 4095) {
			int rc = pk_alive(c);
			if (rc)
				return rc;
			const double waited = mfs_now_s() - t0;
			if (limit_s > 0 && waited > limit_s) {
				*late = 1;
				return 0;
			}
			if (limit_s <= 0 && !said && waited > PK_STALL_S) {
				said = 1;
				mfs_warn("cuda", "msg=\"persistent kernel made no progress\" waited_s=%.0f want=%llu at=%llu "
				                 "published=%llu resident=%llu blocks=%d beside=%d",
				         waited, (unsigned long long)want, __atomic_load_n(word, __ATOMIC_ACQUIRE),
				         (unsigned long long)c->pk.published,
				         __atomic_load_n(&c->pk.h_consumed[1], __ATOMIC_ACQUIRE), c->pk.grid, c->pk.beside);
			}
		}
		if (spins > 64) {
			struct timespec ts = {0, 2000};
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

/* Wait until the kernel consumed slots [0, upto). */
static int pk_wait(struct cuda_impl *c, uint64_t upto)
{
	return pk_poll(c, c->pk.h_consumed, upto, 0, NULL);
}

static int pk_quiesce(struct cuda_impl *c)
{
	return c->pk.running ? pk_wait(c, c->pk.published) : 0;
}

/* Loss and gather kernels fit beside the persistent kernel only if its whole grid is
 * resident: the grid is sized from the occupancy of the plain kernel on every SM. Under
 * compute-sanitizer (instrumented code is larger) or MPS (a client gets part of the SMs) some
 * blocks wait for others that never retire, and a loss kernel queued behind them would wait
 * forever. So after each launch that relies on it, wait (PK_RESIDENT_MS at most) for every
 * block to have started; if they do not, loss and gather calls stop the kernel from then on. */
#define PK_RESIDENT_MS 2000
static int pk_check_resident(struct cuda_impl *c)
{
	struct pk_host *h = &c->pk;
	int late = 0;
	int rc = pk_poll(c, &h->h_consumed[1], (uint64_t)h->grid, PK_RESIDENT_MS / 1e3, &late);
	if (!rc && late) {
		mfs_warn("cuda", "msg=\"persistent kernel not wholly resident: loss and gather kernels stop it from now on\" "
		                 "blocks=%d waited_ms=%d",
		         h->grid, PK_RESIDENT_MS);
		h->beside = 0;
	}
	return rc;
}

static int pk_launch(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	/* every chunk below next_chunk was applied: the tickets restart there */
	*h->h_ticket = h->next_chunk;
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_ticket, h->h_ticket, sizeof *h->h_ticket, cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_stop, &h->h_flag[0], sizeof(unsigned int), cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_resident, 0, sizeof *h->d_resident, h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->copy));
	__atomic_store_n(&h->h_consumed[1], 0ull, __ATOMIC_RELEASE);
	pk_dev a;
	a.hdr = h->d_hdr;
	a.seq = h->d_seq;
	a.done = h->d_done;
	a.ticket = h->d_ticket;
	a.consumed = h->d_consumed;
	a.consumed_host = h->hd_consumed;
	a.resident = h->d_resident;
	a.resident_host = h->hd_consumed + 1;
	a.stop = h->d_stop;
	a.S = h->S;
	a.cap = h->cap;
	const int k = e->model->k;
	if (c->fp16)
		pk_kernel<__half>(k)<<<h->grid, 32 * WARPS_PER_BLOCK, 0, h->run>>>(
			a, (__half *)c->P, (__half *)c->Q, c->bu, c->bi, c->d_hp, c->d_skipped, h->published);
	else
		pk_kernel<float>(k)<<<h->grid, 32 * WARPS_PER_BLOCK, 0, h->run>>>(
			a, (float *)c->P, (float *)c->Q, c->bu, c->bi, c->d_hp, c->d_skipped, h->published);
	MFS_CUDA_LAUNCHED();
	h->running = 1;
	return h->beside ? pk_check_resident(c) : 0;
}

/* Quiesce, then tell the kernel to return and wait for it. Growth of the tables, sets and any
 * allocation happen only while it is stopped (cudaFree synchronizes the device). */
static int pk_stop(struct cuda_impl *c)
{
	struct pk_host *h = &c->pk;
	if (!h->running)
		return 0;
	int rc = pk_quiesce(c);
	h->running = 0; /* whatever happens next, it is not to be waited on again */
	if (rc)
		return rc;
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_stop, &h->h_flag[1], sizeof(unsigned int), cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->run));
	return 0;
}

static void pk_free(struct cuda_impl *c)
{
	struct pk_host *h = &c->pk;
	if (h->running)
		pk_stop(c);
	void *dev[] = {h->d_hdr, h->d_seq, h->d_u, h->d_i, h->d_r, h->d_su, h->d_si, h->d_done, h->d_stop, h->d_ticket,
	               h->d_consumed, h->d_resident};
	for (size_t j = 0; j < sizeof dev / sizeof dev[0]; j++)
		cudaFree(dev[j]);
	void *host[] = {h->h_hdr, h->h_seq, h->h_u, h->h_i, h->h_r, h->h_su, h->h_si, h->h_flag, h->h_ticket, h->h_consumed};
	for (size_t j = 0; j < sizeof host / sizeof host[0]; j++)
		cudaFreeHost(host[j]);
	if (h->run)
		cudaStreamDestroy(h->run);
	if (h->copy)
		cudaStreamDestroy(h->copy);
	if (h->up_ev)
		cudaEventDestroy(h->up_ev);
	memset(h, 0, sizeof *h);
}

/* Allocate the ring and size the grid: SMs x (occupancy - the blocks a loss kernel needs), so
 * the loss and gather kernels of full passes, prequential scoring and snapshots run beside it;
 * without conf.frequent_loss (nobody scores every batch) SMs x occupancy, and those calls stop it. */
static int pk_open(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	const int k = e->model->k;
	h->S = PK_SLOTS;
	h->cap = PK_SLOT_RATINGS;
	const size_t n = (size_t)h->S * h->cap;
	MFS_CUDA_TRY(cudaStreamCreateWithFlags(&h->run, cudaStreamNonBlocking));
	MFS_CUDA_TRY(cudaStreamCreateWithFlags(&h->copy, cudaStreamNonBlocking));
	MFS_CUDA_TRY(cudaEventCreateWithFlags(&h->up_ev, cudaEventDisableTiming));
	MFS_CUDA_TRY(cudaMalloc(&h->d_hdr, h->S * sizeof *h->d_hdr));
	MFS_CUDA_TRY(cudaMalloc(&h->d_seq, h->S * sizeof *h->d_seq));
	MFS_CUDA_TRY(cudaMalloc(&h->d_done, h->S * sizeof *h->d_done));
	MFS_CUDA_TRY(cudaMalloc(&h->d_u, n * sizeof *h->d_u));
	MFS_CUDA_TRY(cudaMalloc(&h->d_i, n * sizeof *h->d_i));
	MFS_CUDA_TRY(cudaMalloc(&h->d_r, n * sizeof *h->d_r));
	MFS_CUDA_TRY(cudaMalloc(&h->d_su, n * sizeof *h->d_su));
	MFS_CUDA_TRY(cudaMalloc(&h->d_si, n * sizeof *h->d_si));
	MFS_CUDA_TRY(cudaMalloc(&h->d_stop, sizeof *h->d_stop));
	MFS_CUDA_TRY(cudaMalloc(&h->d_ticket, sizeof *h->d_ticket));
	MFS_CUDA_TRY(cudaMalloc(&h->d_consumed, sizeof *h->d_consumed));
	MFS_CUDA_TRY(cudaMalloc(&h->d_resident, sizeof *h->d_resident));
	/* on the copy stream and waited for: a legacy-stream memset is not ordered before a
	 * non-blocking stream's kernel, and reused device memory holds an old engine's bytes */
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_seq, 0, h->S * sizeof *h->d_seq, h->copy));
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_done, 0, h->S * sizeof *h->d_done, h->copy));
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_consumed, 0, sizeof *h->d_consumed, h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->copy));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_hdr, h->S * sizeof *h->h_hdr, cudaHostAllocDefault));
	/* h_seq[s]: slot s's sequence number; h_seq[S + s] = 0: the "being rewritten" mark */
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_seq, 2 * h->S * sizeof *h->h_seq, cudaHostAllocDefault));
	memset(h->h_seq, 0, 2 * h->S * sizeof *h->h_seq);
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_u, n * sizeof *h->h_u, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_i, n * sizeof *h->h_i, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_r, n * sizeof *h->h_r, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_su, n * sizeof *h->h_su, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_si, n * sizeof *h->h_si, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_flag, 2 * sizeof *h->h_flag, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_ticket, sizeof *h->h_ticket, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_consumed, 2 * sizeof *h->h_consumed, cudaHostAllocMapped));
	MFS_CUDA_TRY(cudaHostGetDevicePointer((void **)&h->hd_consumed, h->h_consumed, 0));
	h->h_flag[0] = 0;
	h->h_flag[1] = 1;
	h->h_consumed[0] = h->h_consumed[1] = 0;
	/* grid: leave room for one loss block per SM (register-bound kernels of 256 threads) */
	const void *pf = c->fp16 ? (const void *)pk_kernel<__half>(k) : (const void *)pk_kernel<float>(k);
	const void *lf = c->fp16 ? loss_fn<__half>(k) : loss_fn<float>(k);
	int bps = 0;
	cudaFuncAttributes fp, fl;
	MFS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, pf, 32 * WARPS_PER_BLOCK, 0));
	MFS_CUDA_TRY(cudaFuncGetAttributes(&fp, pf));
	MFS_CUDA_TRY(cudaFuncGetAttributes(&fl, lf));
	int reserve = fp.numRegs > 0 ? (fl.numRegs + fp.numRegs - 1) / fp.numRegs : 1;
	if (reserve < 1)
		reserve = 1;
	const int pb = e->conf.cuda_pk_blocks_per_sm; /* experiments */
	int use = pb > 0 ? pb : e->conf.frequent_loss ? bps - reserve : bps;
	/* the persistent kernel uses no shared memory, so the loss kernel's small static block
	 * reduction always fits; registers (and threads, far from the limit) decide */
	h->beside = use + reserve <= bps;
	if (e->conf.cuda_pk_stop_for_loss) /* experiments: stop the kernel for every loss */
		h->beside = 0;
	/* under compute-sanitizer a query of the stream of a loss kernel queued beside the running
	 * persistent kernel did not return while that kernel ran (memcheck on the H100; beside_sync
	 * cannot time out a call that never returns), so the tool would hang serve: stop the
	 * kernel for loss and gather calls instead */
	if (h->beside && getenv("NV_SANITIZER_INJECTION_PORT_BASE")) {
		h->beside = 0;
		mfs_info("cuda", "msg=\"compute-sanitizer attached: loss and gather kernels stop the persistent kernel\"");
	}
	const int pco = e->conf.cuda_pk_carveout; /* experiments: shared memory carveout, percent (-1: 0 %) */
	if (pco)
		MFS_CUDA_TRY(cudaFuncSetAttribute(pf, cudaFuncAttributePreferredSharedMemoryCarveout, pco < 0 ? 0 : pco));
	if (use < 1)
		use = 1;
	h->grid = c->sms * use;
	if (e->conf.cuda_pk_oversubscribe) /* test hook: more blocks than fit, still beside */
		h->grid = 2 * c->sms * bps;
	h->on = 1;
	mfs_info("cuda", "msg=\"persistent kernel\" k=%d fp16=%d blocks=%d blocks_per_sm=%d of=%d regs=%d loss_regs=%d "
	                 "loss_beside=%d slots=%u slot_ratings=%u batch_kernel_blocks_per_sm=%d",
	         k, c->fp16, h->grid, use, bps, fp.numRegs, fl.numRegs, h->beside, h->S, h->cap, c->hog_bps);
	return 0;
}

/* The next slot, once the kernel has consumed the batch that used it before (the ring is
 * full otherwise: that wait is the push back the learner's ring, and then the consumer's
 * partition pause, feel). Launches the kernel if it is not running. */
static int pk_slot(mfs_engine_t *e, uint32_t *slot)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	int rc;
	if (!h->running && (rc = pk_launch(e)))
		return rc;
	if (h->published - pk_consumed(c) >= h->S) {
		h->waits++;
		if ((rc = pk_wait(c, h->published - h->S + 1)))
			return rc;
	}
	*slot = (uint32_t)(h->published % h->S);
	return 0;
}

/* Publish slot s of n ratings described by hd (pointers and modes set by the caller): its
 * header, then its sequence number, on the copy stream after whatever the caller queued. */
static int pk_publish(mfs_engine_t *e, uint32_t s, size_t n)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	struct pk_hdr *hd = &h->h_hdr[s];
	hd->first = h->next_chunk;
	hd->nchunks = (uint32_t)((n + PK_CHUNK - 1) / PK_CHUNK);
	hd->n = (uint32_t)n;
	hd->mu = (float)e->model->mu;
	hd->salt = mfs_coin_salt(++c->launches);
	h->h_seq[s] = h->published + 1;
	/* seqlock: mark the slot before its header changes. A warp scanning past the slot's old
	 * batch reads seq, the header, then seq again; without the mark it could take a half new
	 * header for the old batch (and, finishing it, wait forever for an old `consumed`) */
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_seq + s, h->h_seq + h->S + s, sizeof *h->d_seq, cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_hdr + s, hd, sizeof *hd, cudaMemcpyHostToDevice, h->copy));
	/* seq last: the kernel trusts a slot once seq says so */
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_seq + s, h->h_seq + s, sizeof *h->d_seq, cudaMemcpyHostToDevice, h->copy));
	h->published++;
	h->next_chunk += hd->nchunks;
	return 0;
}

/* Publish batch b into the ring, split at slot size: copied to pinned staging, per-rating
 * row modes computed, queued on the copy stream. Returns without waiting for the kernel. */
static int pk_submit(mfs_engine_t *e, const mfs_batch_t *b)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	int rc;
	for (size_t off = 0; off < b->n;) {
		const size_t n = b->n - off < h->cap ? b->n - off : h->cap;
		uint32_t s;
		if ((rc = pk_slot(e, &s)))
			return rc;
		const size_t base = (size_t)s * h->cap;
		memcpy(h->h_u + base, b->u + off, n * sizeof *h->h_u);
		memcpy(h->h_i + base, b->i + off, n * sizeof *h->h_i);
		memcpy(h->h_r + base, b->r + off, n * sizeof *h->h_r);
		const mfs_batch_t piece = {b->u + off, b->i + off, b->r + off, n};
		const double inflight = (double)h->grid * WARPS_PER_BLOCK * c->hog_g;
		int hot = 0;
		if ((rc = scales_into(e, &piece, inflight < (double)n ? inflight : (double)n, h->h_su + base, h->h_si + base,
		                      &hot)))
			return rc;
		MFS_CUDA_TRY(cudaMemcpyAsync(h->d_u + base, h->h_u + base, n * sizeof *h->d_u, cudaMemcpyHostToDevice, h->copy));
		MFS_CUDA_TRY(cudaMemcpyAsync(h->d_i + base, h->h_i + base, n * sizeof *h->d_i, cudaMemcpyHostToDevice, h->copy));
		MFS_CUDA_TRY(cudaMemcpyAsync(h->d_r + base, h->h_r + base, n * sizeof *h->d_r, cudaMemcpyHostToDevice, h->copy));
		if (hot) {
			MFS_CUDA_TRY(cudaMemcpyAsync(h->d_su + base, h->h_su + base, n * sizeof(float), cudaMemcpyHostToDevice,
			                             h->copy));
			MFS_CUDA_TRY(cudaMemcpyAsync(h->d_si + base, h->h_si + base, n * sizeof(float), cudaMemcpyHostToDevice,
			                             h->copy));
		}
		struct pk_hdr *hd = &h->h_hdr[s];
		hd->u = h->d_u + base;
		hd->i = h->d_i + base;
		hd->r = h->d_r + base;
		hd->mr_u = hot ? h->d_su + base : NULL;
		hd->mr_i = hot ? h->d_si + base : NULL;
		hd->md_u = hd->md_i = NULL;
		hd->du = hd->di = 1.f;
		if ((rc = pk_publish(e, s, n)))
			return rc;
		off += n;
	}
	e->model->events_applied += b->n; /* applied once consumed: snapshots quiesce first */
	return 0;
}

static int cuda_sgd(mfs_engine_t *e, const mfs_batch_t *b)
{
	if (impl_of(e)->pk.on)
		return b->n ? pk_submit(e, b) : 0;
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
	return launch_sgd(e, &s, mfs_coin_salt(++impl_of(e)->launches));
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

/* Per-row modes of a set for the Hogwild kernel (MODE_PLAIN, 1, or a sampling probability).
 * With H ratings held at once over N iid-ordered ratings, row r (n_r ratings) is held by about
 * c_r = H n_r / N warps at once, and a plain read-modify-write loses roughly that fraction of
 * the row's updates.
 *  - c_r <= plain_c (PLAIN_C = 0.1): plain stores. Two holders at once are rare (uniform
 *    1M x 1M, 100M ratings: c ~ 0.013 for every row) and a lost update now and then is the
 *    Hogwild! bargain; a RED costs L2 atomic throughput a plain store does not. The threshold
 *    was 1 first: on H100, 20000 x 20000 x 4M ratings (c ~ 0.4-0.6 everywhere) plain stores
 *    ended at test RMSE 0.773 (fp32) / 0.799 (fp16) against the reference's 0.586 (atomic
 *    deltas: 0.5865 / 0.5880); on 1M x 1M Zipf 0.8, fp16, 1 against 0.1 gave 0.5628 vs 0.5618
 *    (CPU 0.5610) and ran 1 % slower. Lost updates act like a lower rate on the row.
 *  - plain_c < c_r <= HOT_C: atomic deltas, so concurrent holders all land theirs (plain stores
 *    for every row lost too many: 4000 x 2000 planted problem, c ~ 2-4 everywhere, RMSE 0.7620
 *    vs the reference's 0.7185).
 *  - c_r > HOT_C (hot): the c_r deltas computed from one stale row sum to a step c_r times the
 *    intended one (diverged at Zipf 1.2, c ~ 1500 on the top item), so the row takes each delta
 *    whole with probability HOT_C / c_r: an averaged step, c_r / HOT_C times fewer atomics on
 *    the rows that bound throughput under skew. Scaling every row with c > 1 instead over-damped
 *    the 4000 x 2000 problem (0.8176).
 * A side whose rated rows all share one mode gets no array (*dev = NULL, *def = the mode):
 * uniform sets pay no extra load. Rows with no ratings in the set never matter. */
static int row_modes(const mfs_batch_t *b, uint32_t rows, const uint32_t *col, double inflight, double plain_c,
                     float **dev, float *def)
{
	*dev = NULL;
	*def = MODE_PLAIN;
	if (!rows || !b->n)
		return 0;
	uint32_t *cnt = (uint32_t *)calloc(rows, sizeof *cnt);
	float *md = (float *)malloc((size_t)rows * sizeof *md);
	if (!cnt || !md) {
		free(cnt);
		free(md);
		return ENOMEM;
	}
	for (size_t x = 0; x < b->n; x++)
		if (col[x] < rows)
			cnt[col[x]]++;
	size_t hot = 0, atomic = 0, plain = 0;
	float first = -1.f;
	int mixed = 0;
	for (uint32_t r = 0; r < rows; r++) {
		double c = inflight * (double)cnt[r] / (double)b->n;
		md[r] = c > HOT_C ? (float)(HOT_C / c) : c > plain_c ? 1.0f : MODE_PLAIN;
		if (!cnt[r])
			continue;
		hot += c > HOT_C;
		atomic += c > plain_c && c <= HOT_C;
		plain += c <= plain_c;
		if (first < 0)
			first = md[r];
		mixed |= md[r] != first;
	}
	free(cnt);
	mfs_debug("cuda", "msg=\"row modes\" rows=%u plain=%zu atomic=%zu hot=%zu inflight=%.0f", rows, plain, atomic, hot,
	          inflight);
	if (!mixed) {
		*def = first < 0 ? MODE_PLAIN : first;
		free(md);
		return 0;
	}
	cudaError_t err = cudaMalloc(dev, (size_t)rows * sizeof *md);
	if (err == cudaSuccess)
		err = cudaMemcpy(*dev, md, (size_t)rows * sizeof *md, cudaMemcpyHostToDevice);
	free(md);
	if (err != cudaSuccess) {
		cudaFree(*dev);
		*dev = NULL;
		MFS_CUDA_TRY(err);
	}
	return 0;
}

static int cuda_resident_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **out)
{
	int prc = pk_stop(impl_of(e)); /* sets allocate and take the whole device */
	if (prc)
		return prc;
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
	d->du = d->di = 1.f;
	if (!rc && !e->conf.deterministic) {
		/* ratings in flight as launch_sgd will run them (full grid, or fewer for small sets) */
		struct cuda_impl *c = impl_of(e);
		const double inflight = hog_inflight(e, b->n);
		rc = row_modes(b, e->model->n_users, b->u, inflight, c->plain_c, &d->su, &d->du);
		if (!rc)
			rc = row_modes(b, e->model->n_items, b->i, inflight, c->plain_c, &d->si, &d->di);
	}
	if (rc) {
		free_set(d);
		free(d);
		return rc;
	}
	*out = (mfs_resident_t *)d;
	return 0;
}

static void cuda_resident_free(mfs_engine_t *e, mfs_resident_t *s)
{
	pk_stop(impl_of(e));
	(void)e;
	struct dev_set *d = (struct dev_set *)s;
	if (!d)
		return;
	free_set(d);
	free(d);
}

static int cuda_sgd_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch)
{
	int rc = pk_stop(impl_of(e));
	if (rc)
		return rc;
	/* the order is the set's (shuffled once at load); the epoch draws fresh sampling coins */
	return launch_sgd(e, (struct dev_set *)s, mfs_coin_salt(epoch));
}

static int cuda_loss_resident(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *out)
{
	return launch_loss(e, (struct dev_set *)s, out);
}

static int cuda_sync(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	mfs_model_t *m = e->model;
	int rc;
	/* every submitted batch applied; the kernel idles meanwhile, or, where nothing runs beside
	 * it, stops: under compute-sanitizer (H200, memcheck) this copy, made beside the running
	 * kernel after a capture had used the engine's stream, never returned */
	if ((rc = c->pk.beside ? pk_quiesce(c) : pk_stop(c)))
		return rc;
	if (c->pk.on) /* and rows uploaded after the last batch have landed */
		MFS_CUDA_TRY(cudaStreamSynchronize(c->pk.copy));
	if ((rc = get_rows(c, m->P, c->P, c->n_u, m->k)) || (rc = get_rows(c, m->Q, c->Q, c->n_i, m->k)))
		return rc;
	MFS_CUDA_TRY(cudaMemcpy(m->bu, c->bu, (size_t)c->n_u * sizeof(float), cudaMemcpyDeviceToHost));
	MFS_CUDA_TRY(cudaMemcpy(m->bi, c->bi, (size_t)c->n_i * sizeof(float), cudaMemcpyDeviceToHost));
	return 0;
}

/* Room for n gathered rows (doubling). Allocations only while the persistent kernel is
 * stopped, and never under an outstanding capture (its copy reads these buffers). */
static int gather_reserve(mfs_engine_t *e, size_t n)
{
	struct cuda_impl *c = impl_of(e);
	const int k = e->model->k;
	int rc;
	if (n <= c->g_cap)
		return 0;
	if ((rc = pk_stop(c)))
		return rc;
	size_t nc = c->g_cap ? c->g_cap : 4096;
	while (nc < n)
		nc *= 2;
	cudaFree(c->g_rows);
	cudaFree(c->g_F);
	cudaFree(c->g_b);
	cudaFreeHost(c->g_hF);
	cudaFreeHost(c->g_hb);
	c->g_rows = NULL, c->g_F = c->g_hF = NULL, c->g_b = c->g_hb = NULL, c->g_cap = 0;
	MFS_CUDA_TRY(cudaMalloc(&c->g_rows, nc * sizeof *c->g_rows));
	MFS_CUDA_TRY(cudaMalloc(&c->g_F, nc * (size_t)k * c->es));
	MFS_CUDA_TRY(cudaMalloc(&c->g_b, nc * sizeof(float)));
	MFS_CUDA_TRY(cudaHostAlloc(&c->g_hF, nc * (size_t)k * c->es, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&c->g_hb, nc * sizeof(float), cudaHostAllocDefault));
	c->g_cap = nc;
	return 0;
}

/* Gather rows g_rows[at, at + n) of one table (F, b) into g_F/g_b[at, at + n) on the engine's
 * stream (rows already uploaded there). */
static int gather_launch(mfs_engine_t *e, const void *F, const float *b, size_t at, size_t n)
{
	struct cuda_impl *c = impl_of(e);
	const int k = e->model->k;
	if (!n)
		return 0;
	const size_t want = (n + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
	const unsigned blocks = (unsigned)(want < 4096 ? want : 4096);
	void *dF = (char *)c->g_F + at * (size_t)k * c->es;
	if (c->fp16)
		gather_rows_kernel<__half><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
			(const __half *)F, b, c->g_rows + at, n, k, (__half *)dF, c->g_b + at);
	else
		gather_rows_kernel<float><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
			(const float *)F, b, c->g_rows + at, n, k, (float *)dF, c->g_b + at);
	MFS_CUDA_LAUNCHED();
	return 0;
}

/* Gathered row j (pinned g_hF/g_hb, copied back) as fp32: the bias to *bias, k factors to f. */
static void gathered_row(const struct cuda_impl *c, size_t j, int k, float *bias, float *f)
{
	*bias = c->g_hb[j];
	if (c->fp16) {
		const __half *h = (const __half *)c->g_hF + j * (size_t)k;
		for (int x = 0; x < k; x++)
			f[x] = __half2float(h[x]);
	} else {
		memcpy(f, (const float *)c->g_hF + j * (size_t)k, (size_t)k * sizeof(float));
	}
}

/* A snapshot's rows without the learner waiting for the copy: quiesce, gather both tables'
 * rows into g_F/g_b beside the running kernel (users first, then items), start the copy to
 * the pinned g_hF/g_hb and return once the gather has run (later batches change P and Q, not
 * the gathered copy). cuda_capture_wait, on the writer thread, waits for the copy and converts. */
static int cuda_capture(mfs_engine_t *e, const uint32_t *ur, size_t nu, float *du, const uint32_t *ir, size_t ni,
                        float *di)
{
	struct cuda_impl *c = impl_of(e);
	const mfs_model_t *m = e->model;
	const int k = m->k;
	const size_t n = nu + ni;
	int rc;
	if ((rc = pk_quiesce(c)))
		return rc;
	int on_dev = 1;
	for (size_t j = 0; j < nu && on_dev; j++)
		on_dev = ur[j] < c->n_u;
	for (size_t j = 0; j < ni && on_dev; j++)
		on_dev = ir[j] < c->n_i;
	if (!on_dev) { /* rows grow has not given the device yet: the whole-table path, then copy */
		if ((rc = cuda_sync(e)))
			return rc;
		mfs_engine_copy_rows(m->bu, m->P, k, ur, nu, du);
		mfs_engine_copy_rows(m->bi, m->Q, k, ir, ni, di);
		return 0;
	}
	if (!n)
		return 0;
	if ((rc = gather_reserve(e, n)))
		return rc;
	if (!c->pk.beside && (rc = pk_stop(c)))
		return rc;
	if (nu)
		MFS_CUDA_TRY(cudaMemcpyAsync(c->g_rows, ur, nu * sizeof *ur, cudaMemcpyHostToDevice, c->stream));
	if (ni)
		MFS_CUDA_TRY(cudaMemcpyAsync(c->g_rows + nu, ir, ni * sizeof *ir, cudaMemcpyHostToDevice, c->stream));
	if ((rc = gather_launch(e, c->P, c->bu, 0, nu)) || (rc = gather_launch(e, c->Q, c->bi, nu, ni)))
		return rc;
	MFS_CUDA_TRY(cudaEventRecord(c->cap_gathered, c->stream));
	MFS_CUDA_TRY(cudaMemcpyAsync(c->g_hF, c->g_F, n * (size_t)k * c->es, cudaMemcpyDeviceToHost, c->stream));
	MFS_CUDA_TRY(cudaMemcpyAsync(c->g_hb, c->g_b, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
	MFS_CUDA_TRY(cudaEventRecord(c->cap_copied, c->stream));
	c->cap_du = du, c->cap_di = di, c->cap_nu = nu, c->cap_ni = ni;
	c->cap_pending = 1; /* from here on close and the next capture wait for the copy */
	/* not beside (the kernel was stopped for the gather): wait for the copy too, here, before
	 * the next batch relaunches the kernel, and not again in capture_wait, so the writer makes
	 * no CUDA wait beside the running kernel (where nothing may run beside it, under
	 * compute-sanitizer, such waits are what hung: see cuda_sync) */
	c->cap_copy_done = !c->pk.beside;
	return beside_wait(c, c->cap_copy_done ? c->cap_copied : c->cap_gathered);
}

static int cuda_capture_wait(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	if (!c || !c->cap_pending)
		return 0;
	c->cap_pending = 0;
	const int k = e->model->k;
	const size_t w = 1 + (size_t)k;
	if (!c->cap_copy_done) {
		MFS_CUDA_TRY(cudaSetDevice(c->dev)); /* the writer thread's first CUDA call */
		MFS_CUDA_TRY(cudaEventSynchronize(c->cap_copied));
	}
	for (size_t j = 0; j < c->cap_nu; j++)
		gathered_row(c, j, k, c->cap_du + j * w, c->cap_du + j * w + 1);
	for (size_t j = 0; j < c->cap_ni; j++)
		gathered_row(c, c->cap_nu + j, k, c->cap_di + j * w, c->cap_di + j * w + 1);
	return 0;
}

static int cuda_memory(mfs_engine_t *e, uint64_t *used, uint64_t *total)
{
	(void)e;
	size_t fr = 0, tot = 0;
	MFS_CUDA_TRY(cudaMemGetInfo(&fr, &tot));
	*used = (uint64_t)(tot - fr);
	*total = (uint64_t)tot;
	return 0;
}

static int cuda_drain(mfs_engine_t *e)
{
	return pk_quiesce(impl_of(e));
}

/* Ring: slots published / consumed (every batch published before the ticket is applied once
 * consumed reaches it). Launch per batch: calls, applied on return. */
static void cuda_progress(mfs_engine_t *e, uint64_t *ticket, uint64_t *applied)
{
	struct cuda_impl *c = impl_of(e);
	if (c->pk.on) {
		*ticket = c->pk.published;
		*applied = pk_consumed(c);
	} else {
		*ticket = *applied = e->sgd_calls;
	}
}

/* A loaded set through the ring: each piece's descriptor points into the device-resident set
 * and carries the set's per-row modes, so the kernel does what launch_sgd's would. */
static int cuda_sgd_epoch_stream(mfs_engine_t *e, mfs_resident_t *set, uint64_t epoch, size_t batch)
{
	struct cuda_impl *c = impl_of(e);
	const struct dev_set *d = (const struct dev_set *)set;
	int rc;
	if (!c->pk.on)
		return launch_sgd(e, d, mfs_coin_salt(epoch));
	for (size_t off = 0; off < d->n; off += batch) {
		const size_t n = d->n - off < batch ? d->n - off : batch;
		uint32_t s;
		if ((rc = pk_slot(e, &s)))
			return rc;
		struct pk_hdr *hd = &c->pk.h_hdr[s];
		hd->u = d->u + off;
		hd->i = d->i + off;
		hd->r = d->r + off;
		hd->mr_u = hd->mr_i = NULL;
		hd->md_u = d->su;
		hd->md_i = d->si;
		hd->du = d->du;
		hd->di = d->di;
		if ((rc = pk_publish(e, s, n)))
			return rc;
	}
	if ((rc = pk_quiesce(c)))
		return rc;
	e->model->events_applied += d->n;
	return 0;
}

extern "C" const struct mfs_engine_i mfs_engine_cuda_i = {
	"cuda",        cuda_can_implement, cuda_open,     cuda_close,    cuda_set_hparams, cuda_grow,   cuda_sgd,
	cuda_loss,     cuda_resident_load, cuda_resident_free, cuda_sgd_epoch,     cuda_loss_resident, cuda_sync,     cuda_memory,
	cuda_drain,    cuda_progress, cuda_sgd_epoch_stream, cuda_capture,  cuda_capture_wait,
};
