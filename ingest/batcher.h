/* batcher.h - batches of accepted events and the bounded ring between the Kafka consumer
 * thread and the learner thread (docs/STREAMING.md "Threads, ring and backpressure").
 *
 * A batch holds the decoded events of whole messages (never a part of one), the messages
 * themselves (string ids point into their payloads, so they live until the batch is applied),
 * the next offset of every partition the batch advances, and the rejections it saw. The ring
 * has a fixed number of slots: mfs_bring_push() fails with ETIMEDOUT when it is full, which
 * is the consumer's signal to pause its partitions (rd_kafka_pause_partitions). Batches are
 * recycled through a free list, so memory is bounded by (slots + 2) batches.
 *
 * Ordering: the ring is FIFO; a batch's effects (model rows, offsets, counters) are applied by
 * the learner in push order. A batch may carry a barrier (MFS_EBATCH_SNAPSHOT or _FINAL): the
 * learner applies it, publishes a snapshot, and bumps the ring's barrier generation, which
 * mfs_bring_wait_barrier() waits for.
 */
#ifndef MFS_BATCHER_H
#define MFS_BATCHER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "ingest/event.h"

enum { MFS_EBATCH_SNAPSHOT = 1, MFS_EBATCH_FINAL = 2 };

typedef struct mfs_ebatch_off {
	const char *topic; /* owned by the consumer side; lives as long as the service */
	int32_t partition;
	int64_t next;      /* next offset to consume once this batch is applied */
} mfs_ebatch_off_t;

typedef struct mfs_ebatch {
	mfs_event_t *ev;
	size_t n, cap;
	rd_kafka_message_t **msg; /* kept alive while ev points into them */
	size_t n_msg, cap_msg;
	mfs_ebatch_off_t *off;
	size_t n_off, cap_off;
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

/** Append the events of one message; b takes ownership of msg (NULL: nothing to keep). Adds
 * their digests to b->digest and, when holdout_fraction > 0, marks in b->held the events whose
 * mfs_event_holdout_u() is below it. */
int mfs_ebatch_add_events(mfs_ebatch_t *b, const mfs_event_t *ev, size_t n_ev, rd_kafka_message_t *msg,
                          double holdout_fraction);
/** Record that partition (topic, partition) continues at `next` once this batch is applied. */
int mfs_ebatch_advance(mfs_ebatch_t *b, const char *topic, int32_t partition, int64_t next);
/** Empty b (messages destroyed), keeping its arrays. */
void mfs_ebatch_clear(mfs_ebatch_t *b);
void mfs_ebatch_free(mfs_ebatch_t *b);
static inline int mfs_ebatch_empty(const mfs_ebatch_t *b)
{
	return b->n_off == 0 && b->n == 0 && b->barrier == 0;
}

typedef struct mfs_bring {
	pthread_mutex_t br_mu;
	pthread_cond_t br_not_empty, br_not_full, br_changed;
	mfs_ebatch_t **br_q;    /* cap slots, FIFO */
	size_t br_cap, br_head, br_count;
	mfs_ebatch_t **br_free; /* recycled batches */
	size_t br_n_free, br_cap_free;
	size_t br_inflight;     /* popped, not yet released */
	uint64_t br_barrier_gen, br_barrier_done;
	int br_closed;          /* the consumer side will push nothing more */
	int br_failed;          /* the learner stopped (error): pushes fail with EPIPE */
	uint64_t br_pushed, br_full_waits;
} mfs_bring_t;

/** @return 0, ENOMEM, or a pthread error. */
int mfs_bring_init(mfs_bring_t *r, size_t slots);
void mfs_bring_destroy(mfs_bring_t *r);
/** An empty batch to fill (recycled or new). @return NULL on ENOMEM. */
mfs_ebatch_t *mfs_bring_get(mfs_bring_t *r);
/** Queue b; wait at most timeout_ms for a free slot. On success the ring owns b.
 *  @return 0, ETIMEDOUT (full: b is still the caller's), EPIPE (the learner failed). */
int mfs_bring_push(mfs_bring_t *r, mfs_ebatch_t *b, int timeout_ms);
/** Take the oldest batch; wait at most timeout_ms. @return 0, ETIMEDOUT, EPIPE (closed and empty). */
int mfs_bring_pop(mfs_bring_t *r, int timeout_ms, mfs_ebatch_t **out);
/** The learner is done with b (it is cleared and recycled). */
void mfs_bring_release(mfs_bring_t *r, mfs_ebatch_t *b);
/** Batches queued (not counting the one being applied). */
size_t mfs_bring_fill(mfs_bring_t *r);
/** A new barrier generation number for a batch about to be pushed. */
uint64_t mfs_bring_next_barrier(mfs_bring_t *r);
/** Learner side: barrier `gen` is done (its snapshot is published or failed). */
void mfs_bring_barrier_done(mfs_bring_t *r, uint64_t gen);
/** Wait until barrier `gen` is done. @return 0, or EPIPE if the learner failed first. */
int mfs_bring_wait_barrier(mfs_bring_t *r, uint64_t gen);
/** No more pushes: a pop on an empty ring returns EPIPE. */
void mfs_bring_close(mfs_bring_t *r);
/** Learner side: it has stopped on an error; wake and fail every waiter. */
void mfs_bring_fail(mfs_bring_t *r);

#endif
