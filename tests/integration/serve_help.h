/* serve_help.h - shared by the serve tests: feed a topic, run `mfstream serve` as a child
 * process, and read what its snapshot says.
 *
 * Two brokers: librdkafka's mock cluster in the test process (the default), or a real Kafka
 * broker (MFS_TEST_BROKER=kafka: ctest's tests labelled kafka, whose fixture starts one broker
 * per run and writes its address to $MFS_KAFKA_FIXTURE/state; tests/kafka/fixture.sh). On the
 * real broker every topic a test asks for gets a name of its own (the test's name, its pid and
 * a counter), so tests share the broker and not their data; without a broker they exit 77. */
#ifndef MFS_SERVE_HELP_H
#define MFS_SERVE_HELP_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* One invalid message per rejection reason (rating range 0.5..5), built by hand, with the
 * event number the decoder reports for it (-1: the message as a whole). */
static const struct {
	const char *bytes;
	size_t len;
	int reason;
	long index;
} sh_bad[] = {
	{"\xc1", 1, MFS_REJ_NOT_MSGPACK, -1},
	{"\x05", 1, MFS_REJ_WRONG_TYPE, -1},
	{"\x80", 1, MFS_REJ_MISSING_FIELD, 0},
	{"\x93\x01\x02\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", 12, MFS_REJ_NAN, 0},
	{"\x93\x01\x02\x06", 4, MFS_REJ_RANGE, 0},
	{"\x93\xa0\x02\x03", 4, MFS_REJ_ID_LEN, 0},
	{"\x93\x01\x02\x03\x00", 5, MFS_REJ_TRAILING, -1},
	{"\x90", 1, MFS_REJ_EMPTY, -1},
};
#define SH_N_BAD (sizeof sh_bad / sizeof sh_bad[0])

/* The synthetic stream of the serve tests: n events of 3000 users x 1500 items (Zipf 0.8). */
static void sh_synth_conf(mfs_conf_t *c, long n, long seed)
{
	char e[512], v[32];
	if (mfs_conf_init(c))
		exit(2);
	snprintf(v, sizeof v, "%ld", n);
	TEST_OK(mfs_conf_set(c, "gen.ratings", v, e, sizeof e));
	snprintf(v, sizeof v, "%ld", seed);
	TEST_OK(mfs_conf_set(c, "gen.seed", v, e, sizeof e));
	TEST_OK(mfs_conf_set(c, "gen.users", "3000", e, sizeof e));
	TEST_OK(mfs_conf_set(c, "gen.items", "1500", e, sizeof e));
	TEST_OK(mfs_conf_set(c, "gen.zipf", "0.8", e, sizeof e));
}

/* n synthetic events (seed) into topic through mfs_produce_run. @return events delivered. */
static uint64_t sh_produce_valid(const char *bootstraps, const char *topic, long n, long seed)
{
	mfs_conf_t c;
	char e[512];
	sh_synth_conf(&c, n, seed);
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

/* Every sh_bad message once, message j in partition j % parts with key "bad-<j>"; checks the
 * decoder agrees first. */
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
		TEST_ASSERT_MSG(rc == MFS_EDECODE && reason == sh_bad[j].reason && idx == sh_bad[j].index,
		                "bad #%zu: rc=%d reason=%d index=%ld", j, rc, reason, idx);
	}
	mfs_events_free(&evs);
	rd_kafka_conf_t *kc = rd_kafka_conf_new();
	rd_kafka_conf_set(kc, "bootstrap.servers", bootstraps, e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, e, sizeof e);
	TEST_ASSERT_MSG(rk != NULL, "%s", e);
	if (!rk)
		return;
	for (size_t j = 0; j < SH_N_BAD; j++) {
		char key[32];
		snprintf(key, sizeof key, "bad-%zu", j);
		TEST_OK(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION((int32_t)(j % (size_t)parts)),
		                          RD_KAFKA_V_VALUE((void *)(uintptr_t)sh_bad[j].bytes, sh_bad[j].len),
		                          RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
		                          RD_KAFKA_V_END));
	}
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

/* What every serve test starts from: a broker (mock or real) with one topic, and a fresh
 * temporary directory holding the snapshot (dir/snap) and serve's log (dir/serve.log). */
typedef struct sh_env {
	mfs_mock_broker_t *mb; /* NULL on a real broker */
	const char *bs;        /* the cluster's bootstrap servers */
	char bsbuf[128];
	char topic[160];       /* the topic's name on this broker */
	char dir[300], snap[320], log[320];
} sh_env_t;

/* Is this run against the real broker (MFS_TEST_BROKER=kafka)? */
static int sh_real(void)
{
	const char *b = getenv("MFS_TEST_BROKER");
	return b && strcmp(b, "kafka") == 0;
}

/* The real broker's address from the fixture's state file; exits 77 (skip) with its reason
 * when the fixture found none. */
static void sh_real_bootstrap(char *out, size_t size)
{
	const char *dir = getenv("MFS_KAFKA_FIXTURE");
	char path[512], line[256] = "";
	snprintf(path, sizeof path, "%s/state", dir ? dir : "");
	FILE *f = dir ? fopen(path, "r") : NULL;
	if (f) {
		if (!fgets(line, sizeof line, f))
			line[0] = '\0';
		fclose(f);
	}
	line[strcspn(line, "\n")] = '\0';
	if (strncmp(line, "up ", 3) != 0)
		TEST_SKIP("real Kafka broker: %s", *line ? line : "no fixture state (MFS_KAFKA_FIXTURE unset or not started)");
	snprintf(out, size, "%s", line + 3);
}

/* Create topic with parts partitions (replication 1) on a real broker and wait until every
 * partition has a leader. @return 0, or -1 after a failed check. */
static int sh_real_create_topic(const char *bs, const char *topic, int parts)
{
	char e[512];
	rd_kafka_conf_t *kc = rd_kafka_conf_new();
	rd_kafka_conf_set(kc, "bootstrap.servers", bs, e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, e, sizeof e);
	TEST_ASSERT_MSG(rk != NULL, "%s", e);
	if (!rk)
		return -1;
	rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, parts, 1, e, sizeof e);
	rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
	rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
	rd_kafka_event_t *ev = rd_kafka_queue_poll(q, (int)(test_seconds(60) * 1000));
	int rc = -1;
	if (ev && !rd_kafka_event_error(ev)) {
		size_t n = 0;
		const rd_kafka_topic_result_t **res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
		rc = n == 1 && rd_kafka_topic_result_error(res[0]) == 0 ? 0 : -1;
		TEST_ASSERT_MSG(rc == 0, "create topic %s: %s", topic,
		                n ? rd_kafka_topic_result_error_string(res[0]) : "no result");
	} else {
		TEST_ASSERT_MSG(0, "create topic %s: %s", topic, ev ? rd_kafka_event_error_string(ev) : "no answer in time");
	}
	if (ev)
		rd_kafka_event_destroy(ev);
	rd_kafka_queue_destroy(q);
	rd_kafka_NewTopic_destroy(nt);
	/* the topic exists once every partition has a leader in the metadata */
	double end = mfs_now_s() + test_seconds(60);
	int led = 0;
	while (rc == 0 && !led && mfs_now_s() < end) {
		rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
		const struct rd_kafka_metadata *md = NULL;
		if (rd_kafka_metadata(rk, 0, rkt, &md, 5000) == 0 && md->topic_cnt == 1 && !md->topics[0].err &&
		    md->topics[0].partition_cnt == parts) {
			led = 1;
			for (int p = 0; p < parts; p++)
				led &= md->topics[0].partitions[p].leader >= 0;
		}
		if (md)
			rd_kafka_metadata_destroy(md);
		rd_kafka_topic_destroy(rkt);
		if (!led)
			nanosleep(&(struct timespec){0, 100 * 1000000}, NULL);
	}
	TEST_ASSERT_MSG(rc != 0 || led, "topic %s: partitions without a leader after %.0f s", topic, test_seconds(60));
	rd_kafka_destroy(rk);
	return rc == 0 && led ? 0 : -1;
}

/* A real broker of the test's own (one it may kill): ../shared/kafka/broker.sh (MFS_KAFKA_HOME
 * overrides) in dir. Exits 77 (skip) where there is no broker or no Java; a broker that is there
 * but does not start is a failed check. @return 0 with its address in bs, else -1. */
static int sh_own_broker(const char *dir, char *bs, size_t size)
{
	const char *home = getenv("MFS_KAFKA_HOME"), *src = getenv("MFS_SRC_DIR");
	char sh[512], cmd[1200];
	if (home && *home)
		snprintf(sh, sizeof sh, "%s/broker.sh", home);
	else
		snprintf(sh, sizeof sh, "%s/../shared/kafka/broker.sh", src && *src ? src : ".");
	if (access(sh, X_OK) != 0)
		TEST_SKIP("real Kafka broker: no %s (../shared/kafka beside the checkout)", sh);
	if (system("command -v java >/dev/null 2>&1") != 0)
		TEST_SKIP("real Kafka broker: no Java runtime (apt-get install openjdk-17-jre-headless)");
	snprintf(cmd, sizeof cmd, "'%s' start '%s' 2>&1", sh, dir);
	FILE *p = popen(cmd, "r");
	char line[256] = "";
	while (p && fgets(line, sizeof line, p))
		;
	int rc = p ? pclose(p) : -1;
	line[strcspn(line, "\n")] = '\0';
	TEST_ASSERT_MSG(rc == 0 && strncmp(line, "127.0.0.1:", 10) == 0, "broker.sh start: %s", line);
	snprintf(bs, size, "%s", line);
	return rc == 0 ? 0 : -1;
}

/* broker.sh VERB dir (kill, wipe) on a broker of sh_own_broker; "restart": bring it back and
 * wait for partition leaders (tests/kafka/restart.sh). @return the exit status. */
static int sh_own_broker_do(const char *dir, const char *verb)
{
	const char *home = getenv("MFS_KAFKA_HOME"), *src = getenv("MFS_SRC_DIR");
	char sh[600], cmd[1600];
	if (home && *home)
		snprintf(sh, sizeof sh, "%s/broker.sh", home);
	else
		snprintf(sh, sizeof sh, "%s/../shared/kafka/broker.sh", src && *src ? src : ".");
	if (strcmp(verb, "restart") == 0)
		snprintf(cmd, sizeof cmd, "bash '%s/tests/kafka/restart.sh' '%s' '%s' %.0f >/dev/null 2>&1",
		         src && *src ? src : ".", sh, dir, test_seconds(180));
	else
		snprintf(cmd, sizeof cmd, "'%s' %s '%s' >/dev/null 2>&1", sh, verb, dir);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A topic of parts partitions named after base: base itself on the mock cluster, a name of its
 * own on the real broker. @return 0, or -1 after a failed check. */
static int sh_env_topic(sh_env_t *v, const char *base, int parts, char *name, size_t size)
{
	static unsigned seq;
	char e[512];
	if (!v->mb) {
		snprintf(name, size, "%s-%d-%u", base, (int)getpid(), seq++);
		return sh_real_create_topic(v->bs, name, parts);
	}
	snprintf(name, size, "%s", base);
	int rc = mfs_mock_broker_create_topic(v->mb, base, parts, e, sizeof e);
	TEST_ASSERT_MSG(rc == 0, "%s", e);
	return rc ? -1 : 0;
}

/* brokers: the mock cluster's size (the real broker is one). The topic's name is v->topic.
 * @return 0 when ready; else -1, the failure already asserted. Close with sh_env_close. */
static int sh_env_open(sh_env_t *v, int brokers, const char *topic, int parts)
{
	char e[512];
	memset(v, 0, sizeof *v);
	if (sh_real()) {
		sh_real_bootstrap(v->bsbuf, sizeof v->bsbuf);
		v->bs = v->bsbuf;
	} else {
		TEST_OK(mfs_mock_broker_open(brokers, &v->mb, e, sizeof e));
		if (!v->mb)
			return -1;
		v->bs = mfs_mock_broker_bootstraps(v->mb);
	}
	if (sh_env_topic(v, topic, parts, v->topic, sizeof v->topic))
		return -1;
	snprintf(v->dir, sizeof v->dir, "%s", test_tmpdir());
	snprintf(v->snap, sizeof v->snap, "%s/snap", v->dir);
	snprintf(v->log, sizeof v->log, "%s/serve.log", v->dir);
	return 0;
}

static void sh_env_close(sh_env_t *v)
{
	if (v->mb)
		mfs_mock_broker_close(v->mb);
}

/* The engine sh_spawn runs serve with (MFS_TEST_ENGINE, default cpu) and the k it passes:
 * the CUDA engine needs a multiple of 32. */
static const char *sh_engine(void)
{
	const char *eng = getenv("MFS_TEST_ENGINE");
	return eng && *eng ? eng : "cpu";
}
static int sh_k(void) { return strcmp(sh_engine(), "cpu") ? 32 : 16; }

/* Start `mfstream serve` on topic; stderr goes to logpath (appended). extra: more serve
 * arguments, NULL-terminated (NULL: none). */
static pid_t sh_spawn(const char *bootstraps, const char *topic, const char *dir, const char *group,
                      const char *logpath, const char *dlq, const char *const *extra)
{
	/* Everything the child needs is made here, before fork: this process has threads (the
	 * mock broker's, librdkafka's), and one of them may hold a lock (stdio's, malloc's) at the
	 * fork, so the child calls only async-signal-safe functions (open, dup2, execv) until it
	 * runs mfstream. A freopen there once left a child hung before exec. */
	char gk[256];
	snprintf(gk, sizeof gk, "%s", group);
	const char *argv[80];
	int n = 0;
	/* MFS_TEST_ENGINE=cuda runs the same tests on the GPU engine */
	const char *eng = sh_engine(), *bin = test_bin();
	char k[16];
	snprintf(k, sizeof k, "%d", sh_k());
	const char *base[] = {bin, "serve", "--brokers", bootstraps, "--topic", topic, "--snapshot", dir,
	                      "--engine", eng, "--threads", "2", "--k", k, "--serve.snapshot_ms", "100",
	                      "--serve.batch_size", "512", "--kafka.group.id", gk, "--kafka.session.timeout.ms", "6000",
	                      "--metrics.listen", "127.0.0.1:0"};
	for (size_t j = 0; j < sizeof base / sizeof base[0]; j++)
		argv[n++] = base[j];
	if (dlq) {
		argv[n++] = "--serve.dead_letter_topic";
		argv[n++] = dlq;
	}
	for (int j = 0; extra && extra[j] && n < 78; j++)
		argv[n++] = extra[j];
	argv[n] = NULL;
	fflush(NULL);
	const pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(2);
	}
	if (pid == 0) {
		/* a serve never outlives its test, however the test ends (a crash, ctest's kill) */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int fd = open(logpath, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0)
			dup2(fd, 2); /* dup2's copy does not inherit O_CLOEXEC */
		execv(bin, (char *const *)(uintptr_t)argv);
		static const char msg[] = "sh_spawn: execv failed\n";
		ssize_t w = write(2, msg, sizeof msg - 1);
		(void)w;
		_exit(127);
	}
	return pid;
}

typedef struct sh_snap {
	int found;
	uint64_t events, seq, mu_count, held_out, digest;
	uint64_t dropped; /* events_dropped: valid events a full table or admission kept out */
	double mu_sum;
	double pq_rmse, holdout_rmse, lr; /* NaN when absent */
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
	} else if (strcmp(k, "holdout_rmse") == 0) {
		memcpy(&s->holdout_rmse, &v, sizeof v);
	} else if (strcmp(k, "mu_sum") == 0) {
		memcpy(&s->mu_sum, &v, sizeof v);
	} else if (strcmp(k, "events_held_out") == 0) {
		s->held_out = v;
	} else if (strcmp(k, "events_dropped") == 0) {
		s->dropped = v;
	} else if (strcmp(k, "events_digest") == 0) {
		s->digest = v;
	}
	return 0;
}

/* Read the snapshot in dir (found = 0 when there is none yet). */
static sh_snap_t sh_read(const char *dir)
{
	sh_snap_t s;
	memset(&s, 0, sizeof s);
	s.pq_rmse = s.holdout_rmse = s.lr = NAN;
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
		s.lr = m.learning_rate;
	}
	mfs_snap_close(h);
	return s;
}

/* Has the child exited? Checked without reaping it (WNOWAIT), so that sh_stop or
 * sh_wait_exit still reads its status. */
static int sh_exited(pid_t pid)
{
	siginfo_t si;
	memset(&si, 0, sizeof si);
	return waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
}

/* Poll the snapshot in dir until done(snapshot, arg), or the child exits (*child_died = 1; not
 * reaped), or timeout_s (scaled by test_seconds). @return the last snapshot read. */
typedef int (*sh_snap_pred_t)(const sh_snap_t *s, const void *arg);
static sh_snap_t sh_wait_snap(const char *dir, pid_t pid, sh_snap_pred_t done, const void *arg, double timeout_s,
                              int *child_died)
{
	double end = mfs_now_s() + test_seconds(timeout_s);
	sh_snap_t s;
	*child_died = 0;
	for (;;) {
		s = sh_read(dir);
		if ((s.found && done(&s, arg)) || mfs_now_s() > end)
			return s;
		if (sh_exited(pid)) {
			*child_died = 1;
			return s;
		}
		nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	}
}

static int sh_has_events(const sh_snap_t *s, const void *want) { return s->events >= *(const uint64_t *)want; }

/* Poll the snapshot until events_applied >= want (as sh_wait_snap). */
static sh_snap_t sh_wait_events(const char *dir, pid_t pid, uint64_t want, double timeout_s, int *child_died)
{
	return sh_wait_snap(dir, pid, sh_has_events, &want, timeout_s, child_died);
}

typedef struct sh_ends {
	int parts;
	const int64_t *hi;
} sh_ends_t;

static int sh_at_ends(const sh_snap_t *s, const void *arg)
{
	const sh_ends_t *e = arg;
	for (int p = 0; p < e->parts; p++)
		if (s->off[p] < e->hi[p])
			return 0;
	return 1;
}

/* Poll the snapshot until every partition's stored offset reaches the high watermark in hi
 * (a drained topic, rejected messages included), as sh_wait_snap. */
static sh_snap_t sh_wait_offsets(const char *dir, pid_t pid, int parts, const int64_t *hi, double timeout_s,
                                 int *child_died)
{
	const sh_ends_t e = {parts, hi};
	return sh_wait_snap(dir, pid, sh_at_ends, &e, timeout_s, child_died);
}

/* What every message of a topic holds: valid events, their digest sum and rating sum, by
 * partition and offset (rejected messages hold zeros). */
typedef struct sh_topic {
	int parts;
	int64_t hi[SH_MAX_PARTS];
	uint32_t *n_at[SH_MAX_PARTS];
	uint64_t *dg_at[SH_MAX_PARTS];
	double *rs_at[SH_MAX_PARTS];
} sh_topic_t;

/* A consumer of group `group` (no auto commit) for reading topics back; NULL (asserted) when
 * it cannot be made. */
static rd_kafka_t *sh_consumer(const char *bs, const char *group)
{
	char e[512];
	rd_kafka_conf_t *kc;
	const char *const defaults[] = {"group.id", group, "enable.auto.commit", "false", NULL};
	TEST_OK(mfs_kafka_conf_new_with(NULL, defaults, &kc, e, sizeof e));
	rd_kafka_conf_set(kc, "bootstrap.servers", bs, e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, e, sizeof e);
	TEST_ASSERT_MSG(rk != NULL, "%s", e);
	if (rk)
		rd_kafka_poll_set_consumer(rk);
	return rk;
}

static void sh_topic_read(const char *bs, const char *topic, int parts, const int64_t *hi, sh_topic_t *t)
{
	memset(t, 0, sizeof *t);
	t->parts = parts;
	rd_kafka_t *rk = sh_consumer(bs, "mfs-test-topic-reader");
	if (!rk)
		return;
	rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(parts);
	int64_t total = 0, seen = 0;
	for (int p = 0; p < parts; p++) {
		t->hi[p] = hi[p];
		t->n_at[p] = calloc((size_t)hi[p] + 1, sizeof *t->n_at[p]);
		t->dg_at[p] = calloc((size_t)hi[p] + 1, sizeof *t->dg_at[p]);
		t->rs_at[p] = calloc((size_t)hi[p] + 1, sizeof *t->rs_at[p]);
		total += hi[p];
		rd_kafka_topic_partition_list_add(tp, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
	}
	TEST_OK(rd_kafka_assign(rk, tp));
	rd_kafka_topic_partition_list_destroy(tp);
	mfs_event_opts_t eo = {0.5, 5.0, 0};
	mfs_events_t evs = {0};
	double end = mfs_now_s() + test_seconds(60);
	while (seen < total && mfs_now_s() < end) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
		if (!m)
			continue;
		if (!m->err && m->partition >= 0 && m->partition < parts && m->offset < hi[m->partition]) {
			int reason;
			long idx;
			char d[256];
			if (mfs_event_decode(m->payload, m->len, &eo, &evs, &reason, &idx, d, sizeof d) == 0) {
				uint64_t dg = 0;
				double rs = 0;
				for (size_t j = 0; j < evs.n; j++) {
					dg += mfs_event_digest(&evs.ev[j]);
					rs += evs.ev[j].rating;
				}
				t->n_at[m->partition][m->offset] = (uint32_t)evs.n;
				t->dg_at[m->partition][m->offset] = dg;
				t->rs_at[m->partition][m->offset] = rs;
			}
			seen++;
		}
		rd_kafka_message_destroy(m);
	}
	TEST_EQ_INT(seen, total);
	mfs_events_free(&evs);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
}

/* Valid events, digest and rating sum of the messages below off[p] in every partition. */
static void sh_topic_below(const sh_topic_t *t, const int64_t *off, uint64_t *n, uint64_t *dg, double *rs)
{
	*n = 0;
	*dg = 0;
	*rs = 0;
	for (int p = 0; p < t->parts; p++)
		for (int64_t o = 0; o < off[p] && o < t->hi[p]; o++) {
			*n += t->n_at[p][o];
			*dg += t->dg_at[p][o];
			*rs += t->rs_at[p][o];
		}
}

/* Check a snapshot against the topic: applied + held out + dropped == valid events below its
 * offsets, and the digest of them matches; so do the count and rating sum behind mu, which
 * leave dropped events out (with drops, only the count is checked: which ones were dropped is
 * the model's decision, not the topic's). @return 1 if consistent. */
static int sh_snap_consistent(const sh_topic_t *t, const sh_snap_t *s, int verbose)
{
	uint64_t n, dg;
	double rs;
	sh_topic_below(t, s->off, &n, &dg, &rs);
	int ok = s->events + s->held_out + s->dropped == n && s->digest == dg && s->mu_count == n - s->dropped &&
	         (s->dropped || fabs(s->mu_sum - rs) <= 1e-9 * (fabs(rs) > 1 ? fabs(rs) : 1));
	if (!ok && verbose)
		fprintf(stderr, "  snapshot seq %" PRIu64 ": applied %" PRIu64 " + held out %" PRIu64 " + dropped %" PRIu64
		        " (mu_count %" PRIu64
		        ", digest %016" PRIx64 ", mu_sum %.1f) but its offsets cover %" PRIu64 " (digest %016" PRIx64
		        ", sum %.1f)\n", s->seq, s->events, s->held_out, s->dropped, s->mu_count, s->digest, s->mu_sum, n, dg,
		        rs);
	return ok;
}

static void sh_topic_free(sh_topic_t *t)
{
	for (int p = 0; p < t->parts; p++) {
		free(t->n_at[p]);
		free(t->dg_at[p]);
		free(t->rs_at[p]);
	}
}

/* Read the topic up to hi and check every sample against it. @return how many break the invariant. */
static int sh_count_inconsistent(const char *bs, const char *topic, int parts, const int64_t *hi,
                                 const sh_snap_t *samples, int n)
{
	sh_topic_t t;
	sh_topic_read(bs, topic, parts, hi, &t);
	int bad = 0;
	for (int j = 0; j < n; j++)
		if (!sh_snap_consistent(&t, &samples[j], bad < 5))
			bad++;
	sh_topic_free(&t);
	return bad;
}

/* A drained topic: each rejection counter is `rejected`, nothing was lost to retention (low
 * watermarks 0) and the stored offsets are the high watermarks. */
static void sh_check_drained(const sh_snap_t *s, int parts, const int64_t *lo, const int64_t *hi, uint64_t rejected)
{
	for (int r = 0; r < MFS_REJ__COUNT; r++)
		TEST_ASSERT_MSG(s->rejected[r] == rejected, "rejected/%s = %" PRIu64, mfs_reject_name(r), s->rejected[r]);
	for (int p = 0; p < parts; p++) {
		TEST_ASSERT_MSG(lo[p] == 0, "[%d] low watermark %" PRId64, p, lo[p]);
		TEST_ASSERT_MSG(s->off[p] == hi[p], "[%d] stored offset %" PRId64 ", high watermark %" PRId64, p, s->off[p],
		                hi[p]);
	}
}

/* The end of a run that produced only valid events: the snapshot in snap holds exactly
 * `total` events, consistent with the topic below its offsets (count, digest, rating sum),
 * the offsets are the high watermarks and nothing was dropped (low watermarks 0). */
static void sh_check_all_applied(const char *bs, const char *topic, int parts, const char *snap, uint64_t total)
{
	int64_t lo[SH_MAX_PARTS], hi[SH_MAX_PARTS];
	sh_watermarks(bs, topic, parts, lo, hi);
	sh_snap_t s = sh_read(snap);
	sh_topic_t t;
	sh_topic_read(bs, topic, parts, hi, &t);
	TEST_ASSERT(sh_snap_consistent(&t, &s, 1));
	TEST_EQ_INT(s.events + s.held_out, total);
	for (int p = 0; p < parts; p++) {
		TEST_EQ_INT(lo[p], 0);
		TEST_EQ_INT(s.off[p], hi[p]);
	}
	sh_topic_free(&t);
}

/* Lines of the file at path that contain s (0 when it cannot be read). */
static long sh_log_count(const char *path, const char *s)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	long n = 0;
	while (f && fgets(line, sizeof line, f))
		n += strstr(line, s) != NULL;
	if (f)
		fclose(f);
	return n;
}

/* Wait up to timeout_s (scaled by test_seconds) for the child to exit; its exit status (-1:
 * killed by a signal, or still running at the timeout: then it is killed). */
static int sh_wait_exit(pid_t pid, double timeout_s)
{
	double end = mfs_now_s() + test_seconds(timeout_s);
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

/* Does process pid catch signal sig yet (its SigCgt mask in /proc)? */
static int sh_catches(pid_t pid, int sig)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	unsigned long long mask = 0;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "SigCgt: %llx", &mask) == 1)
			break;
	if (f)
		fclose(f);
	return (int)(mask >> (sig - 1) & 1);
}

/* SIGTERM the child and return its exit status (-1: killed by a signal or timeout). A serve
 * just spawned may not have set its handlers yet (a snapshot can already hold everything a
 * test waits for): the signal is sent once it catches SIGTERM, or once it has exited. */
static int sh_stop(pid_t pid, double timeout_s)
{
	double end = mfs_now_s() + test_seconds(timeout_s);
	while (!sh_catches(pid, SIGTERM) && !sh_exited(pid) && mfs_now_s() < end)
		nanosleep(&(struct timespec){0, 5 * 1000000}, NULL);
	kill(pid, SIGTERM);
	return sh_wait_exit(pid, timeout_s);
}

/* GET path from 127.0.0.1:port; the body into buf. @return the HTTP status, or -1. */
static int sh_http_get(int port, const char *path, char *buf, size_t size)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	char req[256];
	int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
	if (write(fd, req, (size_t)n) != n) {
		close(fd);
		return -1;
	}
	size_t len = 0;
	ssize_t r;
	while (len + 1 < size && (r = read(fd, buf + len, size - 1 - len)) > 0)
		len += (size_t)r;
	buf[len] = '\0';
	close(fd);
	int status = -1;
	sscanf(buf, "HTTP/%*s %d", &status);
	return status;
}

/* The value of the sample line that starts with `series ` in a Prometheus text body, or -1. */
static double sh_metric(const char *body, const char *series)
{
	size_t n = strlen(series);
	for (const char *l = body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (strncmp(l, series, n) == 0 && l[n] == ' ')
			return atof(l + n + 1);
	return -1;
}

/* port the service logged ("metrics listening ... port=N"), or -1 */
static int sh_logged_port(const char *log)
{
	for (double end = mfs_now_s() + test_seconds(10); mfs_now_s() < end;) {
		FILE *f = fopen(log, "r");
		char line[2048];
		while (f && fgets(line, sizeof line, f)) {
			const char *p = strstr(line, "metrics listening");
			if (p && (p = strstr(p, "port=")))
				return fclose(f), atoi(p + 5);
		}
		if (f)
			fclose(f);
		nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	}
	return -1;
}

/* the value of key=N in the last line of path that contains msg */
static long sh_log_value(const char *path, const char *msg, const char *key)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	long v = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f)) {
		if (!strstr(line, msg))
			continue;
		const char *k = strstr(line, key);
		if (k)
			v = atol(k + strlen(key));
	}
	fclose(f);
	return v;
}

#endif
