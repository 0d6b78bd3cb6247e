/* http.c - /metrics, /healthz and /readyz over libmicrohttpd (see http.h).
 *
 * DESIGN: we create, bind and listen on the socket ourselves (exact errno for "address in
 * use", and getsockname() answers the port-0 question) and hand it to libmicrohttpd, which
 * owns it from then on and closes it in MHD_stop_daemon(). MHD runs a small pool of
 * internal threads (HTTP_THREADS), each with its own epoll set, all accepting from the one
 * non-blocking listen socket and calling on_request(); renders on two workers serialize on the
 * registry mutex, and a worker held up by a slow render hook leaves the others to accept and
 * answer probes. Health state is three atomics the service writes and the workers read; the
 * fatal reason is written once under a mutex before the flag is raised (release) and read
 * after the flag is seen (acquire).
 *
 * Floods (issue 16): a liveness probe must get through while one client holds many
 * connections open without finishing a request, and the probes may come from that very
 * address (a node's kubelet, a sidecar), so a per-IP limit would lock them out with the flood.
 * What carries them is room and a short idle timeout: up to HTTP_CONN_MAX connections (in
 * epoll an idle one costs a descriptor and a little pool memory, no work), a listen backlog as
 * deep, and HTTP_IDLE_S, after which MHD closes a connection that has sent or read nothing.
 * A flood beyond the room waits in the backlog until the timeout frees a slot: probes then
 * take up to HTTP_IDLE_S, never forever.
 *
 * Without libmicrohttpd (MFS_HAVE_MHD undefined) mfs_http_open() fails with ENOTSUP unless
 * the endpoint is disabled, so a build that lacks it cannot silently run without metrics.
 */
#include "ops/http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef MFS_HAVE_MHD
#include <microhttpd.h>
#endif

#include "common/err.h"
#include "common/log.h"

struct mfs_http {
#ifdef MFS_HAVE_MHD
	struct MHD_Daemon *h_daemon;
#endif
	mfs_metrics_t *h_metrics;
	int64_t h_stale_ms;
	int h_port;
	_Atomic int64_t h_beat_ms; /* monotonic ms of the last heartbeat; 0 = none yet */
	_Atomic int h_ready;
	_Atomic int h_fatal;
	pthread_mutex_t h_lock; /* h_reason */
	char h_reason[256];
	mfs_log_rl_t h_log_rl;
};

static int64_t mono_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- health state: lock-free setters, NULL-safe ----------------------------------------- */
void mfs_http_heartbeat(mfs_http_t *h)
{
	if (h) {
		int64_t now = mono_ms();
		atomic_store_explicit(&h->h_beat_ms, now > 0 ? now : 1, memory_order_relaxed);
	}
}

void mfs_http_set_ready(mfs_http_t *h, int ready)
{
	if (h)
		atomic_store_explicit(&h->h_ready, ready ? 1 : 0, memory_order_relaxed);
}

void mfs_http_set_fatal(mfs_http_t *h, const char *reason)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->h_lock);
	if (!atomic_load_explicit(&h->h_fatal, memory_order_relaxed)) {
		snprintf(h->h_reason, sizeof h->h_reason, "%s", reason && *reason ? reason : "fatal error");
		atomic_store_explicit(&h->h_fatal, 1, memory_order_release);
	}
	pthread_mutex_unlock(&h->h_lock);
}

int mfs_http_port(const mfs_http_t *h) { return h ? h->h_port : 0; }

#ifdef MFS_HAVE_MHD
enum {
	HTTP_CONN_MAX = 4096,   /* connections held at once, all clients together (and the listen backlog) */
	HTTP_IDLE_S = 3,        /* idle seconds (no byte either way) before MHD closes a connection */
	HTTP_THREADS = 4,       /* MHD workers: one stuck in a render hook leaves three to answer probes */
	HTTP_FD_RESERVE = 1024, /* descriptors kept for the rest of the process (LMDB, Kafka, logs) */
};

/* ---- capacity ------------------------------------------------------------------------------ */
/* How many connections the open-file limit leaves room for. A soft limit of 1024 (the common
 * default) would cap the server well below HTTP_CONN_MAX, so it is raised first: to what the
 * server needs plus the reserve, as far as the hard limit allows. Not to the hard limit itself:
 * in containers that can be 2^20 or more, which code that walks every descriptor number (a
 * close-all before exec) pays for, and nothing here needs it. Process-wide, idempotent. */
static unsigned http_conn_limit(void)
{
	const rlim_t want = (rlim_t)HTTP_CONN_MAX + HTTP_FD_RESERVE;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
		mfs_warn("http", "msg=\"getrlimit(RLIMIT_NOFILE) failed, keeping 64 connections\" err=\"%s\"",
		         strerror(errno));
		return 64;
	}
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want &&
	    (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > rl.rlim_cur)) {
		struct rlimit nl = {rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want, rl.rlim_max};
		if (setrlimit(RLIMIT_NOFILE, &nl) == 0) {
			mfs_info("http", "msg=\"raised the open-file soft limit for the HTTP server\" nofile_from=%llu "
			         "nofile_to=%llu nofile_hard=%llu", (unsigned long long)rl.rlim_cur,
			         (unsigned long long)nl.rlim_cur, (unsigned long long)rl.rlim_max);
			rl.rlim_cur = nl.rlim_cur;
		} else {
			mfs_warn("http", "msg=\"could not raise the open-file soft limit\" nofile=%llu want=%llu err=\"%s\"",
			         (unsigned long long)rl.rlim_cur, (unsigned long long)want, strerror(errno));
		}
	}
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want)
		return HTTP_CONN_MAX;
	/* short of the hard limit: share what there is, at least half for the rest of the process */
	rlim_t n = rl.rlim_cur > 2 * HTTP_FD_RESERVE ? rl.rlim_cur - HTTP_FD_RESERVE : rl.rlim_cur / 2;
	if (n < 64)
		n = 64;
	mfs_warn("http", "msg=\"the open-file limit caps HTTP connections: a flood fills them sooner\" nofile=%llu "
	         "connections=%llu want_nofile=%llu", (unsigned long long)rl.rlim_cur, (unsigned long long)n,
	         (unsigned long long)want);
	return (unsigned)n;
}

/* /healthz: 0 and "ok", or 1 and why not into buf. */
static int health_check(mfs_http_t *h, char *buf, size_t size)
{
	if (atomic_load_explicit(&h->h_fatal, memory_order_acquire)) {
		pthread_mutex_lock(&h->h_lock);
		snprintf(buf, size, "fatal: %s\n", h->h_reason);
		pthread_mutex_unlock(&h->h_lock);
		return 1;
	}
	int64_t beat = atomic_load_explicit(&h->h_beat_ms, memory_order_relaxed);
	if (h->h_stale_ms > 0 && beat) {
		int64_t age = mono_ms() - beat;
		if (age > h->h_stale_ms) {
			snprintf(buf, size, "stale: last heartbeat %lld ms ago (limit %lld ms)\n", (long long)age,
			         (long long)h->h_stale_ms);
			return 1;
		}
	}
	snprintf(buf, size, "ok\n");
	return 0;
}

/* ---- listen address ----------------------------------------------------------------------- */
/* "host:port" or "[v6]:port" -> host, port text. */
static int split_listen(const char *addr, char *host, size_t hs, char *port, size_t ps, char *errstr, size_t es)
{
	const char *colon, *hb = addr, *he;
	if (*addr == '[') {
		hb = addr + 1;
		he = strchr(hb, ']');
		if (!he || he[1] != ':')
			return mfs_errf(errstr, es, MFS_ECONFIG, "metrics.listen \"%s\": expected [address]:port", addr);
		colon = he + 1;
	} else {
		colon = strrchr(addr, ':');
		if (!colon)
			return mfs_errf(errstr, es, MFS_ECONFIG, "metrics.listen \"%s\": expected host:port (127.0.0.1:9464)",
			                addr);
		he = colon;
		if (memchr(addr, ':', (size_t)(colon - addr)))
			return mfs_errf(errstr, es, MFS_ECONFIG,
			                "metrics.listen \"%s\": an IPv6 address needs brackets ([::1]:9464)", addr);
	}
	size_t hl = (size_t)(he - hb);
	const char *pt = colon + 1;
	size_t pl = strlen(pt);
	if (hl == 0 || hl >= hs)
		return mfs_errf(errstr, es, MFS_ECONFIG, "metrics.listen \"%s\": missing or too long host (0.0.0.0 = every "
		                "interface)", addr);
	long v = 0;
	for (size_t i = 0; i < pl; i++) {
		if (pt[i] < '0' || pt[i] > '9' || i >= 5) {
			v = -1;
			break;
		}
		v = v * 10 + (pt[i] - '0');
	}
	if (pl == 0 || pl >= ps || v < 0 || v > 65535)
		return mfs_errf(errstr, es, MFS_ECONFIG, "metrics.listen \"%s\": port must be 0..65535", addr);
	memcpy(host, hb, hl);
	host[hl] = '\0';
	memcpy(port, pt, pl + 1);
	return 0;
}

/* A listening TCP socket on the first address of host:port that binds. */
static int listen_socket(const char *addr, int *fd_out, int *port_out, int *v6_out, char *errstr, size_t es)
{
	char host[128], port[8];
	int rc = split_listen(addr, host, sizeof host, port, sizeof port, errstr, es);
	if (rc)
		return rc;
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
	int g = getaddrinfo(host, port, &hints, &res);
	if (g)
		return mfs_errf(errstr, es, MFS_ECONFIG, "metrics.listen \"%s\": %s", addr, gai_strerror(g));
	rc = EADDRNOTAVAIL;
	const char *what = "bind";
	for (struct addrinfo *a = res; a; a = a->ai_next) {
		/* non-blocking: HTTP_THREADS workers race to accept one connection, the losers must
		 * return at once (MHD sets it too; this says so where the socket is made) */
		int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
		if (fd < 0) {
			rc = errno, what = "socket";
			continue;
		}
		int one = 1;
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
			rc = errno, what = "bind";
			close(fd);
			continue;
		}
		/* a burst of connects lands in the backlog, not in SYN retries (1 s, 3 s, ...) that
		 * would alone blow a probe's timeout; the kernel clamps it to net.core.somaxconn */
		if (listen(fd, HTTP_CONN_MAX) != 0) {
			rc = errno, what = "listen";
			close(fd);
			continue;
		}
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
			rc = errno, what = "getsockname";
			close(fd);
			continue;
		}
		*port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
		                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
		*v6_out = ss.ss_family == AF_INET6;
		*fd_out = fd;
		freeaddrinfo(res);
		return 0;
	}
	freeaddrinfo(res);
	return mfs_errf(errstr, es, rc, "metrics.listen \"%s\": %s: %s", addr, what, strerror(rc));
}

/* ---- requests ------------------------------------------------------------------------------ */
static void mhd_free(void *p) { free(p); }

/* Queue status + body (malloc'd, taken over; NULL = out of memory). */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *body, size_t len, const char *ctype,
                             int allow)
{
	if (!body)
		return MHD_NO; /* out of memory: MHD closes the connection */
	struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, body, mhd_free);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status, const char *text, int allow)
{
	char *b = strdup(text);
	return reply(c, status, b, b ? strlen(b) : 0, "text/plain; charset=utf-8", allow);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
	mfs_http_t *h = cls;
	if (*req_cls) { /* a body sent after we answered: drop it */
		*upload_data_size = 0;
		return MHD_YES;
	}
	*req_cls = h;
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", 1);
	char buf[384];
	if (strcmp(url, "/metrics") == 0 && h->h_metrics) {
		char *text = NULL;
		size_t len = 0;
		int rc = mfs_metrics_render(h->h_metrics, &text, &len);
		if (rc) {
			mfs_log_ratelimited(&h->h_log_rl, 10000, MFS_LOG_WARN, "http", "msg=\"metrics render failed\" err=\"%s\"",
			                    mfs_strerror(rc));
			return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "render failed\n", 0);
		}
		return reply(c, MHD_HTTP_OK, text, len, MFS_METRICS_CONTENT_TYPE, 0);
	}
	if (strcmp(url, "/healthz") == 0) {
		int bad = health_check(h, buf, sizeof buf);
		return reply_text(c, bad ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK, buf, 0);
	}
	if (strcmp(url, "/readyz") == 0) {
		int bad = health_check(h, buf, sizeof buf);
		if (!bad && !atomic_load_explicit(&h->h_ready, memory_order_relaxed))
			bad = 1, snprintf(buf, sizeof buf, "not ready\n");
		else if (!bad)
			snprintf(buf, sizeof buf, "ready\n");
		return reply_text(c, bad ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK, buf, 0);
	}
	return reply_text(c, MHD_HTTP_NOT_FOUND, "not found (try /metrics, /healthz, /readyz)\n", 0);
}

/* libmicrohttpd's own complaints (a client that misbehaves): logged, rate-limited. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	mfs_http_t *h = cls;
	char m[256], q[300];
	vsnprintf(m, sizeof m, fmt, ap);
	size_t n = strlen(m);
	while (n && (m[n - 1] == '\n' || m[n - 1] == ' '))
		m[--n] = '\0';
	mfs_log_ratelimited(&h->h_log_rl, 10000, MFS_LOG_WARN, "http", "msg=libmicrohttpd detail=%s",
	                    mfs_log_quote(q, sizeof q, m));
}
#endif /* MFS_HAVE_MHD */

static void http_free(mfs_http_t *h)
{
	pthread_mutex_destroy(&h->h_lock);
	free(h);
}

int mfs_http_open(const char *addr, const mfs_http_opts_t *o, mfs_http_t **out, char *errstr, size_t es)
{
	if (!out)
		return MFS_EINVAL;
	*out = NULL;
	if (!addr || !*addr)
		return 0; /* disabled */
#ifndef MFS_HAVE_MHD
	(void)o;
	return mfs_errf(errstr, es, ENOTSUP, "metrics.listen \"%s\": built without libmicrohttpd (set metrics.listen "
	                "to \"\" to run without /metrics)", addr);
#else
	mfs_http_t *h = calloc(1, sizeof *h);
	if (!h)
		return mfs_errf(errstr, es, ENOMEM, "out of memory");
	if (pthread_mutex_init(&h->h_lock, NULL)) {
		free(h);
		return mfs_errf(errstr, es, ENOMEM, "out of memory");
	}
	h->h_metrics = o ? o->metrics : NULL;
	h->h_stale_ms = o ? o->healthz_stale_ms : 0;
	int fd = -1, v6 = 0;
	int rc = listen_socket(addr, &fd, &h->h_port, &v6, errstr, es);
	if (rc) {
		http_free(h);
		return rc;
	}
	/* MHD owns fd from here: it closes it in MHD_stop_daemon(). Whether a failed start closes
	 * it is not documented, so then we leave it alone (at worst one fd leaks on a path that
	 * ends the process).
	 *
	 * Epoll, not MHD_USE_AUTO: HTTP_CONN_MAX relies on it (poll() walks every connection on
	 * each wakeup, select() stops at FD_SETSIZE = 1024). MHD splits the connection limit
	 * evenly among the workers; one at its share stops accepting and the others go on. */
	unsigned conn_limit = http_conn_limit();
	unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	h->h_daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h,
	                               MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_THREADS,
	                               MHD_OPTION_CONNECTION_LIMIT, conn_limit, MHD_OPTION_CONNECTION_TIMEOUT,
	                               (unsigned)HTTP_IDLE_S, MHD_OPTION_END);
	if (!h->h_daemon) {
		http_free(h);
		return mfs_errf(errstr, es, MFS_EINVAL, "metrics.listen \"%s\": libmicrohttpd did not start", addr);
	}
	mfs_info("http", "msg=\"serving /metrics /healthz /readyz\" listen=%s port=%d threads=%d max_connections=%u "
	         "idle_timeout_s=%d", addr, h->h_port, HTTP_THREADS, conn_limit, HTTP_IDLE_S);
	*out = h;
	return 0;
#endif
}

void mfs_http_close(mfs_http_t *h)
{
	if (!h)
		return;
#ifdef MFS_HAVE_MHD
	if (h->h_daemon)
		MHD_stop_daemon(h->h_daemon);
#endif
	http_free(h);
}
