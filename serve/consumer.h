/* consumer.h - the consumer thread of `mfstream serve` (docs/STREAMING.md): Kafka -> batches.
 *
 * It polls the consumer group (ingest/kafka_consumer.h), decodes and validates each message
 * (ingest/event.h: rejections are counted, logged at a bounded rate and copied to the
 * dead-letter topic), and fills batches of whole messages that it pushes into the queue
 * (serve/batcher.h) for the learner. It tracks the next offset to take in per partition and
 * resumes each assigned partition at the offset the loaded snapshot stores. It also commits,
 * for the learner, the offsets of each published snapshot (mfs_consumer_commit).
 */
#ifndef MFS_CONSUMER_H
#define MFS_CONSUMER_H

#include <stddef.h>
#include <stdint.h>

#include "common/offsets.h"
#include "config/config.h"
#include "ops/catalog.h"
#include "ops/http.h"
#include "serve/batcher.h"
#include "snapshots/snap_load.h"

typedef struct mfs_consumer mfs_consumer_t;

typedef struct mfs_consumer_opts {
	const char *brokers;  /* bootstrap.servers override (NULL: kafka.bootstrap.servers) */
	char *const *topics;  /* topics to consume */
	size_t n_topics;
	int embedded;         /* the broker is librdkafka's mock cluster (--embedded-broker) */
	mfs_batchq_t *queue;  /* where batches go */
	const mfs_snap_loaded_t *loaded; /* the offsets to resume at */
	mfs_catalog_t *cat;   /* metrics */
	mfs_http_t *http;     /* readiness (NULL: no server) */
} mfs_consumer_opts_t;

/** Open the group consumer (and the dead-letter producer when serve.dead_letter_topic is set).
 *  @return 0, MFS_ECONFIG, MFS_EKAFKA, ENOMEM (errstr says why). */
int mfs_consumer_open(const mfs_conf_t *c, const mfs_consumer_opts_t *o, mfs_consumer_t **out, char *errstr,
                      size_t errstr_size);
/** One turn of the loop: hand a sealed batch over (pausing the partitions while the queue is
 *  full, resuming once it is half empty), poll one message into the batch, seal the batch when
 *  it is full, lingered or the learner is idle. @return 0, or the error that stops the
 *  service (EPIPE: the learner failed; its error is the cause). */
int mfs_consumer_step(mfs_consumer_t *s);
/** serve.exit_at_end: something is assigned and every assigned partition is at its end. */
int mfs_consumer_all_at_end(const mfs_consumer_t *s);
/** Push what was polled with a barrier of kind MFS_EBATCH_SNAPSHOT or _FINAL and wait until
 *  the learner has published the snapshot after it. @return 0, EPIPE (the learner failed), ENOMEM. */
int mfs_consumer_barrier(mfs_consumer_t *s, int kind);
/** The learner will take no more batches (a final barrier or a failure): a revocation then
 *  publishes nothing. */
void mfs_consumer_learner_done(mfs_consumer_t *s);
/** Why the last step failed ("" when it said only the code). */
const char *mfs_consumer_error(const mfs_consumer_t *s);
/** The queue's keep_free: releases a message a batch kept alive. */
void mfs_consumer_keep_free(void *msg);
/** The learner's mfs_commit_fn (ctx: the consumer): commit offsets to the group. */
int mfs_consumer_commit(void *ctx, const mfs_offset_t *offs, size_t n, int sync);
/** Leave the group (a revocation here has nothing left to publish) and flush the dead-letter
 *  producer. */
void mfs_consumer_close(mfs_consumer_t *s);
/** Messages taken in and partition pauses since open, and the partitions it has known (assigned
 *  now or before, or named by the loaded snapshot). */
void mfs_consumer_counts(const mfs_consumer_t *s, uint64_t *messages, uint64_t *pauses, size_t *partitions_known);
/** Free the batch being filled, destroy the client handles (waiting at most serve.kafka_close_ms
 *  for each: an unreachable broker can make librdkafka wait forever; the error log says so) and
 *  free s.
 *  Call it after the learner has stopped and the queue is destroyed: every message a batch
 *  kept must be released before its handle goes. */
void mfs_consumer_free(mfs_consumer_t *s);

#endif
