/* dataset.c - load rating files into dense-row arrays through the model, split train/test.
 *
 * DESIGN
 * Training ratings get rows from the model as they stream in (mfs_model_user_row/item_row),
 * so the arrays hold 12 bytes per rating (u32 user row, u32 item row, f32 rating) and no
 * external id is kept. Test ratings split off the training file cannot be resolved when
 * they are read: their user or item may first appear in training further down the file.
 * They are parked in two temporary idmaps (distinct test ids only, not one id per rating)
 * with their rows in those maps, and remapped to model rows - or MFS_ROW_NONE - once the
 * whole training file is in. A separate test file is read after training and only looks
 * rows up. The split rule is stateless: rating number n (0-based over accepted ratings) is
 * test when mix64(seed, n) / 2^64 < test_fraction, so it does not depend on buffering,
 * threads or how the file was compressed.
 */
#include "ingest/dataset.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"

#define DS_MIN_CAP (1u << 16)

void mfs_ratings_free(mfs_ratings_t *rs)
{
	if (!rs)
		return;
	free(rs->u);
	free(rs->i);
	free(rs->r);
	free(rs->ts);
	memset(rs, 0, sizeof *rs);
}

static int ratings_resize(mfs_ratings_t *rs, size_t cap)
{
	/* each array is resized on its own; cap only moves once all three have the room */
	uint32_t *u = realloc(rs->u, cap * sizeof *u);
	if (!u)
		return ENOMEM;
	rs->u = u;
	uint32_t *i = realloc(rs->i, cap * sizeof *i);
	if (!i)
		return ENOMEM;
	rs->i = i;
	float *r = realloc(rs->r, cap * sizeof *r);
	if (!r)
		return ENOMEM;
	rs->r = r;
	if (rs->keep_ts) {
		int64_t *ts = realloc(rs->ts, cap * sizeof *ts);
		if (!ts)
			return ENOMEM;
		rs->ts = ts;
	}
	rs->cap = cap;
	return 0;
}

int mfs_ratings_push(mfs_ratings_t *rs, uint32_t u, uint32_t i, float r)
{
	if (rs->n == rs->cap) {
		int rc = ratings_resize(rs, rs->cap ? rs->cap * 2 : DS_MIN_CAP);
		if (rc)
			return rc;
	}
	rs->u[rs->n] = u;
	rs->i[rs->n] = i;
	rs->r[rs->n] = r;
	rs->n++;
	rs->sum += r;
	return 0;
}

int mfs_ratings_push_ts(mfs_ratings_t *rs, uint32_t u, uint32_t i, float r, int64_t ts)
{
	int rc = mfs_ratings_push(rs, u, i, r);
	if (!rc && rs->keep_ts)
		rs->ts[rs->n - 1] = ts;
	return rc;
}

void mfs_ratings_shuffle(mfs_ratings_t *rs, uint64_t seed)
{
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	for (size_t k = rs->n; k > 1; k--) {
		size_t j = (size_t)mfs_rng_below(&g, k), a = k - 1;
		uint32_t tu = rs->u[a], ti = rs->i[a];
		float tr = rs->r[a];
		rs->u[a] = rs->u[j];
		rs->i[a] = rs->i[j];
		rs->r[a] = rs->r[j];
		rs->u[j] = tu;
		rs->i[j] = ti;
		rs->r[j] = tr;
		if (rs->ts) {
			int64_t tt = rs->ts[a];
			rs->ts[a] = rs->ts[j];
			rs->ts[j] = tt;
		}
	}
}

void mfs_ratings_remap(mfs_ratings_t *rs, int ent, const uint32_t *perm)
{
	uint32_t *rows = ent ? rs->i : rs->u;
	for (size_t j = 0; j < rs->n; j++)
		if (rows[j] != MFS_ROW_NONE)
			rows[j] = perm[rows[j]];
}

/* Give back the growth slack (at most half the arrays) once loading is done. */
static void ratings_trim(mfs_ratings_t *rs)
{
	if (rs->n && rs->n < rs->cap)
		(void)ratings_resize(rs, rs->n); /* shrinking cannot lose data; failure keeps the old arrays */
}

typedef struct load_ctx {
	mfs_model_t *m;
	mfs_ratings_t *train, *test, *valid;
	int split;              /* holding out a fraction of the training file for testing */
	double frac, vfrac;     /* test and validation fractions */
	uint64_t seed;
	uint64_t n;             /* accepted ratings so far: the split's rating number */
	mfs_idmap_t *pend_u;    /* ids of held-out ratings (test and validation), resolved after the file */
	mfs_idmap_t *pend_i;
	const char *path;
	char *errstr;
	size_t errstr_size;
} load_ctx_t;

static int cb_fail(load_ctx_t *c, int rc, uint64_t line, const char *what)
{
	return mfs_errf(c->errstr, c->errstr_size, rc, "%s: line %llu: %s: %s", c->path,
	                (unsigned long long)line, what, mfs_strerror(rc));
}

static int cb_train(void *ctx, const mfs_id_t *user, const mfs_id_t *item, float rating, int64_t ts,
                    uint64_t line)
{
	load_ctx_t *c = ctx;
	uint64_t n = c->n++;
	uint32_t u, i;
	int rc;
	mfs_ratings_t *held = NULL;
	if (c->split && (double)mfs_mix64(c->seed, n) * 0x1p-64 < c->frac)
		held = c->test;
	else if (c->vfrac > 0 && (double)mfs_mix64(c->seed + 1, n) * 0x1p-64 < c->vfrac)
		held = c->valid;
	if (held) { /* rows resolved after the file: ids training never sees get MFS_ROW_NONE */
		int added;
		if ((rc = mfs_idmap_get_or_add(c->pend_u, user, &u, &added)) ||
		    (rc = mfs_idmap_get_or_add(c->pend_i, item, &i, &added)))
			return cb_fail(c, rc, line, "held-out id");
		if ((rc = mfs_ratings_push(held, u, i, rating)))
			return cb_fail(c, rc, line, held == c->test ? "test set" : "validation set");
		return 0;
	}
	if ((rc = mfs_model_user_row(c->m, user, &u)))
		return cb_fail(c, rc, line, "user row");
	if ((rc = mfs_model_item_row(c->m, item, &i)))
		return cb_fail(c, rc, line, "item row");
	if ((rc = mfs_ratings_push_ts(c->train, u, i, rating, ts)))
		return cb_fail(c, rc, line, "training set");
	return 0;
}

static int cb_test(void *ctx, const mfs_id_t *user, const mfs_id_t *item, float rating, int64_t ts,
                   uint64_t line)
{
	load_ctx_t *c = ctx;
	(void)ts;
	int rc = mfs_ratings_push(c->test, mfs_idmap_find(c->m->users, user), mfs_idmap_find(c->m->items, item),
	                          rating);
	return rc ? cb_fail(c, rc, line, "test set") : 0;
}

/* Rows of a temporary map -> model rows (MFS_ROW_NONE for ids training never saw). */
static int remap_pending(const mfs_idmap_t *pend, const mfs_idmap_t *model, uint32_t *rows, size_t n)
{
	uint32_t np = mfs_idmap_size(pend);
	uint32_t *map = malloc(((size_t)np + 1) * sizeof *map);
	if (!map)
		return ENOMEM;
	for (uint32_t k = 0; k < np; k++) {
		mfs_id_t id = mfs_idmap_key(pend, k);
		map[k] = mfs_idmap_find(model, &id);
	}
	for (size_t j = 0; j < n; j++)
		rows[j] = map[rows[j]];
	free(map);
	return 0;
}

int mfs_dataset_load(mfs_model_t *m, const char *train_path, const char *test_path,
                     const mfs_load_opts_t *opts, mfs_ratings_t *train, mfs_ratings_t *test, mfs_ratings_t *valid,
                     mfs_rfile_stats_t *train_stats, mfs_rfile_stats_t *test_stats, char *errstr,
                     size_t errstr_size)
{
	mfs_rfile_stats_t tr_local, te_local;
	if (!train_stats)
		train_stats = &tr_local;
	if (!test_stats)
		test_stats = &te_local;
	memset(train, 0, sizeof *train);
	memset(test, 0, sizeof *test);
	if (valid)
		memset(valid, 0, sizeof *valid);
	memset(test_stats, 0, sizeof *test_stats);
	if (!m || !train_path || !opts || (opts->valid_fraction > 0 && !valid))
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "dataset load: missing model, path, options or validation set");

	load_ctx_t c;
	memset(&c, 0, sizeof c);
	c.m = m;
	c.train = train;
	c.test = test;
	c.valid = valid;
	c.split = !test_path && opts->test_fraction > 0;
	c.frac = opts->test_fraction;
	c.vfrac = opts->valid_fraction;
	c.seed = opts->split_seed;
	c.path = train_path;
	c.errstr = errstr;
	c.errstr_size = errstr_size;
	train->keep_ts = opts->keep_ts;
	int rc = 0;
	if ((c.split || c.vfrac > 0) && ((rc = mfs_idmap_init(&c.pend_u)) || (rc = mfs_idmap_init(&c.pend_i)))) {
		mfs_errf(errstr, errstr_size, rc, "dataset load: %s", mfs_strerror(rc));
		goto fail;
	}
	rc = mfs_rfile_read(train_path, &opts->file, cb_train, &c, train_stats, errstr, errstr_size);
	if (rc)
		goto fail;
	if (train->n == 0) {
		rc = mfs_errf(errstr, errstr_size, MFS_EEMPTY, "%s: no training ratings (%llu lines, %llu rejected)",
		              train_path, (unsigned long long)train_stats->lines,
		              (unsigned long long)train_stats->rejected);
		goto fail;
	}
	if (c.pend_u) {
		if ((rc = remap_pending(c.pend_u, m->users, test->u, test->n)) ||
		    (rc = remap_pending(c.pend_i, m->items, test->i, test->n)) ||
		    (valid && (rc = remap_pending(c.pend_u, m->users, valid->u, valid->n))) ||
		    (valid && (rc = remap_pending(c.pend_i, m->items, valid->i, valid->n)))) {
			mfs_errf(errstr, errstr_size, rc, "dataset load: %s", mfs_strerror(rc));
			goto fail;
		}
	}
	if (test_path) {
		c.path = test_path;
		rc = mfs_rfile_read(test_path, &opts->file, cb_test, &c, test_stats, errstr, errstr_size);
		if (rc)
			goto fail;
	}
	mfs_model_observe(m, train->sum, train->n);
	ratings_trim(train);
	ratings_trim(test);
	if (valid)
		ratings_trim(valid);
	mfs_idmap_free(c.pend_u);
	mfs_idmap_free(c.pend_i);
	mfs_info("ingest", "msg=\"dataset loaded\" train=%zu validation=%zu test=%zu users=%u items=%u mu=%.6f rejected=%llu",
	         train->n, valid ? valid->n : 0, test->n, m->n_users, m->n_items, m->mu,
	         (unsigned long long)(train_stats->rejected + test_stats->rejected));
	return 0;
fail:
	mfs_idmap_free(c.pend_u);
	mfs_idmap_free(c.pend_i);
	mfs_ratings_free(train);
	mfs_ratings_free(test);
	if (valid)
		mfs_ratings_free(valid);
	return rc;
}

int mfs_dataset_load_test(const mfs_model_t *m, const char *path, const mfs_load_opts_t *opts, mfs_ratings_t *out,
                          mfs_rfile_stats_t *stats, char *errstr, size_t errstr_size)
{
	mfs_rfile_stats_t local;
	if (!stats)
		stats = &local;
	memset(out, 0, sizeof *out);
	if (!m || !path || !opts)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "test load: missing model, path or options");
	load_ctx_t c;
	memset(&c, 0, sizeof c);
	c.m = (mfs_model_t *)(uintptr_t)m; /* cb_test only looks rows up */
	c.test = out;
	c.path = path;
	c.errstr = errstr;
	c.errstr_size = errstr_size;
	int rc = mfs_rfile_read(path, &opts->file, cb_test, &c, stats, errstr, errstr_size);
	if (rc) {
		mfs_ratings_free(out);
		return rc;
	}
	ratings_trim(out);
	mfs_info("ingest", "msg=\"test file read\" file=%s test=%zu rejected=%llu", path, out->n,
	         (unsigned long long)stats->rejected);
	return 0;
}
