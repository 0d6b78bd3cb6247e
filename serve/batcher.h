/* batcher.h - batches of accepted events and the bounded queue between the consumer thread
 * and the learner thread (docs/STREAMING.md "Threads, queue and backpressure").
 *
 * A batch holds the decoded events of whole messages (never a part of one), what their string
 * ids point into (the messages: kept alive until the batch is applied, then released with the
 * queue's keep_free), the create time of each message, the next offset of every partition the
 * batch advances, and the rejections it saw. No Kafka type appears here: the learner takes
 * batches from anyone (the consumer, a test). The queue has a fixed number of slots:
 * mfs_batchq_push() fails with ETIMEDOUT when it is full, which is the consumer's signal to
 * pause its partitions. Batches are recycled through a free list, so memory is bounded by
 * (slots + 2) batches.
 *
 * Ordering: the queue is FIFO; a batch's effects (model rows, offsets, counters) are applied
 * by the learner in push order. A batch may carry a barrier (MFS_EBATCH_SNAPSHOT or _FINAL):
 * the learner applies it, publishes a snapshot, and bumps the queue's barrier generation,
 * which mfs_batchq_wait_barrier() waits for.
 */
#ifndef MFS_BATCHER_H
#define MFS_BATCHER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/offsets.h"
#include "ingest/event.h"

enum { MFS_EBATCH_SNAPSHOT = 1, MFS_EBATCH_FINAL = 2 };

/** Releases what a batch kept alive (the consumer's: a Kafka message). */
typedef void (*mfs_keep_free_fn)(void *keep);

typedef struct mfs_ebatch {
	mfs_event_t *ev;      /* the ratings */
	size_t n, cap;
	mfs_event_t *del;     /* deletions (op != MFS_OP_RATE) in stream order; del_at[j]: the ratings
	                         before deletion j (it applies between ev[del_at[j] - 1] and ev[del_at[j]]) */
	size_t *del_at;
	size_t n_del, cap_del, cap_del_at;
	void **keep;          /* what ev's string ids point into; released when the batch is cleared */
	size_t n_keep, cap_keep;
	mfs_keep_free_fn keep_free;
	int64_t *ts;          /* create time (ms since the epoch) of each message that has one */
	size_t n_ts, cap_ts;
	mfs_offset_t *off;    /* next: the next offset to consume once this batch is applied; topic
	                         strings are the producer side's and outlive the batch */
	size_t n_off, cap_off;
	mfs_offset_t *reset;  /* partitions started again at `next` (serve.offset_mismatch=reset): the
	                         learner takes these as they are, before off's (which only advance) */
	size_t n_reset, cap_reset;
	uint64_t rejected[MFS_REJ__COUNT];
	/* computed by the consumer thread as events are added, so the learner does not hash: */
	uint64_t digest;    /* sum mod 2^64 of mfs_event_digest() of ev[0..n) */
	uint8_t *held;      /* held[j]: ev[j] is held out (serve.holdout_fraction); NULL while none can be */
	size_t cap_held;
	uint64_t messages;  /* messages covered (accepted + rejected) */
	double t_first;     /* mfs_now_s() when the first message entered the batch */
	int barrier;        /* 0, MFS_EBATCH_SNAPSHOT or MFS_EBATCH_FINAL */
	uint64_t barrier_gen;
} mfs_ebatch_t;

/** Append the events of one message created at ts_ms (<= 0: unknown), ratings to ev and
 * deletions to del at their place among them; b takes ownership of
 * keep (what their string ids point into; NULL: nothing). Adds their digests to b->digest
 * and, when holdout_fraction > 0, marks in b->held the events whose mfs_event_holdout_u() is
 * below it. @return 0 or ENOMEM (keep is still the caller's). */
int mfs_ebatch_add_events(mfs_ebatch_t *b, const mfs_event_t *ev, size_t n_ev, void *keep, int64_t ts_ms,
                          double holdout_fraction);
/** Record that partition (topic, partition) continues at `next` once this batch is applied. */
int mfs_ebatch_advance(mfs_ebatch_t *b, const char *topic, int32_t partition, int64_t next);
/** Record that partition (topic, partition) starts again at `next`, below where it was. */
int mfs_ebatch_reset(mfs_ebatch_t *b, const char *topic, int32_t partition, int64_t next);
/** Empty b (what it kept released), keeping its arrays. */
void mfs_ebatch_clear(mfs_ebatch_t *b);
void mfs_ebatch_free(mfs_ebatch_t *b);
static inline int mfs_ebatch_empty(const mfs_ebatch_t *b)
{
	return b->n_off == 0 && b->n_reset == 0 && b->n == 0 && b->n_del == 0 && b->barrier == 0;
}

typedef struct mfs_batchq {
	pthread_mutex_t bq_mu;
	pthread_cond_t bq_not_empty, bq_not_full, bq_changed;
	mfs_ebatch_t **bq_q;    /* cap slots, FIFO */
	size_t bq_cap, bq_head, bq_count;
	mfs_ebatch_t **bq_free; /* recycled batches */
	size_t bq_n_free, bq_cap_free;
	size_t bq_inflight;     /* popped, not yet released */
	uint64_t bq_barrier_gen, bq_barrier_done;
	int bq_closed;          /* the consumer side will push nothing more */
	int bq_failed;          /* the learner stopped (error): pushes fail with EPIPE */
	uint64_t bq_pushed, bq_full_waits;
	mfs_keep_free_fn bq_keep_free;
} mfs_batchq_t;

/** keep_free releases what batches keep alive (NULL: they keep nothing).
 *  @return 0, ENOMEM, or a pthread error. */
int mfs_batchq_init(mfs_batchq_t *q, size_t slots, mfs_keep_free_fn keep_free);
void mfs_batchq_destroy(mfs_batchq_t *q);
/** An empty batch to fill (recycled or new). @return NULL on ENOMEM. */
mfs_ebatch_t *mfs_batchq_get(mfs_batchq_t *q);
/** Queue b; wait at most timeout_ms for a free slot. On success the queue owns b.
 *  @return 0, ETIMEDOUT (full: b is still the caller's), EPIPE (the learner failed). */
int mfs_batchq_push(mfs_batchq_t *q, mfs_ebatch_t *b, int timeout_ms);
/** Take the oldest batch; wait at most timeout_ms. @return 0, ETIMEDOUT, EPIPE (closed and empty). */
int mfs_batchq_pop(mfs_batchq_t *q, int timeout_ms, mfs_ebatch_t **out);
/** The batch the next pop will return, left queued (NULL: none yet). Learner side only: the
 *  consumer never changes a queued batch, and only the learner pops, so it stays as it is and
 *  comes out of the next pop. */
mfs_ebatch_t *mfs_batchq_peek(mfs_batchq_t *q);
/** The learner is done with b (it is cleared and recycled). */
void mfs_batchq_release(mfs_batchq_t *q, mfs_ebatch_t *b);
/** Batches queued (not counting the one being applied). */
size_t mfs_batchq_fill(mfs_batchq_t *q);
/** 1 once the learner has failed (mfs_batchq_fail). */
int mfs_batchq_failed(mfs_batchq_t *q);
/** A new barrier generation number for a batch about to be pushed. */
uint64_t mfs_batchq_next_barrier(mfs_batchq_t *q);
/** Learner side: barrier `gen` is done (its snapshot is published or failed). */
void mfs_batchq_barrier_done(mfs_batchq_t *q, uint64_t gen);
/** Wait until barrier `gen` is done. @return 0, or EPIPE if the learner failed first. */
int mfs_batchq_wait_barrier(mfs_batchq_t *q, uint64_t gen);
/** No more pushes: a pop on an empty queue returns EPIPE. */
void mfs_batchq_close(mfs_batchq_t *q);
/** Learner side: it has stopped on an error; wake and fail every waiter. */
void mfs_batchq_fail(mfs_batchq_t *q);

#endif
