/* test_serve_fatal.c - the one fatal path (docs/OPERATIONS.md, "Failing"), driven by fault
 * points in our own code (test.fault, common/fault.h) instead of a full disk or a broken GPU:
 * a snapshot commit that fails with ENOSPC, disk that cannot be reserved, a map that cannot
 * grow, an engine that fails with EIO. For each, `mfstream serve` consumes a backlog and must:
 *   - log the cause in words ("no space left on device at snapshot.dir=...", "Input/output
 *     error") and "fatal error: stopping";
 *   - answer /healthz and /readyz 503 with that cause (test.fatal_linger_ms holds the process
 *     a moment so the test can look);
 *   - exit with status 1 within serve.stop_deadline_ms (10 s) of the 503;
 *   - have committed no offset beyond the last published snapshot's (the group's committed
 *     offsets, read back from the broker);
 * and a restart without the fault applies every event exactly once (count, digest and rating
 * sum equal those of the topic, offsets at the high watermarks).
 */
#include "serve_help.h"

#define N_PARTS 2
#define N_EVENTS 20000
#define LINGER_MS "1500"

/* The group's committed offsets on the broker (-1 where none). */
static void committed(const char *bs, const char *topic, const char *group, int64_t *off)
{
	rd_kafka_t *rk = sh_consumer(bs, group);
	for (int p = 0; p < N_PARTS; p++)
		off[p] = -1;
	if (!rk)
		return;
	rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(N_PARTS);
	for (int p = 0; p < N_PARTS; p++)
		rd_kafka_topic_partition_list_add(l, topic, p);
	TEST_OK(rd_kafka_committed(rk, l, 30000));
	for (int p = 0; p < N_PARTS; p++)
		off[p] = l->elems[p].offset < 0 ? -1 : l->elems[p].offset;
	rd_kafka_topic_partition_list_destroy(l);
	rd_kafka_destroy(rk);
}

static void one_fault(sh_env_t *v, int j, const char *spec, const char *words)
{
	char snap[600], log[600], group[64], topic[200], base[64];
	snprintf(snap, sizeof snap, "%s/snap%d", v->dir, j);
	snprintf(log, sizeof log, "%s/serve%d.log", v->dir, j);
	snprintf(group, sizeof group, "mfs-test-fatal-%d", j);
	snprintf(base, sizeof base, "ratings-fatal-%d", j);
	TEST_ASSERT(sh_env_topic(v, base, N_PARTS, topic, sizeof topic) == 0);
	fprintf(stderr, "  test.fault %s\n", spec);
	uint64_t total = sh_produce_valid(v->bs, topic, N_EVENTS, 40 + j);
	const char *const extra[] = {"--test.fault", spec, "--test.fatal_linger_ms", LINGER_MS, "--test.apply_delay_ms",
	                             "10", NULL};
	pid_t pid = sh_spawn(v->bs, topic, snap, group, log, NULL, extra);
	int port = sh_logged_port(log);
	TEST_ASSERT_MSG(port > 0, "no metrics port in %s", log);
	/* the fault fires within the backlog: /healthz turns 503 with the cause */
	char body[4096] = "";
	int st = 0, exited = -2;
	for (double end = mfs_now_s() + test_seconds(120); mfs_now_s() < end;) {
		st = sh_http_get(port, "/healthz", body, sizeof body);
		if (st == 503)
			break;
		int ws;
		if (waitpid(pid, &ws, WNOHANG) == pid) {
			exited = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
			break;
		}
		nanosleep(&(struct timespec){0, 10 * 1000000}, NULL);
	}
	TEST_ASSERT_MSG(st == 503, "/healthz never turned 503 (last %d, exit %d; log %s)", st, exited, log);
	TEST_ASSERT_MSG(strstr(body, "fatal") && strstr(body, words), "/healthz body: %s", body);
	double t503 = mfs_now_s();
	char rbody[4096] = "";
	int rst = sh_http_get(port, "/readyz", rbody, sizeof rbody);
	TEST_ASSERT_MSG(rst == 503 || rst == -1, "/readyz answered %d after the fatal error", rst);
	int status = exited != -2 ? exited : sh_wait_exit(pid, 60);
	double took = mfs_now_s() - t503;
	const char *said = strstr(body, "fatal") ? strstr(body, "fatal") : body;
	fprintf(stderr, "    503 \"%.*s\"; exit %d %.1f s after it\n", (int)strcspn(said, "\n"), said, status, took);
	TEST_EQ_INT(status, 1);
	TEST_ASSERT_MSG(took < 10.0 + atoi(LINGER_MS) / 1000.0, "exit %.1f s after the 503", took);
	TEST_ASSERT_MSG(sh_log_count(log, "fatal error: stopping") == 1, "no fatal line in %s", log);
	TEST_ASSERT_MSG(sh_log_count(log, words) >= 1, "the cause \"%s\" is not in %s", words, log);
	/* nothing committed beyond what the last snapshot holds */
	sh_snap_t s = sh_read(snap);
	int64_t off[N_PARTS];
	committed(v->bs, topic, group, off);
	for (int p = 0; p < N_PARTS; p++)
		TEST_ASSERT_MSG(off[p] <= (s.found ? s.off[p] : 0), "partition %d committed %" PRId64 ", snapshot %" PRId64,
		                p, off[p], s.found ? s.off[p] : 0);
	/* restart without the fault: every event exactly once */
	pid = sh_spawn(v->bs, topic, snap, group, log, NULL, NULL);
	int died;
	s = sh_wait_events(snap, pid, total, 120, &died);
	TEST_ASSERT_MSG(!died && s.events == total, "restart applied %" PRIu64 " of %" PRIu64, s.events, total);
	TEST_EQ_INT(sh_stop(pid, 60), 0);
	sh_check_all_applied(v->bs, topic, N_PARTS, snap, total);
}

static void test_fatal_paths(void)
{
	sh_env_t v;
	if (sh_env_open(&v, 1, "ratings-fatal-probe", 1))
		return;
	one_fault(&v, 0, "snapshot.commit=ENOSPC@2", "no space left on device at snapshot.dir=");
	one_fault(&v, 1, "snapshot.reserve=ENOSPC", "no space left on device at snapshot.dir=");
	one_fault(&v, 2, "snapshot.commit=MDB_MAP_FULL@2,snapshot.grow=ENOSPC", "no space left on device");
	one_fault(&v, 3, "engine.sgd=EIO@10", "Input/output error");
	sh_env_close(&v);
}

int main(void)
{
	TEST_RUN(test_fatal_paths);
	return TEST_REPORT();
}
