/* test_http.c - /metrics, /healthz, /readyz on an ephemeral port, spoken to with a plain
 * socket client: status codes, content types, HEAD, 404/405, heartbeat staleness, readiness,
 * fatal, listen-address errors, and a clean close. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "ops/http.h"
#include "testhelp.h"

static char errstr[512];

typedef struct resp {
	int status;
	char head[4096]; /* status line + headers */
	char body[65536];
	size_t body_len;
} resp_t;

/* One HTTP/1.1 request with Connection: close; the whole answer read until EOF. */
static int request(int port, const char *raw, resp_t *r)
{
	memset(r, 0, sizeof *r);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct timeval tv = {5, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || write(fd, raw, strlen(raw)) != (ssize_t)strlen(raw)) {
		close(fd);
		return -1;
	}
	static char buf[sizeof r->head + sizeof r->body];
	size_t n = 0;
	ssize_t k;
	while (n < sizeof buf - 1 && (k = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
		n += (size_t)k;
	close(fd);
	buf[n] = '\0';
	char *sep = strstr(buf, "\r\n\r\n");
	if (!sep || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1)
		return -1;
	size_t hl = (size_t)(sep - buf) + 2;
	if (hl >= sizeof r->head)
		return -1;
	memcpy(r->head, buf, hl);
	r->body_len = n - hl - 2;
	memcpy(r->body, sep + 4, r->body_len);
	return 0;
}

static int get(int port, const char *method, const char *path, resp_t *r)
{
	char raw[512];
	snprintf(raw, sizeof raw, "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", method, path);
	return request(port, raw, r);
}

static const char *header(const resp_t *r, const char *name)
{
	static char v[256];
	char key[64];
	snprintf(key, sizeof key, "\r\n%s:", name);
	/* header names are case-insensitive: compare lower-cased copies */
	char low[sizeof r->head], lkey[64];
	size_t i;
	for (i = 0; r->head[i]; i++)
		low[i] = (char)tolower((unsigned char)r->head[i]);
	low[i] = '\0';
	for (i = 0; key[i]; i++)
		lkey[i] = (char)tolower((unsigned char)key[i]);
	lkey[i] = '\0';
	const char *p = strstr(low, lkey);
	if (!p)
		return NULL;
	p = r->head + (p - low) + strlen(lkey);
	while (*p == ' ')
		p++;
	size_t n = strcspn(p, "\r\n");
	if (n >= sizeof v)
		n = sizeof v - 1;
	memcpy(v, p, n);
	v[n] = '\0';
	return v;
}

static void sleep_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

static void test_endpoints(void)
{
	mfs_metrics_t *m;
	TEST_OK(mfs_metrics_init(&m));
	mfs_counter_t *c;
	TEST_OK(mfs_metrics_counter(m, "mfstream_test_total", "A test counter.", &c));
	mfs_counter_add(c, 7);
	mfs_http_t *h = NULL;
	mfs_http_opts_t o = {m, 500};
	int rc = mfs_http_open("127.0.0.1:0", &o, &h, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s", errstr);
	if (rc) {
		mfs_metrics_free(m);
		return;
	}
	int port = mfs_http_port(h);
	TEST_ASSERT(port > 0 && port < 65536);
	resp_t r;

	TEST_OK(get(port, "GET", "/metrics", &r));
	TEST_EQ_INT(r.status, 200);
	TEST_STR_EQ(header(&r, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
	TEST_ASSERT_MSG(strstr(r.body, "# TYPE mfstream_test_total counter\nmfstream_test_total 7\n"), "%s", r.body);
	char *text;
	size_t len;
	TEST_OK(mfs_metrics_render(m, &text, &len));
	TEST_EQ_INT(r.body_len, len);
	TEST_ASSERT(memcmp(r.body, text, len) == 0);
	free(text);
	/* a query string does not change the path */
	TEST_OK(get(port, "GET", "/metrics?name[]=x", &r));
	TEST_EQ_INT(r.status, 200);

	/* HEAD: the same headers, no body */
	TEST_OK(get(port, "HEAD", "/metrics", &r));
	TEST_EQ_INT(r.status, 200);
	TEST_EQ_INT(r.body_len, 0);
	TEST_ASSERT(header(&r, "Content-Type") && strstr(header(&r, "Content-Type"), "version=0.0.4"));

	TEST_OK(get(port, "GET", "/nope", &r));
	TEST_EQ_INT(r.status, 404);
	TEST_OK(get(port, "GET", "/metrics/", &r));
	TEST_EQ_INT(r.status, 404);
	TEST_OK(get(port, "POST", "/metrics", &r));
	TEST_EQ_INT(r.status, 405);
	TEST_ASSERT(header(&r, "Allow") && strcmp(header(&r, "Allow"), "GET, HEAD") == 0);
	TEST_OK(request(port, "POST /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello", &r));
	TEST_EQ_INT(r.status, 405);

	/* /healthz: 200 before the first heartbeat (startup), 200 while beating, 503 when stale */
	TEST_OK(get(port, "GET", "/healthz", &r));
	TEST_EQ_INT(r.status, 200);
	TEST_STR_EQ(r.body, "ok\n");
	mfs_http_heartbeat(h);
	TEST_OK(get(port, "GET", "/healthz", &r));
	TEST_EQ_INT(r.status, 200);
	sleep_ms(800); /* > healthz_stale_ms = 500 */
	TEST_OK(get(port, "GET", "/healthz", &r));
	TEST_EQ_INT(r.status, 503);
	TEST_ASSERT_MSG(strncmp(r.body, "stale: last heartbeat", 21) == 0, "%s", r.body);
	mfs_http_heartbeat(h);
	TEST_OK(get(port, "GET", "/healthz", &r));
	TEST_EQ_INT(r.status, 200);

	/* /readyz: 503 until ready, 200 after, 503 again when not ready or not live */
	TEST_OK(get(port, "GET", "/readyz", &r));
	TEST_EQ_INT(r.status, 503);
	TEST_STR_EQ(r.body, "not ready\n");
	mfs_http_set_ready(h, 1);
	TEST_OK(get(port, "GET", "/readyz", &r));
	TEST_EQ_INT(r.status, 200);
	TEST_STR_EQ(r.body, "ready\n");
	TEST_OK(get(port, "HEAD", "/readyz", &r));
	TEST_EQ_INT(r.status, 200);
	TEST_EQ_INT(r.body_len, 0);
	sleep_ms(800);
	TEST_OK(get(port, "GET", "/readyz", &r));
	TEST_EQ_INT(r.status, 503);
	mfs_http_heartbeat(h);
	TEST_OK(get(port, "GET", "/readyz", &r));
	TEST_EQ_INT(r.status, 200);

	/* fatal: both 503 for good, the first reason wins */
	mfs_http_set_fatal(h, "LMDB map full");
	mfs_http_set_fatal(h, "second");
	mfs_http_heartbeat(h);
	TEST_OK(get(port, "GET", "/healthz", &r));
	TEST_EQ_INT(r.status, 503);
	TEST_STR_EQ(r.body, "fatal: LMDB map full\n");
	TEST_OK(get(port, "GET", "/readyz", &r));
	TEST_EQ_INT(r.status, 503);

	/* the port is taken while we serve */
	mfs_http_t *h2 = NULL;
	char addr[64];
	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
	TEST_EQ_INT(mfs_http_open(addr, &o, &h2, errstr, sizeof errstr), EADDRINUSE);
	TEST_ASSERT_MSG(strstr(errstr, addr) && strstr(errstr, "bind"), "%s", errstr);
	TEST_ASSERT(h2 == NULL);

	/* clean close: the port is free again and nobody answers */
	mfs_http_close(h);
	TEST_ASSERT(get(port, "GET", "/healthz", &r) != 0);
	TEST_OK(mfs_http_open(addr, &o, &h2, errstr, sizeof errstr));
	TEST_EQ_INT(mfs_http_port(h2), port);
	mfs_http_close(h2);
	mfs_metrics_free(m);
}

static void test_no_registry_and_disabled(void)
{
	mfs_http_t *h = (mfs_http_t *)(uintptr_t)1; /* must become NULL */
	TEST_OK(mfs_http_open("", NULL, &h, errstr, sizeof errstr));
	TEST_ASSERT(h == NULL);
	TEST_OK(mfs_http_open(NULL, NULL, &h, errstr, sizeof errstr));
	TEST_ASSERT(h == NULL);
	/* every call accepts the disabled (NULL) server */
	mfs_http_heartbeat(NULL);
	mfs_http_set_ready(NULL, 1);
	mfs_http_set_fatal(NULL, "x");
	TEST_EQ_INT(mfs_http_port(NULL), 0);
	mfs_http_close(NULL);

	/* no registry: /metrics is 404, health still works; "localhost" resolves */
	TEST_OK(mfs_http_open("127.0.0.1:0", NULL, &h, errstr, sizeof errstr));
	resp_t r;
	TEST_OK(get(mfs_http_port(h), "GET", "/metrics", &r));
	TEST_EQ_INT(r.status, 404);
	TEST_OK(get(mfs_http_port(h), "GET", "/healthz", &r));
	TEST_EQ_INT(r.status, 200);
	mfs_http_close(h);
}

static void test_bad_addresses(void)
{
	static const char *const bad[] = {"9464", "127.0.0.1", ":9464", "127.0.0.1:", "127.0.0.1:65536",
	                                  "127.0.0.1:12a", "::1:9464", "[::1]9464", "[::1", "no.such.host.invalid:1",
	                                  "127.0.0.1:999999"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		mfs_http_t *h = NULL;
		errstr[0] = '\0';
		int rc = mfs_http_open(bad[i], NULL, &h, errstr, sizeof errstr);
		TEST_ASSERT_MSG(rc == MFS_ECONFIG, "%s: rc=%d (%s)", bad[i], rc, errstr);
		TEST_ASSERT_MSG(strstr(errstr, "metrics.listen") && strstr(errstr, bad[i]), "%s: %s", bad[i], errstr);
		TEST_ASSERT(h == NULL);
		mfs_http_close(h);
	}
	/* IPv6 loopback in brackets works where the host has IPv6 */
	mfs_http_t *h = NULL;
	int rc = mfs_http_open("[::1]:0", NULL, &h, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0 || rc == EADDRNOTAVAIL || rc == EAFNOSUPPORT, "rc=%d %s", rc, errstr);
	if (!rc)
		TEST_ASSERT(mfs_http_port(h) > 0);
	mfs_http_close(h);
}

int main(void)
{
#ifndef MFS_HAVE_MHD
	TEST_SKIP("built without libmicrohttpd");
#endif
	mfs_log_set_level(MFS_LOG_WARN);
	TEST_RUN(test_endpoints);
	TEST_RUN(test_no_registry_and_disabled);
	TEST_RUN(test_bad_addresses);
	return TEST_REPORT();
}
