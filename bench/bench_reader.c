/* bench_reader.c - libmfsnap serving reads: lookups, predict, top-K (int8 fast path, exact,
 * no-cache), recall of the fast path, and the item-cache refresh.
 *
 *   bench_reader build --dir DIR --items N [--users U] [--k K] [--data planted|gauss] [--seed S]
 *                      [--seen N]
 *   bench_reader run   --dir DIR [--label NAME] [--queries Q] [--exact-queries QE] [--csv FILE]
 *
 * build writes one snapshot with the snapshot writer (snap_writer.h), every row in one txn.
 * Data: "planted" looks like trained factors - items in 50 topics, a log-normal popularity
 * scaling their norms (and biases), users mixing one or two topics; "gauss" is i.i.d. normal
 * factors and no item biases, the hard case for pruning (no structure; the ranking is the
 * dot product alone, whose int8 error is what the bound has to cover). --seen N gives every
 * user a user_rated list of N random items (snapshot.seen_items; default 0: none), which the
 * default top-K leaves out: the selection grows to K + N.
 *
 * run opens the snapshot with libmfsnap and measures, one call at a time (so pin it to one
 * core: bench/reader.sh runs it under taskset -c 0):
 *   lookup      mfs_snap_user of a random user (by external id)
 *   predict     mfs_snap_predict of a random (user, item)
 *   refresh     mfs_snap_cache_refresh after a new snapshot (a child process publishes 1000
 *               changed items, as the service's incremental snapshots do): the full rebuild
 *   top100      mfs_snap_topk_ex, K = 100, default path (int8 scan + exact rescoring), leaving
 *               out the user's rated items (--seen)
 *   top100inc   the same with MFS_SNAP_TOPK_INCLUDE_SEEN (the list not read)
 *   top100x     the default with 500 excluded items (an exclude list)
 *   top1000     K = 1000, default path
 *   exact100    MFS_SNAP_TOPK_EXACT (every item scored exactly from the cache)
 *   nocache100  MFS_SNAP_TOPK_NOCACHE (every row scored from LMDB: what the reader did before)
 * and compares the default path with the exact one on the same users: recall@100 (shared
 * items / 100) and whole answers identical (ids, order, float32 bits). Prints a table and,
 * with --csv, appends "label,n_items,k,metric,unit,p50,p99,mean,count" rows.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/timeutil.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_writer.h"

#define TOPICS 50

struct opts {
	const char *mode, *dir, *label, *csv, *data;
	uint64_t items, users, seed, seen;
	int k;
	int queries, exact_queries;
};

static void usage(void)
{
	fprintf(stderr, "usage: bench_reader build --dir DIR --items N [--users U] [--k K] [--data planted|gauss]"
	                " [--seed S] [--seen N]\n"
	                "       bench_reader run --dir DIR [--label NAME] [--queries Q] [--exact-queries QE]"
	                " [--csv FILE]\n");
	exit(2);
}

static void parse(int argc, char **argv, struct opts *o)
{
	memset(o, 0, sizeof *o);
	o->users = 100000;
	o->k = 128;
	o->seed = 42;
	o->data = "planted";
	o->label = "snapshot";
	o->queries = 400;
	o->exact_queries = 40;
	if (argc < 2)
		usage();
	o->mode = argv[1];
	for (int a = 2; a < argc; a++) {
		const char *f = argv[a];
		if (a + 1 >= argc)
			usage();
		const char *v = argv[++a];
		if (!strcmp(f, "--dir"))
			o->dir = v;
		else if (!strcmp(f, "--items"))
			o->items = strtoull(v, NULL, 10);
		else if (!strcmp(f, "--users"))
			o->users = strtoull(v, NULL, 10);
		else if (!strcmp(f, "--k"))
			o->k = atoi(v);
		else if (!strcmp(f, "--seen"))
			o->seen = strtoull(v, NULL, 10);
		else if (!strcmp(f, "--seed"))
			o->seed = strtoull(v, NULL, 10);
		else if (!strcmp(f, "--data"))
			o->data = v;
		else if (!strcmp(f, "--label"))
			o->label = v;
		else if (!strcmp(f, "--csv"))
			o->csv = v;
		else if (!strcmp(f, "--queries"))
			o->queries = atoi(v);
		else if (!strcmp(f, "--exact-queries"))
			o->exact_queries = atoi(v);
		else
			usage();
	}
	if (!o->dir || (strcmp(o->mode, "build") && strcmp(o->mode, "run")) || o->k < 1 || o->queries < 1 ||
	    o->exact_queries < 1 || (strcmp(o->data, "planted") && strcmp(o->data, "gauss")))
		usage();
}

/* ---- build ---------------------------------------------------------------------------------- */
static void die(const char *what, int rc, const char *err)
{
	fprintf(stderr, "bench_reader: %s: %s (%s)\n", what, mfs_strerror(rc), err ? err : "");
	exit(1);
}

/* Fill rows [0, n) of factors F / biases B: planted (topics x popularity) or i.i.d. normal. */
static void fill_rows(mfs_rng_t *g, const float *centers, int planted, int users, uint32_t n, int k, float *F, float *B)
{
	const double inv = 1.0 / sqrt((double)k);
	for (uint32_t r = 0; r < n; r++) {
		float *f = F + (size_t)r * k;
		if (!planted) {
			for (int j = 0; j < k; j++)
				f[j] = (float)(mfs_rng_normal(g) * inv);
			B[r] = users ? (float)(0.3 * mfs_rng_normal(g)) : 0.0f;
			continue;
		}
		const float *c1 = centers + mfs_rng_below(g, TOPICS) * (size_t)k;
		const float *c2 = centers + mfs_rng_below(g, TOPICS) * (size_t)k;
		double pop = users ? 1.0 : exp(0.5 * mfs_rng_normal(g)), mix = users ? 0.4 * mfs_rng_uniform(g) : 0.0;
		for (int j = 0; j < k; j++)
			f[j] = (float)(pop * (c1[j] + mix * c2[j] + 0.7 * mfs_rng_normal(g)) * inv);
		B[r] = (float)(0.3 * mfs_rng_normal(g) + (users ? 0.0 : 0.2 * log(pop)));
	}
}

static int cmd_build(const struct opts *o)
{
	mfs_model_conf_t mc = {o->k, 0.1, o->seed};
	mfs_model_t *m = NULL;
	char err[512] = "";
	int rc;
	double t0 = mfs_now_s();
	if ((rc = mfs_model_init(&mc, &m)) || (rc = mfs_model_reserve(m, (uint32_t)o->users, (uint32_t)o->items)))
		die("model", rc, NULL);
	uint32_t row;
	for (uint64_t u = 0; u < o->users; u++) {
		mfs_id_t id = mfs_id_u64(u);
		if ((rc = mfs_model_user_row(m, &id, &row)))
			die("user row", rc, NULL);
	}
	for (uint64_t i = 0; i < o->items; i++) {
		mfs_id_t id = mfs_id_u64(i);
		if ((rc = mfs_model_item_row(m, &id, &row)))
			die("item row", rc, NULL);
	}
	mfs_rng_t g;
	mfs_rng_seed(&g, o->seed);
	float *centers = malloc((size_t)TOPICS * o->k * sizeof *centers);
	if (!centers)
		die("centers", ENOMEM, NULL);
	for (size_t j = 0; j < (size_t)TOPICS * o->k; j++)
		centers[j] = (float)mfs_rng_normal(&g);
	int planted = strcmp(o->data, "planted") == 0;
	fill_rows(&g, centers, planted, 1, m->n_users, o->k, m->P, m->bu);
	fill_rows(&g, centers, planted, 0, m->n_items, o->k, m->Q, m->bi);
	free(centers);
	m->mu = 3.5;
	double t1 = mfs_now_s();
	mfs_snap_writer_t *w = NULL;
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.01;
	in.last_loss = NAN;
	in.rating_min = 1.0;
	in.rating_max = 5.0;
	mfs_snap_rated_t *rated = NULL;
	if (o->seen) { /* N random items per user: the lists the default top-K leaves out */
		if (o->seen > 65535 || (rc = mfs_snap_rated_init((uint32_t)o->seen, &rated)))
			die("seen", rc ? rc : MFS_EINVAL, "--seen 1..65535");
		for (uint32_t u = 0; u < m->n_users; u++)
			for (uint64_t j = 0; j < o->seen; j++)
				if ((rc = mfs_snap_rated_add(rated, m, u, (uint32_t)mfs_rng_below(&g, m->n_items))))
					die("seen", rc, NULL);
		in.rated = rated;
	}
	size_t map = ((size_t)(o->items + o->users) * (size_t)(4 * (o->k + 1) + 64)) * 2 + (64u << 20) +
	             (size_t)o->users * o->seen * 24;
	uint64_t seq = 0;
	if ((rc = mfs_snap_writer_open(o->dir, map, &w, err, sizeof err)))
		die("writer open", rc, err);
	if ((rc = mfs_snap_publish(w, m, &in, &seq, err, sizeof err)))
		die("publish", rc, err);
	mfs_snap_writer_close(w);
	mfs_snap_rated_free(rated);
	printf("built %s: %llu users, %llu items, k=%d, %s data, %llu rated items per user, seq %llu (generate %.1f s, "
	       "publish %.1f s)\n", o->dir, (unsigned long long)m->n_users, (unsigned long long)m->n_items, o->k, o->data,
	       (unsigned long long)o->seen, (unsigned long long)seq, t1 - t0, mfs_now_s() - t1);
	mfs_model_free(m);
	return 0;
}

/* ---- run -------------------------------------------------------------------------------------- */
static int dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct series {
	const char *metric, *unit;
	double *v;
	int n;
};

static FILE *csv;
static const struct opts *g_opts;
static uint64_t g_items;

/* Print p50 / p99 / mean of s (sorts it) and append a CSV row. */
static void report(struct series *s)
{
	qsort(s->v, (size_t)s->n, sizeof *s->v, dbl_cmp);
	double sum = 0.0;
	for (int i = 0; i < s->n; i++)
		sum += s->v[i];
	double p50 = s->v[s->n / 2], p99 = s->v[(int)((s->n - 1) * 0.99 + 0.5)], mean = sum / s->n;
	printf("  %-12s %10.3f %10.3f %10.3f  %-3s (%d)\n", s->metric, p50, p99, mean, s->unit, s->n);
	if (csv)
		fprintf(csv, "%s,%llu,%d,%s,%s,%.4f,%.4f,%.4f,%d\n", g_opts->label, (unsigned long long)g_items,
		        g_opts->k, s->metric, s->unit, p50, p99, mean, s->n);
}

static void report_value(const char *metric, const char *unit, double v, int n)
{
	printf("  %-12s %10.4f %10s %10s  %-3s (%d)\n", metric, v, "", "", unit, n);
	if (csv)
		fprintf(csv, "%s,%llu,%d,%s,%s,%.6f,,,%d\n", g_opts->label, (unsigned long long)g_items, g_opts->k,
		        metric, unit, v, n);
}

static struct series series_new(const char *metric, const char *unit, int n)
{
	struct series s = {metric, unit, calloc((size_t)n, sizeof(double)), 0};
	if (!s.v)
		die("series", ENOMEM, NULL);
	return s;
}

/* A child publishes 1000 changed items (an incremental snapshot). */
static void publish_incremental(const struct opts *o, uint64_t n_items, uint64_t round)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		mfs_model_conf_t mc = {o->k, 0.1, o->seed + round};
		mfs_model_t *m = NULL;
		char err[512] = "";
		uint32_t row;
		mfs_rng_t g;
		mfs_rng_seed(&g, o->seed * 7 + round);
		if (mfs_model_init(&mc, &m))
			_exit(1);
		for (int t = 0; t < 1000; t++) {
			mfs_id_t id = mfs_id_u64(mfs_rng_below(&g, n_items));
			if (mfs_model_item_row(m, &id, &row))
				_exit(1);
		}
		for (size_t j = 0; j < (size_t)m->n_items * o->k; j++)
			m->Q[j] = (float)(mfs_rng_normal(&g) / sqrt((double)o->k));
		m->mu = 3.5;
		mfs_snap_info_t in;
		memset(&in, 0, sizeof in);
		in.learning_rate = 0.01;
		in.last_loss = NAN;
		in.rating_min = 1.0;
		in.rating_max = 5.0;
		mfs_snap_writer_t *w = NULL;
		int rc = mfs_snap_writer_open(o->dir, 1 << 20, &w, err, sizeof err);
		if (!rc)
			rc = mfs_snap_publish(w, m, &in, NULL, err, sizeof err);
		if (rc)
			fprintf(stderr, "bench_reader: child publish: %s\n", err);
		mfs_snap_writer_close(w);
		_exit(rc ? 1 : 0);
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		die("incremental publish", MFS_ELMDB, "child failed");
}

static int cmd_run(const struct opts *o)
{
	char err[512] = "";
	mfs_snap_t *s = NULL;
	int rc = mfs_snap_open(o->dir, &s, err, sizeof err);
	if (rc)
		die("open", rc, err);
	mfs_snap_meta_t meta;
	if ((rc = mfs_snap_get_meta(s, &meta)))
		die("meta", rc, NULL);
	g_opts = o;
	g_items = meta.n_items;
	if (o->csv && !(csv = fopen(o->csv, "a")))
		die(o->csv, errno, NULL);
	uint64_t seq = 0;
	int64_t age = 0;
	mfs_snap_staleness(s, &seq, &age);
	printf("%s: %llu users, %llu items, k=%u, seq %llu, age %lld ms\n", o->label, (unsigned long long)meta.n_users,
	       (unsigned long long)meta.n_items, meta.k, (unsigned long long)seq, (long long)age);
	printf("  %-12s %10s %10s %10s\n", "metric", "p50", "p99", "mean");
	mfs_rng_t g;
	mfs_rng_seed(&g, o->seed + 1000);
	float *vec = malloc(meta.k * sizeof *vec), bias, r;

	/* lookups */
	const int NL = 200000;
	struct series sl = series_new("lookup", "us", NL), sp = series_new("predict", "us", NL),
	              st1 = series_new("staleness", "us", NL);
	for (int i = 0; i < NL; i++) {
		mfs_snap_id_t u = {MFS_SNAP_ID_U64, mfs_rng_below(&g, meta.n_users), NULL, 0};
		mfs_snap_id_t it = {MFS_SNAP_ID_U64, mfs_rng_below(&g, meta.n_items), NULL, 0};
		double t0 = mfs_now_s();
		rc = mfs_snap_user(s, &u, &bias, vec);
		double t1 = mfs_now_s();
		rc |= mfs_snap_predict(s, &u, &it, &r, NULL);
		double t2 = mfs_now_s();
		rc |= mfs_snap_staleness(s, &seq, &age);
		double t3 = mfs_now_s();
		if (rc)
			die("lookup", rc, NULL);
		sl.v[sl.n++] = (t1 - t0) * 1e6;
		sp.v[sp.n++] = (t2 - t1) * 1e6;
		st1.v[st1.n++] = (t3 - t2) * 1e6;
	}
	report(&sl);
	report(&sp);
	report(&st1);

	/* the cache: built at the first refresh, then rebuilt after each incremental snapshot */
	int refreshed = 0;
	double t0 = mfs_now_s();
	if ((rc = mfs_snap_cache_refresh(s, &seq, &refreshed)))
		die("refresh", rc, NULL);
	report_value("first_build", "ms", (mfs_now_s() - t0) * 1e3, 1);
	const int NR = 3;
	struct series sr = series_new("refresh", "ms", NR);
	for (int i = 0; i < NR; i++) {
		publish_incremental(o, meta.n_items, (uint64_t)i + 1);
		t0 = mfs_now_s();
		if ((rc = mfs_snap_cache_refresh(s, &seq, &refreshed)) || !refreshed)
			die("refresh", rc ? rc : MFS_EINVAL, "no rebuild after a publish");
		sr.v[sr.n++] = (mfs_now_s() - t0) * 1e3;
	}
	report(&sr);

	/* top-K */
	const int NQ = o->queries, NE = o->exact_queries < NQ ? o->exact_queries : NQ;
	uint64_t *users = malloc((size_t)NQ * sizeof *users);
	for (int q = 0; q < NQ; q++)
		users[q] = mfs_rng_below(&g, meta.n_users);
	mfs_snap_hit_t *fast = calloc((size_t)NE * 100, sizeof *fast), *hits = calloc(1000, sizeof *hits);
	mfs_snap_id_t *ex = calloc(500, sizeof *ex);
	for (int x = 0; x < 500; x++)
		ex[x] = (mfs_snap_id_t){MFS_SNAP_ID_U64, mfs_rng_below(&g, meta.n_items), NULL, 0};
	struct {
		const char *name;
		size_t K;
		unsigned flags;
		size_t nx;
		int n;
	} runs[] = {
		{"top100", 100, 0, 0, NQ},
		{"top100inc", 100, MFS_SNAP_TOPK_INCLUDE_SEEN, 0, NQ},
		{"top100x", 100, 0, 500, NQ},
		{"top1000", 1000, 0, 0, NQ / 4 > 10 ? NQ / 4 : 10},
		{"exact100", 100, MFS_SNAP_TOPK_EXACT, 0, NE},
		{"nocache100", 100, MFS_SNAP_TOPK_NOCACHE, 0, NE / 4 > 3 ? NE / 4 : 3},
	};
	int mismatched = 0;
	double recall_sum = 0.0;
	for (size_t rn = 0; rn < sizeof runs / sizeof runs[0]; rn++) {
		struct series sq = series_new(runs[rn].name, "ms", runs[rn].n);
		struct series sc = series_new("candidates", "n", runs[rn].n);
		for (int q = 0; q < runs[rn].n; q++) {
			mfs_snap_id_t u = {MFS_SNAP_ID_U64, users[q % NQ], NULL, 0};
			mfs_snap_topk_opts_t op = {ex, runs[rn].nx, runs[rn].flags};
			mfs_snap_topk_stats_t st;
			size_t n = 0;
			t0 = mfs_now_s();
			rc = mfs_snap_topk_ex(s, &u, runs[rn].K, &op, hits, &n, &st);
			double dt = (mfs_now_s() - t0) * 1e3;
			if (rc || st.refreshed)
				die("topk", rc ? rc : MFS_EINVAL, "unexpected rebuild");
			sq.v[sq.n++] = dt;
			sc.v[sc.n++] = (double)st.n_scored;
			if (rn == 0 && q < NE)
				memcpy(fast + (size_t)q * 100, hits, n * sizeof *hits);
			if (runs[rn].flags == MFS_SNAP_TOPK_EXACT) {
				/* recall@100 and identity of the default path against the exact one */
				const mfs_snap_hit_t *f = fast + (size_t)q * 100;
				int shared = 0, same = n == 100;
				for (size_t a = 0; a < n; a++) {
					same &= f[a].num == hits[a].num && memcmp(&f[a].score, &hits[a].score, 4) == 0;
					for (size_t b = 0; b < n; b++)
						shared += f[a].num == hits[b].num;
				}
				recall_sum += shared / 100.0;
				mismatched += !same;
			}
		}
		report(&sq);
		if (runs[rn].flags == 0)
			report(&sc);
		free(sq.v);
		free(sc.v);
	}
	report_value("recall@100", "", recall_sum / NE, NE);
	report_value("mismatches", "n", mismatched, NE);
	free(sl.v);
	free(sp.v);
	free(st1.v);
	free(sr.v);
	free(users);
	free(fast);
	free(hits);
	free(ex);
	free(vec);
	mfs_snap_close(s);
	if (csv)
		fclose(csv);
	return mismatched ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	mfs_log_set_level(MFS_LOG_WARN);
	parse(argc, argv, &o);
	return strcmp(o.mode, "build") == 0 ? cmd_build(&o) : cmd_run(&o);
}
