/* step.cuh - the device side of one rating, shared by every kernel that updates or scores one:
 * storage traits (stor<T>: one element; vec16<T>: 16 bytes, load / store / vector RED), the
 * Hogwild row shape and step (hog_shape, hog_coef, hog_step: the batch kernel and the
 * persistent kernel apply the same update), and the coins of sampled hot-row updates (coin01
 * on the device, mfs_coin_salt on the host). Included by .cu files only.
 */
#ifndef MFS_CUDA_STEP_CUH
#define MFS_CUDA_STEP_CUH

#include <cuda_fp16.h>
#include <string.h>

#include "common/rng.h"
#include "gpu/cuda/cuda_int.h"

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

/* The end of the reference's dot product on a warp (mfs_dot_lanes, gpu/cpu/cpu_ref.h): lane l
 * holds the fmaf partial sum of elements l, l + 32, ...; the butterfly 16, 8, 4, 2, 1 adds
 * them with __fadd_rn (nothing to contract). Lane l then holds acc[l] + acc[l ^ o] where the
 * CPU's fold adds acc[l] + acc[l + o]: IEEE addition is commutative, so every lane ends with
 * the CPU's bits. The deterministic SGD and loss kernels end their dot products here. */
__device__ __forceinline__ float dot_fold32(float dot)
{
#pragma unroll
	for (int o = 16; o; o >>= 1)
		dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
	return dot;
}

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

/* The learning-rate terms of one SGD step, read from the hyperparameters in device memory. */
struct hog_coef {
	float lr, ap, aq, abu, abi, dp, dq, dbu, dbi;
	/* scale: the batch's multiplier of the learning rate (1 but for replay) */
	__device__ __forceinline__ void load(const mfs_hparams_t *hp, float scale)
	{
		lr = __fmul_rn(__ldcg(&hp->lr), scale); /* L2: the host retunes it while a persistent kernel runs */
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

#endif
