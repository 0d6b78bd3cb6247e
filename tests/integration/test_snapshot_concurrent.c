/* test_snapshot_concurrent.c - readers never see a mix of two snapshots, even while the map grows.
 *
 * A forked child publishes snapshots s = 1..S. In snapshot s every value is s: mu, every
 * bias and every factor, and the row counts grow with s (users_for(s), items_for(s)), so the
 * data outgrows the 1 MiB starting map several times. The parent, a separate process, runs
 * N_READERS threads, each with one libmfsnap handle for the whole run (the handles share
 * one MDB_env, so the map is remapped under the other threads' feet); each reads
 * continuously and checks that everything one call returns comes from one snapshot:
 *   - meta: mu == seq, n_users == users_for(seq), n_items == items_for(seq);
 *   - a user row: bias == every factor;
 *   - predict(u, i) == mu + b_u + b_i + p.q == 3s + k s^2 for one integer s;
 *   - top-K over all items (one txn): every score == 3s + k s^2 and exactly items_for(s) hits;
 * and that s never goes backwards between calls.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"

#define K 32
#define S 150

static uint32_t users_for(uint64_t s) { return (uint32_t)(50 + 40 * s); }
static uint32_t items_for(uint64_t s) { return (uint32_t)(100 + 60 * s); }
static double expect(uint64_t s) { return 3.0 * (double)s + K * (double)s * (double)s; }

/* The s whose expect(s) is exactly v, or 0. */
static uint64_t solve(double v)
{
	for (uint64_t s = 1; s <= S; s++)
		if (expect(s) == v)
			return s;
	return 0;
}

static int writer_main(const char *dir)
{
	char err[512];
	mfs_model_conf_t c = {K, 0.1, 1};
	mfs_model_t *m;
	mfs_snap_writer_t *w;
	if (mfs_model_init(&c, &m) || mfs_snap_writer_open(dir, 1 << 20, &w, err, sizeof err)) {
		fprintf(stderr, "writer: open failed: %s\n", err);
		return 1;
	}
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.01;
	in.last_loss = NAN;
	in.rating_min = -1e30;
	in.rating_max = 1e30;
	for (uint64_t s = 1; s <= S; s++) {
		uint32_t row;
		while (m->n_users < users_for(s)) {
			mfs_id_t id = mfs_id_u64(m->n_users);
			if (mfs_model_user_row(m, &id, &row))
				return 1;
		}
		while (m->n_items < items_for(s)) {
			mfs_id_t id = mfs_id_u64(m->n_items);
			if (mfs_model_item_row(m, &id, &row))
				return 1;
		}
		float v = (float)s;
		for (size_t j = 0; j < (size_t)m->n_users * K; j++)
			m->P[j] = v;
		for (size_t j = 0; j < (size_t)m->n_items * K; j++)
			m->Q[j] = v;
		for (uint32_t r = 0; r < m->n_users; r++)
			m->bu[r] = v;
		for (uint32_t r = 0; r < m->n_items; r++)
			m->bi[r] = v;
		m->mu = (double)s;
		uint64_t seq;
		int rc = mfs_snap_publish(w, m, &in, &seq, err, sizeof err);
		if (rc || seq != s) {
			fprintf(stderr, "writer: publish %llu: rc=%d seq=%llu %s\n", (unsigned long long)s, rc,
			        (unsigned long long)seq, err);
			return 1;
		}
	}
	mfs_snap_writer_close(w);
	mfs_model_free(m);
	return 0;
}

/* One reader: its own handle (handles on one directory share the process's MDB_env). */
struct reader {
	pthread_t tid;
	const char *dir;
	int open_rc;
	uint64_t first, last;
	long reads, bad_meta, bad_row, bad_pred, bad_topk, backwards, errors;
};

static atomic_int writer_done;

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	char err[512];
	mfs_snap_t *s = NULL;
	if ((rd->open_rc = mfs_snap_open(rd->dir, &s, err, sizeof err))) {
		fprintf(stderr, "reader open: %s\n", err);
		return NULL;
	}
	size_t max_hits = items_for(S) + 10;
	mfs_snap_hit_t *hits = malloc(max_hits * sizeof *hits);
	float vec[K], bias;
	mfs_snap_id_t u0 = {MFS_SNAP_ID_U64, 0, NULL, 0}, i0 = {MFS_SNAP_ID_U64, 0, NULL, 0};
	for (int done = 0; !done;) {
		done = atomic_load(&writer_done); /* one more full round after the last publish */
		mfs_snap_meta_t meta;
		uint64_t seen[4] = {0, 0, 0, 0};
		if (mfs_snap_get_meta(s, &meta) == 0) {
			seen[0] = meta.seq;
			if (meta.mu != (double)meta.seq || meta.n_users != users_for(meta.seq) ||
			    meta.n_items != items_for(meta.seq))
				rd->bad_meta++;
			if (!rd->first)
				rd->first = meta.seq;
		} else {
			rd->errors++;
		}
		if (mfs_snap_user(s, &u0, &bias, vec) == 0) {
			for (int j = 0; j < K; j++)
				if (vec[j] != bias)
					rd->bad_row++;
			seen[1] = (uint64_t)bias;
			if ((float)seen[1] != bias)
				rd->bad_row++;
		} else {
			rd->errors++;
		}
		float r;
		int known;
		if (mfs_snap_predict(s, &u0, &i0, &r, &known) == 0 && known == 3) {
			seen[2] = solve((double)r);
			if (!seen[2])
				rd->bad_pred++;
		} else {
			rd->errors++;
		}
		size_t n = 0;
		if (hits && mfs_snap_topk(s, &u0, max_hits, hits, &n) == 0 && n > 0) {
			uint64_t st = solve((double)hits[0].score);
			if (!st || n != items_for(st))
				rd->bad_topk++;
			for (size_t h = 1; h < n; h++)
				if (hits[h].score != hits[0].score) {
					rd->bad_topk++;
					break;
				}
			seen[3] = st;
		} else {
			rd->errors++;
		}
		/* calls are separate txns: s may only grow from one call to the next */
		for (int c = 0; c < 4; c++) {
			if (seen[c] && seen[c] < rd->last)
				rd->backwards++;
			if (seen[c] > rd->last)
				rd->last = seen[c];
		}
		rd->reads++;
	}
	free(hits);
	mfs_snap_close(s);
	return NULL;
}

#define N_READERS 3

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	const char *dir = test_tmpdir();
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0)
		_exit(writer_main(dir));

	/* wait for the first snapshot with a probe handle */
	char err[512];
	mfs_snap_t *probe = NULL;
	double t0 = mfs_now_s();
	int rc;
	while ((rc = mfs_snap_open(dir, &probe, err, sizeof err)) == MFS_ENOTFOUND && mfs_now_s() - t0 < test_seconds(30)) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	TEST_ASSERT_MSG(rc == 0, "open: %s", err);
	if (rc) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return 1;
	}
	struct reader rd[N_READERS];
	memset(rd, 0, sizeof rd);
	for (int t = 0; t < N_READERS; t++) {
		rd[t].dir = dir;
		TEST_OK(pthread_create(&rd[t].tid, NULL, reader_main, &rd[t]));
	}
	mfs_snap_close(probe); /* the readers' handles keep the shared env alive */
	int status = 0;
	for (;;) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
		if (mfs_now_s() - t0 > test_seconds(120)) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			TEST_ASSERT_MSG(0, "timed out");
			break;
		}
		struct timespec ts = {0, 2000000};
		nanosleep(&ts, NULL);
	}
	atomic_store(&writer_done, 1);
	for (int t = 0; t < N_READERS; t++)
		pthread_join(rd[t].tid, NULL);
	TEST_ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer exit status %d", status);
	for (int t = 0; t < N_READERS; t++) {
		struct reader *r = &rd[t];
		TEST_EQ_INT(r->open_rc, 0);
		TEST_EQ_INT(r->bad_meta, 0);
		TEST_EQ_INT(r->bad_row, 0);
		TEST_EQ_INT(r->bad_pred, 0);
		TEST_EQ_INT(r->bad_topk, 0);
		TEST_EQ_INT(r->backwards, 0);
		TEST_EQ_INT(r->errors, 0);
		TEST_EQ_INT(r->last, S); /* followed the writer to the end, through every map growth */
		TEST_ASSERT_MSG(r->reads >= 10 && r->last > r->first, "reader %d: reads=%ld first=%llu last=%llu", t,
		                r->reads, (unsigned long long)r->first, (unsigned long long)r->last);
		fprintf(stderr, "reader %d: %ld reads, snapshots %llu..%llu\n", t, r->reads,
		        (unsigned long long)r->first, (unsigned long long)r->last);
	}
	char path[512];
	struct stat st;
	snprintf(path, sizeof path, "%s/data.mdb", dir);
	TEST_ASSERT(stat(path, &st) == 0 && st.st_size > 2 * (1 << 20));
	fprintf(stderr, "data.mdb %lld bytes\n", (long long)st.st_size);
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	th_tests = 1;
	th_failed_tests = th_failed_checks ? 1 : 0;
	return TEST_REPORT();
}
