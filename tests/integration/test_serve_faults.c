/* test_serve_faults.c - the consume side under broker faults (mock cluster, 3 brokers):
 * while `mfstream serve` consumes, inject Fetch / OffsetCommit / Heartbeat request errors (a
 * heartbeat error forces a rebalance: revoke -> barrier snapshot -> assign), move every
 * partition's leader, take brokers down and back up one at a time, and produce more events
 * meanwhile. Afterwards: every valid event applied exactly once (count, digest and rating sum
 * equal those of the topic below the stored offsets, for every snapshot sampled), offsets ==
 * high watermarks, low watermarks 0.
 */
#include "serve_help.h"

#include <librdkafka/rdkafka_mock.h>

#define N_PARTS 4
#define N1 40000
#define N2 30000
#define APIKEY_FETCH 1
#define APIKEY_OFFSET_COMMIT 8
#define APIKEY_HEARTBEAT 12
#define MAX_SAMPLES 4096

static sh_snap_t samples[MAX_SAMPLES];
static int n_samples;

static void sample_for(const char *snap, double seconds)
{
	double end = mfs_now_s() + seconds;
	do {
		sh_snap_t s = sh_read(snap);
		if (s.found && n_samples < MAX_SAMPLES)
			samples[n_samples++] = s;
		nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	} while (mfs_now_s() < end);
}

static void test_faults(void)
{
	sh_env_t v;
	const char *topic = "ratings-faults";
	if (sh_env_open(&v, 3, topic, N_PARTS))
		return;
	topic = v.topic; /* its name on this broker */
	rd_kafka_mock_cluster_t *mc = mfs_mock_broker_cluster(v.mb);
	const char *bs = v.bs, *snap = v.snap, *log = v.log;
	uint64_t total = sh_produce_valid(bs, topic, N1, 7);
	sh_produce_bad(bs, topic, N_PARTS);
	/* slow the learner a little so the faults land mid-stream */
	const char *const extra[] = {"--test.apply_delay_ms", "5", NULL};
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-faults", log, NULL, extra);
	int died;
	sh_snap_t s = sh_wait_events(snap, pid, 1, 60, &died);
	TEST_ASSERT_MSG(!died && s.found, "serve did not start (log %s)", log);

	fprintf(stderr, "  request errors: Fetch x6, OffsetCommit x4, Heartbeat x2 (rebalance)\n");
	rd_kafka_mock_push_request_errors(mc, APIKEY_FETCH, 6, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
	                                  RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
	                                  RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR__TRANSPORT,
	                                  RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
	rd_kafka_mock_push_request_errors(mc, APIKEY_OFFSET_COMMIT, 4, RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
	                                  RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
	                                  RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE);
	rd_kafka_mock_push_request_errors(mc, APIKEY_HEARTBEAT, 2, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
	                                  RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
	sample_for(snap, 1.0);
	fprintf(stderr, "  leaders moved\n");
	for (int p = 0; p < N_PARTS; p++)
		TEST_OK(rd_kafka_mock_partition_set_leader(mc, topic, p, p % 3 + 1));
	sample_for(snap, 0.8);
	for (int b = 1; b <= 3; b++) {
		fprintf(stderr, "  broker %d down\n", b);
		TEST_OK(rd_kafka_mock_broker_set_down(mc, b));
		sample_for(snap, 1.2);
		TEST_OK(rd_kafka_mock_broker_set_up(mc, b));
		sample_for(snap, 0.6);
	}
	total += sh_produce_valid(bs, topic, N2, 8); /* more events after the faults */
	double t_end = mfs_now_s() + test_seconds(90);
	do {
		s = sh_read(snap);
		if (s.found && n_samples < MAX_SAMPLES)
			samples[n_samples++] = s;
		if (s.events + s.held_out >= total)
			break;
		nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	} while (mfs_now_s() < t_end && waitpid(pid, NULL, WNOHANG) == 0);
	TEST_ASSERT_MSG(s.events + s.held_out == total, "applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events, total, log);
	TEST_EQ_INT(sh_stop(pid, 30), 0);

	int64_t lo[N_PARTS], hi[N_PARTS];
	sh_watermarks(bs, topic, N_PARTS, lo, hi);
	s = sh_read(snap);
	samples[n_samples < MAX_SAMPLES ? n_samples++ : MAX_SAMPLES - 1] = s;
	TEST_EQ_INT(s.events + s.held_out, total);
	sh_check_drained(&s, N_PARTS, lo, hi, 1);
	int bad = sh_count_inconsistent(bs, topic, N_PARTS, hi, samples, n_samples);
	TEST_ASSERT_MSG(bad == 0, "%d of %d snapshots break the invariant", bad, n_samples);
	fprintf(stderr, "  %d snapshots checked, %" PRIu64 " events applied exactly once through the faults\n", n_samples,
	        total);
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_faults);
	return TEST_REPORT();
}
