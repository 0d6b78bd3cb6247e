/* test_serve_offset_mismatch.c - a snapshot whose offsets lie beyond the log (docs/STREAMING.md,
 * "Offsets beyond the log"): the topic is "recreated" (a new mock cluster, the same topic name,
 * as when the embedded broker or a cluster starts afresh) and holds fewer messages than the
 * snapshot's offsets. Before, serve skipped every new event in silence (5,000 produced, 0
 * applied, lag -817). Now:
 *   - by default (serve.offset_mismatch=fail) serve exits 1 at once, naming topic, partition,
 *     stored offset and log end;
 *   - with reset it starts those partitions at their log start, says so, counts the resets
 *     (mfstream_offset_resets_total) and applies every new event exactly once; a restart on
 *     the snapshot it wrote resumes without another reset and applies nothing twice.
 */
#include "serve_help.h"

#define N_PARTS 2
#define N_OLD 20000
#define N_NEW 5000

static int wait_count(const char *log, const char *s, long want, double timeout_s)
{
	for (double end = mfs_now_s() + test_seconds(timeout_s); mfs_now_s() < end; nanosleep(&(struct timespec){0, 20000000}, NULL))
		if (sh_log_count(log, s) >= want)
			return 1;
	return 0;
}

static void test_offset_mismatch(void)
{
	if (sh_real()) /* a real broker's topic cannot be recreated from here */
		exit(77);
	sh_env_t v;
	const char *topic = "ratings-mismatch";
	if (sh_env_open(&v, 1, topic, N_PARTS))
		return;
	uint64_t old = sh_produce_valid(v.bs, topic, N_OLD, 71);
	pid_t pid = sh_spawn(v.bs, topic, v.snap, "mfs-test-mismatch", v.log, NULL, NULL);
	int died;
	sh_snap_t s = sh_wait_events(v.snap, pid, old, 120, &died);
	TEST_ASSERT_MSG(!died && s.events == old, "first run applied %" PRIu64 " of %" PRIu64, s.events, old);
	TEST_EQ_INT(sh_stop(pid, 60), 0);
	const int64_t stored0 = sh_read(v.snap).off[0];

	/* the topic starts afresh, shorter than the snapshot's offsets */
	sh_env_close(&v);
	char e[512];
	TEST_OK(mfs_mock_broker_open(1, &v.mb, e, sizeof e));
	if (!v.mb)
		return;
	v.bs = mfs_mock_broker_bootstraps(v.mb);
	TEST_OK(mfs_mock_broker_create_topic(v.mb, topic, N_PARTS, e, sizeof e));
	uint64_t fresh = sh_produce_valid(v.bs, topic, N_NEW, 72);
	int64_t lo[N_PARTS], hi[N_PARTS];
	sh_watermarks(v.bs, topic, N_PARTS, lo, hi);
	TEST_ASSERT_MSG(hi[0] < stored0, "the new log (%" PRId64 ") must end below the stored offset (%" PRId64 ")",
	                hi[0], stored0);

	/* default: fail, with the numbers */
	char log2[600];
	snprintf(log2, sizeof log2, "%s/serve-fail.log", v.dir);
	pid = sh_spawn(v.bs, topic, v.snap, "mfs-test-mismatch-2", log2, NULL, NULL);
	int st = sh_wait_exit(pid, 120);
	TEST_EQ_INT(st, 1);
	char want[256];
	snprintf(want, sizeof want, "partition 0 ends at offset %" PRId64 " but the snapshot resumes at %" PRId64, hi[0],
	         stored0);
	TEST_ASSERT_MSG(sh_log_count(log2, want) >= 1, "no \"%s\" in %s", want, log2);
	TEST_EQ_INT(sh_read(v.snap).events, old); /* nothing applied, nothing lost */

	/* reset: the new events are applied, once, and the resets counted */
	char log3[600];
	snprintf(log3, sizeof log3, "%s/serve-reset.log", v.dir);
	const char *const extra[] = {"--serve.offset_mismatch", "reset", NULL};
	pid = sh_spawn(v.bs, topic, v.snap, "mfs-test-mismatch-3", log3, NULL, extra);
	s = sh_wait_events(v.snap, pid, old + fresh, 120, &died);
	TEST_ASSERT_MSG(!died && s.events == old + fresh, "reset applied %" PRIu64 " of %" PRIu64 " new", s.events - old,
	                fresh);
	int port = sh_logged_port(log3);
	char body[1 << 16];
	TEST_EQ_INT(sh_http_get(port, "/metrics", body, sizeof body), 200);
	TEST_ASSERT_MSG(sh_metric(body, "mfstream_offset_resets_total") == N_PARTS, "resets %g",
	                sh_metric(body, "mfstream_offset_resets_total"));
	TEST_EQ_INT(sh_log_count(log3, "action=reset"), N_PARTS);
	TEST_EQ_INT(sh_stop(pid, 60), 0);
	s = sh_read(v.snap);
	TEST_EQ_INT(s.events, old + fresh);
	for (int p = 0; p < N_PARTS; p++)
		TEST_EQ_INT(s.off[p], hi[p]);

	/* a restart on that snapshot: no mismatch, nothing twice */
	pid = sh_spawn(v.bs, topic, v.snap, "mfs-test-mismatch-4", log3, NULL, NULL);
	TEST_ASSERT_MSG(wait_count(log3, "msg=assigned", 2 * N_PARTS, 120), "restart not assigned (log %s)", log3);
	TEST_EQ_INT(sh_stop(pid, 60), 0);
	TEST_EQ_INT(sh_read(v.snap).events, old + fresh);
	TEST_EQ_INT(sh_log_count(log3, "action=reset"), N_PARTS);
	sh_env_close(&v);
}

int main(void)
{
	TEST_RUN(test_offset_mismatch);
	return TEST_REPORT();
}
