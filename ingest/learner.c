/* learner.c - see learner.h.
 *
 * DESIGN: one thread owns model, engine and writer from mfs_learner_start() to the end of
 * the thread (the engine is opened on it, so a CUDA context is current where it is used).
 * The consumer thread only talks to it through the ring. Order of work per batch:
 *   rows for every event (new ids get initialized rows) -> score the batch with the current
 *   model (prequential: test, then train) -> fold its ratings into the running mean -> SGD on
 *   the training part -> append to the retained windows -> advance the applied offsets and the
 *   counters that travel with the batch (rejections, digest, held out).
 * A large batch's rows are resolved on two threads: the users' on the rows thread
 * (rows_main), the items' on the learner; the two halves of the model share nothing
 * (model_store/store.h), and each side still adds its new ids in event order, so the rows are
 * those of a single thread.
 * A snapshot therefore always sits between two batches, and the offsets it stores name exactly
 * the messages whose events the published rows contain (docs/STREAMING.md, "Exactly once").
 * The snapshot is staged there (touched rows copied, offsets and counters captured) and
 * written to LMDB by a writer thread while the learner goes on; one is in flight at a time
 * (a timer snapshot that falls due meanwhile is taken when the writer is free, so a slow disk
 * makes snapshots larger and rarer, never training slower), barriers (revocation, shutdown)
 * wait for their commit, and offsets go to Kafka only after
 * the commit of the snapshot that stores them.
 */
#include "ingest/learner.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/timeutil.h"
#include "gpu/engine.h"
#include "gpu/lr.h"
#include "model_store/touched.h"
#include "snapshots/snap_format.h"
#include "serve/stage_conf.h"
#include "snapshots/snap_writer.h"

/* Batches of at least this many events resolve users and items on two threads. Below it the
 * hand-over (a condition-variable wake, ~10-50 us) would cost more than it saves: one side of a
 * batch this size is some 100 us of lookups. */
#define ROWS_SPLIT_MIN 4096
#define LAT_BUCKETS 10001 /* 1 ms buckets up to 10 s, then one overflow bucket */
#define APL_BUCKETS 100001 /* 0.1 ms buckets up to 10 s, then one overflow bucket */

/* A latency histogram of fixed-width buckets (quantiles without keeping samples). */
typedef struct lat {
	uint64_t *b;
	int nb;
	double width_ms;
	uint64_t n;
} lat_t;

static int lat_init(lat_t *h, int nb, double width_ms)
{
	h->nb = nb;
	h->width_ms = width_ms;
	h->n = 0;
	return (h->b = calloc((size_t)nb, sizeof *h->b)) ? 0 : ENOMEM;
}

static void lat_add(lat_t *h, double ms)
{
	double x = ms / h->width_ms;
	int k = x <= 0 ? 0 : x >= h->nb - 1 ? h->nb - 1 : (int)x;
	h->b[k]++;
	h->n++;
}

/* The q-quantile in ms (the middle of its bucket); NaN when empty. */
static double lat_quantile(const lat_t *h, double q)
{
	if (!h->n)
		return NAN;
	uint64_t want = (uint64_t)ceil(q * (double)h->n), acc = 0;
	if (want < 1)
		want = 1;
	for (int k = 0; k < h->nb; k++) {
		acc += h->b[k];
		if (acc >= want)
			return ((double)k + 0.5) * h->width_ms;
	}
	return INFINITY;
}

typedef struct applied_off {
	char *topic;
	int32_t partition;
	int64_t next;
	int64_t committed; /* last offset sent to Kafka */
} applied_off_t;

/* a ring of the last `cap` ratings (rows are stable forever, so they stay valid) */
typedef struct window {
	uint32_t *u, *i;
	float *r;
	size_t n, cap, alloc, pos;
} window_t;

/* One snapshot on its way to LMDB: the staged rows and everything its meta says, captured
 * on the learner thread at a batch boundary; written by the writer thread; its results are
 * taken back (latency, offset commit, stats) on the learner thread. */
typedef struct snap_job {
	mfs_snap_stage_t *stage;
	mfs_offset_t *offs;
	size_t n_offs, cap_offs;
	mfs_snap_extra_t ex[10 + MFS_REJ__COUNT];
	size_t nx;
	char names[MFS_REJ__COUNT][64];
	double lr, last_loss;
	int64_t *pend_ts; /* create times of the messages it newly covers */
	size_t n_pend, cap_pend;
	size_t users, items;
	uint64_t events_applied;
	const char *why;
	/* results (writer thread) */
	int rc;
	char err[512];
	uint64_t seq;
	double t0, t1;    /* mfs_now_s() around the publish */
	int64_t commit_ms; /* wall time of the commit */
} snap_job_t;

enum { JOB_IDLE, JOB_POSTED, JOB_DONE };

struct mfs_learner {
	const mfs_conf_t *c;
	mfs_bring_t *ring;
	rd_kafka_t *rk;
	mfs_model_t *m;
	mfs_engine_t *e;
	double mem_next_s; /* next device-memory sample (stats_update) */
	mfs_snap_writer_t *w; /* used by the writer thread once it runs */
	mfs_snap_loaded_t loaded;
	/* the writer thread and its one job */
	pthread_t wthread;
	int wquit, job_state;
	pthread_mutex_t wmu;
	pthread_cond_t wcv;
	snap_job_t job;
	pthread_t thread;
	int started, thread_rc;
	char err[1024];
	/* start handshake */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int open_done, open_rc;
	char engine_name[32];
	/* work arrays of one batch */
	uint32_t *tu_, *ti_, *hu_, *hi_;
	uint32_t *ru_, *ri_; /* the rows of a batch's events, in order */
	float *tr_, *hr_;
	size_t wcap;
	uint32_t grown_users, grown_items;
	mfs_touched_t tu, ti;
	/* the rows thread: the users' side of a large batch (side_rows), one job at a time */
	pthread_t rthread;
	int rstarted, rquit, rstate; /* rstate: JOB_IDLE, JOB_POSTED, JOB_DONE */
	pthread_mutex_t rmu;
	pthread_cond_t rcv;
	const mfs_ebatch_t *rbatch;
	int rrc;
	applied_off_t *offs;
	size_t n_offs;
	uint64_t rejected[MFS_REJ__COUNT];
	uint64_t held_out, digest, messages, batches, snapshots;
	uint64_t snap_deferred; /* timer snapshots put off while the writer was busy */
	int dirty;
	/* accuracy */
	double pq_sse, pq_rmse_last;
	uint64_t pq_n;
	window_t win, hwin;
	double win_rmse, hold_rmse, last_loss;
	mfs_lr_t lrc;
	double lr_floor;
	/* freshness: create time of the messages applied since the last snapshot */
	int64_t *pend_ts;
	size_t n_pend, cap_pend;
	lat_t snap_lat; /* message create time -> snapshot commit */
	/* message create time -> applied by the engine: create times waiting for their batch's
	 * ticket (mfs_engine_progress), a FIFO */
	lat_t apl_lat;
	struct apl {
		int64_t ts;      /* message create time, ms */
		uint64_t ticket; /* applied once the engine's progress reaches it */
	} *apl;
	size_t apl_head, apl_n, apl_cap;
	/* stats for other threads */
	pthread_mutex_t st_mu;
	mfs_learner_stats_t st;
	mfs_catalog_t *cat; /* metrics (NULL: none) */
	/* where this thread's time goes: seconds per phase, and when the phase now running began */
	double ph[MFS_LPH__COUNT], ph_t;
	double st_next_s; /* next stats_update while idle */
	double log_ph[MFS_LPH__COUNT]; /* ph at the last progress log */
};

static const char *const phase_names[MFS_LPH__COUNT] = {"wait",   "rows",      "grow",     "score", "submit",
                                                       "record", "full_pass", "snapshot", "other"};

const char *mfs_learner_phase_name(int phase)
{
	return phase >= 0 && phase < MFS_LPH__COUNT ? phase_names[phase] : NULL;
}

/* " learner_<phase><unit>=<sec / per>" for every phase (but wait unless with_wait), for logs */
static void ph_format(char *buf, size_t size, const double *sec, double per, int with_wait, const char *unit)
{
	size_t o = 0;
	buf[0] = '\0';
	for (int p = 0; p < MFS_LPH__COUNT && o < size; p++)
		if (with_wait || p != MFS_LPH_WAIT)
			o += (size_t)snprintf(buf + o, size - o, " learner_%s%s=%.3f", phase_names[p], unit, sec[p] / per);
}

/* The phase that just ended was p: charge it the time since the last mark. One clock read. */
static inline void ph_mark(mfs_learner_t *l, int p)
{
	const double t = mfs_now_s();
	l->ph[p] += t - l->ph_t;
	l->ph_t = t;
}

static applied_off_t *off_get(mfs_learner_t *l, const char *topic, int32_t partition)
{
	for (size_t j = 0; j < l->n_offs; j++)
		if (l->offs[j].partition == partition && strcmp(l->offs[j].topic, topic) == 0)
			return &l->offs[j];
	applied_off_t *no = realloc(l->offs, (l->n_offs + 1) * sizeof *no);
	if (!no)
		return NULL;
	l->offs = no;
	applied_off_t *o = &no[l->n_offs];
	if (!(o->topic = strdup(topic)))
		return NULL;
	o->partition = partition;
	o->next = -1;
	o->committed = -1;
	l->n_offs++;
	return o;
}

static int window_add(window_t *w, const uint32_t *u, const uint32_t *i, const float *r, size_t n)
{
	if (w->cap == 0)
		return 0;
	while (n) {
		size_t at, run;
		if (w->n < w->cap) { /* filling: append, growing the arrays by doubling up to cap */
			run = n < w->cap - w->n ? n : w->cap - w->n;
			if (w->n + run > w->alloc) {
				size_t na = w->alloc ? w->alloc * 2 : 4096;
				while (na < w->n + run)
					na *= 2;
				if (na > w->cap)
					na = w->cap;
				uint32_t *nu = realloc(w->u, na * sizeof *nu);
				if (nu)
					w->u = nu;
				uint32_t *ni = realloc(w->i, na * sizeof *ni);
				if (ni)
					w->i = ni;
				float *nr = realloc(w->r, na * sizeof *nr);
				if (nr)
					w->r = nr;
				if (!nu || !ni || !nr)
					return ENOMEM;
				w->alloc = na;
			}
			at = w->n;
			w->n += run;
		} else { /* full: overwrite the oldest, from pos on */
			at = w->pos;
			run = n < w->cap - at ? n : w->cap - at;
			w->pos = (at + run) % w->cap;
		}
		memcpy(w->u + at, u, run * sizeof *u);
		memcpy(w->i + at, i, run * sizeof *i);
		memcpy(w->r + at, r, run * sizeof *r);
		u += run;
		i += run;
		r += run;
		n -= run;
	}
	return 0;
}

static void window_free(window_t *w)
{
	free(w->u);
	free(w->i);
	free(w->r);
}


static void stats_update(mfs_learner_t *l)
{
	mfs_learner_stats_t s;
	pthread_mutex_lock(&l->st_mu);
	s = l->st;
	pthread_mutex_unlock(&l->st_mu);
	s.events_applied = l->m->events_applied;
	s.events_held_out = l->held_out;
	s.messages = l->messages;
	s.batches = l->batches;
	s.snapshots = l->snapshots;
	memcpy(s.rejected, l->rejected, sizeof s.rejected);
	s.n_users = l->m->n_users;
	s.n_items = l->m->n_items;
	s.cap_users = l->m->cap_users;
	s.cap_items = l->m->cap_items;
	s.lr = l->lrc.lr;
	s.prequential_rmse = l->pq_rmse_last;
	s.holdout_rmse = l->hold_rmse;
	s.window_rmse = l->win_rmse;
	memcpy(s.phase_s, l->ph, sizeof s.phase_s);
	double now = mfs_now_s();
	l->st_next_s = now + 0.5;
	if (now >= l->mem_next_s) { /* device memory: a driver call, so at most twice a second */
		uint64_t used, total;
		l->mem_next_s = now + 0.5;
		if (l->e && mfs_engine_memory(l->e, &used, &total) == 0) {
			s.gpu_mem_used = (double)used;
			s.gpu_mem_total = (double)total;
		} else {
			s.gpu_mem_used = s.gpu_mem_total = 0; /* a host engine (docs/METRICS.md) */
		}
	}
	pthread_mutex_lock(&l->st_mu);
	l->st = s;
	pthread_mutex_unlock(&l->st_mu);
}

static int set_lr(mfs_learner_t *l)
{
	mfs_hparams_t hp;
	mfs_hparams_from(l->c, l->lrc.lr, &hp);
	int rc = mfs_engine_set_hparams(l->e, &hp);
	if (rc)
		mfs_errf(l->err, sizeof l->err, rc, "engine hparams: %s", mfs_strerror(rc));
	return rc;
}

static int work_reserve(mfs_learner_t *l, size_t n)
{
	if (n <= l->wcap)
		return 0;
	size_t nc = l->wcap ? l->wcap : 1024;
	while (nc < n)
		nc *= 2;
	uint32_t **u32[] = {&l->tu_, &l->ti_, &l->hu_, &l->hi_, &l->ru_, &l->ri_};
	for (int j = 0; j < 6; j++) {
		uint32_t *p = realloc(*u32[j], nc * sizeof *p);
		if (!p)
			return ENOMEM;
		*u32[j] = p;
	}
	float **f32[] = {&l->tr_, &l->hr_};
	for (int j = 0; j < 2; j++) {
		float *p = realloc(*f32[j], nc * sizeof *p);
		if (!p)
			return ENOMEM;
		*f32[j] = p;
	}
	l->wcap = nc;
	return 0;
}

/* One side of a batch (0 users, 1 items): its events' rows in event order, new ids added
 * and initialized, and the rows marked touched for the next snapshot. Touches only that
 * side's half of the model and its own arrays, so the two sides can run at once. */
static int side_rows(mfs_learner_t *l, int side, const mfs_ebatch_t *b)
{
	uint32_t *rows = side ? l->ri_ : l->ru_;
	mfs_touched_t *t = side ? &l->ti : &l->tu;
	int rc = mfs_model_rows(l->m, side, side ? &b->ev[0].item : &b->ev[0].user, sizeof *b->ev, b->n, rows);
	for (size_t j = 0; !rc && j < b->n; j++)
		rc = mfs_touched_mark(t, rows[j]);
	return rc;
}

static void *rows_main(void *arg)
{
	mfs_learner_t *l = arg;
	mfs_thread_name("mfs-rows");
	pthread_mutex_lock(&l->rmu);
	for (;;) {
		while (!l->rquit && l->rstate != JOB_POSTED)
			pthread_cond_wait(&l->rcv, &l->rmu);
		if (l->rquit)
			break;
		const mfs_ebatch_t *b = l->rbatch;
		pthread_mutex_unlock(&l->rmu);
		int rc = side_rows(l, 0, b);
		pthread_mutex_lock(&l->rmu);
		l->rrc = rc;
		l->rstate = JOB_DONE;
		pthread_cond_broadcast(&l->rcv);
	}
	pthread_mutex_unlock(&l->rmu);
	return NULL;
}

/* Both sides of a batch: users on the rows thread while the learner does items, when the
 * batch is large enough to pay for the hand-over. @return the first error. */
static int batch_rows(mfs_learner_t *l, const mfs_ebatch_t *b)
{
	if (!l->rstarted || b->n < ROWS_SPLIT_MIN) {
		int rc = side_rows(l, 0, b);
		return rc ? rc : side_rows(l, 1, b);
	}
	pthread_mutex_lock(&l->rmu);
	l->rbatch = b;
	l->rstate = JOB_POSTED;
	pthread_cond_broadcast(&l->rcv);
	pthread_mutex_unlock(&l->rmu);
	int rc = side_rows(l, 1, b);
	pthread_mutex_lock(&l->rmu);
	while (l->rstate != JOB_DONE)
		pthread_cond_wait(&l->rcv, &l->rmu);
	l->rstate = JOB_IDLE;
	int urc = l->rrc;
	pthread_mutex_unlock(&l->rmu);
	return urc ? urc : rc;
}

static int apply(mfs_learner_t *l, mfs_ebatch_t *b)
{
	int rc;
	size_t nt = 0, nh = 0;
	double sum = 0;
	if ((rc = work_reserve(l, b->n)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	/* each side in event order: the same rows as event by event (the two maps are
	 * independent), with the lookups' cache misses overlapped */
	if (b->n && (rc = batch_rows(l, b)))
		return mfs_errf(l->err, sizeof l->err, rc, "model rows: %s", mfs_strerror(rc));
	for (size_t j = 0; j < b->n; j++) {
		const mfs_event_t *ev = &b->ev[j];
		const uint32_t ru = l->ru_[j], ri = l->ri_[j];
		sum += ev->rating;
		if (b->held && b->held[j]) { /* marked by the consumer (serve.holdout_fraction > 0) */
			l->hu_[nh] = ru;
			l->hi_[nh] = ri;
			l->hr_[nh++] = ev->rating;
		} else {
			l->tu_[nt] = ru;
			l->ti_[nt] = ri;
			l->tr_[nt++] = ev->rating;
		}
	}
	ph_mark(l, MFS_LPH_ROWS);
	if (l->m->n_users != l->grown_users || l->m->n_items != l->grown_items) {
		if ((rc = mfs_engine_grow(l->e)))
			return mfs_errf(l->err, sizeof l->err, rc, "engine grow: %s", mfs_strerror(rc));
		l->grown_users = l->m->n_users;
		l->grown_items = l->m->n_items;
		ph_mark(l, MFS_LPH_GROW);
	}
	mfs_batch_t bt = {l->tu_, l->ti_, l->tr_, nt}, bh = {l->hu_, l->hi_, l->hr_, nh};
	if (l->c->serve_prequential) { /* test, then train: every event is scored before it is learned */
		for (int part = 0; part < 2; part++) {
			const mfs_batch_t *pb = part ? &bh : &bt;
			mfs_loss_t ls;
			if (!pb->n)
				continue;
			if ((rc = mfs_engine_loss(l->e, pb, &ls)))
				return mfs_errf(l->err, sizeof l->err, rc, "engine loss: %s", mfs_strerror(rc));
			if (isfinite(ls.sse)) {
				l->pq_sse += ls.sse;
				l->pq_n += ls.n;
			}
		}
		ph_mark(l, MFS_LPH_SCORE);
	}
	l->digest += b->digest;
	if (b->n)
		mfs_model_observe(l->m, sum, b->n);
	if (nt && (rc = mfs_engine_sgd(l->e, &bt)))
		return mfs_errf(l->err, sizeof l->err, rc, "engine sgd: %s", mfs_strerror(rc));
	ph_mark(l, MFS_LPH_SUBMIT);
	if ((rc = window_add(&l->win, bt.u, bt.i, bt.r, nt)) || (rc = window_add(&l->hwin, bh.u, bh.i, bh.r, nh)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	l->held_out += nh;
	for (size_t j = 0; j < b->n_off; j++) {
		applied_off_t *o = off_get(l, b->off[j].topic, b->off[j].partition);
		if (!o)
			return mfs_errf(l->err, sizeof l->err, ENOMEM, "out of memory");
		if (b->off[j].next > o->next)
			o->next = b->off[j].next;
	}
	for (int r = 0; r < MFS_REJ__COUNT; r++)
		l->rejected[r] += b->rejected[r];
	l->messages += b->messages;
	if ((rc = mfs_grow((void **)&l->pend_ts, &l->cap_pend, l->n_pend + b->n_msg, sizeof *l->pend_ts)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	uint64_t ticket, done;
	mfs_engine_progress(l->e, &ticket, &done); /* this batch is applied once done >= ticket */
	if (l->apl_head == l->apl_n)
		l->apl_head = l->apl_n = 0;
	if ((rc = mfs_grow((void **)&l->apl, &l->apl_cap, l->apl_n + b->n_msg, sizeof *l->apl)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	for (size_t j = 0; j < b->n_msg; j++) {
		rd_kafka_timestamp_type_t tt;
		int64_t ts = rd_kafka_message_timestamp(b->msg[j], &tt);
		if (ts > 0) {
			l->pend_ts[l->n_pend++] = ts;
			l->apl[l->apl_n++] = (struct apl){ts, ticket};
		}
	}
	l->batches++;
	if (b->n_off || b->n)
		l->dirty = 1;
	ph_mark(l, MFS_LPH_RECORD);
	if (l->c->test_apply_delay_ms > 0) {
		mfs_sleep_ms(l->c->test_apply_delay_ms);
		ph_mark(l, MFS_LPH_OTHER);
	}
	return 0;
}

/* Messages whose batch the engine has applied since the last poll: their create time ->
 * now goes to the event -> applied histogram. */
static void applied_poll(mfs_learner_t *l)
{
	if (l->apl_head == l->apl_n)
		return;
	uint64_t ticket, done;
	mfs_engine_progress(l->e, &ticket, &done);
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	const double now_ms = (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
	while (l->apl_head < l->apl_n && l->apl[l->apl_head].ticket <= done) {
		double d = now_ms - (double)l->apl[l->apl_head++].ts;
		lat_add(&l->apl_lat, d);
		if (l->cat)
			mfs_histogram_observe(l->cat->event_to_applied, (d < 0 ? 0 : d) / 1000.0);
	}
}

/* Commit to Kafka the offsets a published snapshot stores (lag monitoring only: recovery
 * seeks to the snapshot's own offsets). */
static void commit_offsets(mfs_learner_t *l, const snap_job_t *j, int sync)
{
	if (!l->rk)
		return;
	rd_kafka_topic_partition_list_t *pl = rd_kafka_topic_partition_list_new((int)j->n_offs + 1);
	for (size_t x = 0; x < j->n_offs; x++) {
		applied_off_t *o = off_get(l, j->offs[x].topic, j->offs[x].partition);
		if (o && j->offs[x].next != o->committed) {
			rd_kafka_topic_partition_list_add(pl, j->offs[x].topic, j->offs[x].partition)->offset =
				j->offs[x].next;
			o->committed = j->offs[x].next;
		}
	}
	if (pl->cnt) {
		rd_kafka_resp_err_t ke = rd_kafka_commit(l->rk, pl, !sync);
		if (ke)
			mfs_debug("serve", "msg=\"offset commit failed\" err=\"%s\"", rd_kafka_err2str(ke));
	}
	rd_kafka_topic_partition_list_destroy(pl);
}

/* The writer thread: publishes each posted job in one LMDB txn, off the learner's path. */
static void *writer_main(void *arg)
{
	mfs_learner_t *l = arg;
	mfs_thread_name("mfs-snapwriter");
	pthread_mutex_lock(&l->wmu);
	for (;;) {
		while (l->job_state != JOB_POSTED && !l->wquit)
			pthread_cond_wait(&l->wcv, &l->wmu);
		if (l->job_state != JOB_POSTED)
			break;
		pthread_mutex_unlock(&l->wmu);
		snap_job_t *j = &l->job;
		mfs_snap_info_t info = {
			.learning_rate = j->lr, .last_loss = j->last_loss, .rating_min = l->c->rating_min,
			.rating_max = l->c->rating_max, .offsets = j->offs, .n_offsets = j->n_offs,
			.extra = j->ex, .n_extra = j->nx,
		};
		j->err[0] = '\0';
		if (l->c->test_publish_delay_ms > 0)
			mfs_sleep_ms(l->c->test_publish_delay_ms);
		/* the rows' values: a device engine's copy to the host ends here (mfs_engine_capture) */
		int crc = mfs_engine_capture_wait(l->e);
		j->t0 = mfs_now_s();
		if (crc)
			j->rc = mfs_errf(j->err, sizeof j->err, crc, "engine capture: %s", mfs_strerror(crc));
		else
			j->rc = mfs_snap_publish_stage(l->w, j->stage, &info, &j->seq, j->err, sizeof j->err);
		j->t1 = mfs_now_s();
		j->commit_ms = mfs_wall_ms();
		pthread_mutex_lock(&l->wmu);
		l->job_state = JOB_DONE;
		pthread_cond_broadcast(&l->wcv);
	}
	pthread_mutex_unlock(&l->wmu);
	return NULL;
}

/* Is a snapshot posted to the writer and not yet written? */
static int writer_busy(mfs_learner_t *l)
{
	pthread_mutex_lock(&l->wmu);
	int busy = l->job_state == JOB_POSTED;
	pthread_mutex_unlock(&l->wmu);
	return busy;
}

/* Take back the job the writer thread finished: freshness of what it newly covers, metrics,
 * the offset commit, stats. wait: block until it is done; else only if it already is. */
static int job_finish(mfs_learner_t *l, int wait, int sync_commit)
{
	pthread_mutex_lock(&l->wmu);
	while (wait && l->job_state == JOB_POSTED)
		pthread_cond_wait(&l->wcv, &l->wmu);
	int done = l->job_state == JOB_DONE;
	pthread_mutex_unlock(&l->wmu);
	if (!done)
		return 0;
	snap_job_t *j = &l->job;
	pthread_mutex_lock(&l->wmu);
	l->job_state = JOB_IDLE;
	pthread_mutex_unlock(&l->wmu);
	if (j->rc)
		return mfs_errf(l->err, sizeof l->err, j->rc, "snapshot: %s", *j->err ? j->err : mfs_strerror(j->rc));
	/* visible from its commit on: account the freshness of every message it newly covers */
	for (size_t x = 0; x < j->n_pend; x++) {
		int64_t d = j->commit_ms - j->pend_ts[x];
		lat_add(&l->snap_lat, (double)d);
		if (l->cat)
			mfs_histogram_observe(l->cat->event_to_snapshot, (double)(d < 0 ? 0 : d) / 1000.0);
	}
	if (l->cat)
		mfs_histogram_observe(l->cat->snapshot_duration, j->t1 - j->t0);
	j->n_pend = 0;
	l->snapshots++;
	mfs_debug("serve", "msg=snapshot why=%s seq=%" PRIu64 " users=%zu items=%zu events_applied=%" PRIu64
	          " seconds=%.4f", j->why, j->seq, j->users, j->items, j->events_applied, j->t1 - j->t0);
	commit_offsets(l, j, sync_commit);
	pthread_mutex_lock(&l->st_mu);
	l->st.snap_seq = j->seq;
	l->st.snap_users = j->users;
	l->st.snap_items = j->items;
	l->st.snap_wall_s = (double)j->commit_ms / 1000.0;
	l->st.snap_seconds = j->t1 - j->t0;
	l->st.snap_time_s = j->t1;
	l->st.lat_p50_ms = lat_quantile(&l->snap_lat, 0.50);
	l->st.lat_p99_ms = lat_quantile(&l->snap_lat, 0.99);
	l->st.lat_n = l->snap_lat.n;
	l->st.applied_p50_ms = lat_quantile(&l->apl_lat, 0.50);
	l->st.applied_p99_ms = lat_quantile(&l->apl_lat, 0.99);
	pthread_mutex_unlock(&l->st_mu);
	return 0;
}

/* Take a snapshot at this batch boundary: bring the touched rows back from the engine, stage
 * them with the offsets and counters that describe exactly the batches applied so far, and
 * hand the stage to the writer thread. At most one is in flight: a previous one still being
 * written is waited for first. wait (barriers: revocation, shutdown): return only once this
 * one is committed (and its offsets committed to Kafka synchronously). */
static int snapshot(mfs_learner_t *l, const char *why, int wait)
{
	int rc;
	if ((rc = job_finish(l, 1, 0)))
		return rc;
	if (!l->dirty)
		return 0;
	snap_job_t *j = &l->job;
	static const uint32_t none = 0; /* a non-NULL empty list (NULL would mean every row) */
	mfs_snap_info_t rows = {
		.user_rows = l->tu.n ? l->tu.rows : &none, .n_user_rows = l->tu.n,
		.item_rows = l->ti.n ? l->ti.rows : &none, .n_item_rows = l->ti.n,
	};
	char e[512] = "";
	if (!j->stage && !(j->stage = mfs_snap_stage_new()))
		return mfs_errf(l->err, sizeof l->err, ENOMEM, "out of memory");
	/* the ids here; the values of only the rows this snapshot writes are captured by the engine
	 * as of this batch boundary, and a device engine's copy of them to the host is left to the
	 * writer (mfs_engine_capture_wait there) */
	if ((rc = mfs_snap_stage_fill_ids(j->stage, l->m, &rows, e, sizeof e)))
		return mfs_errf(l->err, sizeof l->err, rc, "snapshot: %s", *e ? e : mfs_strerror(rc));
	if ((rc = mfs_engine_capture(l->e, l->tu.rows, l->tu.n, mfs_snap_stage_values(j->stage, 0, NULL), l->ti.rows,
	                             l->ti.n, mfs_snap_stage_values(j->stage, 1, NULL))))
		return mfs_errf(l->err, sizeof l->err, rc, "engine capture: %s", mfs_strerror(rc));
	if ((rc = mfs_grow((void **)&j->offs, &j->cap_offs, l->n_offs + 1, sizeof *j->offs)))
		return mfs_errf(l->err, sizeof l->err, ENOMEM, "out of memory");
	j->n_offs = 0;
	for (size_t x = 0; x < l->n_offs; x++) /* topic strings live as long as the learner */
		if (l->offs[x].next >= 0)
			j->offs[j->n_offs++] = (mfs_offset_t){l->offs[x].topic, l->offs[x].partition, l->offs[x].next};
	size_t nx = 0;
	j->ex[nx++] = (mfs_snap_extra_t){MFS_META_MU_COUNT, MFS_SNAP_T_U64, l->m->mu_count, 0};
	j->ex[nx++] = (mfs_snap_extra_t){MFS_META_MU_SUM, MFS_SNAP_T_F64, 0, l->m->mu_sum};
	j->ex[nx++] = (mfs_snap_extra_t){MFS_META_HELD_OUT, MFS_SNAP_T_U64, l->held_out, 0};
	j->ex[nx++] = (mfs_snap_extra_t){MFS_META_DIGEST, MFS_SNAP_T_U64, l->digest, 0};
	if (l->pq_n)
		l->pq_rmse_last = sqrt(l->pq_sse / (double)l->pq_n);
	if (l->c->serve_prequential && isfinite(l->pq_rmse_last)) {
		j->ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_RMSE, MFS_SNAP_T_F64, 0, l->pq_rmse_last};
		j->ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_N, MFS_SNAP_T_U64, l->pq_n, 0};
	}
	if (isfinite(l->hold_rmse))
		j->ex[nx++] = (mfs_snap_extra_t){MFS_META_HOLDOUT_RMSE, MFS_SNAP_T_F64, 0, l->hold_rmse};
	if (isfinite(l->win_rmse))
		j->ex[nx++] = (mfs_snap_extra_t){MFS_META_WINDOW_RMSE, MFS_SNAP_T_F64, 0, l->win_rmse};
	for (int r = 0; r < MFS_REJ__COUNT; r++) {
		snprintf(j->names[r], sizeof j->names[r], "%s%s", MFS_META_REJECTED_PREFIX, mfs_reject_name(r));
		j->ex[nx++] = (mfs_snap_extra_t){j->names[r], MFS_SNAP_T_U64, l->rejected[r], 0};
	}
	j->nx = nx;
	j->lr = l->lrc.lr;
	j->last_loss = l->last_loss;
	j->users = l->tu.n;
	j->items = l->ti.n;
	j->events_applied = l->m->events_applied;
	j->why = why;
	/* the messages applied since the last snapshot go with this one (swap the buffers) */
	int64_t *pt = j->pend_ts;
	size_t pc = j->cap_pend;
	j->pend_ts = l->pend_ts;
	j->cap_pend = l->cap_pend;
	j->n_pend = l->n_pend;
	l->pend_ts = pt;
	l->cap_pend = pc;
	l->n_pend = 0;
	mfs_touched_clear(&l->tu);
	mfs_touched_clear(&l->ti);
	l->dirty = 0;
	l->pq_sse = 0;
	l->pq_n = 0;
	pthread_mutex_lock(&l->wmu);
	l->job_state = JOB_POSTED;
	pthread_cond_broadcast(&l->wcv);
	pthread_mutex_unlock(&l->wmu);
	return wait ? job_finish(l, 1, 1) : 0;
}

/* The periodic full pass: loss over the retained windows; the holdout's (else the training
 * window's) RMSE goes to the learning-rate controller, whose rate the engine uses from the
 * next batch on. */
static int full_pass(mfs_learner_t *l)
{
	int rc;
	mfs_loss_t lw, lh;
	l->win_rmse = l->hold_rmse = NAN;
	if (l->win.n) {
		mfs_batch_t b = {l->win.u, l->win.i, l->win.r, l->win.n};
		if ((rc = mfs_engine_loss(l->e, &b, &lw)))
			return mfs_errf(l->err, sizeof l->err, rc, "engine loss: %s", mfs_strerror(rc));
		l->win_rmse = lw.rmse;
	}
	if (l->hwin.n) {
		mfs_batch_t b = {l->hwin.u, l->hwin.i, l->hwin.r, l->hwin.n};
		if ((rc = mfs_engine_loss(l->e, &b, &lh)))
			return mfs_errf(l->err, sizeof l->err, rc, "engine loss: %s", mfs_strerror(rc));
		l->hold_rmse = lh.rmse;
	}
	double loss = l->hwin.n ? l->hold_rmse : l->win_rmse;
	if (!l->win.n && !l->hwin.n)
		return 0;
	double before = l->lrc.lr;
	mfs_lr_update(&l->lrc, loss);
	if (l->lrc.lr < l->lr_floor)
		l->lrc.lr = l->lr_floor;
	l->last_loss = loss;
	mfs_debug("serve", "msg=\"full pass\" window=%zu window_rmse=%.5f holdout=%zu holdout_rmse=%.5f lr=%.6g lr_before=%.6g",
	          l->win.n, l->win_rmse, l->hwin.n, l->hold_rmse, l->lrc.lr, before);
	return l->lrc.lr != before ? set_lr(l) : 0;
}

static void log_progress(mfs_learner_t *l, double *last_t, uint64_t *last_ev)
{
	double now = mfs_now_s();
	uint64_t ev = l->m->events_applied + l->held_out;
	/* the learner thread's time since the last line, as shares of it: busy = all but wait */
	char ph[256];
	double d[MFS_LPH__COUNT], busy = 0, dt = now - *last_t > 0 ? now - *last_t : 1;
	for (int p = 0; p < MFS_LPH__COUNT; p++) {
		d[p] = l->ph[p] - l->log_ph[p];
		busy += p == MFS_LPH_WAIT ? 0 : d[p];
		l->log_ph[p] = l->ph[p];
	}
	ph_format(ph, sizeof ph, d, dt, 0, "");
	mfs_info("serve", "msg=progress events_applied=%" PRIu64 " held_out=%" PRIu64 " events_per_s=%.0f users=%u items=%u"
	         " snapshots=%" PRIu64 " prequential_rmse=%.4f holdout_rmse=%.4f window_rmse=%.4f lr=%.5g ring_fill=%zu"
	         " latency_p50_ms=%.1f latency_p99_ms=%.1f learner_busy=%.3f%s",
	         l->m->events_applied, l->held_out, (double)(ev - *last_ev) / (now - *last_t), l->m->n_users,
	         l->m->n_items, l->snapshots, l->pq_rmse_last, l->hold_rmse, l->win_rmse, l->lrc.lr,
	         mfs_bring_fill(l->ring), lat_quantile(&l->snap_lat, 0.5), lat_quantile(&l->snap_lat, 0.99), busy / dt, ph);
	*last_t = now;
	*last_ev = ev;
}

static int run(mfs_learner_t *l)
{
	int rc = 0;
	const double snap_period = (double)l->c->serve_snapshot_ms / 1000.0;
	const double pass_period = (double)l->c->serve_fullpass_ms / 1000.0;
	double now = mfs_now_s(), next_snap = now + snap_period, next_pass = now + pass_period, next_log = now + 10;
	double last_log_t = now;
	uint64_t last_log_ev = l->m->events_applied + l->held_out;
	int deferred = 0; /* the due timer snapshot waits for the writer */
	for (;;) {
		double wake = next_snap < next_pass ? next_snap : next_pass;
		int tmo = (int)((wake - mfs_now_s()) * 1000.0) + 1;
		if (l->apl_head < l->apl_n && tmo > 1) /* batches in flight on the engine: look again soon */
			tmo = 1;
		mfs_ebatch_t *b = NULL;
		ph_mark(l, MFS_LPH_OTHER);
		int prc = mfs_bring_pop(l->ring, tmo < 1 ? 1 : tmo, &b);
		ph_mark(l, MFS_LPH_WAIT);
		if (prc == EPIPE)
			break;
		if (b) {
			int barrier = b->barrier;
			uint64_t gen = b->barrier_gen;
			rc = apply(l, b);
			mfs_bring_release(l->ring, b);
			if (rc)
				return rc;
			if (barrier) {
				rc = snapshot(l, barrier == MFS_EBATCH_FINAL ? "shutdown" : "revoke", 1);
				ph_mark(l, MFS_LPH_SNAPSHOT);
				stats_update(l);
				mfs_bring_barrier_done(l->ring, gen);
				if (rc)
					return rc;
				if (barrier == MFS_EBATCH_FINAL)
					return 0;
				next_snap = mfs_now_s() + snap_period;
				deferred = 0;
			}
		}
		now = mfs_now_s();
		if (now >= next_pass) {
			if (l->c->serve_window > 0 && (rc = full_pass(l)))
				return rc;
			ph_mark(l, MFS_LPH_FULL_PASS);
			next_pass = now + pass_period;
		}
		const uint64_t snaps = l->snapshots;
		if ((rc = job_finish(l, 0, 0)))
			return rc;
		if (now >= next_snap) {
			if (writer_busy(l)) {
				/* the last one is still being written (many rows, a slow disk): keep learning
				 * and take this one the moment the writer is free, with every row touched
				 * meanwhile, rather than wait for it; the loop looks again within 1 ms */
				if (!deferred) {
					deferred = 1;
					l->snap_deferred++;
				}
			} else {
				if ((rc = snapshot(l, "timer", 0)))
					return rc;
				next_snap = now + snap_period;
				deferred = 0;
			}
		}
		ph_mark(l, MFS_LPH_SNAPSHOT);
		applied_poll(l);
		/* a snapshot written after the last batch shows too; idle time twice a second */
		if (b || l->snapshots != snaps || now >= l->st_next_s)
			stats_update(l);
		if (now >= next_log) {
			log_progress(l, &last_log_t, &last_log_ev);
			next_log = now + 10;
		}
	}
	/* the consumer closed the ring without a final barrier: publish what was applied */
	return snapshot(l, "shutdown", 1);
}

/* Tell a helper thread (writer, rows) to quit once idle and join it. */
static void helper_stop(pthread_t t, pthread_mutex_t *mu, pthread_cond_t *cv, int *quit)
{
	pthread_mutex_lock(mu);
	*quit = 1;
	pthread_cond_broadcast(cv);
	pthread_mutex_unlock(mu);
	pthread_join(t, NULL);
}

static void *thread_main(void *arg)
{
	mfs_learner_t *l = arg;
	mfs_thread_name("mfs-learner");
	mfs_engine_conf_t ec;
	char e[1024] = "";
	mfs_engine_conf_from(l->c, &ec);
	int rc = mfs_engine_open(&ec, l->m, &l->e, e, sizeof e);
	if (rc == 0) {
		snprintf(l->engine_name, sizeof l->engine_name, "%s", mfs_engine_name(l->e));
		l->grown_users = l->m->n_users;
		l->grown_items = l->m->n_items;
		rc = set_lr(l);
	} else {
		mfs_errf(l->err, sizeof l->err, rc, "%s", e);
	}
	pthread_mutex_lock(&l->mu);
	l->open_done = 1;
	l->open_rc = rc;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	if (rc)
		return NULL;
	stats_update(l);
	/* without the rows thread every batch resolves its rows on this one (batch_rows) */
	l->rstarted = pthread_create(&l->rthread, NULL, rows_main, l) == 0;
	if ((rc = pthread_create(&l->wthread, NULL, writer_main, l))) {
		mfs_errf(l->err, sizeof l->err, rc, "snapshot writer thread: %s", strerror(rc));
	} else {
		l->ph_t = mfs_now_s();
		rc = run(l);
		int frc = job_finish(l, 1, 1); /* an error exit may leave one in flight */
		if (!rc)
			rc = frc;
		helper_stop(l->wthread, &l->wmu, &l->wcv, &l->wquit);
	}
	if (l->rstarted) {
		helper_stop(l->rthread, &l->rmu, &l->rcv, &l->rquit);
		l->rstarted = 0;
	}
	if (rc) {
		mfs_error("serve", "msg=\"learner stopped\" err=\"%s\"", l->err);
		mfs_bring_fail(l->ring); /* the consumer sees EPIPE and stops */
	}
	stats_update(l);
	char ph[320];
	ph_format(ph, sizeof ph, l->ph, 1, 1, "_s");
	mfs_info("serve", "msg=\"learner done\" events_applied=%" PRIu64 " held_out=%" PRIu64 " messages=%" PRIu64
	         " snapshots=%" PRIu64 " snapshots_deferred=%" PRIu64 " latency_p50_ms=%.1f latency_p99_ms=%.1f"
	         " latency_n=%" PRIu64 " applied_p50_ms=%.1f applied_p99_ms=%.1f%s",
	         l->m->events_applied, l->held_out, l->messages, l->snapshots, l->snap_deferred,
	         lat_quantile(&l->snap_lat, 0.5), lat_quantile(&l->snap_lat, 0.99), l->snap_lat.n,
	         lat_quantile(&l->apl_lat, 0.5), lat_quantile(&l->apl_lat, 0.99), ph);
	l->thread_rc = rc;
	return NULL;
}

int mfs_learner_open(const mfs_conf_t *c, mfs_bring_t *ring, mfs_learner_t **out, char *errstr, size_t es)
{
	*out = NULL;
	mfs_learner_t *l = calloc(1, sizeof *l);
	if (!l)
		return mfs_errf(errstr, es, ENOMEM, "out of memory");
	l->c = c;
	l->ring = ring;
	l->pq_rmse_last = l->win_rmse = l->hold_rmse = l->last_loss = NAN;
	l->win.cap = (size_t)c->serve_window;
	l->hwin.cap = c->serve_holdout_fraction > 0 ? (size_t)c->serve_holdout_window : 0;
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->st_mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	pthread_mutex_init(&l->wmu, NULL);
	pthread_cond_init(&l->wcv, NULL);
	pthread_mutex_init(&l->rmu, NULL);
	pthread_cond_init(&l->rcv, NULL);
	int rc;
	if (lat_init(&l->snap_lat, LAT_BUCKETS, 1.0) || lat_init(&l->apl_lat, APL_BUCKETS, 0.1)) {
		rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
		goto fail;
	}
	if (!*c->snapshot_dir) {
		rc = mfs_errf(errstr, es, MFS_ECONFIG, "snapshot.dir (--snapshot DIR) is required");
		goto fail;
	}
	mfs_model_conf_t mc;
	mfs_model_conf_from(c, &mc);
	if ((rc = mfs_model_init(&mc, &l->m))) {
		mfs_errf(errstr, es, rc, "model: %s", mfs_strerror(rc));
		goto fail;
	}
	double t0 = mfs_now_s();
	rc = mfs_snap_load(c->snapshot_dir, l->m, &l->loaded, errstr, es);
	if (rc == MFS_ENOTFOUND) {
		memset(&l->loaded, 0, sizeof l->loaded);
		l->loaded.learning_rate = NAN;
		mfs_info("serve", "msg=\"no snapshot: starting from an empty model\" dir=%s", c->snapshot_dir);
	} else if (rc) {
		goto fail;
	} else {
		for (size_t j = 0; j < l->loaded.n_offsets; j++) {
			applied_off_t *o = off_get(l, l->loaded.offsets[j].topic, l->loaded.offsets[j].partition);
			if (!o) {
				rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
				goto fail;
			}
			o->next = o->committed = l->loaded.offsets[j].next;
		}
		char key[64];
		const mfs_snap_extra_t *x;
		for (int r = 0; r < MFS_REJ__COUNT; r++) {
			snprintf(key, sizeof key, "%s%s", MFS_META_REJECTED_PREFIX, mfs_reject_name(r));
			if ((x = mfs_snap_loaded_extra(&l->loaded, key)))
				l->rejected[r] = x->u64;
		}
		if ((x = mfs_snap_loaded_extra(&l->loaded, MFS_META_HELD_OUT)))
			l->held_out = x->u64;
		if ((x = mfs_snap_loaded_extra(&l->loaded, MFS_META_DIGEST)))
			l->digest = x->u64;
		mfs_info("serve", "msg=\"snapshot loaded\" dir=%s seq=%" PRIu64 " users=%u items=%u events_applied=%" PRIu64
		         " offsets=%zu seconds=%.3f", c->snapshot_dir, l->loaded.seq, l->m->n_users, l->m->n_items,
		         l->m->events_applied, l->loaded.n_offsets, mfs_now_s() - t0);
	}
	/* the learning-rate controller resumes from the snapshot's rate */
	mfs_lr_conf_t lc;
	mfs_lr_conf_from(c, c->serve_lr_schedule, &lc);
	mfs_lr_init(&l->lrc, &lc);
	l->lr_floor = c->serve_lr_floor * c->sgd_lr;
	if (isfinite(l->loaded.learning_rate) && l->loaded.learning_rate > 0 && c->serve_lr_schedule != MFS_LR_FIXED)
		l->lrc.lr = l->loaded.learning_rate;
	if ((rc = mfs_snap_writer_open_sync(c->snapshot_dir, (size_t)c->snapshot_map_size,
	                                    (mfs_snap_sync_t)c->snapshot_sync, &l->w, errstr, es)))
		goto fail;
	stats_update(l);
	*out = l;
	return 0;
fail:
	mfs_learner_close(l);
	return rc;
}

void mfs_learner_set_metrics(mfs_learner_t *l, mfs_catalog_t *cat)
{
	l->cat = cat;
}

const mfs_snap_loaded_t *mfs_learner_loaded(const mfs_learner_t *l)
{
	return &l->loaded;
}

const char *mfs_learner_engine_name(const mfs_learner_t *l)
{
	return l->engine_name;
}

int mfs_learner_start(mfs_learner_t *l, rd_kafka_t *rk, char *errstr, size_t es)
{
	l->rk = rk;
	int rc = pthread_create(&l->thread, NULL, thread_main, l);
	if (rc)
		return mfs_errf(errstr, es, rc, "learner thread: %s", strerror(rc));
	l->started = 1;
	pthread_mutex_lock(&l->mu);
	while (!l->open_done)
		pthread_cond_wait(&l->cv, &l->mu);
	rc = l->open_rc;
	pthread_mutex_unlock(&l->mu);
	if (rc) {
		pthread_join(l->thread, NULL);
		l->started = 0;
		return mfs_errf(errstr, es, rc, "%s", l->err);
	}
	return 0;
}

int mfs_learner_join(mfs_learner_t *l, char *errstr, size_t es)
{
	if (!l->started)
		return 0;
	pthread_join(l->thread, NULL);
	l->started = 0;
	if (l->thread_rc)
		return mfs_errf(errstr, es, l->thread_rc, "%s", l->err);
	return 0;
}

void mfs_learner_get_stats(mfs_learner_t *l, mfs_learner_stats_t *out)
{
	pthread_mutex_lock(&l->st_mu);
	*out = l->st;
	pthread_mutex_unlock(&l->st_mu);
}

void mfs_learner_close(mfs_learner_t *l)
{
	if (!l)
		return;
	if (l->started) {
		mfs_bring_close(l->ring);
		pthread_join(l->thread, NULL);
	}
	mfs_snap_writer_close(l->w);
	mfs_engine_close(l->e);
	mfs_model_free(l->m);
	mfs_snap_loaded_free(&l->loaded);
	mfs_touched_free(&l->tu);
	mfs_touched_free(&l->ti);
	for (size_t j = 0; j < l->n_offs; j++)
		free(l->offs[j].topic);
	free(l->offs);
	free(l->tu_);
	free(l->ru_);
	free(l->ri_);
	free(l->ti_);
	free(l->hu_);
	free(l->hi_);
	free(l->tr_);
	free(l->hr_);
	window_free(&l->win);
	window_free(&l->hwin);
	free(l->pend_ts);
	free(l->snap_lat.b);
	free(l->apl_lat.b);
	free(l->apl);
	mfs_snap_stage_free(l->job.stage);
	free(l->job.offs);
	free(l->job.pend_ts);
	pthread_mutex_destroy(&l->mu);
	pthread_mutex_destroy(&l->st_mu);
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->wmu);
	pthread_cond_destroy(&l->wcv);
	pthread_mutex_destroy(&l->rmu);
	pthread_cond_destroy(&l->rcv);
	free(l);
}
