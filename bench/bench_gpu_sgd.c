/* bench_gpu_sgd.c - SGD throughput of an engine on planted synthetic data, GPU-shaped sizes.
 *
 *   bench_gpu_sgd [--users U] [--items I] [--ratings N] [--zipf S] [--k K] [--epochs E]
 *                 [--engine cuda|cpu] [--threads T] [--label NAME] [--csv FILE] [--copy-gb G]
 *                 [--dtype fp32|fp16] [--target-rmse R] [--max-epochs M] [--trace 1]
 *                 [--variants V1,V2,...] [--lr LR] [--set engine.cuda.KEY=VALUE ...]
 *                 [--rows appearance]
 *
 * Data: a planted biased rank-8 model (mu 3.5, bias sd 0.3, dot sd 0.5, noise sd 0.5, clipped
 * to [1, 5]); users uniform, item popularity Zipf(S) over a random permutation of items; iid
 * order. 1 % is held out. Generated in memory in 64 fixed chunks (seeded per chunk, run by one
 * thread per core), so the same flags give the same ratings on any machine: the CPU reference
 * RMSE measured on one machine is a target for a GPU run on another.
 * Prints one table row per run (median epoch updates/s over the first E epochs, bytes per
 * update, achieved GB/s next to the device-to-device copy bandwidth measured in the same
 * process, test RMSE after E epochs) and appends it to the CSV. Bytes per update, iid order:
 * rating 12 + p and q read and written (4 k x element size) + biases read and written 16 =
 * 16k + 28 in fp32, 8k + 28 in fp16 (--dtype); user runs (the CUDA engine's default): q read
 * and written + b_i 8 + item and value 8, and p and b_u once per run, spread over the set's
 * mean run length (mean_run). A default variant is counted as user runs; where the engine
 * keeps the iid order (its log line msg="resident set order", e.g. at item Zipf 1.2) the iid
 * count applies instead.
 * --rows appearance numbers item rows in the order the training ratings first name them, as
 * `mfstream train --train.item_order appearance` does (the generator's numbering is a random
 * permutation of popularity, like train's default renumbering).
 *
 * Hyperparameters: lr 0.02 (--lr), lambda_p = lambda_q = 0.04, bias lambdas 0.02, fixed rate.
 *
 * Time to target: with --target-rmse R (the test RMSE the CPU reference reaches after 20
 * epochs on the same flags, see bench/gpu_sgd.sh), the test RMSE is scored after every epoch
 * and the run goes on past E, up to M epochs (default 2E), until it is <= R; the row reports
 * the epochs and the training seconds (sum of epoch times, loss passes excluded) it took.
 *
 * --variants runs several CUDA engine settings on the same data in one process (one engine
 * each, all from the same initial model): NAME@C sets engine.cuda.plain_c = C (the plain-store
 * threshold of the CUDA engine, read at open; C = 0: atomic deltas everywhere) for that engine, NAME alone leaves the
 * default; NAME labels the row. A NAME starting with "ring" (ring, ring/B) runs each epoch
 * through the persistent kernel's device ring in pieces of B ratings (default 262144,
 * bench_cuda_ring_epoch in bench/ring_feed.cu): the kernel fed from the ring against one launch over the set,
 * on the same data and row modes. "ringfull" (ringfull, ringfull/B) gives the persistent
 * kernel the whole GPU (engine conf frequent_loss 0) instead of leaving room for a loss kernel.
 * A NAME xS (x2, x4, x2-p16-h4) shards the model over S CUDA devices (engine.devices: gpu/sharded.c,
 * docs/SCALE_OUT.md; devices 0..S-1, round the ones that answer), -pP pieces an epoch
 * (engine.merge_pieces, default 16; one unless heavy skew), -hH the hot rows' threshold
 * (engine.merge_hot, default 8), -sF the least share of the set's ratings on hot rows for
 * which an epoch runs in pieces (default 0.8; -s0.001: always in pieces), -eG the factor of
 * BLEND's step after an epoch in one piece (engine.merge_epoch_g; -e1: BLEND's own step; default
 * by the shard count, gpu/shard.h), -c merges by copies
 * (MFS_MERGE_PATH=copies: gpu/cuda/merge.cu's path for devices without peer access).
 * A NAME starting with "iid" runs the set in iid order, one rating per group (sgd.cu; ring
 * variants too), "runsN" in user runs of at most N ratings (runs.cu); otherwise the engine's
 * default (user runs; runs.cu says how long).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/rng.h"
#include "common/timeutil.h"
#include "gpu/engine.h"
#include "model_store/store.h"
#include "bench/bench_set.h"
#ifdef MFS_HAVE_CUDA
#include "bench/bench_cuda.h"
#include "gpu/cuda/cuda_probe.h"
#endif

struct opts {
	long users, items, ratings, k, epochs, threads, max_epochs, trace;
	double zipf, copy_gb, target, lr;
	const char *engine, *label, *csv, *dtype, *variants;
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

#define GEN_CHUNKS 64

struct gen_pool {
	struct gen *g;
	int next;
	pthread_mutex_t mu;
};

static void *gen_worker(void *arg)
{
	struct gen_pool *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->mu);
		int c = p->next < GEN_CHUNKS ? p->next++ : -1;
		pthread_mutex_unlock(&p->mu);
		if (c < 0)
			return NULL;
		gen_chunk(&p->g[c]);
	}
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

/* One epoch of resident ratings through the CUDA engine's ring in pieces of `batch` ratings
 * (bench/ring_feed.cu); another engine, or a build without CUDA: the set epoch. */
static int epoch_ring(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch, size_t batch)
{
#ifdef MFS_HAVE_CUDA
	if (!strcmp(mfs_engine_name(e), "cuda"))
		return bench_cuda_ring_epoch(e, s, epoch, batch);
#endif
	return batch ? mfs_engine_sgd_epoch(e, s, epoch) : MFS_EINVAL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* --rows appearance: item rows in the order the training ratings first name them (then the
 * test's), as `mfstream train --train.item_order appearance` numbers ids; the default keeps the
 * generator's random numbering. */
static int rows_appearance;
static void renumber(uint32_t *I, size_t n, uint32_t *TI, size_t nt, uint32_t items)
{
	uint32_t *map = malloc((size_t)items * sizeof *map), next = 0;
	if (!map)
		return;
	memset(map, 0xff, (size_t)items * sizeof *map);
	for (int pass = 0; pass < 2; pass++) {
		uint32_t *a = pass ? TI : I;
		for (size_t x = 0, m = pass ? nt : n; x < m; x++) {
			if (map[a[x]] == UINT32_MAX)
				map[a[x]] = next++;
			a[x] = map[a[x]];
		}
	}
	free(map);
}

/* Ratings per run of the CUDA engine's user runs (runs.cu) with runs of at most run_max. */
static double mean_run(const uint32_t *U, size_t n, long users, long run_max)
{
	uint32_t *cnt = calloc((size_t)users, sizeof *cnt);
	if (!cnt)
		return 1;
	for (size_t x = 0; x < n; x++)
		cnt[U[x]]++;
	double runs = 0;
	for (long u = 0; u < users; u++)
		runs += (cnt[u] + run_max - 1) / run_max;
	free(cnt);
	return runs > 0 ? (double)n / runs : 1;
}

static int n_devices; /* CUDA devices that answer (sharded variants go round them) */

/* Train one engine on the set for E epochs (more with a target), print and record a row. */
static int run_variant(const struct opts *o, mfs_model_t *m, int is_cuda, int fp16, const char *variant,
                       uint32_t *U, uint32_t *I, float *R, size_t ntrain, uint32_t *TU, uint32_t *TI, float *TR,
                       size_t ntest, double copy_gbps, double t_gen)
{
	const int ring = !strncmp(variant, "ring", 4);
	const char *sl = strchr(variant, '/');
	const size_t ring_batch = sl && atol(sl + 1) > 0 ? (size_t)atol(sl + 1) : 262144;
	mfs_engine_conf_t ec = {is_cuda ? MFS_ENGINE_CUDA : MFS_ENGINE_CPU, (int)o->threads, 0, 0, 42,
	                        fp16 ? MFS_DTYPE_FP16 : MFS_DTYPE_FP32, ring, strncmp(variant, "ringfull", 8) != 0};
	bench_experiments(&ec); /* --set engine.cuda.* / engine.cpu.* */
	if (ring || !strncmp(variant, "iid", 3)) /* iid order (the ring feeds the set's order as it is) */
		ec.cuda_user_runs = -1;
	else if (!strncmp(variant, "runs", 4) && atoi(variant + 4) > 0) /* runsN: runs of at most N ratings */
		ec.cuda_user_runs = atoi(variant + 4);
	if (variant[0] == 'x' && variant[1] >= '1' && variant[1] <= '9') { /* xS[-pP][-hH][-sF][-eG][-c]: S shards */
		const char *p = strstr(variant, "-p"), *h = strstr(variant, "-h"), *sh = strstr(variant, "-s"),
		           *ex = strstr(variant, "-e");
		/* the merge's path (gpu/cuda/merge.cu), read at every merge: -c copies */
		if (setenv("MFS_MERGE_PATH", strstr(variant, "-c") ? "copies" : "", 1))
			return 1;
		ec.merge_pieces_share = sh ? atof(sh + 2) : 0;
		ec.merge_epoch_g = ex ? atof(ex + 2) : 0;
		ec.shards = (uint32_t)atoi(variant + 1);
		ec.merge_batches = 8;
		ec.merge_pieces = p ? (uint32_t)atoi(p + 2) : 16;
		ec.merge_hot = h ? (uint32_t)atoi(h + 2) : 8;
		for (uint32_t s = 0; s < ec.shards && s < MFS_SHARD_MAX; s++)
			ec.devices[s] = (int)(s % (uint32_t)(n_devices > 0 ? n_devices : 1));
		if (ec.shards == 1)
			ec.shards = 0;
	}
	const char *at = strchr(variant, '@'); /* NAME@C: engine.cuda.plain_c = C (0: atomic deltas everywhere) */
	if (at && at[1])
		ec.cuda_plain_c = atof(at + 1) > 0 ? atof(at + 1) : -1;
	mfs_engine_t *e;
	char err[256];
	if (mfs_engine_open(&ec, m, &e, err, sizeof err)) {
		fprintf(stderr, "bench_gpu_sgd: %s\n", err);
		return 1;
	}
	mfs_hparams_t hp = {(float)o->lr, 0.04f, 0.04f, 0.02f, 0.02f, 1.0f, 5.0f};
	mfs_resident_t *st, *ste;
	double t0 = mfs_now_s();
	if (mfs_engine_set_hparams(e, &hp) || mfs_engine_resident_load(e, &(mfs_batch_t){U, I, R, ntrain}, &st) ||
	    mfs_engine_resident_load(e, &(mfs_batch_t){TU, TI, TR, ntest}, &ste)) {
		fprintf(stderr, "bench_gpu_sgd: set load failed\n");
		return 1;
	}
	double t_load = mfs_now_s() - t0;
	double *ups = calloc((size_t)o->epochs, sizeof *ups);
	double t_train = 0, t_hit = NAN, rmse_e = NAN, rmse_last = NAN;
	long ep_hit = 0, ep = 0;
	while (ep < o->max_epochs && (ep < o->epochs || (!isnan(o->target) && !ep_hit))) {
		double a = mfs_now_s();
		int rc = ring ? epoch_ring(e, st, (uint64_t)ep + 1, ring_batch) : mfs_engine_sgd_epoch(e, st, (uint64_t)ep + 1);
		if (rc) {
			fprintf(stderr, "bench_gpu_sgd: %s epoch %ld: %s\n", variant, ep + 1, mfs_strerror(rc));
			return 1;
		}
		double dt = mfs_now_s() - a;
		t_train += dt;
		if (ep < o->epochs)
			ups[ep] = (double)ntrain / dt;
		ep++;
		if (!isnan(o->target) || o->trace || ep == o->epochs) {
			mfs_loss_t l;
			if (mfs_engine_loss_resident(e, ste, &l))
				return 1;
			rmse_last = l.rmse;
			if (ep == o->epochs)
				rmse_e = l.rmse;
			if (!ep_hit && l.rmse <= o->target)
				ep_hit = ep, t_hit = t_train;
			if (o->trace)
				fprintf(stderr, "  %s %s zipf %.2f epoch %ld: test RMSE %.5f (%.3f s)\n", o->label, variant, o->zipf,
				        ep, l.rmse, dt);
		}
	}
	if (!isfinite(rmse_e) && !mfs_engine_sync(e)) { /* where the non-finite values are */
		size_t bad[4] = {0};
		for (size_t x = 0; x < (size_t)m->n_users * (size_t)m->k; x++)
			bad[0] += !isfinite(m->P[x]);
		for (size_t x = 0; x < (size_t)m->n_items * (size_t)m->k; x++)
			bad[1] += !isfinite(m->Q[x]);
		for (size_t x = 0; x < m->n_users; x++)
			bad[2] += !isfinite(m->bu[x]);
		for (size_t x = 0; x < m->n_items; x++)
			bad[3] += !isfinite(m->bi[x]);
		fprintf(stderr, "bench_gpu_sgd: %s: test RMSE %g; non-finite values after the sync: P %zu, Q %zu, bu %zu, bi %zu\n",
		        variant, rmse_e, bad[0], bad[1], bad[2], bad[3]);
	}
	qsort(ups, (size_t)o->epochs, sizeof *ups, cmp_double);
	double med = ups[o->epochs / 2];
	free(ups);
	/* bytes per update: iid, p and q read and written (4 k es) + rating 12 + biases 16; user
	 * runs, q read and written + b_i 8 + rating 8, and p and b_u once per run (runs.cu) */
	const double es = fp16 ? 2.0 : 4.0, row = 2 * es * (double)o->k;
	/* the engine's default run length is at least a group's share (~1e4 here): no user is cut */
	const long run_max = ec.cuda_user_runs < 0 ? 0 : ec.cuda_user_runs > 0 ? ec.cuda_user_runs : 1L << 30;
	double bpu = 2 * row + 28;
	if (is_cuda && run_max)
		bpu = row + 16 + (row + 8) / mean_run(U, ntrain, o->users, run_max);
	double gbs = med * bpu / 1e9;
	char hit[64] = "-";
	if (ep_hit)
		snprintf(hit, sizeof hit, "%ld/%.2f", ep_hit, t_hit);
	else if (!isnan(o->target))
		snprintf(hit, sizeof hit, "no(%.4f)", rmse_last);
	printf("%-24s %4s %-9s %5.2f %4ld %5s %8.3f %6.0f %7.1f %7.1f %5.1f%% %8.4f %7.4f %12s %5.1f %5.1f\n", o->label,
	       o->engine, variant, o->zipf, o->k, o->dtype, med / 1e9, bpu, gbs, copy_gbps, 100 * gbs / copy_gbps, rmse_e,
	       o->target, hit, t_gen, t_load);
	fflush(stdout);
	if (o->csv) {
		FILE *f = fopen(o->csv, "a");
		if (f) {
			if (ftell(f) == 0)
				fprintf(f, "label,engine,variant,users,items,ratings,zipf,k,dtype,lr,epochs,updates_per_s,"
				           "bytes_per_update,achieved_gbps,copy_gbps,test_rmse,target_rmse,epochs_to_target,"
				           "seconds_to_target\n");
			fprintf(f, "%s,%s,%s,%ld,%ld,%ld,%.2f,%ld,%s,%.3f,%ld,%.0f,%.0f,%.1f,%.1f,%.5f,%.5f,%ld,%.3f\n", o->label,
			        o->engine, variant, o->users, o->items, o->ratings, o->zipf, o->k, o->dtype, o->lr, o->epochs, med, bpu,
			        gbs, copy_gbps, rmse_e, o->target, ep_hit, t_hit);
			fclose(f);
		}
	}
	mfs_engine_resident_free(e, st);
	mfs_engine_resident_free(e, ste);
	mfs_engine_close(e);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = {1000000, 1000000, 100000000, 128, 5, 0, 0, 0, 0, 4, NAN, 0.02, "cuda", "run", NULL, "fp32", NULL};
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
		else if (!strcmp(f, "--target-rmse")) o.target = atof(v);
		else if (!strcmp(f, "--max-epochs")) o.max_epochs = atol(v);
		else if (!strcmp(f, "--trace")) o.trace = atol(v);
		else if (!strcmp(f, "--lr")) o.lr = atof(v);
		else if (!strcmp(f, "--variants")) o.variants = v;
		else if (!strcmp(f, "--set")) bench_set(v);
		else if (!strcmp(f, "--rows")) rows_appearance = !strcmp(v, "appearance");
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
	if (is_cuda) {
		char why[256];
		n_devices = mfs_cuda_probe(0, why, sizeof why);
	}
	if (is_cuda && o.copy_gb > 0 && bench_cuda_copy_gbps(0, (size_t)(o.copy_gb * 1e9), 10, &copy_gbps))
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
	/* GEN_CHUNKS chunks, each with its own seed, whatever the number of cores */
	long nt = sysconf(_SC_NPROCESSORS_ONLN);
	if (nt < 1)
		nt = 1;
	if (nt > GEN_CHUNKS)
		nt = GEN_CHUNKS;
	pthread_t th[GEN_CHUNKS];
	struct gen g[GEN_CHUNKS];
	for (long c = 0; c < GEN_CHUNKS; c++)
		g[c] = (struct gen){&o, pu, qi, bu, bi, ai, ap, perm, U, I, R, n * (size_t)c / GEN_CHUNKS,
		                    n * (size_t)(c + 1) / GEN_CHUNKS, mfs_mix64(777, (uint64_t)c)};
	struct gen_pool pool = {g, 0};
	pthread_mutex_init(&pool.mu, NULL);
	for (long t = 0; t < nt; t++)
		pthread_create(&th[t], NULL, gen_worker, &pool);
	for (long t = 0; t < nt; t++)
		pthread_join(th[t], NULL);
	pthread_mutex_destroy(&pool.mu);
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
	if (rows_appearance) /* as train.item_order appearance numbers them: the first item met is row 0 */
		renumber(I, ntrain, TI, ntest, (uint32_t)o.items);
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
	if (o.epochs < 1)
		o.epochs = 1;
	if (o.max_epochs < o.epochs)
		o.max_epochs = isnan(o.target) ? o.epochs : 2 * o.epochs;
	/* one engine per variant ("" = the engine's defaults), all from the same initial model:
	 * a CUDA engine trains its device copy and the host model is never synced here */
	char vbuf[256];
	snprintf(vbuf, sizeof vbuf, "%s", o.variants ? o.variants : "");
	/* CPU engines train the host model in place: every variant after the first starts from a
	 * copy of the initial one */
	float *const arr[4] = {m->P, m->Q, m->bu, m->bi};
	const size_t len[4] = {(size_t)o.users * (size_t)o.k, (size_t)o.items * (size_t)o.k, (size_t)o.users,
	                       (size_t)o.items};
	float *init[4] = {NULL};
	for (int j = 0; j < 4 && !is_cuda; j++) {
		if (!(init[j] = malloc(len[j] * sizeof(float))))
			return 1;
		memcpy(init[j], arr[j], len[j] * sizeof(float));
	}
	char *save = NULL;
	const char *var = strtok_r(vbuf, ",", &save);
	for (int first = 1; first || var; first = 0, var = var ? strtok_r(NULL, ",", &save) : NULL) {
		if (!var)
			var = ""; /* no --variants: one run with the defaults */
		for (int j = 0; j < 4 && !is_cuda && !first; j++)
			memcpy(arr[j], init[j], len[j] * sizeof(float));
		if (run_variant(&o, m, is_cuda, fp16, var[0] ? var : "default", U, I, R, ntrain, TU, TI, TR, ntest,
		                copy_gbps, t_gen))
			return 1;
	}
	for (int j = 0; j < 4; j++)
		free(init[j]);
	mfs_model_free(m);
	return 0;
}
