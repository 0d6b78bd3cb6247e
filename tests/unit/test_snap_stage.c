/* test_snap_stage.c - staged snapshots (snap_writer.h: mfs_snap_stage_*): a stage is a copy
 * independent of the model, sorted on publish, filled by ids and then by values from another
 * thread; and the sync modes (snapshot.sync). Read back through libmfsnap, bit for bit.
 */
#include <errno.h>
#include <lmdb.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "common/par.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"
#include "model_help.h"

#include "snap_help.h"

/* A stage is a copy: what the model does after mfs_snap_stage_fill (new values, new rows, a
 * bigger idmap that moves its strings) does not change what mfs_snap_publish_stage writes.
 * Filling from a model with a NaN fails. */
static void test_stage_is_a_copy(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(8);
	add_user(m, str_id("alice"));
	add_user(m, mfs_id_u64(5));
	add_item(m, str_id("book"));
	fill_random(m);
	float want_b = m->bu[0], want_f = m->P[3];
	mfs_snap_stage_t *st = mfs_snap_stage_new();
	TEST_ASSERT(st != NULL);
	mfs_snap_info_t in = info_default();
	TEST_OK(mfs_snap_stage_fill(st, m, &in, errbuf, sizeof errbuf));
	/* the model moves on */
	m->bu[0] += 1.0f;
	m->P[3] += 1.0f;
	char name[32];
	for (int j = 0; j < 2000; j++) {
		snprintf(name, sizeof name, "user-%d", j);
		add_user(m, str_id(name));
	}
	mfs_snap_writer_t *w = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf));
	if (!w)
		return;
	uint64_t seq = 0;
	TEST_OK(mfs_snap_publish_stage(w, st, &in, &seq, errbuf, sizeof errbuf));
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (s) {
		mfs_snap_meta_t meta;
		TEST_OK(mfs_snap_get_meta(s, &meta));
		TEST_EQ_INT(meta.n_users, 2);
		float v[8], bias;
		mfs_snap_id_t id = snap_id_of(str_id("alice"));
		TEST_OK(mfs_snap_user(s, &id, &bias, v));
		TEST_ASSERT_MSG(bias == want_b && v[3] == want_f, "staged values: bias %g (want %g), f3 %g (want %g)", bias,
		                want_b, v[3], want_f);
		mfs_snap_close(s);
	}
	/* a NaN: the fill fails */
	m->Q[2] = NAN;
	TEST_EQ_INT(mfs_snap_stage_fill(st, m, &in, errbuf, sizeof errbuf), MFS_ENAN);
	mfs_snap_writer_close(w);
	mfs_snap_stage_free(st);
	mfs_model_free(m);
}

/* A stage of rows named out of key order, with repeats, string and u64 ids mixed: the fill
 * keeps them as given and mfs_snap_publish_stage sorts them (the writer thread's share), so
 * each distinct row is written once with its own values; publishing the same stage again
 * writes the same rows. */
static void test_stage_sorts_on_publish(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(4);
	add_user(m, str_id("zed"));   /* row 0 */
	add_user(m, mfs_id_u64(900)); /* row 1 */
	add_user(m, str_id("amy"));   /* row 2 */
	add_user(m, mfs_id_u64(3));   /* row 3 */
	add_user(m, str_id("nobody")); /* row 4: not staged */
	add_item(m, mfs_id_u64(1));
	fill_random(m);
	static const uint32_t rows[] = {2, 0, 3, 1, 2, 0, 3};
	mfs_snap_info_t in = info_default();
	in.user_rows = rows;
	in.n_user_rows = sizeof rows / sizeof rows[0];
	in.item_rows = rows; /* row 0 only */
	in.n_item_rows = 0;
	mfs_snap_stage_t *st = mfs_snap_stage_new();
	TEST_ASSERT(st != NULL);
	TEST_OK(mfs_snap_stage_fill(st, m, &in, errbuf, sizeof errbuf));
	mfs_snap_writer_t *w = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf));
	if (!w)
		return;
	for (int rep = 0; rep < 2; rep++) {
		uint64_t seq = 0;
		TEST_OK(mfs_snap_publish_stage(w, st, &in, &seq, errbuf, sizeof errbuf));
		TEST_EQ_INT(seq, rep + 1);
		mfs_snap_t *s = NULL;
		TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
		if (!s)
			continue;
		mfs_snap_meta_t meta;
		TEST_OK(mfs_snap_get_meta(s, &meta));
		TEST_EQ_INT(meta.n_users, 4);
		const mfs_id_t ids[] = {str_id("zed"), mfs_id_u64(900), str_id("amy"), mfs_id_u64(3)};
		for (int r = 0; r < 4; r++) {
			float v[4], bias;
			mfs_snap_id_t id = snap_id_of(ids[r]);
			TEST_OK(mfs_snap_user(s, &id, &bias, v));
			TEST_ASSERT_MSG(bias == m->bu[r] && memcmp(v, m->P + 4 * r, sizeof v) == 0, "row %d", r);
		}
		mfs_snap_id_t none = snap_id_of(str_id("nobody"));
		float bias;
		TEST_ASSERT(mfs_snap_user(s, &none, &bias, NULL) != 0);
		mfs_snap_close(s);
	}
	mfs_snap_writer_close(w);
	mfs_snap_stage_free(st);
	mfs_model_free(m);
}

/* Many u64 ids in no order (the radix sort's case: ids over the whole 64-bit range, ids that
 * share their high bits, repeats in the row list), published twice from copied stages: into
 * an empty DB (every put an MDB_APPEND, which refuses a key out of order) and into the one
 * holding them (plain puts, the rows in another order). Every row reads back as staged. */
static void test_stage_sorts_many(void)
{
	enum { N = 3000 };
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(4);
	uint64_t x = 88172645463325252u;
	static mfs_id_t ids[N];
	for (int r = 0; r < N; r++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		/* a third anywhere, a third under one high prefix, a third small */
		ids[r] = mfs_id_u64(r % 3 == 0 ? x : r % 3 == 1 ? (0xABCDull << 48) | (x >> 20) : x % 100000);
		uint32_t row = add_user(m, ids[r]);
		if (row != (uint32_t)r) { /* a repeat of a small id: give it a fresh one */
			ids[r] = mfs_id_u64(((uint64_t)1 << 40) + (uint64_t)r);
			TEST_EQ_INT(add_user(m, ids[r]), r);
		}
	}
	add_item(m, mfs_id_u64(1));
	static uint32_t rows[N + N / 4];
	mfs_snap_writer_t *w = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 24, &w, errbuf, sizeof errbuf));
	if (!w)
		return;
	mfs_snap_stage_t *st = mfs_snap_stage_new();
	TEST_ASSERT(st != NULL);
	for (int rep = 0; rep < 2; rep++) {
		fill_random(m);
		for (int i = 0; i < N; i++) /* every row, in a shuffled order */
			rows[i] = (uint32_t)i;
		for (int i = N - 1; i > 0; i--) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			int j = (int)(x % (uint64_t)(i + 1));
			uint32_t t = rows[i];
			rows[i] = rows[j], rows[j] = t;
		}
		for (int i = N; i < N + N / 4; i++) /* and some twice */
			rows[i] = rows[(size_t)i * 7 % N];
		mfs_snap_info_t in = info_default();
		in.user_rows = rows;
		in.n_user_rows = N + N / 4;
		in.item_rows = rows;
		in.n_item_rows = 0;
		uint64_t seq = 0;
		TEST_OK(mfs_snap_stage_fill(st, m, &in, errbuf, sizeof errbuf));
		TEST_OK(mfs_snap_publish_stage(w, st, &in, &seq, errbuf, sizeof errbuf));
		mfs_snap_t *s = NULL;
		TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
		if (!s)
			continue;
		mfs_snap_meta_t meta;
		TEST_OK(mfs_snap_get_meta(s, &meta));
		TEST_EQ_INT(meta.n_users, N);
		int bad = 0;
		for (int r = 0; r < N; r++) {
			float v[4], bias;
			mfs_snap_id_t id = snap_id_of(ids[r]);
			if (mfs_snap_user(s, &id, &bias, v) || bias != m->bu[r] || memcmp(v, m->P + 4 * r, sizeof v))
				bad++;
		}
		TEST_ASSERT_MSG(bad == 0, "publish %d: %d of %d rows wrong or missing", rep, bad, N);
		mfs_snap_close(s);
	}
	mfs_snap_writer_close(w);
	mfs_snap_stage_free(st);
	mfs_model_free(m);
}

/* A stage filled by ids takes its values later (a device engine's capture), per row in the
 * order the rows were named: what is written is those values, not the model's; a non-finite
 * value refuses the publish (nothing written, the last snapshot stays); a published stage
 * has no values to give until the next fill. */
static void test_stage_ids_then_values(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(4);
	add_user(m, str_id("zed"));   /* row 0 */
	add_user(m, mfs_id_u64(900)); /* row 1 */
	add_item(m, mfs_id_u64(1));   /* row 0 */
	fill_random(m);
	static const uint32_t urows[] = {1, 0}, irows[] = {0};
	mfs_snap_info_t in = info_default();
	in.user_rows = urows, in.n_user_rows = 2, in.item_rows = irows, in.n_item_rows = 1;
	mfs_snap_stage_t *st = mfs_snap_stage_new();
	TEST_ASSERT(st != NULL);
	TEST_ASSERT(mfs_snap_stage_values(st, 0, NULL) == NULL); /* not filled by ids */
	m->P[1] = NAN; /* the model's values are not the stage's: no check at fill */
	TEST_OK(mfs_snap_stage_fill_ids(st, m, &in, NULL, errbuf, sizeof errbuf));
	size_t nu = 0, ni = 0;
	float *vu = mfs_snap_stage_values(st, 0, &nu), *vi = mfs_snap_stage_values(st, 1, &ni);
	TEST_ASSERT(vu != NULL && vi != NULL && nu == 2 && ni == 1 && mfs_snap_stage_values(st, 2, NULL) == NULL);
	if (!vu || !vi)
		return;
	for (int j = 0; j < 2 * 5; j++)
		vu[j] = 10.0f * (float)(j / 5) + (float)(j % 5); /* user urows[j / 5]: bias, f0..f3 */
	for (int j = 0; j < 5; j++)
		vi[j] = -1.0f - (float)j;
	mfs_snap_writer_t *w = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf));
	if (!w)
		return;
	uint64_t seq = 0;
	TEST_OK(mfs_snap_publish_stage(w, st, &in, &seq, errbuf, sizeof errbuf));
	TEST_ASSERT(mfs_snap_stage_values(st, 0, NULL) == NULL); /* sorted and written */
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (s) {
		float v[4], bias;
		mfs_snap_id_t id = snap_id_of(mfs_id_u64(900)); /* named first: the first values */
		TEST_OK(mfs_snap_user(s, &id, &bias, v));
		TEST_ASSERT_MSG(bias == 0 && v[0] == 1 && v[3] == 4, "user 900: %g %g %g", bias, v[0], v[3]);
		id = snap_id_of(str_id("zed"));
		TEST_OK(mfs_snap_user(s, &id, &bias, v));
		TEST_ASSERT_MSG(bias == 10 && v[0] == 11 && v[3] == 14, "user zed: %g %g %g", bias, v[0], v[3]);
		id = snap_id_of(mfs_id_u64(1));
		TEST_OK(mfs_snap_item(s, &id, &bias, v));
		TEST_ASSERT_MSG(bias == -1 && v[3] == -5, "item 1: %g %g", bias, v[3]);
		mfs_snap_close(s);
	}
	/* a NaN among the later values: refused, and the stage names the row by its id */
	TEST_OK(mfs_snap_stage_fill_ids(st, m, &in, NULL, errbuf, sizeof errbuf));
	vu = mfs_snap_stage_values(st, 0, NULL);
	TEST_ASSERT(vu != NULL);
	if (vu) {
		for (int j = 0; j < 10; j++)
			vu[j] = 0.5f;
		vu[5 + 2] = INFINITY; /* zed's f1 */
		vi = mfs_snap_stage_values(st, 1, NULL);
		for (int j = 0; vi && j < 5; j++)
			vi[j] = 0.5f;
		TEST_EQ_INT(mfs_snap_publish_stage(w, st, &in, &seq, errbuf, sizeof errbuf), MFS_ENAN);
		TEST_ASSERT_MSG(strstr(errbuf, "zed") != NULL, "errstr: %s", errbuf);
	}
	mfs_snap_meta_t meta;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (s) {
		TEST_OK(mfs_snap_get_meta(s, &meta));
		TEST_EQ_INT(meta.seq, 1);
		mfs_snap_close(s);
	}
	mfs_snap_writer_close(w);
	mfs_snap_stage_free(st);
	mfs_model_free(m);
}

/* Staging ids on a pool (serve's learner with a long touched list) stages what one thread
 * does: 150,000 users, a third with string ids, named in shuffled order, each staged row's
 * values naming its user; every user reads back its own values. Of two bad rows far into the
 * list, the first is the one reported. */
static void test_stage_ids_on_pool(void)
{
	enum { N = 150000 };
	mfs_model_t *m = model_new(4);
	char name[32];
	for (uint32_t u = 0; u < N; u++) {
		snprintf(name, sizeof name, "user-%u", u);
		add_user(m, u % 3 == 0 ? str_id(name) : mfs_id_u64(1000000 + u));
	}
	add_item(m, mfs_id_u64(1));
	fill_random(m);
	uint32_t *rows = malloc(N * sizeof *rows);
	mfs_par_t *par = NULL;
	TEST_OK(mfs_par_init(&par, 4, "t-stage"));
	TEST_ASSERT(rows != NULL && par != NULL);
	if (!rows || !par)
		return;
	for (uint32_t u = 0; u < N; u++)
		rows[u] = u;
	uint64_t x = 88172645463325252ull;
	for (uint32_t u = N - 1; u > 0; u--) { /* Fisher-Yates, xorshift64 */
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		const uint32_t v = (uint32_t)(x % (u + 1)), t = rows[u];
		rows[u] = rows[v], rows[v] = t;
	}
	static const uint32_t irows[] = {0};
	mfs_snap_info_t in = info_default();
	in.user_rows = rows, in.n_user_rows = N, in.item_rows = irows, in.n_item_rows = 1;
	mfs_snap_stage_t *st = mfs_snap_stage_new();
	TEST_ASSERT(st != NULL);
	for (int pass = 0; st && pass < 2; pass++) { /* the pool, then the caller's thread alone */
		const char *dir = test_tmpdir();
		TEST_OK(mfs_snap_stage_fill_ids(st, m, &in, pass ? NULL : par, errbuf, sizeof errbuf));
		size_t nu = 0, ni = 0;
		float *vu = mfs_snap_stage_values(st, 0, &nu), *vi = mfs_snap_stage_values(st, 1, &ni);
		TEST_ASSERT_MSG(vu && vi && nu == N && ni == 1, "pass %d: %zu users, %zu items staged", pass, nu, ni);
		if (!vu || !vi)
			continue;
		for (size_t j = 0; j < N; j++)
			for (int c = 0; c < 5; c++)
				vu[j * 5 + c] = (float)rows[j] + 0.25f * (float)c;
		for (int c = 0; c < 5; c++)
			vi[c] = 1.0f;
		mfs_snap_writer_t *w = NULL;
		TEST_OK(mfs_snap_writer_open(dir, 64 << 20, &w, errbuf, sizeof errbuf));
		if (!w)
			continue;
		uint64_t seq = 0;
		TEST_OK(mfs_snap_publish_stage(w, st, &in, &seq, errbuf, sizeof errbuf));
		mfs_snap_writer_close(w);
		mfs_snap_t *s = NULL;
		TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
		if (!s)
			continue;
		mfs_snap_meta_t meta;
		TEST_OK(mfs_snap_get_meta(s, &meta));
		TEST_EQ_INT(meta.n_users, N);
		int bad = 0;
		for (uint32_t u = 0; u < N; u++) {
			snprintf(name, sizeof name, "user-%u", u);
			mfs_snap_id_t id = snap_id_of(u % 3 == 0 ? str_id(name) : mfs_id_u64(1000000 + u));
			float v[4], bias;
			if (mfs_snap_user(s, &id, &bias, v) || bias != (float)u || v[3] != (float)u + 1.0f)
				bad++;
		}
		TEST_ASSERT_MSG(bad == 0, "pass %d: %d of %d users read back wrong or missing", pass, bad, N);
		mfs_snap_close(s);
	}
	rows[100000] = N + 7;
	rows[120000] = N + 9;
	TEST_EQ_INT(mfs_snap_stage_fill_ids(st, m, &in, par, errbuf, sizeof errbuf), MFS_EINVAL);
	TEST_ASSERT_MSG(strstr(errbuf, "user row 150007 out of range") != NULL, "errstr: %s", errbuf);
	mfs_snap_stage_free(st);
	mfs_par_free(par);
	free(rows);
	mfs_model_free(m);
}

/* Every snapshot.sync mode writes the same snapshots: two publishes into one environment per
 * mode (the second a partial one, so the copy-on-write path runs), a reader sees each, and a
 * reopen after close (which flushes) finds the second. A mode out of range is refused. */
static void test_sync_modes(void)
{
	for (int mode = MFS_SNAP_SYNC_FULL; mode <= MFS_SNAP_SYNC_NONE; mode++) {
		const char *dir = test_tmpdir();
		mfs_model_t *m = model_new(16);
		for (uint64_t u = 0; u < 300; u++) {
			add_user(m, mfs_id_u64(u));
			add_item(m, mfs_id_u64(u * 3));
		}
		fill_random(m);
		mfs_snap_writer_t *w = NULL;
		TEST_OK(mfs_snap_writer_open_sync(dir, 1 << 20, (mfs_snap_sync_t)mode, &w, errbuf, sizeof errbuf));
		if (!w)
			return;
		mfs_snap_info_t in = info_default();
		uint64_t seq = 0;
		TEST_OK(mfs_snap_publish(w, m, &in, &seq, errbuf, sizeof errbuf));
		fill_random(m);
		const uint32_t rows[] = {0, 17, 299};
		in.user_rows = rows;
		in.n_user_rows = 3;
		in.item_rows = rows;
		in.n_item_rows = 3;
		TEST_OK(mfs_snap_publish(w, m, &in, &seq, errbuf, sizeof errbuf));
		TEST_EQ_INT(seq, 2);
		mfs_snap_t *s = NULL;
		TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf)); /* while the writer is open */
		if (s) {
			mfs_snap_meta_t meta;
			TEST_OK(mfs_snap_get_meta(s, &meta));
			TEST_EQ_INT(meta.seq, 2);
			float v[16], bias;
			mfs_snap_id_t id17 = snap_id_of(mfs_id_u64(17));
			TEST_OK(mfs_snap_user(s, &id17, &bias, v));
			TEST_ASSERT_MSG(bias == m->bu[17] && v[5] == m->P[17 * 16 + 5], "mode %d: row 17 not the new values", mode);
			mfs_snap_close(s);
		}
		mfs_snap_writer_close(w);
		TEST_OK(mfs_snap_writer_open_sync(dir, 1 << 20, MFS_SNAP_SYNC_FULL, &w, errbuf, sizeof errbuf));
		TEST_OK(mfs_snap_publish(w, m, &in, &seq, errbuf, sizeof errbuf));
		TEST_EQ_INT(seq, 3); /* the reopened environment held snapshot 2 */
		mfs_snap_writer_close(w);
		mfs_model_free(m);
	}
	mfs_snap_writer_t *w = NULL;
	TEST_EQ_INT(mfs_snap_writer_open_sync(test_tmpdir(), 1 << 20, (mfs_snap_sync_t)7, &w, errbuf, sizeof errbuf),
	            MFS_EINVAL);
	TEST_ASSERT(w == NULL);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	/* every test_tmpdir() below lands in one directory, removed at the end */
	char root[512], cmd[600];
	snprintf(root, sizeof root, "%s", test_tmpdir());
	setenv("TMPDIR", root, 1);
	TEST_RUN(test_sync_modes);
	TEST_RUN(test_stage_is_a_copy);
	TEST_RUN(test_stage_sorts_on_publish);
	TEST_RUN(test_stage_sorts_many);
	TEST_RUN(test_stage_ids_then_values);
	TEST_RUN(test_stage_ids_on_pool);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return TEST_REPORT();
}
