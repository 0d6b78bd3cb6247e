/* service.c - see service.h: the consumer thread of `mfstream serve`.
 *
 * DESIGN: two threads. This one polls Kafka, decodes and validates messages (rejections are
 * counted, logged at a bounded rate and copied to the dead-letter topic), and fills batches of
 * whole messages that it pushes into the bounded ring (ingest/batcher.h). The learner thread
 * (ingest/learner.c) owns model, engine and snapshots and applies the batches in order.
 *
 * Backpressure: when the ring is full, the batch being filled is sealed and every assigned
 * partition is paused (rd_kafka_pause_partitions: librdkafka stops fetching and drops what it
 * had prefetched for them; on resume it fetches again from the next undelivered offset). This
 * thread keeps polling (heartbeats, rebalances, max.poll.interval.ms) and retries the push;
 * once the ring is at most half full the partitions are resumed. Nothing is dropped and nothing
 * grows: memory is bounded by (serve.ring_batches + 2) batches plus librdkafka's queues.
 *
 * Revocation and shutdown push a barrier batch and wait until the learner has applied
 * everything before it and published a snapshot, so the offsets of revoked partitions are in
 * LMDB before anyone else can own them.
 */
#include "ingest/service.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "common/err.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "ingest/batcher.h"
#include "ingest/event.h"
#include "ingest/kafka_consumer.h"
#include "ingest/kafka_util.h"
#include "ingest/learner.h"
#include "ops/catalog.h"
#include "ops/http.h"
#include "ops/metrics.h"

typedef struct part {
	char *topic; /* lives until the service ends: batches point at it */
	int32_t partition;
	int64_t next; /* next offset to take in (last taken + 1) */
	int assigned;
	int at_end;   /* partition EOF was reported at `next` and nothing came after it */
} part_t;

typedef struct svc {
	const mfs_conf_t *c;
	mfs_bring_t ring;
	int ring_ok;
	mfs_learner_t *l;
	int learner_done;
	rd_kafka_t *rk, *dlq;
	mfs_consumer_cbs_t cbs;
	mfs_event_opts_t eo;
	mfs_events_t evs;
	mfs_ebatch_t *cur; /* the batch being filled */
	int sealed;        /* cur is complete and waits for room in the ring */
	int paused;
	uint64_t pauses;
	part_t *parts;
	size_t n_parts;
	mfs_log_rl_t rej_rl; /* rejected-message log lines: at most one per second */
	int fatal;
	uint64_t messages;
	/* operations: Prometheus registry, its catalogue, the HTTP endpoint */
	mfs_metrics_t *reg;
	mfs_catalog_t cat;
	mfs_http_t *http;
	double next_lag;
	char err[1024];
} svc_t;

static part_t *part_get(svc_t *s, const char *topic, int32_t partition, int add)
{
	for (size_t j = 0; j < s->n_parts; j++)
		if (s->parts[j].partition == partition && strcmp(s->parts[j].topic, topic) == 0)
			return &s->parts[j];
	if (!add)
		return NULL;
	part_t *np = realloc(s->parts, (s->n_parts + 1) * sizeof *np);
	if (!np)
		return NULL;
	s->parts = np;
	part_t *p = &np[s->n_parts];
	if (!(p->topic = strdup(topic)))
		return NULL;
	p->partition = partition;
	p->next = -1;
	p->assigned = 0;
	s->n_parts++;
	return p;
}

/* Pause or resume every assigned partition. */
static void set_paused(svc_t *s, int pause)
{
	rd_kafka_topic_partition_list_t *a = NULL;
	if (rd_kafka_assignment(s->rk, &a) == 0 && a) {
		rd_kafka_resp_err_t ke = pause ? rd_kafka_pause_partitions(s->rk, a) : rd_kafka_resume_partitions(s->rk, a);
		if (ke)
			mfs_warn("serve", "msg=\"%s partitions failed\" err=\"%s\"", pause ? "pause" : "resume",
			         rd_kafka_err2str(ke));
		if (!pause) {
			/* librdkafka 2.0's fetcher notices a resume only on its next wakeup (up to ~1 s); a seek
			 * to the next offset we take in restarts the fetch at once (re-deliveries are skipped) */
			for (int j = 0; j < a->cnt; j++) {
				part_t *p = part_get(s, a->elems[j].topic, a->elems[j].partition, 0);
				a->elems[j].offset = p && p->next >= 0 ? p->next : RD_KAFKA_OFFSET_INVALID;
			}
			rd_kafka_error_t *se = rd_kafka_seek_partitions(s->rk, a, 0);
			if (se)
				rd_kafka_error_destroy(se);
		}
	}
	if (pause && !s->paused) {
		s->pauses++;
		mfs_counter_add(s->cat.partition_pauses, a ? (uint64_t)a->cnt : 0);
	}
	mfs_gauge_set(s->cat.partitions_paused, pause && a ? a->cnt : 0);
	s->paused = pause;
	if (a)
		rd_kafka_topic_partition_list_destroy(a);
	mfs_debug("serve", "msg=%s ring_fill=%zu", pause ? "paused" : "resumed", mfs_bring_fill(&s->ring));
}

/* Hand the sealed batch to the learner, waiting at most timeout_ms; pause while the ring is full.
 * @return 0 (pushed, or still sealed and paused), EPIPE (the learner failed), ENOMEM. */
static int push_sealed(svc_t *s, int timeout_ms)
{
	if (!s->sealed)
		return 0;
	int rc = mfs_bring_push(&s->ring, s->cur, timeout_ms);
	if (rc == ETIMEDOUT) {
		if (!s->paused)
			set_paused(s, 1);
		return 0;
	}
	if (rc)
		return rc;
	s->sealed = 0;
	if (!(s->cur = mfs_bring_get(&s->ring)))
		return ENOMEM;
	return 0;
}

static int seal(svc_t *s)
{
	if (s->sealed || mfs_ebatch_empty(s->cur))
		return 0;
	s->sealed = 1;
	return push_sealed(s, 0);
}

/* Push cur with a barrier and wait until the learner has published the snapshot after it. */
static int barrier(svc_t *s, int kind)
{
	s->cur->barrier = kind;
	s->cur->barrier_gen = mfs_bring_next_barrier(&s->ring);
	uint64_t gen = s->cur->barrier_gen;
	s->sealed = 1;
	int rc;
	do
		rc = mfs_bring_push(&s->ring, s->cur, 200);
	while (rc == ETIMEDOUT);
	if (rc)
		return rc;
	s->sealed = 0;
	if (!(s->cur = mfs_bring_get(&s->ring)))
		return ENOMEM;
	return mfs_bring_wait_barrier(&s->ring, gen);
}

/* serve.exit_at_end: something is assigned and every assigned partition is at its end */
static int all_at_end(const svc_t *s)
{
	size_t n = 0;
	for (size_t j = 0; j < s->n_parts; j++) {
		if (!s->parts[j].assigned)
			continue;
		if (!s->parts[j].at_end)
			return 0;
		n++;
	}
	return n > 0;
}

static void gauge_assigned(svc_t *s)
{
	size_t n = 0;
	for (size_t j = 0; j < s->n_parts; j++)
		n += s->parts[j].assigned;
	mfs_gauge_set(s->cat.partitions_assigned, (double)n);
}

static void on_assign(void *ctx, rd_kafka_topic_partition_list_t *parts)
{
	svc_t *s = ctx;
	for (int j = 0; j < parts->cnt; j++) {
		rd_kafka_topic_partition_t *tp = &parts->elems[j];
		part_t *p = part_get(s, tp->topic, tp->partition, 1);
		if (!p) {
			s->fatal = ENOMEM;
			continue;
		}
		p->assigned = 1;
		p->at_end = 0;
		tp->offset = p->next >= 0 ? p->next : RD_KAFKA_OFFSET_BEGINNING;
	}
	gauge_assigned(s);
	mfs_http_set_ready(s->http, 1);
}

static void on_revoke(void *ctx, const rd_kafka_topic_partition_list_t *parts)
{
	svc_t *s = ctx;
	if (s->paused) {
		/* librdkafka keeps a partition's pause flag across a rebalance: clear it now, or a
		 * partition assigned back to us would stay paused for good */
		rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_copy(parts);
		rd_kafka_resume_partitions(s->rk, l);
		rd_kafka_topic_partition_list_destroy(l);
	}
	if (!s->learner_done && !s->fatal) {
		int rc = barrier(s, MFS_EBATCH_SNAPSHOT);
		if (rc) {
			mfs_error("serve", "msg=\"snapshot on revoke failed\" err=\"%s\"", mfs_strerror(rc));
			s->fatal = rc;
		}
	}
	for (int j = 0; j < parts->cnt; j++) {
		part_t *p = part_get(s, parts->elems[j].topic, parts->elems[j].partition, 0);
		if (p) {
			p->assigned = 0;
			char pn[16];
			snprintf(pn, sizeof pn, "%d", (int)p->partition);
			mfs_family_remove(s->cat.consumer_lag, (const char *const[]){p->topic, pn});
		}
	}
	gauge_assigned(s);
	mfs_gauge_set(s->cat.partitions_paused, 0);
	s->paused = 0; /* the ring was drained; a new assignment starts unpaused */
}

static void reject(svc_t *s, const rd_kafka_message_t *msg, int reason, long index, const char *detail)
{
	if (reason < 0 || reason >= MFS_REJ__COUNT)
		reason = MFS_REJ_WRONG_TYPE;
	s->cur->rejected[reason]++;
	mfs_log_ratelimited(&s->rej_rl, 1000, MFS_LOG_WARN, "serve",
	                    "msg=rejected reason=%s topic=%s partition=%d offset=%" PRId64 " event=%ld detail=\"%s\"",
	                    mfs_reject_name(reason), rd_kafka_topic_name(msg->rkt), (int)msg->partition, msg->offset, index,
	                    detail);
	if (s->dlq) {
		rd_kafka_resp_err_t ke = rd_kafka_producev(
			s->dlq, RD_KAFKA_V_TOPIC(s->c->serve_dead_letter_topic),
			RD_KAFKA_V_VALUE(msg->payload, msg->len), RD_KAFKA_V_KEY(msg->key, msg->key_len),
			RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
			RD_KAFKA_V_HEADER("mfs.reason", mfs_reject_name(reason), (ssize_t)-1), RD_KAFKA_V_END);
		if (ke)
			mfs_warn("serve", "msg=\"dead-letter produce failed\" err=\"%s\"", rd_kafka_err2str(ke));
		else
			mfs_counter_inc(s->cat.dead_letter_messages);
		rd_kafka_poll(s->dlq, 0);
	}
}

static int handle(svc_t *s, rd_kafka_message_t *msg)
{
	if (msg->err) {
		if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF && msg->rkt) {
			/* only at `next`: an end reported before a pause dropped the prefetched messages
			 * lies behind what is still to be read */
			part_t *p = part_get(s, rd_kafka_topic_name(msg->rkt), msg->partition, 0);
			int64_t lo = -1, hi = -1;
			if (p && p->assigned && p->next < 0) /* nothing taken yet: at the end if it is empty */
				rd_kafka_get_watermark_offsets(s->rk, p->topic, p->partition, &lo, &hi);
			if (p && p->assigned && (msg->offset == p->next || (p->next < 0 && lo >= 0 && msg->offset == lo)))
				p->at_end = 1;
		} else if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
			mfs_warn("serve", "msg=\"consumer error\" err=\"%s\"", rd_kafka_message_errstr(msg));
		}
		rd_kafka_message_destroy(msg);
		return 0;
	}
	part_t *p = part_get(s, rd_kafka_topic_name(msg->rkt), msg->partition, 1);
	if (!p) {
		rd_kafka_message_destroy(msg);
		return mfs_errf(s->err, sizeof s->err, ENOMEM, "out of memory");
	}
	p->at_end = 0;
	int64_t offset = msg->offset;
	if (p->next >= 0 && offset < p->next) {
		rd_kafka_message_destroy(msg); /* already taken in (a re-delivery): exactly once */
		mfs_counter_inc(s->cat.messages_redelivered);
		return 0;
	}
	s->messages++;
	mfs_counter_inc(s->cat.messages_consumed);
	if (s->cur->messages == 0)
		s->cur->t_first = mfs_now_s();
	int reason = 0, rc;
	long index = -1;
	char detail[256] = "";
	rc = mfs_event_decode(msg->payload, msg->len, &s->eo, &s->evs, &reason, &index, detail, sizeof detail);
	if (rc == MFS_EDECODE) {
		reject(s, msg, reason, index, detail);
		rd_kafka_message_destroy(msg);
	} else if (rc || (rc = mfs_ebatch_add_events(s->cur, s->evs.ev, s->evs.n, msg, s->c->serve_holdout_fraction))) {
		rd_kafka_message_destroy(msg);
		return mfs_errf(s->err, sizeof s->err, rc, "decode: %s", mfs_strerror(rc));
	} else {
		mfs_counter_add(s->cat.events_consumed, s->evs.n);
	}
	/* msg now belongs to the batch (its payload holds the string ids) or is gone */
	if ((rc = mfs_ebatch_advance(s->cur, p->topic, p->partition, offset + 1)))
		return mfs_errf(s->err, sizeof s->err, rc, "out of memory");
	s->cur->messages++;
	p->next = offset + 1;
	if (s->cur->n >= (size_t)s->c->serve_batch_size)
		return seal(s);
	if (s->sealed && !s->paused)
		set_paused(s, 1); /* a message arrived after the pause (e.g. a new assignment): pause again */
	return 0;
}

static int open_dlq(svc_t *s, const char *brokers, char *errstr, size_t es)
{
	static const char *const defaults[] = {"compression.codec", "zstd", "enable.idempotence", "true", NULL};
	rd_kafka_conf_t *kc;
	char e[512];
	int rc = mfs_kafka_conf_new_with(s->c, defaults, &kc, errstr, es);
	if (rc)
		return rc;
	if (brokers && *brokers && rd_kafka_conf_set(kc, "bootstrap.servers", brokers, e, sizeof e)) {
		rd_kafka_conf_destroy(kc);
		return mfs_errf(errstr, es, MFS_ECONFIG, "%s", e);
	}
	/* consumer-only keys of kafka.* make a producer warn, not fail */
	if (!(s->dlq = rd_kafka_new(RD_KAFKA_PRODUCER, kc, e, sizeof e))) {
		rd_kafka_conf_destroy(kc);
		return mfs_errf(errstr, es, MFS_EKAFKA, "dead-letter producer: %s", e);
	}
	return 0;
}

/* At every scrape (HTTP thread, under the registry's render lock): copy what the learner
 * publishes about itself. Counters restored from the snapshot (rejections, events) are set,
 * so they continue across restarts like the snapshot's own. */
static void scrape_hook(mfs_metrics_t *r, void *ctx)
{
	(void)r;
	svc_t *s = ctx;
	mfs_catalog_t *c = &s->cat;
	mfs_learner_stats_t st;
	mfs_learner_get_stats(s->l, &st);
	mfs_counter_set(c->events_applied, st.events_applied);
	mfs_counter_set(c->updates, st.events_applied);
	mfs_counter_set(c->events_held_out, st.events_held_out);
	for (int j = 0; j < MFS_REJ__COUNT && j < MFS_CAT_FIXED_MAX; j++)
		mfs_counter_set(c->messages_rejected_at[j], st.rejected[j]);
	mfs_gauge_set(c->learning_rate, st.lr);
	mfs_gauge_set(c->window_rmse, st.window_rmse);
	mfs_gauge_set(c->holdout_rmse, st.holdout_rmse);
	mfs_gauge_set(c->prequential_rmse, st.prequential_rmse);
	for (int j = 0; j < MFS_LPH__COUNT && j < MFS_CAT_FIXED_MAX; j++)
		mfs_gauge_set(c->learner_seconds_at[j], st.phase_s[j]);
	mfs_gauge_set(c->model_rows_at[MFS_CAT_USERS], st.n_users);
	mfs_gauge_set(c->model_rows_at[MFS_CAT_ITEMS], st.n_items);
	mfs_gauge_set(c->model_capacity_rows_at[MFS_CAT_USERS], st.cap_users);
	mfs_gauge_set(c->model_capacity_rows_at[MFS_CAT_ITEMS], st.cap_items);
	mfs_counter_set(c->snapshots, st.snapshots);
	if (st.snap_wall_s > 0) {
		mfs_gauge_set(c->snapshot_sequence, (double)st.snap_seq);
		mfs_gauge_set(c->snapshot_timestamp, st.snap_wall_s);
		mfs_gauge_set(c->snapshot_age, (double)mfs_wall_ms() / 1000.0 - st.snap_wall_s);
		mfs_gauge_set(c->snapshot_rows_at[MFS_CAT_USERS], (double)st.snap_users);
		mfs_gauge_set(c->snapshot_rows_at[MFS_CAT_ITEMS], (double)st.snap_items);
	}
	mfs_gauge_set(c->ring_batches_queued, (double)mfs_bring_fill(&s->ring));
	mfs_gauge_set(c->ring_batches_capacity, (double)s->c->serve_ring_batches);
	mfs_gauge_set(c->gpu_memory_used, st.gpu_mem_used);
	mfs_gauge_set(c->gpu_memory_total, st.gpu_mem_total);
}

/* Consumer lag per assigned partition from librdkafka's cached high watermarks (no request). */
static void update_lag(svc_t *s)
{
	for (size_t j = 0; j < s->n_parts; j++) {
		part_t *p = &s->parts[j];
		int64_t lo = -1, hi = -1;
		if (!p->assigned || rd_kafka_get_watermark_offsets(s->rk, p->topic, p->partition, &lo, &hi) || hi < 0)
			continue;
		char pn[16];
		snprintf(pn, sizeof pn, "%d", (int)p->partition);
		mfs_gauge_t *g = NULL;
		if (mfs_family_gauge(s->cat.consumer_lag, (const char *const[]){p->topic, pn}, &g) == 0)
			mfs_gauge_set(g, (double)(hi - (p->next >= 0 ? p->next : 0)));
	}
}

int mfs_service_run(const mfs_conf_t *c, const mfs_service_opts_t *o, volatile sig_atomic_t *stop, char *errstr,
                    size_t es)
{
	svc_t s;
	memset(&s, 0, sizeof s);
	s.c = c;
	s.eo = (mfs_event_opts_t){c->rating_min, c->rating_max, 0};
	int rc;
	if ((rc = mfs_bring_init(&s.ring, (size_t)c->serve_ring_batches))) {
		mfs_errf(errstr, es, rc, "ring: %s", mfs_strerror(rc));
		goto out;
	}
	s.ring_ok = 1;
	if (!(s.cur = mfs_bring_get(&s.ring))) {
		rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
		goto out;
	}
	/* metrics first: /healthz answers while the snapshot loads */
	if ((rc = mfs_metrics_init(&s.reg)) || (rc = mfs_catalog_register(s.reg, &s.cat, errstr, es))) {
		mfs_errf(errstr, es, rc, "metrics: %s", mfs_strerror(rc));
		goto out;
	}
	if (*c->metrics_listen) {
		mfs_http_opts_t ho = {s.reg, c->metrics_healthz_stale_ms};
		if ((rc = mfs_http_open(c->metrics_listen, &ho, &s.http, errstr, es)))
			goto out;
		mfs_info("serve", "msg=\"metrics listening\" listen=%s port=%d", c->metrics_listen, mfs_http_port(s.http));
	}
	/* recovery: the learner loads the snapshot; partitions resume at its offsets */
	if ((rc = mfs_learner_open(c, &s.ring, &s.l, errstr, es)))
		goto out;
	const mfs_snap_loaded_t *ld = mfs_learner_loaded(s.l);
	for (size_t j = 0; j < ld->n_offsets; j++) {
		part_t *p = part_get(&s, ld->offsets[j].topic, ld->offsets[j].partition, 1);
		if (!p) {
			rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
			goto out;
		}
		p->next = ld->offsets[j].next;
	}
	if (*c->serve_dead_letter_topic && (rc = open_dlq(&s, o->brokers, errstr, es)))
		goto out;
	s.cbs = (mfs_consumer_cbs_t){&s, on_assign, on_revoke};
	if ((rc = mfs_consumer_open(c, o->brokers, o->embedded, o->topics, o->n_topics, &s.cbs, &s.rk, errstr, es)))
		goto out;
	mfs_learner_set_metrics(s.l, &s.cat);
	if ((rc = mfs_learner_start(s.l, s.rk, errstr, es)))
		goto out;
	mfs_catalog_set_build_info(&s.cat, NULL, mfs_learner_engine_name(s.l));
	if ((rc = mfs_metrics_add_hook(s.reg, scrape_hook, &s))) {
		mfs_errf(errstr, es, rc, "metrics: %s", mfs_strerror(rc));
		goto out;
	}
	mfs_info("serve", "msg=started engine=%s topics=%zu batch=%" PRId64 " ring=%" PRId64 " snapshot_ms=%" PRId64
	         " holdout_fraction=%g", mfs_learner_engine_name(s.l), o->n_topics, c->serve_batch_size,
	         c->serve_ring_batches, c->serve_snapshot_ms, c->serve_holdout_fraction);

	/* a partly filled batch goes to the learner when the consumer catches up or after linger */
	const double linger = c->serve_snapshot_ms < 250 ? (double)c->serve_snapshot_ms / 5000.0 : 0.05;
	const size_t resume_at = (size_t)c->serve_ring_batches / 2;
	while (!*stop && !s.fatal) {
		mfs_http_heartbeat(s.http);
		if (mfs_now_s() >= s.next_lag) {
			update_lag(&s);
			s.next_lag = mfs_now_s() + 1.0;
		}
		if (s.sealed && (rc = push_sealed(&s, 20))) {
			s.fatal = rc;
			break;
		}
		if (s.paused && !s.sealed && mfs_bring_fill(&s.ring) <= resume_at)
			set_paused(&s, 0);
		rd_kafka_message_t *msg = rd_kafka_consumer_poll(s.rk, s.sealed ? 0 : s.cur->messages ? 5 : 50);
		if (msg) {
			if ((rc = handle(&s, msg))) {
				s.fatal = rc;
				break;
			}
			if (!s.sealed && s.cur->messages && mfs_now_s() - s.cur->t_first >= linger && (rc = seal(&s))) {
				s.fatal = rc;
				break;
			}
		} else if (s.cur->messages && !s.sealed &&
		           (mfs_bring_fill(&s.ring) == 0 || mfs_now_s() - s.cur->t_first >= linger) && (rc = seal(&s))) {
			/* caught up: hand over the partial batch if the learner is idle (else keep filling) */
			s.fatal = rc;
			break;
		}
		if (s.dlq)
			rd_kafka_poll(s.dlq, 0);
		if (c->serve_exit_at_end && all_at_end(&s)) {
			mfs_info("serve", "msg=\"every assigned partition read to its end: stopping (serve.exit_at_end)\" "
			                  "partitions=%zu",
			         s.n_parts);
			break;
		}
	}
	if (s.fatal) {
		rc = s.fatal;
		mfs_http_set_fatal(s.http, *s.err ? s.err : mfs_strerror(rc));
		if (!*s.err)
			snprintf(s.err, sizeof s.err, "%s", mfs_strerror(rc));
		if (rc == EPIPE) /* the learner failed: its error is the cause */
			rc = mfs_learner_join(s.l, s.err, sizeof s.err);
		s.learner_done = 1;
		mfs_errf(errstr, es, rc ? rc : MFS_EINVAL, "%s", s.err);
		rc = rc ? rc : MFS_EINVAL;
		goto out;
	}
	/* shutdown: stop polling, let the learner apply everything and publish, commit, close */
	rc = barrier(&s, MFS_EBATCH_FINAL);
	s.learner_done = 1;
	int jrc = mfs_learner_join(s.l, errstr, es);
	if (rc || jrc) {
		if (!jrc)
			mfs_errf(errstr, es, rc, "final snapshot: %s", mfs_strerror(rc));
		rc = jrc ? jrc : rc;
		goto out;
	}
	rd_kafka_consumer_close(s.rk); /* a revoke here has nothing left to publish */
	if (s.dlq && rd_kafka_flush(s.dlq, 10000))
		mfs_warn("serve", "msg=\"dead-letter messages not delivered at shutdown\" count=%d", rd_kafka_outq_len(s.dlq));
	mfs_learner_stats_t st;
	mfs_learner_get_stats(s.l, &st);
	mfs_info("serve", "msg=stopped events_applied=%" PRIu64 " held_out=%" PRIu64 " messages=%" PRIu64
	         " snapshots=%" PRIu64 " pauses=%" PRIu64 " latency_p50_ms=%.1f latency_p99_ms=%.1f applied_p50_ms=%.1f"
	         " applied_p99_ms=%.1f",
	         st.events_applied, st.events_held_out, s.messages, st.snapshots, s.pauses, st.lat_p50_ms, st.lat_p99_ms,
	         st.applied_p50_ms, st.applied_p99_ms);
	rc = 0;
out:
	mfs_http_close(s.http); /* first: its scrape hook reads the learner and the ring */
	if (s.l && !s.learner_done && s.ring_ok)
		mfs_bring_close(&s.ring);
	mfs_learner_close(s.l); /* joins the thread if it still runs */
	if (s.rk)
		rd_kafka_destroy(s.rk);
	if (s.dlq)
		rd_kafka_destroy(s.dlq);
	mfs_events_free(&s.evs);
	mfs_ebatch_free(s.cur);
	if (s.ring_ok)
		mfs_bring_destroy(&s.ring);
	for (size_t j = 0; j < s.n_parts; j++)
		free(s.parts[j].topic);
	free(s.parts);
	mfs_metrics_free(s.reg);
	return rc;
}
