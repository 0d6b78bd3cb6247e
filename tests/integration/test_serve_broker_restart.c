/* test_serve_broker_restart.c - a real Kafka broker killed under `mfstream serve` (kill -9 of
 * the broker process, as a crashed or rebooted node), and one down past the group session
 * timeout. The broker is the test's own (ctest label kafka; it skips with exit 77 where
 * ../shared/kafka or Java is missing), so killing it disturbs no other test.
 *
 * 1. While serve consumes a backlog, the broker is killed and restarted (same data, same port):
 *    serve keeps running, rejoins, and applies every event exactly once; every snapshot sampled
 *    meanwhile satisfies the invariant of test_serve_kill9 (applied + held out, digest and
 *    rating sum == the topic below its offsets); more events produced after the restart are
 *    applied too.
 * 2. The broker is killed and stays down longer than kafka.session.timeout.ms: serve loses its
 *    group session (partitions revoked as lost) and keeps serving its last snapshot; when the
 *    broker comes back it rejoins and applies what was produced since. Then the broker goes
 *    down once more and serve is stopped with SIGTERM: it exits 0 within 60 s, with the final
 *    snapshot published (the offsets in it cover everything applied), though no offset can be
 *    committed to the broker. (About one such shutdown in six, librdkafka 2.0's rd_kafka_destroy
 *    never returns with the broker gone; serve.kafka_close_ms, here 5 s, bounds the wait, and
 *    serve.stop_deadline_ms the whole stop.) While the session is lost /readyz is 503 (nothing
 *    assigned) and /healthz 200; once reassigned /readyz is 200 again.
 */
#include "serve_help.h"

#define N_PARTS 4
#define MAX_SAMPLES 4096

static sh_snap_t samples[MAX_SAMPLES];
static int n_samples;

static void sample(const sh_snap_t *s)
{
	if (s->found && n_samples < MAX_SAMPLES)
		samples[n_samples++] = *s;
}

/* Sample snapshots until events + held out >= want (or the child dies, or timeout_s, scaled). */
static sh_snap_t sample_until(const char *snap, pid_t pid, uint64_t want, double timeout_s, int *died)
{
	double end = mfs_now_s() + test_seconds(timeout_s);
	sh_snap_t s;
	*died = 0;
	for (;;) {
		s = sh_read(snap);
		sample(&s);
		if ((s.found && s.events + s.held_out >= want) || mfs_now_s() > end)
			return s;
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			*died = 1;
			return s;
		}
		nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	}
}

static void test_broker_restart(void)
{
	const char *dir = test_tmpdir();
	char bdir[400], bs[128], topic[160], snap[420], log[420];
	snprintf(bdir, sizeof bdir, "%s/broker", dir);
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(log, sizeof log, "%s/serve.log", dir);
	if (sh_own_broker(bdir, bs, sizeof bs))
		return;
	snprintf(topic, sizeof topic, "ratings-restart");
	if (sh_real_create_topic(bs, topic, N_PARTS)) {
		sh_own_broker_do(bdir, "wipe");
		return;
	}
	const char *const extra[] = {"--serve.holdout_fraction", "0.05", "--serve.fullpass_ms", "200",
	                             "--serve.kafka_close_ms", "5000", NULL};
	uint64_t total = sh_produce_valid(bs, topic, 200000, 31);
	sh_produce_bad(bs, topic, N_PARTS);
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-restart", log, NULL, extra);
	int died;

	/* 1: kill -9 the broker while serve has applied part of the backlog, then restart it */
	sh_snap_t s = sample_until(snap, pid, total / 4, 120, &died);
	TEST_ASSERT_MSG(!died && s.events + s.held_out >= total / 4, "serve applied %" PRIu64 " of %" PRIu64 " (log %s)",
	                s.events + s.held_out, total, log);
	int brc = sh_own_broker_do(bdir, "kill");
	TEST_EQ_INT(brc, 0);
	brc = sh_own_broker_do(bdir, "restart");
	TEST_EQ_INT(brc, 0);
	total += sh_produce_valid(bs, topic, 50000, 32);
	s = sample_until(snap, pid, total, 180, &died);
	TEST_ASSERT_MSG(!died, "serve died (log %s)", log);
	TEST_ASSERT_MSG(s.events + s.held_out == total, "after the broker's restart: %" PRIu64 " of %" PRIu64 " (log %s)",
	                s.events + s.held_out, total, log);

	/* 2: down past the session timeout (sh_spawn: 6 s), back up, more events */
	brc = sh_own_broker_do(bdir, "kill");
	TEST_EQ_INT(brc, 0);
	double end = mfs_now_s() + test_seconds(60);
	while (sh_log_count(log, "lost=1") == 0 && mfs_now_s() < end)
		nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
	TEST_ASSERT_MSG(sh_log_count(log, "lost=1") > 0, "no lost assignment logged within %.0f s (log %s)", test_seconds(60), log);
	TEST_ASSERT_MSG(waitpid(pid, NULL, WNOHANG) == 0, "serve exited while the broker was down (log %s)", log);
	/* nothing assigned: not ready, yet alive (it serves its last snapshot) */
	char body[4096];
	const int port = sh_logged_port(log);
	int ready = 0, alive;
	for (double until = mfs_now_s() + test_seconds(30); mfs_now_s() < until; nanosleep(&(struct timespec){0, 50000000}, NULL))
		if ((ready = sh_http_get(port, "/readyz", body, sizeof body)) == 503)
			break; /* (the revoke's snapshot comes first) */
	alive = sh_http_get(port, "/healthz", body, sizeof body);
	TEST_ASSERT_MSG(ready == 503 && alive == 200, "session lost: /readyz %d (want 503), /healthz %d (want 200)", ready,
	                alive);
	brc = sh_own_broker_do(bdir, "restart");
	TEST_EQ_INT(brc, 0);
	total += sh_produce_valid(bs, topic, 50000, 33);
	s = sample_until(snap, pid, total, 180, &died);
	TEST_ASSERT_MSG(!died, "serve died (log %s)", log);
	TEST_ASSERT_MSG(s.events + s.held_out == total, "after the session was lost: %" PRIu64 " of %" PRIu64 " (log %s)",
	                s.events + s.held_out, total, log);
	ready = sh_http_get(port, "/readyz", body, sizeof body);
	TEST_ASSERT_MSG(ready == 200, "reassigned: /readyz %d (want 200)", ready);

	/* the invariant held in every snapshot sampled (the topic read while the broker is up) */
	int64_t lo[N_PARTS], hi[N_PARTS];
	sh_watermarks(bs, topic, N_PARTS, lo, hi);
	int bad = sh_count_inconsistent(bs, topic, N_PARTS, hi, samples, n_samples);
	TEST_ASSERT_MSG(bad == 0, "%d of %d snapshots break the invariant", bad, n_samples);
	s = sh_read(snap);
	sh_check_drained(&s, N_PARTS, lo, hi, 1);

	/* 3: stopped while the broker is down: exits, final snapshot published */
	brc = sh_own_broker_do(bdir, "kill");
	TEST_EQ_INT(brc, 0);
	const uint64_t seq = sh_read(snap).seq;
	const double t_stop = mfs_now_s();
	int rc = sh_stop(pid, 60);
	/* serve.stop_deadline_ms (10 s) after the final snapshot, whatever librdkafka does */
	fprintf(stderr, "  SIGTERM with the broker down: exit %d after %.1f s\n", rc, mfs_now_s() - t_stop);
	TEST_ASSERT_MSG(rc == 0, "serve exited with %d after SIGTERM with the broker down (log %s)", rc, log);
	s = sh_read(snap);
	TEST_ASSERT(s.seq >= seq);
	TEST_EQ_INT(s.events + s.held_out, total);
	for (int p = 0; p < N_PARTS; p++)
		TEST_EQ_INT(s.off[p], hi[p]);
	fprintf(stderr, "  %" PRIu64 " events applied exactly once across two broker kills and a lost session; "
	        "%d snapshots checked\n", total, n_samples);
	sh_own_broker_do(bdir, "wipe");
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_broker_restart);
	return TEST_REPORT();
}
