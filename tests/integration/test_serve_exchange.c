/* test_serve_exchange.c - exchange.topic: two `mfstream serve` processes (hosts a and b), each
 * on its own rating topic (users split between them, as partitions split them in one group),
 * share item factors through a third topic (serve/exchange.h, docs/SCALE_OUT.md).
 *
 * A message that is not a contribution is on the exchange topic first (both hosts count it and
 * go on). Host b learns items 21..60 from its users (21..40 rated 5, 41..60 rated 3); then host
 * a learns items 1..40 from its own (1..20 rated 5, 21..40 rated 2). Both stay up until each
 * has merged every row the other published (their metrics), then stop. Then: each gave rows to
 * the items only the other's users rated, with what the other learned of them (biases within
 * 20 %: 200 ratings each, merged as that many virtual ratings); on items 21..40, which both
 * rated, b moved from its own value towards a's ratings and neither went past a's (where
 * exactly depends on whether a took b's contributions in before its own ratings: both orders
 * happen, on the mock and the real broker). Then a restarts from its snapshot and no item moves (b's contributions, already in
 * the snapshot, are not merged twice). The merge's arithmetic is the CPU reference's (gpu/shard.h mfs_shard_hosts_merge,
 * test_shard_ref). No timing: every wait is on a condition, with the suite's time scale.
 */
#include "serve_help.h"

#define N_USERS 200

/* Every user u0 + 0..N_USERS-1 rates items i0..i1, one user after another: item i gets r_lo
 * below split, r_hi from it (users take turns, so the running mean settles at once and the item
 * biases carry the difference). */
static void produce_block(const char *bs, const char *topic, uint64_t u0, uint64_t i0, uint64_t i1, uint64_t split,
                          float r_lo, float r_hi)
{
	mfs_conf_t c;
	char e[512];
	TEST_OK(mfs_conf_init(&c));
	mfs_producer_opts_t o = {bs, topic, 0, 100, 0, 0, 0, 0};
	mfs_producer_t *p = NULL;
	TEST_ASSERT_MSG(mfs_producer_open(&c, &o, &p, e, sizeof e) == 0, "%s", e);
	for (uint64_t u = u0; p && u < u0 + N_USERS; u++)
		for (uint64_t i = i0; i <= i1; i++) {
			mfs_event_t ev = {mfs_id_u64(u), mfs_id_u64(i), i < split ? r_lo : r_hi, 0, 0, 0};
			TEST_OK(mfs_producer_send(p, &ev));
		}
	if (p) {
		TEST_OK(mfs_producer_flush(p, e, sizeof e));
		mfs_producer_close(p);
	}
	mfs_conf_free(&c);
}

static void produce_garbage(const char *bs, const char *topic)
{
	char e[512];
	rd_kafka_conf_t *kc = rd_kafka_conf_new();
	rd_kafka_conf_set(kc, "bootstrap.servers", bs, e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, e, sizeof e);
	TEST_ASSERT_MSG(rk != NULL, "%s", e);
	if (!rk)
		return;
	TEST_OK(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_VALUE("\x93\x01\x02\x03", 4),
	                          RD_KAFKA_V_KEY("x", 1), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END));
	TEST_OK(rd_kafka_flush(rk, 20000));
	rd_kafka_destroy(rk);
}

/* The bias of item `item` in the snapshot at dir; NAN when the snapshot or the item is not there. */
static double item_bias(const char *dir, uint64_t item)
{
	mfs_snap_t *s = NULL;
	char e[256], txt[32];
	float b = NAN, vec[64];
	if (mfs_snap_open(dir, &s, e, sizeof e))
		return NAN;
	mfs_snap_id_t id;
	snprintf(txt, sizeof txt, "%" PRIu64, item);
	if (mfs_snap_id_parse(txt, &id) || mfs_snap_item(s, &id, &b, vec))
		b = NAN;
	for (int f = 0; f < sh_k() && isfinite(b); f++)
		if (!isfinite(vec[f]))
			b = NAN;
	mfs_snap_close(s);
	return b;
}

/* Mean item bias of items i0..i1 in the snapshot at dir. */
static double mean_bias(const char *dir, uint64_t i0, uint64_t i1)
{
	double sum = 0;
	for (uint64_t i = i0; i <= i1; i++)
		sum += item_bias(dir, i);
	return sum / (double)(i1 - i0 + 1);
}

/* A counter of the service whose metrics listen on port; -1 when it does not answer. */
static double counter(int port, const char *name)
{
	static char body[1 << 20];
	return port > 0 && sh_http_get(port, "/metrics", body, sizeof body) == 200 ? sh_metric(body, name) : -1;
}

/* Each host has merged every row the other published (every message carries new ratings) and
 * given rows to the 20 items only the other's users rated. */
static int both_merged(int port_a, int port_b)
{
	const double pa = counter(port_a, "mfstream_exchange_published_rows_total"),
	             pb = counter(port_b, "mfstream_exchange_published_rows_total"),
	             ma = counter(port_a, "mfstream_exchange_merged_rows_total"),
	             mb = counter(port_b, "mfstream_exchange_merged_rows_total");
	return pa >= 40 && pb >= 40 && ma >= pb && mb >= pa &&
	       counter(port_b, "mfstream_exchange_items_added_total") == 20;
}

static void test_two_hosts(void)
{
	sh_env_t v;
	char ta[256], tb[256], tx[256], snap_b[600], log_b[600];
	if (sh_env_open(&v, 1, "xch-a", 2))
		return;
	snprintf(ta, sizeof ta, "%s", v.topic);
	if (sh_env_topic(&v, "xch-b", 2, tb, sizeof tb) || sh_env_topic(&v, "xch-items", 2, tx, sizeof tx))
		return;
	snprintf(snap_b, sizeof snap_b, "%s/snap-b", v.dir);
	snprintf(log_b, sizeof log_b, "%s/serve-b.log", v.dir);
	produce_garbage(v.bs, tx);

	/* host b learns its users' ratings of items 21..60 first (21..40: 5, 41..60: 3) */
	produce_block(v.bs, tb, 100001, 21, 60, 41, 5.0f, 3.0f);
	const char *xb[] = {"--exchange.topic", tx, "--exchange.host", "b", "--serve.replay", "0", NULL};
	pid_t pb = sh_spawn(v.bs, tb, snap_b, "xch-group-b", log_b, NULL, xb);
	const uint64_t want = 40 * N_USERS;
	int died = 0;
	sh_snap_t s = sh_wait_events(snap_b, pb, want, test_seconds(120), &died);
	TEST_ASSERT_MSG(!died && s.events + s.held_out == want, "host b: %" PRIu64 " events (log %s)", s.events, log_b);
	const double own0 = mean_bias(snap_b, 21, 40); /* b alone */

	/* host a: items 1..20 rated 5, 21..40 rated 2 */
	produce_block(v.bs, ta, 1, 1, 40, 21, 5.0f, 2.0f);
	const char *xa[] = {"--exchange.topic", tx, "--exchange.host", "a", "--serve.replay", "0", NULL};
	pid_t pa = sh_spawn(v.bs, ta, v.snap, "xch-group-a", v.log, NULL, xa);
	s = sh_wait_events(v.snap, pa, want, test_seconds(120), &died);
	TEST_ASSERT_MSG(!died && s.events + s.held_out == want, "host a: %" PRIu64 " events (log %s)", s.events, v.log);
	/* each takes the other's contributions in (while idle, or before its own events); the
	 * counters follow within half a second */
	const int port_a = sh_logged_port(v.log), port_b = sh_logged_port(log_b);
	const double t0 = mfs_now_s();
	while (!both_merged(port_a, port_b) && mfs_now_s() - t0 < test_seconds(90) && !sh_exited(pa) && !sh_exited(pb))
		mfs_sleep_ms(100);
	TEST_ASSERT_MSG(both_merged(port_a, port_b), "the hosts did not take each other's contributions in (logs %s, %s)",
	                v.log, log_b);
	TEST_ASSERT(counter(port_b, "mfstream_exchange_bad_messages_total") == 1);
	/* stopped, each writes what it merged in its final snapshot */
	TEST_ASSERT_MSG(sh_stop(pa, test_seconds(60)) == 0, "host a did not stop cleanly (log %s)", v.log);
	TEST_ASSERT_MSG(sh_stop(pb, test_seconds(60)) == 0, "host b did not stop cleanly (log %s)", log_b);
	const char *logs[2] = {v.log, log_b};
	for (int h = 0; h < 2; h++) {
		TEST_EQ_INT(sh_log_value(logs[h], "exchange done", "bad_messages="), 1); /* counted, skipped */
		TEST_EQ_INT(sh_log_value(logs[h], "exchange done", "produce_errors="), 0);
		const long pub = sh_log_value(logs[h], "exchange done", "published_rows=");
		const long merged = sh_log_value(logs[h], "exchange done", "merged_rows=");
		const long added = sh_log_value(logs[h], "exchange done", "items_added=");
		TEST_ASSERT_MSG(pub >= 40 && merged >= 40, "published %ld, merged %ld (log %s)", pub, merged, logs[h]);
		/* b: items 1..20; a: 41..60, and 21..40 where b's came before a's own ratings */
		TEST_ASSERT_MSG(added >= 20 && added <= (h ? 20 : 40), "%ld items added (log %s)", added, logs[h]);
	}
	/* items only one host's users rated: the other holds what it learned (200 ratings each,
	 * merged as that many virtual ratings) */
	for (uint64_t i = 1; i <= 60; i += (i == 20 ? 21 : 1)) {
		const double ba = item_bias(v.snap, i), bb = item_bias(snap_b, i), ref = i <= 20 ? ba : bb;
		TEST_ASSERT_MSG(isfinite(ba) && isfinite(bb) && fabs(ref) > 0.5 && fabs(bb - ba) <= 0.2 * fabs(ref),
		                "item %" PRIu64 ": bias %.4f on a, %.4f on b", i, ba, bb);
	}
	/* items 21..40, rated 5 by b's users and 2 by as many of a's: b's value moves from b alone
	 * towards a's ratings, and neither goes past a's (a's value if a took b's in before its
	 * own ratings, as serial SGD would; nearer halfway if each trained before it saw the
	 * other's, each then where its own order of merges left it, as asynchronous replicas are
	 * until their rows are rated again: on the real broker a -0.54, b -0.84 once) */
	const double ma = mean_bias(v.snap, 21, 40), mb = mean_bias(snap_b, 21, 40);
	fprintf(stderr, "  items 21..40, mean bias: b alone %.4f; after the exchange a %.4f, b %.4f\n", own0, ma, mb);
	TEST_ASSERT_MSG(isfinite(ma) && ma > -1.8 && ma < own0 - 0.5, "a %.4f (b alone %.4f)", ma, own0);
	TEST_ASSERT_MSG(isfinite(mb) && own0 > 0.5 && mb < own0 - 0.5 && mb > -1.8, "b %.4f (alone %.4f)", mb, own0);

	/* a restarts from its snapshot: it reads the topic to its end before its first batch, takes
	 * its own contributions back and counts b's as merged (its snapshot has them): no item
	 * moves (merging them again would count b's moves twice) */
	double before[61];
	for (uint64_t i = 1; i <= 60; i++)
		before[i] = item_bias(v.snap, i);
	const uint64_t seq_a = sh_read(v.snap).seq;
	char log_a2[600];
	snprintf(log_a2, sizeof log_a2, "%s/serve-a2.log", v.dir);
	pa = sh_spawn(v.bs, ta, v.snap, "xch-group-a", log_a2, NULL, xa);
	TEST_ASSERT_MSG(sh_logged_port(log_a2) > 0, "a did not come back (log %s)", log_a2);
	TEST_ASSERT_MSG(sh_stop(pa, test_seconds(60)) == 0, "host a did not stop cleanly (log %s)", log_a2);
	/* (a merge would have made a snapshot: the shutdown's is written only when something changed) */
	fprintf(stderr, "  a's snapshot sequence %" PRIu64 " before the restart, %" PRIu64 " after\n", seq_a,
	        sh_read(v.snap).seq);
	TEST_EQ_INT(sh_log_value(log_a2, "exchange done", "merged_rows="), 0);
	TEST_EQ_INT(sh_log_value(log_a2, "exchange done", "items_added="), 0);
	for (uint64_t i = 1; i <= 60; i++) {
		const double after = item_bias(v.snap, i);
		TEST_ASSERT_MSG(after == before[i], "item %" PRIu64 ": bias %.6f before the restart, %.6f after", i,
		                before[i], after);
	}
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_two_hosts);
	return TEST_REPORT();
}
