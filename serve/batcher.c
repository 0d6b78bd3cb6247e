/* batcher.c - see batcher.h.
 *
 * DESIGN: one mutex and three condition variables; the queue moves pointers to batches, never
 * events, and is touched once per batch (thousands of events), so a lock costs nothing
 * measurable. Memory: at most cap queued + one being filled + one being applied batches exist
 * beyond the free list, and the free list only holds batches that were once in use.
 */
#include "serve/batcher.h"

#include "common/grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int mfs_ebatch_add_events(mfs_ebatch_t *b, const mfs_event_t *ev, size_t n_ev, void *keep, int64_t ts_ms,
                          double holdout_fraction)
{
	if (mfs_grow((void **)&b->ev, &b->cap, b->n + n_ev, sizeof *b->ev) ||
	    mfs_grow((void **)&b->keep, &b->cap_keep, b->n_keep + 1, sizeof *b->keep) ||
	    mfs_grow((void **)&b->ts, &b->cap_ts, b->n_ts + 1, sizeof *b->ts) ||
	    (holdout_fraction > 0 && mfs_grow((void **)&b->held, &b->cap_held, b->n + n_ev, sizeof *b->held)))
		return ENOMEM;
	size_t dels = 0;
	for (size_t j = 0; j < n_ev; j++)
		dels += ev[j].op != MFS_OP_RATE;
	if (dels && (mfs_grow((void **)&b->del, &b->cap_del, b->n_del + dels, sizeof *b->del) ||
	             mfs_grow((void **)&b->del_at, &b->cap_del_at, b->n_del + dels, sizeof *b->del_at)))
		return ENOMEM;
	if (!dels && n_ev)
		memcpy(b->ev + b->n, ev, n_ev * sizeof *ev);
	size_t at = b->n;
	for (size_t j = 0; j < n_ev; j++) {
		if (ev[j].op != MFS_OP_RATE) {
			b->del[b->n_del] = ev[j];
			b->del_at[b->n_del++] = at;
			continue;
		}
		if (dels)
			b->ev[at] = ev[j];
		b->digest += mfs_event_digest(&ev[j]);
		if (holdout_fraction > 0)
			b->held[at] = mfs_event_holdout_u(&ev[j]) < holdout_fraction;
		at++;
	}
	b->n = at;
	if (keep)
		b->keep[b->n_keep++] = keep;
	if (ts_ms > 0)
		b->ts[b->n_ts++] = ts_ms;
	return 0;
}

int mfs_ebatch_advance(mfs_ebatch_t *b, const char *topic, int32_t partition, int64_t next)
{
	for (size_t j = 0; j < b->n_off; j++)
		if (b->off[j].partition == partition && b->off[j].topic == topic) {
			if (next > b->off[j].next)
				b->off[j].next = next;
			return 0;
		}
	if (mfs_grow((void **)&b->off, &b->cap_off, b->n_off + 1, sizeof *b->off))
		return ENOMEM;
	b->off[b->n_off++] = (mfs_offset_t){topic, partition, next};
	return 0;
}

int mfs_ebatch_reset(mfs_ebatch_t *b, const char *topic, int32_t partition, int64_t next)
{
	if (mfs_grow((void **)&b->reset, &b->cap_reset, b->n_reset + 1, sizeof *b->reset))
		return ENOMEM;
	b->reset[b->n_reset++] = (mfs_offset_t){topic, partition, next};
	return 0;
}

void mfs_ebatch_clear(mfs_ebatch_t *b)
{
	for (size_t j = 0; j < b->n_keep; j++)
		if (b->keep_free)
			b->keep_free(b->keep[j]);
	b->n = b->n_keep = b->n_ts = b->n_off = b->n_reset = b->n_del = 0;
	memset(b->rejected, 0, sizeof b->rejected);
	b->digest = 0;
	b->messages = 0;
	b->t_first = 0;
	b->barrier = 0;
	b->barrier_gen = 0;
}

void mfs_ebatch_free(mfs_ebatch_t *b)
{
	if (!b)
		return;
	mfs_ebatch_clear(b);
	free(b->ev);
	free(b->del);
	free(b->del_at);
	free(b->held);
	free(b->keep);
	free(b->ts);
	free(b->off);
	free(b->reset);
	free(b);
}

int mfs_batchq_init(mfs_batchq_t *q, size_t slots, mfs_keep_free_fn keep_free)
{
	memset(q, 0, sizeof *q);
	q->bq_keep_free = keep_free;
	if (slots < 1)
		slots = 1;
	if (!(q->bq_q = calloc(slots, sizeof *q->bq_q)))
		return ENOMEM;
	q->bq_cap = slots;
	int rc;
	if ((rc = pthread_mutex_init(&q->bq_mu, NULL)))
		return rc;
	pthread_cond_init(&q->bq_not_empty, NULL);
	pthread_cond_init(&q->bq_not_full, NULL);
	pthread_cond_init(&q->bq_changed, NULL);
	return 0;
}

void mfs_batchq_destroy(mfs_batchq_t *q)
{
	if (!q->bq_q)
		return;
	for (size_t j = 0; j < q->bq_count; j++)
		mfs_ebatch_free(q->bq_q[(q->bq_head + j) % q->bq_cap]);
	for (size_t j = 0; j < q->bq_n_free; j++)
		mfs_ebatch_free(q->bq_free[j]);
	free(q->bq_q);
	free(q->bq_free);
	pthread_mutex_destroy(&q->bq_mu);
	pthread_cond_destroy(&q->bq_not_empty);
	pthread_cond_destroy(&q->bq_not_full);
	pthread_cond_destroy(&q->bq_changed);
	memset(q, 0, sizeof *q);
}

mfs_ebatch_t *mfs_batchq_get(mfs_batchq_t *q)
{
	mfs_ebatch_t *b = NULL;
	pthread_mutex_lock(&q->bq_mu);
	if (q->bq_n_free)
		b = q->bq_free[--q->bq_n_free];
	pthread_mutex_unlock(&q->bq_mu);
	if (!b && (b = calloc(1, sizeof *b)))
		b->keep_free = q->bq_keep_free;
	return b;
}

/* absolute CLOCK_REALTIME deadline timeout_ms from now (pthread_cond_timedwait's clock) */
static struct timespec deadline(int timeout_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

int mfs_batchq_push(mfs_batchq_t *q, mfs_ebatch_t *b, int timeout_ms)
{
	struct timespec dl = deadline(timeout_ms);
	int rc = 0;
	pthread_mutex_lock(&q->bq_mu);
	while (q->bq_count == q->bq_cap && !q->bq_failed && rc == 0)
		rc = timeout_ms > 0 ? pthread_cond_timedwait(&q->bq_not_full, &q->bq_mu, &dl) : ETIMEDOUT;
	if (q->bq_failed) {
		rc = EPIPE;
	} else if (q->bq_count < q->bq_cap) {
		q->bq_q[(q->bq_head + q->bq_count) % q->bq_cap] = b;
		q->bq_count++;
		q->bq_pushed++;
		rc = 0;
		pthread_cond_signal(&q->bq_not_empty);
	} else {
		rc = ETIMEDOUT;
		q->bq_full_waits++;
	}
	pthread_mutex_unlock(&q->bq_mu);
	return rc;
}

int mfs_batchq_pop(mfs_batchq_t *q, int timeout_ms, mfs_ebatch_t **out)
{
	struct timespec dl = deadline(timeout_ms);
	int rc = 0;
	*out = NULL;
	pthread_mutex_lock(&q->bq_mu);
	while (q->bq_count == 0 && !q->bq_closed && rc == 0)
		rc = timeout_ms > 0 ? pthread_cond_timedwait(&q->bq_not_empty, &q->bq_mu, &dl) : ETIMEDOUT;
	if (q->bq_count) {
		*out = q->bq_q[q->bq_head];
		q->bq_head = (q->bq_head + 1) % q->bq_cap;
		q->bq_count--;
		q->bq_inflight++;
		rc = 0;
		pthread_cond_signal(&q->bq_not_full);
	} else {
		rc = q->bq_closed ? EPIPE : ETIMEDOUT;
	}
	pthread_mutex_unlock(&q->bq_mu);
	return rc;
}

mfs_ebatch_t *mfs_batchq_peek(mfs_batchq_t *q)
{
	pthread_mutex_lock(&q->bq_mu);
	mfs_ebatch_t *b = q->bq_count ? q->bq_q[q->bq_head] : NULL;
	pthread_mutex_unlock(&q->bq_mu);
	return b;
}

void mfs_batchq_release(mfs_batchq_t *q, mfs_ebatch_t *b)
{
	mfs_ebatch_clear(b);
	pthread_mutex_lock(&q->bq_mu);
	q->bq_inflight--;
	int kept = 0;
	if (q->bq_n_free < q->bq_cap + 2 &&
	    mfs_grow((void **)&q->bq_free, &q->bq_cap_free, q->bq_n_free + 1, sizeof *q->bq_free) == 0) {
		q->bq_free[q->bq_n_free++] = b;
		kept = 1;
	}
	pthread_mutex_unlock(&q->bq_mu);
	if (!kept)
		mfs_ebatch_free(b);
}

size_t mfs_batchq_fill(mfs_batchq_t *q)
{
	pthread_mutex_lock(&q->bq_mu);
	size_t n = q->bq_count;
	pthread_mutex_unlock(&q->bq_mu);
	return n;
}

uint64_t mfs_batchq_next_barrier(mfs_batchq_t *q)
{
	pthread_mutex_lock(&q->bq_mu);
	uint64_t g = ++q->bq_barrier_gen;
	pthread_mutex_unlock(&q->bq_mu);
	return g;
}

void mfs_batchq_barrier_done(mfs_batchq_t *q, uint64_t gen)
{
	pthread_mutex_lock(&q->bq_mu);
	if (gen > q->bq_barrier_done)
		q->bq_barrier_done = gen;
	pthread_cond_broadcast(&q->bq_changed);
	pthread_mutex_unlock(&q->bq_mu);
}

int mfs_batchq_wait_barrier(mfs_batchq_t *q, uint64_t gen)
{
	pthread_mutex_lock(&q->bq_mu);
	while (q->bq_barrier_done < gen && !q->bq_failed)
		pthread_cond_wait(&q->bq_changed, &q->bq_mu);
	int rc = q->bq_barrier_done >= gen ? 0 : EPIPE;
	pthread_mutex_unlock(&q->bq_mu);
	return rc;
}

void mfs_batchq_close(mfs_batchq_t *q)
{
	pthread_mutex_lock(&q->bq_mu);
	q->bq_closed = 1;
	pthread_cond_broadcast(&q->bq_not_empty);
	pthread_mutex_unlock(&q->bq_mu);
}

int mfs_batchq_failed(mfs_batchq_t *q)
{
	pthread_mutex_lock(&q->bq_mu);
	const int f = q->bq_failed;
	pthread_mutex_unlock(&q->bq_mu);
	return f;
}

void mfs_batchq_fail(mfs_batchq_t *q)
{
	pthread_mutex_lock(&q->bq_mu);
	q->bq_failed = 1;
	pthread_cond_broadcast(&q->bq_not_full);
	pthread_cond_broadcast(&q->bq_changed);
	pthread_mutex_unlock(&q->bq_mu);
}
