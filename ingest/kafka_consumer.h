/* kafka_consumer.h - the consumer-group side of `mfstream serve` (docs/STREAMING.md).
 *
 * A librdkafka high-level consumer subscribed to one or more topics with
 * enable.auto.commit=false and enable.auto.offset.store=false (forced: the service commits
 * only offsets that a published snapshot covers). Where each assigned partition starts is NOT
 * the group's committed offset: the rebalance callback asks the owner (on_assign), which
 * fills in the next offset stored in its snapshot, or leaves RD_KAFKA_OFFSET_BEGINNING (and
 * auto.offset.reset=earliest). Before partitions are taken away, on_revoke lets the owner
 * apply what it has and publish a snapshot. Eager and cooperative protocols are both handled.
 */
#ifndef MFS_KAFKA_CONSUMER_H
#define MFS_KAFKA_CONSUMER_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "config/config.h"

typedef struct mfs_kafka_consumer_cbs {
	void *ctx;
	/** Partitions are being assigned: set each element's offset (default: beginning). */
	void (*on_assign)(void *ctx, rd_kafka_topic_partition_list_t *parts);
	/** Partitions are being revoked (or lost): apply and snapshot before they go. */
	void (*on_revoke)(void *ctx, const rd_kafka_topic_partition_list_t *parts);
} mfs_kafka_consumer_cbs_t;

/** Create the consumer (kafka.* keys of c over our defaults: group.id=mfstream,
 *  auto.offset.reset=earliest; with mock != 0 also short fetch waits, see kafka_consumer.c)
 *  and subscribe to topics.
 *  brokers: bootstrap.servers override (NULL or "": kafka.bootstrap.servers).
 *  mock: the brokers are librdkafka's mock cluster (the embedded broker).
 *  @return 0, MFS_ECONFIG, MFS_EKAFKA, ENOMEM (errstr says why). */
int mfs_kafka_consumer_open(const mfs_conf_t *c, const char *brokers, int mock, char *const *topics,
                            size_t n_topics, const mfs_kafka_consumer_cbs_t *cbs, rd_kafka_t **out, char *errstr,
                            size_t errstr_size);

#endif
