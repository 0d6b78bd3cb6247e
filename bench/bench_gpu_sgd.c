/* bench_gpu_sgd.c - SGD throughput of an engine on planted synthetic data, GPU-shaped sizes.
 *
 *   bench_gpu_sgd [--users U] [--items I] [--ratings N] [--zipf S] [--k K] [--epochs E]
 *                 [--engine cuda|cpu] [--threads T] [--label NAME] [--csv FILE] [--copy-gb G]
 *
 * Data: a planted biased rank-8 model (mu 3.5, bias sd 0.3, dot sd 0.5, noise sd 0.5, clipped
 * to [1, 5]); users uniform, item popularity Zipf(S) over a random permutation of items; iid
 * order. 1 % is held out. Generated in memory with one thread per core (seeded per chunk).
 * Prints one table row per run (median epoch updates/s, bytes per update, achieved GB/s next
 * to the device-to-device copy bandwidth measured in the same process, final test RMSE) and
 * appends it to the CSV. Bytes per update: rating 12 + p and q read and written (4 k x element
 * size) + biases read and written 16 = 16k + 28 in fp32, 8k + 28 in fp16 (--dtype).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/rng.h"
#include "common/timeutil.h"
#include "gpu/engine.h"
#include "model_store/store.h"
#ifdef MFS_HAVE_CUDA
#include "gpu/cuda/cuda_probe.h"
#endif

struct opts {
	long users, items, ratings, k, epochs, threads;
	double zipf, copy_gb;
	const char *engine, *label, *csv, *dtype;
};

struct gen {
	const struct opts *o;
	const float *pu, *qi, *bu, *bi;
	const uint32_t *alias_i;
	const float *alias_p;
	const uint32_t *perm;
	uint32_t *u, *i;
	float *r;
	size_t begin, end;
	uint64_t seed;
};

static void *gen_chunk(void *arg)
{
	struct gen *g = arg;
	mfs_rng_t rng;
	mfs_rng_seed(&rng, g->seed);
	for (size_t x = g->begin; x < g->end; x++) {
		uint32_t u = (uint32_t)mfs_rng_below(&rng, (uint64_t)g->o->users);
		uint32_t slot = (uint32_t)mfs_rng_below(&rng, (uint64_t)g->o->items);
		uint32_t rank = mfs_rng_uniform(&rng) < g->alias_p[slot] ? slot : g->alias_i[slot];
		uint32_t i = g->perm[rank];
		double d = 3.5 + g->bu[u] + g->bi[i];
		for (int f = 0; f < 8; f++)
			d += (double)g->pu[(size_t)u * 8 + f] * g->qi[(size_t)i * 8 + f];
		d += 0.5 * mfs_rng_normal(&rng);
		g->u[x] = u;
		g->i[x] = i;
		g->r[x] = (float)(d < 1 ? 1 : d > 5 ? 5 : d);
	}
	return NULL;
}

/* Vose's alias table for P(rank) ~ 1 / (rank + 1)^s. */
static void alias_build(long n, double s, uint32_t *ai, float *ap)
{
	double *w = malloc((size_t)n * sizeof *w), sum = 0;
	uint32_t *small = malloc((size_t)n * 4), *large = malloc((size_t)n * 4);
	for (long x = 0; x < n; x++)
		sum += (w[x] = pow((double)(x + 1), -s));
	long ns = 0, nl = 0;
	for (long x = 0; x < n; x++) {
		w[x] = w[x] / sum * (double)n;
		if (w[x] < 1)
			small[ns++] = (uint32_t)x;
		else
			large[nl++] = (uint32_t)x;
	}
	while (ns && nl) {
		uint32_t a = small[--ns], b = large[nl - 1];
		ap[a] = (float)w[a];
		ai[a] = b;
		w[b] -= 1 - w[a];
		if (w[b] < 1) {
			nl--;
			small[ns++] = b;
		}
	}
	while (nl)
		ap[large[--nl]] = 1, ai[large[nl]] = large[nl];
	while (ns)
		ap[small[--ns]] = 1, ai[small[ns]] = small[ns];
	free(w);
	free(small);
	free(large);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct opts o = {1000000, 1000000, 100000000, 128, 5, 0, 0, 4, "cuda", "run", NULL, "fp32"};
	for (int a = 1; a + 1 < argc; a += 2) {
		const char *f = argv[a], *v = argv[a + 1];
		if (!strcmp(f, "--users")) o.users = atol(v);
		else if (!strcmp(f, "--items")) o.items = atol(v);
		else if (!strcmp(f, "--ratings")) o.ratings = atol(v);
		else if (!strcmp(f, "--zipf")) o.zipf = atof(v);
		else if (!strcmp(f, "--k")) o.k = atol(v);
		else if (!strcmp(f, "--epochs")) o.epochs = atol(v);
		else if (!strcmp(f, "--threads")) o.threads = atol(v);
		else if (!strcmp(f, "--engine")) o.engine = v;
		else if (!strcmp(f, "--label")) o.label = v;
		else if (!strcmp(f, "--csv")) o.csv = v;
		else if (!strcmp(f, "--copy-gb")) o.copy_gb = atof(v);
		else if (!strcmp(f, "--dtype")) o.dtype = v;
		else {
			fprintf(stderr, "bench_gpu_sgd: unknown flag %s\n", f);
			return 2;
		}
	}
	int is_cuda = !strcmp(o.engine, "cuda");
	if (is_cuda && !mfs_engine_cuda_available()) {
		fprintf(stderr, "bench_gpu_sgd: no CUDA device answers\n");
		return 77;
	}
	double copy_gbps = NAN;
#ifdef MFS_HAVE_CUDA
	if (is_cuda && o.copy_gb > 0 && mfs_cuda_copy_gbps(0, (size_t)(o.copy_gb * 1e9), 10, &copy_gbps))
		return 1;
#endif
	/* planted model */
	double t0 = mfs_now_s();
	mfs_rng_t rng;
	mfs_rng_seed(&rng, 12345);
	float *pu = malloc((size_t)o.users * 8 * 4), *qi = malloc((size_t)o.items * 8 * 4);
	float *bu = malloc((size_t)o.users * 4), *bi = malloc((size_t)o.items * 4);
	const double fsd = sqrt(0.5 / sqrt(8.0)); /* p.q over 8 terms has sd 0.5 */
	for (long x = 0; x < o.users * 8; x++)
		pu[x] = (float)(fsd * mfs_rng_normal(&rng));
	for (long x = 0; x < o.items * 8; x++)
		qi[x] = (float)(fsd * mfs_rng_normal(&rng));
	for (long x = 0; x < o.users; x++)
		bu[x] = (float)(0.3 * mfs_rng_normal(&rng));
	for (long x = 0; x < o.items; x++)
		bi[x] = (float)(0.3 * mfs_rng_normal(&rng));
	uint32_t *perm = malloc((size_t)o.items * 4), *ai = malloc((size_t)o.items * 4);
	float *ap = malloc((size_t)o.items * 4);
	for (long x = 0; x < o.items; x++)
		perm[x] = (uint32_t)x;
	for (long x = o.items - 1; x > 0; x--) {
		long y = (long)mfs_rng_below(&rng, (uint64_t)x + 1);
		uint32_t t = perm[x];
		perm[x] = perm[y];
		perm[y] = t;
	}
	alias_build(o.items, o.zipf, ai, ap);
	size_t n = (size_t)o.ratings;
	uint32_t *U = malloc(n * 4), *I = malloc(n * 4);
	float *R = malloc(n * 4);
	if (!pu || !qi || !U || !I || !R) {
		fprintf(stderr, "bench_gpu_sgd: out of memory\n");
		return 1;
	}
	long nt = sysconf(_SC_NPROCESSORS_ONLN);
	if (nt < 1)
		nt = 1;
	if (nt > 64)
		nt = 64;
	pthread_t th[64];
	struct gen g[64];
	for (long t = 0; t < nt; t++) {
		g[t] = (struct gen){&o, pu, qi, bu, bi, ai, ap, perm, U, I, R, n * (size_t)t / (size_t)nt,
		                    n * (size_t)(t + 1) / (size_t)nt, mfs_mix64(777, (uint64_t)t)};
		pthread_create(&th[t], NULL, gen_chunk, &g[t]);
	}
	for (long t = 0; t < nt; t++)
		pthread_join(th[t], NULL);
	/* every 100th rating is held out (the order is iid, so this is a random 1 %) */
	size_t ntest = n / 100, ntrain = n - ntest;
	uint32_t *TU = malloc(ntest * 4), *TI = malloc(ntest * 4);
	float *TR = malloc(ntest * 4);
	for (size_t x = 0, w = 0, t = 0; x < n; x++) {
		if (x % 100 == 99 && t < ntest) {
			TU[t] = U[x], TI[t] = I[x], TR[t] = R[x], t++;
		} else {
			U[w] = U[x], I[w] = I[x], R[w] = R[x], w++;
		}
	}
	double t_gen = mfs_now_s() - t0;

	mfs_model_conf_t mc = {(int)o.k, 0.1, 42};
	mfs_model_t *m;
	if (mfs_model_init(&mc, &m) || mfs_model_reserve(m, (uint32_t)o.users, (uint32_t)o.items))
		return 1;
	for (long x = 0; x < o.users; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x);
		uint32_t row;
		mfs_model_user_row(m, &id, &row);
	}
	for (long x = 0; x < o.items; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x);
		uint32_t row;
		mfs_model_item_row(m, &id, &row);
	}
	double sum = 0;
	for (size_t x = 0; x < ntrain; x++)
		sum += R[x];
	mfs_model_observe(m, sum, ntrain);

	const int fp16 = !strcmp(o.dtype, "fp16");
	mfs_engine_conf_t ec = {is_cuda ? MFS_ENGINE_CUDA : MFS_ENGINE_CPU, (int)o.threads, 0, 0, 42,
	                        fp16 ? MFS_DTYPE_FP16 : MFS_DTYPE_FP32};
	mfs_engine_t *e;
	char err[256];
	if (mfs_engine_open(&ec, m, &e, err, sizeof err)) {
		fprintf(stderr, "bench_gpu_sgd: %s\n", err);
		return 1;
	}
	mfs_hparams_t hp = {0.02f, 0.04f, 0.04f, 0.02f, 0.02f, 1.0f, 5.0f};
	mfs_engine_set_hparams(e, &hp);
	mfs_set_t *st, *ste;
	t0 = mfs_now_s();
	if (mfs_engine_set_load(e, &(mfs_batch_t){U, I, R, ntrain}, &st) ||
	    mfs_engine_set_load(e, &(mfs_batch_t){TU, TI, TR, ntest}, &ste))
		return 1;
	double t_load = mfs_now_s() - t0;
	double *ups = calloc((size_t)o.epochs, sizeof *ups);
	for (long ep = 0; ep < o.epochs; ep++) {
		double a = mfs_now_s();
		if (mfs_engine_sgd_set(e, st, (uint64_t)ep + 1))
			return 1;
		ups[ep] = (double)ntrain / (mfs_now_s() - a);
	}
	mfs_loss_t l;
	mfs_engine_loss_set(e, ste, &l);
	qsort(ups, (size_t)o.epochs, sizeof *ups, cmp_double);
	double med = ups[o.epochs / 2];
	double bpu = (fp16 ? 8.0 : 16.0) * (double)o.k + 28;
	double gbs = med * bpu / 1e9;
	printf("%-28s %9s %6.2f %4ld %5s %12.3f %8.0f %9.1f %9.1f %6.1f%% %9.4f %6.1f %6.1f\n", o.label, o.engine,
	       o.zipf, o.k, o.dtype, med / 1e9, bpu, gbs, copy_gbps, 100 * gbs / copy_gbps, l.rmse, t_gen, t_load);
	if (o.csv) {
		FILE *f = fopen(o.csv, "a");
		if (f) {
			if (ftell(f) == 0)
				fprintf(f, "label,engine,users,items,ratings,zipf,k,dtype,epochs,updates_per_s,bytes_per_update,"
				           "achieved_gbps,copy_gbps,test_rmse\n");
			fprintf(f, "%s,%s,%ld,%ld,%ld,%.2f,%ld,%s,%ld,%.0f,%.0f,%.1f,%.1f,%.5f\n", o.label, o.engine, o.users,
			        o.items, o.ratings, o.zipf, o.k, o.dtype, o.epochs, med, bpu, gbs, copy_gbps, l.rmse);
			fclose(f);
		}
	}
	mfs_engine_set_free(e, st);
	mfs_engine_set_free(e, ste);
	mfs_engine_close(e);
	mfs_model_free(m);
	return 0;
}
