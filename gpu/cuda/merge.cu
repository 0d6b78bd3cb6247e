/* merge.cu - the sharded engine's item merge on the devices (gpu/sharded.c; engine_int.h's
 * merge op): S CUDA engines, each holding a replica of the item table (Q, bi) and the table as
 * of the last merge (the base, Q0 / b0: conf.items_base), merge a list of rows so that every
 * replica and base holds the same merged row afterwards.
 *
 * Math, per row (gpu/shard.h, BLEND; the reference is mfs_merge_row_ref, gpu/cpu/merge_ref.c):
 * with n_s the ratings shard s gave the row since its last merge, a_s = exp(n_s l) and
 * N = sum n_s, q = q0 + (1 - prod a_s) / N  sum_s n_s (q_s - q0) / (1 - a_s), in double, shards in
 * order (l = log(1 - g): g = lr (1 + lambda_bi) for the bias, lr (rho + lambda_q) for the
 * factors, rho = E[(p.p')^2] / E[|p|^2]: gpu/shard.h, mfs_shard_blend_gq); a row one shard alone
 * changed takes that shard's value. SUM and MEAN as the reference. Every multiply and add is spelled with its rounding (__dmul_rn, __dadd_rn) so that
 * nvcc contracts nothing into an FMA the host code does not have; exp and expm1 are CUDA's
 * (within an ulp of glibc's), so parity with the reference is to a tolerance, and every device
 * computes the same bits from the same inputs.
 *
 * Two paths, the same arithmetic (bit for bit the same rows): direct where every pair of the
 * shards' devices has peer access, else copies (MFS_MERGE_PATH=copies forces it, for tests and
 * benchmarks).
 *
 * Direct (NVLink; shards on one device too): device d merges entries [n d / S, n (d + 1) / S)
 * of the job, reading every shard's replica where it lies (loads from peer memory) and storing
 * the merged row into every replica (stores to peer memory); once every device has, each copies
 * the job's rows of its replica into its base. Steps: norm2_kernel (the partials, into this
 * device's slot); barrier (every device's work before the merge done); lq_kernel (rho from every
 * device's slot, read where it lies), tab_kernel, merge_kernel over the device's range; barrier;
 * the base (a device copy, or rebase_kernel for a list of rows). Bytes a device moves over NVLink: (S - 1) / S of the rows
 * in and out, as a reduce-scatter and an all-gather, with no staging, packing or unpacking, and
 * no scratch for the rows. Pushing the rows to their merging device first (SM stores into a
 * staging slot, then a local merge) was measured too: its merge kernel took half the time, the
 * pushes the rest, 1.78 against 1.63 ms (four H200s, 1M rows, k = 128 fp16).
 *
 * Copies, one host wait per device at the end:
 *   1. norm2_kernel (engine stream): the sums of |p|^2 and of (p.p')^2 (each row with the one n / 2 on,
 *      cyclically) over the job's user rows of this shard, in NORM_BLOCKS fixed partial sums each
 *      (deterministic), into this device's slot of its partials;
 *   2. pack_kernel (engine stream): the rows' values of this replica into this device's slot of
 *      the packed rows (n x k elements, n biases);
 *   3. on a copy stream per peer (mg_ps[d]): device to device copies (cudaMemcpyPeerAsync) of this
 *      device's partials, then of its packed rows in up to MG_CHUNKS chunks, into the same slot
 *      on every other device, to every peer at once, an event per chunk and peer;
 *   4. merge_kernel (engine stream), chunk by chunk once every device has pushed that chunk:
 *      rho from all partials in shard order (before the first chunk), then per row the
 *      merge, written to Q, bi, Q0 and b0. Chunk j merges while chunk j + 1 is copied.
 * A job that is the whole table (rows 0 .. n - 1: the end of an epoch where every item was
 * rated) packs nothing: the peers copy the replica itself and the merge reads the device's own,
 * so a chunk's merge, which overwrites that replica, also waits for this device's own push.
 * Split (S >= 3): device d merges only rows [n d / S, n (d + 1) / S): step 3 pushes each device
 * only the others' ranges, step 4 merges the device's own range (also into its own slot), then
 * each device pushes its merged range into that slot on every other device, where
 * unpack_kernel writes it to Q, bi, Q0 and b0. Each range goes in chunks too.
 * Launch shapes: a warp per row (lane l holds elements l k / 32 ..), 8 warps a block, up to 4096
 * blocks a launch (grid-stride).
 * Measured (NV18; MFS_MERGE_TRACE=1), 1M rows at k = 128 fp16, by copies: two H200s, the push of
 * 256 MB takes 0.73 ms and the whole merge 0.86-0.94 ms; four H200s split in chunks on a stream
 * a peer, 1.9-2.2 ms (each device moves 3/4 of a replica out and in twice, at ~225 GB/s, against
 * 395 GB/s one way for one pair: bench_peer); direct, 1.63 ms (1.41 of it the merge kernel:
 * ~136 GB/s each way a device).
 *
 * Every merged row is checked: a non-finite one is counted (blend_tab's bad) and the merge
 * returns MFS_ENAN (the replicas diverged), as the host merge does (gpu/sharded.c).
 *
 * DESIGN: every engine's persistent kernel is stopped first (every batch applied; the next batch
 * relaunches it): beside running persistent kernels on both devices, merges waited 2 s and more
 * on an H200 pair (the first device run of test_cuda_sharded), cause not established. Scratch
 * grows only with the kernel stopped (cudaFree synchronizes the device). Peer access between the
 * shards' devices is enabled at open (cuda_base_open). A job with keep (resident epochs) keeps
 * its rows, counts and user rows on every device until merge_forget.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/timeutil.h"
#include "gpu/cuda/cuda_int.h"
#include "gpu/shard.h"

#define NORM_BLOCKS 128
#define NORM_PARTS (2 * NORM_BLOCKS) /* a shard's partials: NORM_BLOCKS of |p|^2, then of (p.p')^2 */
#define MERGE_MAX_S MFS_SHARD_DEVICE_MAX /* the per-shard factors of a row live in registers */
#define MAX_E 8       /* elements per lane: k / 32, k <= 256 */
#define MERGE_PF 4    /* shards' rows a merge requests at once (merge_kernel) */
static_assert(MG_PEERS >= MERGE_MAX_S, "a copy stream and events per peer");

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }

/* part[b] = sum over the rows j of block b (rows b*8 + w, then + 8*NORM_BLOCKS) of |P row j|^2, and
 * part[NORM_BLOCKS + b] of (P row j . P row (j + n / 2) mod n)^2 (BLEND's rho, gpu/shard.h
 * mfs_shard_blend_gq), lane l over f = l, l + 32, ...; fixed order: each lane's sum of squares,
 * the lanes folded by halves, the warps in order; a pair's dot, each lane's products, folded by
 * halves (every lane then holds it), squared and summed in the order of the rows, lane 0's sum,
 * the warps in order. Four rows a step, so that their loads are in flight together. */
template <typename T>
__global__ void norm2_kernel(const T *P, int k, const uint32_t *__restrict__ rows, size_t n, double *part)
{
	__shared__ double ws[WARPS_PER_BLOCK], wp[WARPS_PER_BLOCK];
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const size_t step = (size_t)gridDim.x * WARPS_PER_BLOCK;
	double acc = 0, accp = 0;
	for (size_t j = (size_t)blockIdx.x * WARPS_PER_BLOCK + w; j < n; j += 4 * step) {
		float v[4][MAX_E], u[4][MAX_E];
#pragma unroll
		for (int y = 0; y < 4; y++) {
			const size_t jj = j + (size_t)y * step;
			const T *p = jj < n ? P + (size_t)rows[jj] * k : NULL;
			const T *q = jj < n ? P + (size_t)rows[(jj + n / 2) % n] * k : NULL;
#pragma unroll
			for (int e = 0; e < MAX_E; e++) {
				v[y][e] = p && lane + 32 * e < k ? to_f<T>(p[lane + 32 * e]) : 0.f;
				u[y][e] = q && lane + 32 * e < k ? to_f<T>(q[lane + 32 * e]) : 0.f;
			}
		}
#pragma unroll
		for (int y = 0; y < 4; y++) {
			double dot = 0;
#pragma unroll
			for (int e = 0; e < MAX_E; e++) {
				acc = __dadd_rn(acc, __dmul_rn((double)v[y][e], (double)v[y][e]));
				dot = __dadd_rn(dot, __dmul_rn((double)v[y][e], (double)u[y][e]));
			}
			for (int o = 16; o > 0; o >>= 1)
				dot = __dadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, o));
			accp = __dadd_rn(accp, __dmul_rn(dot, dot));
		}
	}
	for (int o = 16; o > 0; o >>= 1)
		acc = __dadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
	if (lane == 0) {
		ws[w] = acc;
		wp[w] = accp;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		double sum = 0, sump = 0;
		for (int x = 0; x < WARPS_PER_BLOCK; x++) {
			sum = __dadd_rn(sum, ws[x]);
			sump = __dadd_rn(sump, wp[x]);
		}
		part[blockIdx.x] = sum;
		part[NORM_BLOCKS + blockIdx.x] = sump;
	}
}

/* out row j = F row rows[j], bout[j] = b[rows[j]] (words of 4 bytes: k x sizeof(T) is a
 * multiple of 4 for k a multiple of 32). */
__global__ void pack_kernel(const uint32_t *F, const float *b, const uint32_t *__restrict__ rows, size_t n,
                            int words, uint32_t *out, float *bout)
{
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t warps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const int lane = threadIdx.x & 31;
	for (size_t j = warp; j < n; j += warps) {
		const size_t r = rows[j];
		for (int x = lane; x < words; x += 32)
			out[j * (size_t)words + x] = __ldcg(F + r * (size_t)words + x);
		if (lane == 0)
			bout[j] = __ldcg(b + r);
	}
}

/* BLEND's per-count factors, for counts below TAB_N: a[n] = exp(n l), w[n] = n / -expm1(n l), for
 * the bias (l = lb) and the factors (l = lq). A table, because every merged row needs them for
 * each shard and the counts are small integers: the same exp and expm1 calls, made once. */
#define TAB_N 4096
struct blend_tab {
	double lq;
	double ab[TAB_N], aq[TAB_N], wb[TAB_N], wq[TAB_N];
	unsigned int bad; /* rows this device's merge made non-finite (zeroed by lq_kernel) */
};

/* Every shard's partials (NORM_PARTS doubles each): this device's copies of them (copies), or
 * the shards' own slots on their devices, read over NVLink (direct). */
struct parts {
	const double *p[MERGE_MAX_S];
};

/* lq from the shards' partials (each shard's in order, the shards in order), on one thread: the
 * same bits on every device; g as mfs_shard_blend_gq (gpu/shard.h), the same operations, lr as
 * mfs_shard_blend_lr gives it (the host's double, so an epoch's closing merge too). Also
 * zeroes the merge's count of non-finite rows (it runs before any of the merge's kernels). */
__global__ void lq_kernel(struct parts part, uint32_t S, double lr, double lambda_q, struct blend_tab *tab)
{
	double sum = 0, pairs = 0;
	tab->bad = 0;
	for (uint32_t s = 0; s < S; s++) {
		double ps = 0, pp = 0;
		for (int x = 0; x < NORM_BLOCKS; x++) {
			ps = __dadd_rn(ps, part.p[s][x]);
			pp = __dadd_rn(pp, part.p[s][NORM_BLOCKS + x]);
		}
		sum = s ? __dadd_rn(sum, ps) : ps;
		pairs = s ? __dadd_rn(pairs, pp) : pp;
	}
	const double g = __dmul_rn(lr, __dadd_rn(sum > 0 ? __ddiv_rn(pairs, sum) : 0, lambda_q));
	tab->lq = log1p(-fmin(g, MFS_SHARD_BLEND_MAX_STEP));
}

__device__ __forceinline__ void blend_factors(double nn, double l, double *a, double *w)
{
	*a = exp(__dmul_rn(nn, l));
	*w = __ddiv_rn(nn, -expm1(__dmul_rn(nn, l)));
}

__global__ void tab_kernel(double lb, struct blend_tab *tab)
{
	const int n = blockIdx.x * blockDim.x + threadIdx.x;
	if (n >= TAB_N)
		return;
	if (n == 0) {
		tab->ab[0] = tab->aq[0] = 1, tab->wb[0] = tab->wq[0] = 0;
		return;
	}
	const double lq = tab->lq;
	blend_factors((double)n, lb, &tab->ab[n], &tab->wb[n]);
	blend_factors((double)n, lq, &tab->aq[n], &tab->wq[n]);
}

struct merge_args {
	const uint32_t *rows, *cnt; /* rows NULL: the rows are 0 .. n - 1 (the whole table) */
	size_t lo, hi;              /* this launch's part of the job: entries [lo, hi) */
	uint32_t S;
	int combine;
	/* shard s's values of the rows and their biases: packed (entry x at row x: n x k elements),
	 * or (by_row) shard s's replica itself, entry x at its row, where it lies */
	const void *F[MERGE_MAX_S];
	const float *b[MERGE_MAX_S];
	int by_row;
	/* direct merges: the merged row into every shard's replica (Qo[s] non-NULL), at its row,
	 * where it lies; else into this device's Q, bi, Q0 and b0 */
	void *Qo[MERGE_MAX_S];
	float *bo[MERGE_MAX_S];
	const struct blend_tab *tab;
	unsigned int *bad; /* += 1 for each merged row with a non-finite value */
	double lb;
	void *Fout;  /* split merges by copies (S >= 3): the merged rows also here, packed as F */
	float *bout; /* and their biases */
};

/* The widest load of B bytes that a lane's run of B bytes is aligned to (B's largest power of
 * two, up to 16): a lane's elements start at lane x B bytes within a row of 32 B. */
template <int B> struct lane_word;
template <> struct lane_word<16> { typedef uint4 t; };
template <> struct lane_word<8> { typedef uint2 t; };
template <> struct lane_word<4> { typedef unsigned int t; };
template <> struct lane_word<2> { typedef unsigned short t; };
template <typename T, int E> struct lane_io {
	static constexpr int bytes = E * (int)sizeof(T);
	static constexpr int W = bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : 2;
	typedef typename lane_word<W>::t word;
};

/* A lane's E = k / 32 contiguous elements of a row (one coalesced run a warp), widened to fp32. */
template <typename T, int E> __device__ __forceinline__ void ld_lane(const T *p, float *v)
{
	typedef typename lane_io<T, E>::word word;
	constexpr int n = lane_io<T, E>::bytes / lane_io<T, E>::W;
	__align__(16) T t[E];
#pragma unroll
	for (int w = 0; w < n; w++)
		((word *)t)[w] = __ldcg((const word *)p + w);
#pragma unroll
	for (int e = 0; e < E; e++)
		v[e] = to_f<T>(t[e]);
}

template <typename T, int E> __device__ __forceinline__ void st_lane(T *p, const float *v)
{
	typedef typename lane_io<T, E>::word word;
	constexpr int n = lane_io<T, E>::bytes / lane_io<T, E>::W;
	__align__(16) T t[E];
#pragma unroll
	for (int e = 0; e < E; e++)
		t[e] = from_f<T>(v[e]);
#pragma unroll
	for (int w = 0; w < n; w++)
		((word *)p)[w] = ((const word *)t)[w];
}

/* A lane's run of a row as loaded (words), converted later: a prefetched row costs its bytes in
 * registers, not E floats. */
template <typename T, int E> struct lane_raw {
	typename lane_io<T, E>::word w[lane_io<T, E>::bytes / lane_io<T, E>::W];
};
template <typename T, int E> __device__ __forceinline__ void ld_raw(const T *p, lane_raw<T, E> &r)
{
	typedef typename lane_io<T, E>::word word;
#pragma unroll
	for (int w = 0; w < lane_io<T, E>::bytes / lane_io<T, E>::W; w++)
		r.w[w] = __ldcg((const word *)p + w);
}
template <typename T, int E> __device__ __forceinline__ void cvt_raw(const lane_raw<T, E> &r, float *v)
{
	typedef typename lane_io<T, E>::word word;
	__align__(16) T t[E];
#pragma unroll
	for (int w = 0; w < lane_io<T, E>::bytes / lane_io<T, E>::W; w++)
		((word *)t)[w] = r.w[w];
#pragma unroll
	for (int e = 0; e < E; e++)
		v[e] = to_f<T>(t[e]);
}

/* A warp per row; lane l holds elements l E .. l E + E - 1 (E = k / 32, a template argument so
 * that a row's registers are exactly its elements: at k = 128, 16 warps an SM with E as a
 * bound at run time, 48 with it known), lane 0 the bias too. The per-shard counts and BLEND
 * factors (from the table) are read by lane s for shard s and shared by shuffles; the shards
 * are then walked in order, as mfs_merge_row_ref does. */
template <typename T, int E>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK, E <= 4 ? 4 : 2)
	merge_kernel(struct merge_args a, T *Q, float *bi, T *Q0, float *b0)
{
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t warps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const int lane = threadIdx.x & 31;
	constexpr int k = 32 * E;
	const uint32_t S = a.S;
	const double lq = a.tab->lq, lb = a.lb;
	for (size_t x = a.lo + warp; x < a.hi; x += warps) {
		const size_t i = a.rows ? a.rows[x] : x;
		const uint32_t mine = (uint32_t)lane < S ? a.cnt[x * S + lane] : 0u;
		const unsigned live = __ballot_sync(0xffffffffu, mine != 0) & ((1u << S) - 1u);
		if (!live)
			continue; /* no shard changed it: every replica holds the base */
		const uint32_t c = (uint32_t)__ffs(live) - 1u, count = (uint32_t)__popc(live);
		const int blend = a.combine == MFS_SHARD_BLEND && count > 1;
		double eb = 1, eq = 1, mb = 0, mq = 0;
		if (blend && mine) {
			if (mine < TAB_N) {
				eb = a.tab->ab[mine], eq = a.tab->aq[mine], mb = a.tab->wb[mine], mq = a.tab->wq[mine];
			} else {
				blend_factors((double)mine, lb, &eb, &mb);
				blend_factors((double)mine, lq, &eq, &mq);
			}
		}
		const size_t off = i * (size_t)k + (size_t)lane * E, src = a.by_row ? i : x;
		const size_t so = src * (size_t)k + (size_t)lane * E;
		/* the first MERGE_PF shards' rows requested at once, before any is used (direct merges
		 * read them over NVLink). Measured on four H200s: the direct merge's kernel took 1.41 ms
		 * with and without it, so one load after another was not its bound; kept, as the code
		 * the devices ran since */
		lane_raw<T, E> pr[MERGE_PF];
		float pb[MERGE_PF];
#pragma unroll
		for (int s = 0; s < MERGE_PF; s++)
			if (live >> s & 1u) {
				ld_raw<T, E>((const T *)a.F[s] + so, pr[s]);
				pb[s] = lane == 0 ? a.b[s][src] : 0.f;
			}
		float q0[E], o[E];
		const float b_0 = lane == 0 ? b0[i] : 0.f;
		float ob = 0.f;
		ld_lane<T, E>(Q0 + off, q0);
		double t[E], tb = 0, prod_b = 1, prod_q = 1, N = 0;
#pragma unroll
		for (int e = 0; e < E; e++)
			t[e] = 0;
		/* the live shards in order (live is warp-uniform: every lane takes the same branches).
		 * SUM or MEAN, in float: shard c's row plus the others'; BLEND:
		 * q = q0 + (1 - prod a_s) / N sum_s w_s (q_s - q0), in double */
#pragma unroll
		for (int s = 0; s < MERGE_MAX_S; s++) {
			if (!(live >> s & 1u))
				continue;
			float v[E], vb;
			if (s < MERGE_PF) {
				cvt_raw<T, E>(pr[s], v);
				vb = pb[s];
			} else {
				ld_lane<T, E>((const T *)a.F[s] + so, v);
				vb = lane == 0 ? a.b[s][src] : 0.f;
			}
			if (!blend) {
				if ((uint32_t)s == c) {
#pragma unroll
					for (int e = 0; e < E; e++)
						o[e] = v[e];
					ob = vb;
					continue;
				}
#pragma unroll
				for (int e = 0; e < E; e++)
					o[e] = a.combine == MFS_SHARD_MEAN ? __fadd_rn(o[e], v[e]) : __fadd_rn(o[e], __fsub_rn(v[e], q0[e]));
				ob = a.combine == MFS_SHARD_MEAN ? __fadd_rn(ob, vb) : __fadd_rn(ob, __fsub_rn(vb, b_0));
				continue;
			}
			const double e_b = __shfl_sync(0xffffffffu, eb, s), e_q = __shfl_sync(0xffffffffu, eq, s);
			const double w_b = __shfl_sync(0xffffffffu, mb, s), w_q = __shfl_sync(0xffffffffu, mq, s);
			const uint32_t ns = __shfl_sync(0xffffffffu, mine, s);
			prod_b = __dmul_rn(prod_b, e_b);
			prod_q = __dmul_rn(prod_q, e_q);
			N = __dadd_rn(N, (double)ns);
#pragma unroll
			for (int e = 0; e < E; e++)
				t[e] = __dadd_rn(t[e], __dmul_rn(w_q, __dsub_rn((double)v[e], (double)q0[e])));
			tb = __dadd_rn(tb, __dmul_rn(w_b, __dsub_rn((double)vb, (double)b_0)));
		}
		if (!blend && count > 1 && a.combine == MFS_SHARD_MEAN) {
#pragma unroll
			for (int e = 0; e < E; e++)
				o[e] = __fdiv_rn(o[e], (float)count);
			ob = __fdiv_rn(ob, (float)count);
		} else if (blend) {
			const double Cb = __ddiv_rn(__dsub_rn(1.0, prod_b), N), Cq = __ddiv_rn(__dsub_rn(1.0, prod_q), N);
#pragma unroll
			for (int e = 0; e < E; e++)
				o[e] = (float)__dadd_rn((double)q0[e], __dmul_rn(Cq, t[e]));
			ob = (float)__dadd_rn((double)b_0, __dmul_rn(Cb, tb));
		}
		/* no NaN reaches the factors unseen: a non-finite merged row is counted (the host fails
		 * the merge, MFS_ENAN); stored all the same, the engine is not used again */
		int fin = lane == 0 ? isfinite(ob) : 1;
#pragma unroll
		for (int e = 0; e < E; e++)
			fin &= isfinite(o[e]);
		if (!__all_sync(0xffffffffu, fin) && lane == 0)
			atomicAdd(a.bad, 1u);
		if (a.Qo[0]) { /* every shard's replica (the base: after every device's merge) */
			for (uint32_t s = 0; s < S; s++) {
				st_lane<T, E>((T *)a.Qo[s] + off, o);
				if (lane == 0)
					a.bo[s][i] = ob;
			}
			continue;
		}
		st_lane<T, E>(Q + off, o);
		st_lane<T, E>(Q0 + off, o);
		if (a.Fout)
			st_lane<T, E>((T *)a.Fout + x * (size_t)k + (size_t)lane * E, o);
		if (lane == 0) {
			bi[i] = ob;
			b0[i] = ob;
			if (a.bout)
				a.bout[x] = ob;
		}
	}
}

/* Split merges: rows [lo, hi) another device merged, packed (words of 4 bytes a row) with their
 * biases, into the replica and the base at their rows (rows NULL: row x). */
__global__ void unpack_kernel(const uint32_t *in, const float *bin, const uint32_t *__restrict__ rows, size_t lo,
                              size_t hi, int words, uint32_t *Q, uint32_t *Q0, float *bi, float *b0)
{
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t warps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const int lane = threadIdx.x & 31;
	for (size_t x = lo + warp; x < hi; x += warps) {
		const size_t r = rows ? rows[x] : x;
		for (int w = lane; w < words; w += 32) {
			const uint32_t v = __ldcg(in + x * (size_t)words + w);
			Q[r * (size_t)words + w] = v;
			Q0[r * (size_t)words + w] = v;
		}
		if (lane == 0)
			bi[r] = b0[r] = __ldcg(bin + x);
	}
}

/* Direct merges: rows rows[x], x < n, of the replica into the base, once every device has
 * written its range into this replica (a job of the whole table is one device copy instead). */
__global__ void rebase_kernel(const uint32_t *__restrict__ rows, size_t n, int words, const uint32_t *Q,
                              const float *bi, uint32_t *Q0, float *b0)
{
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t warps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const int lane = threadIdx.x & 31;
	for (size_t x = warp; x < n; x += warps) {
		const size_t r = rows[x];
		for (int w = lane; w < words; w += 32)
			Q0[r * (size_t)words + w] = __ldcg(Q + r * (size_t)words + w);
		if (lane == 0)
			b0[r] = __ldcg(bi + r);
	}
}

/* merge_kernel<T, k / 32> (k a multiple of 32 in 32 .. 256: cuda_can_implement) */
template <typename T> static const void *merge_kernel_fn(int k)
{
	switch (k / 32) {
	case 1: return (const void *)merge_kernel<T, 1>;
	case 2: return (const void *)merge_kernel<T, 2>;
	case 3: return (const void *)merge_kernel<T, 3>;
	case 4: return (const void *)merge_kernel<T, 4>;
	case 5: return (const void *)merge_kernel<T, 5>;
	case 6: return (const void *)merge_kernel<T, 6>;
	case 7: return (const void *)merge_kernel<T, 7>;
	default: return (const void *)merge_kernel<T, 8>;
	}
}

const void *merge_fn(int fp16, int k, int which)
{
	switch (which) {
	case 0:
		return fp16 ? (const void *)norm2_kernel<__half> : (const void *)norm2_kernel<float>;
	case 1:
		return (const void *)pack_kernel;
	case 3:
		return (const void *)lq_kernel;
	case 4:
		return (const void *)tab_kernel;
	case 5:
		return (const void *)unpack_kernel;
	case 6:
		return (const void *)rebase_kernel;
	default:
		return fp16 ? merge_kernel_fn<__half>(k) : merge_kernel_fn<float>(k);
	}
}

/* ---- host side ----------------------------------------------------------------------- */

/* What a kept job holds on one device. */
struct kept {
	uint32_t *rows, *cnt, *p2;
	int dense; /* the rows are the whole table, 0 .. n - 1 */
};

/* Are rows[0, n) exactly 0 .. n - 1, the whole table of `have` rows? Then nothing is packed: the
 * peers copy the table itself. */
static int dense_rows(const uint32_t *rows, size_t n, uint32_t have)
{
	if (n != have || !n || rows[0] != 0 || rows[n - 1] != n - 1)
		return 0;
	for (size_t x = 0; x < n; x++)
		if (rows[x] != x)
			return 0;
	return 1;
}

/* The base (Q0, b0) at the item table's capacity, rows [0, n_i) copied from the old base. */
int cuda_base_grow(struct cuda_impl *c, int k)
{
	if (!c->items_base || c->base_cap >= c->cap_i)
		return 0;
	void *nf = NULL;
	float *nb = NULL;
	MFS_CUDA_TRY(cudaMalloc(&nf, (size_t)c->cap_i * k * c->es));
	if (cudaMalloc(&nb, (size_t)c->cap_i * sizeof(float)) != cudaSuccess) {
		cudaFree(nf);
		MFS_CUDA_TRY(cudaGetLastError());
		return MFS_EGPU;
	}
	if (c->base_cap) {
		MFS_CUDA_TRY(cudaMemcpyAsync(nf, c->Q0, (size_t)c->n_i * k * c->es, cudaMemcpyDeviceToDevice, c->stream));
		MFS_CUDA_TRY(cudaMemcpyAsync(nb, c->b0, (size_t)c->n_i * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	}
	cudaFree(c->Q0);
	cudaFree(c->b0);
	c->Q0 = nf;
	c->b0 = nb;
	c->base_cap = c->cap_i;
	return 0;
}

/* Peer access from this engine's device to every other (a shard's merge reads its peers'
 * packed rows over NVLink where there is one; without access the copies are staged). */
int cuda_base_open(struct cuda_impl *c)
{
	int n = 0;
	MFS_CUDA_TRY(cudaGetDeviceCount(&n));
	for (int p = 0; p < n; p++) {
		int can = 0;
		if (p == c->dev || cudaDeviceCanAccessPeer(&can, c->dev, p) != cudaSuccess || !can)
			continue;
		cudaError_t err = cudaDeviceEnablePeerAccess(p, 0);
		if (err == cudaErrorPeerAccessAlreadyEnabled)
			(void)cudaGetLastError();
		else
			MFS_CUDA_TRY(err);
	}
	return 0;
}

void cuda_merge_free(struct cuda_impl *c)
{
	cudaFree(c->Q0);
	cudaFree(c->b0);
	cudaFree(c->mg_rows);
	cudaFree(c->mg_cnt);
	cudaFree(c->mg_p2);
	cudaFree(c->mg_F);
	cudaFree(c->mg_b);
	cudaFree(c->mg_part);
	cudaFree(c->mg_tab);
	c->mg_tab = NULL;
	if (c->mg_ev)
		cudaEventDestroy(c->mg_ev);
	if (c->mg_ready)
		cudaEventDestroy(c->mg_ready);
	c->mg_ready = NULL;
	for (int x = 0; x < MG_CHUNKS; x++) {
		if (c->mg_merged[x])
			cudaEventDestroy(c->mg_merged[x]);
		c->mg_merged[x] = NULL;
		for (int d = 0; d < MG_PEERS; d++) {
			cudaEvent_t *ev[] = {&c->mg_pto[d][x], &c->mg_bto[d][x]};
			for (int y = 0; y < 2; y++) {
				if (*ev[y])
					cudaEventDestroy(*ev[y]);
				*ev[y] = NULL;
			}
		}
	}
	for (int d = 0; d < MG_PEERS; d++) {
		if (c->mg_ps[d])
			cudaStreamDestroy(c->mg_ps[d]);
		c->mg_ps[d] = NULL;
	}
	for (int x = 0; x < 4; x++) {
		if (c->mg_t[x])
			cudaEventDestroy(c->mg_t[x]);
		c->mg_t[x] = NULL;
	}
	if (c->mg_cs)
		cudaStreamDestroy(c->mg_cs);
	c->mg_cs = NULL;
	cudaFreeHost(c->mg_badh);
	c->mg_badh = NULL;
	c->Q0 = c->mg_F = NULL;
	c->b0 = NULL;
	c->mg_rows = c->mg_cnt = c->mg_p2 = NULL;
	c->mg_b = NULL;
	c->mg_part = NULL;
	c->mg_ev = NULL;
}

/* Scratch for n rows and p2n user rows, and (staged: merges by copies) S slots of n packed rows;
 * grows with the persistent kernel stopped. */
static int merge_reserve(struct cuda_impl *c, uint32_t S, int k, size_t n, size_t p2n, int staged)
{
	int rc;
	if (!c->mg_ev)
		MFS_CUDA_TRY(cudaEventCreateWithFlags(&c->mg_ev, cudaEventDisableTiming));
	if (!c->mg_ready)
		MFS_CUDA_TRY(cudaEventCreateWithFlags(&c->mg_ready, cudaEventDisableTiming));
	for (int x = 0; x < MG_CHUNKS; x++) {
		if (!c->mg_merged[x])
			MFS_CUDA_TRY(cudaEventCreateWithFlags(&c->mg_merged[x], cudaEventDisableTiming));
		for (uint32_t d = 0; d < S; d++) {
			cudaEvent_t *ev[] = {&c->mg_pto[d][x], &c->mg_bto[d][x]};
			for (int y = 0; y < 2; y++)
				if (!*ev[y])
					MFS_CUDA_TRY(cudaEventCreateWithFlags(ev[y], cudaEventDisableTiming));
		}
	}
	for (uint32_t d = 0; d < S; d++)
		if (!c->mg_ps[d])
			MFS_CUDA_TRY(cudaStreamCreateWithFlags(&c->mg_ps[d], cudaStreamNonBlocking));
	for (int x = 0; x < 4; x++)
		if (!c->mg_t[x])
			MFS_CUDA_TRY(cudaEventCreate(&c->mg_t[x]));
	if (!c->mg_cs)
		MFS_CUDA_TRY(cudaStreamCreateWithFlags(&c->mg_cs, cudaStreamNonBlocking));
	if (!c->mg_part)
		MFS_CUDA_TRY(cudaMalloc(&c->mg_part, (size_t)MFS_SHARD_MAX * NORM_PARTS * sizeof(double)));
	if (!c->mg_tab)
		MFS_CUDA_TRY(cudaMalloc(&c->mg_tab, sizeof(struct blend_tab)));
	if (!c->mg_badh)
		MFS_CUDA_TRY(cudaHostAlloc((void **)&c->mg_badh, sizeof *c->mg_badh, cudaHostAllocDefault));
	if (n > c->mg_cap || S != c->mg_S || (staged && !c->mg_F)) {
		if ((rc = pk_stop(c)))
			return rc;
		size_t nc = c->mg_cap ? c->mg_cap : 4096;
		while (nc < n)
			nc *= 2;
		cudaFree(c->mg_rows);
		cudaFree(c->mg_cnt);
		cudaFree(c->mg_F);
		cudaFree(c->mg_b);
		c->mg_rows = c->mg_cnt = NULL, c->mg_F = NULL, c->mg_b = NULL, c->mg_cap = 0;
		MFS_CUDA_TRY(cudaMalloc(&c->mg_rows, nc * sizeof(uint32_t)));
		MFS_CUDA_TRY(cudaMalloc(&c->mg_cnt, nc * S * sizeof(uint32_t)));
		if (staged) { /* direct merges read and write the replicas themselves */
			MFS_CUDA_TRY(cudaMalloc(&c->mg_F, nc * S * (size_t)k * c->es));
			MFS_CUDA_TRY(cudaMalloc(&c->mg_b, nc * S * sizeof(float)));
		}
		c->mg_cap = nc;
		c->mg_S = S;
	}
	if (p2n > c->mg_p2_cap) {
		if ((rc = pk_stop(c)))
			return rc;
		size_t nc = c->mg_p2_cap ? c->mg_p2_cap : 4096;
		while (nc < p2n)
			nc *= 2;
		cudaFree(c->mg_p2);
		c->mg_p2 = NULL, c->mg_p2_cap = 0;
		MFS_CUDA_TRY(cudaMalloc(&c->mg_p2, nc * sizeof(uint32_t)));
		c->mg_p2_cap = nc;
	}
	return 0;
}

static int keep_upload(struct cuda_impl *c, uint32_t S, uint32_t s, const mfs_merge_job_t *job, struct kept **out)
{
	struct kept *kp = (struct kept *)calloc(1, sizeof *kp);
	if (!kp)
		return ENOMEM;
	*out = kp;
	const size_t n = job->n ? job->n : 1, p2n = job->p2_n[s] ? job->p2_n[s] : 1;
	MFS_CUDA_TRY(cudaMalloc(&kp->rows, n * sizeof(uint32_t)));
	MFS_CUDA_TRY(cudaMalloc(&kp->cnt, n * S * sizeof(uint32_t)));
	MFS_CUDA_TRY(cudaMalloc(&kp->p2, p2n * sizeof(uint32_t)));
	MFS_CUDA_TRY(cudaMemcpy(kp->rows, job->rows, job->n * sizeof(uint32_t), cudaMemcpyHostToDevice));
	MFS_CUDA_TRY(cudaMemcpy(kp->cnt, job->cnt, job->n * S * sizeof(uint32_t), cudaMemcpyHostToDevice));
	MFS_CUDA_TRY(cudaMemcpy(kp->p2, job->p2_rows[s], job->p2_n[s] * sizeof(uint32_t), cudaMemcpyHostToDevice));
	kp->dense = dense_rows(job->rows, job->n, c->n_i);
	return 0;
}

static unsigned warp_blocks(size_t n)
{
	const size_t want = (n + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
	return (unsigned)(want < 4096 ? (want ? want : 1) : 4096);
}

/* Chunks a job of n rows is pushed and merged in: chunk j's merge runs while chunk j + 1 is
 * pushed. At least MG_CHUNK_MIN rows a chunk (a small job, the hot rows of a batch, is one). */
#define MG_CHUNK_MIN 32768
static uint32_t merge_chunks(size_t n)
{
	const size_t c = n / MG_CHUNK_MIN;
	return c < 1 ? 1 : c > MG_CHUNKS ? MG_CHUNKS : (uint32_t)c;
}

/* Rows [lo, hi) of chunk j of C: of the whole job, or (split) of the range device d merges,
 * [n d / S, n (d + 1) / S) */
static void chunk_of(size_t n, uint32_t S, int split, uint32_t d, uint32_t j, uint32_t C, size_t *lo, size_t *hi)
{
	if (!split) {
		*lo = n * j / C, *hi = n * (j + 1) / C;
		return;
	}
	const size_t a = n * d / S, m = n * (d + 1) / S - a;
	*lo = a + m * j / C, *hi = a + m * (j + 1) / C;
}

template <typename T>
static void launch_merge(int k, unsigned blocks, cudaStream_t st, const struct merge_args &a, T *Q, float *bi, T *Q0,
                         float *b0)
{
	const unsigned th = 32 * WARPS_PER_BLOCK;
	switch (k / 32) {
	case 1: merge_kernel<T, 1><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	case 2: merge_kernel<T, 2><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	case 3: merge_kernel<T, 3><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	case 4: merge_kernel<T, 4><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	case 5: merge_kernel<T, 5><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	case 6: merge_kernel<T, 6><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	case 7: merge_kernel<T, 7><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	default: merge_kernel<T, 8><<<blocks, th, 0, st>>>(a, Q, bi, Q0, b0); break;
	}
}

/* Can every shard's device load and store every other's memory (peer access, enabled at open
 * by cuda_base_open)? Shards on one device always can. */
static int peers_direct(struct cuda_impl *const *cs, uint32_t S)
{
	for (uint32_t s = 0; s < S; s++)
		for (uint32_t t = 0; t < S; t++) {
			int can = 0;
			if (cs[s]->dev == cs[t]->dev)
				continue;
			if (cudaDeviceCanAccessPeer(&can, cs[s]->dev, cs[t]->dev) != cudaSuccess || !can) {
				(void)cudaGetLastError();
				return 0;
			}
		}
	return 1;
}

/* The job's rows (rows NULL: 0 .. n - 1) and counts on device s. */
static const uint32_t *job_rows(struct cuda_impl *c, const mfs_merge_job_t *job, uint32_t s, int dense)
{
	return dense ? NULL : job->keep ? ((const struct kept *)job->kept[s])->rows : c->mg_rows;
}
static const uint32_t *job_cnt(struct cuda_impl *c, const mfs_merge_job_t *job, uint32_t s)
{
	return job->keep ? ((const struct kept *)job->kept[s])->cnt : c->mg_cnt;
}

/* After a merge's kernels on every device (its stream): this device's count of non-finite rows to
 * the host, the merge's end recorded. Then, on the host, every device waited for; MFS_ENAN where
 * a merged row is not finite (BLEND of diverged replicas, or a replica that diverged alone). */
static int merge_finish(struct cuda_impl *const *cs, uint32_t S, size_t n, double epoch_g, int trace, double h0,
                        const char *how)
{
	int rc;
	for (uint32_t d = 0; d < S; d++) {
		struct cuda_impl *c = cs[d];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		MFS_CUDA_TRY(cudaMemcpyAsync(c->mg_badh, &((struct blend_tab *)c->mg_tab)->bad, sizeof *c->mg_badh,
		                             cudaMemcpyDeviceToHost, c->stream));
		if (trace)
			MFS_CUDA_TRY(cudaEventRecord(c->mg_t[3], c->stream));
		MFS_CUDA_TRY(cudaEventRecord(c->mg_ev, c->stream));
	}
	uint64_t bad = 0;
	for (uint32_t d = 0; d < S; d++) {
		if ((rc = beside_wait(cs[d], cs[d]->mg_ev)))
			return rc;
		bad += n ? *cs[d]->mg_badh : 0;
	}
	if (trace && n) /* MFS_MERGE_TRACE: where a merge's time goes, per device */
		for (uint32_t d = 0; d < S; d++) {
			struct cuda_impl *c = cs[d];
			float all = 0, mid = 0;
			MFS_CUDA_TRY(cudaEventElapsedTime(&all, c->mg_t[0], c->mg_t[3]));
			MFS_CUDA_TRY(cudaEventElapsedTime(&mid, c->mg_t[1], c->mg_t[2]));
			mfs_info("cuda", "msg=\"merge trace\" dev=%d rows=%zu how=%s device_ms=%.3f %s=%.3f host_ms=%.3f", c->dev,
			         n, how, all, strcmp(how, "direct") ? "push_ms" : "merge_ms", mid, (mfs_now_s() - h0) * 1e3);
		}
	if (bad) {
		mfs_error("cuda", "msg=\"merge made item rows non-finite: the replicas diverged (a smaller "
		          "learning rate, more merges, or after an epoch in one piece engine.merge_epoch_g 1)\" "
		          "rows=%llu of=%zu shards=%u epoch_g=%g", (unsigned long long)bad, n, S, epoch_g);
		return MFS_ENAN;
	}
	return 0;
}

/* A merge's first step on shard s's device, both paths: the start of the trace, the job's arrays
 * staged from the host (a kept job has them there already), and this shard's |p|^2 and (p.p')^2
 * partials into its slot, which it returns. */
static int merge_begin(struct cuda_impl *c, uint32_t S, uint32_t s, int k, const mfs_merge_job_t *job, int trace,
                       double **part_out)
{
	const size_t n = job->n;
	if (trace)
		MFS_CUDA_TRY(cudaEventRecord(c->mg_t[0], c->stream));
	const uint32_t *p2 = job->keep ? ((const struct kept *)job->kept[s])->p2 : c->mg_p2;
	if (!job->keep) { /* pageable sources: staged before each call returns */
		MFS_CUDA_TRY(cudaMemcpyAsync(c->mg_rows, job->rows, n * sizeof(uint32_t), cudaMemcpyHostToDevice, c->stream));
		MFS_CUDA_TRY(cudaMemcpyAsync(c->mg_cnt, job->cnt, n * S * sizeof(uint32_t), cudaMemcpyHostToDevice,
		                             c->stream));
		MFS_CUDA_TRY(cudaMemcpyAsync(c->mg_p2, job->p2_rows[s], job->p2_n[s] * sizeof(uint32_t),
		                             cudaMemcpyHostToDevice, c->stream));
	}
	double *part = c->mg_part + (size_t)s * NORM_PARTS;
	if (c->fp16)
		norm2_kernel<__half><<<NORM_BLOCKS, 32 * WARPS_PER_BLOCK, 0, c->stream>>>((const __half *)c->P, k, p2,
		                                                                          job->p2_n[s], part);
	else
		norm2_kernel<float><<<NORM_BLOCKS, 32 * WARPS_PER_BLOCK, 0, c->stream>>>((const float *)c->P, k, p2,
		                                                                         job->p2_n[s], part);
	MFS_CUDA_LAUNCHED();
	*part_out = part;
	return 0;
}

/* rho from every shard's partials, then BLEND's per-count table, on this device's stream (both
 * paths, before the device's first merge kernel). */
static int merge_tables(struct cuda_impl *c, const struct parts &pt, uint32_t S, const mfs_merge_job_t *job, double lb)
{
	lq_kernel<<<1, 1, 0, c->stream>>>(pt, S, mfs_shard_blend_lr((double)job->hp.lr, job->epoch_g),
	                                  (double)job->hp.lambda_q,
	                                  (struct blend_tab *)c->mg_tab);
	MFS_CUDA_LAUNCHED();
	if (job->combine == MFS_SHARD_BLEND) {
		tab_kernel<<<(TAB_N + 255) / 256, 256, 0, c->stream>>>(lb, (struct blend_tab *)c->mg_tab);
		MFS_CUDA_LAUNCHED();
	}
	return 0;
}

/* Direct merge (every pair of devices has peer access): device d merges entries
 * [n d / S, n (d + 1) / S) of the job reading every shard's replica where it lies (its own, and
 * the others' over NVLink: loads from peer memory), and writes the merged row into every replica
 * (stores to peer memory); then, once every device has, each copies the job's rows of its replica
 * into its base. No device touches another's range, so the only waits are two barriers: every
 * device's work before the merge done (its replica settled, its partials in its slot), and every
 * device's merge done (before the base is copied and the engines run again). Bytes a device
 * moves over NVLink: (S - 1) / S of the rows in and the same out, as a reduce-scatter and an
 * all-gather, with no staging copy, no packing and no unpacking: the copy engines' ~225 GB/s a
 * device with four H200s at once (the copies path below) is what this avoids. */
static int merge_direct(struct cuda_impl *const *cs, uint32_t S, int k, mfs_merge_job_t *job, int dense, int trace,
                        double h0)
{
	const size_t n = job->n;
	int rc;
	struct parts pt;
	memset(&pt, 0, sizeof pt);
	for (uint32_t s = 0; s < S; s++) {
		struct cuda_impl *c = cs[s];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		double *part;
		if ((rc = merge_begin(c, S, s, k, job, trace, &part)))
			return rc;
		pt.p[s] = part;
		MFS_CUDA_TRY(cudaEventRecord(c->mg_ready, c->stream));
	}
	const double lb = mfs_shard_blend_log((double)job->hp.lr * (1.0 + (double)job->hp.lambda_bi));
	for (uint32_t d = 0; d < S; d++) { /* barrier 1, then device d's range */
		struct cuda_impl *c = cs[d];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		for (uint32_t s = 0; s < S; s++)
			if (s != d)
				MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, cs[s]->mg_ready, 0));
		if (trace)
			MFS_CUDA_TRY(cudaEventRecord(c->mg_t[1], c->stream));
		if ((rc = merge_tables(c, pt, S, job, lb)))
			return rc;
		struct merge_args a;
		memset(&a, 0, sizeof a);
		for (uint32_t s = 0; s < S; s++) {
			a.F[s] = a.Qo[s] = cs[s]->Q;
			a.b[s] = a.bo[s] = cs[s]->bi;
		}
		a.by_row = 1;
		a.rows = job_rows(c, job, d, dense), a.cnt = job_cnt(c, job, d);
		a.S = S, a.combine = job->combine;
		a.tab = (const struct blend_tab *)c->mg_tab, a.bad = &((struct blend_tab *)c->mg_tab)->bad, a.lb = lb;
		a.lo = n * d / S, a.hi = n * (d + 1) / S;
		if (a.hi > a.lo) {
			if (c->fp16)
				launch_merge<__half>(k, warp_blocks(a.hi - a.lo), c->stream, a, NULL, NULL, (__half *)c->Q0, c->b0);
			else
				launch_merge<float>(k, warp_blocks(a.hi - a.lo), c->stream, a, NULL, NULL, (float *)c->Q0, c->b0);
			MFS_CUDA_LAUNCHED();
		}
		if (trace)
			MFS_CUDA_TRY(cudaEventRecord(c->mg_t[2], c->stream));
		MFS_CUDA_TRY(cudaEventRecord(c->mg_merged[0], c->stream));
	}
	for (uint32_t d = 0; d < S; d++) { /* barrier 2, then the base */
		struct cuda_impl *c = cs[d];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		for (uint32_t s = 0; s < S; s++)
			if (s != d)
				MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, cs[s]->mg_merged[0], 0));
		const size_t row_bytes = (size_t)k * c->es;
		if (dense) {
			MFS_CUDA_TRY(cudaMemcpyAsync(c->Q0, c->Q, n * row_bytes, cudaMemcpyDeviceToDevice, c->stream));
			MFS_CUDA_TRY(cudaMemcpyAsync(c->b0, c->bi, n * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
		} else if (n) {
			rebase_kernel<<<warp_blocks(n), 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
				job_rows(c, job, d, 0), n, (int)(row_bytes / 4), (const uint32_t *)c->Q, c->bi, (uint32_t *)c->Q0, c->b0);
			MFS_CUDA_LAUNCHED();
		}
	}
	return merge_finish(cs, S, n, job->epoch_g, trace, h0, "direct");
}

extern "C" int cuda_merge(mfs_engine_t *const *subs, uint32_t S, mfs_merge_job_t *job)
{
	struct cuda_impl *cs[MFS_SHARD_MAX];
	const int k = subs[0]->model->k;
	const size_t n = job->n;
	int rc;
	if (S > MERGE_MAX_S || k > 32 * MAX_E || k % 32)
		return MFS_EINVAL;
	static int trace = -1;
	if (trace < 0)
		trace = getenv("MFS_MERGE_TRACE") != NULL;
	const double h0 = trace ? mfs_now_s() : 0;
	for (uint32_t s = 0; s < S; s++)
		cs[s] = impl_of(subs[s]);
	/* direct where every pair of devices has peer access (measured side by side, docs/BENCHMARKS.md:
	 * four H200s 1.12x the epochs/s of copies; two, the merges 0.6-0.7x the time);
	 * MFS_MERGE_PATH=copies (tests, benchmarks) takes the copies path anyway */
	const char *path = getenv("MFS_MERGE_PATH");
	const int direct = !(path && !strcmp(path, "copies")) && peers_direct(cs, S);
	/* 1. every engine stopped, its scratch and the job's arrays on its device */
	for (uint32_t s = 0; s < S; s++) {
		struct cuda_impl *c = cs[s];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		if (!c->items_base)
			return MFS_EINVAL;
		if ((rc = pk_stop(c)) || (rc = merge_reserve(c, S, k, n, job->keep ? 0 : job->p2_n[s], !direct)))
			return rc;
		if (job->keep && !job->kept[s] && (rc = keep_upload(c, S, s, job, (struct kept **)&job->kept[s])))
			return rc;
	}
	const int dense = job->keep ? ((const struct kept *)job->kept[0])->dense : dense_rows(job->rows, n, cs[0]->n_i);
	if (direct)
		return merge_direct(cs, S, k, job, dense, trace, h0);
	/* split (S >= 3): device d merges only rows [n d / S, n (d + 1) / S), from the others' pushes
	 * of that range, then sends its merged rows to every other device (a reduce-scatter, then an
	 * all-gather): each device receives (S - 1) / S of a replica twice, not S - 1 replicas */
	const int split = S >= 3;
	const uint32_t C = merge_chunks(split ? n / S : n);
	for (uint32_t s = 0; s < S; s++) {
		struct cuda_impl *c = cs[s];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		/* 2. this shard's |p|^2 and (p.p')^2 partials and (unless the job is the whole table) its
		 * packed rows */
		double *part;
		if ((rc = merge_begin(c, S, s, k, job, trace, &part)))
			return rc;
		const int words = (int)((size_t)k * c->es / 4);
		if (n && !dense) {
			pack_kernel<<<warp_blocks(n), 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
				(const uint32_t *)c->Q, c->bi, job_rows(c, job, s, 0), n, words,
				(uint32_t *)((char *)c->mg_F + (size_t)s * c->mg_cap * k * c->es), c->mg_b + (size_t)s * c->mg_cap);
			MFS_CUDA_LAUNCHED();
		}
		MFS_CUDA_TRY(cudaEventRecord(c->mg_ready, c->stream));
		/* 3. on a copy stream a peer: the partials, then chunk by chunk this shard's rows (its
		 * packed slot, or its table), into the same slot on every other device (device to device
		 * writes, NVLink where the pair has it), all peers at once, an event a chunk and peer.
		 * On four H200s the pushes ran at 190-290 GB/s a device from one stream, a peer after
		 * another, and at about the same from a stream a peer (the merge 1.9-2.2 ms either way);
		 * a stream a peer lets a peer's merge start as soon as its own chunk has landed */
		if (trace)
			MFS_CUDA_TRY(cudaEventRecord(c->mg_t[1], c->stream));
		const size_t row_bytes = (size_t)k * c->es;
		const char *src = dense ? (const char *)c->Q : (const char *)c->mg_F + (size_t)s * c->mg_cap * row_bytes;
		const float *bsrc = dense ? c->bi : c->mg_b + (size_t)s * c->mg_cap;
		for (uint32_t d = 0; d < S; d++) {
			if (d == s)
				continue;
			const struct cuda_impl *o = cs[d];
			cudaStream_t ps = c->mg_ps[d];
			MFS_CUDA_TRY(cudaStreamWaitEvent(ps, c->mg_ready, 0));
			MFS_CUDA_TRY(cudaMemcpyPeerAsync(o->mg_part + (size_t)s * NORM_PARTS, o->dev, part, c->dev,
			                                 NORM_PARTS * sizeof(double), ps));
			for (uint32_t j = 0; j < C; j++) {
				/* chunk j of the rows, or (split) of the rows device d merges */
				size_t lo, hi;
				chunk_of(n, S, split, d, j, C, &lo, &hi);
				if (hi > lo) {
					MFS_CUDA_TRY(cudaMemcpyPeerAsync((char *)o->mg_F + ((size_t)s * o->mg_cap + lo) * row_bytes, o->dev,
					                                 src + lo * row_bytes, c->dev, (hi - lo) * row_bytes, ps));
					MFS_CUDA_TRY(cudaMemcpyPeerAsync(o->mg_b + (size_t)s * o->mg_cap + lo, o->dev, bsrc + lo, c->dev,
					                                 (hi - lo) * sizeof(float), ps));
				}
				MFS_CUDA_TRY(cudaEventRecord(c->mg_pto[d][j], ps));
			}
		}
		if (trace) { /* every push done */
			for (uint32_t d = 0; d < S; d++)
				if (d != s)
					MFS_CUDA_TRY(cudaStreamWaitEvent(c->mg_cs, c->mg_pto[d][C - 1], 0));
			MFS_CUDA_TRY(cudaEventRecord(c->mg_t[2], c->mg_cs));
		}
	}
	/* 4. the merge on every device, chunk by chunk, once every device's push of the chunk is
	 * done: the others' rows have landed, and (for the whole table) this device's own replica,
	 * which the merge overwrites, has been read */
	const double lb = mfs_shard_blend_log((double)job->hp.lr * (1.0 + (double)job->hp.lambda_bi));
	for (uint32_t d = 0; d < S; d++) {
		struct cuda_impl *c = cs[d];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		const size_t row_bytes = (size_t)k * c->es;
		struct merge_args a;
		memset(&a, 0, sizeof a);
		for (uint32_t s = 0; s < S; s++) {
			a.F[s] = s == d && dense ? c->Q : (char *)c->mg_F + (size_t)s * c->mg_cap * row_bytes;
			a.b[s] = s == d && dense ? c->bi : c->mg_b + (size_t)s * c->mg_cap;
		}
		a.rows = job_rows(c, job, d, dense), a.cnt = job_cnt(c, job, d);
		a.S = S, a.combine = job->combine;
		a.tab = (const struct blend_tab *)c->mg_tab, a.bad = &((struct blend_tab *)c->mg_tab)->bad, a.lb = lb;
		for (uint32_t j = 0; j < C && n; j++) {
			/* the others' pushes of chunk j to this device; for the whole table, also this
			 * device's own pushes of chunk j, which read the replica the merge overwrites (split
			 * merges overwrite only the device's own range, which it does not push) */
			for (uint32_t s = 0; s < S; s++)
				if (s != d)
					MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, cs[s]->mg_pto[d][j], 0));
			for (uint32_t x = 0; dense && !split && x < S; x++)
				if (x != d)
					MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->mg_pto[x][j], 0));
			if (j == 0) { /* every partial has landed with chunk 0 (the same copy streams, before it) */
				struct parts pt;
				memset(&pt, 0, sizeof pt);
				for (uint32_t s = 0; s < S; s++)
					pt.p[s] = c->mg_part + (size_t)s * NORM_PARTS;
				if ((rc = merge_tables(c, pt, S, job, lb)))
					return rc;
			}
			chunk_of(n, S, split, d, j, C, &a.lo, &a.hi);
			if (split) { /* the merged rows also into this device's own slot, to be sent on */
				a.Fout = (char *)c->mg_F + (size_t)d * c->mg_cap * row_bytes;
				a.bout = c->mg_b + (size_t)d * c->mg_cap;
			}
			if (c->fp16)
				launch_merge<__half>(k, warp_blocks(a.hi - a.lo), c->stream, a, (__half *)c->Q, c->bi, (__half *)c->Q0, c->b0);
			else
				launch_merge<float>(k, warp_blocks(a.hi - a.lo), c->stream, a, (float *)c->Q, c->bi, (float *)c->Q0, c->b0);
			MFS_CUDA_LAUNCHED();
			if (split)
				MFS_CUDA_TRY(cudaEventRecord(c->mg_merged[j], c->stream));
		}
		/* split: each merged chunk to the same slot on every other device, on the peers' copy
		 * streams behind this device's first pushes, while the next chunk merges (the others
		 * have read that slot's range of their own replica already: the chunk's merge waited for
		 * their pushes of it) */
		for (uint32_t j = 0; split && j < C && n; j++) {
			size_t lo, hi;
			chunk_of(n, S, split, d, j, C, &lo, &hi);
			for (uint32_t d2 = 0; d2 < S; d2++) {
				if (d2 == d)
					continue;
				const struct cuda_impl *o = cs[d2];
				cudaStream_t ps = c->mg_ps[d2];
				MFS_CUDA_TRY(cudaStreamWaitEvent(ps, c->mg_merged[j], 0));
				if (hi > lo) {
					MFS_CUDA_TRY(cudaMemcpyPeerAsync((char *)o->mg_F + ((size_t)d * o->mg_cap + lo) * row_bytes, o->dev,
					                                 (const char *)c->mg_F + ((size_t)d * c->mg_cap + lo) * row_bytes,
					                                 c->dev, (hi - lo) * row_bytes, ps));
					MFS_CUDA_TRY(cudaMemcpyPeerAsync(o->mg_b + (size_t)d * o->mg_cap + lo, o->dev,
					                                 c->mg_b + (size_t)d * c->mg_cap + lo, c->dev,
					                                 (hi - lo) * sizeof(float), ps));
				}
				MFS_CUDA_TRY(cudaEventRecord(c->mg_bto[d2][j], ps));
			}
		}
	}
	/* split: the others' merged rows into this device's replica and base, chunk by chunk as
	 * they land */
	for (uint32_t d2 = 0; split && n && d2 < S; d2++) {
		struct cuda_impl *c = cs[d2];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		const int words = (int)((size_t)k * c->es / 4);
		const uint32_t *rows = job_rows(c, job, d2, dense);
		for (uint32_t j = 0; j < C; j++)
			for (uint32_t d = 0; d < S; d++) {
				size_t lo, hi;
				chunk_of(n, S, split, d, j, C, &lo, &hi);
				if (d == d2 || lo == hi)
					continue;
				MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, cs[d]->mg_bto[d2][j], 0));
				unpack_kernel<<<warp_blocks(hi - lo), 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
					(const uint32_t *)((const char *)c->mg_F + (size_t)d * c->mg_cap * k * c->es),
					c->mg_b + (size_t)d * c->mg_cap, rows, lo, hi, words, (uint32_t *)c->Q, (uint32_t *)c->Q0, c->bi,
					c->b0);
				MFS_CUDA_LAUNCHED();
			}
	}
	/* every device done before its scratch is used again (and every copy stream: a chunk's
	 * merge waited for it, but a job of no rows has no merge) */
	for (uint32_t d = 0; d < S; d++) {
		struct cuda_impl *c = cs[d];
		MFS_CUDA_TRY(cudaSetDevice(c->dev));
		for (uint32_t x = 0; !n && x < S; x++) /* no merge waited for the pushes */
			if (x != d)
				MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->mg_pto[x][C - 1], 0));
	}
	return merge_finish(cs, S, n, job->epoch_g, trace, h0, split ? "copies-split" : "copies");
}

extern "C" void cuda_merge_forget(mfs_engine_t *const *subs, uint32_t S, mfs_merge_job_t *job)
{
	for (uint32_t s = 0; s < S; s++) {
		struct kept *kp = (struct kept *)job->kept[s];
		if (!kp)
			continue;
		struct cuda_impl *c = impl_of(subs[s]);
		cudaSetDevice(c->dev);
		pk_stop(c); /* cudaFree synchronizes the device */
		cudaFree(kp->rows);
		cudaFree(kp->cnt);
		cudaFree(kp->p2);
		free(kp);
		job->kept[s] = NULL;
	}
}
