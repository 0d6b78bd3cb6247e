/* snap_dot.c - libmfsnap's dot-product kernels and the int8 row quantizer.
 *
 * Portable C that GCC vectorizes; the int8 kernel is compiled twice (AVX2 and baseline
 * x86-64) through target_clones, and the loader picks one by CPUID (an ifunc), so the
 * library runs on any x86-64 and needs no -mavx2. Other compilers and architectures get
 * the plain loop.
 *
 * DESIGN
 * Why int8 x int16. The approximate scan reads n * kpad bytes per query (1 M items at
 * k = 128: 128 MiB, a quarter of the fp32 factors); the user vector is quantized once per
 * query to int16, which makes its share of the error negligible. The inner loop is
 * `acc += (int32)q8[j] * (int32)uq[j]` over a constant SNAP_KBLOCK trip count: GCC turns it
 * into vpmovsxbw + vpmaddwd (AVX2) or pmovsxbw/pmaddwd-like SSE2 code. Products fit int32
 * with room: |q8| <= 127, |uq| <= 32767, pairs summed by pmaddwd, and the caller bounds
 * |uq| so that kpad * 127 * max|uq| < 2^31.
 *
 * Why the exact kernel runs across rows. The score contract (docs/SNAPSHOT_FORMAT.md) is
 * sum_j p_j q_j in double, in j order, so C and Python agree bit for bit. A product of two
 * floats is exact in double, so only the order of the additions matters, and each row's sum
 * is one chain of k dependent adds (3-4 cycles each). So the vector lanes hold different
 * rows, never different j: snap_dot_exact16 keeps 16 rows in flight (four 4-row groups, a
 * 4x4 transpose per group and 4 j) and prefetches the next 16 rows, whose 16 interleaved
 * streams the hardware prefetcher does not follow well (measured: 2x).
 */
#include <math.h>
#include <string.h>

#include "common/clones.h"
#include "snapshots/reader/mfs_snap_int.h"

/* AVX2 and baseline variants, picked at load (common/clones.h: none under ThreadSanitizer). GCC
 * only: the exported ifunc's visibility handling below is GCC's. */
#if defined(__GNUC__) && !defined(__clang__)
#define SNAP_TARGET_CLONES MFS_TARGET_CLONES("avx2", "default")
#else
#define SNAP_TARGET_CLONES
#endif

/* snap_dot_i8: out[i] = sum_j q8[i][j] * uq[j].
 * Math: int8 x int16 products summed in int32 (exact: see DESIGN for the bound).
 * Shape: one row at a time, kpad / SNAP_KBLOCK blocks of SNAP_KBLOCK lanes.
 * Bytes: kpad per row streamed from q8 (uq, 2 * kpad bytes, stays in L1); 4 written. */
SNAP_TARGET_CLONES
static void dot_i8(const int8_t *restrict q8, size_t n, size_t kpad, const int16_t *restrict uq,
                   int32_t *restrict out)
{
	for (size_t i = 0; i < n; i++) {
		const int8_t *row = q8 + i * kpad;
		int32_t acc = 0;
		for (size_t jb = 0; jb < kpad; jb += SNAP_KBLOCK)
			for (size_t j = 0; j < SNAP_KBLOCK; j++)
				acc += (int32_t)row[jb + j] * (int32_t)uq[jb + j];
		out[i] = acc;
	}
}

/* The ifunc of a non-static target_clones function is exported whatever the visibility
 * (GCC 12), so the clones stay static behind this wrapper; one call per block of rows. */
void snap_dot_i8(const int8_t *q8, size_t n, size_t kpad, const int16_t *uq, int32_t *out)
{
	dot_i8(q8, n, kpad, uq, out);
}

/* snap_bounds_i8: for b < SNAP_BLOCK, with ap = scale[b] * t * dot[b] and e = scale[b] * a,
 *   lo[b], up[b] = (base + bias[b]) + ap -/+ (e + 2^-16 (|base| + |bias[b]| + |ap| + e) + 2^-120)
 * (snap_topk.c DESIGN: e bounds the int8 error, the rest the float rounding).
 * Bytes: 12 per item read (dot, scale, bias), 8 written. */
SNAP_TARGET_CLONES
static int bounds_i8(const int32_t *restrict dot, const float *restrict scale, const float *restrict bias, float base,
                     float t, float a, float thr, float *restrict lo, float *restrict up)
{
	const float abase = fabsf(base);
	int reach = 0;
	for (size_t b = 0; b < SNAP_BLOCK; b++) {
		float ap = scale[b] * t * (float)dot[b];
		float e = scale[b] * a;
		float mid = (base + bias[b]) + ap;
		float w = e + (abase + fabsf(bias[b]) + fabsf(ap) + e) * 0x1p-16f + 0x1p-120f;
		up[b] = mid + w;
		lo[b] = mid - w;
		reach |= up[b] >= thr;
	}
	return reach;
}

int snap_bounds_i8(const int32_t *dot, const float *scale, const float *bias, float base, float t, float a,
                   float thr, float *lo, float *up)
{
	return bounds_i8(dot, scale, bias, base, t, a, thr, lo, up);
}

/* snap_dot_exact: sum_j (double)p[j] * (double)q[j], j = 0..k-1 in order.
 * Bytes: 4k per row. */
double snap_dot_exact(const float *p, const float *q, uint32_t k)
{
	double acc = 0.0;
	for (uint32_t j = 0; j < k; j++)
		acc += (double)p[j] * (double)q[j];
	return acc;
}

void snap_dot_exact4(const float *p, const float *q0, const float *q1, const float *q2, const float *q3,
                     uint32_t k, double out[4])
{
	double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
	for (uint32_t j = 0; j < k; j++) {
		double pj = (double)p[j];
		a0 += pj * (double)q0[j];
		a1 += pj * (double)q1[j];
		a2 += pj * (double)q2[j];
		a3 += pj * (double)q3[j];
	}
	out[0] = a0;
	out[1] = a1;
	out[2] = a2;
	out[3] = a3;
}

typedef float snap_v4sf __attribute__((vector_size(16)));
typedef double snap_v4df __attribute__((vector_size(32)));
typedef int32_t snap_v4si __attribute__((vector_size(16)));

/* snap_dot_exact16: out[r] = sum_j (double)p[j] * (double)q[r * k + j] for r < 16, each in
 * j order (lane r of acc[r / 4] is row r's chain).
 * Shape: 16 consecutive rows, j in steps of 4; four 4x4 float transposes per step.
 * Bytes: 64k from q (sequential over the block), prefetch of the next 64k. */
SNAP_TARGET_CLONES
static void dot_exact16(const float *restrict p, const float *restrict q, uint32_t k, double *restrict out)
{
	const size_t sk = k;
	snap_v4df acc[4];
	for (int g = 0; g < 4; g++)
		acc[g] = (snap_v4df){0.0, 0.0, 0.0, 0.0};
	uint32_t j = 0;
	for (; j + 4 <= k; j += 4) {
		/* the next 16 rows are 64k bytes, prefetched 64 bytes per row and step */
		const char *next = (const char *)(q + 16 * sk) + (size_t)j * 64;
		for (int l = 0; l < 4; l++)
			__builtin_prefetch(next + 64 * l);
		double a = p[j], b = p[j + 1], c = p[j + 2], d = p[j + 3];
		snap_v4df p0 = {a, a, a, a}, p1 = {b, b, b, b}, p2 = {c, c, c, c}, p3 = {d, d, d, d};
		for (int g = 0; g < 4; g++) {
			const float *r = q + 4 * (size_t)g * sk + j;
			snap_v4sf r0, r1, r2, r3;
			memcpy(&r0, r, 16);
			memcpy(&r1, r + sk, 16);
			memcpy(&r2, r + 2 * sk, 16);
			memcpy(&r3, r + 3 * sk, 16);
			snap_v4sf t0 = __builtin_shuffle(r0, r1, (snap_v4si){0, 4, 1, 5});
			snap_v4sf t1 = __builtin_shuffle(r2, r3, (snap_v4si){0, 4, 1, 5});
			snap_v4sf t2 = __builtin_shuffle(r0, r1, (snap_v4si){2, 6, 3, 7});
			snap_v4sf t3 = __builtin_shuffle(r2, r3, (snap_v4si){2, 6, 3, 7});
			/* column j + i of the 4 rows, added in j order */
			acc[g] += __builtin_convertvector(__builtin_shuffle(t0, t1, (snap_v4si){0, 1, 4, 5}), snap_v4df) * p0;
			acc[g] += __builtin_convertvector(__builtin_shuffle(t0, t1, (snap_v4si){2, 3, 6, 7}), snap_v4df) * p1;
			acc[g] += __builtin_convertvector(__builtin_shuffle(t2, t3, (snap_v4si){0, 1, 4, 5}), snap_v4df) * p2;
			acc[g] += __builtin_convertvector(__builtin_shuffle(t2, t3, (snap_v4si){2, 3, 6, 7}), snap_v4df) * p3;
		}
	}
	for (; j < k; j++) {
		double a = p[j];
		snap_v4df pj = {a, a, a, a};
		for (int g = 0; g < 4; g++) {
			const float *r = q + 4 * (size_t)g * sk + j;
			snap_v4sf col = {r[0], r[sk], r[2 * sk], r[3 * sk]};
			acc[g] += __builtin_convertvector(col, snap_v4df) * pj;
		}
	}
	memcpy(out, acc, sizeof acc);
}

void snap_dot_exact16(const float *p, const float *q, uint32_t k, double out[16])
{
	dot_exact16(p, q, k, out);
}

/* The scale is rounded up to a float so that |x / s| <= 127 holds for every element; c is
 * x / s rounded to nearest (computed in double, error ~2^-46), so |x - s c| <= s / 2. A
 * scale is never below SNAP_SCALE_MIN (a larger scale keeps both properties), so products
 * of a row scale and a user scale stay normal floats in the scan. */
float snap_quantize_row(const float *x, uint32_t k, uint32_t kpad, int8_t *c)
{
	float amax = 0.0f;
	for (uint32_t j = 0; j < k; j++)
		amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
	memset(c, 0, kpad);
	if (amax == 0.0f)
		return 0.0f;
	double sd = (double)amax / 127.0;
	float s = (float)sd;
	if ((double)s < sd)
		s = nextafterf(s, INFINITY);
	if (s < SNAP_SCALE_MIN)
		s = SNAP_SCALE_MIN;
	double inv = 1.0 / (double)s;
	for (uint32_t j = 0; j < k; j++) {
		double v = (double)x[j] * inv;
		int q = (int)(v + copysign(0.5, v)); /* round half away from zero, by truncation */
		c[j] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
	}
	return s;
}
