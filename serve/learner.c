/* learner.c - see learner.h.
 *
 * DESIGN: one thread owns model, engine and publisher from mfs_learner_start() to the end of
 * the thread (the engine is opened on it, so a CUDA context is current where it is used).
 * The consumer thread only talks to it through the queue. Order of work per batch:
 *   rows for every event (new ids get initialized rows) -> score the batch with the current
 *   model (prequential: test, then train) -> fold its ratings into the running mean -> SGD on
 *   the training part -> append to the retained windows -> advance the applied offsets and the
 *   counters that travel with the batch (rejections, digest, held out).
 * A large batch's rows are resolved on two threads (serve/rows.h), with the same rows as on
 * one.
 * A snapshot therefore always sits between two batches, and the offsets it stores name exactly
 * the messages whose events the published rows contain (docs/STREAMING.md, "Exactly once").
 * The snapshot is staged there (touched rows' ids, the engine's capture of their values,
 * offsets and counters) and written to LMDB by the publisher's thread (serve/publisher.h)
 * while the learner goes on; one is in flight at a time (a timer snapshot that falls due
 * meanwhile is taken when the publisher is free, so a slow disk makes snapshots larger and
 * rarer, never training slower), barriers (revocation, shutdown) wait for their commit, and
 * offsets are committed to the broker only after the commit of the snapshot that stores them.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "serve/learner.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/timeutil.h"
#include "gpu/engine.h"
#include "gpu/lr.h"
#include "model_store/life.h"
#include "serve/exchange.h"
#include "serve/latency.h"
#include "serve/meta.h"
#include "serve/prequential.h"
#include "serve/publisher.h"
#include "serve/replay.h"
#include "serve/rows.h"
#include "serve/stage_conf.h"
#include "serve/window.h"

#define LAT_BUCKETS 10001 /* 1 ms buckets up to 10 s, then geometric ones (latency.h) */
#define APL_BUCKETS 100001 /* 0.1 ms buckets up to 10 s, then geometric ones (latency.h) */
/* While fewer events are behind the mean than a batch holds, a batch is scored in pieces no
 * larger than that count (and no smaller than this): each piece sees the mean of the events
 * before it. */
#define PQ_MIN_PIECE 64

struct mfs_learner {
	const mfs_conf_t *c;
	mfs_batchq_t *queue;
	mfs_commit_fn commit;
	void *commit_ctx;
	mfs_model_t *m;
	mfs_engine_t *e;
	double mem_next_s; /* next device-memory sample (stats_update) */
	mfs_publisher_t *pub;
	mfs_snap_loaded_t loaded;
	pthread_t thread;
	int started, thread_rc;
	char err[1024];
	/* start handshake */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int open_done, open_rc;
	char engine_name[32];
	/* a batch's rows (and the rows touched since the last snapshot), then its training and
	 * held-out parts */
	mfs_rows_t rows;
	int rows_ok;
	/* the items each user rated since the last snapshot (snapshot.seen_items; NULL: off): the
	 * snapshot merges them into the users' stored lists, in its own txn. A snapshot takes the
	 * tracker whole (its writer makes the lists and clears it) and the learner goes on with the
	 * spare, the tracker the last snapshot took */
	mfs_snap_rated_t *rated, *rated_spare;
	uint32_t *tu_, *ti_, *hu_, *hi_;
	float *tr_, *hr_;
	size_t wcap[6];
	uint32_t grown_users, grown_items;
	mfs_parts_t offs; /* next: applied so far; committed: last sent through commit */
	mfs_serve_meta_t meta; /* the counters a snapshot stores (held_out, digest, rejected, ...) */
	uint64_t messages, batches, snapshots;
	uint64_t snap_deferred; /* timer snapshots put off while the publisher was busy */
	int dirty;      /* rows or offsets changed since the last snapshot */
	int meta_dirty; /* a full pass changed the learning rate or the accuracy figures since then */
	/* accuracy */
	mfs_preq_t pq;       /* prequential scores: interval, window, cumulative */
	double pq_rmse_last; /* the interval's, as of the last snapshot */
	int mu_known;        /* the model's mu means something before any event (a loaded snapshot's) */
	mfs_window_t win, hwin;
	mfs_replay_t rp; /* serve.replay: spare capacity spent on win */
	uint32_t clock0; /* the model's event-time clock and events applied when replay first looked */
	uint64_t events0;
	double win_rmse, hold_rmse, last_loss;
	mfs_lr_t lrc;
	double lr_floor;
	/* freshness: create time of the messages applied since the last snapshot */
	int64_t *pend_ts;
	size_t n_pend, cap_pend;
	mfs_hist_t snap_lat; /* message create time -> snapshot commit */
	mfs_hist_t apl_lat;  /* message create time -> applied by the engine */
	mfs_pending_t apl;   /* create times waiting for their batch's ticket (mfs_engine_progress) */
	/* with the id lifecycle's stamps: per batch stamp with updates given, the ticket of its last
	 * one (a batch, then replay chunks), oldest first: what the engine holds (life.h) */
	struct stamp_ticket {
		uint32_t stamp;
		uint64_t ticket;
	} *st_q;
	size_t st_head, st_n, st_cap;
	/* stats for other threads */
	pthread_mutex_t st_mu;
	mfs_learner_stats_t st;
	mfs_catalog_t *cat; /* metrics (NULL: none) */
	/* where this thread's time goes: seconds per phase, and when the phase now running began */
	double ph[MFS_LPH__COUNT], ph_t;
	/* when the last phase ended (ms on mfs_now_s's clock; 0: not running) and which it was: read
	 * by the service loop, which says when the learner has ended none for a long time */
	_Atomic int64_t beat_ms;
	_Atomic int beat_phase;
	double seen_s; /* the seen-items tracker: starting it, and waiting for it (rated_join) */
	int rated_pending; /* the tracker's adds of the last batch may still run on the pool */
	double st_next_s; /* next stats_update while idle */
	double log_ph[MFS_LPH__COUNT]; /* ph at the last progress log */
	uint64_t resets, resets_drained; /* batches whose reused rows the engine reset; of them, after a drain */
	/* exchange.topic: item rows shared with the other services (serve/exchange.h); opened on
	 * this thread after the engine */
	char *xch_brokers;
	mfs_exchange_t *xch;
	double xch_next_s; /* idle: merge arrivals this often */
};

static const char *const phase_names[MFS_LPH__COUNT] = {"wait",   "rows",   "grow",      "score",    "submit",
                                                       "record", "replay", "full_pass", "snapshot", "other"};

const char *mfs_learner_phase_name(int phase)
{
	return phase >= 0 && phase < MFS_LPH__COUNT ? phase_names[phase] : NULL;
}

static const char *const rows_step_names[MFS_LRS__COUNT] = {"lookup", "new_ids", "finish", "seen_items"};

const char *mfs_learner_rows_step_name(int step)
{
	return step >= 0 && step < MFS_LRS__COUNT ? rows_step_names[step] : NULL;
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
	atomic_store_explicit(&l->beat_ms, (int64_t)(t * 1000.0), memory_order_relaxed);
	atomic_store_explicit(&l->beat_phase, p, memory_order_relaxed);
}

static void stats_update(mfs_learner_t *l)
{
	mfs_learner_stats_t s;
	pthread_mutex_lock(&l->st_mu);
	s = l->st;
	pthread_mutex_unlock(&l->st_mu);
	s.events_applied = l->m->events_applied;
	s.events_held_out = l->meta.held_out;
	s.messages = l->messages;
	s.batches = l->batches;
	s.snapshots = l->snapshots;
	s.events_replayed = l->meta.replayed;
	s.events_dropped = l->meta.dropped;
	s.not_admitted[0] = mfs_model_refused(l->m, 0);
	s.not_admitted[1] = mfs_model_refused(l->m, 1);
	for (int e = 0; e < 2; e++) {
		s.evicted[e] = mfs_model_freed(l->m, e, MFS_FREED_EVICTED);
		s.expired[e] = mfs_model_freed(l->m, e, MFS_FREED_EXPIRED);
		s.deleted[e] = mfs_model_freed(l->m, e, MFS_FREED_DELETED);
	}
	s.live_users = mfs_model_live(l->m, 0);
	s.live_items = mfs_model_live(l->m, 1);
	s.replay_owed = l->rp.debt;
	memcpy(s.rejected, l->meta.rejected, sizeof s.rejected);
	s.n_users = l->m->n_users;
	s.n_items = l->m->n_items;
	s.cap_users = l->m->cap_users;
	s.cap_items = l->m->cap_items;
	s.lr = l->lrc.lr;
	s.prequential_rmse = l->pq_rmse_last;
	s.prequential_window_rmse = mfs_preq_window_rmse(&l->pq, NULL);
	s.prequential_cumulative_rmse = mfs_preq_cumulative_rmse(&l->pq, NULL);
	s.holdout_rmse = l->hold_rmse;
	s.window_rmse = l->win_rmse;
	memcpy(s.phase_s, l->ph, sizeof s.phase_s);
	for (int x = 0; x < 3; x++)
		s.rows_step_s[MFS_LRS_LOOKUP + x] = l->rows.step_s[x];
	s.rows_step_s[MFS_LRS_SEEN_ITEMS] = l->seen_s;
	s.rows_ahead_batches = l->rows.ahead_used;
	if (l->xch) {
		mfs_exchange_stats_t xs;
		mfs_exchange_get_stats(l->xch, &xs);
		s.xch_published_rows = xs.published_rows;
		s.xch_merged_rows = xs.merged_rows;
		s.xch_items_added = xs.items_added;
		s.xch_bad_messages = xs.bad_messages;
		s.xch_produce_errors = xs.produce_errors;
	}
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
	void **arr[] = {(void **)&l->tu_, (void **)&l->ti_, (void **)&l->hu_, (void **)&l->hi_,
	                (void **)&l->tr_, (void **)&l->hr_};
	const size_t elem[] = {sizeof *l->tu_, sizeof *l->ti_, sizeof *l->hu_, sizeof *l->hi_,
	                       sizeof *l->tr_, sizeof *l->hr_};
	for (int j = 0; j < 6; j++)
		if (mfs_grow(arr[j], &l->wcap[j], n, elem[j]))
			return ENOMEM;
	return 0;
}

/* Test-then-train scores of a batch, in event order, folding its ratings into the running mean
 * as it goes (PQ_MIN_PIECE): each piece of events is scored with the model as it stands and
 * the mean of every event before it, never with a mean of nothing: before the first event the
 * mean is the loaded model's, or the middle of the rating range. bt / bh are the batch's
 * training and held-out events in event order; nd and sum, the batch's dropped events and the
 * sum of the others' ratings in event order (apply counted them: a batch scored in one piece,
 * the usual case once the mean has seen a batch's worth, is not read again). @return 0 or the
 * engine's error. */
static int score(mfs_learner_t *l, const mfs_ebatch_t *b, const mfs_batch_t *bt, const mfs_batch_t *bh, size_t nd,
                 double sum)
{
	size_t a = 0, at_t = 0, at_h = 0;
	while (a < b->n) {
		size_t len = b->n - a;
		const uint64_t seen = l->m->mu_count;
		if (seen < len)
			len = seen > PQ_MIN_PIECE ? (size_t)seen : PQ_MIN_PIECE;
		if (len > b->n - a)
			len = b->n - a;
		if (seen == 0 && !l->mu_known)
			l->m->mu = 0.5 * (l->c->rating_min + l->c->rating_max);
		size_t ct = 0, ch = 0, cd = 0;
		double psum = 0;
		if (a == 0 && len == b->n) { /* the whole batch: apply's counts (the same sum, same order) */
			ct = bt->n;
			ch = bh->n;
			cd = nd;
			psum = sum;
		} else {
			for (size_t j = a; j < a + len; j++) {
				if (l->rows.u[j] == MFS_ROW_NONE || l->rows.i[j] == MFS_ROW_NONE) { /* dropped (apply) */
					cd++;
					continue;
				}
				if (b->held && b->held[j])
					ch++;
				else
					ct++;
				psum += l->rows.r[j];
			}
		}
		for (int part = 0; part < 2; part++) {
			const mfs_batch_t *pb = part ? bh : bt;
			const size_t at = part ? at_h : at_t, cnt = part ? ch : ct;
			mfs_batch_t piece = {pb->u + at, pb->i + at, pb->r + at, cnt};
			mfs_loss_t ls;
			if (!cnt)
				continue;
			int rc = mfs_engine_loss(l->e, &piece, &ls);
			if (rc)
				return mfs_errf(l->err, sizeof l->err, rc, "engine loss: %s", mfs_strerror(rc));
			if (isfinite(ls.sse) && (rc = mfs_preq_add(&l->pq, ls.sse, ls.n)))
				return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
		}
		if (len > cd)
			mfs_model_observe(l->m, psum, len - cd);
		a += len;
		at_t += ct;
		at_h += ch;
	}
	return 0;
}

/* The batch's event time, seconds: its latest event time (t), else its latest message time;
 * 0 when it has neither (the model's clock stays). */
static uint32_t batch_clock(const mfs_ebatch_t *b)
{
	int64_t t = 0;
	for (size_t j = 0; j < b->n; j++)
		if (b->ev[j].has_ts && b->ev[j].ts_ms > t)
			t = b->ev[j].ts_ms;
	for (size_t j = 0; !t && j < b->n_ts; j++)
		if (b->ts[j] > t)
			t = b->ts[j];
	t /= 1000;
	return t > 0 ? (t > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)t) : 0;
}

/* Updates naming rows stamped with the current batch were just given to the engine: its
 * ticket for them is the latest. */
static int stamps_given(mfs_learner_t *l)
{
	if (!l->m->track)
		return 0;
	uint64_t ticket, done;
	mfs_engine_progress(l->e, &ticket, &done);
	if (l->st_n && l->st_q[(l->st_head + l->st_n - 1) % l->st_cap].stamp == l->m->batch_stamp) {
		l->st_q[(l->st_head + l->st_n - 1) % l->st_cap].ticket = ticket;
		return 0;
	}
	if (l->st_n == l->st_cap) { /* full: unroll into a larger one */
		size_t nc = l->st_cap ? 2 * l->st_cap : 64;
		struct stamp_ticket *q = malloc(nc * sizeof *q);
		if (!q)
			return ENOMEM;
		for (size_t x = 0; x < l->st_n; x++)
			q[x] = l->st_q[(l->st_head + x) % l->st_cap];
		free(l->st_q);
		l->st_q = q, l->st_cap = nc, l->st_head = 0;
	}
	l->st_q[(l->st_head + l->st_n++) % l->st_cap] = (struct stamp_ticket){l->m->batch_stamp, ticket};
	return 0;
}

/* At a batch's start: tell the model which batches the engine has applied (every one before
 * the oldest with updates outstanding), so eviction takes rows the engine holds no update of
 * and the engine need not drain its ring to reset them (a synchronous engine: all). */
static void stamps_applied(mfs_learner_t *l)
{
	if (!l->m->track || !l->st_n)
		return;
	uint64_t ticket, done;
	mfs_engine_progress(l->e, &ticket, &done);
	while (l->st_n && l->st_q[l->st_head].ticket <= done)
		l->st_head = (l->st_head + 1) % l->st_cap, l->st_n--;
	if (l->st_n)
		mfs_model_applied_through(l->m, l->st_q[l->st_head].stamp - 1);
}

/* Rows the model gave to new ids this batch (evicted, expired or deleted before): the engine
 * takes their fresh values before any batch names them, once every batch it holds that may
 * name one is applied. */
static int reset_reused(mfs_learner_t *l)
{
	for (int ent = 0; ent < 2; ent++) {
		size_t n;
		const uint32_t *rows = mfs_model_reused(l->m, ent, &n);
		if (!n)
			continue;
		const int in_flight = mfs_model_reused_in_flight(l->m, ent);
		int rc = mfs_engine_reset_rows(l->e, ent, rows, n, in_flight);
		l->resets++;
		l->resets_drained += in_flight != 0;
		if (rc)
			return mfs_errf(l->err, sizeof l->err, rc, "engine reset rows: %s", mfs_strerror(rc));
	}
	mfs_model_reused_clear(l->m);
	return 0;
}

/* Wait for the seen-items tracker's adds of the last batch (begun in apply on the rows pool's
 * workers): before the pool, the rows or the tracker are used again. */
static int rated_join(mfs_learner_t *l)
{
	if (!l->rated_pending)
		return 0;
	const double t0 = mfs_now_s();
	l->rated_pending = 0;
	int rc = mfs_snap_rated_add_finish(l->rated, l->rows.par);
	l->seen_s += mfs_now_s() - t0;
	return rc ? mfs_errf(l->err, sizeof l->err, rc, "out of memory") : 0;
}

static int apply(mfs_learner_t *l, mfs_ebatch_t *b)
{
	int rc;
	size_t nt = 0, nh = 0;
	double sum = 0;
	if ((rc = rated_join(l)))
		return rc;
	if ((rc = work_reserve(l, b->n)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	/* the id lifecycle's clock and batch stamp (model_store/life.h) */
	mfs_model_begin_batch(l->m, l->m->track || l->c->serve_replay_half_life_s > 0 ? batch_clock(b) : 0);
	stamps_applied(l);
	/* each side in event order: the same rows as event by event (the two maps are
	 * independent), with the lookups' cache misses overlapped */
	if ((rc = mfs_rows_resolve(&l->rows, b)))
		return mfs_errf(l->err, sizeof l->err, rc, "model rows: %s", mfs_strerror(rc));
	size_t nd = 0;
	for (size_t j = 0; j < b->n; j++) {
		const uint32_t ru = l->rows.u[j], ri = l->rows.i[j];
		if (ru == MFS_ROW_NONE || ri == MFS_ROW_NONE) { /* a new id, its table full (model.max_*) */
			nd++;
			continue;
		}
		const float rating = l->rows.r[j]; /* (dense: rows.h) */
		sum += rating;
		if (b->held && b->held[j]) { /* marked by the consumer (serve.holdout_fraction > 0) */
			l->hu_[nh] = ru;
			l->hi_[nh] = ri;
			l->hr_[nh++] = rating;
		} else {
			l->tu_[nt] = ru;
			l->ti_[nt] = ri;
			l->tr_[nt++] = rating;
		}
	}
	/* trained or held out, the user rated the item: top-K leaves it out (each user's ratings in
	 * order; the tracker's shards on the rows pool) */
	if (l->rated) { /* on the pool's workers while this thread scores and submits (rated_join) */
		const double t0 = mfs_now_s();
		mfs_snap_rated_add_start(l->rated, l->m, l->rows.u, l->rows.i, b->n, l->rows.par);
		l->rated_pending = 1;
		l->seen_s += mfs_now_s() - t0;
	} else if (l->c->serve_rows_ahead && !l->xch) { /* the next batch's lookups on the pool while this thread
	                                                   * scores and submits (rows.h); not with exchange.topic,
	                                                   * whose merge may add item rows before the next batch */
		mfs_ebatch_t *next = mfs_batchq_peek(l->queue);
		if (next)
			mfs_rows_ahead(&l->rows, next);
	}
	ph_mark(l, MFS_LPH_ROWS);
	if (l->m->n_users != l->grown_users || l->m->n_items != l->grown_items) {
		if ((rc = mfs_engine_grow(l->e)))
			return mfs_errf(l->err, sizeof l->err, rc, "engine grow: %s", mfs_strerror(rc));
		l->grown_users = l->m->n_users;
		l->grown_items = l->m->n_items;
		ph_mark(l, MFS_LPH_GROW);
	}
	if ((rc = reset_reused(l)))
		return rc;
	mfs_batch_t bt = {l->tu_, l->ti_, l->tr_, nt}, bh = {l->hu_, l->hi_, l->hr_, nh};
	if (l->c->serve_prequential) { /* test, then train: every event is scored before it is learned */
		if ((rc = score(l, b, &bt, &bh, nd, sum)))
			return rc;
		ph_mark(l, MFS_LPH_SCORE);
	} else if (b->n > nd) {
		mfs_model_observe(l->m, sum, b->n - nd);
	}
	l->meta.dropped += nd;
	l->meta.digest += b->digest;
	if (nt && ((rc = mfs_engine_sgd(l->e, &bt)) || (rc = stamps_given(l))))
		return mfs_errf(l->err, sizeof l->err, rc, "engine sgd: %s", mfs_strerror(rc));
	if (l->xch && nt && (rc = mfs_exchange_note(l->xch, bt.u, bt.i, nt)))
		return mfs_errf(l->err, sizeof l->err, rc, "exchange: %s", mfs_strerror(rc));
	ph_mark(l, MFS_LPH_SUBMIT);
	if ((rc = mfs_window_add(&l->win, &bt)) || (rc = mfs_window_add(&l->hwin, &bh)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	mfs_replay_credit(&l->rp, nt);
	l->meta.held_out += nh;
	for (size_t j = 0; j < b->n_reset; j++) { /* a partition started again below its offset */
		mfs_part_t *o = mfs_parts_get(&l->offs, b->reset[j].topic, b->reset[j].partition);
		if (!o)
			return mfs_errf(l->err, sizeof l->err, ENOMEM, "out of memory");
		o->off.next = b->reset[j].next;
		l->dirty = 1;
	}
	for (size_t j = 0; j < b->n_off; j++) {
		mfs_part_t *o = mfs_parts_get(&l->offs, b->off[j].topic, b->off[j].partition);
		if (!o)
			return mfs_errf(l->err, sizeof l->err, ENOMEM, "out of memory");
		if (b->off[j].next > o->off.next)
			o->off.next = b->off[j].next;
	}
	for (int r = 0; r < MFS_REJ__COUNT; r++)
		l->meta.rejected[r] += b->rejected[r];
	l->messages += b->messages;
	if ((rc = mfs_grow((void **)&l->pend_ts, &l->cap_pend, l->n_pend + b->n_ts, sizeof *l->pend_ts)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	if (b->n_ts)
		memcpy(l->pend_ts + l->n_pend, b->ts, b->n_ts * sizeof *b->ts);
	l->n_pend += b->n_ts;
	uint64_t ticket, done;
	mfs_engine_progress(l->e, &ticket, &done); /* this batch is applied once done >= ticket */
	if ((rc = mfs_pending_push(&l->apl, b->ts, b->n_ts, ticket)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	l->batches++;
	if (b->n_off || b->n || b->n_del)
		l->dirty = 1;
	ph_mark(l, MFS_LPH_RECORD);
	if (l->c->test_apply_delay_ms > 0) {
		mfs_sleep_ms(l->c->test_apply_delay_ms);
		ph_mark(l, MFS_LPH_OTHER);
	}
	return 0;
}

/* exchange.topic: after a batch (batch = 1: publish when due) or while idle, merge what the
 * other services published (serve/exchange.h). */
static int exchange_step(mfs_learner_t *l, int batch)
{
	if (!l->xch)
		return 0;
	mfs_hparams_t hp;
	mfs_exchange_stats_t a, b;
	mfs_hparams_from(l->c, l->lrc.lr, &hp);
	mfs_exchange_get_stats(l->xch, &a);
	int rc = mfs_exchange_step(l->xch, l->e, &hp, &l->rows.ti, batch);
	l->xch_next_s = mfs_now_s() + 0.1;
	if (rc)
		return mfs_errf(l->err, sizeof l->err, rc, "exchange: %s", mfs_strerror(rc));
	mfs_exchange_get_stats(l->xch, &b);
	if (b.merged_rows != a.merged_rows || b.items_added != a.items_added)
		l->dirty = 1; /* merged rows are in the next snapshot */
	return 0;
}

/* serve.rows_threads, 0: half the CPUs this process may run on, 2..8 */
static int rows_threads(const mfs_conf_t *c)
{
	if (c->serve_rows_threads > 0)
		return (int)c->serve_rows_threads;
	cpu_set_t set;
	int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
	n /= 2;
	return n < 2 ? 2 : n > 8 ? 8 : n;
}

/* The replay's recency scale (serve/replay.h tau), in ratings: serve.replay_half_life_s of event
 * time at the rate events have come in event time since the learner began (1 rating a second
 * until the clock has moved). */
static double replay_tau(mfs_learner_t *l)
{
	if (!l->clock0)
		l->clock0 = l->m->clock_s, l->events0 = l->m->events_applied;
	const double span = (double)(l->m->clock_s - l->clock0);
	const double rate = span > 0 ? (double)(l->m->events_applied - l->events0) / span : 1.0;
	return l->c->serve_replay_half_life_s * rate / M_LN2;
}

/* One chunk of replay (serve.replay): ratings sampled from the retained window go to the
 * engine like a batch; their rows join the next snapshot's, so a snapshot stays the whole
 * model at a batch boundary. No offset, counter of events, mean or score moves. */
static int replay_chunk(mfs_learner_t *l)
{
	mfs_batch_t b;
	if (l->c->serve_replay_half_life_s > 0) /* forgetting: its half-life in ratings at the stream's event rate */
		l->rp.tau = replay_tau(l);
	int rc = mfs_replay_next(&l->rp, &l->win, &b);
	if (rc)
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	if (!b.n)
		return 0;
	if ((rc = mfs_touched_mark_many(&l->rows.tu, b.u, b.n)) || (rc = mfs_touched_mark_many(&l->rows.ti, b.i, b.n)))
		return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
	mfs_model_stamp_rows(l->m, 0, b.u, b.n); /* in flight like a batch's (model_store/life.h) */
	mfs_model_stamp_rows(l->m, 1, b.i, b.n);
	if ((rc = mfs_engine_replay(l->e, &b, l->rp.lr_scale)) || (rc = stamps_given(l)))
		return mfs_errf(l->err, sizeof l->err, rc, "engine sgd (replay): %s", mfs_strerror(rc));
	l->meta.replayed += b.n;
	l->dirty = 1;
	return 0;
}

static void observe_applied(void *ctx, double seconds)
{
	mfs_histogram_observe(ctx, seconds);
}

/* Messages whose batch the engine has applied since the last poll: their create time ->
 * now goes to the event -> applied histogram. */
static void applied_poll(mfs_learner_t *l)
{
	if (mfs_pending_empty(&l->apl))
		return;
	uint64_t ticket, done;
	mfs_engine_progress(l->e, &ticket, &done);
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	const double now_ms = (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
	mfs_pending_drain(&l->apl, done, now_ms, &l->apl_lat, l->cat ? observe_applied : NULL,
	                  l->cat ? l->cat->event_to_applied : NULL);
}

/* Send the offsets a published snapshot stores through the commit callback, those that
 * changed since the last commit. */
static void commit_offsets(mfs_learner_t *l, const mfs_pubjob_t *j, int sync)
{
	if (!l->commit)
		return;
	mfs_offset_t *send = NULL;
	size_t n = 0;
	if (j->n_offs && !(send = malloc(j->n_offs * sizeof *send)))
		return; /* the next snapshot commits them */
	for (size_t x = 0; x < j->n_offs; x++) {
		mfs_part_t *o = mfs_parts_find(&l->offs, j->offs[x].topic, j->offs[x].partition);
		if (o && j->offs[x].next != o->committed) {
			send[n++] = j->offs[x];
			o->committed = j->offs[x].next;
		}
	}
	if (n)
		(void)l->commit(l->commit_ctx, send, n, sync); /* it logs a failure (debug); an offset is sent
		                                                   again only once it advances */
	free(send);
}

/* Take back the job the publisher finished: freshness of what it newly covers, metrics, the
 * offset commit, stats. wait: block until it is done; else only if it already is. */
static int job_finish(mfs_learner_t *l, int wait, int sync_commit)
{
	mfs_pubjob_t *j = mfs_publisher_take(l->pub, wait);
	if (!j)
		return 0;
	if (j->rc)
		return mfs_errf(l->err, sizeof l->err, j->rc, "snapshot: %s", *j->err ? j->err : mfs_strerror(j->rc));
	/* visible from its commit on: account the freshness of every message it newly covers */
	for (size_t x = 0; x < j->n_pend; x++) {
		int64_t d = j->commit_ms - j->pend_ts[x];
		mfs_hist_add(&l->snap_lat, (double)d);
		if (l->cat)
			mfs_histogram_observe(l->cat->event_to_snapshot, (double)(d < 0 ? 0 : d) / 1000.0);
	}
	if (l->cat) {
		mfs_histogram_observe(l->cat->snapshot_duration, j->t1 - j->t0);
		/* capture, the writer's phases in their order, trim (catalog.def) */
		mfs_gauge_add(l->cat->snapshot_seconds_at[0], j->capture_s);
		for (int x = 0; x < MFS_SNAP_PH__COUNT; x++)
			mfs_gauge_add(l->cat->snapshot_seconds_at[x + 1], j->phase_s[x]);
		mfs_gauge_add(l->cat->snapshot_seconds_at[MFS_SNAP_PH__COUNT + 1], j->trim_s);
	}
	j->n_pend = 0;
	l->snapshots++;
	mfs_debug("serve", "msg=snapshot why=%s seq=%" PRIu64 " users=%zu items=%zu events_applied=%" PRIu64
	          " seconds=%.4f capture_s=%.4f prepare_s=%.4f reserve_s=%.4f rows_s=%.4f rated_s=%.4f commit_s=%.4f"
	          " trim_s=%.4f",
	          j->why, j->seq, j->users, j->items, j->events_applied, j->t1 - j->t0, j->capture_s,
	          j->phase_s[MFS_SNAP_PH_PREPARE], j->phase_s[MFS_SNAP_PH_RESERVE], j->phase_s[MFS_SNAP_PH_ROWS],
	          j->phase_s[MFS_SNAP_PH_RATED], j->phase_s[MFS_SNAP_PH_COMMIT], j->trim_s);
	commit_offsets(l, j, sync_commit);
	pthread_mutex_lock(&l->st_mu);
	l->st.snap_seq = j->seq;
	l->st.snap_users = j->users;
	l->st.snap_items = j->items;
	l->st.snap_wall_s = (double)j->commit_ms / 1000.0;
	l->st.snap_seconds = j->t1 - j->t0;
	l->st.snap_time_s = j->t1;
	l->st.lat_p50_ms = mfs_hist_quantile(&l->snap_lat, 0.50);
	l->st.lat_p99_ms = mfs_hist_quantile(&l->snap_lat, 0.99);
	l->st.lat_n = l->snap_lat.n;
	l->st.applied_p50_ms = mfs_hist_quantile(&l->apl_lat, 0.50);
	l->st.applied_p99_ms = mfs_hist_quantile(&l->apl_lat, 0.99);
	pthread_mutex_unlock(&l->st_mu);
	return 0;
}

/* Take a snapshot at this batch boundary: stage the touched rows' ids, have the engine capture
 * their values, add the offsets and counters that describe exactly the batches applied so far,
 * and post the job to the publisher. At most one is in flight: a previous one still being
 * written is waited for first. wait (barriers: revocation, shutdown): return only once this
 * one is committed (and its offsets committed synchronously). */
/* Leave the rows of t that are dead now (freed, no new id yet) out of its list. */
static void drop_dead(mfs_touched_t *t, const mfs_idmap_t *map)
{
	size_t n = 0;
	for (size_t j = 0; j < t->n; j++)
		if (mfs_idmap_alive(map, t->rows[j]))
			t->rows[n++] = t->rows[j];
	t->n = n;
}

static int snapshot(mfs_learner_t *l, const char *why, int wait)
{
	int rc;
	if ((rc = rated_join(l)) || (rc = job_finish(l, 1, 0)))
		return rc;
	/* a timer snapshot needs new rows or offsets; a barrier's (revocation, shutdown) also
	 * publishes a newer learning rate and accuracy figures, so a restart resumes with them */
	if (!l->dirty && !(wait && l->meta_dirty))
		return 0;
	mfs_pubjob_t *j = mfs_publisher_job(l->pub);
	static const uint32_t none = 0; /* a non-NULL empty list (NULL would mean every row) */
	if (mfs_model_frees(l->m)) { /* rows freed and not given to another id: nothing to write */
		drop_dead(&l->rows.tu, l->m->users);
		drop_dead(&l->rows.ti, l->m->items);
	}
	const mfs_touched_t *tu = &l->rows.tu, *ti = &l->rows.ti;
	mfs_snap_info_t rows = {
		.user_rows = tu->n ? tu->rows : &none, .n_user_rows = tu->n,
		.item_rows = ti->n ? ti->rows : &none, .n_item_rows = ti->n,
		.rated_take = l->rated, /* the last job is done (job_finish above): the spare is free */
	};
	char e[512] = "";
	if (!j->stage && !(j->stage = mfs_snap_stage_new()))
		return mfs_errf(l->err, sizeof l->err, ENOMEM, "out of memory");
	/* the ids here; the values of only the rows this snapshot writes are captured by the engine
	 * as of this batch boundary, and a device engine's copy of them to the host is left to the
	 * publisher (mfs_engine_capture_wait there) */
	const double t0 = mfs_now_s();
	if ((rc = mfs_snap_stage_fill_ids(j->stage, l->m, &rows, l->rows.par, e, sizeof e)))
		return mfs_errf(l->err, sizeof l->err, rc, "snapshot: %s", *e ? e : mfs_strerror(rc));
	const double t1 = mfs_now_s();
	mfs_model_gone_clear(l->m); /* the stage deletes them */
	mfs_snap_rated_t *taken = l->rated; /* the stage has it; its writer clears it */
	l->rated = l->rated_spare;
	l->rated_spare = taken;
	if ((rc = mfs_engine_capture(l->e, tu->rows, tu->n, mfs_snap_stage_values(j->stage, 0, NULL), ti->rows, ti->n,
	                             mfs_snap_stage_values(j->stage, 1, NULL))))
		return mfs_errf(l->err, sizeof l->err, rc, "engine capture: %s", mfs_strerror(rc));
	const double t2 = mfs_now_s();
	if (t2 - t0 > 0.1) /* the learner held: which part (ids, or the engine's copy) */
		mfs_info("serve", "msg=\"slow snapshot staging\" users=%zu items=%zu seconds=%.3f ids_s=%.3f capture_s=%.3f",
		         tu->n, ti->n, t2 - t0, t1 - t0, t2 - t1);
	if ((rc = mfs_grow((void **)&j->offs, &j->cap_offs, l->offs.n + 1, sizeof *j->offs)))
		return mfs_errf(l->err, sizeof l->err, ENOMEM, "out of memory");
	j->n_offs = 0;
	for (size_t x = 0; x < l->offs.n; x++) /* topic strings live as long as the learner */
		if (l->offs.p[x].off.next >= 0)
			j->offs[j->n_offs++] = l->offs.p[x].off;
	uint64_t pq_n;
	const double pq = mfs_preq_interval_rmse(&l->pq, &pq_n);
	if (pq_n)
		l->pq_rmse_last = pq;
	l->meta.mu_count = l->m->mu_count;
	l->meta.mu_sum = l->m->mu_sum;
	for (int ent = 0; ent < 2; ent++)
		for (int w = 0; w < 3; w++)
			l->meta.freed[ent][w] = mfs_model_freed(l->m, ent, w);
	l->meta.pq_rmse = l->pq_rmse_last;
	l->meta.pq_n = pq_n;
	l->meta.pq_window_rmse = mfs_preq_window_rmse(&l->pq, &l->meta.pq_window_n);
	l->meta.pq_cumulative_rmse = mfs_preq_cumulative_rmse(&l->pq, &l->meta.pq_cumulative_n);
	l->meta.holdout_rmse = l->hold_rmse;
	l->meta.window_rmse = l->win_rmse;
	j->n_meta = mfs_serve_meta_records(&l->meta, l->c->serve_prequential, &j->meta);
	j->lr = l->lrc.lr;
	j->last_loss = l->last_loss;
	j->users = tu->n;
	j->items = ti->n;
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
	mfs_touched_clear(&l->rows.tu);
	mfs_touched_clear(&l->rows.ti);
	l->dirty = 0;
	l->meta_dirty = 0;
	mfs_preq_interval_reset(&l->pq);
	mfs_publisher_post(l->pub);
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
		mfs_batch_t b;
		if ((rc = mfs_window_live(&l->win, &b)))
			return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
		if ((rc = mfs_engine_loss(l->e, &b, &lw)))
			return mfs_errf(l->err, sizeof l->err, rc, "engine loss: %s", mfs_strerror(rc));
		l->win_rmse = lw.rmse;
	}
	if (l->hwin.n) {
		mfs_batch_t b;
		if ((rc = mfs_window_live(&l->hwin, &b)))
			return mfs_errf(l->err, sizeof l->err, rc, "out of memory");
		if ((rc = mfs_engine_loss(l->e, &b, &lh)))
			return mfs_errf(l->err, sizeof l->err, rc, "engine loss: %s", mfs_strerror(rc));
		l->hold_rmse = lh.rmse;
	}
	double loss = l->hwin.n ? l->hold_rmse : l->win_rmse;
	if (!l->win.n && !l->hwin.n)
		return 0;
	double before = l->lrc.lr;
	l->meta_dirty = 1;
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
	uint64_t ev = l->m->events_applied + l->meta.held_out;
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
	         " snapshots=%" PRIu64 " replayed=%" PRIu64 " prequential_rmse=%.4f holdout_rmse=%.4f window_rmse=%.4f lr=%.5g ring_fill=%zu"
	         " latency_p50_ms=%.1f latency_p99_ms=%.1f row_resets=%" PRIu64 " row_resets_drained=%" PRIu64
	         " learner_busy=%.3f%s",
	         l->m->events_applied, l->meta.held_out, (double)(ev - *last_ev) / (now - *last_t), l->m->n_users,
	         l->m->n_items, l->snapshots, l->meta.replayed, l->pq_rmse_last, l->hold_rmse, l->win_rmse, l->lrc.lr,
	         mfs_batchq_fill(l->queue), mfs_hist_quantile(&l->snap_lat, 0.5), mfs_hist_quantile(&l->snap_lat, 0.99),
	         l->resets, l->resets_drained, busy / dt, ph);
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
	uint64_t last_log_ev = l->m->events_applied + l->meta.held_out;
	int deferred = 0; /* the due timer snapshot waits for the publisher */
	for (;;) {
		double wake = next_snap < next_pass ? next_snap : next_pass;
		if (l->st_next_s < wake) /* idle stats twice a second (what replay did shows when it ends) */
			wake = l->st_next_s;
		int tmo = (int)((wake - mfs_now_s()) * 1000.0) + 1;
		if (!mfs_pending_empty(&l->apl) && tmo > 1) /* batches in flight on the engine: look again soon */
			tmo = 1;
		const int replay = mfs_replay_due(&l->rp, &l->win);
		mfs_ebatch_t *b = NULL;
		ph_mark(l, MFS_LPH_OTHER);
		/* replay owed: only look whether a batch waits (new events first), else replay */
		int prc = mfs_batchq_pop(l->queue, replay ? 0 : tmo < 1 ? 1 : tmo, &b);
		ph_mark(l, MFS_LPH_WAIT);
		if (prc == EPIPE)
			break;
		if (!b && replay) {
			if ((rc = replay_chunk(l)))
				return rc;
			ph_mark(l, MFS_LPH_REPLAY);
		}
		if (b) {
			int barrier = b->barrier;
			uint64_t gen = b->barrier_gen;
			rc = apply(l, b);
			mfs_rows_ahead_cancel(&l->rows, b); /* (an error before its rows: lookups of it may still run) */
			mfs_batchq_release(l->queue, b);
			if (rc || (rc = exchange_step(l, 1)))
				return rc;
			if (barrier) {
				rc = snapshot(l, barrier == MFS_EBATCH_FINAL ? "shutdown" : "revoke", 1);
				ph_mark(l, MFS_LPH_SNAPSHOT);
				stats_update(l);
				mfs_batchq_barrier_done(l->queue, gen);
				if (rc)
					return rc;
				if (barrier == MFS_EBATCH_FINAL)
					return 0;
				next_snap = mfs_now_s() + snap_period;
				deferred = 0;
			}
		}
		now = mfs_now_s();
		if (!b && l->xch && now >= l->xch_next_s && (rc = exchange_step(l, 0))) /* idle: merge what arrived */
			return rc;
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
			if (mfs_publisher_busy(l->pub)) {
				/* the last one is still being written (many rows, a slow disk): keep learning
				 * and take this one the moment the publisher is free, with every row touched
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
	/* the consumer closed the queue without a final barrier: publish what was applied */
	return snapshot(l, "shutdown", 1);
}

static void *thread_main(void *arg)
{
	mfs_learner_t *l = arg;
	mfs_thread_name("mfs-learner");
	mfs_engine_conf_t ec;
	char e[1024] = "";
	int rc = mfs_engine_conf_from(l->c, &ec, e, sizeof e);
	if (rc == 0)
		rc = mfs_engine_open(&ec, l->m, &l->e, e, sizeof e);
	if (rc == 0) {
		snprintf(l->engine_name, sizeof l->engine_name, "%s", mfs_engine_name(l->e));
		/* new ids' initial values from the engine (the CUDA engine: on the device, no host
		 * Box-Muller, pages or upload on a stream of new ids) */
		int taken = 0;
		if (l->c->engine_cuda_device_init && (rc = mfs_engine_take_new_rows(l->e, &taken)))
			mfs_errf(l->err, sizeof l->err, rc, "engine: new rows: %s", mfs_strerror(rc));
		l->grown_users = l->m->n_users;
		l->grown_items = l->m->n_items;
		if (!rc)
			rc = set_lr(l);
		if (!rc && *l->c->exchange_topic &&
		    (rc = mfs_exchange_open(l->c, l->xch_brokers, l->m, &l->xch, e, sizeof e)))
			mfs_errf(l->err, sizeof l->err, rc, "%s", e);
		if (!rc && l->xch) /* what the topic held at open, before the first batch (exchange.c, "Restart") */
			rc = exchange_step(l, 0);
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
	if ((rc = mfs_rows_start(&l->rows))) { /* without it every batch resolves its rows on this thread */
		mfs_warn("serve", "msg=\"rows threads not started: ids resolve on the learner alone\" threads=%d err=\"%s\"",
		         l->rows.threads, mfs_strerror(rc));
		rc = 0;
	}
	/* a doubling of the id maps finds its new tables' pages there (model_store/idmap.c) */
	if ((rc = mfs_model_prepare_ahead(l->m))) {
		mfs_warn("serve", "msg=\"id map helper not started: tables grow on the learner's path\" err=\"%s\"",
		         mfs_strerror(rc));
		rc = 0;
	}
	if ((rc = mfs_publisher_start(l->pub, l->e))) {
		mfs_errf(l->err, sizeof l->err, rc, "snapshot writer thread: %s", strerror(rc));
	} else {
		l->ph_t = mfs_now_s();
		atomic_store_explicit(&l->beat_ms, (int64_t)(l->ph_t * 1000.0), memory_order_relaxed);
		rc = run(l);
		mfs_rows_ahead_cancel(&l->rows, NULL);
		atomic_store_explicit(&l->beat_ms, 0, memory_order_relaxed); /* done: not stalled */
		int frc = job_finish(l, 1, 1); /* an error exit may leave one in flight */
		if (!rc)
			rc = frc;
		mfs_publisher_stop(l->pub);
	}
	int jrc = rated_join(l);
	if (!rc)
		rc = jrc;
	mfs_rows_stop(&l->rows);
	if (rc) {
		mfs_error("serve", "msg=\"learner stopped\" err=\"%s\"", l->err);
		mfs_batchq_fail(l->queue); /* the consumer sees EPIPE and stops */
	}
	stats_update(l);
	char ph[320];
	ph_format(ph, sizeof ph, l->ph, 1, 1, "_s");
	mfs_info("serve", "msg=\"learner done\" events_applied=%" PRIu64 " held_out=%" PRIu64 " replayed=%" PRIu64 " messages=%" PRIu64
	         " snapshots=%" PRIu64 " snapshots_deferred=%" PRIu64 " latency_p50_ms=%.1f latency_p99_ms=%.1f"
	         " latency_n=%" PRIu64 " applied_p50_ms=%.1f applied_p99_ms=%.1f rows_ahead=%" PRIu64 "%s",
	         l->m->events_applied, l->meta.held_out, l->meta.replayed, l->messages, l->snapshots, l->snap_deferred,
	         mfs_hist_quantile(&l->snap_lat, 0.5), mfs_hist_quantile(&l->snap_lat, 0.99), l->snap_lat.n,
	         mfs_hist_quantile(&l->apl_lat, 0.5), mfs_hist_quantile(&l->apl_lat, 0.99), l->rows.ahead_used, ph);
	if (l->xch) {
		mfs_exchange_stats_t xs;
		mfs_exchange_get_stats(l->xch, &xs);
		mfs_info("serve", "msg=\"exchange done\" published_rows=%" PRIu64 " received_rows=%" PRIu64
		         " merged_rows=%" PRIu64 " items_added=%" PRIu64 " bad_messages=%" PRIu64 " produce_errors=%" PRIu64,
		         xs.published_rows, xs.received_rows, xs.merged_rows, xs.items_added, xs.bad_messages,
		         xs.produce_errors);
		mfs_exchange_close(l->xch); /* delivers what was published */
		l->xch = NULL;
	}
	l->thread_rc = rc;
	return NULL;
}

int mfs_learner_open(const mfs_conf_t *c, mfs_batchq_t *queue, mfs_learner_t **out, char *errstr, size_t es)
{
	*out = NULL;
	mfs_learner_t *l = calloc(1, sizeof *l);
	if (!l)
		return mfs_errf(errstr, es, ENOMEM, "out of memory");
	l->c = c;
	l->queue = queue;
	l->pq_rmse_last = l->win_rmse = l->hold_rmse = l->last_loss = NAN;
	mfs_preq_init(&l->pq, (uint64_t)c->serve_prequential_window);
	l->win.cap = (size_t)c->serve_window;
	mfs_replay_init(&l->rp, c->serve_replay, l->win.cap, (size_t)c->serve_replay_chunk, c->serve_replay_beta,
	                (uint64_t)c->model_seed);
	l->hwin.cap = c->serve_holdout_fraction > 0 ? (size_t)c->serve_holdout_window : 0;
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->st_mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	int rc;
	if (mfs_hist_init(&l->snap_lat, LAT_BUCKETS, 1.0) || mfs_hist_init(&l->apl_lat, APL_BUCKETS, 0.1)) {
		rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
		goto fail;
	}
	if (!*c->snapshot_dir) {
		rc = mfs_errf(errstr, es, MFS_ECONFIG, "snapshot.dir (--snapshot DIR) is required");
		goto fail;
	}
	mfs_model_conf_t mc;
	mfs_model_conf_stream(c, &mc);
	if ((rc = mfs_model_init(&mc, &l->m))) {
		mfs_errf(errstr, es, rc, "model: %s", mfs_strerror(rc));
		goto fail;
	}
	l->m->max_users = (uint32_t)c->model_max_users;
	l->m->max_items = (uint32_t)c->model_max_items;
	/* the host tables sized to their bounds at once: address space only (mappings fault in
	 * as rows are added), and no doubling later */
	if ((rc = mfs_model_reserve(l->m, l->m->max_users, l->m->max_items))) {
		mfs_errf(errstr, es, rc, "model.max_users / model.max_items: %s", mfs_strerror(rc));
		goto fail;
	}
	if (c->model_admit_after > 1 &&
	    (rc = mfs_model_admit(l->m, (unsigned)c->model_admit_after, (size_t)c->model_admit_sketch_width))) {
		mfs_errf(errstr, es, rc, "admission sketch: %s", mfs_strerror(rc));
		goto fail;
	}
	if ((rc = mfs_model_life(l->m, (uint32_t)c->model_ttl_s,
	                         (c->model_max_users || c->model_max_items) && c->model_on_full == 0))) {
		mfs_errf(errstr, es, rc, "model lifecycle: %s", mfs_strerror(rc));
		goto fail;
	}
	l->win.m = l->hwin.m = l->m;
	if ((rc = mfs_rows_init(&l->rows, l->m, rows_threads(c)))) {
		mfs_errf(errstr, es, rc, "rows: %s", mfs_strerror(rc));
		goto fail;
	}
	l->rows_ok = 1;
	/* one shard per worker of the rows pool (the learner does other work meanwhile) */
	const uint32_t rsh = l->rows.threads > 1 ? (uint32_t)l->rows.threads - 1 : 1;
	if (c->snapshot_seen_items > 0 &&
	    ((rc = mfs_snap_rated_init_shards((uint32_t)c->snapshot_seen_items, rsh, &l->rated)) ||
	     (rc = mfs_snap_rated_init_shards((uint32_t)c->snapshot_seen_items, rsh, &l->rated_spare)))) {
		mfs_errf(errstr, es, rc, "snapshot.seen_items: %s", mfs_strerror(rc));
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
			mfs_part_t *o = mfs_parts_get(&l->offs, l->loaded.offsets[j].topic, l->loaded.offsets[j].partition);
			if (!o) {
				rc = mfs_errf(errstr, es, ENOMEM, "out of memory");
				goto fail;
			}
			o->off.next = o->committed = l->loaded.offsets[j].next;
		}
		mfs_serve_meta_restore(&l->loaded, &l->meta);
		for (int e = 0; e < 2; e++) /* the lifecycle's counters go on from the snapshot's */
			for (int w = 0; w < 3; w++)
				l->m->life[e]->freed[w] = l->meta.freed[e][w];
		mfs_preq_resume(&l->pq, l->meta.pq_cumulative_rmse, l->meta.pq_cumulative_n);
		l->mu_known = 1; /* the snapshot's mu, even one without mu_count (a train snapshot) */
		mfs_info("serve", "msg=\"snapshot loaded\" dir=%s seq=%" PRIu64 " users=%u items=%u events_applied=%" PRIu64
		         " offsets=%zu seconds=%.3f", c->snapshot_dir, l->loaded.seq, l->m->n_users, l->m->n_items,
		         l->m->events_applied, l->loaded.n_offsets, mfs_now_s() - t0);
	}
	/* the learning-rate controller resumes from the snapshot's rate */
	mfs_lr_conf_t lc;
	mfs_lr_conf_stream(c, &lc);
	mfs_lr_init(&l->lrc, &lc);
	l->lr_floor = c->serve_lr_floor * lc.lr0;
	if (isfinite(l->loaded.learning_rate) && l->loaded.learning_rate > 0 && c->serve_lr_schedule != MFS_LR_FIXED)
		l->lrc.lr = l->loaded.learning_rate;
	mfs_publisher_conf_t pc = {c->snapshot_dir, (size_t)c->snapshot_map_size, c->snapshot_sync, c->rating_min,
	                           c->rating_max, (int)c->test_publish_delay_ms};
	if ((rc = mfs_publisher_open(&pc, &l->pub, errstr, es)))
		goto fail;
	stats_update(l);
	*out = l;
	return 0;
fail:
	mfs_learner_close(l);
	return rc;
}

int mfs_learner_set_brokers(mfs_learner_t *l, const char *brokers)
{
	free(l->xch_brokers);
	l->xch_brokers = brokers ? strdup(brokers) : NULL;
	return brokers && !l->xch_brokers ? ENOMEM : 0;
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

double mfs_learner_stalled_s(mfs_learner_t *l, const char **last_phase)
{
	const int64_t b = atomic_load_explicit(&l->beat_ms, memory_order_relaxed);
	if (last_phase)
		*last_phase = mfs_learner_phase_name(atomic_load_explicit(&l->beat_phase, memory_order_relaxed));
	if (b <= 0)
		return 0;
	const double age = mfs_now_s() - (double)b / 1000.0;
	return age > 0 ? age : 0;
}

int mfs_learner_start(mfs_learner_t *l, mfs_commit_fn commit, void *commit_ctx, char *errstr, size_t es)
{
	l->commit = commit;
	l->commit_ctx = commit_ctx;
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
		mfs_batchq_close(l->queue);
		pthread_join(l->thread, NULL);
	}
	mfs_publisher_close(l->pub); /* before the engine: a job in flight waits on its capture */
	mfs_exchange_close(l->xch); /* (the thread closes it; not when it never ran) */
	free(l->xch_brokers);
	mfs_engine_close(l->e);
	mfs_model_free(l->m);
	mfs_snap_loaded_free(&l->loaded);
	if (l->rows_ok)
		mfs_rows_free(&l->rows);
	mfs_snap_rated_free(l->rated);
	mfs_snap_rated_free(l->rated_spare);
	mfs_parts_free(&l->offs);
	free(l->tu_);
	free(l->ti_);
	free(l->hu_);
	free(l->hi_);
	free(l->tr_);
	free(l->hr_);
	mfs_window_free(&l->win);
	mfs_window_free(&l->hwin);
	mfs_replay_free(&l->rp);
	free(l->pend_ts);
	mfs_hist_free(&l->snap_lat);
	mfs_hist_free(&l->apl_lat);
	mfs_pending_free(&l->apl);
	free(l->st_q);
	mfs_preq_free(&l->pq);
	pthread_mutex_destroy(&l->mu);
	pthread_mutex_destroy(&l->st_mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}
