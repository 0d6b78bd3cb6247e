/* bench_planted.h - the planted rating sets of the CPU benchmarks (bench_cpu_sgd, bench_shard):
 * a biased rank-R model (mean 3.5, bias sd 0.3, sd of p.q 0.5, Gaussian noise, clipped to
 * [1, 5]), users uniform, items Zipf(s) through an inverse-CDF table (s = 0: uniform), a
 * training and a test set drawn from one seeded stream. One implementation, so both draw the
 * same ratings from the same flags. */
#ifndef MFS_BENCH_PLANTED_H
#define MFS_BENCH_PLANTED_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/rng.h"

struct data {
	uint32_t *u, *i;
	float *r;
	size_t n;
};

static int data_alloc(struct data *d, size_t n)
{
	d->n = n;
	d->u = malloc((n ? n : 1) * sizeof *d->u);
	d->i = malloc((n ? n : 1) * sizeof *d->i);
	d->r = malloc((n ? n : 1) * sizeof *d->r);
	return d->u && d->i && d->r ? 0 : -1;
}

static void data_free(struct data *d) { free(d->u), free(d->i), free(d->r); }

/* nu users x ni items, rank R, ntr training and nte test ratings; *mean: the training mean.
 * @return 0, -1 when out of memory. */
static int planted_sets(size_t nu, size_t ni, size_t R, size_t ntr, size_t nte, double zipf, double noise,
                        uint64_t seed, struct data *tr, struct data *te, double *mean)
{
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	float *P = malloc(nu * R * sizeof *P), *Q = malloc(ni * R * sizeof *Q);
	float *bu = malloc(nu * sizeof *bu), *bi = malloc(ni * sizeof *bi);
	double *cdf = zipf > 0 ? malloc(ni * sizeof *cdf) : NULL;
	if (!P || !Q || !bu || !bi || (zipf > 0 && !cdf) || data_alloc(tr, ntr) || data_alloc(te, nte))
		return -1;
	const double fs = sqrt(0.5 / sqrt((double)R)); /* sd of p.q = 0.5 */
	for (size_t x = 0; x < nu * R; x++)
		P[x] = (float)(fs * mfs_rng_normal(&g));
	for (size_t x = 0; x < ni * R; x++)
		Q[x] = (float)(fs * mfs_rng_normal(&g));
	for (size_t x = 0; x < nu; x++)
		bu[x] = (float)(0.3 * mfs_rng_normal(&g));
	for (size_t x = 0; x < ni; x++)
		bi[x] = (float)(0.3 * mfs_rng_normal(&g));
	if (cdf) {
		double s = 0;
		for (size_t x = 0; x < ni; x++)
			cdf[x] = (s += pow((double)(x + 1), -zipf));
		for (size_t x = 0; x < ni; x++)
			cdf[x] /= s;
	}
	double sum = 0;
	for (size_t x = 0; x < tr->n + te->n; x++) {
		uint32_t u = (uint32_t)mfs_rng_below(&g, nu), i;
		if (cdf) {
			double y = mfs_rng_uniform(&g);
			size_t lo = 0, hi = ni - 1;
			while (lo < hi) {
				size_t mid = (lo + hi) / 2;
				if (cdf[mid] < y)
					lo = mid + 1;
				else
					hi = mid;
			}
			i = (uint32_t)lo;
		} else {
			i = (uint32_t)mfs_rng_below(&g, ni);
		}
		double d = 3.5 + bu[u] + bi[i];
		for (size_t f = 0; f < R; f++)
			d += (double)P[u * R + f] * Q[i * R + f];
		d += noise * mfs_rng_normal(&g);
		float r = (float)(d < 1 ? 1 : d > 5 ? 5 : d);
		struct data *t = x < tr->n ? tr : te;
		size_t j = x < tr->n ? x : x - tr->n;
		t->u[j] = u, t->i[j] = i, t->r[j] = r;
		if (t == tr)
			sum += r;
	}
	*mean = sum / (double)tr->n;
	free(P), free(Q), free(bu), free(bi), free(cdf);
	return 0;
}

#endif
