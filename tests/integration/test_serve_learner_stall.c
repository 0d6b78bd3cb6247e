/* test_serve_learner_stall.c - a learner that ends no step for metrics.healthz_stale_ms is
 * said to be stalled (docs/OPERATIONS.md, "A stalled learner").
 *
 * The learner sleeps 3 s inside every batch (test.apply_delay_ms: a device, a pool or a
 * snapshot writer that holds it) and the limit is 1 s: the service logs "learner stalled"
 * naming the last phase the learner ended (record: the sleep follows it), then "learner going
 * again" once the batch is done; /metrics shows mfstream_learner_stalled_seconds past the
 * limit meanwhile; every event is still applied exactly once.
 */
#include "serve_help.h"

#define N_PARTS 1
#define N_EVENTS 1024 /* two batches of 512 */

static void test_learner_stall(void)
{
	sh_env_t v;
	if (sh_env_open(&v, 1, "ratings-stall", N_PARTS))
		return;
	const char *bs = v.bs, *topic = v.topic, *snap = v.snap, *log = v.log;
	uint64_t total = sh_produce_valid(bs, topic, N_EVENTS, 23);
	TEST_EQ_INT(total, N_EVENTS);
	const char *extra[] = {"--test.apply_delay_ms", "3000", "--metrics.healthz_stale_ms", "1000", NULL};
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-stall", log, NULL, extra);
	int port = sh_logged_port(log);
	TEST_ASSERT_MSG(port > 0, "no metrics port in %s", log);
	/* until the stall has been said and then its end, the gauge sampled meanwhile */
	static char body[1 << 17];
	double worst = -1, t_end = mfs_now_s() + test_seconds(60);
	while (mfs_now_s() < t_end && waitpid(pid, NULL, WNOHANG) == 0) {
		if (port > 0 && sh_http_get(port, "/metrics", body, sizeof body) == 200) {
			const double g = sh_metric(body, "mfstream_learner_stalled_seconds");
			if (g > worst)
				worst = g;
		}
		if (sh_log_count(log, "msg=\"learner going again\"") > 0 && worst >= 1.0)
			break;
		nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	}
	TEST_ASSERT_MSG(sh_log_count(log, "msg=\"learner stalled\"") > 0, "no stall said (log %s)", log);
	TEST_ASSERT_MSG(sh_log_count(log, "last_phase=record") > 0, "the stall does not name the phase (log %s)", log);
	TEST_ASSERT_MSG(sh_log_count(log, "msg=\"learner going again\"") > 0, "no end of the stall said (log %s)", log);
	TEST_ASSERT_MSG(worst >= 1.0, "mfstream_learner_stalled_seconds reached only %g", worst);
	int died;
	sh_snap_t s = sh_wait_events(snap, pid, total, 60, &died);
	TEST_ASSERT_MSG(!died && s.events + s.held_out == total, "published %" PRIu64 " of %" PRIu64 " (log %s)",
	                s.events + s.held_out, total, log);
	TEST_EQ_INT(sh_stop(pid, 30), 0);
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_learner_stall);
	return TEST_REPORT();
}
