/* test_movielens_read.c - the readers on real MovieLens files (../shared/data/movielens,
 * zstd-compressed): rating, user and item counts must match the published numbers. Skips
 * (exit 77) when the data directory is absent. */
#include <sys/stat.h>

#include "common/err.h"
#include "common/log.h"
#include "ingest/dataset.h"
#include "ingest/ratings_file.h"
#include "model_store/store.h"
#include "testhelp.h"

#define ML_DIR "../shared/data/movielens"

typedef struct counts {
	mfs_idmap_t *users, *items;
	double sum, rmin, rmax;
	int64_t ts_min;
} counts_t;

static int count_cb(void *ctx, const mfs_id_t *u, const mfs_id_t *i, float r, int64_t ts, uint64_t line)
{
	counts_t *c = ctx;
	uint32_t row;
	(void)line;
	if (mfs_idmap_get_or_add(c->users, u, &row, NULL) || mfs_idmap_get_or_add(c->items, i, &row, NULL))
		return ENOMEM;
	c->sum += r;
	c->rmin = r < c->rmin ? r : c->rmin;
	c->rmax = r > c->rmax ? r : c->rmax;
	c->ts_min = ts < c->ts_min ? ts : c->ts_min;
	return 0;
}

static void check_file(const char *name, int fmt, uint64_t ratings, uint64_t lines, uint32_t users,
                       uint32_t items, double rmin, double rmax)
{
	char path[512], err[512];
	snprintf(path, sizeof path, "%s/%s", ML_DIR, name);
	counts_t c = {NULL, NULL, 0, 1e9, -1e9, INT64_MAX};
	if (mfs_idmap_init(&c.users) || mfs_idmap_init(&c.items))
		exit(2);
	mfs_rfile_opts_t o = {MFS_RFMT_AUTO, 1, 0.5, 5, 10};
	mfs_rfile_stats_t st;
	int rc = mfs_rfile_read(path, &o, count_cb, &c, &st, err, sizeof err);
	TEST_ASSERT_MSG(rc == 0, "%s: %s", name, err);
	TEST_EQ_INT(st.format, fmt);
	TEST_EQ_INT(st.accepted, ratings);
	TEST_EQ_INT(st.lines, lines);
	TEST_EQ_INT(st.rejected, 0);
	TEST_EQ_INT(mfs_idmap_size(c.users), users);
	TEST_EQ_INT(mfs_idmap_size(c.items), items);
	TEST_NEAR(c.rmin, rmin, 0);
	TEST_NEAR(c.rmax, rmax, 0);
	TEST_ASSERT(c.ts_min > 800000000); /* seconds since 1970, all after 1995 */
	fprintf(stderr, "  %s: %llu ratings, %u users, %u items, mean %.4f\n", name,
	        (unsigned long long)st.accepted, mfs_idmap_size(c.users), mfs_idmap_size(c.items),
	        c.sum / (double)st.accepted);
	mfs_idmap_free(c.users);
	mfs_idmap_free(c.items);
}

static void test_ml100k(void)
{
	check_file("ml-100k_u.data.zst", MFS_RFMT_TSV, 100000, 100000, 943, 1682, 1, 5);
}

static void test_ml_latest_small(void)
{
	check_file("ml-latest-small_ratings.csv.zst", MFS_RFMT_CSV, 100836, 100837, 610, 9724, 0.5, 5);
}

/* Through the dataset loader: a 10% split of ml-100k. */
static void test_ml100k_dataset(void)
{
	mfs_model_conf_t mc = {8, 0.1, 1};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&mc, &m));
	mfs_load_opts_t o;
	memset(&o, 0, sizeof o);
	o.file.rating_min = 0.5;
	o.file.rating_max = 5;
	o.test_fraction = 0.1;
	o.split_seed = 1;
	mfs_ratings_t tr, te;
	char err[512];
	TEST_OK(mfs_dataset_load(m, ML_DIR "/ml-100k_u.data.zst", NULL, &o, &tr, &te, NULL, NULL, NULL, err, sizeof err));
	TEST_EQ_INT(tr.n + te.n, 100000);
	TEST_ASSERT_MSG(te.n > 9500 && te.n < 10500, "test %zu", te.n);
	TEST_ASSERT(m->n_users <= 943 && m->n_users > 900);
	TEST_NEAR(m->mu, 3.53, 0.02); /* ml-100k's mean rating is 3.5299 */
	size_t unseen = 0;
	for (size_t k = 0; k < te.n; k++)
		unseen += te.u[k] == MFS_ROW_NONE || te.i[k] == MFS_ROW_NONE;
	TEST_ASSERT_MSG(unseen < 100, "unseen %zu", unseen);
	mfs_ratings_free(&tr);
	mfs_ratings_free(&te);
	mfs_model_free(m);
}

int main(void)
{
	struct stat sb;
	if (stat(ML_DIR, &sb) != 0)
		TEST_SKIP("%s not found (run from the repository root)", ML_DIR);
	mfs_log_set_level(MFS_LOG_WARN);
	TEST_RUN(test_ml100k);
	TEST_RUN(test_ml_latest_small);
	TEST_RUN(test_ml100k_dataset);
	return TEST_REPORT();
}
