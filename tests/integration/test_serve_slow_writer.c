/* test_serve_slow_writer.c - training never waits for a slow snapshot writer.
 *
 * The writer sleeps 1.5 s before every LMDB write (test.publish_delay_ms: a slow disk, or a
 * snapshot of a million new rows), snapshots fall due every 100 ms, and the learner has
 * ~1 s of work (test.apply_delay_ms per 512-event batch). A learner that waited for the
 * writer at every due snapshot would have finished several 1.5 s writes before it applied the
 * last event; one that defers the due snapshot until the writer is free applies everything
 * while the first write (or, on a slow machine, the second) is still going on. Then: every
 * event applied exactly once, offsets at the high watermarks, the deferrals counted, and
 * /metrics showing the last snapshot although no batch followed it.
 */
#include "serve_help.h"

#define N_PARTS 2
#define N_EVENTS 40000

static void test_slow_writer(void)
{
	sh_env_t v;
	const char *topic = "ratings-sw";
	if (sh_env_open(&v, 1, topic, N_PARTS))
		return;
	topic = v.topic; /* its name on this broker */
	const char *bs = v.bs, *snap = v.snap, *log = v.log;
	uint64_t total = sh_produce_valid(bs, topic, N_EVENTS, 17);
	TEST_EQ_INT(total, N_EVENTS);
	const char *extra[] = {"--test.publish_delay_ms", "1500", "--test.apply_delay_ms", "12", NULL};
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-sw", log, NULL, extra);
	int port = sh_logged_port(log);
	TEST_ASSERT_MSG(port > 0, "no metrics port in %s", log);
	/* the first scrape that shows every event applied (by the learner, not yet published) */
	static char body[1 << 17];
	double applied = -1, snapshots = -1, t_end = mfs_now_s() + test_seconds(60);
	while (port > 0 && mfs_now_s() < t_end && waitpid(pid, NULL, WNOHANG) == 0) {
		if (sh_http_get(port, "/metrics", body, sizeof body) == 200) {
			applied = sh_metric(body, "mfstream_events_applied_total");
			snapshots = sh_metric(body, "mfstream_snapshots_total");
			if (applied >= (double)total)
				break;
		}
		nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	}
	fprintf(stderr, "  all %g events applied with %g snapshots written\n", applied, snapshots);
	TEST_ASSERT_MSG(applied == (double)total, "applied %g of %" PRIu64 " (log %s)", applied, total, log);
	TEST_ASSERT_MSG(snapshots >= 0 && snapshots <= 2,
	                "%g snapshots of 1.5 s each were written before the last event was applied: the learner "
	                "waited for the writer", snapshots);
	/* then everything is published, exactly once */
	int died;
	sh_snap_t s = sh_wait_events(snap, pid, total, 60, &died);
	TEST_ASSERT_MSG(!died && s.events == total, "published %" PRIu64 " of %" PRIu64 " (log %s)", s.events, total,
	                log);
	/* /metrics follows the snapshots written after the last batch too (no batch to refresh it) */
	double seq = -1, count = -1;
	for (double t = mfs_now_s() + test_seconds(10); port > 0 && mfs_now_s() < t && (seq != (double)s.seq || count != seq);) {
		if (sh_http_get(port, "/metrics", body, sizeof body) == 200) {
			seq = sh_metric(body, "mfstream_snapshot_sequence");
			count = sh_metric(body, "mfstream_snapshots_total");
		}
		nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	}
	/* a new directory: its sequence numbers count this process's snapshots */
	TEST_ASSERT_MSG(seq == (double)s.seq && count == seq, "/metrics: snapshot_sequence %g, snapshots_total %g; "
	                "the snapshot's seq %" PRIu64, seq, count, s.seq);
	TEST_EQ_INT(sh_stop(pid, 30), 0);
	sh_check_all_applied(bs, topic, N_PARTS, snap, total);
	long deferred = sh_log_value(log, "msg=\"learner done\"", "snapshots_deferred=");
	TEST_ASSERT_MSG(deferred >= 1, "snapshots_deferred=%ld (log %s)", deferred, log);
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_slow_writer);
	return TEST_REPORT();
}
