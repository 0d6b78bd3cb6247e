/* catalog.c - register mfstream's metrics (catalog.def) and the scrape hook for the values
 * computed on demand. */
#include "ops/catalog.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/timeutil.h"
#include "mfs_version.h"


/* Snapshots take milliseconds (small deltas) to tens of seconds (a full model on a slow disk). */
static const double snapshot_duration_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                   0.25,  0.5,    1,     2.5,  5,     10,   30};
/* Event -> visible: about serve.snapshot_ms (1 s) when healthy; minutes when lagging. */
static const double event_to_snapshot_buckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5,
                                                   2,    3,     5,    10,  30,   60,  120, 300};
/* Event -> applied: milliseconds when the learner keeps up; 0.15 and 0.2 tell a p99 within 2x of
 * a 0.1 s steady state from one past it (bench/growth.sh). */
static const double event_to_applied_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15,
                                                  0.2,   0.25,   0.5,   1,    2.5,   5,    10,  30};

#define MFS_CAT_TYPE_counter MFS_METRIC_COUNTER
#define MFS_CAT_TYPE_gauge MFS_METRIC_GAUGE

const mfs_catalog_entry_t mfs_catalog_entries[] = {
#define MFS_CAT_COUNTER(f, name, help) {name, MFS_METRIC_COUNTER, "", ""},
#define MFS_CAT_GAUGE(f, name, help) {name, MFS_METRIC_GAUGE, "", ""},
#define MFS_CAT_HISTOGRAM(f, name, help, buckets) {name, MFS_METRIC_HISTOGRAM, "", ""},
#define MFS_CAT_FAMILY(f, type, name, help, labels, fixed) {name, MFS_CAT_TYPE_##type, labels, fixed},
#include "ops/catalog.def"
#undef MFS_CAT_COUNTER
#undef MFS_CAT_GAUGE
#undef MFS_CAT_HISTOGRAM
#undef MFS_CAT_FAMILY
};
const size_t mfs_catalog_n_entries = sizeof mfs_catalog_entries / sizeof mfs_catalog_entries[0];

/* Item i of a separated list ("a,b" or "x|y") into buf; 0 if it exists. */
static int list_at(const char *list, char sep, size_t i, char *buf, size_t size)
{
	if (!*list)
		return -1;
	for (size_t n = 0;; n++) {
		const char *e = strchr(list, sep);
		size_t len = e ? (size_t)(e - list) : strlen(list);
		if (n == i) {
			if (len >= size)
				return -1;
			memcpy(buf, list, len);
			buf[len] = '\0';
			return 0;
		}
		if (!e)
			return -1;
		list = e + 1;
	}
}

static int cat_family(mfs_metrics_t *r, int type, const char *name, const char *help, const char *labels,
                      mfs_family_t **out)
{
	char names[MFS_METRICS_MAX_LABELS][64];
	const char *lv[MFS_METRICS_MAX_LABELS];
	size_t n = 0;
	while (n < MFS_METRICS_MAX_LABELS && list_at(labels, ',', n, names[n], sizeof names[n]) == 0) {
		lv[n] = names[n];
		n++;
	}
	return mfs_metrics_family(r, type, name, help, lv, n, NULL, 0, out);
}

static double wall_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Runs under the registry lock before each render: only atomics are read. */
static void catalog_hook(mfs_metrics_t *r, void *ctx)
{
	(void)r;
	mfs_catalog_t *cat = ctx;
	double ts = mfs_gauge_get(cat->snapshot_timestamp);
	mfs_gauge_set(cat->snapshot_age, ts > 0 ? fmax(0.0, wall_s() - ts) : NAN);
	double now = mfs_now_s();
	uint64_t u = mfs_counter_get(cat->updates);
	if (cat->cat_rate_prev_s == 0) {
		cat->cat_rate_prev = u;
		cat->cat_rate_prev_s = now;
	} else if (now - cat->cat_rate_prev_s >= 1.0) {
		mfs_gauge_set(cat->updates_per_second, (double)(u - cat->cat_rate_prev) / (now - cat->cat_rate_prev_s));
		cat->cat_rate_prev = u;
		cat->cat_rate_prev_s = now;
	}
}

int mfs_catalog_register(mfs_metrics_t *r, mfs_catalog_t *cat, char *errstr, size_t es)
{
	int rc;
	char v[64];
	memset(cat, 0, sizeof *cat);
#define FAIL(name) return mfs_errf(errstr, es, rc, "metric %s: %s", name, mfs_strerror(rc))
#define MFS_CAT_COUNTER(f, name, help)                                                        \
	if ((rc = mfs_metrics_counter(r, name, help, &cat->f)))                               \
		FAIL(name);
#define MFS_CAT_GAUGE(f, name, help)                                                          \
	if ((rc = mfs_metrics_gauge(r, name, help, &cat->f)))                                 \
		FAIL(name);
#define MFS_CAT_HISTOGRAM(f, name, help, buckets)                                             \
	if ((rc = mfs_metrics_histogram(r, name, help, buckets, sizeof buckets / sizeof buckets[0], &cat->f))) \
		FAIL(name);
#define MFS_CAT_FAMILY(f, type, name, help, labels, fixed)                                    \
	if ((rc = cat_family(r, MFS_CAT_TYPE_##type, name, help, labels, &cat->f)))           \
		FAIL(name);                                                                   \
	for (size_t i_ = 0; i_ < MFS_CAT_FIXED_MAX && list_at(fixed, '|', i_, v, sizeof v) == 0; i_++) \
		if ((rc = mfs_family_##type(cat->f, (const char *const[]){v}, &cat->f##_at[i_]))) \
			FAIL(name);
#include "ops/catalog.def"
#undef MFS_CAT_COUNTER
#undef MFS_CAT_GAUGE
#undef MFS_CAT_HISTOGRAM
#undef MFS_CAT_FAMILY
#undef FAIL
	mfs_gauge_set(cat->window_rmse, NAN);
	mfs_gauge_set(cat->holdout_rmse, NAN);
	mfs_gauge_set(cat->prequential_rmse, NAN);
	mfs_gauge_set(cat->snapshot_age, NAN);
	if ((rc = mfs_metrics_add_hook(r, catalog_hook, cat)))
		return mfs_errf(errstr, es, rc, "metrics hook: %s", mfs_strerror(rc));
	return 0;
}

int mfs_catalog_set_build_info(mfs_catalog_t *cat, const char *version, const char *engine)
{
	mfs_gauge_t *g;
	if (!cat || !cat->build_info)
		return MFS_EINVAL;
	int rc = mfs_family_gauge(cat->build_info, (const char *const[]){version ? version : MFS_VERSION,
	                                                                  engine ? engine : "unknown"}, &g);
	if (rc)
		return rc;
	mfs_gauge_set(g, 1);
	mfs_gauge_set(cat->start_time, floor(wall_s()));
	return 0;
}
