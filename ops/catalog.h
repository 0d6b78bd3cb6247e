/* catalog.h - mfstream's metrics (ops/catalog.def, docs/METRICS.md) as one struct of handles.
 *
 *   mfs_metrics_t *reg;  mfs_metrics_init(&reg);
 *   mfs_catalog_t cat;   mfs_catalog_register(reg, &cat, errstr, sizeof errstr);
 *   mfs_catalog_set_build_info(&cat, NULL, mfs_engine_name(e));
 *   ...
 *   mfs_counter_add(cat.events_applied, n);
 *   mfs_counter_inc(cat.messages_rejected_at[reason]);          // enum mfs_reject order
 *   mfs_gauge_set(cat.model_rows_at[MFS_CAT_USERS], m->n_users);
 *   mfs_histogram_observe(cat.snapshot_duration, seconds);
 *
 * Every handle is NULL-safe in the update functions, so a zeroed mfs_catalog_t (metrics off)
 * works too. Two values are computed by a scrape hook that registration installs:
 * mfstream_snapshot_age_seconds (from mfstream_snapshot_last_timestamp_seconds) and
 * mfstream_updates_per_second (from mfstream_updates_total between scrapes at least 1 s apart).
 * That hook keeps a pointer to cat: cat must stay where it is while reg is rendered.
 */
#ifndef MFS_CATALOG_H
#define MFS_CATALOG_H

#include <stddef.h>

#include "ops/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Fixed label values per family at most (field_at[] size). */
#define MFS_CAT_FIXED_MAX 16
/** Index into the table="users|items" families (model_rows_at, snapshot_rows_at, ...). */
enum { MFS_CAT_USERS = 0, MFS_CAT_ITEMS = 1 };

typedef struct mfs_catalog {
#define MFS_CAT_COUNTER(f, name, help) mfs_counter_t *f;
#define MFS_CAT_GAUGE(f, name, help) mfs_gauge_t *f;
#define MFS_CAT_HISTOGRAM(f, name, help, buckets) mfs_histogram_t *f;
#define MFS_CAT_FAMILY(f, type, name, help, labels, fixed)                                   \
	mfs_family_t *f;                                                                     \
	mfs_##type##_t *f##_at[MFS_CAT_FIXED_MAX];
#include "ops/catalog.def"
#undef MFS_CAT_COUNTER
#undef MFS_CAT_GAUGE
#undef MFS_CAT_HISTOGRAM
#undef MFS_CAT_FAMILY
	/* the scrape hook's memory (mfstream_updates_per_second) */
	uint64_t cat_rate_prev;
	double cat_rate_prev_s;
} mfs_catalog_t;

/** Register every metric of the catalog in r and fill cat with the handles (fixed series
 *  created). The RMSE gauges and the snapshot age start at NaN ("not known yet").
 *  @return 0, or the first registration error (MFS_EINVAL: a name already taken; ENOMEM);
 *  errstr names the metric. */
int mfs_catalog_register(mfs_metrics_t *r, mfs_catalog_t *cat, char *errstr, size_t errstr_size);

/** mfstream_build_info{version,engine} = 1 and mfstream_start_time_seconds = now.
 *  @param[in] version NULL: this build's version @return 0, MFS_EINVAL, ENOMEM. */
int mfs_catalog_set_build_info(mfs_catalog_t *cat, const char *version, const char *engine);

/** One row per catalog entry (tests and docs). */
typedef struct mfs_catalog_entry {
	const char *name;
	int type;           /* enum mfs_metric_type */
	const char *labels; /* "a,b" or "" */
	const char *fixed;  /* "x|y" or "" */
} mfs_catalog_entry_t;
extern const mfs_catalog_entry_t mfs_catalog_entries[];
extern const size_t mfs_catalog_n_entries;

#ifdef __cplusplus
}
#endif
#endif
