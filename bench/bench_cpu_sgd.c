/* bench_cpu_sgd.c - speed and accuracy of the CPU engine's offline epochs on a planted problem.
 *
 *   bench_cpu_sgd [--users 143000] [--items 48000] [--ratings 18000000] [--test 1800000]
 *                 [--rank 8] [--noise 0.5] [--k 128] [--threads 2] [--epochs 20]
 *                 [--lr X] [--lambda L] [--schedule fixed|decay|bold] [--beta B]
 *                 (hyperparameter defaults: the configuration table's, as `mfstream train` uses)
 *                 [--deterministic] [--mode set|batch] [--batch 1000000] [--zipf 0]
 *                 [--train-loss 1] [--seed 7] [--csv FILE]
 *
 * The data: a rank-`rank` planted model like `mfstream gen` (mean 3.5, bias sd 0.3, p.q sd
 * 0.5), Gaussian noise `noise`, ratings clipped to [1, 5]; uniform users, items uniform or
 * Zipf(zipf). A separate test set is drawn from the same model. The shape defaults to the
 * LIBMF comparison run (143 K users x 48 K items x 18 M ratings, k = 128, 20 iterations).
 *
 * --mode set : the engine's offline path (resident_load once, sgd_epoch per epoch: blocked layout).
 * --mode batch: a baseline: every epoch the ratings are shuffled and fed as mfs_engine_sgd
 *               batches (flat random order, Hogwild ranges), to compare order and speed.
 *
 * Prints a table (epoch, SGD seconds, updates/s, train RMSE, test RMSE, lr) and a summary
 * line; --csv writes the table. SGD time excludes the loss passes, which are timed apart.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "bench/bench_planted.h"
#include "common/timeutil.h"
#include "config/config.h"
#include "gpu/engine.h"
#include "gpu/lr.h"
#include "bench/bench_set.h"
#include "serve/stage_conf.h"

struct opts {
	long users, items, ratings, test, rank, k, threads, epochs, batch, train_loss, det;
	double noise, lr, lambda, beta, zipf;
	const char *schedule, *mode, *csv;
	uint64_t seed;
};

static void usage(void)
{
	fprintf(stderr, "usage: bench_cpu_sgd [--users N] [--items N] [--ratings N] [--test N] [--rank R]\n"
	                "  [--noise S] [--k K] [--threads T] [--epochs E] [--lr X] [--lambda L]\n"
	                "  [--schedule fixed|decay|bold] [--beta B] [--deterministic] [--mode set|batch]\n"
	                "  [--batch N] [--zipf S] [--train-loss 0|1] [--seed N] [--csv FILE]\n"
	                "  [--set engine.cpu.KEY=VALUE ...]\n");
	exit(2);
}

static void parse(int argc, char **argv, struct opts *o)
{
	for (int a = 1; a < argc; a++) {
		const char *f = argv[a];
		if (!strcmp(f, "--deterministic")) {
			o->det = 1;
			continue;
		}
		if (a + 1 >= argc)
			usage();
		const char *v = argv[++a];
#define L(name, field)                                                                       \
	if (!strcmp(f, name)) {                                                                   \
		o->field = atol(v);                                                                   \
		continue;                                                                             \
	}
#define D(name, field)                                                                       \
	if (!strcmp(f, name)) {                                                                   \
		o->field = atof(v);                                                                   \
		continue;                                                                             \
	}
		L("--users", users) L("--items", items) L("--ratings", ratings) L("--test", test)
		L("--rank", rank) L("--k", k) L("--threads", threads) L("--epochs", epochs)
		L("--batch", batch) L("--train-loss", train_loss)
		D("--noise", noise) D("--lr", lr) D("--lambda", lambda) D("--beta", beta) D("--zipf", zipf)
#undef L
#undef D
		if (!strcmp(f, "--schedule")) {
			o->schedule = v;
			continue;
		}
		if (!strcmp(f, "--mode")) {
			o->mode = v;
			continue;
		}
		if (!strcmp(f, "--csv")) {
			o->csv = v;
			continue;
		}
		if (!strcmp(f, "--seed")) {
			o->seed = strtoull(v, NULL, 10);
			continue;
		}
		if (!strcmp(f, "--set")) { /* engine.cpu.grid_users=16 ... (bench_set.h) */
			bench_set(v);
			continue;
		}
		usage();
	}
	if (o->users < 1 || o->items < 1 || o->ratings < 1 || o->rank < 1 || o->k < 1 || o->epochs < 1 ||
	    o->threads < 0 || o->batch < 1 || o->test < 0 || (strcmp(o->mode, "set") && strcmp(o->mode, "batch")))
		usage();
}

/* The planted model and the two rating sets drawn from it (bench_planted.h). */
static int generate(const struct opts *o, struct data *tr, struct data *te, double *mean)
{
	return planted_sets((size_t)o->users, (size_t)o->items, (size_t)o->rank, (size_t)o->ratings, (size_t)o->test,
	                    o->zipf, o->noise, o->seed, tr, te, mean);
}

static void shuffle(struct data *d, mfs_rng_t *g)
{
	for (size_t j = d->n; j > 1; j--) {
		size_t x = (size_t)mfs_rng_below(g, j);
		uint32_t tu = d->u[j - 1], ti = d->i[j - 1];
		float tr = d->r[j - 1];
		d->u[j - 1] = d->u[x], d->i[j - 1] = d->i[x], d->r[j - 1] = d->r[x];
		d->u[x] = tu, d->i[x] = ti, d->r[x] = tr;
	}
}

/* CPU seconds of the whole process: with other jobs on the machine, updates per CPU-second
 * stays comparable between runs when wall-clock rates do not. */
static double cpu_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* FNV-1a over the model's parameters: deterministic runs must print the same value on every
 * build and machine (ISA variants included). */
static uint64_t model_fnv(const mfs_model_t *m)
{
	uint64_t h = 0xcbf29ce484222325ull;
	const struct {
		const void *p;
		size_t n;
	} part[] = {{m->P, (size_t)m->n_users * (size_t)m->k * sizeof(float)},
	            {m->Q, (size_t)m->n_items * (size_t)m->k * sizeof(float)},
	            {m->bu, m->n_users * sizeof(float)},
	            {m->bi, m->n_items * sizeof(float)}};
	for (size_t x = 0; x < sizeof part / sizeof part[0]; x++)
		for (size_t j = 0; j < part[x].n; j++)
			h = (h ^ ((const unsigned char *)part[x].p)[j]) * 0x100000001b3ull;
	return h;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	struct opts o = {143000, 48000, 18000000, 1800000, 8, 128, 2, 20, 1000000, 1, 0,
	                 0.5, 0.08, 0.04, 0.1, 0, "decay", "set", NULL, 7};
	/* the shipped defaults, so the benchmark measures what users run */
	mfs_conf_t defaults;
	if (mfs_conf_init(&defaults))
		return 1;
	o.lr = defaults.sgd_lr;
	o.lambda = defaults.sgd_lambda_p;
	o.beta = defaults.lr_beta;
	o.schedule = defaults.lr_schedule == 0 ? "fixed" : defaults.lr_schedule == 1 ? "decay" : "bold";
	const float lam_b = (float)defaults.sgd_lambda_bu;
	mfs_conf_free(&defaults);
	parse(argc, argv, &o);
	mfs_log_set_level(MFS_LOG_WARN);

	struct data tr, te;
	double mean, t0 = mfs_now_s();
	if (generate(&o, &tr, &te, &mean)) {
		fprintf(stderr, "bench_cpu_sgd: out of memory\n");
		return 1;
	}
	double t_gen = mfs_now_s() - t0;

	mfs_model_conf_t mc = {(int)o.k, 0.1, o.seed};
	mfs_model_t *m = NULL;
	int rc = mfs_model_init(&mc, &m);
	if (!rc)
		rc = mfs_model_reserve(m, (uint32_t)o.users, (uint32_t)o.items);
	for (long x = 0; !rc && x < o.users; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x);
		uint32_t row;
		rc = mfs_model_user_row(m, &id, &row);
	}
	for (long x = 0; !rc && x < o.items; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x);
		uint32_t row;
		rc = mfs_model_item_row(m, &id, &row);
	}
	if (rc) {
		fprintf(stderr, "bench_cpu_sgd: model: %s\n", mfs_strerror(rc));
		return 1;
	}
	mfs_model_observe(m, mean * (double)tr.n, tr.n);

	mfs_engine_conf_t ec = {MFS_ENGINE_CPU, (int)o.threads, (int)o.det, 0, o.seed};
	bench_experiments(&ec);
	mfs_engine_t *e = NULL;
	char err[256];
	if ((rc = mfs_engine_open(&ec, m, &e, err, sizeof err))) {
		fprintf(stderr, "bench_cpu_sgd: %s\n", err);
		return 1;
	}
	/* The learning-rate controller, configured like the service would be. */
	mfs_conf_t conf;
	char num[64];
	mfs_conf_init(&conf);
	snprintf(num, sizeof num, "%.17g", o.lr);
	rc = mfs_conf_set(&conf, "sgd.lr", num, err, sizeof err);
	snprintf(num, sizeof num, "%.17g", o.beta);
	rc = rc ? rc : mfs_conf_set(&conf, "lr.beta", num, err, sizeof err);
	rc = rc ? rc : mfs_conf_set(&conf, "lr.schedule", o.schedule, err, sizeof err);
	if (rc) {
		fprintf(stderr, "bench_cpu_sgd: %s\n", err);
		return 1;
	}
	mfs_lr_t lrc;
	mfs_lr_conf_t lc;
	mfs_lr_conf_from(&conf, conf.lr_schedule, &lc);
	mfs_lr_init(&lrc, &lc);
	mfs_conf_free(&conf);
	float lam = (float)o.lambda;
	mfs_hparams_t hp = {(float)lrc.lr, lam, lam, lam_b, lam_b, 1.0f, 5.0f};
	mfs_engine_set_hparams(e, &hp);

	mfs_resident_t *set = NULL;
	double t_load = 0;
	int is_set = !strcmp(o.mode, "set");
	if (is_set) {
		t0 = mfs_now_s();
		if ((rc = mfs_engine_resident_load(e, &(mfs_batch_t){tr.u, tr.i, tr.r, tr.n}, &set))) {
			fprintf(stderr, "bench_cpu_sgd: resident_load: %s\n", mfs_strerror(rc));
			return 1;
		}
		t_load = mfs_now_s() - t0;
	}
	FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
	if (o.csv && !csv) {
		perror(o.csv);
		return 1;
	}
	if (csv)
		fprintf(csv, "epoch,sgd_s,updates_per_s,updates_per_cpu_s,train_rmse,test_rmse,lr,loss_s\n");
	printf("# %ld users x %ld items, %zu train + %zu test ratings, rank %ld, noise %.2f, zipf %.2f; "
	       "k=%ld threads=%ld %s mode=%s schedule=%s lr=%g lambda=%g\n",
	       o.users, o.items, tr.n, te.n, o.rank, o.noise, o.zipf, o.k, o.threads,
	       o.det ? "deterministic" : "hogwild", o.mode, o.schedule, o.lr, o.lambda);
	printf("# generate %.2f s, set load %.2f s\n", t_gen, t_load);
	printf("%5s %8s %12s %12s %10s %10s %10s %8s\n", "epoch", "sgd_s", "updates/s", "upd/cpu_s", "train_rmse",
	       "test_rmse", "lr", "loss_s");
	double *rates = malloc((size_t)o.epochs * sizeof *rates), sgd_total = 0, test_rmse = NAN;
	double *cpu_rates = malloc((size_t)o.epochs * sizeof *cpu_rates);
	mfs_rng_t g;
	mfs_rng_seed(&g, o.seed + 1);
	for (long ep = 0; ep < o.epochs; ep++) {
		uint64_t before = m->events_applied;
		if (!is_set)
			shuffle(&tr, &g); /* not timed: the order is the baseline's input, not its work */
		double ts = mfs_now_s(), tc = cpu_now_s();
		if (is_set) {
			rc = mfs_engine_sgd_epoch(e, set, (uint64_t)ep);
		} else {
			for (size_t off = 0; !rc && off < tr.n; off += (size_t)o.batch) {
				size_t len = tr.n - off < (size_t)o.batch ? tr.n - off : (size_t)o.batch;
				rc = mfs_engine_sgd(e, &(mfs_batch_t){tr.u + off, tr.i + off, tr.r + off, len});
			}
		}
		double sgd_s = mfs_now_s() - ts, cpu_s = cpu_now_s() - tc;
		if (rc) {
			fprintf(stderr, "bench_cpu_sgd: sgd: %s\n", mfs_strerror(rc));
			return 1;
		}
		double ups = (double)(m->events_applied - before) / sgd_s;
		double upc = (double)(m->events_applied - before) / cpu_s;
		rates[ep] = ups;
		cpu_rates[ep] = upc;
		sgd_total += sgd_s;
		ts = mfs_now_s();
		mfs_loss_t ltr = {.rmse = NAN}, lte = {.rmse = NAN};
		if (o.train_loss || ep == o.epochs - 1) {
			if (is_set)
				mfs_engine_loss_resident(e, set, &ltr);
			else
				mfs_engine_loss(e, &(mfs_batch_t){tr.u, tr.i, tr.r, tr.n}, &ltr);
		}
		if (te.n)
			mfs_engine_loss(e, &(mfs_batch_t){te.u, te.i, te.r, te.n}, &lte);
		double loss_s = mfs_now_s() - ts;
		test_rmse = lte.rmse;
		printf("%5ld %8.3f %12.0f %12.0f %10.5f %10.5f %10.6f %8.3f\n", ep + 1, sgd_s, ups, upc, ltr.rmse,
		       lte.rmse, (double)hp.lr, loss_s);
		fflush(stdout);
		if (csv)
			fprintf(csv, "%ld,%.6f,%.0f,%.0f,%.6f,%.6f,%.8f,%.6f\n", ep + 1, sgd_s, ups, upc, ltr.rmse,
			        lte.rmse, (double)hp.lr, loss_s);
		/* The controller sees the training loss (the test set is for reporting only). */
		hp.lr = (float)mfs_lr_update(&lrc, o.train_loss ? ltr.rmse : lte.rmse);
		mfs_engine_set_hparams(e, &hp);
	}
	qsort(rates, (size_t)o.epochs, sizeof *rates, cmp_double);
	qsort(cpu_rates, (size_t)o.epochs, sizeof *cpu_rates, cmp_double);
	double median = o.epochs % 2 ? rates[o.epochs / 2] : 0.5 * (rates[o.epochs / 2 - 1] + rates[o.epochs / 2]);
	double cmedian = o.epochs % 2 ? cpu_rates[o.epochs / 2]
	                              : 0.5 * (cpu_rates[o.epochs / 2 - 1] + cpu_rates[o.epochs / 2]);
	printf("summary: mode=%s threads=%ld %s k=%ld epochs=%ld ratings=%zu median_updates_per_s=%.0f "
	       "mean_updates_per_s=%.0f median_updates_per_cpu_s=%.0f sgd_s=%.2f final_test_rmse=%.5f "
	       "model_fnv=%016llx\n",
	       o.mode, o.det ? 1L : o.threads, o.det ? "deterministic" : "hogwild", o.k, o.epochs, tr.n, median,
	       (double)tr.n * (double)o.epochs / sgd_total, cmedian, sgd_total, test_rmse,
	       (unsigned long long)model_fnv(m));
	if (csv)
		fclose(csv);
	free(rates);
	free(cpu_rates);
	if (set)
		mfs_engine_resident_free(e, set);
	mfs_engine_close(e);
	mfs_model_free(m);
	free(tr.u), free(tr.i), free(tr.r), free(te.u), free(te.i), free(te.r);
	return 0;
}
