/* bench_shard.c - the two item-exchange schemes of a sharded model (issue 21), measured with the
 * CPU reference (gpu/cpu/shard_ref.h): test RMSE per epoch for S = 1, 2, 4 shards, the bytes
 * that would cross NVLink/NCCL per epoch, and how even the shards' work is.
 *
 *   bench_shard [--users 100000] [--items 100000] [--ratings 10000000] [--test 500000]
 *               [--rank 8] [--noise 0.5] [--k 32] [--zipf 0,0.8,1.2] [--shards 1,2,4]
 *               [--every 1,10] [--combine sum,mean,blend] [--lag LIST] [--hot LIST] [--batch 100000] [--epochs 10]
 *               [--threads 2]
 *               [--init 0.1] [--lr 0.1] [--lambda 0.05] [--beta 0.05] [--seed 7] [--csv FILE]
 *
 * Hyperparameters: decay schedule; lr 0.1 and lambda 0.05 rather than the shipped 0.03 and
 * 0.04, because on this sparse shape (100 ratings a row) the shipped values leave the model on
 * its starting plateau (factors near 0, test RMSE 0.693 -> 0.690 in 10 epochs): the schemes
 * would then be compared on biases alone. With these, S = 1 goes 0.72 -> 0.59 in 10 epochs.
 *
 * The data: a rank-`rank` planted model like bench_cpu_sgd's (mean 3.5, bias sd 0.3, p.q sd
 * 0.5, Gaussian noise, clipped to [1, 5]); users uniform, items uniform or Zipf(s) with item 0
 * the most popular; a separate test set from the same model. Every run of one data set sees
 * the same ratings in the same order and starts from the same model (seeded).
 *
 * Runs per data set: S = 1 (the serial engine's result: test_shard_ref), then for every other
 * S: allreduce with each exchange period of --every (in batches of --batch ratings) and each
 * way of combining the replicas of --combine (ar-sum: q0 + the sum of the deltas; ar-mean:
 * the mean of the changed replicas; ar-blend: from the one to the other as the shards' moves
 * grow; gpu/shard.h), and rotation; with --lag, also the hosts' scheme (MFS_SHARD_HOSTS: no
 * barrier; every --every batches each shard publishes its cumulative item contributions, the
 * others merge them --lag batches later, by SUM (h-sum) or BLEND (h-blend); docs/SCALE_OUT.md).
 * --schemes leaves out all-reduce or rotation (both by default; the hosts' runs follow --lag).
 * --hot runs the all-reduce once per value T (default 0, off): after every batch the rows one
 * shard has given T ratings or more since their last merge are merged too (hot rows more often;
 * the multi-GPU engine's engine.merge_hot).
 * Columns:
 *   test_rmse      after the epoch (each shard scores its users; the sums are added)
 *   vs_S1          the relative difference to S = 1 after the same epoch, percent
 *   dense_MB       allreduce: a ring all-reduce of the whole item table per exchange (fp32
 *                  bias + k factors), all shards together, this epoch
 *   sparse_MB      allreduce: an all-gather of the touched rows (row number + values);
 *                  rotation: the item blocks handed on
 *   rows_x         allreduce: item rows changed between exchanges, summed (thousands)
 *   imbalance      per round (batch or sub-epoch) the busiest shard's ratings x S / all
 *                  ratings: the slowdown a barrier per round costs (1 = even)
 *   sgd_s          wall seconds of the epoch (a CPU stand-in: not a GPU prediction)
 * A summary table (last epoch) follows; --csv writes every row.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "bench/bench_planted.h"
#include "common/timeutil.h"
#include "config/config.h"
#include "gpu/cpu/shard_ref.h"
#include "gpu/engine.h"
#include "gpu/lr.h"
#include "serve/stage_conf.h"

#define MAX_LIST 8

struct opts {
	long users, items, ratings, test, rank, k, epochs, batch, threads;
	double noise, lr, lambda, beta, init;
	double zipf[MAX_LIST];
	long shards[MAX_LIST], every[MAX_LIST], lag[MAX_LIST], hot[MAX_LIST];
	int combine[4];
	int n_zipf, n_shards, n_every, n_combine, n_lag, n_hot;
	int do_allreduce, do_rotate; /* --schemes */
	const char *csv;
	uint64_t seed;
};

static void usage(void)
{
	fprintf(stderr, "usage: bench_shard [--users N] [--items N] [--ratings N] [--test N] [--rank R]\n"
	                "  [--noise S] [--k K] [--zipf LIST] [--shards LIST] [--every LIST] [--combine sum,mean,blend]\n"
	                "  [--lag LIST] [--schemes allreduce,rotate]\n"
	                "  [--batch N] [--epochs E] [--threads T] [--init S] [--lr X] [--lambda L] [--beta B] [--seed N]\n"
	                "  [--csv FILE]\n"
	                "  (LIST: comma-separated, at most %d values)\n",
	        MAX_LIST);
	exit(2);
}

static int parse_list(const char *v, double *d, long *l)
{
	int n = 0;
	for (const char *p = v; *p && n < MAX_LIST; n++) {
		char *end;
		double x = strtod(p, &end);
		if (end == p)
			usage();
		if (d)
			d[n] = x;
		if (l)
			l[n] = (long)x;
		p = *end == ',' ? end + 1 : end;
	}
	return n;
}

static void parse(int argc, char **argv, struct opts *o)
{
	for (int a = 1; a < argc; a++) {
		const char *f = argv[a];
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
		L("--rank", rank) L("--k", k) L("--epochs", epochs) L("--batch", batch) L("--threads", threads)
		D("--noise", noise) D("--init", init) D("--lr", lr) D("--lambda", lambda) D("--beta", beta)
#undef L
#undef D
		if (!strcmp(f, "--zipf")) {
			o->n_zipf = parse_list(v, o->zipf, NULL);
			continue;
		}
		if (!strcmp(f, "--shards")) {
			o->n_shards = parse_list(v, NULL, o->shards);
			continue;
		}
		if (!strcmp(f, "--every")) {
			o->n_every = parse_list(v, NULL, o->every);
			continue;
		}
		if (!strcmp(f, "--schemes")) {
			o->do_allreduce = strstr(v, "allreduce") != NULL;
			o->do_rotate = strstr(v, "rotate") != NULL;
			continue;
		}
		if (!strcmp(f, "--hot")) {
			o->n_hot = parse_list(v, NULL, o->hot);
			continue;
		}
		if (!strcmp(f, "--lag")) {
			o->n_lag = parse_list(v, NULL, o->lag);
			continue;
		}
		if (!strcmp(f, "--combine")) {
			o->n_combine = 0;
			if (strstr(v, "sum"))
				o->combine[o->n_combine++] = MFS_SHARD_SUM;
			if (strstr(v, "mean"))
				o->combine[o->n_combine++] = MFS_SHARD_MEAN;
			if (strstr(v, "blend"))
				o->combine[o->n_combine++] = MFS_SHARD_BLEND;
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
		usage();
	}
	if (o->users < 1 || o->items < 1 || o->ratings < 1 || o->test < 1 || o->rank < 1 || o->k < 1 ||
	    o->epochs < 1 || o->batch < 1 || !o->n_zipf || !o->n_shards || !o->n_every ||
	    !o->n_combine)
		usage();
	for (int x = 0; x < o->n_shards; x++)
		if (o->shards[x] < 1 || o->shards[x] > MFS_SHARD_MAX)
			usage();
	for (int x = 0; x < o->n_every; x++)
		if (o->every[x] < 1)
			usage();
	for (int x = 0; x < o->n_lag; x++)
		if (o->lag[x] < 0)
			usage();
	for (int x = 0; x < o->n_hot; x++)
		if (o->hot[x] < 0 || o->hot[x] > UINT32_MAX)
			usage();
}

/* The planted model and the two rating sets drawn from it (bench_planted.h). */
static int generate(const struct opts *o, double zipf, struct data *tr, struct data *te, double *mean)
{
	return planted_sets((size_t)o->users, (size_t)o->items, (size_t)o->rank, (size_t)o->ratings, (size_t)o->test,
	                    zipf, o->noise, o->seed, tr, te, mean);
}

static mfs_model_t *make_model(const struct opts *o, double mean)
{
	mfs_model_conf_t mc = {(int)o->k, o->init, o->seed};
	mfs_model_t *m = NULL;
	int rc = mfs_model_init(&mc, &m);
	if (!rc)
		rc = mfs_model_reserve(m, (uint32_t)o->users, (uint32_t)o->items);
	for (long x = 0; !rc && x < o->users; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x);
		uint32_t row;
		rc = mfs_model_user_row(m, &id, &row);
	}
	for (long x = 0; !rc && x < o->items; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x);
		uint32_t row;
		rc = mfs_model_item_row(m, &id, &row);
	}
	if (rc) {
		fprintf(stderr, "bench_shard: model: %s\n", mfs_strerror(rc));
		mfs_model_free(m);
		return NULL;
	}
	mfs_model_observe(m, mean, 1);
	return m;
}

/* One run's last epoch, for the summary. */
struct result {
	double zipf;
	const char *scheme;
	long S, every, lag, hot;
	double rmse, vs1, dense_mb, sparse_mb, imbalance, sgd_s;
};

/* Train one configuration; rmse1 holds S = 1's test RMSE per epoch (filled when S == 1). */
static int run(const struct opts *o, double zipf, const struct data *tr, const struct data *te, double mean,
               long S, int scheme, long every, long lag, long hot, int combine, double *rmse1, FILE *csv,
               struct result *res)
{
	mfs_conf_t conf;
	char err[256], num[64];
	int rc = mfs_conf_init(&conf);
	snprintf(num, sizeof num, "%.17g", o->lr);
	rc = rc ? rc : mfs_conf_set(&conf, "sgd.lr", num, err, sizeof err);
	snprintf(num, sizeof num, "%.17g", o->beta);
	rc = rc ? rc : mfs_conf_set(&conf, "lr.beta", num, err, sizeof err);
	rc = rc ? rc : mfs_conf_set(&conf, "lr.schedule", "decay", err, sizeof err);
	if (rc) {
		fprintf(stderr, "bench_shard: %s\n", err);
		return 1;
	}
	mfs_lr_conf_t lc;
	mfs_lr_t lrc;
	mfs_lr_conf_from(&conf, conf.lr_schedule, &lc);
	mfs_lr_init(&lrc, &lc);
	const float lam_b = (float)conf.sgd_lambda_bu;
	mfs_conf_free(&conf);

	mfs_model_t *m = make_model(o, mean);
	if (!m)
		return 1;
	mfs_shard_conf_t sc = {.shards = (uint32_t)S, .scheme = scheme, .batch = (size_t)o->batch,
	                       .exchange_every = (uint32_t)every, .lag = (uint32_t)lag, .combine = combine,
	                       .threads = (int)o->threads,
	                       .hot_ratings = scheme == MFS_SHARD_ALLREDUCE ? (uint32_t)hot : 0};
	mfs_shard_ref_t *r = NULL;
	if ((rc = mfs_shard_ref_init(&sc, m, &r, err, sizeof err))) {
		fprintf(stderr, "bench_shard: %s\n", err);
		mfs_model_free(m);
		return 1;
	}
	const char *name = scheme == MFS_SHARD_ROTATE  ? "rotate"
	                   : S == 1                    ? "serial"
	                   : scheme == MFS_SHARD_HOSTS ? (combine == MFS_SHARD_BLEND ? "h-blend" : "h-sum")
	                   : combine == MFS_SHARD_MEAN ? "ar-mean"
	                   : combine == MFS_SHARD_BLEND ? "ar-blend"
	                                                : "ar-sum";
	if (scheme != MFS_SHARD_HOSTS)
		lag = 0;
	if (scheme != MFS_SHARD_ALLREDUCE)
		hot = 0;
	mfs_hparams_t hp = {(float)lrc.lr, (float)o->lambda, (float)o->lambda, lam_b, lam_b, 1.0f, 5.0f};
	rc = mfs_shard_ref_set_hparams(r, &hp);
	rc = rc ? rc : mfs_shard_ref_load(r, &(mfs_batch_t){tr->u, tr->i, tr->r, tr->n});
	mfs_shard_stats_t prev = {0}, st;
	for (long ep = 0; !rc && ep < o->epochs; ep++) {
		double t0 = mfs_now_s();
		if ((rc = mfs_shard_ref_epoch(r)))
			break;
		double sgd_s = mfs_now_s() - t0;
		mfs_loss_t l;
		if ((rc = mfs_shard_ref_loss(r, &(mfs_batch_t){te->u, te->i, te->r, te->n}, &l)))
			break;
		mfs_shard_ref_stats(r, &st);
		if (S == 1)
			rmse1[ep] = l.rmse;
		const double vs1 = 100.0 * (l.rmse - rmse1[ep]) / rmse1[ep];
		const double dense = (double)(st.bytes_dense - prev.bytes_dense) / 1e6;
		const double sparse = (double)(st.bytes_sparse - prev.bytes_sparse) / 1e6;
		const double rows_k = (double)(st.rows_exchanged - prev.rows_exchanged) / 1e3;
		const uint64_t dr = st.ratings - prev.ratings, dm = st.ratings_max_sum - prev.ratings_max_sum;
		const double imb = dr ? (double)dm * (double)S / (double)dr : 1.0;
		printf("%5.2f %-9s %2ld %5ld %4ld %4ld %5ld %10.5f %+7.2f %11.1f %10.1f %8.1f %9.3f %7.2f\n", zipf, name, S,
		       scheme == MFS_SHARD_ROTATE ? 0L : every, lag, hot, ep + 1, l.rmse, vs1, dense, sparse, rows_k, imb, sgd_s);
		fflush(stdout);
		if (csv)
			fprintf(csv, "%.2f,%s,%ld,%ld,%ld,%ld,%.6f,%.4f,%.0f,%.0f,%llu,%.4f,%.3f,%.8f,%ld\n", zipf, name, S,
			        scheme == MFS_SHARD_ROTATE ? 0L : every, lag, ep + 1, l.rmse, vs1, dense * 1e6, sparse * 1e6,
			        (unsigned long long)(st.rows_exchanged - prev.rows_exchanged), imb, sgd_s, (double)hp.lr, hot);
		*res = (struct result){zipf, name, S, scheme == MFS_SHARD_ROTATE ? 0L : every, lag, hot, l.rmse, vs1, dense, sparse,
		                       imb, sgd_s};
		prev = st;
		hp.lr = (float)mfs_lr_update(&lrc, l.rmse); /* decay: the loss does not matter */
		rc = mfs_shard_ref_set_hparams(r, &hp);
	}
	if (rc)
		fprintf(stderr, "bench_shard: %s\n", mfs_strerror(rc));
	mfs_shard_ref_free(r);
	mfs_model_free(m);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct opts o = {.users = 100000, .items = 100000, .ratings = 10000000, .test = 500000, .rank = 8, .k = 32,
	                 .epochs = 10, .lr = 0.1, .lambda = 0.05, .batch = 100000, .threads = 2, .noise = 0.5, .init = 0.1, .zipf = {0, 0.8, 1.2},
	                 .shards = {1, 2, 4}, .every = {1, 10}, .combine = {MFS_SHARD_SUM, MFS_SHARD_MEAN, MFS_SHARD_BLEND},
	                 .hot = {0}, .n_hot = 1,
	                 .n_zipf = 3, .n_shards = 3, .n_every = 2, .n_combine = 3, .seed = 7, .do_allreduce = 1,
	                 .do_rotate = 1};
	mfs_conf_t defaults; /* the shipped decay rate */
	if (mfs_conf_init(&defaults))
		return 1;
	o.beta = defaults.lr_beta;
	mfs_conf_free(&defaults);
	parse(argc, argv, &o);
	mfs_log_set_level(MFS_LOG_WARN);
	FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
	if (o.csv && !csv) {
		perror(o.csv);
		return 1;
	}
	if (csv)
		fprintf(csv, "zipf,scheme,shards,every,lag,epoch,test_rmse,vs_s1_pct,dense_bytes,sparse_bytes,rows_exchanged,"
		             "imbalance,sgd_s,lr,hot\n");
	printf("# %ld users x %ld items, %ld train + %ld test ratings, rank %ld, noise %.2f; k=%ld batch=%ld "
	       "epochs=%ld threads=%ld lr=%g (decay, beta %g) lambda=%g\n",
	       o.users, o.items, o.ratings, o.test, o.rank, o.noise, o.k, o.batch, o.epochs, o.threads, o.lr, o.beta,
	       o.lambda);
	printf("%5s %-9s %2s %5s %4s %4s %5s %10s %7s %11s %10s %8s %9s %7s\n", "zipf", "scheme", "S", "every", "lag", "hot", "epoch",
	       "test_rmse", "vs_S1%", "dense_MB", "sparse_MB", "rows_xK", "imbalance", "sgd_s");
	struct result res[MAX_LIST * (1 + MAX_LIST * (1 + 3 * MAX_LIST * MAX_LIST + 2 * MAX_LIST * MAX_LIST))];
	int nres = 0, rc = 0;
	double *rmse1 = calloc((size_t)o.epochs, sizeof *rmse1);
	for (int z = 0; z < o.n_zipf && !rc; z++) {
		struct data tr, te;
		double mean;
		if (generate(&o, o.zipf[z], &tr, &te, &mean)) {
			fprintf(stderr, "bench_shard: out of memory\n");
			return 1;
		}
		/* S = 1 first: the baseline of vs_S1 */
		rc = run(&o, o.zipf[z], &tr, &te, mean, 1, MFS_SHARD_ALLREDUCE, 1, 0, 0, MFS_SHARD_SUM, rmse1, csv, &res[nres++]);
		for (int s = 0; s < o.n_shards && !rc; s++) {
			if (o.shards[s] == 1)
				continue;
			for (int c = 0; c < o.n_combine && !rc && o.do_allreduce; c++)
				for (int x = 0; x < o.n_every && !rc; x++)
					for (int h = 0; h < o.n_hot && !rc; h++)
						rc = run(&o, o.zipf[z], &tr, &te, mean, o.shards[s], MFS_SHARD_ALLREDUCE, o.every[x], 0,
						         o.hot[h], o.combine[c], rmse1, csv, &res[nres++]);
			for (int c = 0; c < o.n_combine && !rc; c++)
				for (int x = 0; x < o.n_every && !rc; x++)
					for (int y = 0; y < o.n_lag && !rc && o.combine[c] != MFS_SHARD_MEAN; y++)
						rc = run(&o, o.zipf[z], &tr, &te, mean, o.shards[s], MFS_SHARD_HOSTS, o.every[x], o.lag[y], 0,
						         o.combine[c], rmse1, csv, &res[nres++]);
			if (!rc && o.do_rotate)
				rc = run(&o, o.zipf[z], &tr, &te, mean, o.shards[s], MFS_SHARD_ROTATE, 0, 0, 0, MFS_SHARD_SUM, rmse1,
				         csv, &res[nres++]);
		}
		data_free(&tr);
		data_free(&te);
	}
	printf("\nsummary (epoch %ld): zipf scheme S every lag hot test_rmse vs_S1%% dense_MB/epoch sparse_MB/epoch "
	       "imbalance\n",
	       o.epochs);
	for (int x = 0; x < nres; x++)
		printf("summary: %5.2f %-9s %2ld %5ld %4ld %4ld %9.5f %+7.2f %12.1f %12.1f %7.3f\n", res[x].zipf, res[x].scheme,
		       res[x].S, res[x].every, res[x].lag, res[x].hot, res[x].rmse, res[x].vs1, res[x].dense_mb, res[x].sparse_mb, res[x].imbalance);
	if (csv)
		fclose(csv);
	free(rmse1);
	return rc;
}
