/* test_snapshot.c - snapshot format v1: the writer (snap_writer.c) against libmfsnap.
 *
 * Round trips are compared bit for bit. LMDB asks that one process not open the same env
 * twice at once, so each test closes its writer before opening a reader; where a reader
 * must watch the writer grow the map, the writer runs in a forked child.
 */
#include <errno.h>
#include <lmdb.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/log.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"
#include "model_help.h"

#include "snap_help.h"

static void roundtrip_k(int k)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(k);
	char long_id[257];
	/* 256 bytes of UTF-8: 128 two-byte characters */
	for (int i = 0; i < 128; i++) {
		long_id[2 * i] = (char)0xC3;
		long_id[2 * i + 1] = (char)0xA9;
	}
	long_id[256] = '\0';
	const uint64_t nums[] = {0, 1, 42, 7, UINT64_MAX, (uint64_t)1 << 63, 255, 256};
	for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
		add_user(m, mfs_id_u64(nums[i]));
		add_item(m, mfs_id_u64(nums[i] ^ 1));
	}
	const char *strs[] = {"alice", "007", "42", "bob smith", "str:x", "\xe2\x82\xac", long_id};
	for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
		add_user(m, str_id(strs[i]));
		add_item(m, str_id(strs[i]));
	}
	fill_random(m);
	mfs_snap_info_t in = info_default();
	uint64_t seq = 0;
	int64_t t0 = (int64_t)time(NULL) * 1000;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, &seq));
	TEST_EQ_INT(seq, 1);

	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	mfs_snap_meta_t meta;
	TEST_OK(mfs_snap_get_meta(s, &meta));
	TEST_EQ_INT(meta.format_version, MFS_SNAP_VERSION);
	TEST_EQ_INT(meta.k, k);
	TEST_EQ_INT(meta.n_users, m->n_users);
	TEST_EQ_INT(meta.n_items, m->n_items);
	TEST_EQ_INT(meta.seq, 1);
	TEST_EQ_INT(meta.events_applied, 12345);
	TEST_ASSERT(meta.mu == 3.25);
	TEST_ASSERT(meta.learning_rate == 0.01);
	TEST_ASSERT(isnan(meta.last_loss));
	TEST_ASSERT(meta.rating_min == 1.0 && meta.rating_max == 5.0);
	TEST_ASSERT_MSG(meta.wall_time_ms >= t0 - 1000 && meta.wall_time_ms <= t0 + 60000, "wall %lld",
	                (long long)meta.wall_time_ms);
	check_all_rows(s, m);
	/* u64 7 and string "7" are different ids; "007" is a string */
	mfs_snap_id_t id;
	float bias;
	TEST_OK(mfs_snap_id_parse("7", &id));
	TEST_OK(mfs_snap_user(s, &id, &bias, NULL));
	TEST_OK(mfs_snap_id_parse("str:7", &id));
	TEST_EQ_INT(mfs_snap_user(s, &id, &bias, NULL), MFS_ENOTFOUND);
	TEST_OK(mfs_snap_id_parse("007", &id));
	TEST_EQ_INT(id.kind, MFS_SNAP_ID_STR);
	TEST_OK(mfs_snap_user(s, &id, &bias, NULL));
	TEST_OK(mfs_snap_id_parse(long_id, &id));
	TEST_OK(mfs_snap_user(s, &id, &bias, NULL));
	mfs_snap_close(s);
	mfs_model_free(m);
}

static void test_roundtrip_k1(void) { roundtrip_k(1); }
static void test_roundtrip_k8(void) { roundtrip_k(8); }
static void test_roundtrip_k128(void) { roundtrip_k(128); }

/* ---- seq, partial publish, new rows ----------------------------------------------------- */
static void test_partial_publish(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(4);
	for (uint64_t i = 0; i < 6; i++) {
		add_user(m, mfs_id_u64(100 + i));
		add_item(m, mfs_id_u64(200 + i));
	}
	fill_random(m);
	mfs_snap_info_t in = info_default();
	uint64_t seq = 0;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, &seq));
	TEST_EQ_INT(seq, 1);
	/* keep a copy of the published state */
	mfs_model_t *old = model_new(4);
	for (uint64_t i = 0; i < 6; i++) {
		add_user(old, mfs_id_u64(100 + i));
		add_item(old, mfs_id_u64(200 + i));
	}
	memcpy(old->bu, m->bu, 6 * 4);
	memcpy(old->bi, m->bi, 6 * 4);
	memcpy(old->P, m->P, 6 * 4 * 4);
	memcpy(old->Q, m->Q, 6 * 4 * 4);

	/* change every row, add a user and an item, publish only some of them */
	fill_random(m);
	uint32_t nu = add_user(m, str_id("newcomer"));
	uint32_t ni = add_item(m, mfs_id_u64(1));
	m->bu[nu] = 0.5f;
	m->bi[ni] = -0.5f;
	m->mu = 3.5;
	uint32_t urows[] = {3, 1, nu, 3}; /* unsorted, with a repeat */
	uint32_t irows[] = {ni, 0};
	in.user_rows = urows;
	in.n_user_rows = 4;
	in.item_rows = irows;
	in.n_item_rows = 2;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, &seq));
	TEST_EQ_INT(seq, 2);

	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	mfs_snap_meta_t meta;
	TEST_OK(mfs_snap_get_meta(s, &meta));
	TEST_EQ_INT(meta.seq, 2);
	TEST_EQ_INT(meta.n_users, 7);
	TEST_EQ_INT(meta.n_items, 7);
	TEST_ASSERT(meta.mu == 3.5);
	float bias, vec[4];
	for (uint32_t r = 0; r < 6; r++) {
		mfs_snap_id_t id = {MFS_SNAP_ID_U64, 100 + r, NULL, 0};
		TEST_OK(mfs_snap_user(s, &id, &bias, vec));
		const mfs_model_t *want = (r == 1 || r == 3) ? m : old;
		TEST_ASSERT_MSG(memcmp(&bias, &want->bu[r], 4) == 0 && memcmp(vec, want->P + r * 4, 16) == 0,
		                "user row %u", r);
		id.num = 200 + r;
		TEST_OK(mfs_snap_item(s, &id, &bias, vec));
		want = r == 0 ? m : old;
		TEST_ASSERT_MSG(memcmp(&bias, &want->bi[r], 4) == 0 && memcmp(vec, want->Q + r * 4, 16) == 0,
		                "item row %u", r);
	}
	mfs_snap_id_t id;
	TEST_OK(mfs_snap_id_parse("newcomer", &id));
	TEST_OK(mfs_snap_user(s, &id, &bias, vec));
	TEST_ASSERT(bias == 0.5f);
	TEST_OK(mfs_snap_id_parse("1", &id));
	TEST_OK(mfs_snap_item(s, &id, &bias, vec));
	TEST_ASSERT(bias == -0.5f);
	mfs_snap_close(s);

	/* an empty row list writes no rows but still a new snapshot */
	in.n_user_rows = 0;
	in.n_item_rows = 0;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, &seq));
	TEST_EQ_INT(seq, 3);
	/* a row index beyond the model is refused */
	uint32_t bad = 99;
	in.user_rows = &bad;
	in.n_user_rows = 1;
	TEST_EQ_INT(publish_once(dir, 1 << 20, m, &in, &seq), MFS_EINVAL);
	mfs_model_free(m);
	mfs_model_free(old);
}

/* ---- offsets ------------------------------------------------------------------------------- */
struct offs_seen {
	char keys[16][300];
	int64_t vals[16];
	int n;
	int other;
};

static int collect_offsets(void *ctx, const char *key, size_t key_len, const unsigned char *val, size_t val_len)
{
	struct offs_seen *o = ctx;
	if (mfs_snap_meta_type(key, key_len) == MFS_SNAP_T_UNKNOWN)
		return -1;
	if (key_len > 7 && memcmp(key, MFS_META_OFFSET_PREFIX, 7) == 0 && o->n < 16 && val_len == 8) {
		snprintf(o->keys[o->n], sizeof o->keys[0], "%.*s", (int)key_len, key);
		o->vals[o->n++] = (int64_t)mfs_snap_get_u64(val);
	} else {
		o->other++;
	}
	return 0;
}

static int64_t offset_of(const struct offs_seen *o, const char *key)
{
	for (int i = 0; i < o->n; i++)
		if (strcmp(o->keys[i], key) == 0)
			return o->vals[i];
	return INT64_MIN;
}

static void test_offsets(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(2);
	add_user(m, mfs_id_u64(1));
	add_item(m, mfs_id_u64(2));
	mfs_snap_info_t in = info_default();
	mfs_offset_t offs[] = {{"ratings", 0, 100}, {"ratings", 1, 200}, {"other.topic-x", 12, 1LL << 40}};
	in.offsets = offs;
	in.n_offsets = 3;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, NULL));
	mfs_offset_t offs2[] = {{"ratings", 0, 150}};
	in.offsets = offs2;
	in.n_offsets = 1;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, NULL));
	mfs_offset_t bad[] = {{"a/b", 0, 1}};
	in.offsets = bad;
	TEST_EQ_INT(publish_once(dir, 1 << 20, m, &in, NULL), MFS_EINVAL);

	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	struct offs_seen o;
	memset(&o, 0, sizeof o);
	TEST_OK(mfs_snap_meta_each(s, collect_offsets, &o));
	TEST_EQ_INT(o.n, 3);
	TEST_EQ_INT(o.other, 13); /* every fixed meta key, each of a known type */
	TEST_EQ_INT(offset_of(&o, "offset/ratings/0"), 150);
	TEST_EQ_INT(offset_of(&o, "offset/ratings/1"), 200); /* not named again: kept */
	TEST_EQ_INT(offset_of(&o, "offset/other.topic-x/12"), 1LL << 40);
	mfs_snap_close(s);
	mfs_model_free(m);
}

/* ---- refusals ------------------------------------------------------------------------------ */
static void test_nan_refused(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(3);
	add_user(m, mfs_id_u64(1));
	add_user(m, mfs_id_u64(2));
	add_item(m, mfs_id_u64(3));
	fill_random(m);
	mfs_snap_info_t in = info_default();
	/* the first publish already refused: the directory holds no snapshot */
	float keep = m->P[4];
	m->P[4] = NAN;
	TEST_EQ_INT(publish_once(dir, 1 << 20, m, &in, NULL), MFS_ENAN);
	mfs_snap_t *s = NULL;
	TEST_EQ_INT(mfs_snap_open(dir, &s, errbuf, sizeof errbuf), MFS_ENOTFOUND);
	m->P[4] = keep;
	uint64_t seq;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, &seq));
	TEST_EQ_INT(seq, 1);

	/* later refusals leave snapshot 1 untouched: NaN factor, inf bias, NaN mu, inf loss */
	float good_bias = m->bi[0];
	m->Q[1] = NAN;
	m->bu[0] = 123.0f; /* a valid change that must not be written either */
	TEST_EQ_INT(publish_once(dir, 1 << 20, m, &in, NULL), MFS_ENAN);
	m->Q[1] = 0.0f;
	m->bi[0] = INFINITY;
	TEST_EQ_INT(publish_once(dir, 1 << 20, m, &in, NULL), MFS_ENAN);
	m->bi[0] = good_bias;
	m->mu = NAN;
	TEST_EQ_INT(publish_once(dir, 1 << 20, m, &in, NULL), MFS_ENAN);
	m->mu = 3.0;
	in.last_loss = INFINITY;
	TEST_EQ_INT(publish_once(dir, 1 << 20, m, &in, NULL), MFS_ENAN);
	in.last_loss = NAN;
	/* a NaN in a row that is not published is not looked at */
	m->P[0] = NAN;
	uint32_t only = 1;
	in.user_rows = &only;
	in.n_user_rows = 1;
	in.item_rows = &only;
	in.n_item_rows = 0;
	TEST_OK(publish_once(dir, 1 << 20, m, &in, &seq));
	TEST_EQ_INT(seq, 2);

	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	mfs_snap_id_t id = {MFS_SNAP_ID_U64, 1, NULL, 0};
	float bias;
	TEST_OK(mfs_snap_user(s, &id, &bias, NULL));
	TEST_ASSERT(bias != 123.0f);
	mfs_snap_close(s);
	mfs_model_free(m);
}

static void test_k_and_version_mismatch(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m4 = model_new(4), *m8 = model_new(8);
	add_user(m4, mfs_id_u64(1));
	add_user(m8, mfs_id_u64(1));
	mfs_snap_info_t in = info_default();
	TEST_OK(publish_once(dir, 1 << 20, m4, &in, NULL));
	TEST_EQ_INT(publish_once(dir, 1 << 20, m8, &in, NULL), MFS_EINVAL);
	TEST_ASSERT(strstr(errbuf, "k = 8") != NULL);
	uint64_t seq;
	TEST_OK(publish_once(dir, 1 << 20, m4, &in, &seq));
	TEST_EQ_INT(seq, 2);

	/* rewrite format_version to 2 behind the writer's back */
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	TEST_OK(mdb_env_create(&env));
	mdb_env_set_maxdbs(env, 3);
	TEST_OK(mdb_env_open(env, dir, 0, 0644));
	TEST_OK(mdb_txn_begin(env, NULL, 0, &txn));
	TEST_OK(mdb_dbi_open(txn, MFS_SNAP_DB_META, 0, &dbi));
	unsigned char two[4];
	mfs_snap_put_u32(two, 2);
	MDB_val k = {strlen(MFS_META_VERSION), (void *)MFS_META_VERSION}, v = {4, two};
	TEST_OK(mdb_put(txn, dbi, &k, &v, 0));
	TEST_OK(mdb_txn_commit(txn));
	mdb_env_close(env);

	mfs_snap_writer_t *w = NULL;
	TEST_EQ_INT(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf), MFS_EVERSION);
	mfs_snap_t *s = NULL;
	TEST_EQ_INT(mfs_snap_open(dir, &s, errbuf, sizeof errbuf), MFS_EVERSION);
	TEST_ASSERT(strstr(errbuf, "version 2") != NULL);
	mfs_model_free(m4);
	mfs_model_free(m8);
}

/* One writer per directory: a second one is refused, naming the first one's pid, until the
 * first closes. */
static void test_one_writer(void)
{
	const char *dir = test_tmpdir();
	mfs_snap_writer_t *w1 = NULL, *w2 = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w1, errbuf, sizeof errbuf));
	TEST_EQ_INT(mfs_snap_writer_open(dir, 1 << 20, &w2, errbuf, sizeof errbuf), EBUSY);
	TEST_ASSERT(w2 == NULL);
	char want[64];
	snprintf(want, sizeof want, "in use by another writer (pid %ld", (long)getpid());
	TEST_ASSERT_MSG(strstr(errbuf, want) != NULL, "%s", errbuf);
	mfs_snap_writer_close(w1);
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w2, errbuf, sizeof errbuf));
	mfs_snap_writer_close(w2);
}

/* A replacing publish (`mfstream train --snapshot.mode replace`): the old rows, meta and
 * offsets are gone, seq goes on, and k must still match; mfs_snap_writer_existing says what
 * the directory holds. A replace that fails at its commit leaves the old snapshot whole:
 * readers see the old model or the new one, never a mix. */
static void test_replace(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m16 = model_new(16), *m8 = model_new(8), *mb = model_new(16);
	for (uint64_t i = 0; i < 100; i++)
		add_user(m16, mfs_id_u64(i));
	for (uint64_t i = 0; i < 50; i++)
		add_item(m16, mfs_id_u64(i));
	for (uint64_t i = 1000; i < 1010; i++)
		add_user(mb, mfs_id_u64(i)), add_user(m8, mfs_id_u64(i));
	for (uint64_t i = 1000; i < 1005; i++)
		add_item(mb, mfs_id_u64(i)), add_item(m8, mfs_id_u64(i));
	fill_random(m16);
	fill_random(m8);
	fill_random(mb);
	mfs_snap_writer_t *w = NULL;
	mfs_snap_existing_t ex;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf));
	if (!w)
		return;
	TEST_OK(mfs_snap_writer_existing(w, &ex, errbuf, sizeof errbuf));
	TEST_ASSERT(ex.seq == 0 && ex.k == 0 && ex.n_users == 0 && ex.n_items == 0);
	mfs_snap_info_t in = info_default();
	mfs_offset_t offs[] = {{"ratings", 0, 100}};
	in.offsets = offs;
	in.n_offsets = 1;
	uint64_t seq = 0;
	TEST_OK(mfs_snap_publish(w, m16, &in, &seq, errbuf, sizeof errbuf));
	TEST_OK(mfs_snap_writer_existing(w, &ex, errbuf, sizeof errbuf));
	TEST_ASSERT(ex.seq == 1 && ex.k == 16 && ex.n_users == 100 && ex.n_items == 50);
	mfs_snap_info_t rin = info_default();
	rin.replace = 1;
	TEST_EQ_INT(mfs_snap_publish(w, m8, &rin, NULL, errbuf, sizeof errbuf), MFS_EINVAL); /* k differs */
	TEST_ASSERT_MSG(strstr(errbuf, "k = 16") != NULL, "%s", errbuf);
	TEST_OK(mfs_snap_publish(w, mb, &rin, &seq, errbuf, sizeof errbuf));
	TEST_EQ_INT(seq, 2);
	TEST_OK(mfs_snap_writer_existing(w, &ex, errbuf, sizeof errbuf));
	TEST_ASSERT(ex.seq == 2 && ex.k == 16 && ex.n_users == 10 && ex.n_items == 5);
	mfs_snap_writer_close(w);

	/* a replace whose commit fails changes nothing */
	TEST_OK(mfs_fault_arm("snapshot.commit=EIO", errbuf, sizeof errbuf));
	rin.replace = 1;
	TEST_ASSERT(publish_once(dir, 1 << 20, m16, &rin, NULL) != 0);
	TEST_OK(mfs_fault_arm(NULL, errbuf, sizeof errbuf));

	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (s) {
		mfs_snap_meta_t meta;
		TEST_OK(mfs_snap_get_meta(s, &meta));
		TEST_ASSERT_MSG(meta.seq == 2 && meta.k == 16 && meta.n_users == 10 && meta.n_items == 5,
		                "seq %llu k %u users %llu items %llu", (unsigned long long)meta.seq, (unsigned)meta.k,
		                (unsigned long long)meta.n_users, (unsigned long long)meta.n_items);
		check_all_rows(s, mb);
		float bias, vec[16];
		mfs_snap_id_t old = snap_id_of(mfs_id_u64(0));
		TEST_EQ_INT(mfs_snap_user(s, &old, &bias, vec), MFS_ENOTFOUND);
		struct offs_seen o;
		memset(&o, 0, sizeof o);
		TEST_OK(mfs_snap_meta_each(s, collect_offsets, &o));
		TEST_EQ_INT(o.n, 0); /* the old offsets went with the old model */
		mfs_snap_close(s);
	}
	mfs_model_free(m16);
	mfs_model_free(m8);
	mfs_model_free(mb);
}

/* ---- map growth ------------------------------------------------------------------------------ */
static void test_map_grows(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(128);
	add_user(m, mfs_id_u64(0));
	add_item(m, mfs_id_u64(0));
	mfs_snap_info_t in = info_default();
	TEST_OK(publish_once(dir, 1 << 20, m, &in, NULL));
	/* this reader's map is 1 MiB; it must follow the writer's growth (MAP_RESIZED) */
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	/* ~4 MiB of rows into a 1 MiB map; the writer runs in a child so the two envs live in
	 * different processes, as LMDB requires */
	for (uint64_t i = 1; i < 4000; i++) {
		add_user(m, mfs_id_u64(i));
		add_item(m, mfs_id_u64(i * 3));
	}
	fill_random(m);
	pid_t pid = fork();
	if (pid == 0) {
		uint64_t seq = 0;
		int rc = publish_once(dir, 1 << 20, m, &in, &seq);
		if (rc)
			fprintf(stderr, "child publish: %s\n", errbuf);
		_exit(rc == 0 && seq == 2 ? 0 : 1);
	}
	int status = 0;
	TEST_ASSERT(pid > 0 && waitpid(pid, &status, 0) == pid);
	TEST_ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
	struct stat st;
	char path[512];
	snprintf(path, sizeof path, "%s/data.mdb", dir);
	TEST_OK(stat(path, &st));
	TEST_ASSERT_MSG(st.st_size > (1 << 20), "data.mdb is %lld bytes", (long long)st.st_size);
	mfs_snap_meta_t meta;
	TEST_OK(mfs_snap_get_meta(s, &meta));
	TEST_EQ_INT(meta.seq, 2);
	TEST_EQ_INT(meta.n_users, 4000);
	check_all_rows(s, m);
	mfs_snap_close(s);
	mfs_model_free(m);
}

/* ---- predict and top-K --------------------------------------------------------------------------- */
static void set_row(mfs_model_t *m, int ent, uint32_t row, float bias, float f0, float f1)
{
	(ent ? m->bi : m->bu)[row] = bias;
	float *F = (ent ? m->Q : m->P) + (size_t)row * 2;
	F[0] = f0;
	F[1] = f1;
}

static void test_predict(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(2);
	m->mu = 3.0;
	set_row(m, 0, add_user(m, str_id("u1")), 0.5f, 1.0f, 2.0f);
	set_row(m, 1, add_item(m, str_id("i1")), -0.25f, 0.5f, 0.25f);
	set_row(m, 1, add_item(m, str_id("hi")), 0.0f, 10.0f, 10.0f);
	set_row(m, 1, add_item(m, str_id("lo")), 0.0f, -10.0f, -10.0f);
	mfs_snap_info_t in = info_default();
	TEST_OK(publish_once(dir, 1 << 20, m, &in, NULL));
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	mfs_snap_id_t u, i, nu, ni;
	mfs_snap_id_parse("u1", &u);
	mfs_snap_id_parse("i1", &i);
	mfs_snap_id_parse("nobody", &nu);
	mfs_snap_id_parse("12345", &ni);
	float r = 0;
	int known = -1;
	TEST_OK(mfs_snap_predict(s, &u, &i, &r, &known));
	TEST_ASSERT_MSG(r == 4.25f, "%g", r); /* 3 + .5 - .25 + (.5 + .5) */
	TEST_EQ_INT(known, 3);
	TEST_OK(mfs_snap_predict(s, &nu, &i, &r, &known));
	TEST_ASSERT_MSG(r == 2.75f, "%g", r); /* mu + b_i */
	TEST_EQ_INT(known, 2);
	TEST_OK(mfs_snap_predict(s, &u, &ni, &r, &known));
	TEST_ASSERT_MSG(r == 3.5f, "%g", r); /* mu + b_u */
	TEST_EQ_INT(known, 1);
	TEST_OK(mfs_snap_predict(s, &nu, &ni, &r, NULL));
	TEST_ASSERT_MSG(r == 3.0f, "%g", r); /* mu */
	mfs_snap_id_parse("hi", &i);
	TEST_OK(mfs_snap_predict(s, &u, &i, &r, NULL));
	TEST_ASSERT_MSG(r == 5.0f, "%g", r); /* clipped to rating_max */
	mfs_snap_id_parse("lo", &i);
	TEST_OK(mfs_snap_predict(s, &u, &i, &r, NULL));
	TEST_ASSERT_MSG(r == 1.0f, "%g", r); /* clipped to rating_min */
	mfs_snap_id_t empty = {MFS_SNAP_ID_STR, 0, "", 0};
	TEST_EQ_INT(mfs_snap_predict(s, &empty, &i, &r, NULL), MFS_EIDLEN);
	mfs_snap_close(s);
	mfs_model_free(m);
}

static void test_topk(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(2);
	m->mu = 0.0;
	set_row(m, 0, add_user(m, mfs_id_u64(1)), 0.0f, 1.0f, 0.0f);
	/* item j scores (j * 37) % 50 / 8 (distinct); plus two ties at score 100 */
	for (uint32_t j = 0; j < 50; j++)
		set_row(m, 1, add_item(m, mfs_id_u64(1000 + j)), 0.0f, (float)((j * 37) % 50) / 8.0f, 5.0f);
	set_row(m, 1, add_item(m, str_id("tie-b")), 0.0f, 100.0f, 0.0f);
	set_row(m, 1, add_item(m, str_id("tie-a")), 0.0f, 100.0f, 0.0f);
	mfs_snap_info_t in = info_default();
	TEST_OK(publish_once(dir, 1 << 20, m, &in, NULL));
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	mfs_snap_id_t u = {MFS_SNAP_ID_U64, 1, NULL, 0};
	mfs_snap_hit_t hits[100];
	size_t n = 0;
	TEST_OK(mfs_snap_topk(s, &u, 5, hits, &n));
	TEST_EQ_INT(n, 5);
	TEST_EQ_INT(hits[0].kind, MFS_SNAP_ID_STR);
	TEST_STR_EQ(hits[0].str, "tie-a"); /* equal scores: smaller key first */
	TEST_STR_EQ(hits[1].str, "tie-b");
	TEST_ASSERT(hits[0].score == 100.0f && hits[1].score == 100.0f);
	/* then scores 49/8, 48/8, 47/8 (unclipped) */
	for (int r = 2; r < 5; r++) {
		TEST_EQ_INT(hits[r].kind, MFS_SNAP_ID_U64);
		TEST_ASSERT_MSG(hits[r].score == (float)(51 - r) / 8.0f, "rank %d score %g", r, hits[r].score);
		TEST_EQ_INT((hits[r].num - 1000) * 37 % 50, 51 - r);
	}
	TEST_OK(mfs_snap_topk(s, &u, 100, hits, &n));
	TEST_EQ_INT(n, 52); /* K > n_items */
	int sorted = 1;
	for (size_t r = 1; r < n; r++)
		sorted &= hits[r - 1].score >= hits[r].score;
	TEST_ASSERT(sorted);
	TEST_ASSERT(hits[51].score == 0.0f);
	TEST_OK(mfs_snap_topk(s, &u, 0, hits, &n));
	TEST_EQ_INT(n, 0);
	mfs_snap_id_t nobody = {MFS_SNAP_ID_U64, 2, NULL, 0};
	TEST_EQ_INT(mfs_snap_topk(s, &nobody, 5, hits, &n), MFS_ENOTFOUND);
	mfs_snap_close(s);
	mfs_model_free(m);
}

/* ---- open, ids, errors ------------------------------------------------------------------------------ */
static void test_open_empty(void)
{
	const char *dir = test_tmpdir();
	mfs_snap_t *s = NULL;
	errbuf[0] = '\0';
	TEST_EQ_INT(mfs_snap_open(dir, &s, errbuf, sizeof errbuf), MFS_ENOTFOUND);
	TEST_ASSERT_MSG(strstr(errbuf, "no snapshot") != NULL, "errstr: %s", errbuf);
	TEST_ASSERT(s == NULL);
	char missing[512];
	snprintf(missing, sizeof missing, "%s/nope", dir);
	TEST_EQ_INT(mfs_snap_open(missing, &s, errbuf, sizeof errbuf), MFS_ENOTFOUND);
	/* a writer that opened the env but published nothing */
	mfs_snap_writer_t *w = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf));
	mfs_snap_writer_close(w);
	TEST_EQ_INT(mfs_snap_open(dir, &s, errbuf, sizeof errbuf), MFS_ENOTFOUND);
	TEST_ASSERT_MSG(strstr(errbuf, "no snapshot") != NULL, "errstr: %s", errbuf);
	/* ... and it can still be opened once something is published */
	mfs_model_t *m = model_new(2);
	add_user(m, mfs_id_u64(5));
	mfs_snap_info_t in = info_default();
	TEST_OK(publish_once(dir, 1 << 20, m, &in, NULL));
	mfs_snap_t *a = NULL, *b = NULL;
	TEST_OK(mfs_snap_open(dir, &a, errbuf, sizeof errbuf));
	TEST_OK(mfs_snap_open(dir, &b, errbuf, sizeof errbuf)); /* shares a's env */
	mfs_snap_close(a);
	mfs_snap_id_t id = {MFS_SNAP_ID_U64, 5, NULL, 0};
	float bias = 1;
	TEST_OK(mfs_snap_user(b, &id, &bias, NULL));
	TEST_ASSERT(bias == 0.0f);
	mfs_snap_close(b);
	mfs_model_free(m);
}

static void test_id_parse(void)
{
	mfs_snap_id_t id;
	TEST_OK(mfs_snap_id_parse("42", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_U64 && id.num == 42);
	TEST_OK(mfs_snap_id_parse("0", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_U64 && id.num == 0);
	TEST_OK(mfs_snap_id_parse("18446744073709551615", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_U64 && id.num == UINT64_MAX);
	TEST_OK(mfs_snap_id_parse("18446744073709551616", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_STR && id.len == 20);
	TEST_OK(mfs_snap_id_parse("042", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_STR && id.len == 3);
	TEST_OK(mfs_snap_id_parse("-1", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_STR);
	TEST_OK(mfs_snap_id_parse("str:42", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_STR && id.len == 2 && memcmp(id.str, "42", 2) == 0);
	TEST_OK(mfs_snap_id_parse("str:str:x", &id));
	TEST_ASSERT(id.kind == MFS_SNAP_ID_STR && id.len == 5);
	TEST_EQ_INT(mfs_snap_id_parse("", &id), MFS_EIDLEN);
	TEST_EQ_INT(mfs_snap_id_parse("str:", &id), MFS_EIDLEN);
	char big[258];
	memset(big, 'a', 257);
	big[257] = '\0';
	TEST_EQ_INT(mfs_snap_id_parse(big, &id), MFS_EIDLEN);
	big[256] = '\0';
	TEST_OK(mfs_snap_id_parse(big, &id));
	/* same rules as model_store's parser */
	const char *cases[] = {"7", "007", "str:7", "abc", "18446744073709551616", "0", "str:str:"};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		mfs_id_t mid;
		TEST_OK(mfs_id_parse(cases[c], strlen(cases[c]), &mid));
		TEST_OK(mfs_snap_id_parse(cases[c], &id));
		TEST_ASSERT_MSG(mid.kind == id.kind && (mid.kind == MFS_ID_U64 ? mid.num == id.num
		                                                                 : mid.len == id.len &&
		                                                                       memcmp(mid.str, id.str, id.len) == 0),
		                "case %s", cases[c]);
	}
	TEST_ASSERT(strcmp(mfs_snap_strerror(MDB_MAP_RESIZED), mdb_strerror(MDB_MAP_RESIZED)) == 0);
	TEST_STR_EQ(mfs_snap_strerror(MFS_ENOTFOUND), "not found");
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	/* every test_tmpdir() below lands in one directory, removed at the end */
	char root[512], cmd[600];
	snprintf(root, sizeof root, "%s", test_tmpdir());
	setenv("TMPDIR", root, 1);
	TEST_RUN(test_id_parse);
	TEST_RUN(test_roundtrip_k1);
	TEST_RUN(test_roundtrip_k8);
	TEST_RUN(test_roundtrip_k128);
	TEST_RUN(test_partial_publish);
	TEST_RUN(test_offsets);
	TEST_RUN(test_nan_refused);
	TEST_RUN(test_k_and_version_mismatch);
	TEST_RUN(test_one_writer);
	TEST_RUN(test_replace);
	TEST_RUN(test_map_grows);
	TEST_RUN(test_predict);
	TEST_RUN(test_topk);
	TEST_RUN(test_open_empty);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return TEST_REPORT();
}
