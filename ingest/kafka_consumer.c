/* kafka_consumer.c - see kafka_consumer.h. */
#include "ingest/kafka_consumer.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "ingest/kafka_util.h"

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
	const mfs_kafka_consumer_cbs_t *cbs = opaque;
	int coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
	if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
		for (int j = 0; j < parts->cnt; j++)
			parts->elems[j].offset = RD_KAFKA_OFFSET_BEGINNING;
		if (cbs->on_assign)
			cbs->on_assign(cbs->ctx, parts);
		for (int j = 0; j < parts->cnt; j++)
			mfs_info("kafka", "msg=assigned topic=%s partition=%d start_offset=%lld", parts->elems[j].topic,
			         (int)parts->elems[j].partition, (long long)parts->elems[j].offset);
		if (coop) {
			rd_kafka_error_t *e = rd_kafka_incremental_assign(rk, parts);
			if (e) {
				mfs_error("kafka", "msg=\"incremental assign failed\" err=\"%s\"", rd_kafka_error_string(e));
				rd_kafka_error_destroy(e);
			}
		} else {
			rd_kafka_resp_err_t e = rd_kafka_assign(rk, parts);
			if (e)
				mfs_error("kafka", "msg=\"assign failed\" err=\"%s\"", rd_kafka_err2str(e));
		}
	} else {
		const int lost = rd_kafka_assignment_lost(rk);
		mfs_info("kafka", "msg=revoked partitions=%d lost=%d", parts->cnt, lost);
		if (lost)
			mfs_warn("kafka", "msg=\"group session lost: partitions revoked\" partitions=%d detail=\"the broker was "
			                  "away past kafka.session.timeout.ms; the last snapshot is still served; consumption "
			                  "resumes on reassignment\"",
			         parts->cnt);
		if (cbs->on_revoke)
			cbs->on_revoke(cbs->ctx, parts);
		if (coop) {
			rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
			if (e)
				rd_kafka_error_destroy(e);
		} else {
			rd_kafka_assign(rk, NULL);
		}
	}
}

int mfs_kafka_consumer_open(const mfs_conf_t *c, const char *brokers, int mock, char *const *topics,
                            size_t n_topics, const mfs_kafka_consumer_cbs_t *cbs, rd_kafka_t **out, char *errstr,
                            size_t es)
{
	/* librdkafka's mock cluster holds a fetch for the whole fetch.wait.max.ms (500) when a
	 * partition has nothing, instead of answering when data arrives, and some of its answers
	 * cost the consumer a fetch.error.backoff.ms (500) pause. Measured, 50 K events/s, 250 ms
	 * snapshots: event -> snapshot p50/p99 419/718 ms with the defaults, 172/299 ms with 20/10
	 * ms. Real Kafka answers a long poll when data arrives, so only the mock gets them; like
	 * every default here, kafka.* settings of the user win. */
	/* a real cluster's list ends at the NULL before the fetch settings */
	const char *const defaults[] = {"group.id", "mfstream", "auto.offset.reset", "earliest",
	                                "enable.partition.eof", "false", mock ? "fetch.wait.max.ms" : NULL, "20",
	                                "fetch.error.backoff.ms", "10", NULL};
	rd_kafka_conf_t *kc = NULL;
	char e[512];
	int rc;
	*out = NULL;
	if (n_topics == 0)
		return mfs_errf(errstr, es, MFS_EINVAL, "no topic to consume");
	if ((rc = mfs_kafka_conf_new_with(c, defaults, &kc, errstr, es)))
		return rc;
	/* forced: offsets are committed by the service only for what a snapshot covers; with
	 * serve.exit_at_end the service needs to hear of each partition's end */
	if ((brokers && *brokers && rd_kafka_conf_set(kc, "bootstrap.servers", brokers, e, sizeof e)) ||
	    rd_kafka_conf_set(kc, "enable.auto.commit", "false", e, sizeof e) ||
	    rd_kafka_conf_set(kc, "enable.auto.offset.store", "false", e, sizeof e) ||
	    (c && c->serve_exit_at_end && rd_kafka_conf_set(kc, "enable.partition.eof", "true", e, sizeof e))) {
		rd_kafka_conf_destroy(kc);
		return mfs_errf(errstr, es, MFS_ECONFIG, "%s", e);
	}
	rd_kafka_conf_set_rebalance_cb(kc, rebalance_cb);
	rd_kafka_conf_set_opaque(kc, (void *)(uintptr_t)cbs);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, e, sizeof e);
	if (!rk) {
		rd_kafka_conf_destroy(kc);
		return mfs_errf(errstr, es, MFS_EKAFKA, "consumer: %s", e);
	}
	rd_kafka_poll_set_consumer(rk);
	rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new((int)n_topics);
	for (size_t j = 0; j < n_topics; j++)
		rd_kafka_topic_partition_list_add(sub, topics[j], RD_KAFKA_PARTITION_UA);
	rd_kafka_resp_err_t ke = rd_kafka_subscribe(rk, sub);
	rd_kafka_topic_partition_list_destroy(sub);
	if (ke) {
		rd_kafka_destroy(rk);
		return mfs_errf(errstr, es, MFS_EKAFKA, "subscribe: %s", rd_kafka_err2str(ke));
	}
	*out = rk;
	return 0;
}
