/* test_metrics.c - the metrics registry: exact text exposition output (golden), escaping,
 * NaN/Inf, histograms, label families, remove/revive, scrape hooks, argument checks, and
 * exact totals while threads update and another thread renders. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/err.h"
#include "ops/metrics.h"
#include "testhelp.h"

static char *render(mfs_metrics_t *r)
{
	char *t = NULL;
	size_t len = 0;
	int rc = mfs_metrics_render(r, &t, &len);
	TEST_OK(rc);
	if (rc)
		return NULL;
	TEST_EQ_INT(len, strlen(t));
	return t;
}

#define TEST_RENDER_EQ(r, want)                                                           \
	do {                                                                              \
		char *got_ = render(r);                                                   \
		TEST_ASSERT_MSG(got_ && strcmp(got_, want) == 0, "\n--- got ---\n%s--- want ---\n%s", \
		                got_ ? got_ : "(null)", want);                            \
		free(got_);                                                               \
	} while (0)

static void test_scalars_golden(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_counter_t *c;
	mfs_gauge_t *g;
	TEST_OK(mfs_metrics_counter(r, "mfs_requests_total", "Requests served.", &c));
	TEST_OK(mfs_metrics_gauge(r, "mfs_temperature", "A \\ backslash\nand a newline; \"quotes\" stay.", &g));
	mfs_counter_add(c, 41);
	mfs_counter_inc(c);
	mfs_gauge_set(g, 0.1);
	TEST_RENDER_EQ(r, "# HELP mfs_requests_total Requests served.\n"
	                  "# TYPE mfs_requests_total counter\n"
	                  "mfs_requests_total 42\n"
	                  "# HELP mfs_temperature A \\\\ backslash\\nand a newline; \"quotes\" stay.\n"
	                  "# TYPE mfs_temperature gauge\n"
	                  "mfs_temperature 0.1\n");
	TEST_EQ_INT(mfs_counter_get(c), 42);
	mfs_counter_set(c, UINT64_MAX);
	mfs_gauge_add(g, 0.2);
	TEST_NEAR(mfs_gauge_get(g), 0.30000000000000004, 0);
	char *t = render(r);
	TEST_ASSERT(t && strstr(t, "\nmfs_requests_total 18446744073709551615\n"));
	/* shortest round-trip text: 0.1 + 0.2 needs 17 digits */
	TEST_ASSERT(t && strstr(t, "\nmfs_temperature 0.30000000000000004\n"));
	free(t);

	/* NaN and the infinities are spelled the way Prometheus parses them */
	static const struct {
		double v;
		const char *text;
	} cases[] = {{NAN, "NaN"}, {INFINITY, "+Inf"}, {-INFINITY, "-Inf"}, {-0.5, "-0.5"}, {1e300, "1e+300"},
	             {123456789012.0, "123456789012"}, {0, "0"}};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char want[128];
		mfs_gauge_set(g, cases[i].v);
		snprintf(want, sizeof want, "\nmfs_temperature %s\n", cases[i].text);
		t = render(r);
		TEST_ASSERT_MSG(t && strstr(t, want), "want %s in\n%s", want + 1, t ? t : "");
		free(t);
	}
	mfs_metrics_free(r);
}

static void test_families_golden(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_family_t *rej, *lag;
	TEST_OK(mfs_metrics_family(r, MFS_METRIC_COUNTER, "mfs_rejected_total", "Rejected, by reason.",
	                           (const char *[]){"reason"}, 1, NULL, 0, &rej));
	TEST_OK(mfs_metrics_family(r, MFS_METRIC_GAUGE, "mfs_lag", "Lag.", (const char *[]){"topic", "partition"}, 2,
	                           NULL, 0, &lag));
	mfs_counter_t *nan_c, *range_c, *again;
	TEST_OK(mfs_family_counter(rej, (const char *[]){"nan"}, &nan_c));
	TEST_OK(mfs_family_counter(rej, (const char *[]){"rating_range"}, &range_c));
	TEST_OK(mfs_family_counter(rej, (const char *[]){"nan"}, &again));
	TEST_ASSERT(again == nan_c); /* same label values, same series */
	mfs_counter_add(nan_c, 3);
	mfs_counter_inc(range_c);
	mfs_gauge_t *p0, *weird;
	TEST_OK(mfs_family_gauge(lag, (const char *[]){"ratings", "0"}, &p0));
	/* label values: backslash, double quote and newline are escaped; other bytes pass */
	TEST_OK(mfs_family_gauge(lag, (const char *[]){"a\"b\\c\nd", "π"}, &weird));
	mfs_gauge_set(p0, 12);
	mfs_gauge_set(weird, -1);
	TEST_RENDER_EQ(r, "# HELP mfs_rejected_total Rejected, by reason.\n"
	                  "# TYPE mfs_rejected_total counter\n"
	                  "mfs_rejected_total{reason=\"nan\"} 3\n"
	                  "mfs_rejected_total{reason=\"rating_range\"} 1\n"
	                  "# HELP mfs_lag Lag.\n"
	                  "# TYPE mfs_lag gauge\n"
	                  "mfs_lag{topic=\"ratings\",partition=\"0\"} 12\n"
	                  "mfs_lag{topic=\"a\\\"b\\\\c\\nd\",partition=\"π\"} -1\n");

	/* remove hides the series; its handle keeps working; a lookup shows it again */
	TEST_OK(mfs_family_remove(lag, (const char *[]){"ratings", "0"}));
	TEST_EQ_INT(mfs_family_remove(lag, (const char *[]){"ratings", "7"}), MFS_ENOTFOUND);
	mfs_gauge_set(p0, 5);
	char *t = render(r);
	TEST_ASSERT(t && !strstr(t, "partition=\"0\"") && strstr(t, "partition=\"π\""));
	free(t);
	mfs_gauge_t *p0b;
	TEST_OK(mfs_family_gauge(lag, (const char *[]){"ratings", "0"}, &p0b));
	TEST_ASSERT(p0b == p0);
	t = render(r);
	TEST_ASSERT(t && strstr(t, "\nmfs_lag{topic=\"ratings\",partition=\"0\"} 5\n"));
	free(t);
	mfs_family_remove_all(lag);
	TEST_RENDER_EQ(r, "# HELP mfs_rejected_total Rejected, by reason.\n"
	                  "# TYPE mfs_rejected_total counter\n"
	                  "mfs_rejected_total{reason=\"nan\"} 3\n"
	                  "mfs_rejected_total{reason=\"rating_range\"} 1\n"
	                  "# HELP mfs_lag Lag.\n"
	                  "# TYPE mfs_lag gauge\n");

	/* wrong type, NULL value */
	mfs_gauge_t *wrong;
	TEST_EQ_INT(mfs_family_gauge(rej, (const char *[]){"x"}, &wrong), MFS_EINVAL);
	TEST_EQ_INT(mfs_family_counter(rej, (const char *[]){NULL}, &again), MFS_EINVAL);
	mfs_metrics_free(r);
}

static void test_histogram_golden(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_histogram_t *h;
	static const double b[] = {0.005, 0.1, 1, 2.5};
	TEST_OK(mfs_metrics_histogram(r, "mfs_duration_seconds", "Duration.", b, 4, &h));
	mfs_histogram_observe(h, 0.005); /* on a bound: counts in that bucket (le = <=) */
	mfs_histogram_observe(h, 0.05);
	mfs_histogram_observe(h, 0.5);
	mfs_histogram_observe(h, 100);
	mfs_histogram_observe(h, NAN); /* ignored */
	mfs_histogram_observe_n(h, 2, 3);
	mfs_histogram_observe(h, -1); /* below every bound: first bucket */
	TEST_RENDER_EQ(r, "# HELP mfs_duration_seconds Duration.\n"
	                  "# TYPE mfs_duration_seconds histogram\n"
	                  "mfs_duration_seconds_bucket{le=\"0.005\"} 2\n"
	                  "mfs_duration_seconds_bucket{le=\"0.1\"} 3\n"
	                  "mfs_duration_seconds_bucket{le=\"1\"} 4\n"
	                  "mfs_duration_seconds_bucket{le=\"2.5\"} 7\n"
	                  "mfs_duration_seconds_bucket{le=\"+Inf\"} 8\n"
	                  "mfs_duration_seconds_sum 105.555\n"
	                  "mfs_duration_seconds_count 8\n");

	/* a labelled histogram family: le comes after the family's labels */
	mfs_family_t *f;
	TEST_OK(mfs_metrics_family(r, MFS_METRIC_HISTOGRAM, "mfs_lat_seconds", "L.", (const char *[]){"stage"}, 1,
	                           (const double[]){1}, 1, &f));
	mfs_histogram_t *hs;
	TEST_OK(mfs_family_histogram(f, (const char *[]){"snap"}, &hs));
	mfs_histogram_observe(hs, 0.25);
	char *t = render(r);
	TEST_ASSERT(t && strstr(t, "# TYPE mfs_lat_seconds histogram\n"
	                           "mfs_lat_seconds_bucket{stage=\"snap\",le=\"1\"} 1\n"
	                           "mfs_lat_seconds_bucket{stage=\"snap\",le=\"+Inf\"} 1\n"
	                           "mfs_lat_seconds_sum{stage=\"snap\"} 0.25\n"
	                           "mfs_lat_seconds_count{stage=\"snap\"} 1\n"));
	free(t);
	mfs_metrics_free(r);
}

static void test_argument_checks(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	mfs_counter_t *c;
	mfs_histogram_t *h;
	mfs_family_t *f;
	TEST_EQ_INT(mfs_metrics_counter(r, "", "x", &c), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_counter(r, "9lives", "x", &c), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_counter(r, "has-dash", "x", &c), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_counter(r, NULL, "x", &c), MFS_EINVAL);
	TEST_OK(mfs_metrics_counter(r, "ns:ok_name_1", "x", &c));
	TEST_EQ_INT(mfs_metrics_counter(r, "ns:ok_name_1", "dup", &c), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_histogram(r, "h1", "x", (const double[]){1, 1}, 2, &h), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_histogram(r, "h2", "x", (const double[]){2, 1}, 2, &h), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_histogram(r, "h3", "x", (const double[]){INFINITY}, 1, &h), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_histogram(r, "h4", "x", NULL, 0, &h), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_family(r, MFS_METRIC_HISTOGRAM, "h5", "x", (const char *[]){"le"}, 1,
	                               (const double[]){1}, 1, &f), MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_family(r, MFS_METRIC_GAUGE, "g1", "x", (const char *[]){"__reserved"}, 1, NULL, 0, &f),
	            MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_family(r, MFS_METRIC_GAUGE, "g2", "x", (const char *[]){"a", "a"}, 2, NULL, 0, &f),
	            MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_family(r, MFS_METRIC_GAUGE, "g3", "x", (const char *[]){"a:b"}, 1, NULL, 0, &f),
	            MFS_EINVAL);
	TEST_EQ_INT(mfs_metrics_family(r, 7, "g4", "x", NULL, 0, NULL, 0, &f), MFS_EINVAL);
	/* NULL handles are no-ops (metrics switched off) */
	mfs_counter_inc(NULL);
	mfs_gauge_set(NULL, 1);
	mfs_histogram_observe(NULL, 1);
	TEST_EQ_INT(mfs_counter_get(NULL), 0);
	/* the series cap */
	TEST_OK(mfs_metrics_family(r, MFS_METRIC_COUNTER, "many_total", "x", (const char *[]){"id"}, 1, NULL, 0, &f));
	int rc = 0;
	char v[32];
	for (int i = 0; i <= MFS_METRICS_MAX_SERIES && !rc; i++) {
		snprintf(v, sizeof v, "%d", i);
		rc = mfs_family_counter(f, (const char *[]){v}, &c);
	}
	TEST_EQ_INT(rc, MFS_EFULL);
	/* nothing registered after a failure is half there */
	char *t = render(r);
	TEST_ASSERT(t && !strstr(t, "h1") && !strstr(t, "g2") && strstr(t, "ns:ok_name_1 0\n"));
	free(t);
	mfs_metrics_free(r);
	mfs_metrics_free(NULL);
}

/* ---- scrape hooks --------------------------------------------------------------------- */
typedef struct hook_ctx {
	mfs_gauge_t *g;
	mfs_family_t *f;
	int calls;
} hook_ctx_t;

static void hook(mfs_metrics_t *r, void *ctx)
{
	hook_ctx_t *h = ctx;
	(void)r;
	h->calls++;
	mfs_gauge_set(h->g, h->calls * 10);
	/* the registry lock is recursive: a hook may rebuild a family's series */
	mfs_gauge_t *s;
	char v[16];
	snprintf(v, sizeof v, "%d", h->calls);
	mfs_family_remove_all(h->f);
	if (mfs_family_gauge(h->f, (const char *[]){v}, &s) == 0)
		mfs_gauge_set(s, 1);
}

static void test_hooks(void)
{
	mfs_metrics_t *r;
	TEST_OK(mfs_metrics_init(&r));
	hook_ctx_t h = {0};
	TEST_OK(mfs_metrics_gauge(r, "computed", "At scrape time.", &h.g));
	TEST_OK(mfs_metrics_family(r, MFS_METRIC_GAUGE, "rebuilt", "Series rebuilt by the hook.",
	                           (const char *[]){"n"}, 1, NULL, 0, &h.f));
	TEST_OK(mfs_metrics_add_hook(r, hook, &h));
	TEST_RENDER_EQ(r, "# HELP computed At scrape time.\n# TYPE computed gauge\ncomputed 10\n"
	                  "# HELP rebuilt Series rebuilt by the hook.\n# TYPE rebuilt gauge\nrebuilt{n=\"1\"} 1\n");
	TEST_RENDER_EQ(r, "# HELP computed At scrape time.\n# TYPE computed gauge\ncomputed 20\n"
	                  "# HELP rebuilt Series rebuilt by the hook.\n# TYPE rebuilt gauge\nrebuilt{n=\"2\"} 1\n");
	TEST_EQ_INT(h.calls, 2);
	int rc = 0;
	for (int i = 0; i < 32 && !rc; i++)
		rc = mfs_metrics_add_hook(r, hook, &h);
	TEST_EQ_INT(rc, MFS_EFULL);
	mfs_metrics_free(r);
}

/* ---- concurrency: exact totals while a renderer runs ---------------------------------- */
#define N_THREADS 4
#define N_ITERS 200000

typedef struct shared {
	mfs_metrics_t *r;
	mfs_counter_t *c;
	mfs_gauge_t *g;
	mfs_histogram_t *h;
	mfs_family_t *f;
	_Atomic int stop;
	int renders, bad_renders;
} shared_t;

typedef struct worker {
	shared_t *s;
	int id;
} worker_t;

static void *work(void *arg)
{
	worker_t *w = arg;
	shared_t *s = w->s;
	char v[16];
	snprintf(v, sizeof v, "t%d", w->id);
	mfs_counter_t *mine = NULL;
	for (int i = 0; i < N_ITERS; i++) {
		mfs_counter_inc(s->c);
		mfs_gauge_add(s->g, 1.0);
		mfs_histogram_observe(s->h, (double)(i % 4)); /* 0,1,2,3 -> buckets le=0.5,1.5,2.5,+Inf */
		if (i % 1000 == 0) /* series creation races with rendering too */
			mfs_family_counter(s->f, (const char *[]){v}, &mine);
		mfs_counter_inc(mine);
	}
	return NULL;
}

/* In every render: the histogram's +Inf bucket equals its _count (both from one pass). */
static void *renderer(void *arg)
{
	shared_t *s = arg;
	while (!atomic_load(&s->stop)) {
		char *t = NULL;
		if (mfs_metrics_render(s->r, &t, NULL)) {
			s->bad_renders++;
			continue;
		}
		const char *inf = strstr(t, "conc_seconds_bucket{le=\"+Inf\"} ");
		const char *cnt = strstr(t, "conc_seconds_count ");
		if (!inf || !cnt || strtoull(inf + 31, NULL, 10) != strtoull(cnt + 19, NULL, 10))
			s->bad_renders++;
		s->renders++;
		free(t);
	}
	return NULL;
}

static void test_concurrent_updates_exact(void)
{
	shared_t s;
	memset(&s, 0, sizeof s);
	TEST_OK(mfs_metrics_init(&s.r));
	TEST_OK(mfs_metrics_counter(s.r, "conc_total", "c", &s.c));
	TEST_OK(mfs_metrics_gauge(s.r, "conc_gauge", "g", &s.g));
	TEST_OK(mfs_metrics_histogram(s.r, "conc_seconds", "h", (const double[]){0.5, 1.5, 2.5}, 3, &s.h));
	TEST_OK(mfs_metrics_family(s.r, MFS_METRIC_COUNTER, "conc_by_thread_total", "f", (const char *[]){"t"}, 1,
	                           NULL, 0, &s.f));
	pthread_t th[N_THREADS], rt;
	worker_t w[N_THREADS];
	TEST_OK(pthread_create(&rt, NULL, renderer, &s));
	for (int i = 0; i < N_THREADS; i++) {
		w[i] = (worker_t){&s, i};
		TEST_OK(pthread_create(&th[i], NULL, work, &w[i]));
	}
	for (int i = 0; i < N_THREADS; i++)
		pthread_join(th[i], NULL);
	atomic_store(&s.stop, 1);
	pthread_join(rt, NULL);
	TEST_ASSERT(s.renders > 0);
	TEST_EQ_INT(s.bad_renders, 0);
	const uint64_t total = (uint64_t)N_THREADS * N_ITERS;
	TEST_EQ_INT(mfs_counter_get(s.c), total);
	TEST_NEAR(mfs_gauge_get(s.g), (double)total, 0); /* integers below 2^53: exact */
	char *t = render(s.r);
	char want[256];
	snprintf(want, sizeof want, "conc_total %llu\n", (unsigned long long)total);
	TEST_ASSERT(t && strstr(t, want));
	snprintf(want, sizeof want,
	         "conc_seconds_bucket{le=\"0.5\"} %llu\nconc_seconds_bucket{le=\"1.5\"} %llu\n"
	         "conc_seconds_bucket{le=\"2.5\"} %llu\nconc_seconds_bucket{le=\"+Inf\"} %llu\n"
	         "conc_seconds_sum %llu\nconc_seconds_count %llu\n",
	         (unsigned long long)total / 4, (unsigned long long)total / 2, (unsigned long long)total * 3 / 4,
	         (unsigned long long)total, (unsigned long long)total * 6 / 4, (unsigned long long)total);
	TEST_ASSERT_MSG(t && strstr(t, want), "want\n%s", want);
	for (int i = 0; i < N_THREADS; i++) {
		snprintf(want, sizeof want, "conc_by_thread_total{t=\"t%d\"} %d\n", i, N_ITERS);
		TEST_ASSERT_MSG(t && strstr(t, want), "want %s", want);
	}
	free(t);
	mfs_metrics_free(s.r);
}

int main(void)
{
	TEST_RUN(test_scalars_golden);
	TEST_RUN(test_families_golden);
	TEST_RUN(test_histogram_golden);
	TEST_RUN(test_argument_checks);
	TEST_RUN(test_hooks);
	TEST_RUN(test_concurrent_updates_exact);
	return TEST_REPORT();
}
