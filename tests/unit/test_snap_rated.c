/* test_snap_rated.c - the items each user rated (issue 20): the tracker (snapshots/snap_rated.h),
 * the user_rated records the writer makes of it (docs/SNAPSHOT_FORMAT.md) and libmfsnap's top-K,
 * which leaves them out unless MFS_SNAP_TOPK_INCLUDE_SEEN.
 *
 *   ring      a tracker keeps each user's last max ratings, oldest first
 *   merge     serve's publishes merge the ratings since the last one into the stored list: a
 *             re-rated item moves to the end, the list keeps the last max distinct items;
 *             train's (rated_merge = 0) replace it; string ids on both sides
 *   delete    a deleted user's list is deleted in the publish that deletes the row; the id
 *             rating again starts a fresh list; a deleted item leaves the lists the tracker
 *             still holds (its row could go to another item)
 *   take      serve's way: the stage takes the tracker whole (rated_take) with the rows' ids, and
 *             the publish makes the same lists from the staged rows, leaves out a rating whose
 *             item row changed hands since, and clears the tracker
 *   shards    a tracker in shards fed a batch at a time on a pool (serve's way) holds the lists of
 *             one fed rating by rating, and a publish of either writes the same records
 *   topk      the default answer is the INCLUDE_SEEN answer without the listed items, on every
 *             path (int8, exact, no cache), and is the answer with the list as exclude list
 */
#include <lmdb.h>
#include <stdint.h>

#include "common/err.h"
#include "common/par.h"
#include "common/rng.h"
#include "model_store/life.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_rated.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"
#include "model_help.h"

#include "snap_help.h"
#include "rated_help.h"

static int publish(const char *dir, const mfs_model_t *m, const mfs_snap_rated_t *r, int merge)
{
	mfs_snap_info_t in = info_default();
	in.rated = r;
	in.rated_merge = merge;
	uint64_t seq;
	int rc = publish_once(dir, 1 << 22, m, &in, &seq);
	TEST_ASSERT_MSG(rc == 0, "publish: %s", errbuf);
	return rc;
}

/* User u rates items[0..n) in that order. */
static void rate(mfs_snap_rated_t *r, const mfs_model_t *m, uint32_t u, const uint32_t *items, size_t n)
{
	for (size_t j = 0; j < n; j++)
		TEST_OK(mfs_snap_rated_add(r, m, u, items[j]));
}

static void test_ring(void)
{
	mfs_model_t *m = model_new(4);
	mfs_snap_rated_t *r = NULL;
	TEST_EQ_INT(mfs_snap_rated_init(0, &r), MFS_EINVAL);
	TEST_OK(mfs_snap_rated_init(3, &r));
	uint32_t u = add_user(m, mfs_id_u64(7)), it[6], user, got[3];
	for (int j = 0; j < 6; j++)
		it[j] = add_item(m, mfs_id_u64(100 + (uint64_t)j));
	for (int j = 0; j < 5; j++)
		TEST_OK(mfs_snap_rated_add(r, m, u, it[j]));
	TEST_OK(mfs_snap_rated_add(r, m, MFS_ROW_NONE, it[5])); /* ignored */
	TEST_EQ_INT(mfs_snap_rated_users(r), 1);
	TEST_EQ_INT(mfs_snap_rated_list(r, m, 0, &user, got), 3);
	TEST_EQ_INT(user, u);
	TEST_ASSERT(got[0] == it[2] && got[1] == it[3] && got[2] == it[4]); /* the last 3, oldest first */
	const size_t full = mfs_snap_rated_bytes(r);
	mfs_snap_rated_clear(r);
	TEST_EQ_INT(mfs_snap_rated_users(r), 0);
	TEST_EQ_INT(mfs_snap_rated_bytes(r), full); /* the block kept for the next round */
	TEST_OK(mfs_snap_rated_add(r, m, u, it[0])); /* a round that takes the kept block */
	TEST_EQ_INT(mfs_snap_rated_bytes(r), full);
	mfs_snap_rated_clear(r);
	mfs_snap_rated_clear(r); /* a round that needed no block: the kept one is given back */
	TEST_ASSERT(mfs_snap_rated_bytes(r) < full);
	mfs_snap_rated_free(r);
	mfs_model_free(m);
}

/* Every user's list of r as a map user row -> items, into lists[u * (max + 1)]: count, items. */
static void lists_of(const mfs_snap_rated_t *r, const mfs_model_t *m, uint32_t max, uint32_t users, uint32_t *lists)
{
	memset(lists, 0, (size_t)users * (max + 1) * sizeof *lists);
	for (size_t j = 0; j < mfs_snap_rated_users(r); j++) {
		uint32_t u, got[8];
		const size_t n = mfs_snap_rated_list(r, m, j, &u, got);
		if (u == MFS_ROW_NONE && n == 0) /* the list of a row freed since (not written) */
			continue;
		TEST_ASSERT(u < users && n <= max);
		if (u >= users)
			continue;
		TEST_ASSERT_MSG(lists[u * (max + 1)] == 0, "user row %u listed twice", u);
		lists[u * (max + 1)] = (uint32_t)n;
		memcpy(&lists[u * (max + 1) + 1], got, n * sizeof *got);
	}
}

static void test_shards(void)
{
	enum { USERS = 3000, ITEMS = 500, MAX = 8, N = 50000 };
	mfs_model_t *m = model_new(4);
	uint32_t *u = malloc(N * sizeof *u), *it = malloc(N * sizeof *it), ur[USERS], ir[ITEMS];
	for (uint32_t x = 0; x < USERS; x++)
		ur[x] = add_user(m, mfs_id_u64(1 + x));
	for (uint32_t x = 0; x < ITEMS; x++)
		ir[x] = add_item(m, mfs_id_u64(1 + x));
	mfs_rng_t g;
	mfs_rng_seed(&g, 3);
	for (size_t j = 0; j < N; j++) { /* some events without a row (a full table): skipped */
		u[j] = j % 97 == 5 ? MFS_ROW_NONE : ur[mfs_rng_below(&g, USERS)];
		it[j] = j % 89 == 7 ? MFS_ROW_NONE : ir[mfs_rng_below(&g, ITEMS)];
	}
	mfs_snap_rated_t *one, *sh, *bad;
	mfs_par_t *par;
	TEST_EQ_INT(mfs_snap_rated_init_shards(MAX, 0, &bad), MFS_EINVAL);
	TEST_OK(mfs_snap_rated_init(MAX, &one));
	TEST_OK(mfs_snap_rated_init_shards(MAX, 5, &sh));
	TEST_OK(mfs_par_init(&par, 3, "test-rated"));
	for (size_t j = 0; j < N; j++)
		TEST_OK(mfs_snap_rated_add(one, m, u[j], it[j]));
	for (size_t a = 0; a < N; a += 4096) { /* batches; every other one begun on the workers */
		const size_t len = a + 4096 < N ? 4096 : N - a;
		if (a / 4096 % 2) {
			mfs_snap_rated_add_start(sh, m, u + a, it + a, len, par);
			TEST_OK(mfs_snap_rated_add_finish(sh, par));
		} else {
			TEST_OK(mfs_snap_rated_add_many(sh, m, u + a, it + a, len, par));
		}
	}
	TEST_EQ_INT(mfs_snap_rated_users(sh), mfs_snap_rated_users(one));
	TEST_EQ_INT(mfs_snap_rated_bytes(sh) > 0, 1);
	uint32_t *l1 = malloc((size_t)USERS * (MAX + 1) * sizeof *l1), *l2 = malloc((size_t)USERS * (MAX + 1) * sizeof *l2);
	lists_of(one, m, MAX, USERS, l1);
	lists_of(sh, m, MAX, USERS, l2);
	TEST_ASSERT_MSG(!memcmp(l1, l2, (size_t)USERS * (MAX + 1) * sizeof *l1), "the sharded lists differ");
	size_t full = 0;
	for (uint32_t x = 0; x < USERS; x++)
		full += l1[x * (MAX + 1)] == MAX;
	TEST_ASSERT(full > USERS / 2); /* most rings wrapped: the order within a ring is checked */
	/* the records a publish writes of either */
	char d1[256], d2[256], b1[4096], b2[4096];
	snprintf(d1, sizeof d1, "%s", test_tmpdir());
	snprintf(d2, sizeof d2, "%s", test_tmpdir());
	publish(d1, m, one, 0);
	publish(d2, m, sh, 0);
	int same = 0, some = 0;
	for (uint32_t x = 0; x < USERS; x += 7) {
		list_u64(d1, 1 + x, b1, sizeof b1);
		list_u64(d2, 1 + x, b2, sizeof b2);
		same += !strcmp(b1, b2);
		some += b1[0] != '-' && b1[0] != '?';
	}
	TEST_EQ_INT(same, (USERS + 6) / 7);
	TEST_ASSERT(some > USERS / 14);
	/* rows freed and given to new ids: their new lists start afresh, sharded or not (the
	 * shards read row generations only once rows have been freed) */
	for (uint32_t x = 0; x < USERS; x += 10) {
		const mfs_id_t id = mfs_id_u64(1 + x);
		TEST_EQ_INT(mfs_model_delete(m, 0, &id), 1);
	}
	for (uint32_t x = 0; x < ITEMS; x += 25) {
		const mfs_id_t id = mfs_id_u64(1 + x);
		TEST_EQ_INT(mfs_model_delete(m, 1, &id), 1);
	}
	mfs_model_begin_batch(m, 1); /* the deletions' rows free for reuse */
	for (uint32_t x = 0; x < USERS; x += 10)
		add_user(m, mfs_id_u64(100000 + x));
	for (uint32_t x = 0; x < ITEMS; x += 25)
		add_item(m, mfs_id_u64(100000 + x));
	TEST_ASSERT_MSG(m->n_users == USERS && m->n_items == ITEMS && mfs_model_frees(m) > 0,
	                "the new ids took the freed rows: users %u items %u", m->n_users, m->n_items);
	for (size_t j = 0; j < 1024; j++) { /* the new ids rate, on rows that had lists */
		u[j] = ur[mfs_rng_below(&g, USERS / 10) * 10];
		it[j] = ir[mfs_rng_below(&g, ITEMS)];
	}
	for (size_t j = 0; j < 1024; j++)
		TEST_OK(mfs_snap_rated_add(one, m, u[j], it[j]));
	TEST_OK(mfs_snap_rated_add_many(sh, m, u, it, 1024, par));
	lists_of(one, m, MAX, USERS, l1);
	lists_of(sh, m, MAX, USERS, l2);
	TEST_ASSERT_MSG(!memcmp(l1, l2, (size_t)USERS * (MAX + 1) * sizeof *l1), "the sharded lists differ after reuse");
	size_t fresh = 0;
	for (uint32_t x = 0; x < USERS; x += 10)
		fresh += l1[ur[x] * (MAX + 1)] > 0 && l1[ur[x] * (MAX + 1)] < MAX;
	TEST_ASSERT(fresh > USERS / 40); /* lists of the new ids, not the old ones' full rings */
	mfs_snap_rated_clear(sh);
	TEST_EQ_INT(mfs_snap_rated_users(sh), 0);
	mfs_par_free(par);
	mfs_snap_rated_free(one);
	mfs_snap_rated_free(sh);
	free(l1);
	free(l2);
	free(u);
	free(it);
	mfs_model_free(m);
}

static void test_merge(void)
{
	const char *dir = test_tmpdir();
	char buf[4096];
	mfs_model_t *m = model_new(4);
	mfs_snap_rated_t *r = NULL;
	TEST_OK(mfs_snap_rated_init(4, &r));
	uint32_t u = add_user(m, mfs_id_u64(1)), alice = add_user(m, str_id("alice"));
	uint32_t A = add_item(m, mfs_id_u64(10)), B = add_item(m, mfs_id_u64(11)), C = add_item(m, str_id("item-c")),
	         D = add_item(m, mfs_id_u64(13)), E = add_item(m, mfs_id_u64(14));
	/* serve's first snapshot: the ratings since the start */
	rate(r, m, u, (const uint32_t[]){A, B, C}, 3);
	TEST_OK(mfs_snap_rated_add(r, m, alice, C));
	publish(dir, m, r, 1);
	mfs_snap_rated_clear(r);
	TEST_STR_EQ(list_u64(dir, 1, buf, sizeof buf), "10,11,item-c");
	unsigned char ak[16];
	size_t al = mfs_snap_key_str(ak, "alice", 5);
	TEST_STR_EQ(list_of(dir, ak, al, buf, sizeof buf), "item-c");
	/* the next: B again, D, E -> A C B D E -> the last 4 */
	rate(r, m, u, (const uint32_t[]){B, D, E}, 3);
	publish(dir, m, r, 1);
	mfs_snap_rated_clear(r);
	TEST_STR_EQ(list_u64(dir, 1, buf, sizeof buf), "item-c,11,13,14");
	TEST_STR_EQ(list_of(dir, ak, al, buf, sizeof buf), "item-c"); /* untouched: as it was */
	/* a publish with no ratings for a user leaves their list */
	publish(dir, m, r, 1);
	TEST_STR_EQ(list_u64(dir, 1, buf, sizeof buf), "item-c,11,13,14");
	/* train's: the list replaces the stored one; a repeat inside it counts once */
	rate(r, m, u, (const uint32_t[]){A, D, A}, 3);
	publish(dir, m, r, 0);
	TEST_STR_EQ(list_u64(dir, 1, buf, sizeof buf), "13,10");
	mfs_snap_rated_free(r);
	mfs_model_free(m);
}

/* Stage ids as serve does (mfs_snap_stage_fill_ids over the rows rated, values filled after),
 * the tracker taken whole, then publish it. */
static void publish_taken(const char *dir, const mfs_model_t *m, mfs_snap_rated_t *r, const uint32_t *ur, size_t nu,
                          const uint32_t *ir, size_t ni)
{
	mfs_snap_writer_t *w = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 22, &w, errbuf, sizeof errbuf));
	mfs_snap_stage_t *st = mfs_snap_stage_new();
	TEST_ASSERT(st);
	mfs_snap_info_t in = info_default();
	in.user_rows = ur, in.n_user_rows = nu, in.item_rows = ir, in.n_item_rows = ni;
	in.rated_take = r;
	TEST_OK(mfs_snap_stage_fill_ids(st, m, &in, NULL, errbuf, sizeof errbuf));
	for (int side = 0; side < 2; side++) {
		size_t n;
		float *v = mfs_snap_stage_values(st, side, &n);
		for (size_t x = 0; x < n * (size_t)(1 + m->k); x++)
			v[x] = 0.5f;
	}
	uint64_t seq;
	int rc = mfs_snap_publish_stage(w, st, &in, &seq, errbuf, sizeof errbuf);
	TEST_ASSERT_MSG(rc == 0, "publish: %s", errbuf);
	mfs_snap_stage_free(st);
	mfs_snap_writer_close(w);
}

static void test_take(void)
{
	const char *dir = test_tmpdir();
	char buf[4096];
	mfs_model_t *m = model_new(4);
	mfs_snap_rated_t *r = NULL;
	TEST_OK(mfs_snap_rated_init(4, &r));
	uint32_t u = add_user(m, mfs_id_u64(1)), alice = add_user(m, str_id("alice"));
	uint32_t A = add_item(m, mfs_id_u64(10)), B = add_item(m, str_id("item-b")), C = add_item(m, mfs_id_u64(12));
	rate(r, m, u, (const uint32_t[]){A, B}, 2);
	rate(r, m, alice, (const uint32_t[]){B, C}, 2);
	/* C leaves and its row goes to another item before the snapshot: alice's C is not that one */
	mfs_model_begin_batch(m, 1);
	mfs_id_t c = mfs_id_u64(12);
	TEST_EQ_INT(mfs_model_delete(m, 1, &c), 1);
	mfs_model_begin_batch(m, 2);
	TEST_EQ_INT(add_item(m, mfs_id_u64(99)), C);
	const uint32_t ur[] = {u, alice}, ir[] = {A, B, C};
	publish_taken(dir, m, r, ur, 2, ir, 3);
	TEST_EQ_INT(mfs_snap_rated_users(r), 0); /* cleared by the publish */
	TEST_STR_EQ(list_u64(dir, 1, buf, sizeof buf), "10,item-b");
	unsigned char ak[16];
	size_t al = mfs_snap_key_str(ak, "alice", 5);
	TEST_STR_EQ(list_of(dir, ak, al, buf, sizeof buf), "item-b");
	/* the next publish merges, as the tracker given to mfs_snap_publish does */
	TEST_OK(mfs_snap_rated_add(r, m, u, C));
	const uint32_t ur2[] = {u}, ir2[] = {C};
	publish_taken(dir, m, r, ur2, 1, ir2, 1);
	TEST_STR_EQ(list_u64(dir, 1, buf, sizeof buf), "10,item-b,99");
	mfs_snap_rated_free(r);
	mfs_model_free(m);
}

static void test_delete(void)
{
	const char *dir = test_tmpdir();
	char buf[4096];
	mfs_model_t *m = model_new(4);
	TEST_OK(mfs_model_life(m, 0, 0));
	mfs_snap_rated_t *r = NULL;
	TEST_OK(mfs_snap_rated_init(8, &r));
	mfs_id_t uid = mfs_id_u64(5), iid = mfs_id_u64(21);
	uint32_t u = add_user(m, uid), v = add_user(m, mfs_id_u64(6));
	uint32_t A = add_item(m, mfs_id_u64(20)), B = add_item(m, iid);
	TEST_OK(mfs_snap_rated_add(r, m, u, A));
	TEST_OK(mfs_snap_rated_add(r, m, v, A));
	publish(dir, m, r, 1);
	mfs_snap_rated_clear(r);
	TEST_STR_EQ(list_u64(dir, 5, buf, sizeof buf), "20");
	/* user 5 rates B, then is deleted before the snapshot; item 21 is deleted after 6 rated it */
	TEST_OK(mfs_snap_rated_add(r, m, u, B));
	TEST_OK(mfs_snap_rated_add(r, m, v, B));
	TEST_EQ_INT(mfs_model_delete(m, 0, &uid), 1);
	TEST_EQ_INT(mfs_model_delete(m, 1, &iid), 1);
	publish(dir, m, r, 1);
	mfs_model_gone_clear(m);
	TEST_STR_EQ(list_u64(dir, 5, buf, sizeof buf), "-"); /* no list left behind */
	TEST_STR_EQ(list_u64(dir, 6, buf, sizeof buf), "20"); /* B went before the snapshot: not listed */
	/* 5 comes back (the freed row is reused at the next batch) and rates A: a fresh list, not
	 * the old id's entries the tracker still holds for that row (not cleared here on purpose) */
	mfs_model_begin_batch(m, 0);
	uint32_t u2 = add_user(m, uid);
	TEST_EQ_INT(u2, u);
	TEST_OK(mfs_snap_rated_add(r, m, u2, A));
	publish(dir, m, r, 1);
	TEST_STR_EQ(list_u64(dir, 5, buf, sizeof buf), "20");
	mfs_snap_rated_free(r);
	mfs_model_free(m);
}

/* One top-K through libmfsnap; hits as "id,id,..." into out. */
static const char *topk_ids(mfs_snap_t *s, uint64_t user, size_t k, const mfs_snap_id_t *ex, size_t nx,
                            unsigned flags, char *out, size_t cap)
{
	mfs_snap_hit_t hits[64];
	size_t n = 0, o = 0;
	mfs_snap_id_t uid = {MFS_SNAP_ID_U64, user, NULL, 0};
	mfs_snap_topk_opts_t op = {ex, nx, flags};
	TEST_OK(mfs_snap_topk_ex(s, &uid, k, &op, hits, &n, NULL));
	out[0] = '\0';
	for (size_t j = 0; j < n; j++)
		o += (size_t)snprintf(out + o, cap - o, "%s%llu", j ? "," : "", (unsigned long long)hits[j].num);
	return out;
}

static void test_topk(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(8);
	mfs_snap_rated_t *r = NULL;
	TEST_OK(mfs_snap_rated_init(5, &r));
	for (uint64_t u = 0; u < 3; u++)
		add_user(m, mfs_id_u64(u));
	for (uint64_t i = 0; i < 40; i++)
		add_item(m, mfs_id_u64(i));
	for (uint32_t x = 0; x < (uint32_t)m->n_users * m->k; x++)
		m->P[x] = (float)((x * 7919u) % 13) / 13.0f - 0.5f;
	for (uint32_t x = 0; x < (uint32_t)m->n_items * m->k; x++)
		m->Q[x] = (float)((x * 104729u) % 17) / 17.0f - 0.5f;
	/* user 0 rated 7 items (the last 5 are kept), user 1 none, user 2 one */
	for (uint32_t i = 0; i < 7; i++)
		TEST_OK(mfs_snap_rated_add(r, m, 0, i * 3));
	TEST_OK(mfs_snap_rated_add(r, m, 2, 5));
	publish(dir, m, r, 0);
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	const unsigned paths[] = {0, MFS_SNAP_TOPK_EXACT, MFS_SNAP_TOPK_NOCACHE};
	mfs_snap_id_t seen[5];
	for (int j = 0; j < 5; j++)
		seen[j] = (mfs_snap_id_t){MFS_SNAP_ID_U64, (uint64_t)(j + 2) * 3, NULL, 0};
	for (uint64_t u = 0; u < 3; u++)
		for (size_t p = 0; p < 3; p++) {
			char a[1024], b[1024], c[1024];
			topk_ids(s, u, 10, NULL, 0, paths[p], a, sizeof a);
			topk_ids(s, u, 10, NULL, 0, paths[p] | MFS_SNAP_TOPK_INCLUDE_SEEN, b, sizeof b);
			/* the stored list given as an exclude list, the stored list itself not used */
			const mfs_snap_id_t *ex = u == 0 ? seen : u == 2 ? &(mfs_snap_id_t){MFS_SNAP_ID_U64, 5, NULL, 0} : NULL;
			topk_ids(s, u, 10, ex, u == 0 ? 5 : u == 2 ? 1 : 0, paths[p] | MFS_SNAP_TOPK_INCLUDE_SEEN, c, sizeof c);
			TEST_ASSERT_MSG(strcmp(a, c) == 0, "user %llu path %u: default %s == exclude-list %s", (unsigned long long)u,
			                paths[p], a, c);
			if (u == 1)
				TEST_STR_EQ(a, b);
			else
				TEST_ASSERT_MSG(strcmp(a, b) != 0 || u == 2, "user 0: the rated items were in the top 10");
		}
	/* stats count the rated items found among the excluded */
	mfs_snap_hit_t hits[10];
	size_t n;
	mfs_snap_topk_stats_t st;
	mfs_snap_id_t u0 = {MFS_SNAP_ID_U64, 0, NULL, 0};
	TEST_OK(mfs_snap_topk_ex(s, &u0, 10, NULL, hits, &n, &st));
	TEST_EQ_INT(st.n_excluded, 5);
	TEST_EQ_INT(n, 10);
	mfs_snap_close(s);
	mfs_snap_rated_free(r);
	mfs_model_free(m);
}

int main(void)
{
	TEST_RUN(test_ring);
	TEST_RUN(test_merge);
	TEST_RUN(test_take);
	TEST_RUN(test_delete);
	TEST_RUN(test_shards);
	TEST_RUN(test_topk);
	return TEST_REPORT();
}
