/* rng.h - small deterministic generators: splitmix64 (seeding, hashing) and xoshiro256**.
 * Everything seeded is reproducible across runs and machines. */
#ifndef MFS_RNG_H
#define MFS_RNG_H

#include <math.h>
#include <stdint.h>

/* The generators compile for the GPU too (the CUDA engine draws new rows' initial values on the
 * device with the host's formula, gpu/cuda/init.cu). */
#ifdef __CUDACC__
#define MFS_HD __host__ __device__
#else
#define MFS_HD
#endif

static inline MFS_HD uint64_t mfs_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/** A stateless mix of two words: deterministic per (a, b). */
static inline MFS_HD uint64_t mfs_mix64(uint64_t a, uint64_t b)
{
	uint64_t s = a ^ (b * 0xD1B54A32D192ED03ull);
	return mfs_splitmix64(&s);
}

typedef struct mfs_rng { uint64_t s[4]; } mfs_rng_t;

static inline MFS_HD void mfs_rng_seed(mfs_rng_t *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = mfs_splitmix64(&seed);
}

static inline MFS_HD uint64_t mfs_rng_next(mfs_rng_t *r)
{
	uint64_t *s = r->s;
	uint64_t x = s[1] * 5;
	uint64_t res = ((x << 7) | (x >> 57)) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = (s[3] << 45) | (s[3] >> 19);
	return res;
}

/** Uniform in [0, 1) with 53 random bits. */
static inline double mfs_rng_uniform(mfs_rng_t *r) { return (double)(mfs_rng_next(r) >> 11) * 0x1.0p-53; }

/** Uniform integer in [0, n) (Lemire's multiply-shift; bias < 2^-32 for n < 2^32). */
__extension__ typedef unsigned __int128 mfs_u128_t;
static inline uint64_t mfs_rng_below(mfs_rng_t *r, uint64_t n)
{
	return (uint64_t)(((mfs_u128_t)mfs_rng_next(r) * n) >> 64);
}

/** Standard normal (Box-Muller; one value per call, the second is dropped for simplicity). */
static inline double mfs_rng_normal(mfs_rng_t *r)
{
	double u1 = mfs_rng_uniform(r), u2 = mfs_rng_uniform(r);
	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/** Two independent standard normals in float from one 64-bit draw (Box-Muller with both
 * outputs, 24-bit uniforms; |z| < 5.8): about 3x cheaper per value than mfs_rng_normal, for
 * bulk draws where float is enough (initial factors). */
static inline MFS_HD void mfs_rng_normal2f(mfs_rng_t *r, float *z0, float *z1)
{
	uint64_t x = mfs_rng_next(r);
	float u1 = (float)((x >> 40) + 1) * 0x1.0p-24f; /* (0, 1] */
	float u2 = (float)((x >> 16) & 0xffffff) * 0x1.0p-24f;
	float m = sqrtf(-2.0f * logf(u1)), t = 6.2831853f * u2;
	*z0 = m * cosf(t);
	*z1 = m * sinf(t);
}

/** The seed of row `row` of table `ent` (0 users, 1 items) under a model's seed, and of the
 *  row's gen-th reuse when gen > 0 (model_store: mfs_model_init_row). */
static inline MFS_HD uint64_t mfs_row_seed(uint64_t seed, int ent, uint32_t row, uint16_t gen)
{
	uint64_t s = mfs_mix64(seed ^ (0x5851F42D4C957F2Dull * (uint64_t)(ent + 1)), row);
	return gen ? mfs_mix64(s, (uint64_t)gen) : s;
}

#endif
