/* exchange.c - see exchange.h.
 *
 * DESIGN
 *
 * Threads. The learner's thread owns the ledger and calls note/step between batches; a reader
 * thread (mfs-exchange) polls the topic (every partition assigned from its start, no group)
 * and appends decoded messages to the inbox under a mutex; step swaps the inbox out and
 * merges it. The producer is polled by step (delivery reports count failures).
 *
 * The ledger, per item row (bias then k factors, as the CPU reference keeps it, shard_ref.c):
 *     ref    the row's value at this host's last publish, moved by every merge since: the
 *            current value - ref is its own unpublished move
 *     own    its cumulative contribution (double) and own_n the ratings behind it
 *     tn     its ratings of the row since the last publish
 *     got[s] the cumulative contribution of host s merged here (and got_n[s]); a message
 *            carries the sender's got_n of every host for the row: the receiver's ratings
 *            the sender had merged when it published
 * New rows start with ref = their initial value (mfs_model_init_row, zero bias): the value
 * the first SGD step moved from.
 *
 * Merge of sender s's message for row i (n = its ratings - got_n, d = its contribution -
 * got), from the current value q (captured from the engine with every batch applied):
 *     a = (1 - g)^n, t = v + d a / (1 - a)   the sender's target (v its value)
 *     nr = own_n + tn - (the sender's got_n of this host), ar = (1 - g)^nr,
 *     m = (nr q + n t) / (nr + n)
 *     q' = m + (q - m) ar a                   (mfs_shard_hosts_merge; a sender whose count went
 *                                              back after a restart: q' = q + d)
 * with g = lr (1 + lambda_bi) for the bias and lr (|p|^2 / k + lambda_q) for the factors
 * (|p|^2: the mean over the users of the batches since the last step), not the in-host merge's
 * lr (rho + lambda_q) (gpu/shard.h): with rho this lagged merge measured 0.1-0.6 points worse on
 * every case of bench_shard's hosts scheme and no different on MovieLens (docs/BENCHMARKS.md,
 * "Between hosts"). ref moves with q.
 * Restart. At open the reader notes where each partition of the topic ends, and open returns
 * once it has read to there (the learner's first batch waits; the ratings queue up behind).
 * What it read is merged before the first batch (the learner steps once), with two
 * differences: this host's own messages set own and own_n (what it had published; ref = the
 * row's value now), so that its next publish continues its cumulative contribution rather than
 * start again below what the others hold (they would take that as a restart and subtract);
 * and, for a model loaded from a snapshot, the others' contributions to rows it holds only set
 * got and got_n (the snapshot has them merged). What was published between the snapshot and
 * the restart is therefore lost on this host (its own moves in that window are redone from
 * the replayed ratings, the others' are not merged) until the next publish of each row: the
 * topic's offsets are not in the snapshot yet.
 * An item this host has no row for gets one (every host holds the whole catalogue), starting
 * from its initial value and the sender's whole contribution. The merged rows are written to
 * the host model and handed to the engine with
 * mfs_engine_reset_rows (in flight: batches given before are applied first).
 */
#define _GNU_SOURCE
#include "serve/exchange.h"

#include <errno.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/timeutil.h"
#include "gpu/shard.h"
#include "ingest/kafka_util.h"

#define MAX_HOSTS 64
#define HOST_MAX 128

/* a decoded message */
struct inmsg {
	int self;             /* this host's own, read back */
	int catchup;          /* on the topic before this host opened it (DESIGN, "Restart") */
	int sender;           /* index into hosts (not self); -2: skipped by the merge */
	uint32_t row;         /* the item's row here (merge) */
	mfs_id_t id;          /* str points at idbuf */
	char idbuf[MFS_ID_MAX_LEN];
	uint64_t n;
	uint64_t seen;        /* of this host's ratings of the row, how many the sender had merged */
	double *c;            /* k + 1 */
	float *v;             /* k + 1 */
};

struct mfs_exchange {
	const mfs_conf_t *c;
	mfs_model_t *m;
	size_t k, kv;
	char host[HOST_MAX];
	uint32_t every, since;
	rd_kafka_t *prod, *cons;
	pthread_t th;
	int th_started;
	atomic_int stop;
	pthread_mutex_t mu;   /* the inbox, hosts[] and nhosts (the reader adds hosts) */
	struct inmsg **in;
	size_t nin, capin;
	char hosts[MAX_HOSTS][HOST_MAX];
	int nhosts;
	/* catch-up: the topic's end per partition when this host opened it; the reader marks the
	 * messages below it and counts the partitions it has read to there */
	int64_t *catch_hi;
	int parts, parts_left;
	int loaded;           /* the model came from a snapshot (rows at open) */
	/* ledger (learner's thread), capacity cap rows, ref set below init_to */
	uint32_t cap, init_to;
	float *ref;
	double *own;
	uint64_t *own_n;
	uint32_t *tn, *tlist;
	size_t ntl;
	double *got[MAX_HOSTS];
	uint64_t *got_n[MAX_HOSTS];
	/* scratch */
	uint32_t *rows, *slot;
	float *vals;
	size_t caprows;
	double p2_sum;
	uint64_t p2_n;
	double p2;
	msgpack_sbuffer sb;
	atomic_uint_fast64_t produce_errors;
	mfs_exchange_stats_t st;
};

/* ---- the ledger ----------------------------------------------------------------------------- */

static int grow_arr(void **p, size_t old_n, size_t n, size_t size)
{
	void *q = realloc(*p, n * size);
	if (!q)
		return ENOMEM;
	memset((char *)q + old_n * size, 0, (n - old_n) * size);
	*p = q;
	return 0;
}

/* Room for every item row of the model; new rows' ref = their initial value. */
static int ledger_fit(mfs_exchange_t *x)
{
	const uint32_t need = x->m->n_items;
	const size_t kv = x->kv;
	if (need > x->cap) {
		uint32_t cap = x->cap ? x->cap : 1024;
		while (cap < need)
			cap *= 2;
		const size_t o = x->cap;
		int rc = grow_arr((void **)&x->ref, o * kv, (size_t)cap * kv, sizeof *x->ref);
		rc = rc ? rc : grow_arr((void **)&x->own, o * kv, (size_t)cap * kv, sizeof *x->own);
		rc = rc ? rc : grow_arr((void **)&x->own_n, o, cap, sizeof *x->own_n);
		rc = rc ? rc : grow_arr((void **)&x->tn, o, cap, sizeof *x->tn);
		rc = rc ? rc : grow_arr((void **)&x->tlist, o, cap, sizeof *x->tlist);
		rc = rc ? rc : grow_arr((void **)&x->slot, o, cap, sizeof *x->slot);
		for (int s = 0; !rc && s < MAX_HOSTS; s++)
			if (x->got[s]) {
				rc = grow_arr((void **)&x->got[s], o * kv, (size_t)cap * kv, sizeof(double));
				rc = rc ? rc : grow_arr((void **)&x->got_n[s], o, cap, sizeof(uint64_t));
			}
		if (rc)
			return rc;
		x->cap = cap;
	}
	for (; x->init_to < need; x->init_to++) /* bias 0 (zeroed), factors as the row was drawn */
		mfs_model_init_row(x->m, 1, x->init_to, x->ref + (size_t)x->init_to * kv + 1);
	return 0;
}

/* Sender s's ledger, made on its first message. */
static int ledger_sender(mfs_exchange_t *x, int s)
{
	if (x->got[s])
		return 0;
	x->got[s] = calloc((size_t)(x->cap ? x->cap : 1) * x->kv, sizeof(double));
	x->got_n[s] = calloc(x->cap ? x->cap : 1, sizeof(uint64_t));
	return x->got[s] && x->got_n[s] ? 0 : ENOMEM;
}

int mfs_exchange_note(mfs_exchange_t *x, const uint32_t *u, const uint32_t *i, size_t n)
{
	int rc = ledger_fit(x);
	if (rc)
		return rc;
	const float *P = x->m->P;
	for (size_t j = 0; j < n; j++) {
		if (x->tn[i[j]]++ == 0)
			x->tlist[x->ntl++] = i[j];
		const float *p = P + (size_t)u[j] * x->k;
		double s = 0;
		for (size_t f = 0; f < x->k; f++)
			s += (double)p[f] * (double)p[f];
		x->p2_sum += s;
	}
	x->p2_n += n;
	return 0;
}

/* ---- messages ------------------------------------------------------------------------------- */

static int pack_msg(mfs_exchange_t *x, const mfs_id_t *id, uint32_t row, uint64_t n, const double *c,
                    const float *v, int nhosts)
{
	msgpack_packer pk;
	msgpack_sbuffer_clear(&x->sb);
	msgpack_packer_init(&pk, &x->sb, msgpack_sbuffer_write);
	const size_t hl = strlen(x->host);
	int rc = msgpack_pack_array(&pk, 6);
	rc = rc ? rc : msgpack_pack_str(&pk, hl);
	rc = rc ? rc : msgpack_pack_str_body(&pk, x->host, hl);
	if (!rc && id->kind == MFS_ID_U64)
		rc = msgpack_pack_uint64(&pk, id->num);
	else if (!rc) {
		rc = msgpack_pack_str(&pk, id->len);
		rc = rc ? rc : msgpack_pack_str_body(&pk, id->str, id->len);
	}
	rc = rc ? rc : msgpack_pack_uint64(&pk, n);
	/* little-endian on the wire, as the snapshot's floats (this build's hosts are) */
	rc = rc ? rc : msgpack_pack_bin(&pk, x->kv * sizeof *c);
	rc = rc ? rc : msgpack_pack_bin_body(&pk, c, x->kv * sizeof *c);
	rc = rc ? rc : msgpack_pack_bin(&pk, x->kv * sizeof *v);
	rc = rc ? rc : msgpack_pack_bin_body(&pk, v, x->kv * sizeof *v);
	/* what it had merged of the others' ratings of the row: {host: ratings} */
	uint32_t nm = 0;
	for (int s = 0; s < nhosts; s++)
		nm += x->got_n[s] && x->got_n[s][row] > 0;
	rc = rc ? rc : msgpack_pack_map(&pk, nm);
	for (int s = 0; s < nhosts && !rc; s++)
		if (x->got_n[s] && x->got_n[s][row] > 0) {
			const size_t l = strlen(x->hosts[s]);
			rc = msgpack_pack_str(&pk, l);
			rc = rc ? rc : msgpack_pack_str_body(&pk, x->hosts[s], l);
			rc = rc ? rc : msgpack_pack_uint64(&pk, x->got_n[s][row]);
		}
	return rc ? ENOMEM : 0;
}

/* Decode a message into a new inmsg, or NULL (bad: counted by the caller). */
static struct inmsg *unpack_msg(mfs_exchange_t *x, const void *buf, size_t len, char *host, size_t hostsz)
{
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	struct inmsg *im = NULL;
	size_t off = 0;
	if (msgpack_unpack_next(&up, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
		goto done;
	const msgpack_object *o = &up.data;
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 6)
		goto done;
	const msgpack_object *a = o->via.array.ptr;
	if (a[0].type != MSGPACK_OBJECT_STR || a[0].via.str.size == 0 || a[0].via.str.size >= hostsz ||
	    a[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[3].type != MSGPACK_OBJECT_BIN ||
	    a[3].via.bin.size != x->kv * sizeof(double) || a[4].type != MSGPACK_OBJECT_BIN ||
	    a[4].via.bin.size != x->kv * sizeof(float) || a[5].type != MSGPACK_OBJECT_MAP)
		goto done;
	if (!(im = calloc(1, sizeof *im + x->kv * (sizeof(double) + sizeof(float)))))
		goto done;
	im->c = (double *)(im + 1);
	im->v = (float *)(im->c + x->kv);
	if (a[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		im->id = mfs_id_u64(a[1].via.u64);
	} else if (a[1].type == MSGPACK_OBJECT_STR && a[1].via.str.size > 0 && a[1].via.str.size <= MFS_ID_MAX_LEN) {
		memcpy(im->idbuf, a[1].via.str.ptr, a[1].via.str.size);
		im->id = (mfs_id_t){MFS_ID_STR, (uint16_t)a[1].via.str.size, 0, im->idbuf};
	} else {
		free(im);
		im = NULL;
		goto done;
	}
	memcpy(host, a[0].via.str.ptr, a[0].via.str.size);
	host[a[0].via.str.size] = 0;
	im->n = a[2].via.u64;
	for (uint32_t j = 0; j < a[5].via.map.size; j++) {
		const msgpack_object_kv *kv = &a[5].via.map.ptr[j];
		if (kv->key.type != MSGPACK_OBJECT_STR || kv->val.type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
			free(im);
			im = NULL;
			goto done;
		}
		if (kv->key.via.str.size == strlen(x->host) && !memcmp(kv->key.via.str.ptr, x->host, kv->key.via.str.size))
			im->seen = kv->val.via.u64;
	}
	memcpy(im->c, a[3].via.bin.ptr, x->kv * sizeof(double));
	memcpy(im->v, a[4].via.bin.ptr, x->kv * sizeof(float));
	for (size_t f = 0; f < x->kv; f++)
		if (!isfinite(im->c[f]) || !isfinite(im->v[f])) { /* no NaN reaches the factors */
			free(im);
			im = NULL;
			goto done;
		}
done:
	msgpack_unpacked_destroy(&up);
	return im;
}

static void *reader_main(void *arg)
{
	mfs_exchange_t *x = arg;
	char host[HOST_MAX];
	mfs_thread_name("mfs-exchange");
	while (!atomic_load(&x->stop)) {
		rd_kafka_message_t *msg = rd_kafka_consumer_poll(x->cons, 100);
		if (!msg)
			continue;
		if (msg->err) {
			if (msg->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) { /* (a compacted tail) */
				pthread_mutex_lock(&x->mu);
				if (msg->partition >= 0 && msg->partition < x->parts && x->catch_hi[msg->partition] > 0) {
					x->catch_hi[msg->partition] = 0;
					x->parts_left--;
				}
				pthread_mutex_unlock(&x->mu);
			} else {
				mfs_warn("exchange", "msg=\"topic read error\" error=\"%s\"", rd_kafka_message_errstr(msg));
			}
			rd_kafka_message_destroy(msg);
			continue;
		}
		struct inmsg *im = unpack_msg(x, msg->payload, msg->len, host, sizeof host);
		const int32_t part = msg->partition;
		const int64_t off = msg->offset;
		rd_kafka_message_destroy(msg);
		pthread_mutex_lock(&x->mu);
		int catchup = 0;
		if (part >= 0 && part < x->parts && x->catch_hi[part] > 0) {
			catchup = off < x->catch_hi[part];
			if (off + 1 >= x->catch_hi[part]) { /* read to where it ended at open */
				x->catch_hi[part] = 0;
				x->parts_left--;
			}
		}
		if (im)
			im->catchup = catchup;
		if (!im) {
			if (x->st.bad_messages++ == 0)
				mfs_warn("exchange", "msg=\"a message on the exchange topic is not an item contribution of k=%zu: "
				         "skipped and counted\"", x->k);
		} else {
			im->self = !strcmp(host, x->host);
			im->sender = -1;
			for (int s = 0; !im->self && s < x->nhosts; s++)
				if (!strcmp(x->hosts[s], host))
					im->sender = s;
			if (!im->self && im->sender < 0 && x->nhosts < MAX_HOSTS) {
				snprintf(x->hosts[x->nhosts], HOST_MAX, "%s", host);
				im->sender = x->nhosts++;
				mfs_info("exchange", "msg=\"first contribution from a host\" host=%s hosts=%d", host, x->nhosts + 1);
			}
			if (!im->self && im->sender < 0) {
				x->st.bad_messages++;
				free(im);
			} else if (x->nin == x->capin) {
				size_t cap = x->capin ? 2 * x->capin : 1024;
				struct inmsg **q = realloc(x->in, cap * sizeof *q);
				if (q) {
					x->in = q;
					x->capin = cap;
					x->in[x->nin++] = im;
				} else {
					free(im); /* the sender's next message of the row carries its whole contribution */
				}
			} else {
				x->in[x->nin++] = im;
			}
		}
		pthread_mutex_unlock(&x->mu);
	}
	return NULL;
}

/* ---- publish and merge ---------------------------------------------------------------------- */

static int scratch(mfs_exchange_t *x, size_t n)
{
	if (n <= x->caprows)
		return 0;
	size_t cap = x->caprows ? x->caprows : 1024;
	while (cap < n)
		cap *= 2;
	uint32_t *r = realloc(x->rows, cap * sizeof *r);
	if (r)
		x->rows = r;
	float *v = realloc(x->vals, cap * x->kv * sizeof *v);
	if (v)
		x->vals = v;
	if (!r || !v)
		return ENOMEM;
	x->caprows = cap;
	return 0;
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	(void)rk;
	mfs_exchange_t *x = opaque;
	if (msg->err && atomic_fetch_add(&x->produce_errors, 1) == 0)
		mfs_error("exchange", "msg=\"an item contribution was not delivered\" error=\"%s\"",
		          rd_kafka_err2str(msg->err));
}

static int produce(mfs_exchange_t *x, const mfs_id_t *id)
{
	char key[MFS_ID_MAX_LEN + HOST_MAX + 32];
	char idtxt[MFS_ID_MAX_LEN + 16];
	const int kl = snprintf(key, sizeof key, "%s@%s", mfs_id_format(id, idtxt, sizeof idtxt), x->host);
	for (;;) {
		rd_kafka_resp_err_t ke = rd_kafka_producev(
			x->prod, RD_KAFKA_V_TOPIC(x->c->exchange_topic), RD_KAFKA_V_KEY(key, (size_t)kl),
			RD_KAFKA_V_VALUE(x->sb.data, x->sb.size), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
		if (ke == RD_KAFKA_RESP_ERR_NO_ERROR)
			return 0;
		if (ke != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
			mfs_error("exchange", "msg=\"produce failed\" error=\"%s\"", rd_kafka_err2str(ke));
			return MFS_EKAFKA;
		}
		rd_kafka_poll(x->prod, 10); /* the local queue is full: wait for deliveries */
	}
}

/* Publish every row rated since the last publish: own += value - ref, ref = value. */
static int publish(mfs_exchange_t *x, mfs_engine_t *e)
{
	const size_t n = x->ntl, kv = x->kv;
	int rc;
	if (!n)
		return 0;
	if ((rc = scratch(x, n)))
		return rc;
	if ((rc = mfs_engine_capture(e, NULL, 0, NULL, x->tlist, n, x->vals)) || (rc = mfs_engine_capture_wait(e)))
		return rc;
	pthread_mutex_lock(&x->mu);
	const int nhosts = x->nhosts; /* names below it stay as they are */
	pthread_mutex_unlock(&x->mu);
	for (size_t j = 0; j < n; j++) {
		const uint32_t i = x->tlist[j];
		const float *v = x->vals + j * kv;
		float *ref = x->ref + (size_t)i * kv;
		double *own = x->own + (size_t)i * kv;
		for (size_t f = 0; f < kv; f++) {
			own[f] += (double)v[f] - (double)ref[f];
			ref[f] = v[f];
		}
		x->own_n[i] += x->tn[i];
		x->tn[i] = 0;
		const mfs_id_t id = mfs_idmap_key(x->m->items, i);
		if (!id.kind)
			continue; /* freed since (the id lifecycle) */
		if ((rc = pack_msg(x, &id, i, x->own_n[i], own, v, nhosts)) || (rc = produce(x, &id)))
			return rc;
	}
	x->st.published_rows += n;
	x->ntl = 0;
	rd_kafka_poll(x->prod, 0);
	return 0;
}

/* Merge the messages that arrived (DESIGN). */
static int merge(mfs_exchange_t *x, mfs_engine_t *e, const mfs_hparams_t *hp, mfs_touched_t *touched)
{
	struct inmsg **in;
	size_t nin;
	pthread_mutex_lock(&x->mu);
	in = x->in;
	nin = x->nin;
	x->in = NULL;
	x->nin = x->capin = 0;
	pthread_mutex_unlock(&x->mu);
	if (!nin)
		return 0;
	const size_t kv = x->kv, k = x->k;
	const uint64_t added0 = x->st.items_added;
	int rc = scratch(x, nin);
	size_t nr = 0;
	/* the rows (an item new here gets one), each captured once; its own messages are skipped */
	for (size_t j = 0; !rc && j < nin; j++) {
		struct inmsg *im = in[j];
		uint32_t i = mfs_idmap_find(x->m->items, &im->id);
		if (im->catchup && !im->self && x->loaded && i != MFS_ROW_NONE && i < x->cap) {
			/* on the topic before this host opened it, for a row its snapshot holds: the
			 * snapshot has it merged (up to the contributions after it: DESIGN, "Restart") */
			if ((rc = ledger_sender(x, im->sender)))
				break;
			memcpy(x->got[im->sender] + (size_t)i * kv, im->c, kv * sizeof *im->c);
			x->got_n[im->sender][i] = im->n;
			im->sender = -2;
			continue;
		}
		if (i == MFS_ROW_NONE && (!im->self || im->catchup)) {
			/* an item this host's users have not rated yet: every host holds the whole
			 * catalogue, so it gets its row now, with what the sender learned of it */
			if ((rc = mfs_model_item_row(x->m, &im->id, &i)) || (rc = ledger_fit(x)))
				break;
			x->st.items_added++;
		}
		if (i == MFS_ROW_NONE || i >= x->cap) {
			im->sender = -2; /* skip */
			continue;
		}
		if (im->self && !im->catchup) { /* its own, read back */
			im->sender = -2;
			continue;
		}
		if (im->self) {
			im->sender = -3; /* its own from before: its contribution so far (below) */
		} else {
			if ((rc = ledger_sender(x, im->sender)))
				break;
			x->st.received_rows++;
		}
		if (x->slot[i] == 0) { /* slot + 1, 0: not yet */
			x->rows[nr] = i;
			x->slot[i] = (uint32_t)++nr;
		}
		im->row = i;
	}
	if (!rc && x->st.items_added != added0) /* rows were added: the engine takes them first */
		rc = mfs_engine_grow(e);
	if (!rc && nr && !(rc = mfs_engine_capture(e, NULL, 0, NULL, x->rows, nr, x->vals)))
		rc = mfs_engine_capture_wait(e);
	const double p2 = x->p2;
	const double lb = mfs_shard_blend_log((double)hp->lr * (1.0 + (double)hp->lambda_bi));
	const double lq = mfs_shard_blend_log((double)hp->lr * (p2 / (double)k + (double)hp->lambda_q));
	for (size_t j = 0; !rc && j < nin; j++) {
		struct inmsg *im = in[j];
		if (im->sender == -3) { /* own = what it had published, the value as it is now */
			const uint32_t i = im->row;
			memcpy(x->own + (size_t)i * kv, im->c, kv * sizeof *im->c);
			x->own_n[i] = im->n;
			memcpy(x->ref + (size_t)i * kv, x->vals + (size_t)(x->slot[i] - 1) * kv, kv * sizeof *x->ref);
			continue;
		}
		if (im->sender < 0)
			continue;
		const uint32_t i = im->row;
		double *g = x->got[im->sender] + (size_t)i * kv;
		uint64_t *gn = &x->got_n[im->sender][i];
		float *q = x->vals + (size_t)(x->slot[i] - 1) * kv, *ref = x->ref + (size_t)i * kv;
		const int back = im->n < *gn; /* the sender restarted behind what it had sent */
		const double n = back ? 0 : (double)(im->n - *gn);
		*gn = im->n;
		if (n == 0 && !back)
			continue;
		const uint64_t mine = x->own_n[i] + x->tn[i];
		const double nrr = mine > im->seen ? (double)(mine - im->seen) : 0;
		for (size_t f = 0; f < kv; f++) {
			const double d = im->c[f] - g[f], cur = q[f];
			g[f] = im->c[f];
			const double next = back ? cur + d : mfs_shard_hosts_merge(cur, d, (double)im->v[f], n, nrr, f ? lq : lb);
			q[f] = (float)next;
			if (!isfinite(q[f]))
				q[f] = (float)cur; /* no NaN reaches the factors */
			ref[f] = (float)((double)ref[f] + ((double)q[f] - cur));
		}
		x->st.merged_rows++;
	}
	if (!rc && nr) {
		/* write the merged rows to the host model and hand them to the engine */
		for (size_t j = 0; j < nr; j++) {
			const uint32_t i = x->rows[j];
			const float *v = x->vals + j * kv;
			x->m->bi[i] = v[0];
			memcpy(x->m->Q + (size_t)i * k, v + 1, k * sizeof *v);
		}
		rc = mfs_engine_reset_rows(e, 1, x->rows, nr, 1);
		if (!rc)
			rc = mfs_touched_mark_many(touched, x->rows, nr);
	}
	for (size_t j = 0; j < nr; j++)
		x->slot[x->rows[j]] = 0;
	for (size_t j = 0; j < nin; j++)
		free(in[j]);
	free(in);
	return rc;
}

int mfs_exchange_step(mfs_exchange_t *x, mfs_engine_t *e, const mfs_hparams_t *hp, mfs_touched_t *touched,
                      int batch)
{
	int rc = ledger_fit(x);
	if (rc)
		return rc;
	if (batch && ++x->since >= x->every) {
		x->since = 0;
		if ((rc = publish(x, e)))
			return rc;
	}
	if (x->p2_n) { /* |p|^2: the users of the batches since the last step */
		x->p2 = x->p2_sum / (double)x->p2_n;
		x->p2_sum = 0;
		x->p2_n = 0;
	}
	return merge(x, e, hp, touched);
}

void mfs_exchange_get_stats(mfs_exchange_t *x, mfs_exchange_stats_t *out)
{
	pthread_mutex_lock(&x->mu);
	*out = x->st;
	pthread_mutex_unlock(&x->mu);
	out->produce_errors = atomic_load(&x->produce_errors);
}

/* ---- open and close ------------------------------------------------------------------------- */

void mfs_exchange_close(mfs_exchange_t *x)
{
	if (!x)
		return;
	if (x->th_started) {
		atomic_store(&x->stop, 1);
		pthread_join(x->th, NULL);
	}
	if (x->prod) {
		if (rd_kafka_flush(x->prod, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR)
			mfs_error("exchange", "msg=\"item contributions not delivered at close\" queued=%d",
			          rd_kafka_outq_len(x->prod));
		rd_kafka_destroy(x->prod);
	}
	if (x->cons) {
		rd_kafka_consumer_close(x->cons);
		rd_kafka_destroy(x->cons);
	}
	for (size_t j = 0; j < x->nin; j++)
		free(x->in[j]);
	free(x->in);
	free(x->ref);
	free(x->own);
	free(x->own_n);
	free(x->tn);
	free(x->tlist);
	for (int s = 0; s < MAX_HOSTS; s++) {
		free(x->got[s]);
		free(x->got_n[s]);
	}
	free(x->catch_hi);
	free(x->rows);
	free(x->slot);
	free(x->vals);
	msgpack_sbuffer_destroy(&x->sb);
	pthread_mutex_destroy(&x->mu);
	free(x);
}

int mfs_exchange_open(const mfs_conf_t *c, const char *brokers, mfs_model_t *m, mfs_exchange_t **out,
                      char *errstr, size_t es)
{
	*out = NULL;
	if (!c || !*c->exchange_topic)
		return mfs_errf(errstr, es, MFS_EINVAL, "exchange: no exchange.topic");
	mfs_exchange_t *x = calloc(1, sizeof *x);
	if (!x)
		return mfs_errf(errstr, es, ENOMEM, "exchange: out of memory");
	x->c = c;
	x->m = m;
	x->k = (size_t)m->k;
	x->kv = x->k + 1;
	x->every = (uint32_t)c->exchange_every_batches;
	pthread_mutex_init(&x->mu, NULL);
	msgpack_sbuffer_init(&x->sb);
	if (*c->exchange_host)
		snprintf(x->host, sizeof x->host, "%s", c->exchange_host);
	else if (gethostname(x->host, sizeof x->host - 1) || !*x->host)
		snprintf(x->host, sizeof x->host, "host-%ld", (long)getpid());
	char e[512];
	int rc;
	rd_kafka_conf_t *kc = NULL;
	/* the producer: every contribution delivered, in order per row and host */
	const char *const pdef[] = {"enable.idempotence", "true", "linger.ms", "5", NULL};
	if ((rc = mfs_kafka_conf_new_with(c, pdef, &kc, errstr, es)))
		goto fail;
	if (brokers && *brokers && rd_kafka_conf_set(kc, "bootstrap.servers", brokers, e, sizeof e)) {
		rd_kafka_conf_destroy(kc);
		rc = mfs_errf(errstr, es, MFS_ECONFIG, "exchange: %s", e);
		goto fail;
	}
	rd_kafka_conf_set_dr_msg_cb(kc, dr_cb);
	rd_kafka_conf_set_opaque(kc, x);
	if (!(x->prod = rd_kafka_new(RD_KAFKA_PRODUCER, kc, e, sizeof e))) {
		rd_kafka_conf_destroy(kc);
		rc = mfs_errf(errstr, es, MFS_EKAFKA, "exchange producer: %s", e);
		goto fail;
	}
	/* the reader: every partition from its start, no group (nothing is committed) */
	const char *const cdef[] = {"fetch.wait.max.ms", "50", NULL};
	if ((rc = mfs_kafka_conf_new_with(c, cdef, &kc, errstr, es)))
		goto fail;
	if ((brokers && *brokers && rd_kafka_conf_set(kc, "bootstrap.servers", brokers, e, sizeof e)) ||
	    rd_kafka_conf_set(kc, "group.id", "mfstream-exchange", e, sizeof e) ||
	    rd_kafka_conf_set(kc, "enable.auto.commit", "false", e, sizeof e) ||
	    rd_kafka_conf_set(kc, "enable.partition.eof", "true", e, sizeof e) ||
	    /* a position that falls off the log (retention, compaction, a broker that keeps less)
	     * resumes at the oldest message kept, never at the end: every key's latest value is
	     * what a reader of this topic needs (librdkafka's default, latest, skipped the
	     * contributions in between: on the embedded broker up to all of another service's) */
	    rd_kafka_conf_set(kc, "auto.offset.reset", "earliest", e, sizeof e)) {
		rd_kafka_conf_destroy(kc);
		rc = mfs_errf(errstr, es, MFS_ECONFIG, "exchange: %s", e);
		goto fail;
	}
	if (!(x->cons = rd_kafka_new(RD_KAFKA_CONSUMER, kc, e, sizeof e))) {
		rd_kafka_conf_destroy(kc);
		rc = mfs_errf(errstr, es, MFS_EKAFKA, "exchange reader: %s", e);
		goto fail;
	}
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(x->cons, c->exchange_topic, NULL);
	rd_kafka_resp_err_t ke = rkt ? rd_kafka_metadata(x->cons, 0, rkt, &md, 30000) : RD_KAFKA_RESP_ERR__FAIL;
	int parts = 0;
	if (!ke && md && md->topic_cnt == 1 && !md->topics[0].err)
		parts = md->topics[0].partition_cnt;
	if (md)
		rd_kafka_metadata_destroy(md);
	if (rkt)
		rd_kafka_topic_destroy(rkt);
	if (parts <= 0) {
		rc = mfs_errf(errstr, es, MFS_EINVAL,
		              "exchange: topic \"%s\" not found (%s): create it (compacted: cleanup.policy=compact)",
		              c->exchange_topic, ke ? rd_kafka_err2str(ke) : "no partitions");
		goto fail;
	}
	/* catch-up: where each partition ends now (DESIGN, "Restart") */
	x->loaded = m->n_items > 0;
	x->parts = parts;
	if (!(x->catch_hi = calloc((size_t)parts, sizeof *x->catch_hi))) {
		rc = mfs_errf(errstr, es, ENOMEM, "exchange: out of memory");
		goto fail;
	}
	for (int p = 0; p < parts; p++) {
		int64_t lo = 0, hi = 0;
		ke = rd_kafka_query_watermark_offsets(x->cons, c->exchange_topic, p, &lo, &hi, 30000);
		if (ke) {
			rc = mfs_errf(errstr, es, MFS_EKAFKA, "exchange: the end of %s [%d]: %s", c->exchange_topic, p,
			              rd_kafka_err2str(ke));
			goto fail;
		}
		if (hi > lo) {
			x->catch_hi[p] = hi;
			x->parts_left++;
		}
	}
	rd_kafka_topic_partition_list_t *pl = rd_kafka_topic_partition_list_new(parts);
	for (int p = 0; p < parts; p++)
		rd_kafka_topic_partition_list_add(pl, c->exchange_topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
	ke = rd_kafka_assign(x->cons, pl);
	rd_kafka_topic_partition_list_destroy(pl);
	if (ke) {
		rc = mfs_errf(errstr, es, MFS_EKAFKA, "exchange: assign: %s", rd_kafka_err2str(ke));
		goto fail;
	}
	if ((rc = ledger_fit(x))) {
		mfs_errf(errstr, es, rc, "exchange: out of memory");
		goto fail;
	}
	if ((rc = pthread_create(&x->th, NULL, reader_main, x))) {
		mfs_errf(errstr, es, rc, "exchange: reader thread: %s", strerror(rc));
		goto fail;
	}
	x->th_started = 1;
	/* read what the topic held at open before the first batch: this host's own contributions
	 * so far, and the others' (merged, or for a loaded model taken as merged) */
	for (double t0 = mfs_now_s(), next = t0 + 10;;) {
		pthread_mutex_lock(&x->mu);
		const int left = x->parts_left;
		pthread_mutex_unlock(&x->mu);
		if (!left)
			break;
		if (mfs_now_s() >= next) {
			mfs_info("exchange", "msg=\"reading the exchange topic to its end before the first batch\" "
			         "partitions_left=%d seconds=%.0f", left, mfs_now_s() - t0);
			next += 10;
		}
		mfs_sleep_ms(10);
	}
	mfs_info("exchange", "msg=\"exchanging item rows\" topic=%s partitions=%d host=%s every_batches=%u",
	         c->exchange_topic, parts, x->host, x->every);
	*out = x;
	return 0;
fail:
	mfs_exchange_close(x);
	return rc;
}
