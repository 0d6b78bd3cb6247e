/* test_catalog.c - mfstream's metric catalogue: it registers and renders, docs/METRICS.md names
 * exactly its metrics, the reject reasons follow enum mfs_reject, and the scrape hook computes
 * snapshot age and update rate. */
#include <math.h>
#include <stddef.h>
#include <time.h>

#include "common/err.h"
#include "ingest/event.h"
#include "serve/learner.h"
#include "ops/catalog.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"

static char errstr[512];

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	static char buf[1 << 18];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strdup(buf);
}

static const mfs_catalog_entry_t *entry_named(const char *name, size_t len)
{
	for (size_t i = 0; i < mfs_catalog_n_entries; i++)
		if (strlen(mfs_catalog_entries[i].name) == len && strncmp(mfs_catalog_entries[i].name, name, len) == 0)
			return &mfs_catalog_entries[i];
	return NULL;
}

static double sample(const char *text, const char *series)
{
	char key[256];
	snprintf(key, sizeof key, "\n%s ", series);
	const char *p = strstr(text, key);
	if (!p)
		return -12345;
	p += strlen(key);
	if (strncmp(p, "NaN", 3) == 0)
		return NAN;
	return strtod(p, NULL);
}

static void test_register_and_render(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_catalog_t cat;
	int rc = mfs_catalog_register(r, &cat, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s", errstr);
	char *t;
	TEST_OK(mfs_metrics_render(r, &t, NULL));
	static const char *const tn[] = {"counter", "gauge", "histogram"};
	for (size_t i = 0; i < mfs_catalog_n_entries; i++) {
		const mfs_catalog_entry_t *e = &mfs_catalog_entries[i];
		char want[256];
		snprintf(want, sizeof want, "# TYPE %s %s\n", e->name, tn[e->type]);
		TEST_ASSERT_MSG(strstr(t, want), "missing %s", want);
		TEST_ASSERT_MSG(strncmp(e->name, "mfstream_", 9) == 0, "%s", e->name);
		if (e->type == MFS_METRIC_COUNTER)
			TEST_ASSERT_MSG(strlen(e->name) > 6 && strcmp(e->name + strlen(e->name) - 6, "_total") == 0, "%s",
			                e->name);
	}
	/* fixed series exist from the start; "not known yet" is NaN */
	TEST_ASSERT(strstr(t, "\nmfstream_messages_rejected_total{reason=\"not_msgpack\"} 0\n"));
	TEST_ASSERT(strstr(t, "\nmfstream_model_rows{table=\"users\"} 0\nmfstream_model_rows{table=\"items\"} 0\n"));
	TEST_ASSERT(isnan(sample(t, "mfstream_prequential_rmse")));
	TEST_ASSERT(isnan(sample(t, "mfstream_snapshot_age_seconds")));
	free(t);

	/* one line per update */
	mfs_counter_add(cat.events_applied, 10);
	mfs_counter_inc(cat.messages_rejected_at[MFS_REJ_RANGE]);
	mfs_gauge_set(cat.model_rows_at[MFS_CAT_ITEMS], 42);
	mfs_histogram_observe(cat.snapshot_duration, 0.02);
	mfs_gauge_t *lag;
	TEST_OK(mfs_family_gauge(cat.consumer_lag, (const char *[]){"ratings", "3"}, &lag));
	mfs_gauge_set(lag, 17);
	TEST_OK(mfs_catalog_set_build_info(&cat, NULL, "cpu"));
	TEST_OK(mfs_metrics_render(r, &t, NULL));
	TEST_NEAR(sample(t, "mfstream_events_applied_total"), 10, 0);
	TEST_NEAR(sample(t, "mfstream_messages_rejected_total{reason=\"rating_range\"}"), 1, 0);
	TEST_NEAR(sample(t, "mfstream_model_rows{table=\"items\"}"), 42, 0);
	TEST_NEAR(sample(t, "mfstream_snapshot_duration_seconds_bucket{le=\"0.025\"}"), 1, 0);
	TEST_NEAR(sample(t, "mfstream_snapshot_duration_seconds_bucket{le=\"0.01\"}"), 0, 0);
	TEST_NEAR(sample(t, "mfstream_consumer_lag_messages{topic=\"ratings\",partition=\"3\"}"), 17, 0);
	const char *bi = strstr(t, "\nmfstream_build_info{version=\"");
	TEST_ASSERT(bi && !strstr(t, "version=\"unknown\"") && strstr(bi, "\",engine=\"cpu\"} 1\n"));
	TEST_ASSERT(sample(t, "mfstream_start_time_seconds") > 1.7e9);
	free(t);

	/* a second catalog cannot share the registry: names are unique */
	mfs_catalog_t again;
	TEST_EQ_INT(mfs_catalog_register(r, &again, errstr, sizeof errstr), MFS_EINVAL);
	TEST_ASSERT_MSG(strstr(errstr, "mfstream_messages_consumed_total"), "%s", errstr);
	mfs_metrics_free(r);

	/* metrics off: a zeroed catalog takes every update */
	mfs_catalog_t off;
	memset(&off, 0, sizeof off);
	mfs_counter_inc(off.events_applied);
	mfs_gauge_set(off.model_rows_at[MFS_CAT_USERS], 1);
	mfs_histogram_observe(off.event_to_snapshot, 1);
	TEST_EQ_INT(mfs_catalog_set_build_info(&off, NULL, "cpu"), MFS_EINVAL);
}

static void test_reject_reasons_follow_the_enum(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_catalog_t cat;
	TEST_OK(mfs_catalog_register(r, &cat, errstr, sizeof errstr));
	for (int i = 0; i < MFS_REJ__COUNT; i++) {
		TEST_ASSERT_MSG(cat.messages_rejected_at[i] != NULL, "reason %d", i);
		mfs_counter_add(cat.messages_rejected_at[i], (uint64_t)i + 100);
	}
	TEST_ASSERT(MFS_REJ__COUNT < MFS_CAT_FIXED_MAX && cat.messages_rejected_at[MFS_REJ__COUNT] == NULL);
	char *t;
	TEST_OK(mfs_metrics_render(r, &t, NULL));
	for (int i = 0; i < MFS_REJ__COUNT; i++) {
		char s[128];
		snprintf(s, sizeof s, "mfstream_messages_rejected_total{reason=\"%s\"}", mfs_reject_name(i));
		TEST_NEAR(sample(t, s), i + 100, 0);
	}
	free(t);
	mfs_metrics_free(r);
}

/* A gauge family whose label values are an enum's names in order: the catalog registers one
 * series per value (at the field at offset `at` of the catalog) and none past it, the name
 * function knows no value outside it, and each series renders under its name. */
static void check_enum_gauges(size_t at, int count, const char *(*name)(int), const char *series_fmt)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_catalog_t cat;
	TEST_OK(mfs_catalog_register(r, &cat, errstr, sizeof errstr));
	mfs_gauge_t **g = (mfs_gauge_t **)((char *)&cat + at);
	for (int i = 0; i < count; i++) {
		TEST_ASSERT_MSG(g[i] != NULL, "value %d of %s", i, series_fmt);
		mfs_gauge_set(g[i], i + 0.5);
	}
	TEST_ASSERT(count < MFS_CAT_FIXED_MAX && g[count] == NULL);
	TEST_ASSERT(name(count) == NULL && name(-1) == NULL);
	char *t;
	TEST_OK(mfs_metrics_render(r, &t, NULL));
	for (int i = 0; i < count; i++) {
		char s[128];
		snprintf(s, sizeof s, series_fmt, name(i));
		TEST_NEAR(sample(t, s), i + 0.5, 0);
	}
	free(t);
	mfs_metrics_free(r);
}

static void test_learner_phases_follow_the_enum(void)
{
	check_enum_gauges(offsetof(mfs_catalog_t, learner_seconds_at), MFS_LPH__COUNT, mfs_learner_phase_name,
	                  "mfstream_learner_seconds{phase=\"%s\"}");
}

static void test_learner_rows_steps_follow_the_enum(void)
{
	check_enum_gauges(offsetof(mfs_catalog_t, learner_rows_seconds_at), MFS_LRS__COUNT, mfs_learner_rows_step_name,
	                  "mfstream_learner_rows_seconds{step=\"%s\"}");
}

/* mfstream_snapshot_seconds: capture first, then the writer's phases in the enum's order, by
 * the writer's names (learner.c adds phase x at index x + 1), then trim. */
static void test_snapshot_phases_follow_the_enum(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_catalog_t cat;
	TEST_OK(mfs_catalog_register(r, &cat, errstr, sizeof errstr));
	for (int i = 0; i <= MFS_SNAP_PH__COUNT + 1; i++) {
		TEST_ASSERT_MSG(cat.snapshot_seconds_at[i] != NULL, "series %d", i);
		mfs_gauge_set(cat.snapshot_seconds_at[i], i + 0.25);
	}
	TEST_ASSERT(MFS_SNAP_PH__COUNT + 2 < MFS_CAT_FIXED_MAX && cat.snapshot_seconds_at[MFS_SNAP_PH__COUNT + 2] == NULL);
	TEST_ASSERT(mfs_snap_phase_name(MFS_SNAP_PH__COUNT) == NULL && mfs_snap_phase_name(-1) == NULL);
	char *t;
	TEST_OK(mfs_metrics_render(r, &t, NULL));
	TEST_NEAR(sample(t, "mfstream_snapshot_seconds{phase=\"capture\"}"), 0.25, 0);
	for (int i = 0; i < MFS_SNAP_PH__COUNT; i++) {
		char s[128];
		snprintf(s, sizeof s, "mfstream_snapshot_seconds{phase=\"%s\"}", mfs_snap_phase_name(i));
		TEST_NEAR(sample(t, s), i + 1.25, 0);
	}
	TEST_NEAR(sample(t, "mfstream_snapshot_seconds{phase=\"trim\"}"), MFS_SNAP_PH__COUNT + 1.25, 0);
	free(t);
	mfs_metrics_free(r);
}

static void test_scrape_hook(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_catalog_t cat;
	TEST_OK(mfs_catalog_register(r, &cat, errstr, sizeof errstr));
	char *t;
	TEST_OK(mfs_metrics_render(r, &t, NULL)); /* the rate's baseline */
	TEST_NEAR(sample(t, "mfstream_updates_per_second"), 0, 0);
	free(t);
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	mfs_gauge_set(cat.snapshot_timestamp, (double)now.tv_sec - 5);
	mfs_counter_add(cat.updates, 1000);
	struct timespec d = {1, 100000000L};
	nanosleep(&d, NULL);
	TEST_OK(mfs_metrics_render(r, &t, NULL));
	double age = sample(t, "mfstream_snapshot_age_seconds");
	TEST_ASSERT_MSG(age >= 5 && age < 8, "age %g", age);
	double rate = sample(t, "mfstream_updates_per_second");
	TEST_ASSERT_MSG(rate > 100 && rate <= 1000 / 1.1 + 1e-9, "rate %g", rate); /* dt in [1.1 s, 10 s) */
	free(t);
	/* a render within a second keeps the last rate */
	mfs_counter_add(cat.updates, 1000000);
	TEST_OK(mfs_metrics_render(r, &t, NULL));
	TEST_NEAR(sample(t, "mfstream_updates_per_second"), rate, 0);
	free(t);
	mfs_metrics_free(r);
}

/* docs/METRICS.md describes exactly the catalogue: every metric has its `name` in it, and
 * every mfstream_* name it mentions exists (histogram series suffixes allowed). */
static void test_doc_matches_catalog(void)
{
	char *doc = read_file("docs/METRICS.md");
	TEST_ASSERT_MSG(doc, "docs/METRICS.md not found (tests run from the source root)");
	if (!doc)
		return;
	for (size_t i = 0; i < mfs_catalog_n_entries; i++) {
		char want[128];
		snprintf(want, sizeof want, "| `%s` |", mfs_catalog_entries[i].name);
		TEST_ASSERT_MSG(strstr(doc, want), "docs/METRICS.md has no table row for %s", mfs_catalog_entries[i].name);
	}
	for (const char *p = doc; (p = strstr(p, "mfstream_"));) {
		size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
		const mfs_catalog_entry_t *e = entry_named(p, n);
		if (!e) {
			static const char *const suffix[] = {"_bucket", "_sum", "_count"};
			for (size_t s = 0; s < 3 && !e; s++) {
				size_t sl = strlen(suffix[s]);
				if (n > sl && strncmp(p + n - sl, suffix[s], sl) == 0) {
					e = entry_named(p, n - sl);
					if (e && e->type != MFS_METRIC_HISTOGRAM)
						e = NULL;
				}
			}
		}
		if (n == 9) /* the bare prefix */
			e = &mfs_catalog_entries[0];
		TEST_ASSERT_MSG(e, "docs/METRICS.md names %.*s, which the catalogue does not have", (int)n, p);
		p += n;
	}
	free(doc);
}

int main(void)
{
	TEST_RUN(test_register_and_render);
	TEST_RUN(test_reject_reasons_follow_the_enum);
	TEST_RUN(test_learner_phases_follow_the_enum);
	TEST_RUN(test_learner_rows_steps_follow_the_enum);
	TEST_RUN(test_snapshot_phases_follow_the_enum);
	TEST_RUN(test_scrape_hook);
	TEST_RUN(test_doc_matches_catalog);
	return TEST_REPORT();
}
