/* http.h - the operations endpoint: Prometheus /metrics, liveness /healthz, readiness /readyz.
 *
 *   GET /metrics  200, text/plain; version=0.0.4: mfs_metrics_render() of the registry
 *   GET /healthz  200 "ok" while the service loop beats (mfs_http_heartbeat); 503 when the last
 *                 beat is older than healthz_stale_ms or a fatal error was flagged
 *   GET /readyz   200 "ready" after mfs_http_set_ready(h, 1) (model loaded, partitions
 *                 assigned) and while /healthz would answer 200; else 503
 *   anything else 404; methods other than GET and HEAD 405 (HEAD: same headers, no body)
 *
 * libmicrohttpd serves it from four internal epoll threads, with room for 4,096 connections
 * and a 3 s idle timeout, so probes get through a flood of half-open connections (http.c,
 * docs/OPERATIONS.md); mfs_http_open raises the process's open-file soft limit for that room
 * where it must and can, and logs it. The setters below are lock-free atomics the service
 * calls from its own loop, and every one of them accepts NULL (the endpoint is
 * disabled), so the service calls them unconditionally.
 *
 * Before the first heartbeat /healthz answers 200 (a long snapshot load is startup, which
 * /readyz and a Kubernetes startupProbe cover, not a hang); after it, staleness counts.
 */
#ifndef MFS_HTTP_H
#define MFS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "ops/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mfs_http mfs_http_t;

typedef struct mfs_http_opts {
	mfs_metrics_t *metrics;   /* what /metrics renders (NULL: /metrics answers 404); not owned */
	int64_t healthz_stale_ms; /* heartbeat age that makes /healthz 503 (<= 0: never stale) */
} mfs_http_opts_t;

/** Start serving on addr (metrics.listen): "host:port" or "[v6addr]:port", host a literal
 *  address or a name ("127.0.0.1:9464", "0.0.0.0:9464", "localhost:0"; port 0 picks a free
 *  port, see mfs_http_port). An empty or NULL addr disables the endpoint: *out = NULL, 0.
 *  @param[in] o options (copied); the registry must outlive the server
 *  @param[out] out the server, or NULL when disabled
 *  @return 0; MFS_ECONFIG (malformed listen, unknown host); a positive errno from socket/bind/
 *  listen (EADDRINUSE, EACCES, ...); ENOMEM; ENOTSUP (built without libmicrohttpd) or
 *  MFS_EINVAL (libmicrohttpd refused to start). errstr names the address and the cause. */
int mfs_http_open(const char *addr, const mfs_http_opts_t *o, mfs_http_t **out, char *errstr, size_t errstr_size);
/** Stop accepting, finish or drop requests in flight, join the thread, free. NULL is a no-op.
 *  After it returns no callback (render, hooks) runs any more. */
void mfs_http_close(mfs_http_t *h);
/** The TCP port actually bound (the answer for port 0), or 0 for NULL. */
int mfs_http_port(const mfs_http_t *h);

/** The service loop is alive: call it every iteration (cheap: one clock read and a store). */
void mfs_http_heartbeat(mfs_http_t *h);
/** Ready (1) or not (0): the model is loaded and partitions are assigned. */
void mfs_http_set_ready(mfs_http_t *h, int ready);
/** A fatal error: /healthz and /readyz answer 503 from now on, with reason (the first one
 *  flagged wins). The orchestrator then restarts us. */
void mfs_http_set_fatal(mfs_http_t *h, const char *reason);

#ifdef __cplusplus
}
#endif
#endif
