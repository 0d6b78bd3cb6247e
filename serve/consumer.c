/* consumer.c - see consumer.h.
 *
 * DESIGN: this thread and the learner thread share only the queue (serve/batcher.h) and the
 * consumer handle, whose commit the learner calls (librdkafka handles are thread-safe).
 *
 * Backpressure: when the queue is full, the batch being filled is sealed and every assigned
 * partition is paused (rd_kafka_pause_partitions: librdkafka stops fetching and drops what it
 * had prefetched for them; on resume it fetches again from the next undelivered offset). This
 * thread keeps polling (heartbeats, rebalances, max.poll.interval.ms) and retries the push;
 * once the queue is at most half full the partitions are resumed. Nothing is dropped and
 * nothing grows: memory is bounded by (serve.ring_batches + 2) batches plus librdkafka's queues.
 *
 * Revocation and shutdown push a barrier batch and wait until the learner has applied
 * everything before it and published a snapshot, so the offsets of revoked partitions are in
 * LMDB before anyone else can own them.
 */
#include "serve/consumer.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "common/check.h"
#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/timeutil.h"
#include "ingest/event.h"
#include "ingest/kafka_consumer.h"
#include "ingest/kafka_util.h"
#include "ops/metrics.h"

struct mfs_consumer {
	const mfs_conf_t *c;
	mfs_batchq_t *queue;
	mfs_catalog_t *cat;
	mfs_http_t *http;
	int learner_done;
	rd_kafka_t *rk, *dlq;
	mfs_kafka_consumer_cbs_t cbs;
	mfs_event_opts_t eo;
	mfs_events_t evs;
	mfs_ebatch_t *cur; /* the batch being filled */
	int sealed;        /* cur is complete and waits for room in the queue */
	int paused;
	uint64_t pauses;
	mfs_parts_t parts; /* next: the next offset to take in (last taken + 1); assigned; at_end */
	mfs_log_rl_t rej_rl; /* rejected-message log lines: at most one per second */
	mfs_log_rl_t err_rl[4]; /* consumer errors by kind (consumer_error) */
	int fatal;
	uint64_t messages;
	double next_lag;
	double linger;     /* a partly filled batch goes to the learner after this long */
	size_t resume_at;  /* paused partitions resume once the queue holds at most this many */
	char err[1024];
};

/* Pause or resume every assigned partition. */
static void set_paused(mfs_consumer_t *s, int pause)
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
				mfs_part_t *p = mfs_parts_find(&s->parts, a->elems[j].topic, a->elems[j].partition);
				a->elems[j].offset = p && p->off.next >= 0 ? p->off.next : RD_KAFKA_OFFSET_INVALID;
			}
			rd_kafka_error_t *se = rd_kafka_seek_partitions(s->rk, a, 0);
			if (se)
				rd_kafka_error_destroy(se);
		}
	}
	if (pause && !s->paused) {
		s->pauses++;
		mfs_counter_add(s->cat->partition_pauses, a ? (uint64_t)a->cnt : 0);
	}
	mfs_gauge_set(s->cat->partitions_paused, pause && a ? a->cnt : 0);
	s->paused = pause;
	if (a)
		rd_kafka_topic_partition_list_destroy(a);
	mfs_debug("serve", "msg=%s ring_fill=%zu", pause ? "paused" : "resumed", mfs_batchq_fill(s->queue));
}

/* Hand the sealed batch to the learner, waiting at most timeout_ms; pause while the queue is
 * full. @return 0 (pushed, or still sealed and paused), EPIPE (the learner failed), ENOMEM. */
static int push_sealed(mfs_consumer_t *s, int timeout_ms)
{
	if (!s->sealed)
		return 0;
	int rc = mfs_batchq_push(s->queue, s->cur, timeout_ms);
	if (rc == ETIMEDOUT) {
		if (!s->paused)
			set_paused(s, 1);
		return 0;
	}
	if (rc)
		return rc;
	s->sealed = 0;
	if (!(s->cur = mfs_batchq_get(s->queue)))
		return ENOMEM;
	return 0;
}

static int seal(mfs_consumer_t *s)
{
	if (s->sealed || mfs_ebatch_empty(s->cur))
		return 0;
	s->sealed = 1;
	return push_sealed(s, 0);
}

int mfs_consumer_barrier(mfs_consumer_t *s, int kind)
{
	s->cur->barrier = kind;
	s->cur->barrier_gen = mfs_batchq_next_barrier(s->queue);
	uint64_t gen = s->cur->barrier_gen;
	s->sealed = 1;
	int rc;
	do
		rc = mfs_batchq_push(s->queue, s->cur, 200);
	while (rc == ETIMEDOUT);
	if (rc)
		return rc;
	s->sealed = 0;
	if (!(s->cur = mfs_batchq_get(s->queue)))
		return ENOMEM;
	return mfs_batchq_wait_barrier(s->queue, gen);
}

int mfs_consumer_all_at_end(const mfs_consumer_t *s)
{
	size_t n = 0;
	for (size_t j = 0; j < s->parts.n; j++) {
		if (!s->parts.p[j].assigned)
			continue;
		if (!s->parts.p[j].at_end)
			return 0;
		n++;
	}
	return n > 0;
}

static void gauge_assigned(mfs_consumer_t *s)
{
	size_t n = 0;
	for (size_t j = 0; j < s->parts.n; j++)
		n += s->parts.p[j].assigned;
	mfs_gauge_set(s->cat->partitions_assigned, (double)n);
	mfs_http_set_ready(s->http, n > 0); /* ready: partitions assigned (METRICS.md), also after a revoke or loss */
}

/* The partition's log must reach the offset the snapshot resumes at: a log that ends below it
 * (the topic recreated, another cluster, the embedded broker started afresh) would have every
 * new event skipped in silence until the log grows past the stored offset. serve.offset_mismatch
 * says what to do: fail (stop with the numbers) or reset (start at the log's beginning). Asked
 * of the broker (up to 10 s); when it does not answer, the check is skipped with a warning.
 * @return 0, or MFS_EKAFKA with s->err set. */
static int check_log_end(mfs_consumer_t *s, mfs_part_t *p)
{
	int64_t lo = -1, hi = -1;
	rd_kafka_resp_err_t ke = rd_kafka_query_watermark_offsets(s->rk, p->off.topic, p->off.partition, &lo, &hi, 10000);
	if (ke) {
		mfs_warn("serve", "msg=\"could not check the log end against the snapshot\" topic=%s partition=%d err=\"%s\"",
		         p->off.topic, (int)p->off.partition, rd_kafka_err2str(ke));
		return 0;
	}
	if (hi >= p->off.next)
		return 0;
	if (s->c->serve_offset_mismatch == 0) { /* fail */
		snprintf(s->err, sizeof s->err,
		         "topic %s partition %d ends at offset %" PRId64 " but the snapshot resumes at %" PRId64
		         " (the topic was recreated, or this is another cluster): every new event would be skipped. Use a "
		         "new snapshot.dir, or serve.offset_mismatch=reset to start this partition at its log start",
		         p->off.topic, (int)p->off.partition, hi, p->off.next);
		mfs_error("serve", "msg=\"offset beyond the log\" topic=%s partition=%d stored_offset=%" PRId64
		                   " log_end=%" PRId64 " action=fail", p->off.topic, (int)p->off.partition, p->off.next, hi);
		return MFS_EKAFKA;
	}
	mfs_warn("serve", "msg=\"offset beyond the log: starting the partition at its log start\" topic=%s partition=%d "
	                  "stored_offset=%" PRId64 " log_end=%" PRId64 " log_start=%" PRId64 " action=reset",
	         p->off.topic, (int)p->off.partition, p->off.next, hi, lo);
	mfs_counter_add(s->cat->offset_resets, 1);
	p->off.next = lo >= 0 ? lo : 0;
	if (mfs_ebatch_reset(s->cur, p->off.topic, p->off.partition, p->off.next)) { /* the learner's too */
		snprintf(s->err, sizeof s->err, "out of memory");
		return ENOMEM;
	}
	return 0;
}

static void on_assign(void *ctx, rd_kafka_topic_partition_list_t *parts)
{
	mfs_consumer_t *s = ctx;
	for (int j = 0; j < parts->cnt; j++) {
		rd_kafka_topic_partition_t *tp = &parts->elems[j];
		mfs_part_t *p = mfs_parts_get(&s->parts, tp->topic, tp->partition);
		if (!p) {
			s->fatal = ENOMEM;
			continue;
		}
		p->assigned = 1;
		p->at_end = 0;
		int rc;
		if (p->off.next > 0 && !s->fatal && (rc = check_log_end(s, p)))
			s->fatal = rc;
		tp->offset = p->off.next >= 0 ? p->off.next : RD_KAFKA_OFFSET_BEGINNING;
	}
	gauge_assigned(s);
}

static void on_revoke(void *ctx, const rd_kafka_topic_partition_list_t *parts)
{
	mfs_consumer_t *s = ctx;
	if (s->paused) {
		/* librdkafka keeps a partition's pause flag across a rebalance: clear it now, or a
		 * partition assigned back to us would stay paused for good */
		rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_copy(parts);
		rd_kafka_resume_partitions(s->rk, l);
		rd_kafka_topic_partition_list_destroy(l);
	}
	if (!s->learner_done && !s->fatal) {
		int rc = mfs_consumer_barrier(s, MFS_EBATCH_SNAPSHOT);
		if (rc) {
			mfs_error("serve", "msg=\"snapshot on revoke failed\" err=\"%s\"", mfs_strerror(rc));
			s->fatal = rc;
		}
	}
	for (int j = 0; j < parts->cnt; j++) {
		mfs_part_t *p = mfs_parts_find(&s->parts, parts->elems[j].topic, parts->elems[j].partition);
		if (p) {
			p->assigned = 0;
			char pn[16];
			snprintf(pn, sizeof pn, "%d", (int)p->off.partition);
			mfs_family_remove(s->cat->consumer_lag, (const char *const[]){p->off.topic, pn});
		}
	}
	gauge_assigned(s);
	mfs_gauge_set(s->cat->partitions_paused, 0);
	s->paused = 0; /* the queue was drained; a new assignment starts unpaused */
}

/* Copy a rejected message raw (value and key) to serve.dead_letter_topic, with headers that say
 * why and where it came from (docs/EVENT_FORMAT.md, "Dead letters"). The original timestamp goes
 * in a header, not in the dead letter's own timestamp: the topic's time-based retention would
 * count from it, and the dead letters of a backfill of old data could expire at once. */
static void dead_letter(mfs_consumer_t *s, const rd_kafka_message_t *msg, int reason, long index, const char *detail)
{
	char idx[24], part[16], off[24], tsv[24];
	rd_kafka_timestamp_type_t tt;
	const int64_t ts = rd_kafka_message_timestamp(msg, &tt);
	rd_kafka_headers_t *h = rd_kafka_headers_new(7);
	snprintf(idx, sizeof idx, "%ld", index);
	snprintf(part, sizeof part, "%" PRId32, msg->partition);
	snprintf(off, sizeof off, "%" PRId64, msg->offset);
	rd_kafka_header_add(h, "mfs.reason", -1, mfs_reject_name(reason), -1);
	rd_kafka_header_add(h, "mfs.event_index", -1, idx, -1);
	rd_kafka_header_add(h, "mfs.detail", -1, detail, -1);
	rd_kafka_header_add(h, "mfs.topic", -1, rd_kafka_topic_name(msg->rkt), -1);
	rd_kafka_header_add(h, "mfs.partition", -1, part, -1);
	rd_kafka_header_add(h, "mfs.offset", -1, off, -1);
	if (tt != RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && ts >= 0) {
		snprintf(tsv, sizeof tsv, "%" PRId64, ts);
		rd_kafka_header_add(h, "mfs.timestamp", -1, tsv, -1);
	}
	rd_kafka_resp_err_t ke = rd_kafka_producev(
		s->dlq, RD_KAFKA_V_TOPIC(s->c->serve_dead_letter_topic), RD_KAFKA_V_VALUE(msg->payload, msg->len),
		RD_KAFKA_V_KEY(msg->key, msg->key_len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(h),
		RD_KAFKA_V_END);
	if (ke) {
		rd_kafka_headers_destroy(h); /* librdkafka owns them only once the produce succeeded */
		mfs_warn("serve", "msg=\"dead-letter produce failed\" err=\"%s\"", rd_kafka_err2str(ke));
	} else {
		mfs_counter_inc(s->cat->dead_letter_messages);
	}
	rd_kafka_poll(s->dlq, 0);
}

static void reject(mfs_consumer_t *s, const rd_kafka_message_t *msg, int reason, long index, const char *detail)
{
	if (MFS_NEVER(reason < 0 || reason >= MFS_REJ__COUNT)) /* the decoder names a reason it has */
		reason = MFS_REJ_WRONG_TYPE;
	s->cur->rejected[reason]++;
	mfs_log_ratelimited(&s->rej_rl, 1000, MFS_LOG_WARN, "serve",
	                    "msg=rejected reason=%s topic=%s partition=%d offset=%" PRId64 " event=%ld detail=\"%s\"",
	                    mfs_reject_name(reason), rd_kafka_topic_name(msg->rkt), (int)msg->partition, msg->offset, index,
	                    detail);
	if (s->dlq)
		dead_letter(s, msg, reason, index, detail);
}

/* A librdkafka error event, said once in the service's words: what it means for the stream
 * and what happens next. Repeats of one kind are folded (one line per 30 s, suppressed=N);
 * librdkafka's own line for the same failure is at debug level (ingest/kafka_util.c). */
static void consumer_error(mfs_consumer_t *s, const rd_kafka_message_t *msg)
{
	const char *means;
	int kind;
	switch (msg->err) {
	case RD_KAFKA_RESP_ERR__TRANSPORT:
	case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
	case RD_KAFKA_RESP_ERR__RESOLVE:
	case RD_KAFKA_RESP_ERR__TIMED_OUT:
		kind = 0;
		means = "a broker is unreachable: the client reconnects by itself, the last snapshot is still served, "
		        "consumption resumes when a broker answers (beyond kafka.session.timeout.ms the group session is "
		        "lost and the partitions come back by reassignment)";
		break;
	case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
	case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
	case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
		kind = 1;
		means = "the topic or partition does not exist (yet): nothing to consume until it does";
		break;
	case RD_KAFKA_RESP_ERR__MAX_POLL_EXCEEDED:
		kind = 2;
		means = "the consumer left the group: not polled within max.poll.interval.ms; it rejoins";
		break;
	default:
		kind = 3;
		means = "see the error; the client retries what it can";
		break;
	}
	mfs_log_ratelimited(&s->err_rl[kind], 30000, MFS_LOG_WARN, "serve",
	                    "msg=\"Kafka consumer error\" err=\"%s\" means=\"%s\"", rd_kafka_message_errstr(msg), means);
}

static int handle(mfs_consumer_t *s, rd_kafka_message_t *msg)
{
	if (msg->err) {
		if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF && msg->rkt) {
			/* only at `next`: an end reported before a pause dropped the prefetched messages
			 * lies behind what is still to be read */
			mfs_part_t *p = mfs_parts_find(&s->parts, rd_kafka_topic_name(msg->rkt), msg->partition);
			int64_t lo = -1, hi = -1;
			if (p && p->assigned && p->off.next < 0) /* nothing taken yet: at the end if it is empty */
				rd_kafka_get_watermark_offsets(s->rk, p->off.topic, p->off.partition, &lo, &hi);
			if (p && p->assigned && (msg->offset == p->off.next || (p->off.next < 0 && lo >= 0 && msg->offset == lo)))
				p->at_end = 1;
		} else if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
			consumer_error(s, msg);
		}
		rd_kafka_message_destroy(msg);
		return 0;
	}
	mfs_part_t *p = mfs_parts_get(&s->parts, rd_kafka_topic_name(msg->rkt), msg->partition);
	if (!p) {
		rd_kafka_message_destroy(msg);
		return mfs_errf(s->err, sizeof s->err, ENOMEM, "out of memory");
	}
	p->at_end = 0;
	int64_t offset = msg->offset;
	if (p->off.next >= 0 && offset < p->off.next) {
		rd_kafka_message_destroy(msg); /* already taken in (a re-delivery): exactly once */
		mfs_counter_inc(s->cat->messages_redelivered);
		return 0;
	}
	s->messages++;
	mfs_counter_inc(s->cat->messages_consumed);
	if (s->cur->messages == 0)
		s->cur->t_first = mfs_now_s();
	int reason = 0, rc;
	long index = -1;
	char detail[256] = "";
	rd_kafka_timestamp_type_t tt;
	const int64_t ts = rd_kafka_message_timestamp(msg, &tt);
	rc = mfs_event_decode(msg->payload, msg->len, &s->eo, &s->evs, &reason, &index, detail, sizeof detail);
	if (rc == MFS_EDECODE) {
		reject(s, msg, reason, index, detail);
		rd_kafka_message_destroy(msg);
	} else if (rc || (rc = mfs_ebatch_add_events(s->cur, s->evs.ev, s->evs.n, msg, ts, s->c->serve_holdout_fraction))) {
		rd_kafka_message_destroy(msg);
		return mfs_errf(s->err, sizeof s->err, rc, "decode: %s", mfs_strerror(rc));
	} else {
		mfs_counter_add(s->cat->events_consumed, s->evs.n);
	}
	/* msg now belongs to the batch (its payload holds the string ids) or is gone */
	if ((rc = mfs_ebatch_advance(s->cur, p->off.topic, p->off.partition, offset + 1)))
		return mfs_errf(s->err, sizeof s->err, rc, "out of memory");
	s->cur->messages++;
	p->off.next = offset + 1;
	if (s->cur->n >= (size_t)s->c->serve_batch_size)
		return seal(s);
	if (s->sealed && !s->paused)
		set_paused(s, 1); /* a message arrived after the pause (e.g. a new assignment): pause again */
	return 0;
}

static int open_dlq(mfs_consumer_t *s, const char *brokers, char *errstr, size_t es)
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

/* Consumer lag per assigned partition from librdkafka's cached high watermarks (no request). */
static void update_lag(mfs_consumer_t *s)
{
	for (size_t j = 0; j < s->parts.n; j++) {
		mfs_part_t *p = &s->parts.p[j];
		int64_t lo = -1, hi = -1;
		if (!p->assigned || rd_kafka_get_watermark_offsets(s->rk, p->off.topic, p->off.partition, &lo, &hi) || hi < 0)
			continue;
		char pn[16];
		snprintf(pn, sizeof pn, "%d", (int)p->off.partition);
		mfs_gauge_t *g = NULL;
		if (mfs_family_gauge(s->cat->consumer_lag, (const char *const[]){p->off.topic, pn}, &g) == 0)
			mfs_gauge_set(g, (double)(hi - (p->off.next >= 0 ? p->off.next : 0)));
	}
}

void mfs_consumer_keep_free(void *msg)
{
	rd_kafka_message_destroy(msg);
}

int mfs_consumer_open(const mfs_conf_t *c, const mfs_consumer_opts_t *o, mfs_consumer_t **out, char *errstr,
                      size_t es)
{
	*out = NULL;
	mfs_consumer_t *s = calloc(1, sizeof *s);
	if (!s)
		return mfs_errf(errstr, es, ENOMEM, "out of memory");
	s->c = c;
	s->queue = o->queue;
	s->cat = o->cat;
	s->http = o->http;
	s->eo = (mfs_event_opts_t){c->rating_min, c->rating_max, 0};
	/* a partly filled batch goes to the learner when the consumer catches up or after linger */
	s->linger = c->serve_snapshot_ms < 250 ? (double)c->serve_snapshot_ms / 5000.0 : 0.05;
	s->resume_at = (size_t)c->serve_ring_batches / 2;
	int rc;
	if (!(s->cur = mfs_batchq_get(s->queue))) {
		rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t j = 0; o->loaded && j < o->loaded->n_offsets; j++) {
		mfs_part_t *p = mfs_parts_get(&s->parts, o->loaded->offsets[j].topic, o->loaded->offsets[j].partition);
		if (!p) {
			rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
			goto fail;
		}
		p->off.next = o->loaded->offsets[j].next;
	}
	if (*c->serve_dead_letter_topic && (rc = open_dlq(s, o->brokers, errstr, es)))
		goto fail;
	s->cbs = (mfs_kafka_consumer_cbs_t){s, on_assign, on_revoke};
	if ((rc = mfs_kafka_consumer_open(c, o->brokers, o->embedded, o->topics, o->n_topics, &s->cbs, &s->rk, errstr,
	                                  es)))
		goto fail;
	*out = s;
	return 0;
fail:
	mfs_consumer_free(s);
	return rc;
}

int mfs_consumer_step(mfs_consumer_t *s)
{
	int rc;
	if (s->fatal) /* set by a rebalance callback */
		return s->fatal;
	if (mfs_now_s() >= s->next_lag) {
		update_lag(s);
		s->next_lag = mfs_now_s() + 1.0;
	}
	if (s->sealed && (rc = push_sealed(s, 20)))
		return s->fatal = rc;
	if (s->paused && !s->sealed && mfs_batchq_fill(s->queue) <= s->resume_at)
		set_paused(s, 0);
	rd_kafka_message_t *msg = rd_kafka_consumer_poll(s->rk, s->sealed ? 0 : s->cur->messages ? 5 : 50);
	if (msg) {
		if ((rc = handle(s, msg)))
			return s->fatal = rc;
		if (!s->sealed && s->cur->messages && mfs_now_s() - s->cur->t_first >= s->linger && (rc = seal(s)))
			return s->fatal = rc;
	} else if (s->cur->messages && !s->sealed &&
	           (mfs_batchq_fill(s->queue) == 0 || mfs_now_s() - s->cur->t_first >= s->linger) && (rc = seal(s))) {
		/* caught up: hand over the partial batch if the learner is idle (else keep filling) */
		return s->fatal = rc;
	}
	if (s->dlq)
		rd_kafka_poll(s->dlq, 0);
	return s->fatal;
}

void mfs_consumer_learner_done(mfs_consumer_t *s)
{
	s->learner_done = 1;
}

const char *mfs_consumer_error(const mfs_consumer_t *s)
{
	return s->err;
}

int mfs_consumer_commit(void *ctx, const mfs_offset_t *offs, size_t n, int sync)
{
	mfs_consumer_t *s = ctx;
	rd_kafka_topic_partition_list_t *pl = rd_kafka_topic_partition_list_new((int)n + 1);
	for (size_t x = 0; x < n; x++)
		rd_kafka_topic_partition_list_add(pl, offs[x].topic, offs[x].partition)->offset = offs[x].next;
	rd_kafka_resp_err_t ke = rd_kafka_commit(s->rk, pl, !sync);
	rd_kafka_topic_partition_list_destroy(pl);
	if (ke)
		mfs_debug("serve", "msg=\"offset commit failed\" err=\"%s\"", rd_kafka_err2str(ke));
	return ke ? MFS_EKAFKA : 0;
}

void mfs_consumer_close(mfs_consumer_t *s)
{
	rd_kafka_consumer_close(s->rk); /* a revoke here has nothing left to publish */
	if (s->dlq && rd_kafka_flush(s->dlq, 10000))
		mfs_warn("serve", "msg=\"dead-letter messages not delivered at shutdown\" count=%d", rd_kafka_outq_len(s->dlq));
}

void mfs_consumer_counts(const mfs_consumer_t *s, uint64_t *messages, uint64_t *pauses, size_t *partitions_known)
{
	*messages = s->messages;
	*pauses = s->pauses;
	*partitions_known = s->parts.n;
}

/* rd_kafka_destroy on a thread of its own, waited for at most limit_ms (serve.kafka_close_ms).
 *
 * librdkafka 2.0 can wait forever in rd_kafka_destroy for a broker thread when the broker is
 * unreachable (upstream issues 3954 and 4519: a broker reference is never dropped; seen here
 * with a real broker killed just before SIGTERM, about one shutdown in six). By the time serve
 * destroys its handles the final snapshot is published and every message is released, so
 * nothing is lost by not waiting: after the limit this logs why and returns, and the process's
 * exit ends librdkafka's threads. @return 1 when the handle was destroyed. */
typedef struct destroy_job {
	rd_kafka_t *rk;
	int delay_ms; /* test.kafka_destroy_delay_ms */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
} destroy_job_t;

static void *destroy_main(void *arg)
{
	destroy_job_t *j = arg;
	mfs_thread_name("mfs-rkdestroy");
	if (j->delay_ms > 0)
		mfs_sleep_ms(j->delay_ms);
	rd_kafka_destroy(j->rk);
	pthread_mutex_lock(&j->mu);
	j->done = 1;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

static int destroy_bounded(rd_kafka_t *rk, int64_t limit_ms, int delay_ms, const char *what)
{
	destroy_job_t *j = calloc(1, sizeof *j);
	pthread_t t;
	if (j)
		j->delay_ms = delay_ms;
	if (!j || pthread_mutex_init(&j->mu, NULL) || pthread_cond_init(&j->cv, NULL) ||
	    (j->rk = rk, pthread_create(&t, NULL, destroy_main, j))) {
		free(j); /* (a mutex or condition made here is never used) */
		rd_kafka_destroy(rk);
		return 1;
	}
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += (time_t)(limit_ms / 1000);
	dl.tv_nsec += (long)(limit_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&j->mu);
	int rc = 0;
	while (!j->done && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&j->cv, &j->mu, &dl);
	const int done = j->done;
	pthread_mutex_unlock(&j->mu);
	if (!done) { /* j stays with the thread */
		pthread_detach(t);
		mfs_error("serve", "msg=\"the Kafka client did not shut down: exiting without it\" handle=%s "
		                   "waited_ms=%" PRId64 " detail=\"a broker is unreachable (librdkafka 2.0 can then wait "
		                   "forever; serve.kafka_close_ms); the final snapshot is published\"",
		          what, limit_ms);
		return 0;
	}
	pthread_join(t, NULL);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	free(j);
	return 1;
}

void mfs_consumer_free(mfs_consumer_t *s)
{
	if (!s)
		return;
	/* every message goes before its handle (librdkafka's rule): the batch being filled here,
	 * the queue's batches before this is called (serve.c) */
	mfs_ebatch_free(s->cur);
	mfs_events_free(&s->evs);
	const int64_t limit = s->c->serve_kafka_close_ms;
	const int delay = (int)s->c->test_kafka_destroy_delay_ms;
	if (s->rk)
		destroy_bounded(s->rk, limit, delay, "consumer");
	if (s->dlq)
		destroy_bounded(s->dlq, limit, delay, "dead-letter producer");
	mfs_parts_free(&s->parts);
	free(s);
}
