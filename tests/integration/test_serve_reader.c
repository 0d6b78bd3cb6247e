/* test_serve_reader.c - a reader in another process sees only whole snapshots while the
 * stream runs. `mfstream serve` consumes a topic that is produced in rounds while a forked
 * reader opens the LMDB environment and, in ONE read transaction per look, records the meta
 * record (seq, counters, digest, offsets) and the number of user and item records, and checks
 * a run of rows for size and finite values. Afterwards every look must be a whole snapshot:
 * n_users/n_items equal the records present, and applied + held out, digest and rating sum
 * equal those of the valid events below the offsets it stores.
 */
#include "serve_help.h"

#include <lmdb.h>

#include "snapshots/snap_format.h"

#define N_PARTS 3
#define ROUNDS 6
#define PER_ROUND 15000

typedef struct look {
	sh_snap_t s;
	uint64_t n_users, n_items, users_in_db, items_in_db;
	int rows_ok;
} look_t;

static int K; /* the k serve runs with (sh_k) */

static int meta_u64(MDB_txn *t, MDB_dbi d, const char *key, uint64_t *v)
{
	MDB_val k = {strlen(key), (void *)(uintptr_t)key}, val;
	if (mdb_get(t, d, &k, &val) || val.mv_size != 8)
		return -1;
	*v = mfs_snap_get_u64(val.mv_data);
	return 0;
}

/* one look in one read txn; 1 if a snapshot exists */
static int look_once(MDB_env *env, look_t *l)
{
	MDB_txn *t;
	int rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &t);
	if (rc == MDB_MAP_RESIZED) {
		mdb_env_set_mapsize(env, 0);
		rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &t);
	}
	if (rc)
		return 0;
	MDB_dbi dm, du, di;
	int ok = 0;
	memset(l, 0, sizeof *l);
	for (int p = 0; p < SH_MAX_PARTS; p++)
		l->s.off[p] = -1;
	if (mdb_dbi_open(t, MFS_SNAP_DB_META, 0, &dm) || mdb_dbi_open(t, MFS_SNAP_DB_USERS, 0, &du) ||
	    mdb_dbi_open(t, MFS_SNAP_DB_ITEMS, 0, &di))
		goto out;
	uint64_t sum_bits = 0;
	if (meta_u64(t, dm, MFS_META_SEQ, &l->s.seq) || meta_u64(t, dm, MFS_META_N_USERS, &l->n_users) ||
	    meta_u64(t, dm, MFS_META_N_ITEMS, &l->n_items) || meta_u64(t, dm, MFS_META_EVENTS, &l->s.events))
		goto out;
	meta_u64(t, dm, MFS_META_HELD_OUT, &l->s.held_out);
	meta_u64(t, dm, MFS_META_DIGEST, &l->s.digest);
	meta_u64(t, dm, MFS_META_MU_COUNT, &l->s.mu_count);
	if (meta_u64(t, dm, MFS_META_MU_SUM, &sum_bits) == 0)
		memcpy(&l->s.mu_sum, &sum_bits, sizeof sum_bits);
	MDB_cursor *c;
	MDB_val k, v;
	if (mdb_cursor_open(t, dm, &c) == 0) {
		const char *pre = MFS_META_OFFSET_PREFIX;
		size_t pl = strlen(pre);
		for (int r = mdb_cursor_get(c, &k, &v, MDB_FIRST); r == 0; r = mdb_cursor_get(c, &k, &v, MDB_NEXT))
			if (k.mv_size > pl && memcmp(k.mv_data, pre, pl) == 0 && v.mv_size == 8) {
				const char *key = k.mv_data, *slash = NULL;
				for (size_t j = k.mv_size; j > pl; j--)
					if (key[j - 1] == '/') {
						slash = key + j - 1;
						break;
					}
				char num[16] = "";
				size_t nl = slash ? (size_t)(key + k.mv_size - slash - 1) : 0;
				if (nl > 0 && nl < sizeof num)
					memcpy(num, slash + 1, nl); /* keys are not NUL-terminated */
				int p = *num ? atoi(num) : -1;
				if (p >= 0 && p < SH_MAX_PARTS)
					l->s.off[p] = (int64_t)mfs_snap_get_u64(v.mv_data);
			}
		mdb_cursor_close(c);
	}
	MDB_stat st;
	mdb_stat(t, du, &st);
	l->users_in_db = st.ms_entries;
	mdb_stat(t, di, &st);
	l->items_in_db = st.ms_entries;
	l->rows_ok = 1;
	if (mdb_cursor_open(t, du, &c) == 0) { /* a run of rows: bias + K finite floats */
		int n = 0;
		for (int r = mdb_cursor_get(c, &k, &v, MDB_FIRST); r == 0 && n < 200; r = mdb_cursor_get(c, &k, &v, MDB_NEXT), n++) {
			if (v.mv_size != (size_t)(K + 1) * sizeof(float)) {
				l->rows_ok = 0;
				break;
			}
			for (int j = 0; j <= K; j++) {
				float f;
				memcpy(&f, (const char *)v.mv_data + j * sizeof f, sizeof f);
				if (!isfinite(f))
					l->rows_ok = 0;
			}
		}
		mdb_cursor_close(c);
	}
	l->s.found = 1;
	ok = 1;
out:
	mdb_txn_abort(t);
	return ok;
}

/* the reader process: look until the parent kills it, append looks to path */
static void reader_main(const char *snap, const char *path)
{
	FILE *f = fopen(path, "wb");
	MDB_env *env = NULL;
	while (!env) {
		char lock[400];
		snprintf(lock, sizeof lock, "%s/lock.mdb", snap);
		if (access(lock, F_OK) == 0 && mdb_env_create(&env) == 0) {
			mdb_env_set_maxdbs(env, MFS_SNAP_MAX_DBS);
			mdb_env_set_maxreaders(env, MFS_SNAP_MAX_READERS);
			if (mdb_env_open(env, snap, MDB_RDONLY, 0644)) {
				mdb_env_close(env);
				env = NULL;
			}
		}
		if (!env)
			nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	}
	for (;;) {
		look_t l;
		if (look_once(env, &l)) {
			fwrite(&l, sizeof l, 1, f);
			fflush(f);
		}
		nanosleep(&(struct timespec){0, 2 * 1000000}, NULL);
	}
}

static void test_reader_sees_whole_snapshots(void)
{
	sh_env_t v;
	const char *topic = "ratings-reader";
	if (sh_env_open(&v, 1, topic, N_PARTS))
		return;
	topic = v.topic; /* its name on this broker */
	const char *bs = v.bs, *snap = v.snap, *log = v.log;
	char looks[320];
	snprintf(looks, sizeof looks, "%s/looks.bin", v.dir);
	const char *const extra[] = {"--serve.holdout_fraction", "0.1", "--test.apply_delay_ms", "3", NULL};
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-reader", log, NULL, extra);
	fflush(NULL);
	pid_t rpid = fork();
	if (rpid == 0) {
		reader_main(snap, looks);
		_exit(0);
	}
	uint64_t total = 0;
	int died;
	sh_snap_t s;
	for (int r = 0; r < ROUNDS; r++) { /* the stream runs while the reader reads */
		total += sh_produce_valid(bs, topic, PER_ROUND, 300 + r);
		if (r == 0) { /* wait for the consumer group to form */
			s = sh_wait_events(snap, pid, 1, 60, &died);
			TEST_ASSERT_MSG(!died && s.found, "serve did not start (log %s)", log);
		}
		nanosleep(&(struct timespec){0, 400 * 1000000}, NULL);
	}
	double t_end = mfs_now_s() + test_seconds(60);
	do {
		s = sh_wait_events(snap, pid, 1, 5, &died);
		if (s.events + s.held_out >= total)
			break;
		nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	} while (!died && mfs_now_s() < t_end);
	nanosleep(&(struct timespec){0, 300 * 1000000}, NULL);
	int rst = 0;
	TEST_ASSERT_MSG(waitpid(rpid, &rst, WNOHANG) == 0, "the reader died (status %d)", rst);
	kill(rpid, SIGKILL);
	waitpid(rpid, NULL, 0);
	TEST_ASSERT_MSG(s.events + s.held_out == total, "applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events, total, log);
	TEST_EQ_INT(sh_stop(pid, 30), 0);

	int64_t lo[N_PARTS], hi[N_PARTS];
	sh_watermarks(bs, topic, N_PARTS, lo, hi);
	sh_topic_t t;
	sh_topic_read(bs, topic, N_PARTS, hi, &t);
	FILE *f = fopen(looks, "rb");
	TEST_ASSERT(f != NULL);
	look_t l;
	long n = 0, bad = 0;
	uint64_t seqs = 0, last_seq = 0;
	while (f && fread(&l, sizeof l, 1, f) == 1) {
		n++;
		int whole = l.users_in_db == l.n_users && l.items_in_db == l.n_items && l.rows_ok &&
		            sh_snap_consistent(&t, &l.s, bad < 5);
		if (!whole && bad++ < 5)
			fprintf(stderr, "  look %ld: seq %" PRIu64 " n_users %" PRIu64 " (db %" PRIu64 ") n_items %" PRIu64
			        " (db %" PRIu64 ") rows_ok %d\n", n, l.s.seq, l.n_users, l.users_in_db, l.n_items, l.items_in_db,
			        l.rows_ok);
		TEST_ASSERT_MSG(l.s.seq >= last_seq, "seq went back: %" PRIu64 " after %" PRIu64, l.s.seq, last_seq);
		if (l.s.seq != last_seq)
			seqs++;
		last_seq = l.s.seq;
	}
	if (f)
		fclose(f);
	fprintf(stderr, "  %ld looks over %" PRIu64 " distinct snapshots, %ld not whole\n", n, seqs, bad);
	TEST_ASSERT_MSG(n > 100 && seqs >= 5, "too few looks (%ld) or snapshots (%" PRIu64 ")", n, seqs);
	TEST_EQ_INT(bad, 0);
	sh_topic_free(&t);
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	K = sh_k();
	TEST_RUN(test_reader_sees_whole_snapshots);
	return TEST_REPORT();
}
