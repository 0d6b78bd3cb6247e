/* test_serve_backpressure.c - a deliberately slow learner (test.apply_delay_ms) behind a
 * 2-batch ring: the consumer must pause its partitions (and resume them), memory must stay
 * bounded, and nothing may be dropped: at the end every valid event is applied exactly once
 * (count, digest and rating sum against the topic), offsets == high watermarks.
 */
#include "serve_help.h"

#define N_PARTS 2
#define N_EVENTS 60000
#define RSS_LIMIT_KB (256 * 1024)

/* VmHWM (peak resident set) of pid in KiB, or -1 */
static long peak_rss_kb(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long kb = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static void test_backpressure(void)
{
	sh_env_t v;
	const char *topic = "ratings-bp";
	if (sh_env_open(&v, 1, topic, N_PARTS))
		return;
	topic = v.topic; /* its name on this broker */
	const char *bs = v.bs, *snap = v.snap, *log = v.log;
	uint64_t total = sh_produce_valid(bs, topic, N_EVENTS, 11);
	/* 512-event batches, 15 ms each, through a 2-slot ring: the topic is consumed far faster
	 * than it is applied; librdkafka's own prefetch is kept small too */
	const char *extra[] = {"--test.apply_delay_ms", "15", "--serve.ring_batches", "2",
	                       "--kafka.fetch.wait.max.ms", "20", "--kafka.fetch.error.backoff.ms", "20", "--log.level", "debug", NULL};
	double t0 = mfs_now_s();
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-bp", log, NULL, extra);
	long peak = -1;
	sh_snap_t s;
	memset(&s, 0, sizeof s);
	double t_end = mfs_now_s() + test_seconds(120);
	while (mfs_now_s() < t_end && waitpid(pid, NULL, WNOHANG) == 0) {
		long p = peak_rss_kb(pid);
		if (p > peak)
			peak = p;
		s = sh_read(snap);
		if (s.found && s.events + s.held_out >= total)
			break;
		nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	}
	double took = mfs_now_s() - t0;
	TEST_ASSERT_MSG(s.events + s.held_out == total, "applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events, total, log);
	TEST_EQ_INT(sh_stop(pid, 30), 0);
	long pauses = sh_log_value(log, "msg=stopped", "pauses=");
	long paused_lines = sh_log_count(log, "msg=paused");
	fprintf(stderr, "  %" PRIu64 " events in %.1f s; pauses %ld (paused lines %ld); peak RSS %ld KiB\n", total, took,
	        pauses, paused_lines, peak);
	TEST_ASSERT_MSG(pauses >= 3, "the consumer paused %ld times (log %s)", pauses, log);
	TEST_EQ_INT(paused_lines, pauses);
	TEST_ASSERT_MSG(peak > 0 && peak < RSS_LIMIT_KB, "peak RSS %ld KiB", peak);
	/* nothing dropped, nothing twice */
	sh_check_all_applied(bs, topic, N_PARTS, snap, total);
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_backpressure);
	return TEST_REPORT();
}
