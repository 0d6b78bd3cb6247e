/* serve_help.h - shared by test_serve_mock.c and test_serve_kill9.c: feed a mock-broker topic,
 * run `mfstream serve` as a child process, and read what its snapshot says. */
#ifndef MFS_SERVE_HELP_H
#define MFS_SERVE_HELP_H

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#include "common/err.h"
#include "common/timeutil.h"
#include "ingest/event.h"
#include "ingest/event_source.h"
#include "ingest/kafka_util.h"
#include "ingest/producer.h"
#include "snapshots/reader/mfs_snap.h"
#include "testhelp.h"

#define SH_MAX_PARTS 16

/* One invalid message per rejection reason (rating range 0.5..5), built by hand. */
static const struct {
	const char *bytes;
	size_t len;
	int reason;
} sh_bad[] = {
	{"\xc1", 1, MFS_REJ_NOT_MSGPACK},
	{"\x05", 1, MFS_REJ_WRONG_TYPE},
	{"\x80", 1, MFS_REJ_MISSING_FIELD},
	{"\x93\x01\x02\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", 12, MFS_REJ_NAN},
	{"\x93\x01\x02\x06", 4, MFS_REJ_RANGE},
	{"\x93\xa0\x02\x03", 4, MFS_REJ_ID_LEN},
	{"\x93\x01\x02\x03\x00", 5, MFS_REJ_TRAILING},
	{"\x90", 1, MFS_REJ_EMPTY},
};
#define SH_N_BAD (sizeof sh_bad / sizeof sh_bad[0])

/* n synthetic events (seed) into topic through mfs_produce_run. @return events delivered. */
static uint64_t sh_produce_valid(const char *bootstraps, const char *topic, long n, long seed)
{
	mfs_conf_t c;
	char e[512], v[32];
	if (mfs_conf_init(&c))
		exit(2);
	snprintf(v, sizeof v, "%ld", n);
	TEST_OK(mfs_conf_set(&c, "gen.ratings", v, e, sizeof e));
	snprintf(v, sizeof v, "%ld", seed);
	TEST_OK(mfs_conf_set(&c, "gen.seed", v, e, sizeof e));
	TEST_OK(mfs_conf_set(&c, "gen.users", "3000", e, sizeof e));
	TEST_OK(mfs_conf_set(&c, "gen.items", "1500", e, sizeof e));
	TEST_OK(mfs_conf_set(&c, "gen.zipf", "0.8", e, sizeof e));
	mfs_evsrc_t *src = NULL;
	mfs_producer_t *p = NULL;
	uint64_t got = 0;
	TEST_OK(mfs_evsrc_open_synth(&c, &src, e, sizeof e));
	mfs_producer_opts_t po = {.brokers = bootstraps, .topic = topic, .batch = 100};
	int rc = mfs_producer_open(&c, &po, &p, e, sizeof e);
	TEST_ASSERT_MSG(rc == 0, "%s", e);
	if (rc == 0 && src) {
		rc = mfs_produce_run(p, src, 0, NULL, NULL, e, sizeof e);
		TEST_ASSERT_MSG(rc == 0, "%s", e);
		mfs_producer_stats_t st;
		mfs_producer_get_stats(p, &st);
		got = st.events;
	}
	mfs_producer_close(p);
	mfs_evsrc_close(src);
	mfs_conf_free(&c);
	return got;
}

/* Every sh_bad message once, spread over the partitions; checks the decoder agrees first. */
static void sh_produce_bad(const char *bootstraps, const char *topic, int parts)
{
	char e[512];
	mfs_event_opts_t eo = {0.5, 5.0, 0};
	mfs_events_t evs = {0};
	for (size_t j = 0; j < SH_N_BAD; j++) {
		int reason = -1;
		long idx;
		char d[256];
		int rc = mfs_event_decode(sh_bad[j].bytes, sh_bad[j].len, &eo, &evs, &reason, &idx, d, sizeof d);
		TEST_ASSERT_MSG(rc == MFS_EDECODE && reason == sh_bad[j].reason, "bad #%zu: rc=%d reason=%d", j, rc, reason);
	}
	mfs_events_free(&evs);
	rd_kafka_conf_t *kc = rd_kafka_conf_new();
	rd_kafka_conf_set(kc, "bootstrap.servers", bootstraps, e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, e, sizeof e);
	TEST_ASSERT_MSG(rk != NULL, "%s", e);
	if (!rk)
		return;
	for (size_t j = 0; j < SH_N_BAD; j++)
		TEST_OK(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION((int32_t)(j % (size_t)parts)),
		                          RD_KAFKA_V_VALUE((void *)(uintptr_t)sh_bad[j].bytes, sh_bad[j].len),
		                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END));
	TEST_OK(rd_kafka_flush(rk, 20000));
	rd_kafka_destroy(rk);
}

/* Low and high watermarks of every partition. */
static void sh_watermarks(const char *bootstraps, const char *topic, int parts, int64_t *lo, int64_t *hi)
{
	char e[512];
	rd_kafka_conf_t *kc = rd_kafka_conf_new();
	rd_kafka_conf_set(kc, "bootstrap.servers", bootstraps, e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, e, sizeof e);
	for (int p = 0; p < parts; p++) {
		lo[p] = hi[p] = -1;
		rd_kafka_resp_err_t ke = rk ? rd_kafka_query_watermark_offsets(rk, topic, p, &lo[p], &hi[p], 10000)
		                            : RD_KAFKA_RESP_ERR__FAIL;
		TEST_ASSERT_MSG(ke == 0, "watermarks [%d]: %s", p, rd_kafka_err2str(ke));
	}
	if (rk)
		rd_kafka_destroy(rk);
}

/* Start `mfstream serve` on topic; stderr goes to logpath (appended). */
static pid_t sh_spawn(const char *bootstraps, const char *topic, const char *dir, const char *group,
                      const char *logpath, const char *dlq)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(2);
	}
	if (pid == 0) {
		FILE *f = freopen(logpath, "a", stderr);
		(void)f;
		char gk[256];
		snprintf(gk, sizeof gk, "%s", group);
		execl(test_bin(), test_bin(), "serve", "--brokers", bootstraps, "--topic", topic, "--snapshot", dir,
		      "--engine", "cpu", "--threads", "2", "--k", "16", "--serve.snapshot_ms", "100",
		      "--serve.batch_size", "512", "--kafka.group.id", gk, "--kafka.session.timeout.ms", "6000",
		      dlq ? "--serve.dead_letter_topic" : (char *)NULL, dlq, (char *)NULL);
		perror("execl");
		_exit(127);
	}
	return pid;
}

typedef struct sh_snap {
	int found;
	uint64_t events, seq, mu_count;
	double pq_rmse; /* NaN when absent */
	int64_t off[SH_MAX_PARTS];
	uint64_t rejected[MFS_REJ__COUNT];
} sh_snap_t;

static int sh_meta_cb(void *ctx, const char *key, size_t kl, const unsigned char *val, size_t vl)
{
	sh_snap_t *s = ctx;
	char k[300];
	snprintf(k, sizeof k, "%.*s", (int)kl, key);
	if (vl != 8)
		return 0;
	uint64_t v = 0;
	for (int j = 7; j >= 0; j--)
		v = v << 8 | val[j];
	const char *slash = strrchr(k, '/');
	if (strncmp(k, "offset/", 7) == 0 && slash) {
		int p = atoi(slash + 1);
		if (p >= 0 && p < SH_MAX_PARTS)
			s->off[p] = (int64_t)v;
	} else if (strncmp(k, "rejected/", 9) == 0) {
		for (int r = 0; r < MFS_REJ__COUNT; r++)
			if (strcmp(k + 9, mfs_reject_name(r)) == 0)
				s->rejected[r] = v;
	} else if (strcmp(k, "mu_count") == 0) {
		s->mu_count = v;
	} else if (strcmp(k, "prequential_rmse") == 0) {
		memcpy(&s->pq_rmse, &v, sizeof v);
	}
	return 0;
}

/* Read the snapshot in dir (found = 0 when there is none yet). */
static sh_snap_t sh_read(const char *dir)
{
	sh_snap_t s;
	memset(&s, 0, sizeof s);
	s.pq_rmse = NAN;
	for (int p = 0; p < SH_MAX_PARTS; p++)
		s.off[p] = -1;
	mfs_snap_t *h = NULL;
	char e[256];
	if (mfs_snap_open(dir, &h, e, sizeof e) != 0)
		return s;
	mfs_snap_meta_t m;
	if (mfs_snap_get_meta(h, &m) == 0 && mfs_snap_meta_each(h, sh_meta_cb, &s) == 0) {
		s.found = 1;
		s.events = m.events_applied;
		s.seq = m.seq;
	}
	mfs_snap_close(h);
	return s;
}

/* Poll the snapshot until events_applied >= want (or the child dies, or timeout_s). */
static sh_snap_t sh_wait_events(const char *dir, pid_t pid, uint64_t want, double timeout_s, int *child_died)
{
	double end = mfs_now_s() + timeout_s;
	sh_snap_t s;
	*child_died = 0;
	for (;;) {
		s = sh_read(dir);
		if ((s.found && s.events >= want) || mfs_now_s() > end)
			return s;
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			*child_died = 1;
			return s;
		}
		struct timespec ts = {0, 50 * 1000000};
		nanosleep(&ts, NULL);
	}
}

/* SIGTERM the child and return its exit status (-1: killed by a signal or timeout). */
static int sh_stop(pid_t pid, double timeout_s)
{
	kill(pid, SIGTERM);
	double end = mfs_now_s() + timeout_s;
	int st;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
		if (mfs_now_s() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			return -1;
		}
		struct timespec ts = {0, 20 * 1000000};
		nanosleep(&ts, NULL);
	}
}

#endif
