/* test_http_flood.c - issue 16, item 5: /healthz and /readyz answer within 1 s while one
 * address holds 1,000 connections that never finish a request (a slowloris, or a broken
 * client), and the probes come from that same address (127.0.0.1), so no per-IP limit can
 * tell them apart: what has to carry them is the server's room and its idle timeout.
 *
 * The server runs in this process (mfs_http_open), so /proc/self/fd shows both ends of every
 * connection: the test waits until the server has accepted the whole flood (a condition, not
 * a sleep) before it probes, checks after the probes that it still holds all of it, then
 * stops feeding the flood and waits for the idle timeout to drop it. The 1 s per probe is the
 * acceptance itself (a kubelet probe with timeoutSeconds: 1), so it stays a hard bound.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "ops/http.h"
#include "testhelp.h"

#define FLOOD_MAX 1000
#define PROBE_BUDGET_MS 1000 /* the acceptance: every probe answered within 1 s */
#define WAIT_MS 60000        /* generous bound for conditions on a loaded 2-core machine */

static char errstr[512];
static int flood[FLOOD_MAX];

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

/* Descriptors open in this process: both ends of each flood connection are ours. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the DIR's own descriptor */
}

static int flood_trickle(int n);

/* Poll count_fds() until it reaches (at_least) or falls to (!at_least) target, or WAIT_MS.
 * keep_alive > 0: feed that many flood connections every 500 ms meanwhile, so that the ones
 * accepted first are not timed out while a loaded machine is slow to accept the rest. */
static int wait_fds(int target, int at_least, int keep_alive)
{
	int64_t end = now_ms() + WAIT_MS, fed = now_ms();
	int n;
	while ((n = count_fds()) >= 0 && (at_least ? n < target : n > target) && now_ms() < end) {
		sleep_ms(10);
		if (keep_alive > 0 && now_ms() - fed >= 500) {
			(void)flood_trickle(keep_alive);
			fed = now_ms();
		}
	}
	return n;
}

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

/* One flood connection: a request line and a header, never the blank line that ends it.
 * Blocking connect, but bounded: a server that stops accepting fills the listen backlog and
 * the kernel then drops our SYNs, which would otherwise stall the test for minutes. */
static int flood_one(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct timeval tv = {5, 0};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	struct sockaddr_in a = loopback(port);
	static const char part[] = "GET /healthz HTTP/1.1\r\nHost: flood\r\n";
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    send(fd, part, sizeof part - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof part - 1)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* One more header line on every flood connection: activity resets the server's idle timer,
 * so the server holds the whole flood through the probes however slow this machine is (a
 * slowloris does the same; the timeout alone cannot shed it, only room can). @return how
 * many writes failed (a connection the server dropped). */
static int flood_trickle(int n)
{
	static const char more[] = "X-Flood: 1\r\n";
	int bad = 0;
	for (int i = 0; i < n; i++)
		bad += send(flood[i], more, sizeof more - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof more - 1);
	return bad;
}

/* GET path with Connection: close, the whole answer read, all within PROBE_BUDGET_MS from the
 * first syscall. @return 0 with status, body and ms filled; -1 on timeout or a broken answer. */
static int probe(int port, const char *path, int *status, char *body, size_t bs, int64_t *ms)
{
	int64_t t0 = now_ms(), end = t0 + PROBE_BUDGET_MS;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = loopback(port);
	char buf[4096], req[256];
	size_t n = 0;
	int ok = -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS)
		goto out;
	struct pollfd p = {fd, POLLOUT, 0};
	if (poll(&p, 1, (int)(end - now_ms())) != 1)
		goto out;
	int err = 0;
	socklen_t el = sizeof err;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err)
		goto out;
	int rl = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", path);
	if (send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl)
		goto out;
	for (;;) {
		int64_t left = end - now_ms();
		p.events = POLLIN;
		if (left <= 0 || poll(&p, 1, (int)left) != 1)
			goto out;
		ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
		if (k == 0)
			break;
		if (k < 0 && errno != EAGAIN)
			goto out;
		if (k > 0 && (n += (size_t)k) == sizeof buf - 1)
			goto out;
	}
	buf[n] = '\0';
	char *sep = strstr(buf, "\r\n\r\n");
	if (sep && sscanf(buf, "HTTP/1.%*d %d", status) == 1) {
		snprintf(body, bs, "%s", sep + 4);
		ok = 0;
	}
out:
	*ms = now_ms() - t0;
	close(fd);
	return ok;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static void test_probes_through_flood(void)
{
	mfs_http_t *h = NULL;
	mfs_http_opts_t o = {NULL, 0};
	int rc = mfs_http_open("127.0.0.1:0", &o, &h, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s", errstr);
	if (rc)
		return;
	int port = mfs_http_port(h);

	/* Both ends of each connection live in this process: 2 descriptors per flood connection,
	 * with room kept for the probes and the rest. mfs_http_open has already raised the soft
	 * limit as far as the server needs (and the hard limit allows). */
	struct rlimit rl;
	TEST_OK(getrlimit(RLIMIT_NOFILE, &rl));
	long room = rl.rlim_cur == RLIM_INFINITY ? FLOOD_MAX : ((long)rl.rlim_cur - 256) / 2;
	int n = room < FLOOD_MAX ? (int)(room > 0 ? room : 0) : FLOOD_MAX;
	if (n < 100) { /* no flood worth the name: say so rather than pass on nothing */
		mfs_http_close(h);
		TEST_SKIP("RLIMIT_NOFILE %llu leaves room for only %d flood connections", (unsigned long long)rl.rlim_cur, n);
	}
	if (n < FLOOD_MAX)
		fprintf(stderr, "flood lowered to %d connections: RLIMIT_NOFILE soft limit %llu\n", n,
		        (unsigned long long)rl.rlim_cur);

	int base = count_fds();
	int opened = 0;
	int64_t t0 = now_ms();
	while (opened < n && (flood[opened] = flood_one(port)) >= 0)
		opened++;
	TEST_ASSERT_MSG(opened == n, "only %d of %d flood connections opened: the server stopped accepting", opened,
	                n);
	/* the server holds the flood once it has accepted every connection: 2 descriptors each */
	int fds = wait_fds(base + 2 * opened, 1, opened);
	TEST_ASSERT_MSG(fds >= base + 2 * opened, "server holds %d of %d flood connections",
	                fds - base - opened > 0 ? fds - base - opened : 0, opened);
	fprintf(stderr, "flood: %d half-open connections from 127.0.0.1, held by the server after %lld ms "
	        "(RLIMIT_NOFILE %llu)\n", opened, (long long)(now_ms() - t0), (unsigned long long)rl.rlim_cur);

	/* 20 /healthz (200 ok) and 20 /readyz: 10 before ready (503), 10 after (200) */
	int64_t lat[40];
	int answered = 0, within = 0, trickle_bad = 0;
	for (int i = 0; i < 40; i++) {
		trickle_bad += flood_trickle(opened);
		int readyz = i & 1;
		if (readyz && i == 21)
			mfs_http_set_ready(h, 1);
		int status = 0;
		char body[256] = "";
		int prc = probe(port, readyz ? "/readyz" : "/healthz", &status, body, sizeof body, &lat[i]);
		answered += prc == 0;
		within += prc == 0 && lat[i] <= PROBE_BUDGET_MS;
		TEST_ASSERT_MSG(prc == 0 && lat[i] <= PROBE_BUDGET_MS, "probe %d %s: no answer within %d ms (%lld ms)", i,
		                readyz ? "/readyz" : "/healthz", PROBE_BUDGET_MS, (long long)lat[i]);
		if (prc)
			continue;
		if (!readyz) {
			TEST_EQ_INT(status, 200);
			TEST_STR_EQ(body, "ok\n");
		} else if (i < 21) {
			TEST_EQ_INT(status, 503);
			TEST_STR_EQ(body, "not ready\n");
		} else {
			TEST_EQ_INT(status, 200);
			TEST_STR_EQ(body, "ready\n");
		}
	}
	/* the probes went through a flood the server was really holding, not one it had shed */
	TEST_EQ_INT(trickle_bad, 0);
	fds = count_fds();
	TEST_ASSERT_MSG(fds >= base + 2 * opened, "server dropped %d flood connections during the probes",
	                base + 2 * opened - fds);
	int64_t sorted[40];
	memcpy(sorted, lat, sizeof sorted);
	qsort(sorted, 40, sizeof sorted[0], cmp_i64);
	fprintf(stderr, "probes: 40 (20 /healthz, 20 /readyz), %d answered, %d within %d ms; latency median %lld ms, "
	        "max %lld ms\n", answered, within, PROBE_BUDGET_MS, (long long)sorted[20], (long long)sorted[39]);

	/* Left idle, the flood is dropped by the server's idle timeout: every connection reads EOF
	 * (or a reset) and the server's descriptors go back. */
	t0 = now_ms();
	fds = wait_fds(base + opened, 0, 0);
	TEST_ASSERT_MSG(fds <= base + opened, "server still holds %d idle flood connections after %d ms",
	                fds - base - opened, WAIT_MS);
	int eof = 0;
	for (int i = 0; i < opened; i++) {
		char c;
		struct pollfd p = {flood[i], POLLIN, 0};
		eof += poll(&p, 1, 0) == 1 && recv(flood[i], &c, 1, MSG_DONTWAIT) <= 0;
	}
	TEST_EQ_INT(eof, opened);
	fprintf(stderr, "idle flood dropped by the server after %lld ms\n", (long long)(now_ms() - t0));
	for (int i = 0; i < opened; i++)
		close(flood[i]);

	/* and the server still answers */
	int status = 0;
	char body[256];
	int64_t ms;
	TEST_OK(probe(port, "/healthz", &status, body, sizeof body, &ms));
	TEST_EQ_INT(status, 200);
	mfs_http_close(h);
}

int main(void)
{
	TEST_RUN(test_probes_through_flood);
	return TEST_REPORT();
}
