/* planted_help.h - a planted rating problem for the sharded engine's tests (include after
 * testhelp.h and model_help.h): r = 3 + 0.3 sin(u) + 0.3 cos(i) + p*_u . q*_i (rank 4, factor sd
 * 0.6) + N(0, 0.3^2), users uniform, items Zipf(zipf) by inverse CDF (zipf 0: uniform), n
 * training ratings then tn test ratings, all from one seeded stream. */
#ifndef MFS_TEST_PLANTED_HELP_H
#define MFS_TEST_PLANTED_HELP_H

#include <math.h>
#include <stdlib.h>

#include "common/rng.h"
#include "model_store/store.h"

struct planted {
	uint32_t *u, *i;
	float *r;
	size_t n, tn;
	double mean; /* of the training ratings */
};

static inline void planted(struct planted *pl, uint32_t nu, uint32_t ni, size_t n, size_t tn, double zipf,
                           uint64_t seed)
{
	const int R = 4;
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	double *P = malloc((size_t)nu * R * sizeof *P), *Q = malloc((size_t)ni * R * sizeof *Q);
	double *cdf = malloc(ni * sizeof *cdf), total = 0;
	for (uint32_t x = 0; x < ni; x++)
		cdf[x] = (total += zipf > 0 ? pow((double)x + 1, -zipf) : 1.0);
	for (size_t x = 0; x < (size_t)nu * R; x++)
		P[x] = 0.6 * mfs_rng_normal(&g);
	for (size_t x = 0; x < (size_t)ni * R; x++)
		Q[x] = 0.6 * mfs_rng_normal(&g);
	pl->n = n, pl->tn = tn;
	pl->u = malloc((n + tn) * sizeof *pl->u);
	pl->i = malloc((n + tn) * sizeof *pl->i);
	pl->r = malloc((n + tn) * sizeof *pl->r);
	double sum = 0;
	for (size_t x = 0; x < n + tn; x++) {
		const uint32_t u = (uint32_t)mfs_rng_below(&g, nu);
		const double y = mfs_rng_uniform(&g) * total;
		uint32_t lo = 0, hi = ni - 1;
		while (lo < hi) {
			const uint32_t mid = (lo + hi) / 2;
			if (cdf[mid] <= y)
				lo = mid + 1;
			else
				hi = mid;
		}
		double d = 3.0 + 0.3 * sin((double)u) + 0.3 * cos((double)lo);
		for (int f = 0; f < R; f++)
			d += P[(size_t)u * R + f] * Q[(size_t)lo * R + f];
		pl->u[x] = u, pl->i[x] = lo;
		pl->r[x] = (float)(d + 0.3 * mfs_rng_normal(&g));
		if (x < n)
			sum += pl->r[x];
	}
	pl->mean = sum / (double)n;
	free(P);
	free(Q);
	free(cdf);
}

static inline void planted_free(struct planted *pl)
{
	free(pl->u);
	free(pl->i);
	free(pl->r);
}

/* A model (model_help.h's model_with_rows, seed 11) with users 0..nu-1, items 0..ni-1 and mean. */
static inline mfs_model_t *mk_model(int k, uint32_t nu, uint32_t ni, double mean)
{
	mfs_model_t *m = model_with_rows(k, nu, ni, 11);
	if (m)
		mfs_model_observe(m, mean, 1);
	return m;
}

#endif
