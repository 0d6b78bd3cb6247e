/* test_serve_rebalance_paused.c - a rebalance while the consumer has its partitions paused.
 *
 * A slow learner (test.apply_delay_ms) behind a 2-batch ring keeps the partitions paused most
 * of the time. Once the log shows a pause, the group rebalances: on the mock cluster Heartbeat
 * errors (REBALANCE_IN_PROGRESS) ask for it; on a real broker a second member joins the group
 * and leaves again. The partitions are revoked while paused (the revocation barrier must still
 * get its snapshot while the queue is full) and assigned back, paused state and all. Twice.
 * At the end every valid event is applied exactly once: count, digest and rating sum against
 * the topic, offsets == high watermarks, low watermarks 0.
 * (It passes also without on_revoke's resume of paused partitions: the resume when the ring
 * drains to half clears librdkafka's pause flag of the partitions assigned back.)
 */
#include "serve_help.h"

#define N_PARTS 2
#define N_EVENTS 40000
#define APIKEY_HEARTBEAT 12

/* Wait until the log has more than `after` lines with s, or the deadline; returns the count. */
static long wait_lines(const char *path, const char *s, long after, double seconds)
{
	double end = mfs_now_s() + test_seconds(seconds);
	long n;
	while ((n = sh_log_count(path, s)) <= after && mfs_now_s() < end)
		nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	return n;
}

/* A real broker's rebalance: a second member joins serve's group (taking partitions from it),
 * polls until it has its share, and leaves (giving them back). It never commits, and what it
 * fetches is not consumed for serve: serve resumes from its own offsets. */
static void real_rebalance(const char *bs, const char *topic, const char *group)
{
	char e[512];
	rd_kafka_conf_t *kc = rd_kafka_conf_new();
	TEST_OK(rd_kafka_conf_set(kc, "bootstrap.servers", bs, e, sizeof e));
	TEST_OK(rd_kafka_conf_set(kc, "group.id", group, e, sizeof e));
	TEST_OK(rd_kafka_conf_set(kc, "enable.auto.commit", "false", e, sizeof e));
	TEST_OK(rd_kafka_conf_set(kc, "session.timeout.ms", "6000", e, sizeof e));
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, e, sizeof e);
	TEST_ASSERT_MSG(rk != NULL, "%s", e);
	if (!rk)
		return;
	rd_kafka_poll_set_consumer(rk);
	rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(tl, topic, RD_KAFKA_PARTITION_UA);
	TEST_OK(rd_kafka_subscribe(rk, tl));
	rd_kafka_topic_partition_list_destroy(tl);
	double end = mfs_now_s() + test_seconds(60);
	int assigned = 0;
	while (!assigned && mfs_now_s() < end) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
		if (m)
			rd_kafka_message_destroy(m);
		rd_kafka_topic_partition_list_t *a = NULL;
		if (rd_kafka_assignment(rk, &a) == 0 && a) {
			assigned = a->cnt > 0;
			rd_kafka_topic_partition_list_destroy(a);
		}
	}
	TEST_ASSERT_MSG(assigned, "the second member got no partitions in 60 s");
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
}

static void test_rebalance_while_paused(void)
{
	sh_env_t v;
	const char *topic = "ratings-rbp";
	if (sh_env_open(&v, 1, topic, N_PARTS))
		return;
	topic = v.topic; /* its name on this broker */
	rd_kafka_mock_cluster_t *mc = v.mb ? mfs_mock_broker_cluster(v.mb) : NULL;
	const char *bs = v.bs, *snap = v.snap, *log = v.log;
	uint64_t total = sh_produce_valid(bs, topic, N_EVENTS, 23);
	const char *extra[] = {"--test.apply_delay_ms", "15", "--serve.ring_batches", "2", "--log.level", "debug", NULL};
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-rbp", log, NULL, extra);
	long rebalances = 0, revoked_paused = 0;
	for (int round = 0; round < 2; round++) {
		long paused = wait_lines(log, "msg=paused", sh_log_count(log, "msg=paused"), 30);
		TEST_ASSERT_MSG(paused > 0, "round %d: the consumer never paused (log %s)", round, log);
		long revoked = sh_log_count(log, "msg=revoked");
		/* paused right now? (the last pause/resume line is a pause) */
		long p = sh_log_count(log, "msg=paused"), r = sh_log_count(log, "msg=resumed");
		revoked_paused += p > r;
		if (mc)
			rd_kafka_mock_push_request_errors(mc, APIKEY_HEARTBEAT, 2, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
			                                  RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
		else
			real_rebalance(bs, topic, "mfs-test-rbp");
		long now = wait_lines(log, "msg=revoked", revoked, 30);
		TEST_ASSERT_MSG(now > revoked, "round %d: no rebalance within 30 s (log %s)", round, log);
		rebalances += now - revoked;
	}
	int died;
	sh_snap_t s = sh_wait_events(snap, pid, total, 90, &died);
	TEST_ASSERT_MSG(!died, "serve died (log %s)", log);
	TEST_ASSERT_MSG(s.events + s.held_out == total, "applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events, total,
	                log);
	TEST_EQ_INT(sh_stop(pid, 30), 0);
	fprintf(stderr, "  %ld revocations, %ld of them requested while paused; %" PRIu64 " events\n", rebalances,
	        revoked_paused, total);
	TEST_ASSERT_MSG(revoked_paused >= 1, "no rebalance was requested while paused (log %s)", log);
	sh_check_all_applied(bs, topic, N_PARTS, snap, total);
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_rebalance_while_paused);
	return TEST_REPORT();
}
