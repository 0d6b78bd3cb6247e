/* metrics.c - the metrics registry and its Prometheus text rendering (see metrics.h).
 *
 * DESIGN: a registry is a list of families in registration order; a family is a list of
 * series in creation order. Each series is allocated on its own (64-byte aligned, so two hot
 * counters never share a cache line) and never moves or goes away before mfs_metrics_free(),
 * which is what lets callers keep raw handles and update them without any lock. The lists
 * only grow, and only under the registry mutex; rendering walks them under the same mutex,
 * so it never sees a half-linked series. Values are atomics read with relaxed loads: a scrape
 * sees every update that happened before it, in no particular order between series.
 * Histograms keep per-bucket (not cumulative) counts; the renderer sums them and derives
 * _count from the same numbers, so +Inf == _count always holds in the output even while
 * observations race with the scrape (_sum may be a few observations apart, as in every
 * Prometheus client without a hot/cold swap). Doubles live in atomic uint64 bit patterns.
 */
#include "ops/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/grow.h"

#define MAX_BOUNDS 64
#define MAX_HOOKS 16

struct mfs_counter {
	_Atomic uint64_t v;
};
struct mfs_gauge {
	_Atomic uint64_t bits; /* a double */
};
struct mfs_histogram {
	_Atomic uint64_t sum_bits; /* a double */
	const double *bounds;      /* the family's */
	size_t nb;
	_Atomic uint64_t *buckets; /* nb + 1 (the last is +Inf), not cumulative */
};

typedef struct series {
	union {
		struct mfs_counter c;
		struct mfs_gauge g;
		struct mfs_histogram h;
	} s_u;
	_Alignas(64) struct series *s_next; /* keeps the hot union alone on its cache line */
	char **s_values;
	int s_visible;
} series_t;

struct mfs_family {
	struct mfs_family *f_next;
	mfs_metrics_t *f_reg;
	int f_type;
	char *f_name, *f_help;
	char **f_labels;
	size_t f_n_labels;
	double *f_bounds;
	size_t f_nb;
	series_t *f_head, **f_tail;
	size_t f_n_series;
};

struct mfs_metrics {
	pthread_mutex_t m_lock; /* recursive: hooks run under it and may look series up */
	mfs_family_t *m_head, **m_tail;
	struct {
		mfs_metrics_hook_fn fn;
		void *ctx;
	} m_hooks[MAX_HOOKS];
	size_t m_n_hooks;
};

/* ---- doubles in atomics --------------------------------------------------------------- */
static uint64_t dbits(double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof u);
	return u;
}
static double bitsd(uint64_t u)
{
	double d;
	memcpy(&d, &u, sizeof d);
	return d;
}
static void atomic_add_double(_Atomic uint64_t *a, double d)
{
	uint64_t old = atomic_load_explicit(a, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(a, &old, dbits(bitsd(old) + d), memory_order_relaxed,
	                                              memory_order_relaxed))
		;
}

/* ---- hot path ------------------------------------------------------------------------- */
void mfs_counter_add(mfs_counter_t *c, uint64_t n)
{
	if (c)
		atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed);
}
void mfs_counter_inc(mfs_counter_t *c) { mfs_counter_add(c, 1); }
void mfs_counter_set(mfs_counter_t *c, uint64_t v)
{
	if (c)
		atomic_store_explicit(&c->v, v, memory_order_relaxed);
}
uint64_t mfs_counter_get(const mfs_counter_t *c)
{
	return c ? atomic_load_explicit(&((mfs_counter_t *)(uintptr_t)c)->v, memory_order_relaxed) : 0;
}
void mfs_gauge_set(mfs_gauge_t *g, double v)
{
	if (g)
		atomic_store_explicit(&g->bits, dbits(v), memory_order_relaxed);
}
void mfs_gauge_add(mfs_gauge_t *g, double d)
{
	if (g)
		atomic_add_double(&g->bits, d);
}
double mfs_gauge_get(const mfs_gauge_t *g)
{
	return g ? bitsd(atomic_load_explicit(&((mfs_gauge_t *)(uintptr_t)g)->bits, memory_order_relaxed)) : NAN;
}

void mfs_histogram_observe_n(mfs_histogram_t *h, double v, uint64_t n)
{
	if (!h || isnan(v) || n == 0)
		return;
	/* first bound >= v: binary search over a short sorted array */
	size_t lo = 0, hi = h->nb;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (v <= h->bounds[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	atomic_fetch_add_explicit(&h->buckets[lo], n, memory_order_relaxed);
	atomic_add_double(&h->sum_bits, v * (double)n);
}
void mfs_histogram_observe(mfs_histogram_t *h, double v) { mfs_histogram_observe_n(h, v, 1); }

/* ---- names ---------------------------------------------------------------------------- */
static int valid_metric_name(const char *s)
{
	if (!s || !*s)
		return 0;
	for (const char *p = s; *p; p++) {
		char c = *p;
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
		         (p > s && c >= '0' && c <= '9');
		if (!ok)
			return 0;
	}
	return 1;
}

static int valid_label_name(const char *s)
{
	if (!s || !*s || strncmp(s, "__", 2) == 0)
		return 0;
	for (const char *p = s; *p; p++) {
		char c = *p;
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (p > s && c >= '0' && c <= '9');
		if (!ok)
			return 0;
	}
	return 1;
}

/* ---- registry --------------------------------------------------------------------------- */
int mfs_metrics_init(mfs_metrics_t **out)
{
	mfs_metrics_t *r = calloc(1, sizeof *r);
	if (!r)
		return ENOMEM;
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
	int rc = pthread_mutex_init(&r->m_lock, &a);
	pthread_mutexattr_destroy(&a);
	if (rc) {
		free(r);
		return rc;
	}
	r->m_tail = &r->m_head;
	*out = r;
	return 0;
}

static void free_strv(char **v, size_t n)
{
	if (!v)
		return;
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static void series_free(const mfs_family_t *f, series_t *s)
{
	free_strv(s->s_values, f->f_n_labels);
	if (f->f_type == MFS_METRIC_HISTOGRAM)
		free(s->s_u.h.buckets);
	free(s);
}

static void family_free(mfs_family_t *f)
{
	for (series_t *s = f->f_head, *n; s; s = n) {
		n = s->s_next;
		series_free(f, s);
	}
	free(f->f_name);
	free(f->f_help);
	free_strv(f->f_labels, f->f_n_labels);
	free(f->f_bounds);
	free(f);
}

void mfs_metrics_free(mfs_metrics_t *r)
{
	if (!r)
		return;
	for (mfs_family_t *f = r->m_head, *n; f; f = n) {
		n = f->f_next;
		family_free(f);
	}
	pthread_mutex_destroy(&r->m_lock);
	free(r);
}

static char **dup_strv(const char *const *v, size_t n)
{
	char **d = calloc(n ? n : 1, sizeof *d);
	if (!d)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!(d[i] = strdup(v[i]))) {
			free_strv(d, n);
			return NULL;
		}
	return d;
}

int mfs_metrics_family(mfs_metrics_t *r, int type, const char *name, const char *help, const char *const *labels,
                       size_t n_labels, const double *bounds, size_t n_bounds, mfs_family_t **out)
{
	if (!r || !out || !valid_metric_name(name) || n_labels > MFS_METRICS_MAX_LABELS || (n_labels && !labels))
		return MFS_EINVAL;
	if (type != MFS_METRIC_COUNTER && type != MFS_METRIC_GAUGE && type != MFS_METRIC_HISTOGRAM)
		return MFS_EINVAL;
	for (size_t i = 0; i < n_labels; i++) {
		if (!valid_label_name(labels[i]) || (type == MFS_METRIC_HISTOGRAM && strcmp(labels[i], "le") == 0))
			return MFS_EINVAL;
		for (size_t j = 0; j < i; j++)
			if (strcmp(labels[i], labels[j]) == 0)
				return MFS_EINVAL;
	}
	if (type == MFS_METRIC_HISTOGRAM) {
		if (!bounds || n_bounds == 0 || n_bounds > MAX_BOUNDS)
			return MFS_EINVAL;
		for (size_t i = 0; i < n_bounds; i++)
			if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1]))
				return MFS_EINVAL;
	} else if (n_bounds) {
		return MFS_EINVAL;
	}
	mfs_family_t *f = calloc(1, sizeof *f);
	if (!f)
		return ENOMEM;
	f->f_reg = r;
	f->f_type = type;
	f->f_n_labels = n_labels;
	f->f_nb = type == MFS_METRIC_HISTOGRAM ? n_bounds : 0;
	f->f_tail = &f->f_head;
	f->f_name = strdup(name);
	f->f_help = strdup(help ? help : "");
	f->f_labels = dup_strv(labels, n_labels);
	if (f->f_nb && (f->f_bounds = malloc(n_bounds * sizeof *f->f_bounds)))
		memcpy(f->f_bounds, bounds, n_bounds * sizeof *f->f_bounds);
	if (!f->f_name || !f->f_help || !f->f_labels || (f->f_nb && !f->f_bounds)) {
		family_free(f);
		return ENOMEM;
	}
	pthread_mutex_lock(&r->m_lock);
	for (mfs_family_t *g = r->m_head; g; g = g->f_next)
		if (strcmp(g->f_name, name) == 0) {
			pthread_mutex_unlock(&r->m_lock);
			family_free(f);
			return MFS_EINVAL;
		}
	*r->m_tail = f;
	r->m_tail = &f->f_next;
	pthread_mutex_unlock(&r->m_lock);
	*out = f;
	return 0;
}

/* The series for values: found or created (visible either way). Caller holds the lock. */
static int series_get(mfs_family_t *f, const char *const *values, series_t **out)
{
	for (size_t i = 0; i < f->f_n_labels; i++)
		if (!values || !values[i])
			return MFS_EINVAL;
	for (series_t *s = f->f_head; s; s = s->s_next) {
		size_t i = 0;
		while (i < f->f_n_labels && strcmp(s->s_values[i], values[i]) == 0)
			i++;
		if (i == f->f_n_labels) {
			s->s_visible = 1;
			*out = s;
			return 0;
		}
	}
	if (f->f_n_series >= MFS_METRICS_MAX_SERIES)
		return MFS_EFULL;
	series_t *s = aligned_alloc(_Alignof(series_t), sizeof *s);
	if (!s)
		return ENOMEM;
	memset(s, 0, sizeof *s);
	if (!(s->s_values = dup_strv(values, f->f_n_labels))) {
		free(s);
		return ENOMEM;
	}
	if (f->f_type == MFS_METRIC_HISTOGRAM) {
		s->s_u.h.bounds = f->f_bounds;
		s->s_u.h.nb = f->f_nb;
		if (!(s->s_u.h.buckets = calloc(f->f_nb + 1, sizeof *s->s_u.h.buckets))) {
			series_free(f, s);
			return ENOMEM;
		}
		for (size_t i = 0; i <= f->f_nb; i++)
			atomic_init(&s->s_u.h.buckets[i], 0);
		atomic_init(&s->s_u.h.sum_bits, dbits(0.0));
	} else if (f->f_type == MFS_METRIC_GAUGE) {
		atomic_init(&s->s_u.g.bits, dbits(0.0));
	} else {
		atomic_init(&s->s_u.c.v, 0);
	}
	s->s_visible = 1;
	*f->f_tail = s;
	f->f_tail = &s->s_next;
	f->f_n_series++;
	*out = s;
	return 0;
}

static int family_get(mfs_family_t *f, int type, const char *const *values, series_t **out)
{
	if (!f || !out)
		return MFS_EINVAL;
	if (f->f_type != type)
		return MFS_EINVAL;
	pthread_mutex_lock(&f->f_reg->m_lock);
	int rc = series_get(f, values, out);
	pthread_mutex_unlock(&f->f_reg->m_lock);
	return rc;
}

int mfs_family_counter(mfs_family_t *f, const char *const *values, mfs_counter_t **out)
{
	series_t *s;
	int rc = family_get(f, MFS_METRIC_COUNTER, values, &s);
	if (!rc)
		*out = &s->s_u.c;
	return rc;
}

int mfs_family_gauge(mfs_family_t *f, const char *const *values, mfs_gauge_t **out)
{
	series_t *s;
	int rc = family_get(f, MFS_METRIC_GAUGE, values, &s);
	if (!rc)
		*out = &s->s_u.g;
	return rc;
}

int mfs_family_histogram(mfs_family_t *f, const char *const *values, mfs_histogram_t **out)
{
	series_t *s;
	int rc = family_get(f, MFS_METRIC_HISTOGRAM, values, &s);
	if (!rc)
		*out = &s->s_u.h;
	return rc;
}

int mfs_family_remove(mfs_family_t *f, const char *const *values)
{
	if (!f)
		return MFS_EINVAL;
	int rc = MFS_ENOTFOUND;
	pthread_mutex_lock(&f->f_reg->m_lock);
	for (series_t *s = f->f_head; s; s = s->s_next) {
		size_t i = 0;
		while (i < f->f_n_labels && values && values[i] && strcmp(s->s_values[i], values[i]) == 0)
			i++;
		if (i == f->f_n_labels) {
			s->s_visible = 0;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&f->f_reg->m_lock);
	return rc;
}

void mfs_family_remove_all(mfs_family_t *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->f_reg->m_lock);
	for (series_t *s = f->f_head; s; s = s->s_next)
		s->s_visible = 0;
	pthread_mutex_unlock(&f->f_reg->m_lock);
}

/* An unlabelled metric: a family with no labels and its one series. */
static int metrics_single(mfs_metrics_t *r, int type, const char *name, const char *help, const double *bounds,
                          size_t nb, series_t **out)
{
	mfs_family_t *f;
	int rc = mfs_metrics_family(r, type, name, help, NULL, 0, bounds, nb, &f);
	if (rc)
		return rc;
	return family_get(f, type, NULL, out);
}

int mfs_metrics_counter(mfs_metrics_t *r, const char *name, const char *help, mfs_counter_t **out)
{
	series_t *s;
	int rc = metrics_single(r, MFS_METRIC_COUNTER, name, help, NULL, 0, &s);
	if (!rc)
		*out = &s->s_u.c;
	return rc;
}

int mfs_metrics_gauge(mfs_metrics_t *r, const char *name, const char *help, mfs_gauge_t **out)
{
	series_t *s;
	int rc = metrics_single(r, MFS_METRIC_GAUGE, name, help, NULL, 0, &s);
	if (!rc)
		*out = &s->s_u.g;
	return rc;
}

int mfs_metrics_histogram(mfs_metrics_t *r, const char *name, const char *help, const double *bounds,
                          size_t n_bounds, mfs_histogram_t **out)
{
	series_t *s;
	int rc = metrics_single(r, MFS_METRIC_HISTOGRAM, name, help, bounds, n_bounds, &s);
	if (!rc)
		*out = &s->s_u.h;
	return rc;
}

int mfs_metrics_add_hook(mfs_metrics_t *r, mfs_metrics_hook_fn fn, void *ctx)
{
	if (!r || !fn)
		return MFS_EINVAL;
	int rc = 0;
	pthread_mutex_lock(&r->m_lock);
	if (r->m_n_hooks == MAX_HOOKS) {
		rc = MFS_EFULL;
	} else {
		r->m_hooks[r->m_n_hooks].fn = fn;
		r->m_hooks[r->m_n_hooks++].ctx = ctx;
	}
	pthread_mutex_unlock(&r->m_lock);
	return rc;
}

void mfs_metrics_remove_hook(mfs_metrics_t *r, mfs_metrics_hook_fn fn, void *ctx)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->m_lock); /* hooks run under it: none is running past this */
	for (size_t j = 0; j < r->m_n_hooks; j++)
		if (r->m_hooks[j].fn == fn && r->m_hooks[j].ctx == ctx) {
			memmove(&r->m_hooks[j], &r->m_hooks[j + 1], (r->m_n_hooks - j - 1) * sizeof r->m_hooks[0]);
			r->m_n_hooks--;
			break;
		}
	pthread_mutex_unlock(&r->m_lock);
}

/* ---- rendering -------------------------------------------------------------------------- */
typedef struct sbuf {
	char *p;
	size_t len, cap;
	int oom;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (mfs_grow((void **)&b->p, &b->cap, b->len + n + 1, 1)) {
		b->oom = 1;
		return;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_str(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

/* HELP text: backslash and newline escaped. Label values: those and the double quote. */
static void sb_escaped(sbuf_t *b, const char *s, int quote)
{
	const char *run = s;
	for (; *s; s++) {
		const char *e = *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : (quote && *s == '"') ? "\\\"" : NULL;
		if (e) {
			sb_put(b, run, (size_t)(s - run));
			sb_put(b, e, 2);
			run = s + 1;
		}
	}
	sb_put(b, run, (size_t)(s - run));
}

/* Shortest text that reads back to the same double; NaN and the infinities as Prometheus
 * writes them. */
static void fmt_double(char *buf, size_t size, double v)
{
	if (isnan(v))
		snprintf(buf, size, "NaN");
	else if (isinf(v))
		snprintf(buf, size, v > 0 ? "+Inf" : "-Inf");
	else {
		snprintf(buf, size, "%.15g", v);
		if (strtod(buf, NULL) != v)
			snprintf(buf, size, "%.17g", v);
	}
}

/* {a="x",b="y"[,le="..."]}, or nothing when there are no labels at all. */
static void sb_labels(sbuf_t *b, const mfs_family_t *f, const series_t *s, const char *le)
{
	if (!f->f_n_labels && !le)
		return;
	sb_put(b, "{", 1);
	for (size_t i = 0; i < f->f_n_labels; i++) {
		if (i)
			sb_put(b, ",", 1);
		sb_str(b, f->f_labels[i]);
		sb_put(b, "=\"", 2);
		sb_escaped(b, s->s_values[i], 1);
		sb_put(b, "\"", 1);
	}
	if (le) {
		if (f->f_n_labels)
			sb_put(b, ",", 1);
		sb_put(b, "le=\"", 4);
		sb_str(b, le);
		sb_put(b, "\"", 1);
	}
	sb_put(b, "}", 1);
}

static void render_series(sbuf_t *b, const mfs_family_t *f, series_t *s)
{
	char num[64];
	switch (f->f_type) {
	case MFS_METRIC_COUNTER:
		sb_str(b, f->f_name);
		sb_labels(b, f, s, NULL);
		snprintf(num, sizeof num, " %" PRIu64 "\n", atomic_load_explicit(&s->s_u.c.v, memory_order_relaxed));
		sb_str(b, num);
		break;
	case MFS_METRIC_GAUGE:
		sb_str(b, f->f_name);
		sb_labels(b, f, s, NULL);
		sb_put(b, " ", 1);
		fmt_double(num, sizeof num, bitsd(atomic_load_explicit(&s->s_u.g.bits, memory_order_relaxed)));
		sb_str(b, num);
		sb_put(b, "\n", 1);
		break;
	case MFS_METRIC_HISTOGRAM: {
		uint64_t cum = 0;
		char le[64];
		for (size_t i = 0; i <= f->f_nb; i++) {
			cum += atomic_load_explicit(&s->s_u.h.buckets[i], memory_order_relaxed);
			if (i < f->f_nb)
				fmt_double(le, sizeof le, f->f_bounds[i]);
			else
				snprintf(le, sizeof le, "+Inf");
			sb_str(b, f->f_name);
			sb_put(b, "_bucket", 7);
			sb_labels(b, f, s, le);
			snprintf(num, sizeof num, " %" PRIu64 "\n", cum);
			sb_str(b, num);
		}
		sb_str(b, f->f_name);
		sb_put(b, "_sum", 4);
		sb_labels(b, f, s, NULL);
		sb_put(b, " ", 1);
		fmt_double(num, sizeof num, bitsd(atomic_load_explicit(&s->s_u.h.sum_bits, memory_order_relaxed)));
		sb_str(b, num);
		sb_put(b, "\n", 1);
		sb_str(b, f->f_name);
		sb_put(b, "_count", 6);
		sb_labels(b, f, s, NULL);
		snprintf(num, sizeof num, " %" PRIu64 "\n", cum);
		sb_str(b, num);
		break;
	}
	}
}

int mfs_metrics_render(mfs_metrics_t *r, char **out, size_t *len)
{
	static const char *const type_name[] = {"counter", "gauge", "histogram"};
	if (!r || !out)
		return MFS_EINVAL;
	sbuf_t b = {0};
	pthread_mutex_lock(&r->m_lock);
	for (size_t i = 0; i < r->m_n_hooks; i++)
		r->m_hooks[i].fn(r, r->m_hooks[i].ctx);
	for (mfs_family_t *f = r->m_head; f; f = f->f_next) {
		sb_put(&b, "# HELP ", 7);
		sb_str(&b, f->f_name);
		sb_put(&b, " ", 1);
		sb_escaped(&b, f->f_help, 0);
		sb_put(&b, "\n# TYPE ", 8);
		sb_str(&b, f->f_name);
		sb_put(&b, " ", 1);
		sb_str(&b, type_name[f->f_type]);
		sb_put(&b, "\n", 1);
		for (series_t *s = f->f_head; s; s = s->s_next)
			if (s->s_visible)
				render_series(&b, f, s);
	}
	pthread_mutex_unlock(&r->m_lock);
	if (!b.oom && !b.p)
		sb_put(&b, "", 0);
	if (b.oom) {
		free(b.p);
		return ENOMEM;
	}
	*out = b.p;
	if (len)
		*len = b.len;
	return 0;
}
