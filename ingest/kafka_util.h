/* kafka_util.h - librdkafka plumbing shared by the producer and the consumer: configuration
 * from mfs_conf_t (kafka.* keys verbatim), logs routed into mfs_log, and the embedded broker
 * (librdkafka's in-process mock cluster) for demos and integration tests.
 */
#ifndef MFS_KAFKA_UTIL_H
#define MFS_KAFKA_UTIL_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "config/config.h"

/** A librdkafka configuration: the log callback (librdkafka lines become mfs_log lines with
 *  mod=kafka, syslog level mapped to ours), then every kafka.* key of c, in the order set,
 *  through rd_kafka_conf_set.
 *  @param[in] c        the configuration (NULL: no kafka.* keys)
 *  @param[out] out     the new conf (the caller owns it until rd_kafka_new takes it)
 *  @return 0, ENOMEM, or MFS_ECONFIG with errstr naming the key and librdkafka's reason. */
int mfs_kafka_conf_new(const mfs_conf_t *c, rd_kafka_conf_t **out, char *errstr, size_t errstr_size);

/** Like mfs_kafka_conf_new, with defaults applied first so that the user's kafka.* keys
 *  override them: defaults is {"key", "value", ..., NULL} (NULL: none).
 *  @return 0, ENOMEM or MFS_ECONFIG (a default that librdkafka rejects names its key too). */
int mfs_kafka_conf_new_with(const mfs_conf_t *c, const char *const *defaults, rd_kafka_conf_t **out,
                            char *errstr, size_t errstr_size);

/** Did the user set librdkafka property key (without "kafka.") in c? */
int mfs_kafka_conf_has(const mfs_conf_t *c, const char *key);
/** The broker choice of a command (--brokers B, kafka.bootstrap.servers, or --embedded-broker):
 *  NULL when it is valid, else the usage message to print. */
const char *mfs_kafka_broker_choice_error(const mfs_conf_t *c, const char *brokers, int embedded);

/** The route of librdkafka logs into mfs_log (set by mfs_kafka_conf_new; exposed for confs
 *  made elsewhere). */
void mfs_kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf);

/* ---- the embedded broker ------------------------------------------------------------- */

/** An in-process Kafka cluster (rd_kafka_mock_cluster_t on a dedicated rd_kafka_t handle).
 *  It speaks the Kafka protocol on 127.0.0.1 ephemeral ports, so any client (ours, kcat)
 *  can use its bootstrap list. Limits: about 5 MiB kept per partition (older data is
 *  dropped silently), no persistence, no CreateTopics admin API (use create_topic).
 *  Not thread-safe: one owner opens, configures and closes it. */
typedef struct mfs_mock_broker mfs_mock_broker_t;

/** Start a cluster of `brokers` brokers (ids 1..brokers).
 *  @return 0, MFS_EINVAL (brokers < 1), ENOMEM or MFS_EKAFKA (errstr says why). */
int mfs_mock_broker_open(int brokers, mfs_mock_broker_t **out, char *errstr, size_t errstr_size);

/** "127.0.0.1:port,..." for bootstrap.servers; valid until close. */
const char *mfs_mock_broker_bootstraps(const mfs_mock_broker_t *mb);

/** Create topic with `partitions` partitions, replication factor min(3, brokers); leaders
 *  are spread over the brokers. @return 0, MFS_EINVAL or MFS_EKAFKA. */
int mfs_mock_broker_create_topic(mfs_mock_broker_t *mb, const char *topic, int partitions, char *errstr,
                                 size_t errstr_size);

/** The underlying cluster, for fault injection (rd_kafka_mock_push_request_errors,
 *  rd_kafka_mock_broker_set_down, rd_kafka_mock_partition_set_leader, ...). */
rd_kafka_mock_cluster_t *mfs_mock_broker_cluster(mfs_mock_broker_t *mb);

/** Number of brokers. */
int mfs_mock_broker_count(const mfs_mock_broker_t *mb);

/** Stop the cluster and free it (NULL is fine). Clients still connected see it go away. */
void mfs_mock_broker_close(mfs_mock_broker_t *mb);

#endif
