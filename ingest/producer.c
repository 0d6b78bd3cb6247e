/* producer.c - rating events into Kafka as batched MessagePack messages (`mfstream produce`).
 *
 * DESIGN: one thread. Each partition has a pending batch that events are encoded into as
 * they arrive (mfs_event_encode appends one event at a time, so string ids are copied at
 * once and the caller's buffers may change); five bytes are reserved in front for the
 * array header, which is written right-aligned into them when the batch is sent, so a
 * message is never copied to prepend it. A batch is sent when it holds `batch` events,
 * reaches MFS_PRODUCER_MSG_SOFT_MAX bytes, or (rate-limited runs) is older than linger_ms.
 * librdkafka copies the value (RD_KAFKA_MSG_F_COPY) and the pending buffer is reused.
 *
 * Partitioning is ours, not librdkafka's: an event's partition is murmur2(text of its user)
 * mod partitions (Kafka's Java default), which is what lets a message of many users share
 * one partition and still be keyed: its key is the first event's user text, which hashes
 * to the same partition, so a key-based consumer or compaction sees a consistent mapping.
 *
 * Delivery: enable.idempotence=true (acks=all, retries with sequence numbers: per
 * partition, no duplicates and no reordering across retries). Delivery reports and errors
 * are served by rd_kafka_poll on this thread (every 1024 events, while throttling, while
 * flushing), so the counters need no locks. A failed delivery or a fatal error stops the
 * run: mfs_producer_send returns MFS_EKAFKA from then on, and flush reports what was lost.
 * Retriable errors (broker down, leader moves) are logged and left to librdkafka.
 *
 * Rate limit: a token bucket in events, refilled at `rate` per second, holding at most
 * max(1, rate / 100) tokens (10 ms of burst), so the clock is read about 100 times a
 * second however high the rate; waiting happens inside rd_kafka_poll.
 */
#include "ingest/producer.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "ingest/kafka_util.h"

#define HDR_RESERVE 5 /* array32 header: 0xdd + be32 */
#define KEY_MAX (MFS_ID_MAX_LEN + 8)
#define POLL_EVERY 1024

typedef struct pend {
	mfs_buf_t pb_buf; /* [HDR_RESERVE spare bytes when batching] events ... */
	size_t pb_n;      /* events in it */
	size_t pb_keylen;
	double pb_t_first; /* when the first event came (rate-limited runs only) */
	char pb_key[KEY_MAX];
} pend_t;

struct mfs_producer {
	rd_kafka_t *pr_rk;
	rd_kafka_topic_t *pr_rkt;
	int32_t pr_parts;
	size_t pr_batch;
	int pr_compact;
	double pr_rate, pr_tokens, pr_burst, pr_t_last, pr_linger_s;
	pend_t *pr_pend;
	unsigned pr_since_poll;
	int pr_fatal;
	double pr_t_start, pr_t_end;
	mfs_producer_stats_t pr_st;
	char pr_topic[256];
};

/* ---- hashing and keys ------------------------------------------------------------------ */

uint32_t mfs_murmur2(const void *data, size_t len)
{
	const uint8_t *d = data;
	const uint32_t m = 0x5bd1e995u, seed = 0x9747b28cu;
	const int r = 24;
	uint32_t h = seed ^ (uint32_t)len;
	size_t n4 = len / 4;
	for (size_t i = 0; i < n4; i++) {
		uint32_t k = (uint32_t)d[4 * i] | (uint32_t)d[4 * i + 1] << 8 | (uint32_t)d[4 * i + 2] << 16 |
		             (uint32_t)d[4 * i + 3] << 24;
		k *= m;
		k ^= k >> r;
		k *= m;
		h *= m;
		h ^= k;
	}
	const uint8_t *t = d + 4 * n4;
	switch (len & 3) {
	case 3:
		h ^= (uint32_t)t[2] << 16;
		/* fall through */
	case 2:
		h ^= (uint32_t)t[1] << 8;
		/* fall through */
	case 1:
		h ^= t[0];
		h *= m;
	}
	h ^= h >> 13;
	h *= m;
	h ^= h >> 15;
	return h;
}

/* The text form of an id (mfs_id_format), fast for u64 ids. @return its length. */
static size_t id_text(const mfs_id_t *id, char *buf)
{
	if (id->kind != MFS_ID_U64) {
		mfs_id_format(id, buf, KEY_MAX);
		return strlen(buf);
	}
	char tmp[24];
	size_t n = 0;
	uint64_t v = id->num;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (size_t i = 0; i < n; i++)
		buf[i] = tmp[n - 1 - i];
	buf[n] = '\0';
	return n;
}

static inline int32_t part_of_text(const char *key, size_t len, int32_t n)
{
	return (int32_t)((mfs_murmur2(key, len) & 0x7fffffffu) % (uint32_t)n);
}

int32_t mfs_producer_partition_of(const mfs_id_t *user, int32_t n)
{
	char key[KEY_MAX];
	size_t len = id_text(user, key);
	return part_of_text(key, len, n);
}

/* ---- callbacks (served by rd_kafka_poll on the producing thread) ----------------------- */

static void set_first_error(mfs_producer_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_first_error(mfs_producer_t *p, const char *fmt, ...)
{
	if (p->pr_st.first_error[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->pr_st.first_error, sizeof p->pr_st.first_error, fmt, ap);
	va_end(ap);
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void)rk;
	mfs_producer_t *p = opaque;
	uint64_t n = (uint64_t)(uintptr_t)m->_private;
	if (m->err) {
		if (p->pr_st.messages_failed++ < 10)
			mfs_error("produce", "msg=\"message not delivered\" partition=%" PRId32 " events=%" PRIu64 " err=%s",
			          m->partition, n, rd_kafka_err2name(m->err));
		p->pr_st.events_failed += n;
		set_first_error(p, "%s (partition %ld)", rd_kafka_err2str(m->err), (long)m->partition);
		return;
	}
	p->pr_st.messages++;
	p->pr_st.events += n;
	p->pr_st.bytes += m->len;
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	mfs_producer_t *p = opaque;
	char q[512];
	if (err == RD_KAFKA_RESP_ERR__FATAL) {
		char why[512];
		rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, why, sizeof why);
		p->pr_fatal = 1;
		mfs_error("produce", "msg=\"fatal producer error\" err=%s reason=%s", rd_kafka_err2name(orig),
		          mfs_log_quote(q, sizeof q, why));
		set_first_error(p, "fatal: %s", why);
		return;
	}
	/* retriable: librdkafka reconnects and retries on its own. A transport error was already
	 * logged by librdkafka (fac=FAIL) through the log callback. */
	mfs_log(err == RD_KAFKA_RESP_ERR__TRANSPORT ? MFS_LOG_DEBUG : MFS_LOG_WARN, "produce",
	        "msg=\"kafka error (retrying)\" err=%s reason=%s", rd_kafka_err2name((rd_kafka_resp_err_t)err), mfs_log_quote(q, sizeof q, reason));
}

/* ---- open / close ---------------------------------------------------------------------- */

static int fetch_partitions(mfs_producer_t *p, int timeout_ms, int32_t *cnt, char *errstr, size_t es)
{
	double deadline = mfs_now_s() + timeout_ms / 1000.0;
	rd_kafka_resp_err_t last = RD_KAFKA_RESP_ERR_NO_ERROR;
	for (;;) {
		const struct rd_kafka_metadata *md = NULL;
		int left = (int)((deadline - mfs_now_s()) * 1000);
		rd_kafka_resp_err_t err = rd_kafka_metadata(p->pr_rk, 0, p->pr_rkt, &md, left > 100 ? left : 100);
		if (!err) {
			const struct rd_kafka_metadata_topic *t = md->topic_cnt == 1 ? &md->topics[0] : NULL;
			err = !t ? RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC : t->err;
			if (!err && t->partition_cnt > 0)
				*cnt = t->partition_cnt;
			else if (!err)
				err = RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION;
			rd_kafka_metadata_destroy(md);
			if (!err)
				return 0;
		}
		last = err;
		if (mfs_now_s() >= deadline)
			break;
		rd_kafka_poll(p->pr_rk, 200); /* a new topic: leaders appear after a moment */
	}
	return mfs_errf(errstr, es, MFS_EKAFKA, "topic %s: no metadata within %d ms: %s", p->pr_topic, timeout_ms,
	                rd_kafka_err2str(last));
}

int mfs_producer_open(const mfs_conf_t *c, const mfs_producer_opts_t *o, mfs_producer_t **out, char *errstr,
                      size_t errstr_size)
{
	*out = NULL;
	if (!o->topic || !*o->topic || strlen(o->topic) >= 250)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "a topic name (1..249 bytes) is required");
	if (o->batch < 1 || o->batch > MFS_PRODUCER_BATCH_MAX)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "batch %zu outside 1..%d", o->batch,
		                MFS_PRODUCER_BATCH_MAX);
	if (!(o->rate >= 0) || isinf(o->rate) || o->partitions < 0)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "rate %g / partitions %d out of range", o->rate,
		                o->partitions);
	mfs_producer_t *p = calloc(1, sizeof *p);
	if (!p)
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	snprintf(p->pr_topic, sizeof p->pr_topic, "%s", o->topic);
	p->pr_batch = o->batch;
	p->pr_compact = o->compact;
	p->pr_rate = o->rate;
	p->pr_burst = o->rate / 100 > 1 ? o->rate / 100 : 1;
	p->pr_tokens = p->pr_burst;
	p->pr_linger_s = (o->linger_ms > 0 ? o->linger_ms : 100) / 1000.0;

	/* ours first, so any kafka.* key overrides them. lz4, not zstd: a consumer decompresses
	 * on one thread per broker it fetches from, and zstd's decompression was most of that
	 * thread at 10 M events/s (docs/PRODUCER.md, "Compression") */
	static const char *const defaults[] = {"compression.codec", "lz4", "enable.idempotence", "true",
	                                       "client.id", "mfstream-produce", NULL};
	rd_kafka_conf_t *conf;
	char why[512];
	int rc = mfs_kafka_conf_new_with(c, defaults, &conf, errstr, errstr_size);
	if (rc)
		goto fail;
	if (o->brokers && *o->brokers &&
	    rd_kafka_conf_set(conf, "bootstrap.servers", o->brokers, why, sizeof why) != RD_KAFKA_CONF_OK) {
		rd_kafka_conf_destroy(conf);
		rc = mfs_errf(errstr, errstr_size, MFS_ECONFIG, "brokers \"%s\": %s", o->brokers, why);
		goto fail;
	}
	rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
	rd_kafka_conf_set_error_cb(conf, error_cb);
	rd_kafka_conf_set_opaque(conf, p);
	p->pr_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof why);
	if (!p->pr_rk) {
		rd_kafka_conf_destroy(conf);
		rc = mfs_errf(errstr, errstr_size, MFS_EKAFKA, "rd_kafka_new: %s", why);
		goto fail;
	}
	p->pr_rkt = rd_kafka_topic_new(p->pr_rk, o->topic, NULL);
	if (!p->pr_rkt) {
		rc = mfs_errf(errstr, errstr_size, MFS_EKAFKA, "topic %s: %s", o->topic,
		              rd_kafka_err2str(rd_kafka_last_error()));
		goto fail;
	}
	int32_t cnt = 0;
	if ((rc = fetch_partitions(p, o->metadata_timeout_ms > 0 ? o->metadata_timeout_ms : 10000, &cnt, errstr,
	                           errstr_size)))
		goto fail;
	if (o->partitions && o->partitions != cnt) {
		rc = mfs_errf(errstr, errstr_size, MFS_EKAFKA, "topic %s has %d partitions, not %d", o->topic, (int)cnt,
		              o->partitions);
		goto fail;
	}
	p->pr_parts = cnt;
	p->pr_pend = calloc((size_t)cnt, sizeof *p->pr_pend);
	if (!p->pr_pend) {
		rc = mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
		goto fail;
	}
	char cq[64];
	size_t cl = sizeof cq;
	if (rd_kafka_conf_get(rd_kafka_conf(p->pr_rk), "compression.codec", cq, &cl) != RD_KAFKA_CONF_OK)
		snprintf(cq, sizeof cq, "?");
	mfs_info("produce", "msg=\"producer ready\" topic=%s partitions=%d batch=%zu form=%s compression=%s rate=%g",
	         o->topic, (int)cnt, o->batch, o->compact ? "compact" : "map", cq, o->rate);
	*out = p;
	return 0;
fail:
	mfs_producer_close(p);
	return rc;
}

void mfs_producer_close(mfs_producer_t *p)
{
	if (!p)
		return;
	if (p->pr_rkt)
		rd_kafka_topic_destroy(p->pr_rkt);
	if (p->pr_rk) {
		/* what was not flushed is dropped, not waited for */
		rd_kafka_purge(p->pr_rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		rd_kafka_poll(p->pr_rk, 0);
		rd_kafka_destroy(p->pr_rk);
	}
	for (int32_t k = 0; p->pr_pend && k < p->pr_parts; k++)
		mfs_buf_free(&p->pr_pend[k].pb_buf);
	free(p->pr_pend);
	free(p);
}

/* ---- sending ----------------------------------------------------------------------------- */

static int reserve(mfs_buf_t *b, size_t n)
{
	return mfs_grow((void **)&b->data, &b->cap, n, 1);
}

/* Hand partition k's pending batch to librdkafka. */
static int send_pending(mfs_producer_t *p, int32_t k)
{
	pend_t *b = &p->pr_pend[k];
	if (!b->pb_n)
		return 0;
	char *data = b->pb_buf.data;
	size_t len = b->pb_buf.len;
	if (p->pr_batch > 1) { /* the array header, right-aligned in the reserved bytes */
		uint32_t n = (uint32_t)b->pb_n;
		size_t h = n <= 15 ? 1 : n <= 0xffff ? 3 : 5;
		char *o = data + HDR_RESERVE - h;
		if (h == 1) {
			o[0] = (char)(0x90 | n);
		} else if (h == 3) {
			o[0] = (char)0xdc;
			o[1] = (char)(n >> 8);
			o[2] = (char)n;
		} else {
			o[0] = (char)0xdd;
			o[1] = (char)(n >> 24);
			o[2] = (char)(n >> 16);
			o[3] = (char)(n >> 8);
			o[4] = (char)n;
		}
		data = o;
		len -= HDR_RESERVE - h;
	}
	rd_kafka_resp_err_t err;
	for (;;) {
		err = rd_kafka_producev(p->pr_rk, RD_KAFKA_V_RKT(p->pr_rkt), RD_KAFKA_V_PARTITION(k),
		                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE(data, len),
		                        RD_KAFKA_V_KEY(b->pb_key, b->pb_keylen),
		                        RD_KAFKA_V_OPAQUE((void *)(uintptr_t)b->pb_n), RD_KAFKA_V_END);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		rd_kafka_poll(p->pr_rk, 50); /* backpressure: wait for deliveries to free the queue */
	}
	if (err) {
		mfs_error("produce", "msg=\"produce failed\" partition=%d events=%zu bytes=%zu err=%s", (int)k, b->pb_n, len,
		          rd_kafka_err2name(err));
		set_first_error(p, "produce: %s (partition %ld)", rd_kafka_err2str(err), (long)k);
		p->pr_fatal = 1;
		return MFS_EKAFKA;
	}
	p->pr_st.messages_sent++;
	p->pr_st.events_sent += b->pb_n;
	p->pr_st.bytes_sent += len;
	b->pb_n = 0;
	b->pb_buf.len = 0;
	return 0;
}

static int send_lingering(mfs_producer_t *p, double now)
{
	for (int32_t k = 0; k < p->pr_parts; k++) {
		int rc;
		if (p->pr_pend[k].pb_n && now - p->pr_pend[k].pb_t_first >= p->pr_linger_s && (rc = send_pending(p, k)))
			return rc;
	}
	return 0;
}

static int throttle(mfs_producer_t *p)
{
	while (p->pr_tokens < 1) {
		double now = mfs_now_s();
		p->pr_tokens += (now - p->pr_t_last) * p->pr_rate;
		if (p->pr_tokens > p->pr_burst)
			p->pr_tokens = p->pr_burst;
		p->pr_t_last = now;
		if (p->pr_tokens >= 1)
			break;
		int rc = send_lingering(p, now);
		if (rc)
			return rc;
		int ms = (int)ceil((1 - p->pr_tokens) / p->pr_rate * 1000);
		rd_kafka_poll(p->pr_rk, ms < 1 ? 1 : ms > 100 ? 100 : ms);
	}
	p->pr_tokens -= 1;
	return 0;
}

int mfs_producer_send(mfs_producer_t *p, const mfs_event_t *ev)
{
	if (p->pr_fatal || p->pr_st.messages_failed)
		return MFS_EKAFKA;
	if (!p->pr_st.events_sent && !p->pr_t_start) {
		p->pr_t_start = mfs_now_s();
		p->pr_t_last = p->pr_t_start;
	}
	int rc;
	if (p->pr_rate > 0 && (rc = throttle(p)))
		return rc;
	char key[KEY_MAX];
	size_t kl = id_text(ev->op == MFS_OP_DEL_ITEM ? &ev->item : &ev->user, key); /* a user's events: one partition */
	int32_t k = part_of_text(key, kl, p->pr_parts);
	pend_t *b = &p->pr_pend[k];
	if (!b->pb_n) {
		size_t h = p->pr_batch > 1 ? HDR_RESERVE : 0;
		if ((rc = reserve(&b->pb_buf, h + 64)))
			return rc;
		b->pb_buf.len = h;
		memcpy(b->pb_key, key, kl);
		b->pb_keylen = kl;
		b->pb_t_first = p->pr_rate > 0 ? mfs_now_s() : 0;
	}
	if ((rc = mfs_event_encode(&b->pb_buf, ev, 1, 0, p->pr_compact)))
		return rc;
	b->pb_n++;
	if ((b->pb_n >= p->pr_batch || b->pb_buf.len >= MFS_PRODUCER_MSG_SOFT_MAX) && (rc = send_pending(p, k)))
		return rc;
	if (++p->pr_since_poll >= POLL_EVERY) {
		p->pr_since_poll = 0;
		rd_kafka_poll(p->pr_rk, 0);
		if (p->pr_fatal || p->pr_st.messages_failed)
			return MFS_EKAFKA;
	}
	return 0;
}

int mfs_producer_flush(mfs_producer_t *p, char *errstr, size_t errstr_size)
{
	int rc = 0;
	for (int32_t k = 0; k < p->pr_parts && !p->pr_fatal; k++)
		if ((rc = send_pending(p, k)))
			break;
	/* librdkafka fails each message after message.timeout.ms, so this ends */
	for (unsigned waited = 1; rd_kafka_flush(p->pr_rk, 1000) == RD_KAFKA_RESP_ERR__TIMED_OUT; waited++) {
		if (p->pr_fatal) { /* nothing more will be delivered: fail the rest now */
			rd_kafka_purge(p->pr_rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
			rd_kafka_poll(p->pr_rk, 100);
			break;
		}
		if (waited % 10 == 0)
			mfs_info("produce", "msg=\"waiting for deliveries\" seconds=%u in_queue=%d delivered_messages=%" PRIu64,
			         waited, rd_kafka_outq_len(p->pr_rk), p->pr_st.messages);
	}
	p->pr_t_end = mfs_now_s();
	const mfs_producer_stats_t *s = &p->pr_st;
	if (s->messages_failed || p->pr_fatal || rc) {
		uint64_t lost = s->messages_sent - s->messages;
		return mfs_errf(errstr, errstr_size, MFS_EKAFKA,
		                "%" PRIu64 " of %" PRIu64 " messages (%" PRIu64 " events) not delivered to %s: %s", lost,
		                s->messages_sent, s->events_sent - s->events, p->pr_topic,
		                s->first_error[0] ? s->first_error : "unknown error");
	}
	return 0;
}

void mfs_producer_get_stats(const mfs_producer_t *p, mfs_producer_stats_t *st)
{
	*st = p->pr_st;
	double end = p->pr_t_end > 0 ? p->pr_t_end : mfs_now_s();
	st->seconds = p->pr_t_start > 0 ? end - p->pr_t_start : 0;
}

int mfs_producer_partitions(const mfs_producer_t *p) { return p->pr_parts; }

rd_kafka_t *mfs_producer_handle(mfs_producer_t *p) { return p->pr_rk; }

/* ---- the loop ---------------------------------------------------------------------------- */

int mfs_produce_run(mfs_producer_t *p, mfs_evsrc_t *src, uint64_t progress_every, mfs_produce_progress_cb cb,
                    void *ctx, char *errstr, size_t errstr_size)
{
	mfs_event_t ev;
	uint64_t n = 0;
	int rc = 0;
	while (mfs_evsrc_next(src, &ev) == 1) {
		if ((rc = mfs_producer_send(p, &ev)))
			break;
		if (cb && progress_every && ++n % progress_every == 0) {
			mfs_producer_stats_t st;
			mfs_producer_get_stats(p, &st);
			if ((rc = cb(ctx, &st)))
				break;
		}
	}
	int src_rc = rc;
	/* flush even after a stop, so what was handed over is delivered (or reported lost) */
	rc = mfs_producer_flush(p, errstr, errstr_size);
	if (src_rc && src_rc != MFS_EKAFKA) {
		if (src_rc != ENOMEM)
			return src_rc; /* the callback's stop (errstr: flush's outcome, if any) */
		mfs_errf(errstr, errstr_size, ENOMEM, "out of memory encoding events");
		return ENOMEM;
	}
	return rc ? rc : src_rc;
}
