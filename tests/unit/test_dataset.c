/* test_dataset.c - loading ratings through the model: the deterministic split, late-resolved
 * test ids, a separate test file with unseen ids, mu, shuffle, empty input. */
#include <stdint.h>

#include "common/check.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "ingest/dataset.h"
#include "model_store/store.h"
#include "testhelp.h"

static const char *tmp;

static const char *path_of(const char *name)
{
	static char buf[4][512];
	static int k;
	char *p = buf[k++ % 4];
	snprintf(p, 512, "%s/%s", tmp, name);
	return p;
}

static mfs_model_t *new_model(void)
{
	mfs_model_conf_t mc = {4, 0.1, 1};
	mfs_model_t *m = NULL;
	if (mfs_model_init(&mc, &m))
		exit(2);
	return m;
}

static mfs_load_opts_t load_opts(double frac, uint64_t seed)
{
	mfs_load_opts_t o;
	memset(&o, 0, sizeof o);
	o.file.format = MFS_RFMT_AUTO;
	o.file.rating_min = 0.5;
	o.file.rating_max = 5;
	o.file.max_reported = 3;
	o.test_fraction = frac;
	o.split_seed = seed;
	return o;
}

/* Rating k of the synthetic file: user "u<k%250>" (string ids) or k%250 (numbers), item k%97,
 * rating 1 + k%9 / 2. Users 200..249 appear for the first time late in the file. */
#define N_RATINGS 20000
static void rating_k(uint64_t k, mfs_id_t *u, mfs_id_t *i, float *r, char *sbuf)
{
	uint64_t user = k < N_RATINGS / 2 ? k % 200 : k % 250;
	if (user % 3 == 0) {
		int len = snprintf(sbuf, 32, "u%llu", (unsigned long long)user);
		mfs_id_t s = {MFS_ID_STR, (uint16_t)len, 0, sbuf};
		*u = s;
	} else {
		*u = mfs_id_u64(user);
	}
	*i = mfs_id_u64(k % 97);
	*r = 1.0f + (float)(k % 9) / 2.0f;
}

static void write_file(const char *p, uint64_t n)
{
	mfs_rfile_writer_t *w;
	char err[256];
	if (mfs_rfile_writer_open(p, MFS_RFMT_AUTO, &w, err, sizeof err))
		exit(2);
	for (uint64_t k = 0; k < n; k++) {
		mfs_id_t u, i;
		float r;
		char sbuf[32];
		rating_k(k, &u, &i, &r, sbuf);
		if (mfs_rfile_write(w, &u, &i, r, (int64_t)k))
			exit(2);
	}
	if (mfs_rfile_writer_close(w))
		exit(2);
}

static int is_test(uint64_t seed, uint64_t n, double frac) { return (double)mfs_mix64(seed, n) * 0x1p-64 < frac; }

static void test_split(void)
{
	const char *p = path_of("split.tsv.zst");
	write_file(p, N_RATINGS);
	const double frac = 0.2;
	mfs_load_opts_t o = load_opts(frac, 5);
	mfs_model_t *m = new_model();
	mfs_ratings_t tr, te;
	mfs_rfile_stats_t ts, es;
	char err[256];
	TEST_OK(mfs_dataset_load(m, p, NULL, &o, &tr, &te, NULL, &ts, &es, err, sizeof err));
	TEST_EQ_INT(tr.n + te.n, N_RATINGS);
	TEST_EQ_INT(ts.accepted, N_RATINGS);
	/* exactly the documented rule, and near the fraction (4 sigma) */
	uint64_t want_test = 0;
	double train_sum = 0;
	for (uint64_t k = 0; k < N_RATINGS; k++) {
		mfs_id_t u, i;
		float r;
		char sbuf[32];
		rating_k(k, &u, &i, &r, sbuf);
		if (is_test(5, k, frac))
			want_test++;
		else
			train_sum += r;
	}
	TEST_EQ_INT(te.n, want_test);
	TEST_ASSERT_MSG(fabs((double)te.n - frac * N_RATINGS) < 4 * sqrt(N_RATINGS * frac * (1 - frac)),
	                "test share %zu of %d", te.n, N_RATINGS);
	/* mu is the training mean */
	TEST_NEAR(m->mu, train_sum / (double)tr.n, 1e-9);
	TEST_NEAR(tr.sum, train_sum, 1e-6);
	/* every rating, in file order, has the rows of its ids (test ids of users 200..249 can
	 * come before the user's first training rating and must resolve all the same) */
	size_t jt = 0, je = 0;
	int bad = 0;
	for (uint64_t k = 0; k < N_RATINGS; k++) {
		mfs_id_t u, i;
		float r;
		char sbuf[32];
		rating_k(k, &u, &i, &r, sbuf);
		uint32_t ru = mfs_idmap_find(m->users, &u), ri = mfs_idmap_find(m->items, &i);
		if (!is_test(5, k, frac)) {
			bad += tr.u[jt] != ru || tr.i[jt] != ri || tr.r[jt] != r || ru == MFS_ROW_NONE;
			jt++;
		} else {
			bad += te.u[je] != ru || te.i[je] != ri || te.r[je] != r;
			je++;
		}
	}
	TEST_EQ_INT(bad, 0);
	TEST_EQ_INT(m->n_users, 250);
	TEST_EQ_INT(m->n_items, 97);
	/* same seed, same split; another seed, another split */
	mfs_model_t *m2 = new_model();
	mfs_ratings_t tr2, te2;
	TEST_OK(mfs_dataset_load(m2, p, NULL, &o, &tr2, &te2, NULL, NULL, NULL, err, sizeof err));
	TEST_EQ_INT(te2.n, te.n);
	TEST_ASSERT(te2.n == te.n && !memcmp(te2.u, te.u, te.n * 4) && !memcmp(te2.r, te.r, te.n * 4));
	TEST_ASSERT(tr2.n == tr.n && !memcmp(tr2.i, tr.i, tr.n * 4));
	mfs_ratings_free(&tr2);
	mfs_ratings_free(&te2);
	mfs_model_free(m2);
	m2 = new_model();
	o.split_seed = 6;
	TEST_OK(mfs_dataset_load(m2, p, NULL, &o, &tr2, &te2, NULL, NULL, NULL, err, sizeof err));
	TEST_ASSERT(te2.n != te.n || memcmp(te2.r, te.r, te.n * 4) != 0);
	mfs_ratings_free(&tr2);
	mfs_ratings_free(&te2);
	mfs_model_free(m2);
	/* fraction 0: everything trains */
	m2 = new_model();
	o.test_fraction = 0;
	TEST_OK(mfs_dataset_load(m2, p, NULL, &o, &tr2, &te2, NULL, NULL, NULL, err, sizeof err));
	TEST_EQ_INT(tr2.n, N_RATINGS);
	TEST_EQ_INT(te2.n, 0);
	mfs_ratings_free(&tr2);
	mfs_ratings_free(&te2);
	mfs_model_free(m2);

	mfs_ratings_free(&tr);
	mfs_ratings_free(&te);
	mfs_model_free(m);
}

/* A test id that appears in training only after its test rating must resolve. */
static void test_split_late_ids(void)
{
	/* find a seed whose split puts rating 0 in the test set and rating 1 in training */
	uint64_t seed = 0;
	while (!(is_test(seed, 0, 0.5) && !is_test(seed, 1, 0.5) && is_test(seed, 2, 0.5)))
		seed++;
	const char *p = path_of("late.csv");
	const char *text = "userId,movieId,rating,timestamp\n"
	                   "alice,film,4,1\n"  /* test: alice and film unseen so far */
	                   "alice,film,3,2\n"  /* train: now both exist */
	                   "bob,7,2,3\n";      /* test: bob and item 7 never train */
	TEST_OK(test_write_file(p, text, strlen(text)));
	mfs_load_opts_t o = load_opts(0.5, seed);
	mfs_model_t *m = new_model();
	mfs_ratings_t tr, te;
	char err[256];
	TEST_OK(mfs_dataset_load(m, p, NULL, &o, &tr, &te, NULL, NULL, NULL, err, sizeof err));
	TEST_EQ_INT(tr.n, 1);
	TEST_EQ_INT(te.n, 2);
	TEST_EQ_INT(m->n_users, 1);
	TEST_EQ_INT(te.u[0], tr.u[0]);
	TEST_EQ_INT(te.i[0], tr.i[0]);
	TEST_NEAR(te.r[0], 4, 0);
	TEST_EQ_INT(te.u[1], MFS_ROW_NONE);
	TEST_EQ_INT(te.i[1], MFS_ROW_NONE);
	TEST_NEAR(m->mu, 3, 1e-12);
	mfs_ratings_free(&tr);
	mfs_ratings_free(&te);
	mfs_model_free(m);
}

static void test_separate_test_file(void)
{
	const char *ptr = path_of("train.dat");
	const char *pte = path_of("test.tsv");
	const char *train = "1::10::4::1\n2::20::2::2\n3::10::3::3\nzoe::30::5::4\n";
	const char *test = "1\t20\t3\t5\n9\t10\t4\t6\n2\t99\t1\t7\nzoe\t30\t5\t8\n1\t10\t9\t9\n";
	TEST_OK(test_write_file(ptr, train, strlen(train)));
	TEST_OK(test_write_file(pte, test, strlen(test)));
	mfs_load_opts_t o = load_opts(0.3, 1); /* ignored: a test file is given */
	mfs_model_t *m = new_model();
	mfs_ratings_t tr, te;
	mfs_rfile_stats_t ts, es;
	char err[256];
	TEST_OK(mfs_dataset_load(m, ptr, pte, &o, &tr, &te, NULL, &ts, &es, err, sizeof err));
	TEST_EQ_INT(tr.n, 4);
	TEST_EQ_INT(te.n, 4);
	TEST_EQ_INT(es.rejected, 1); /* rating 9 out of range */
	TEST_EQ_INT(es.first_bad_line, 5);
	TEST_EQ_INT(m->n_users, 4);
	TEST_EQ_INT(m->n_items, 3);
	TEST_NEAR(m->mu, 3.5, 1e-12);
	mfs_id_t u1 = mfs_id_u64(1), i20 = mfs_id_u64(20), i10 = mfs_id_u64(10);
	TEST_EQ_INT(te.u[0], mfs_idmap_find(m->users, &u1));
	TEST_EQ_INT(te.i[0], mfs_idmap_find(m->items, &i20));
	TEST_EQ_INT(te.u[1], MFS_ROW_NONE); /* user 9 unseen */
	TEST_EQ_INT(te.i[1], mfs_idmap_find(m->items, &i10));
	TEST_EQ_INT(te.i[2], MFS_ROW_NONE); /* item 99 unseen */
	TEST_EQ_INT(te.u[3], tr.u[3]);      /* string id zoe */
	TEST_ASSERT(te.u[3] != MFS_ROW_NONE);
	/* test ids are not added to the model */
	TEST_EQ_INT(mfs_idmap_size(m->users), 4);
	mfs_ratings_free(&tr);
	mfs_ratings_free(&te);
	mfs_model_free(m);
}

static void test_empty_and_errors(void)
{
	const char *p = path_of("empty.tsv");
	TEST_OK(test_write_file(p, "", 0));
	mfs_load_opts_t o = load_opts(0.1, 1);
	mfs_model_t *m = new_model();
	mfs_ratings_t tr, te;
	char err[256];
	TEST_EQ_INT(mfs_dataset_load(m, p, NULL, &o, &tr, &te, NULL, NULL, NULL, err, sizeof err), MFS_EEMPTY);
	TEST_ASSERT(strstr(err, "empty.tsv") != NULL);
	TEST_EQ_INT(tr.n, 0);
	TEST_ASSERT(tr.u == NULL && te.u == NULL);
	/* all lines bad: also empty */
	p = path_of("allbad.tsv");
	TEST_OK(test_write_file(p, "1\t2\t99\n", 7));
	TEST_EQ_INT(mfs_dataset_load(m, p, NULL, &o, &tr, &te, NULL, NULL, NULL, err, sizeof err), MFS_EEMPTY);
	/* fail mode stops with MFS_EPARSE and frees what was loaded */
	o.file.fail_on_error = 1;
	p = path_of("failing.tsv");
	TEST_OK(test_write_file(p, "1\t2\t3\n1\t2\t99\n", 13));
	TEST_EQ_INT(mfs_dataset_load(m, p, NULL, &o, &tr, &te, NULL, NULL, NULL, err, sizeof err), MFS_EPARSE);
	TEST_ASSERT_MSG(strstr(err, "line 2") != NULL, "%s", err);
	TEST_ASSERT(tr.u == NULL && tr.n == 0);
	mfs_model_free(m);
}

static void test_shuffle(void)
{
	mfs_ratings_t a, b, c;
	memset(&a, 0, sizeof a);
	memset(&b, 0, sizeof b);
	memset(&c, 0, sizeof c);
	const uint32_t n = 100000;
	for (uint32_t k = 0; k < n; k++) {
		TEST_OK(mfs_ratings_push(&a, k, k * 7, (float)k));
		TEST_OK(mfs_ratings_push(&b, k, k * 7, (float)k));
		TEST_OK(mfs_ratings_push(&c, k, k * 7, (float)k));
	}
	TEST_NEAR(a.sum, (double)n * (n - 1) / 2, 1e-3 * n);
	mfs_ratings_shuffle(&a, 42);
	mfs_ratings_shuffle(&b, 42);
	mfs_ratings_shuffle(&c, 43);
	TEST_ASSERT(!memcmp(a.u, b.u, n * 4) && !memcmp(a.i, b.i, n * 4) && !memcmp(a.r, b.r, n * 4));
	TEST_ASSERT(memcmp(a.u, c.u, n * 4) != 0);
	/* a permutation that keeps each (u, i, r) triple together */
	uint8_t *seen = calloc(n, 1);
	int bad = 0, moved = 0;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t u = a.u[k];
		bad += u >= n || seen[u] || a.i[k] != u * 7 || a.r[k] != (float)u;
		if (u < n)
			seen[u] = 1;
		moved += u != k;
	}
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT(moved > (int)n / 2);
	free(seen);
	/* tiny sets */
	mfs_ratings_t one;
	memset(&one, 0, sizeof one);
	mfs_ratings_shuffle(&one, 1);
	TEST_OK(mfs_ratings_push(&one, 3, 4, 5));
	mfs_ratings_shuffle(&one, 1);
	TEST_EQ_INT(one.u[0], 3);
	mfs_batch_t bt = mfs_ratings_batch(&one);
	TEST_EQ_INT(bt.n, 1);
	mfs_ratings_free(&one);
	mfs_ratings_free(&a);
	mfs_ratings_free(&b);
	mfs_ratings_free(&c);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_ERROR);
	tmp = test_tmpdir();
	TEST_RUN(test_split);
	TEST_RUN(test_split_late_ids);
	TEST_RUN(test_separate_test_file);
	TEST_RUN(test_empty_and_errors);
	TEST_RUN(test_shuffle);
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", tmp);
	return TEST_REPORT();
}
