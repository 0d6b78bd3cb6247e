/* test_serve_signals.c - no signal ends `mfstream serve` without a log line (docs/OPERATIONS.md,
 * "Signals"): SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored (nothing reloads: every key is
 * read at start), and the service keeps applying events; SIGTERM then stops it the usual way,
 * logged with the signal's name, exit 0, every event applied exactly once.
 */
#include "serve_help.h"

#define N_PARTS 2
#define N_EVENTS 10000

static long wait_log(const char *log, const char *s, double timeout_s)
{
	long n = 0;
	for (double end = mfs_now_s() + test_seconds(timeout_s); (n = sh_log_count(log, s)) == 0 && mfs_now_s() < end;)
		nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	return n;
}

static void test_signals(void)
{
	sh_env_t v;
	if (sh_env_open(&v, 1, "ratings-signals", N_PARTS))
		return;
	uint64_t total = sh_produce_valid(v.bs, v.topic, N_EVENTS, 61);
	pid_t pid = sh_spawn(v.bs, v.topic, v.snap, "mfs-test-signals", v.log, NULL, NULL);
	int died;
	sh_snap_t s = sh_wait_events(v.snap, pid, total, 120, &died);
	TEST_ASSERT_MSG(!died && s.events == total, "applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events, total, v.log);
	static const struct {
		int sig;
		const char *line;
	} ignored[] = {{SIGHUP, "signal=SIGHUP"}, {SIGUSR1, "signal=SIGUSR1"}, {SIGUSR2, "signal=SIGUSR2"}};
	for (size_t j = 0; j < sizeof ignored / sizeof ignored[0]; j++) {
		kill(pid, ignored[j].sig);
		TEST_ASSERT_MSG(wait_log(v.log, ignored[j].line, 60) == 1, "no \"%s\" line in %s", ignored[j].line, v.log);
		TEST_ASSERT_MSG(waitpid(pid, NULL, WNOHANG) == 0, "serve ended on %s (log %s)", ignored[j].line, v.log);
	}
	TEST_EQ_INT(sh_log_count(v.log, "signal ignored"), 3);
	/* still at work after them */
	total += sh_produce_valid(v.bs, v.topic, N_EVENTS, 62);
	s = sh_wait_events(v.snap, pid, total, 120, &died);
	TEST_ASSERT_MSG(!died && s.events == total, "after the signals: %" PRIu64 " of %" PRIu64, s.events, total);
	TEST_EQ_INT(sh_stop(pid, 60), 0);
	TEST_EQ_INT(sh_log_count(v.log, "msg=stopping signal=SIGTERM"), 1);
	sh_check_all_applied(v.bs, v.topic, N_PARTS, v.snap, total);
	sh_env_close(&v);
}

int main(void)
{
	TEST_RUN(test_signals);
	return TEST_REPORT();
}
