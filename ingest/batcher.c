/* batcher.c - see batcher.h.
 *
 * DESIGN: one mutex and three condition variables; the ring moves pointers to batches, never
 * events, and is touched once per batch (thousands of events), so a lock costs nothing
 * measurable. Memory: at most cap queued + one being filled + one being applied batches exist
 * beyond the free list, and the free list only holds batches that were once in use.
 */
#include "ingest/batcher.h"

#include "common/grow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int mfs_ebatch_add_events(mfs_ebatch_t *b, const mfs_event_t *ev, size_t n_ev, rd_kafka_message_t *msg,
                          double holdout_fraction)
{
	if (mfs_grow((void **)&b->ev, &b->cap, b->n + n_ev, sizeof *b->ev) ||
	    mfs_grow((void **)&b->msg, &b->cap_msg, b->n_msg + 1, sizeof *b->msg) ||
	    (holdout_fraction > 0 && mfs_grow((void **)&b->held, &b->cap_held, b->n + n_ev, sizeof *b->held)))
		return ENOMEM;
	if (n_ev)
		memcpy(b->ev + b->n, ev, n_ev * sizeof *ev);
	for (size_t j = 0; j < n_ev; j++) {
		b->digest += mfs_event_digest(&ev[j]);
		if (holdout_fraction > 0)
			b->held[b->n + j] = mfs_event_holdout_u(&ev[j]) < holdout_fraction;
	}
	b->n += n_ev;
	if (msg)
		b->msg[b->n_msg++] = msg;
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
	b->off[b->n_off++] = (mfs_ebatch_off_t){topic, partition, next};
	return 0;
}

void mfs_ebatch_clear(mfs_ebatch_t *b)
{
	for (size_t j = 0; j < b->n_msg; j++)
		rd_kafka_message_destroy(b->msg[j]);
	b->n = b->n_msg = b->n_off = 0;
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
	free(b->held);
	free(b->msg);
	free(b->off);
	free(b);
}

int mfs_bring_init(mfs_bring_t *r, size_t slots)
{
	memset(r, 0, sizeof *r);
	if (slots < 1)
		slots = 1;
	if (!(r->br_q = calloc(slots, sizeof *r->br_q)))
		return ENOMEM;
	r->br_cap = slots;
	int rc;
	if ((rc = pthread_mutex_init(&r->br_mu, NULL)))
		return rc;
	pthread_cond_init(&r->br_not_empty, NULL);
	pthread_cond_init(&r->br_not_full, NULL);
	pthread_cond_init(&r->br_changed, NULL);
	return 0;
}

void mfs_bring_destroy(mfs_bring_t *r)
{
	if (!r->br_q)
		return;
	for (size_t j = 0; j < r->br_count; j++)
		mfs_ebatch_free(r->br_q[(r->br_head + j) % r->br_cap]);
	for (size_t j = 0; j < r->br_n_free; j++)
		mfs_ebatch_free(r->br_free[j]);
	free(r->br_q);
	free(r->br_free);
	pthread_mutex_destroy(&r->br_mu);
	pthread_cond_destroy(&r->br_not_empty);
	pthread_cond_destroy(&r->br_not_full);
	pthread_cond_destroy(&r->br_changed);
	memset(r, 0, sizeof *r);
}

mfs_ebatch_t *mfs_bring_get(mfs_bring_t *r)
{
	mfs_ebatch_t *b = NULL;
	pthread_mutex_lock(&r->br_mu);
	if (r->br_n_free)
		b = r->br_free[--r->br_n_free];
	pthread_mutex_unlock(&r->br_mu);
	return b ? b : calloc(1, sizeof *b);
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

int mfs_bring_push(mfs_bring_t *r, mfs_ebatch_t *b, int timeout_ms)
{
	struct timespec dl = deadline(timeout_ms);
	int rc = 0;
	pthread_mutex_lock(&r->br_mu);
	while (r->br_count == r->br_cap && !r->br_failed && rc == 0)
		rc = timeout_ms > 0 ? pthread_cond_timedwait(&r->br_not_full, &r->br_mu, &dl) : ETIMEDOUT;
	if (r->br_failed) {
		rc = EPIPE;
	} else if (r->br_count < r->br_cap) {
		r->br_q[(r->br_head + r->br_count) % r->br_cap] = b;
		r->br_count++;
		r->br_pushed++;
		rc = 0;
		pthread_cond_signal(&r->br_not_empty);
	} else {
		rc = ETIMEDOUT;
		r->br_full_waits++;
	}
	pthread_mutex_unlock(&r->br_mu);
	return rc;
}

int mfs_bring_pop(mfs_bring_t *r, int timeout_ms, mfs_ebatch_t **out)
{
	struct timespec dl = deadline(timeout_ms);
	int rc = 0;
	*out = NULL;
	pthread_mutex_lock(&r->br_mu);
	while (r->br_count == 0 && !r->br_closed && rc == 0)
		rc = timeout_ms > 0 ? pthread_cond_timedwait(&r->br_not_empty, &r->br_mu, &dl) : ETIMEDOUT;
	if (r->br_count) {
		*out = r->br_q[r->br_head];
		r->br_head = (r->br_head + 1) % r->br_cap;
		r->br_count--;
		r->br_inflight++;
		rc = 0;
		pthread_cond_signal(&r->br_not_full);
	} else {
		rc = r->br_closed ? EPIPE : ETIMEDOUT;
	}
	pthread_mutex_unlock(&r->br_mu);
	return rc;
}

void mfs_bring_release(mfs_bring_t *r, mfs_ebatch_t *b)
{
	mfs_ebatch_clear(b);
	pthread_mutex_lock(&r->br_mu);
	r->br_inflight--;
	int kept = 0;
	if (r->br_n_free < r->br_cap + 2 &&
	    mfs_grow((void **)&r->br_free, &r->br_cap_free, r->br_n_free + 1, sizeof *r->br_free) == 0) {
		r->br_free[r->br_n_free++] = b;
		kept = 1;
	}
	pthread_mutex_unlock(&r->br_mu);
	if (!kept)
		mfs_ebatch_free(b);
}

size_t mfs_bring_fill(mfs_bring_t *r)
{
	pthread_mutex_lock(&r->br_mu);
	size_t n = r->br_count;
	pthread_mutex_unlock(&r->br_mu);
	return n;
}

uint64_t mfs_bring_next_barrier(mfs_bring_t *r)
{
	pthread_mutex_lock(&r->br_mu);
	uint64_t g = ++r->br_barrier_gen;
	pthread_mutex_unlock(&r->br_mu);
	return g;
}

void mfs_bring_barrier_done(mfs_bring_t *r, uint64_t gen)
{
	pthread_mutex_lock(&r->br_mu);
	if (gen > r->br_barrier_done)
		r->br_barrier_done = gen;
	pthread_cond_broadcast(&r->br_changed);
	pthread_mutex_unlock(&r->br_mu);
}

int mfs_bring_wait_barrier(mfs_bring_t *r, uint64_t gen)
{
	pthread_mutex_lock(&r->br_mu);
	while (r->br_barrier_done < gen && !r->br_failed)
		pthread_cond_wait(&r->br_changed, &r->br_mu);
	int rc = r->br_barrier_done >= gen ? 0 : EPIPE;
	pthread_mutex_unlock(&r->br_mu);
	return rc;
}

void mfs_bring_close(mfs_bring_t *r)
{
	pthread_mutex_lock(&r->br_mu);
	r->br_closed = 1;
	pthread_cond_broadcast(&r->br_not_empty);
	pthread_mutex_unlock(&r->br_mu);
}

void mfs_bring_fail(mfs_bring_t *r)
{
	pthread_mutex_lock(&r->br_mu);
	r->br_failed = 1;
	pthread_cond_broadcast(&r->br_not_full);
	pthread_cond_broadcast(&r->br_changed);
	pthread_mutex_unlock(&r->br_mu);
}
