/* test_serve_mock.c - `mfstream serve` end to end against the embedded (mock) broker.
 *
 * The mock cluster runs in this process; a topic of 3 partitions gets N valid events
 * (synthetic, batched messages through mfs_produce_run) plus one hand-built invalid message
 * per rejection reason. `mfstream serve` runs as a child process (fork/exec), we wait until
 * its snapshot says events_applied == N, SIGTERM it, and check: exit 0; events_applied == N
 * exactly and mu_count == N; every rejected/<reason> == 1; the stored offset of every
 * partition == its high watermark (low watermarks 0: the mock kept everything). A second run
 * on the same snapshot with nothing new applies nothing twice. serve.dead_letter_topic: each
 * invalid message is copied raw, once, with its key and the mfs.* headers (reason, event index,
 * detail, original topic/partition/offset/timestamp) of docs/EVENT_FORMAT.md.
 */
#include "serve_help.h"

#include "serve/learner.h"


#define N_PARTS 3
#define N_EVENTS 50000

/* Header name of a dead letter as a string in buf. @return 1 if it is there (and fits). */
static int dl_header(rd_kafka_headers_t *h, const char *name, char *buf, size_t size)
{
	const void *v = NULL;
	size_t n = 0;
	if (!h || rd_kafka_header_get_last(h, name, &v, &n) || !v || n >= size)
		return 0;
	memcpy(buf, v, n);
	buf[n] = '\0';
	return 1;
}

/* The message at topic/partition/offset, through the consumer rk (its assignment is replaced). */
static rd_kafka_message_t *read_at(rd_kafka_t *rk, const char *topic, int32_t part, int64_t off)
{
	rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(tp, topic, part)->offset = off;
	rd_kafka_resp_err_t ke = rd_kafka_assign(rk, tp);
	rd_kafka_topic_partition_list_destroy(tp);
	for (double end = mfs_now_s() + test_seconds(10); !ke && mfs_now_s() < end;) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
		if (m && !m->err && m->partition == part && m->offset == off)
			return m;
		if (m)
			rd_kafka_message_destroy(m);
	}
	return NULL;
}

/* The dead-letter topic holds each invalid message once, raw, with its key and the headers of
 * docs/EVENT_FORMAT.md: mfs.reason, mfs.event_index (-1 for the message as a whole), mfs.detail
 * (the decoder's line), and mfs.topic/partition/offset/timestamp naming the original, which is
 * read back from the source topic and compared. */
static void check_dead_letters(const char *bs, const char *topic, const char *dlq)
{
	rd_kafka_t *rk = sh_consumer(bs, "mfs-test-dlq-reader"), *src = sh_consumer(bs, "mfs-test-dlq-source");
	if (!rk || !src)
		goto done;
	rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(tp, dlq, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
	TEST_OK(rd_kafka_assign(rk, tp));
	rd_kafka_topic_partition_list_destroy(tp);
	const mfs_event_opts_t eo = {0.5, 5.0, 0}; /* serve's rating.min/max defaults */
	mfs_events_t evs = {0};
	int seen[SH_N_BAD] = {0}, n = 0;
	double end = mfs_now_s() + test_seconds(10);
	while (n < (int)SH_N_BAD && mfs_now_s() < end) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
		if (!m)
			continue;
		if (m->err) {
			rd_kafka_message_destroy(m);
			continue;
		}
		n++;
		rd_kafka_headers_t *h = NULL;
		char reason[64], index[32], detail[512], otopic[256], opart[16], ooff[32], ots[32], want[512];
		if (rd_kafka_message_headers(m, &h))
			h = NULL;
		int all = dl_header(h, "mfs.reason", reason, sizeof reason) &&
		          dl_header(h, "mfs.event_index", index, sizeof index) &&
		          dl_header(h, "mfs.detail", detail, sizeof detail) &&
		          dl_header(h, "mfs.topic", otopic, sizeof otopic) &&
		          dl_header(h, "mfs.partition", opart, sizeof opart) &&
		          dl_header(h, "mfs.offset", ooff, sizeof ooff) && dl_header(h, "mfs.timestamp", ots, sizeof ots);
		TEST_ASSERT_MSG(all, "dead letter at %" PRId64 " lacks an mfs.* header", m->offset);
		size_t j = 0;
		while (j < SH_N_BAD && !(m->len == sh_bad[j].len && memcmp(m->payload, sh_bad[j].bytes, m->len) == 0))
			j++;
		TEST_ASSERT_MSG(j < SH_N_BAD, "dead letter at %" PRId64 " is none of the invalid messages", m->offset);
		if (!all || j == SH_N_BAD) {
			rd_kafka_message_destroy(m);
			continue;
		}
		seen[j]++;
		TEST_ASSERT_MSG(strcmp(reason, mfs_reject_name(sh_bad[j].reason)) == 0, "#%zu: reason %s, want %s", j,
		                reason, mfs_reject_name(sh_bad[j].reason));
		snprintf(want, sizeof want, "%ld", sh_bad[j].index);
		TEST_ASSERT_MSG(strcmp(index, want) == 0, "#%zu: mfs.event_index %s, want %s", j, index, want);
		int r;
		long idx;
		want[0] = '\0';
		mfs_event_decode(sh_bad[j].bytes, sh_bad[j].len, &eo, &evs, &r, &idx, want, sizeof want);
		TEST_ASSERT_MSG(*detail && strcmp(detail, want) == 0, "#%zu: mfs.detail \"%s\", want \"%s\"", j, detail,
		                want);
		/* where sh_produce_bad put it: partition j % N_PARTS, key "bad-<j>" */
		char key[32];
		snprintf(key, sizeof key, "bad-%zu", j);
		TEST_ASSERT_MSG(m->key_len == strlen(key) && memcmp(m->key, key, m->key_len) == 0, "#%zu: key %.*s", j,
		                (int)m->key_len, m->key ? (const char *)m->key : "");
		TEST_ASSERT_MSG(strcmp(otopic, topic) == 0, "#%zu: mfs.topic %s, want %s", j, otopic, topic);
		snprintf(want, sizeof want, "%d", (int)(j % N_PARTS));
		TEST_ASSERT_MSG(strcmp(opart, want) == 0, "#%zu: mfs.partition %s, want %s", j, opart, want);
		/* the original, read at mfs.offset: same bytes, same key, mfs.timestamp its timestamp */
		char *e1, *e2;
		long long off = strtoll(ooff, &e1, 10), part = strtoll(opart, &e2, 10);
		TEST_ASSERT_MSG(*ooff && !*e1 && off >= 0 && !*e2, "#%zu: mfs.offset %s", j, ooff);
		rd_kafka_message_t *o = read_at(src, topic, (int32_t)part, off);
		TEST_ASSERT_MSG(o != NULL, "#%zu: no message at %s/%s/%s", j, otopic, opart, ooff);
		if (o) {
			TEST_ASSERT_MSG(o->len == m->len && memcmp(o->payload, m->payload, m->len) == 0,
			                "#%zu: the message at %s/%s/%s is not the dead letter's", j, otopic, opart, ooff);
			TEST_ASSERT(o->key_len == m->key_len && memcmp(o->key, m->key, m->key_len) == 0);
			snprintf(want, sizeof want, "%" PRId64, rd_kafka_message_timestamp(o, NULL));
			TEST_ASSERT_MSG(strcmp(ots, want) == 0, "#%zu: mfs.timestamp %s, want %s", j, ots, want);
			rd_kafka_message_destroy(o);
		}
		rd_kafka_message_destroy(m);
	}
	for (size_t j = 0; j < SH_N_BAD; j++)
		TEST_ASSERT_MSG(seen[j] == 1, "invalid message #%zu (%s) dead-lettered %d times", j,
		                mfs_reject_name(sh_bad[j].reason), seen[j]);
	mfs_events_free(&evs);
done:
	if (src) {
		rd_kafka_consumer_close(src);
		rd_kafka_destroy(src);
	}
	if (rk) {
		rd_kafka_consumer_close(rk);
		rd_kafka_destroy(rk);
	}
}

/* Scrape /metrics while the service runs: the counters equal what was produced and rejected,
 * and once the topic is consumed every partition's lag reaches 0 (the gauge follows the
 * client's cached high watermarks, refreshed about once a second). */
static void check_metrics(const char *log, uint64_t n, const char *topic)
{
	int port = sh_logged_port(log);
	TEST_ASSERT_MSG(port > 0, "no metrics port in %s", log);
	static char body[1 << 20];
	TEST_EQ_INT(sh_http_get(port, "/healthz", body, sizeof body), 200);
	TEST_EQ_INT(sh_http_get(port, "/readyz", body, sizeof body), 200);
	TEST_EQ_INT(sh_http_get(port, "/metrics", body, sizeof body), 200);
	TEST_ASSERT_MSG(sh_metric(body, "mfstream_events_applied_total") == (double)n, "events_applied_total %g, want %" PRIu64,
	                sh_metric(body, "mfstream_events_applied_total"), n);
	TEST_ASSERT_MSG(sh_metric(body, "mfstream_events_consumed_total") == (double)n, "events_consumed_total %g",
	                sh_metric(body, "mfstream_events_consumed_total"));
	for (int r = 0; r < MFS_REJ__COUNT; r++) {
		char series[128];
		snprintf(series, sizeof series, "mfstream_messages_rejected_total{reason=\"%s\"}", mfs_reject_name(r));
		TEST_ASSERT_MSG(sh_metric(body, series) == 1, "%s = %g", series, sh_metric(body, series));
	}
	TEST_ASSERT_MSG(sh_metric(body, "mfstream_dead_letter_messages_total") == (double)SH_N_BAD, "dead letters %g",
	                sh_metric(body, "mfstream_dead_letter_messages_total"));
	TEST_ASSERT(sh_metric(body, "mfstream_snapshots_total") >= 1);
	TEST_ASSERT(sh_metric(body, "mfstream_partitions_assigned") == N_PARTS);
	TEST_ASSERT(sh_metric(body, "mfstream_event_to_snapshot_seconds_count") > 0);
	double age = sh_metric(body, "mfstream_snapshot_age_seconds");
	TEST_ASSERT_MSG(age >= 0 && age < 30, "snapshot age %g s", age);
	/* the learner's time by phase: each phase that had work shows some, and together they
	 * account for the learner's life (it starts after the engine opens, and idle time is
	 * published twice a second) */
	double sum = 0, up = (double)mfs_wall_ms() / 1000.0 - sh_metric(body, "mfstream_start_time_seconds");
	for (int p = 0; p < MFS_LPH__COUNT; p++) {
		char series[128];
		snprintf(series, sizeof series, "mfstream_learner_seconds{phase=\"%s\"}", mfs_learner_phase_name(p));
		double v = sh_metric(body, series);
		TEST_ASSERT_MSG(v >= 0, "%s = %g", series, v);
		if (p == MFS_LPH_WAIT || p == MFS_LPH_ROWS || p == MFS_LPH_SCORE || p == MFS_LPH_SUBMIT ||
		    p == MFS_LPH_RECORD || p == MFS_LPH_SNAPSHOT)
			TEST_ASSERT_MSG(v > 0, "%s = %g", series, v);
		sum += v;
	}
	TEST_ASSERT_MSG(sum <= up + 0.05 && sum >= 0.25 * up, "learner phases sum to %g s in %g s up", sum, up);
	double end = mfs_now_s() + test_seconds(30), lag = -1;
	for (;;) {
		lag = 0;
		for (int p = 0; p < N_PARTS && lag >= 0; p++) {
			char series[256];
			snprintf(series, sizeof series, "mfstream_consumer_lag_messages{topic=\"%s\",partition=\"%d\"}", topic, p);
			double v = sh_metric(body, series);
			lag = v < 0 ? -1 : lag + v;
		}
		if (lag == 0 || mfs_now_s() > end || sh_http_get(port, "/metrics", body, sizeof body) != 200)
			break;
		nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
	}
	TEST_ASSERT_MSG(lag == 0, "consumer lag %g after the topic was consumed (-1: a partition without the gauge)", lag);
	fprintf(stderr, "  /metrics: %g events applied, %g messages consumed, snapshot age %g s, learner phases %.2f s of %.2f s up\n",
	        sh_metric(body, "mfstream_events_applied_total"), sh_metric(body, "mfstream_messages_consumed_total"),
	        sh_metric(body, "mfstream_snapshot_age_seconds"), sum, up);
}

/* Every user and item of the produced stream (sh_synth_conf, seed) has a row in the snapshot,
 * and the snapshot has no others: a large batch resolves its users and items on two threads
 * (serve/rows.c), and neither side may lose, swap or invent an id. */
static void check_ids(mfs_snap_t *h, const mfs_snap_meta_t *m, long n, long seed)
{
	mfs_conf_t c;
	char e[512];
	sh_synth_conf(&c, n, seed);
	mfs_evsrc_t *src = NULL;
	TEST_OK(mfs_evsrc_open_synth(&c, &src, e, sizeof e));
	static unsigned char seen_u[1 << 16], seen_i[1 << 16];
	memset(seen_u, 0, sizeof seen_u);
	memset(seen_i, 0, sizeof seen_i);
	uint64_t users = 0, items = 0, missing = 0, events = 0;
	float bias, vec[256];
	mfs_event_t ev;
	while (src && mfs_evsrc_next(src, &ev) == 1) {
		events++;
		TEST_ASSERT(ev.user.kind == MFS_ID_U64 && ev.item.kind == MFS_ID_U64 && ev.user.num < sizeof seen_u &&
		            ev.item.num < sizeof seen_i && m->k <= 256);
		mfs_snap_id_t u = {MFS_SNAP_ID_U64, ev.user.num, NULL, 0}, i = {MFS_SNAP_ID_U64, ev.item.num, NULL, 0};
		if (!seen_u[ev.user.num]) {
			seen_u[ev.user.num] = 1;
			users++;
			missing += mfs_snap_user(h, &u, &bias, vec) != 0;
		}
		if (!seen_i[ev.item.num]) {
			seen_i[ev.item.num] = 1;
			items++;
			missing += mfs_snap_item(h, &i, &bias, vec) != 0;
		}
	}
	TEST_EQ_INT(events, n);
	TEST_EQ_INT(missing, 0);
	TEST_EQ_INT(m->n_users, users);
	TEST_EQ_INT(m->n_items, items);
	mfs_evsrc_close(src);
	mfs_conf_free(&c);
}

static void test_serve_exactly_once(void)
{
	char e[512];
	sh_env_t v;
	const char *topic = "ratings";
	if (sh_env_open(&v, 3, topic, N_PARTS))
		return;
	topic = v.topic; /* its name on this broker */
	const char *bs = v.bs, *snap = v.snap, *log = v.log;
	char dlq[160];
	if (sh_env_topic(&v, "dead-letters", 1, dlq, sizeof dlq))
		return;
	uint64_t n = sh_produce_valid(bs, topic, N_EVENTS, 11);
	TEST_EQ_INT(n, N_EVENTS);
	sh_produce_bad(bs, topic, N_PARTS);

	double t0 = mfs_now_s();
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-serve", log, dlq, NULL);
	int died;
	sh_snap_t s = sh_wait_events(snap, pid, n, 90, &died);
	TEST_ASSERT_MSG(!died, "serve exited early (log %s)", log);
	TEST_ASSERT_MSG(s.found && s.events == n, "events_applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events, n, log);
	fprintf(stderr, "  %" PRIu64 " events applied and published in %.2f s\n", s.events, mfs_now_s() - t0);
	/* the rejected messages follow the valid ones: wait until a snapshot covers the whole topic */
	int64_t lo[N_PARTS], hi[N_PARTS];
	sh_watermarks(bs, topic, N_PARTS, lo, hi);
	double t_end = mfs_now_s() + test_seconds(30);
	for (int covered = 0; !covered && mfs_now_s() < t_end;) {
		s = sh_read(snap);
		covered = 1;
		for (int p = 0; p < N_PARTS; p++)
			covered &= s.off[p] == hi[p];
		if (!covered)
			nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	}
	check_metrics(log, n, topic);
	TEST_EQ_INT(sh_stop(pid, 30), 0);
	sh_watermarks(bs, topic, N_PARTS, lo, hi);
	s = sh_read(snap);
	TEST_ASSERT(s.found);
	TEST_EQ_INT(s.events, n);
	TEST_EQ_INT(s.mu_count, n);
	/* test-then-train RMSE of the last interval: a learning model on ratings in [1, 5] */
	TEST_ASSERT_MSG(isfinite(s.pq_rmse) && s.pq_rmse > 0.1 && s.pq_rmse < 1.6, "prequential_rmse %g", s.pq_rmse);
	/* the stream learns at serve.lr (fixed schedule by default), not at train's sgd.lr */
	TEST_ASSERT_MSG(fabs(s.lr - 0.03) < 1e-6, "learning_rate %g, serve.lr's default 0.03 expected", s.lr);
	for (int r = 0; r < MFS_REJ__COUNT; r++)
		TEST_ASSERT_MSG(s.rejected[r] == 1, "rejected/%s = %" PRIu64, mfs_reject_name(r), s.rejected[r]);
	for (int p = 0; p < N_PARTS; p++) {
		TEST_ASSERT_MSG(lo[p] == 0, "[%d] low watermark %" PRId64, p, lo[p]);
		TEST_ASSERT_MSG(hi[p] > 0 && s.off[p] == hi[p], "[%d] stored offset %" PRId64 ", high watermark %" PRId64, p,
		                s.off[p], hi[p]);
	}

	check_dead_letters(bs, topic, dlq);

	/* restart on the same snapshot (another group: committed offsets must not matter) */
	uint64_t seq = s.seq;
	pid = sh_spawn(bs, topic, snap, "mfs-test-serve-2", log, NULL, NULL);
	nanosleep(&(struct timespec){3, 0}, NULL);
	TEST_EQ_INT(sh_stop(pid, 30), 0);
	s = sh_read(snap);
	TEST_EQ_INT(s.events, n);
	TEST_EQ_INT(s.mu_count, n);
	TEST_ASSERT_MSG(s.seq == seq, "a restart with nothing new published seq %" PRIu64 " (was %" PRIu64 ")", s.seq,
	                seq);
	for (int p = 0; p < N_PARTS; p++)
		TEST_EQ_INT(s.off[p], hi[p]);
	/* the reader sees real factors */
	mfs_snap_t *h = NULL;
	TEST_OK(mfs_snap_open(snap, &h, e, sizeof e));
	if (h) {
		mfs_snap_meta_t m;
		TEST_OK(mfs_snap_get_meta(h, &m));
		TEST_ASSERT(m.n_users > 100 && m.n_items > 100 && m.k == sh_k());
		TEST_ASSERT(m.mu > 1 && m.mu < 5);
		check_ids(h, &m, N_EVENTS, 11);
		mfs_snap_close(h);
	}

	/* the whole topic again into a new snapshot, in batches large enough (the backlog fills
	 * them) to resolve users and items on two threads: still every id has its row. The
	 * learner holds each batch a second (test.apply_delay_ms), so the consumer has the next
	 * one queued when the learner looks: its ids are looked up ahead (serve.rows_ahead; not
	 * beside the seen-items tracker, which has the pool then) */
	char snap2[400];
	snprintf(snap2, sizeof snap2, "%s/snap-big", v.dir);
	const char *big[] = {"--serve.batch_size", "16384", "--serve.exit_at_end", "true", "--lr", "0.05",
	                     "--test.apply_delay_ms", "1000", "--snapshot.seen_items", "0", NULL};
	pid = sh_spawn(bs, topic, snap2, "mfs-test-serve-3", log, NULL, big);
	TEST_EQ_INT(sh_wait_exit(pid, 60), 0);
	const long ahead = sh_log_value(log, "learner done", "rows_ahead=");
	TEST_ASSERT_MSG(ahead >= 1, "batches looked up ahead: %ld (the learner's final line)", ahead);
	s = sh_read(snap2);
	TEST_EQ_INT(s.events, n);
	TEST_ASSERT_MSG(fabs(s.lr - 0.05) < 1e-6, "learning_rate %g: serve's --lr is serve.lr (0.05)", s.lr);
	h = NULL;
	TEST_OK(mfs_snap_open(snap2, &h, e, sizeof e));
	if (h) {
		mfs_snap_meta_t m;
		TEST_OK(mfs_snap_get_meta(h, &m));
		check_ids(h, &m, N_EVENTS, 11);
		mfs_snap_close(h);
	}
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_serve_exactly_once);
	return TEST_REPORT();
}
