/* kafka_util.c - librdkafka configuration from mfs_conf_t, its logs in mfs_log, and the
 * embedded broker (librdkafka's mock cluster) behind a small handle.
 *
 * DESIGN: kafka.* keys are applied verbatim and in the order they were set, after any
 * defaults a caller supplies, so a user can override every default we choose (the
 * producer's lz4 and idempotence among them). librdkafka calls the log callback from its
 * own threads; mfs_log writes each line with one write(2), so lines never interleave.
 * The mock cluster needs an rd_kafka_t for its bookkeeping and runs its brokers on its
 * own thread; we give it a dedicated producer handle that never produces, so the cluster's
 * life is independent of the clients under test (a test can destroy and recreate its
 * producer while the cluster, and the data in it, stays).
 */
#include "ingest/kafka_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

struct mfs_mock_broker {
	rd_kafka_t *mb_rk;               /* the handle the cluster is attached to */
	rd_kafka_mock_cluster_t *mb_mc;
	int mb_brokers;
};

void mfs_kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	/* syslog levels: 0..3 emerg/alert/crit/err, 4 warning, 5 notice, 6 info, 7 debug.
	 * FAIL (a broker connection failed or dropped) is logged as an error by librdkafka but is
	 * retriable, and the same failure reaches the client as an error event, which serve's
	 * consumer and the producer log once in their own words: debug here. */
	int lv = level <= 3 ? MFS_LOG_ERROR : level == 4 ? MFS_LOG_WARN : level <= 6 ? MFS_LOG_INFO : MFS_LOG_DEBUG;
	if (fac && strcmp(fac, "FAIL") == 0) /* also an error event: serve says it once, in words */
		lv = MFS_LOG_DEBUG;
	if (lv < mfs_log_get_level())
		return;
	char qm[1024], qn[256];
	mfs_log(lv, "kafka", "msg=%s fac=%s client=%s", mfs_log_quote(qm, sizeof qm, buf ? buf : ""),
	        fac ? fac : "-", mfs_log_quote(qn, sizeof qn, rk ? rd_kafka_name(rk) : "-"));
}

int mfs_kafka_conf_has(const mfs_conf_t *c, const char *key)
{
	for (int i = 0; c && i < c->kafka_n; i++)
		if (strcmp(c->kafka_key[i], key) == 0)
			return 1;
	return 0;
}

int mfs_kafka_conf_new_with(const mfs_conf_t *c, const char *const *defaults, rd_kafka_conf_t **out,
                            char *errstr, size_t errstr_size)
{
	char why[512];
	*out = NULL;
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	if (!conf)
		return mfs_errf(errstr, errstr_size, ENOMEM, "rd_kafka_conf_new: out of memory");
	rd_kafka_conf_set_log_cb(conf, mfs_kafka_log_cb);
	for (size_t i = 0; defaults && defaults[i] && defaults[i + 1]; i += 2)
		if (rd_kafka_conf_set(conf, defaults[i], defaults[i + 1], why, sizeof why) != RD_KAFKA_CONF_OK) {
			rd_kafka_conf_destroy(conf);
			return mfs_errf(errstr, errstr_size, MFS_ECONFIG, "librdkafka default %s=%s: %s", defaults[i],
			                defaults[i + 1], why);
		}
	for (int i = 0; c && i < c->kafka_n; i++)
		if (rd_kafka_conf_set(conf, c->kafka_key[i], c->kafka_val[i], why, sizeof why) != RD_KAFKA_CONF_OK) {
			rd_kafka_conf_destroy(conf);
			return mfs_errf(errstr, errstr_size, MFS_ECONFIG, "config key \"kafka.%s\": %s", c->kafka_key[i],
			                why);
		}
	*out = conf;
	return 0;
}

int mfs_kafka_conf_new(const mfs_conf_t *c, rd_kafka_conf_t **out, char *errstr, size_t errstr_size)
{
	return mfs_kafka_conf_new_with(c, NULL, out, errstr, errstr_size);
}

/* ---- embedded broker ------------------------------------------------------------------ */

int mfs_mock_broker_open(int brokers, mfs_mock_broker_t **out, char *errstr, size_t errstr_size)
{
	*out = NULL;
	if (brokers < 1 || brokers > 64)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "embedded broker: %d brokers (want 1..64)", brokers);
	mfs_mock_broker_t *mb = calloc(1, sizeof *mb);
	if (!mb)
		return mfs_errf(errstr, errstr_size, ENOMEM, "embedded broker: out of memory");
	/* log_level 4: the handle never connects anywhere, its notices ("no bootstrap.servers")
	 * are noise; the brokers' warnings and errors still come through */
	static const char *const defaults[] = {"client.id", "mfs-embedded-broker", "log_level", "4", NULL};
	rd_kafka_conf_t *conf;
	int rc = mfs_kafka_conf_new_with(NULL, defaults, &conf, errstr, errstr_size);
	if (rc)
		goto fail;
	char why[512];
	mb->mb_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof why);
	if (!mb->mb_rk) {
		rd_kafka_conf_destroy(conf);
		rc = mfs_errf(errstr, errstr_size, MFS_EKAFKA, "embedded broker: rd_kafka_new: %s", why);
		goto fail;
	}
	mb->mb_mc = rd_kafka_mock_cluster_new(mb->mb_rk, brokers);
	if (!mb->mb_mc) {
		rc = mfs_errf(errstr, errstr_size, MFS_EKAFKA,
		              "embedded broker: rd_kafka_mock_cluster_new failed (no loopback port?)");
		goto fail;
	}
	mb->mb_brokers = brokers;
	mfs_info("kafka", "msg=\"embedded broker started\" brokers=%d bootstrap=%s", brokers,
	         rd_kafka_mock_cluster_bootstraps(mb->mb_mc));
	*out = mb;
	return 0;
fail:
	mfs_mock_broker_close(mb);
	return rc;
}

const char *mfs_mock_broker_bootstraps(const mfs_mock_broker_t *mb)
{
	return rd_kafka_mock_cluster_bootstraps(mb->mb_mc);
}

int mfs_mock_broker_create_topic(mfs_mock_broker_t *mb, const char *topic, int partitions, char *errstr,
                                 size_t errstr_size)
{
	if (!topic || !*topic || partitions < 1)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "embedded broker: topic \"%s\" with %d partitions",
		                topic ? topic : "", partitions);
	int rf = mb->mb_brokers < 3 ? mb->mb_brokers : 3;
	rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(mb->mb_mc, topic, partitions, rf);
	if (err)
		return mfs_errf(errstr, errstr_size, MFS_EKAFKA, "embedded broker: create topic %s: %s", topic,
		                rd_kafka_err2str(err));
	return 0;
}

rd_kafka_mock_cluster_t *mfs_mock_broker_cluster(mfs_mock_broker_t *mb) { return mb->mb_mc; }

int mfs_mock_broker_count(const mfs_mock_broker_t *mb) { return mb->mb_brokers; }

void mfs_mock_broker_close(mfs_mock_broker_t *mb)
{
	if (!mb)
		return;
	if (mb->mb_mc)
		rd_kafka_mock_cluster_destroy(mb->mb_mc);
	if (mb->mb_rk)
		rd_kafka_destroy(mb->mb_rk);
	free(mb);
}

const char *mfs_kafka_broker_choice_error(const mfs_conf_t *c, const char *brokers, int embedded)
{
	if (embedded && brokers)
		return "--brokers and --embedded-broker exclude each other";
	if (brokers && !*brokers)
		return "--brokers is empty: give HOST:PORT[,HOST:PORT...]";
	if (!embedded && !brokers && !mfs_kafka_conf_has(c, "bootstrap.servers") &&
	    !mfs_kafka_conf_has(c, "metadata.broker.list"))
		return "--brokers B (or kafka.bootstrap.servers) or --embedded-broker is required";
	return NULL;
}
