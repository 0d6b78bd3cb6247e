/* service.c - see service.h.
 *
 * DESIGN: one thread. Messages are handled as they are polled: decoded, their events turned
 * into rows and appended to the pending batch, and the partition's next offset advanced to
 * offset + 1. The batch goes to the engine when it holds serve.batch_size ratings, and always
 * before a snapshot, so a snapshot is taken at a batch boundary and the offsets it stores
 * name exactly the messages whose events the published rows contain. The rebalance callback
 * runs inside rd_kafka_consumer_poll on this same thread, so it can flush and publish too.
 */
#include "ingest/service.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "common/err.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "gpu/engine.h"
#include "ingest/event.h"
#include "ingest/kafka_consumer.h"
#include "ingest/kafka_util.h"
#include "model_store/touched.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_load.h"
#include "snapshots/snap_writer.h"

typedef struct part {
	char *topic;
	int32_t partition;
	int64_t next;  /* next offset to apply (last applied + 1) */
	int assigned;
} part_t;

typedef struct svc {
	const mfs_conf_t *c;
	mfs_model_t *m;
	mfs_engine_t *e;
	mfs_snap_writer_t *w;
	rd_kafka_t *rk, *dlq;
	mfs_consumer_cbs_t cbs;
	mfs_event_opts_t eo;
	mfs_events_t evs;
	/* pending batch */
	uint32_t *bu, *bi;
	float *br;
	size_t bn, bcap;
	uint32_t grown_users, grown_items; /* rows the engine knows about */
	mfs_touched_t tu, ti;
	part_t *parts;
	size_t n_parts;
	uint64_t rejected[MFS_REJ__COUNT];
	uint64_t rej_logged_suppressed;
	double rej_log_next;
	int dirty;
	int fatal;
	uint64_t snapshots, messages;
	double pq_sse;       /* test-then-train squared error since the last snapshot */
	uint64_t pq_n;
	double pq_rmse_last; /* of the last interval that had events (NaN: none yet) */
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

static int flush_batch(svc_t *s)
{
	int rc;
	if (s->bn == 0)
		return 0;
	if (s->m->n_users != s->grown_users || s->m->n_items != s->grown_items) {
		if ((rc = mfs_engine_grow(s->e))) {
			mfs_errf(s->err, sizeof s->err, rc, "engine grow: %s", mfs_strerror(rc));
			return rc;
		}
		s->grown_users = s->m->n_users;
		s->grown_items = s->m->n_items;
	}
	mfs_batch_t b = {s->bu, s->bi, s->br, s->bn};
	if (s->c->serve_prequential) { /* test, then train */
		mfs_loss_t l;
		if ((rc = mfs_engine_loss(s->e, &b, &l))) {
			mfs_errf(s->err, sizeof s->err, rc, "engine loss: %s", mfs_strerror(rc));
			return rc;
		}
		if (isfinite(l.sse)) {
			s->pq_sse += l.sse;
			s->pq_n += l.n;
		}
	}
	if ((rc = mfs_engine_sgd(s->e, &b))) {
		mfs_errf(s->err, sizeof s->err, rc, "engine sgd: %s", mfs_strerror(rc));
		return rc;
	}
	s->bn = 0;
	return 0;
}

static int snapshot(svc_t *s, const char *why)
{
	int rc;
	if ((rc = flush_batch(s)))
		return rc;
	if (!s->dirty)
		return 0;
	if ((rc = mfs_engine_sync(s->e))) {
		mfs_errf(s->err, sizeof s->err, rc, "engine sync: %s", mfs_strerror(rc));
		return rc;
	}
	mfs_snap_offset_t *offs = calloc(s->n_parts + 1, sizeof *offs);
	mfs_snap_extra_t ex[4 + MFS_REJ__COUNT];
	char names[MFS_REJ__COUNT][64];
	if (!offs)
		return mfs_errf(s->err, sizeof s->err, ENOMEM, "out of memory");
	size_t no = 0;
	for (size_t j = 0; j < s->n_parts; j++)
		if (s->parts[j].next >= 0)
			offs[no++] = (mfs_snap_offset_t){s->parts[j].topic, s->parts[j].partition, s->parts[j].next};
	size_t nx = 0;
	ex[nx++] = (mfs_snap_extra_t){MFS_META_MU_COUNT, MFS_SNAP_T_U64, s->m->mu_count, 0};
	ex[nx++] = (mfs_snap_extra_t){MFS_META_MU_SUM, MFS_SNAP_T_F64, 0, s->m->mu_sum};
	if (s->pq_n)
		s->pq_rmse_last = sqrt(s->pq_sse / (double)s->pq_n);
	if (s->c->serve_prequential && isfinite(s->pq_rmse_last)) {
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_RMSE, MFS_SNAP_T_F64, 0, s->pq_rmse_last};
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_N, MFS_SNAP_T_U64, s->pq_n, 0};
	}
	for (int r = 0; r < MFS_REJ__COUNT; r++) {
		snprintf(names[r], sizeof names[r], "%s%s", MFS_META_REJECTED_PREFIX, mfs_reject_name(r));
		ex[nx++] = (mfs_snap_extra_t){names[r], MFS_SNAP_T_U64, s->rejected[r], 0};
	}
	static const uint32_t none = 0; /* a non-NULL empty list (NULL would mean every row) */
	mfs_snap_info_t info = {
		.learning_rate = s->c->sgd_lr, .last_loss = NAN, .rating_min = s->c->rating_min,
		.rating_max = s->c->rating_max, .offsets = offs, .n_offsets = no,
		.user_rows = s->tu.n ? s->tu.rows : &none, .n_user_rows = s->tu.n,
		.item_rows = s->ti.n ? s->ti.rows : &none, .n_item_rows = s->ti.n,
		.extra = ex, .n_extra = nx,
	};
	uint64_t seq = 0;
	double t0 = mfs_now_s();
	char e[512] = "";
	rc = mfs_snap_publish(s->w, s->m, &info, &seq, e, sizeof e);
	if (rc) {
		free(offs);
		return mfs_errf(s->err, sizeof s->err, rc, "snapshot: %s", *e ? e : mfs_strerror(rc));
	}
	s->snapshots++;
	mfs_debug("serve", "msg=snapshot why=%s seq=%" PRIu64 " users=%zu items=%zu events_applied=%" PRIu64
	          " seconds=%.4f", why, seq, s->tu.n, s->ti.n, s->m->events_applied, mfs_now_s() - t0);
	mfs_touched_clear(&s->tu);
	mfs_touched_clear(&s->ti);
	s->dirty = 0;
	s->pq_sse = 0;
	s->pq_n = 0;
	/* commit what the snapshot covers (lag monitoring only: restarts use the snapshot) */
	if (s->rk) {
		rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)no + 1);
		for (size_t j = 0; j < s->n_parts; j++)
			if (s->parts[j].assigned && s->parts[j].next >= 0)
				rd_kafka_topic_partition_list_add(l, s->parts[j].topic, s->parts[j].partition)->offset =
					s->parts[j].next;
		if (l->cnt) {
			rd_kafka_resp_err_t ke = rd_kafka_commit(s->rk, l, 1);
			if (ke)
				mfs_debug("serve", "msg=\"offset commit failed\" err=\"%s\"", rd_kafka_err2str(ke));
		}
		rd_kafka_topic_partition_list_destroy(l);
	}
	free(offs);
	return 0;
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
		tp->offset = p->next >= 0 ? p->next : RD_KAFKA_OFFSET_BEGINNING;
	}
}

static void on_revoke(void *ctx, const rd_kafka_topic_partition_list_t *parts)
{
	svc_t *s = ctx;
	int rc = snapshot(s, "revoke");
	if (rc) {
		mfs_error("serve", "msg=\"snapshot on revoke failed\" err=\"%s\"", s->err);
		s->fatal = rc;
	}
	for (int j = 0; j < parts->cnt; j++) {
		part_t *p = part_get(s, parts->elems[j].topic, parts->elems[j].partition, 0);
		if (p)
			p->assigned = 0;
	}
}

static void reject(svc_t *s, const rd_kafka_message_t *msg, int reason, long index, const char *detail)
{
	if (reason < 0 || reason >= MFS_REJ__COUNT)
		reason = MFS_REJ_WRONG_TYPE;
	s->rejected[reason]++;
	double now = mfs_now_s();
	if (now >= s->rej_log_next) {
		mfs_warn("serve", "msg=rejected reason=%s topic=%s partition=%d offset=%" PRId64 " event=%ld detail=\"%s\""
		         " suppressed=%" PRIu64, mfs_reject_name(reason), rd_kafka_topic_name(msg->rkt), (int)msg->partition,
		         msg->offset, index, detail, s->rej_logged_suppressed);
		s->rej_log_next = now + 1.0;
		s->rej_logged_suppressed = 0;
	} else {
		s->rej_logged_suppressed++;
	}
	if (s->dlq) {
		rd_kafka_resp_err_t ke = rd_kafka_producev(
			s->dlq, RD_KAFKA_V_TOPIC(s->c->serve_dead_letter_topic),
			RD_KAFKA_V_VALUE(msg->payload, msg->len), RD_KAFKA_V_KEY(msg->key, msg->key_len),
			RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
			RD_KAFKA_V_HEADER("mfs.reason", mfs_reject_name(reason), (ssize_t)-1), RD_KAFKA_V_END);
		if (ke)
			mfs_warn("serve", "msg=\"dead-letter produce failed\" err=\"%s\"", rd_kafka_err2str(ke));
		rd_kafka_poll(s->dlq, 0);
	}
}

static int batch_reserve(svc_t *s, size_t extra)
{
	if (s->bn + extra <= s->bcap)
		return 0;
	size_t nc = s->bcap ? s->bcap : 1024;
	while (nc < s->bn + extra)
		nc *= 2;
	uint32_t *u = realloc(s->bu, nc * sizeof *u);
	if (u)
		s->bu = u;
	uint32_t *i = realloc(s->bi, nc * sizeof *i);
	if (i)
		s->bi = i;
	float *r = realloc(s->br, nc * sizeof *r);
	if (r)
		s->br = r;
	if (!u || !i || !r)
		return ENOMEM;
	s->bcap = nc;
	return 0;
}

static int handle(svc_t *s, rd_kafka_message_t *msg)
{
	if (msg->err) {
		if (msg->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
			mfs_warn("serve", "msg=\"consumer error\" err=\"%s\"", rd_kafka_message_errstr(msg));
		return 0;
	}
	const char *topic = rd_kafka_topic_name(msg->rkt);
	part_t *p = part_get(s, topic, msg->partition, 1);
	if (!p)
		return mfs_errf(s->err, sizeof s->err, ENOMEM, "out of memory");
	if (p->next >= 0 && msg->offset < p->next)
		return 0; /* already in the model (a re-delivery): exactly once */
	s->messages++;
	int reason = 0, rc;
	long index = -1;
	char detail[256] = "";
	rc = mfs_event_decode(msg->payload, msg->len, &s->eo, &s->evs, &reason, &index, detail, sizeof detail);
	if (rc == MFS_EDECODE) {
		reject(s, msg, reason, index, detail);
	} else if (rc) {
		return mfs_errf(s->err, sizeof s->err, rc, "decode: %s", mfs_strerror(rc));
	} else {
		if ((rc = batch_reserve(s, s->evs.n)))
			return mfs_errf(s->err, sizeof s->err, rc, "out of memory");
		double sum = 0;
		for (size_t j = 0; j < s->evs.n; j++) {
			const mfs_event_t *ev = &s->evs.ev[j];
			uint32_t ru, ri;
			if ((rc = mfs_model_user_row(s->m, &ev->user, &ru)) || (rc = mfs_model_item_row(s->m, &ev->item, &ri)) ||
			    (rc = mfs_touched_mark(&s->tu, ru)) || (rc = mfs_touched_mark(&s->ti, ri)))
				return mfs_errf(s->err, sizeof s->err, rc, "model rows: %s", mfs_strerror(rc));
			s->bu[s->bn] = ru;
			s->bi[s->bn] = ri;
			s->br[s->bn] = ev->rating;
			s->bn++;
			sum += ev->rating;
		}
		mfs_model_observe(s->m, sum, s->evs.n);
	}
	p->next = msg->offset + 1;
	s->dirty = 1;
	if (s->bn >= (size_t)s->c->serve_batch_size)
		return flush_batch(s);
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

int mfs_service_run(const mfs_conf_t *c, const mfs_service_opts_t *o, volatile sig_atomic_t *stop, char *errstr,
                    size_t es)
{
	svc_t s;
	memset(&s, 0, sizeof s);
	s.c = c;
	s.pq_rmse_last = NAN;
	s.eo = (mfs_event_opts_t){c->rating_min, c->rating_max, 0};
	int rc;
	mfs_snap_loaded_t ld;
	memset(&ld, 0, sizeof ld);
	if (!*c->snapshot_dir)
		return mfs_errf(errstr, es, MFS_ECONFIG, "snapshot.dir (--snapshot DIR) is required");
	mfs_model_conf_t mc = {(int)c->model_k, c->model_init_scale, (uint64_t)c->model_seed};
	if ((rc = mfs_model_init(&mc, &s.m))) {
		mfs_errf(errstr, es, rc, "model: %s", mfs_strerror(rc));
		goto out;
	}
	/* recovery: the snapshot's rows, mean, counters and offsets */
	double t0 = mfs_now_s();
	rc = mfs_snap_load(c->snapshot_dir, s.m, &ld, errstr, es);
	if (rc == MFS_ENOTFOUND) {
		mfs_info("serve", "msg=\"no snapshot: starting from an empty model\" dir=%s", c->snapshot_dir);
	} else if (rc) {
		goto out;
	} else {
		for (size_t j = 0; j < ld.n_offsets; j++) {
			part_t *p = part_get(&s, ld.offsets[j].topic, ld.offsets[j].partition, 1);
			if (!p) {
				rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
				goto out;
			}
			p->next = ld.offsets[j].next_offset;
		}
		for (int r = 0; r < MFS_REJ__COUNT; r++)
			s.rejected[r] = ld.rejected[r];
		mfs_info("serve", "msg=\"snapshot loaded\" dir=%s seq=%" PRIu64 " users=%u items=%u events_applied=%" PRIu64
		         " offsets=%zu seconds=%.3f", c->snapshot_dir, ld.seq, s.m->n_users, s.m->n_items,
		         s.m->events_applied, ld.n_offsets, mfs_now_s() - t0);
	}
	mfs_engine_conf_t ec;
	mfs_engine_conf_from(c, &ec);
	if ((rc = mfs_engine_open(&ec, s.m, &s.e, errstr, es)))
		goto out;
	s.grown_users = s.m->n_users;
	s.grown_items = s.m->n_items;
	mfs_hparams_t hp;
	mfs_hparams_from(c, c->sgd_lr, &hp);
	if ((rc = mfs_engine_set_hparams(s.e, &hp))) {
		mfs_errf(errstr, es, rc, "engine: %s", mfs_strerror(rc));
		goto out;
	}
	if ((rc = mfs_snap_writer_open(c->snapshot_dir, (size_t)c->snapshot_map_size, &s.w, errstr, es)))
		goto out;
	if (*c->serve_dead_letter_topic && (rc = open_dlq(&s, o->brokers, errstr, es)))
		goto out;
	s.cbs = (mfs_consumer_cbs_t){&s, on_assign, on_revoke};
	if ((rc = mfs_consumer_open(c, o->brokers, o->topics, o->n_topics, &s.cbs, &s.rk, errstr, es)))
		goto out;
	mfs_info("serve", "msg=started engine=%s topics=%zu batch=%" PRId64 " snapshot_ms=%" PRId64,
	         mfs_engine_name(s.e), o->n_topics, c->serve_batch_size, c->serve_snapshot_ms);

	double period = (double)c->serve_snapshot_ms / 1000.0, next_snap = mfs_now_s() + period;
	double next_stat = mfs_now_s() + 10;
	while (!*stop && !s.fatal) {
		rd_kafka_message_t *msg = rd_kafka_consumer_poll(s.rk, 50);
		if (msg) {
			rc = handle(&s, msg);
			rd_kafka_message_destroy(msg);
			if (rc) {
				s.fatal = rc;
				break;
			}
		}
		double now = mfs_now_s();
		if (now >= next_snap) {
			if ((rc = snapshot(&s, "timer"))) {
				s.fatal = rc;
				break;
			}
			next_snap = now + period;
		}
		if (now >= next_stat) {
			mfs_info("serve", "msg=progress events_applied=%" PRIu64 " messages=%" PRIu64 " users=%u items=%u"
			         " snapshots=%" PRIu64 " prequential_rmse=%.4f", s.m->events_applied, s.messages, s.m->n_users,
			         s.m->n_items, s.snapshots, s.pq_rmse_last);
			next_stat = now + 10;
		}
		if (s.dlq)
			rd_kafka_poll(s.dlq, 0);
	}
	if (s.fatal) {
		rc = s.fatal;
		mfs_errf(errstr, es, rc, "%s", *s.err ? s.err : mfs_strerror(rc));
		goto out;
	}
	/* shutdown: apply what was polled, final snapshot, commit, close */
	if ((rc = snapshot(&s, "shutdown"))) {
		mfs_errf(errstr, es, rc, "%s", s.err);
		goto out;
	}
	rd_kafka_commit(s.rk, NULL, 0); /* best effort: flushes outstanding async commits */
	rd_kafka_consumer_close(s.rk);  /* a revoke here finds nothing new to publish */
	if (s.fatal) {
		rc = s.fatal;
		mfs_errf(errstr, es, rc, "%s", s.err);
		goto out;
	}
	if (s.dlq && rd_kafka_flush(s.dlq, 10000))
		mfs_warn("serve", "msg=\"dead-letter messages not delivered at shutdown\" count=%d", rd_kafka_outq_len(s.dlq));
	mfs_info("serve", "msg=stopped events_applied=%" PRIu64 " messages=%" PRIu64 " snapshots=%" PRIu64,
	         s.m->events_applied, s.messages, s.snapshots);
	rc = 0;
out:
	if (s.rk)
		rd_kafka_destroy(s.rk);
	if (s.dlq)
		rd_kafka_destroy(s.dlq);
	mfs_snap_writer_close(s.w);
	mfs_engine_close(s.e);
	mfs_model_free(s.m);
	mfs_snap_loaded_free(&ld);
	mfs_events_free(&s.evs);
	mfs_touched_free(&s.tu);
	mfs_touched_free(&s.ti);
	for (size_t j = 0; j < s.n_parts; j++)
		free(s.parts[j].topic);
	free(s.parts);
	free(s.bu);
	free(s.bi);
	free(s.br);
	return rc;
}
