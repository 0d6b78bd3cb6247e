/* test_serve_kill9.c - exactly once across kill -9 (docs/STREAMING.md, "the proof").
 *
 * Rounds: produce a batch of events (plus one invalid message per rejection reason) into a
 * 4-partition mock topic, start `mfstream serve`, and SIGKILL it at a random moment after it
 * has started applying (0..400 ms after its first new snapshot); restart it on the same
 * snapshot directory. Every snapshot we see (sampled while it runs and after every kill) must
 * satisfy the invariant the proof rests on:
 *     events_applied == sum over partitions p of (valid events in messages at offsets < off[p])
 * i.e. the offsets stored with the model say exactly which events it contains. At the end a
 * clean run drains the topic: events_applied == every valid event produced, mu_count too,
 * rejected/<reason> == rounds, stored offsets == high watermarks (low watermarks 0).
 * Each run uses its own group id: a dead member must not hold partitions for a session
 * timeout, and the start offsets come from the snapshot anyway, not from the group.
 */
#include "serve_help.h"

#define N_PARTS 4
#define ROUNDS 4
#define PER_ROUND 30000
#define MAX_SAMPLES 4096

static sh_snap_t samples[MAX_SAMPLES];
static int n_samples;

static void sample(const sh_snap_t *s)
{
	if (s->found && n_samples < MAX_SAMPLES)
		samples[n_samples++] = *s;
}

/* valid events per message, per partition, by offset */
static uint32_t *ev_at[N_PARTS];

static void read_topic(const char *bs, const char *topic, const int64_t *hi)
{
	char e[512];
	rd_kafka_conf_t *kc;
	static const char *const defaults[] = {"group.id", "mfs-test-kill9-reader", "enable.auto.commit", "false", NULL};
	TEST_OK(mfs_kafka_conf_new_with(NULL, defaults, &kc, e, sizeof e));
	rd_kafka_conf_set(kc, "bootstrap.servers", bs, e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, e, sizeof e);
	TEST_ASSERT_MSG(rk != NULL, "%s", e);
	if (!rk)
		return;
	rd_kafka_poll_set_consumer(rk);
	rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(N_PARTS);
	int64_t total = 0, seen = 0;
	for (int p = 0; p < N_PARTS; p++) {
		ev_at[p] = calloc((size_t)hi[p] + 1, sizeof *ev_at[p]);
		total += hi[p];
		rd_kafka_topic_partition_list_add(tp, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
	}
	TEST_OK(rd_kafka_assign(rk, tp));
	rd_kafka_topic_partition_list_destroy(tp);
	mfs_event_opts_t eo = {0.5, 5.0, 0};
	mfs_events_t evs = {0};
	double end = mfs_now_s() + 60;
	while (seen < total && mfs_now_s() < end) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
		if (!m)
			continue;
		if (!m->err && m->partition >= 0 && m->partition < N_PARTS && m->offset < hi[m->partition]) {
			int reason;
			long idx;
			char d[256];
			if (mfs_event_decode(m->payload, m->len, &eo, &evs, &reason, &idx, d, sizeof d) == 0)
				ev_at[m->partition][m->offset] = (uint32_t)evs.n;
			seen++;
		}
		rd_kafka_message_destroy(m);
	}
	TEST_EQ_INT(seen, total);
	mfs_events_free(&evs);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
}

static uint64_t events_below(int p, int64_t off)
{
	uint64_t s = 0;
	for (int64_t o = 0; o < off; o++)
		s += ev_at[p][o];
	return s;
}

static void test_kill9_exactly_once(void)
{
	char e[512];
	mfs_mock_broker_t *mb = NULL;
	TEST_OK(mfs_mock_broker_open(1, &mb, e, sizeof e));
	if (!mb)
		return;
	const char *bs = mfs_mock_broker_bootstraps(mb), *topic = "ratings-k9";
	TEST_OK(mfs_mock_broker_create_topic(mb, topic, N_PARTS, e, sizeof e));
	unsigned seed = (unsigned)time(NULL);
	srand(seed);
	fprintf(stderr, "  random seed %u\n", seed);

	char dir[300], snap[320], log[320], group[64];
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(log, sizeof log, "%s/serve.log", dir);
	uint64_t total = 0;
	int kills = 0;
	for (int r = 0; r < ROUNDS; r++) {
		total += sh_produce_valid(bs, topic, PER_ROUND, 1000 + r);
		sh_produce_bad(bs, topic, N_PARTS);
		uint64_t before = sh_read(snap).events;
		snprintf(group, sizeof group, "mfs-test-kill9-%d", r);
		pid_t pid = sh_spawn(bs, topic, snap, group, log, NULL);
		int died;
		sh_snap_t s = sh_wait_events(snap, pid, before + 1, 60, &died);
		TEST_ASSERT_MSG(!died, "round %d: serve exited early (log %s)", r, log);
		sample(&s);
		int delay_ms = rand() % 400;
		double t_end = mfs_now_s() + delay_ms / 1000.0;
		while (mfs_now_s() < t_end) { /* sample snapshots while it runs */
			s = sh_read(snap);
			sample(&s);
			nanosleep(&(struct timespec){0, 5 * 1000000}, NULL);
		}
		kill(pid, SIGKILL);
		int st;
		waitpid(pid, &st, 0);
		TEST_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		kills++;
		s = sh_read(snap);
		sample(&s);
		fprintf(stderr, "  round %d: killed after %d ms; snapshot events_applied=%" PRIu64 " of %" PRIu64 "\n", r,
		        delay_ms, s.events, total);
	}
	/* a clean run drains the topic */
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-kill9-final", log, NULL);
	int died;
	sh_snap_t s = sh_wait_events(snap, pid, total, 90, &died);
	TEST_ASSERT_MSG(!died && s.events == total, "final: events_applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events,
	                total, log);
	nanosleep(&(struct timespec){0, 400 * 1000000}, NULL);
	TEST_EQ_INT(sh_stop(pid, 30), 0);

	int64_t lo[N_PARTS], hi[N_PARTS];
	sh_watermarks(bs, topic, N_PARTS, lo, hi);
	s = sh_read(snap);
	sample(&s);
	TEST_EQ_INT(s.events, total);
	TEST_EQ_INT(s.mu_count, total);
	for (int r = 0; r < MFS_REJ__COUNT; r++)
		TEST_ASSERT_MSG(s.rejected[r] == ROUNDS, "rejected/%s = %" PRIu64, mfs_reject_name(r), s.rejected[r]);
	for (int p = 0; p < N_PARTS; p++) {
		TEST_ASSERT_MSG(lo[p] == 0, "[%d] low watermark %" PRId64, p, lo[p]);
		TEST_ASSERT_MSG(s.off[p] == hi[p], "[%d] stored offset %" PRId64 ", high watermark %" PRId64, p, s.off[p],
		                hi[p]);
	}

	/* the invariant, for every snapshot we saw */
	read_topic(bs, topic, hi);
	int bad = 0;
	for (int j = 0; j < n_samples; j++) {
		uint64_t want = 0;
		for (int p = 0; p < N_PARTS; p++)
			if (samples[j].off[p] > 0 && samples[j].off[p] <= hi[p])
				want += events_below(p, samples[j].off[p]);
		if (want != samples[j].events && bad++ < 5)
			fprintf(stderr, "  snapshot seq %" PRIu64 ": events_applied %" PRIu64 " but its offsets cover %" PRIu64 "\n",
			        samples[j].seq, samples[j].events, want);
	}
	TEST_ASSERT_MSG(bad == 0, "%d of %d snapshots break the invariant", bad, n_samples);
	fprintf(stderr, "  %d kills, %d snapshots checked, %" PRIu64 " events applied exactly once\n", kills, n_samples,
	        total);
	for (int p = 0; p < N_PARTS; p++)
		free(ev_at[p]);
	mfs_mock_broker_close(mb);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_kill9_exactly_once);
	return TEST_REPORT();
}
