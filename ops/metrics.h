/* metrics.h - a registry of Prometheus metrics: counters, gauges, histograms, labelled families,
 * rendered in the text exposition format 0.0.4 (what GET /metrics returns, ops/http.h).
 *
 *   mfs_metrics_t *r;            mfs_metrics_init(&r);
 *   mfs_counter_t *applied;      mfs_metrics_counter(r, "mfstream_events_applied_total", "help", &applied);
 *   mfs_family_t *lag;           mfs_metrics_family(r, MFS_METRIC_GAUGE, "mfstream_consumer_lag_messages", "help",
 *                                                   (const char *[]){"topic", "partition"}, 2, NULL, 0, &lag);
 *   mfs_gauge_t *p0;             mfs_family_gauge(lag, (const char *[]){"ratings", "0"}, &p0);
 *   hot path:                    mfs_counter_add(applied, n);  mfs_gauge_set(p0, 12);
 *
 * Updates are lock-free (one relaxed atomic RMW, a CAS loop for double adds) and safe from any
 * thread; keep the handles, they stay valid until mfs_metrics_free(). Registration, label-set
 * lookup/creation and rendering take the registry's (recursive) mutex. Series appear in
 * registration/creation order, so the output is deterministic.
 *
 * Thread safety: every function here may be called from any thread, except that
 * mfs_metrics_free() must come after every other use (close the HTTP server first).
 */
#ifndef MFS_METRICS_H
#define MFS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mfs_metrics mfs_metrics_t;     /* the registry */
typedef struct mfs_family mfs_family_t;       /* one metric name; its series differ by label values */
typedef struct mfs_counter mfs_counter_t;     /* a monotonic uint64 series */
typedef struct mfs_gauge mfs_gauge_t;         /* a double series that goes up and down */
typedef struct mfs_histogram mfs_histogram_t; /* fixed buckets + sum + count */

enum mfs_metric_type { MFS_METRIC_COUNTER = 0, MFS_METRIC_GAUGE, MFS_METRIC_HISTOGRAM };

/** Label sets one family may hold at most (a guard against unbounded label values). */
#define MFS_METRICS_MAX_SERIES 4096
/** Labels per family at most (histograms add "le" on top). */
#define MFS_METRICS_MAX_LABELS 8

/** A new, empty registry. @param[out] out @return 0 or ENOMEM. */
int mfs_metrics_init(mfs_metrics_t **out);
/** Free the registry and every handle it gave out. NULL is a no-op. */
void mfs_metrics_free(mfs_metrics_t *r);

/** Register an unlabelled metric (one series) and return its handle.
 *  name: [a-zA-Z_:][a-zA-Z0-9_:]*, unique in the registry; help: any text (escaped on output).
 *  Counter names should end in _total (not enforced).
 *  @return 0, MFS_EINVAL (bad or duplicate name, bad buckets), ENOMEM. */
int mfs_metrics_counter(mfs_metrics_t *r, const char *name, const char *help, mfs_counter_t **out);
int mfs_metrics_gauge(mfs_metrics_t *r, const char *name, const char *help, mfs_gauge_t **out);
/** @param[in] bounds bucket upper bounds, finite and strictly increasing (+Inf is implied);
 *  copied. @param[in] n_bounds 1..64 */
int mfs_metrics_histogram(mfs_metrics_t *r, const char *name, const char *help, const double *bounds,
                          size_t n_bounds, mfs_histogram_t **out);

/** Register a labelled family. Its series are created on first use of a label-value tuple.
 *  @param[in] type MFS_METRIC_COUNTER, _GAUGE or _HISTOGRAM
 *  @param[in] labels n_labels label names, [a-zA-Z_][a-zA-Z0-9_]*, not "__*", unique, and not
 *             "le" for histograms; copied. n_labels may be 0 (one series, empty tuple).
 *  @param[in] bounds, n_bounds histogram buckets (as mfs_metrics_histogram), else NULL, 0
 *  @return 0, MFS_EINVAL, ENOMEM. */
int mfs_metrics_family(mfs_metrics_t *r, int type, const char *name, const char *help, const char *const *labels,
                       size_t n_labels, const double *bounds, size_t n_bounds, mfs_family_t **out);

/** The series of a family for label values (n_labels strings, any bytes but NUL; escaped on
 *  output), created at zero if new. Takes the registry mutex: look up once, keep the handle.
 *  A removed series comes back (visible again, value kept).
 *  @return 0, MFS_EINVAL (NULL value, or the family has another type), MFS_EFULL (more than
 *  MFS_METRICS_MAX_SERIES series), ENOMEM. */
int mfs_family_counter(mfs_family_t *f, const char *const *values, mfs_counter_t **out);
int mfs_family_gauge(mfs_family_t *f, const char *const *values, mfs_gauge_t **out);
int mfs_family_histogram(mfs_family_t *f, const char *const *values, mfs_histogram_t **out);
/** Stop exporting one series (a revoked partition's lag). Its handle stays valid and keeps
 *  counting; the next mfs_family_* lookup of the same values shows it again.
 *  @return 0 or MFS_ENOTFOUND. */
int mfs_family_remove(mfs_family_t *f, const char *const *values);
/** mfs_family_remove for every series of the family. */
void mfs_family_remove_all(mfs_family_t *f);

/* ---- hot path: lock-free, any thread; a NULL handle is a no-op (metrics disabled) ---- */
void mfs_counter_add(mfs_counter_t *c, uint64_t n);
void mfs_counter_inc(mfs_counter_t *c);
/** Mirror an authoritative total kept elsewhere (e.g. restored from a snapshot). A counter
 *  must not go down except across a restart; this does not check. */
void mfs_counter_set(mfs_counter_t *c, uint64_t v);
uint64_t mfs_counter_get(const mfs_counter_t *c);
void mfs_gauge_set(mfs_gauge_t *g, double v);
void mfs_gauge_add(mfs_gauge_t *g, double d);
double mfs_gauge_get(const mfs_gauge_t *g);
/** Count v in the first bucket whose bound is >= v (+Inf if none). NaN is ignored. */
void mfs_histogram_observe(mfs_histogram_t *h, double v);
/** n observations of the same value v (a batch whose events share one latency). */
void mfs_histogram_observe_n(mfs_histogram_t *h, double v, uint64_t n);

/** A function run at the start of every render, under the registry mutex, on the thread that
 *  renders (the HTTP server's). Use it for values cheaper to compute on demand (snapshot age,
 *  memory in use). It may update any handle and look up or remove series (the mutex is
 *  recursive) but must not block for long: scrapes wait for it. Whatever it reads must be safe
 *  to read from that thread (atomics, or data under the caller's own lock). */
typedef void (*mfs_metrics_hook_fn)(mfs_metrics_t *r, void *ctx);
/** @return 0, or MFS_EFULL after 16 hooks. */
int mfs_metrics_add_hook(mfs_metrics_t *r, mfs_metrics_hook_fn fn, void *ctx);
/** Remove a hook added with the same fn and ctx; once this returns it is not running and
 *  will not run again (what it reads may go). */
void mfs_metrics_remove_hook(mfs_metrics_t *r, mfs_metrics_hook_fn fn, void *ctx);

/** Render every visible series in the text format 0.0.4 (# HELP, # TYPE, then samples; label
 *  values and help escaped; NaN, +Inf, -Inf spelled as Prometheus expects).
 *  @param[out] out a malloc'd, NUL-terminated text the caller frees
 *  @param[out] len its length (without the NUL); may be NULL
 *  @return 0 or ENOMEM. */
int mfs_metrics_render(mfs_metrics_t *r, char **out, size_t *len);

/** Content-Type of the rendered text. */
#define MFS_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#ifdef __cplusplus
}
#endif
#endif
