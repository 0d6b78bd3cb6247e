/* producer.h - rating events into Kafka as batched MessagePack messages (`mfstream produce`).
 *
 * Message layout (docs/PRODUCER.md): the value is an array of up to `batch` events (map or,
 * with compact, [u, i, r, t] form; batch 1 sends single events, not arrays of one). Every
 * event of a message belongs to the same partition: partition = murmur2(text of user id) %
 * partitions, the hash of Kafka's Java default partitioner; the key is the text of the
 * first event's user, so the key hashes to the message's partition too. Per partition,
 * messages keep the order of the events handed in (idempotent producer).
 */
#ifndef MFS_PRODUCER_H
#define MFS_PRODUCER_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "config/config.h"
#include "ingest/event.h"
#include "ingest/event_source.h"
#include "model_store/store.h"

#define MFS_PRODUCER_BATCH_MAX 100000
/* A pending batch is sent early when its encoding reaches this many bytes, well below
 * Kafka's default message.max.bytes (1 MB). */
#define MFS_PRODUCER_MSG_SOFT_MAX (512 * 1024)

typedef struct mfs_producer_opts {
	const char *brokers;     /* bootstrap.servers; NULL or "" = kafka.bootstrap.servers */
	const char *topic;
	int partitions;          /* 0 = the topic's count from metadata; else it must match */
	size_t batch;            /* events per message, 1..MFS_PRODUCER_BATCH_MAX */
	int compact;             /* [u, i, r, t] events instead of maps */
	double rate;             /* events/s (token bucket); 0 = as fast as possible */
	int linger_ms;           /* a partial batch older than this is sent (rate-limited runs); 0 = 100 */
	int metadata_timeout_ms; /* how long to wait for the topic's metadata; 0 = 10000 */
} mfs_producer_opts_t;

typedef struct mfs_producer_stats {
	uint64_t events, messages, bytes;                /* delivered: acknowledged by the broker */
	uint64_t events_sent, messages_sent, bytes_sent; /* handed to librdkafka */
	uint64_t events_failed, messages_failed;         /* delivery reports with an error */
	double seconds;                                  /* since open */
	char first_error[256];                           /* the first delivery or fatal error */
} mfs_producer_stats_t;

typedef struct mfs_producer mfs_producer_t;

/** Connect: a librdkafka producer from c's kafka.* keys over our defaults
 *  (compression.codec=zstd, enable.idempotence=true), then the topic's metadata.
 *  @return 0, MFS_EINVAL (bad opts), MFS_ECONFIG (a kafka.* key), ENOMEM, or MFS_EKAFKA
 *  (no metadata, unknown topic, partition count mismatch); errstr says which. */
int mfs_producer_open(const mfs_conf_t *c, const mfs_producer_opts_t *o, mfs_producer_t **out, char *errstr,
                      size_t errstr_size);

/** Add one event to its partition's pending batch; a full batch is sent. Applies the rate
 *  limit, serves delivery reports. The event's string ids are copied (encoded) at once.
 *  @return 0, ENOMEM, MFS_EKAFKA (a message was not delivered, or librdkafka failed
 *  fatally: stop), MFS_EIDLEN. */
int mfs_producer_send(mfs_producer_t *p, const mfs_event_t *ev);

/** Send every pending batch and wait until all messages are delivered or failed (librdkafka
 *  fails a message after message.timeout.ms). @return 0, or MFS_EKAFKA with errstr naming
 *  how many messages and events were lost and the first error. */
int mfs_producer_flush(mfs_producer_t *p, char *errstr, size_t errstr_size);

void mfs_producer_get_stats(const mfs_producer_t *p, mfs_producer_stats_t *st);
/** The topic's partition count (what events are spread over). */
int mfs_producer_partitions(const mfs_producer_t *p);
/** The underlying librdkafka handle (tests, metrics). */
rd_kafka_t *mfs_producer_handle(mfs_producer_t *p);
/** Destroy the producer; messages not flushed are purged. NULL is fine. */
void mfs_producer_close(mfs_producer_t *p);

/** The partition of user among n: Kafka's murmur2 (Java default partitioner) of the id's
 *  text form (mfs_id_format), positive part, modulo n. */
int32_t mfs_producer_partition_of(const mfs_id_t *user, int32_t n);
/** Kafka's murmur2 of len bytes (seed 0x9747b28c). */
uint32_t mfs_murmur2(const void *data, size_t len);

/** Progress callback of mfs_produce_run; non-zero stops the run (that value is returned). */
typedef int (*mfs_produce_progress_cb)(void *ctx, const mfs_producer_stats_t *st);

/** The producing loop of `mfstream produce`: every event of src into p, then flush.
 *  cb (may be NULL) is called every progress_every events (0 = never).
 *  @return 0, cb's value (after a flush of what was sent), or send/flush's codes. */
int mfs_produce_run(mfs_producer_t *p, mfs_evsrc_t *src, uint64_t progress_every, mfs_produce_progress_cb cb,
                    void *ctx, char *errstr, size_t errstr_size);

#endif
