/* test_life.c - the id lifecycle: idmap removal and reuse, eviction, expiry, deletion
 * (model_store/life.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "model_store/life.h"
#include "model_store/store.h"
#include "testhelp.h"

/* id j of a test: even j a u64, odd j a string of 40..140 bytes (so removals make arena garbage) */
static mfs_id_t test_id(uint32_t j, char *buf)
{
	if (j % 2 == 0)
		return mfs_id_u64(j);
	int len = snprintf(buf, 160, "user-%u-", j);
	const int want = 40 + (int)(j % 101);
	while (len < want)
		buf[len++] = (char)('a' + j % 26);
	mfs_id_t id = {MFS_ID_STR, (uint16_t)len, 0, buf};
	return id;
}

/* Random inserts and removals against a reference array: every lookup, the live count and the
 * keys agree through rehashes, tombstone clean-ups and arena rewrites. */
static void test_idmap_remove_reuse(void)
{
	enum { IDS = 60000, OPS = 400000 };
	mfs_idmap_t *m;
	TEST_OK(mfs_idmap_init(&m));
	uint32_t *row_of = malloc(IDS * sizeof *row_of); /* reference: id -> row or NONE */
	uint32_t *dead = malloc(IDS * sizeof *dead);      /* rows free for reuse */
	size_t n_dead = 0;
	for (uint32_t j = 0; j < IDS; j++)
		row_of[j] = MFS_ROW_NONE;
	mfs_rng_t r;
	mfs_rng_seed(&r, 7);
	uint32_t live = 0;
	char buf[160];
	for (int op = 0; op < OPS; op++) {
		const uint32_t j = (uint32_t)mfs_rng_below(&r, IDS);
		mfs_id_t id = test_id(j, buf);
		const uint32_t found = mfs_idmap_find(m, &id);
		TEST_ASSERT_MSG(found == row_of[j], "op %d id %u: %u, want %u", op, j, found, row_of[j]);
		if (row_of[j] == MFS_ROW_NONE) {
			uint32_t row = n_dead ? dead[--n_dead] : mfs_idmap_size(m);
			TEST_OK(mfs_idmap_insert_h(m, &id, mfs_idmap_hash(&id), row));
			row_of[j] = row;
			live++;
		} else if (mfs_rng_below(&r, 3) == 0) {
			mfs_idmap_remove(m, row_of[j]);
			TEST_ASSERT(!mfs_idmap_alive(m, row_of[j]));
			dead[n_dead++] = row_of[j];
			row_of[j] = MFS_ROW_NONE;
			live--;
		}
	}
	TEST_EQ_INT(mfs_idmap_live(m), live);
	TEST_ASSERT(mfs_idmap_size(m) <= IDS);
	for (uint32_t j = 0; j < IDS; j++) {
		mfs_id_t id = test_id(j, buf);
		TEST_ASSERT_MSG(mfs_idmap_find(m, &id) == row_of[j], "id %u", j);
		if (row_of[j] != MFS_ROW_NONE) {
			mfs_id_t k = mfs_idmap_key(m, row_of[j]);
			TEST_ASSERT(k.kind == id.kind && k.len == id.len &&
			            (id.kind == MFS_ID_U64 ? k.num == id.num : memcmp(k.str, id.str, id.len) == 0));
		}
	}
	/* a live row cannot be inserted into, nor a row beyond the size */
	mfs_id_t x = mfs_id_u64(UINT64_MAX);
	for (uint32_t row = 0; row < mfs_idmap_size(m); row++)
		if (mfs_idmap_alive(m, row)) {
			TEST_EQ_INT(mfs_idmap_insert_h(m, &x, mfs_idmap_hash(&x), row), MFS_EINVAL);
			break;
		}
	TEST_EQ_INT(mfs_idmap_insert_h(m, &x, mfs_idmap_hash(&x), mfs_idmap_size(m) + 1), MFS_EINVAL);
	free(row_of);
	free(dead);
	mfs_idmap_free(m);
}

static mfs_model_t *new_model(uint32_t max_users, uint32_t ttl_s, int evict)
{
	mfs_model_conf_t c = {8, 0.1, 42};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&c, &m));
	m->max_users = max_users;
	TEST_OK(mfs_model_life(m, ttl_s, evict));
	return m;
}

static uint32_t user_row(mfs_model_t *m, uint64_t u)
{
	mfs_id_t id = mfs_id_u64(u);
	uint32_t row = 0;
	TEST_OK(mfs_model_user_row(m, &id, &row));
	return row;
}

/* A bounded table with eviction: new ids keep coming, the table never passes its bound, every
 * eviction lists its id, a user seen in every batch is never the one evicted, and a reused
 * row starts from new values. */
static void test_evict_lru(void)
{
	mfs_model_t *m = new_model(100, 0, 1);
	uint32_t clock = 1000, hot_row = MFS_ROW_NONE;
	for (uint64_t u = 1; u <= 2000; u++) {
		mfs_model_begin_batch(m, clock++);
		const uint32_t h = user_row(m, 0); /* user 0: every batch */
		TEST_ASSERT(hot_row == MFS_ROW_NONE || h == hot_row);
		hot_row = h;
		TEST_ASSERT_MSG(user_row(m, u) != MFS_ROW_NONE, "user %llu got no row", (unsigned long long)u);
		TEST_ASSERT(m->n_users <= 100 && m->cap_users >= m->n_users);
	}
	TEST_EQ_INT(mfs_model_live(m, 0), 100);
	TEST_EQ_INT(mfs_model_freed(m, 0, MFS_FREED_EVICTED), 2001 - 100);
	TEST_EQ_INT(mfs_model_gone_n(m, 0), 2001 - 100);
	/* approximate LRU: the survivors are recent (the oldest possible survivor is the
	 * bound's worth of batches back, with sampling slack) */
	size_t recent = 0;
	for (uint64_t u = 1900; u <= 2000; u++) {
		mfs_id_t id = mfs_id_u64(u);
		recent += mfs_idmap_find(m->users, &id) != MFS_ROW_NONE;
	}
	TEST_ASSERT_MSG(recent >= 80, "only %zu of the last 100 users held", recent);
	/* every gone id is absent, and the rows reused were listed for the engine */
	for (size_t j = 0; j < mfs_model_gone_n(m, 0); j++) {
		mfs_id_t g = mfs_model_gone_id(m, 0, j);
		TEST_ASSERT(g.kind == MFS_ID_U64 && g.num != 0);
	}
	size_t nr;
	mfs_model_reused(m, 0, &nr);
	TEST_EQ_INT(nr, 2001 - 100);
	/* a reused row's values are its generation's, not the evicted id's starting values */
	mfs_model_t *fresh = new_model(0, 0, 0);
	const uint32_t row = user_row(m, 5000);
	float want[8];
	mfs_model_init_row(fresh, 0, row, want);
	TEST_ASSERT(m->gen[0][row] > 0 && memcmp(m->P + (size_t)row * 8, want, sizeof want) != 0);
	mfs_model_free(fresh);
	mfs_model_free(m);
}

/* Eviction never takes a row the current batch has named: with every row named, the new id
 * is dropped rather than given a row two ids of this batch would share. */
static void test_evict_not_this_batch(void)
{
	mfs_model_t *m = new_model(4, 0, 1);
	mfs_model_begin_batch(m, 10);
	for (uint64_t u = 0; u < 4; u++)
		user_row(m, u);
	TEST_EQ_INT(user_row(m, 99), MFS_ROW_NONE);
	TEST_EQ_INT(mfs_model_freed(m, 0, MFS_FREED_EVICTED), 0);
	mfs_model_begin_batch(m, 11);
	TEST_ASSERT(user_row(m, 99) != MFS_ROW_NONE);
	TEST_EQ_INT(mfs_model_freed(m, 0, MFS_FREED_EVICTED), 1);
	TEST_EQ_INT(mfs_model_live(m, 0), 4);
	mfs_model_free(m);
}

/* An asynchronous engine still holds batches (mfs_model_applied_through): eviction takes a row
 * no batch in flight names while a sample holds one, even one seen later than rows in flight,
 * and says so (mfs_model_reused_in_flight 0); only when every candidate is in flight does it
 * take one of those, flagged, so the engine applies what it holds first. Replayed rows count
 * as named by the batch they were replayed in. Deletions without stamps are always flagged. */
static void test_evict_in_flight(void)
{
	mfs_model_t *m = new_model(8, 0, 1);
	/* batches 1..8: user u seen at time 100 + u (user 0 the least recently seen) */
	for (uint64_t u = 0; u < 8; u++) {
		mfs_model_begin_batch(m, (uint32_t)(100 + u));
		user_row(m, u);
	}
	/* batch 9: the engine has applied batches up to 3 (users 0..2) only, and users 0 and 1 were
	 * replayed in batch 8 (in flight again): user 2 is the one to evict, though 0 and 1 were
	 * seen before it */
	const uint32_t r0 = 0, r1 = 1, r2 = 2;
	mfs_model_stamp_rows(m, 0, (const uint32_t[]){r0, r1}, 2);
	mfs_model_begin_batch(m, 200);
	mfs_model_applied_through(m, 3);
	const uint32_t got = user_row(m, 50);
	TEST_EQ_INT(got, r2);
	TEST_EQ_INT(mfs_model_reused_in_flight(m, 0), 0);
	mfs_model_reused_clear(m);
	/* batch 10: nothing applied since batch 4 and rows 0..3 all named lately: every sample is
	 * in flight, so one is taken and flagged */
	mfs_model_begin_batch(m, 201);
	mfs_model_stamp_rows(m, 0, (const uint32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
	mfs_model_begin_batch(m, 202);
	mfs_model_applied_through(m, 4);
	TEST_ASSERT(user_row(m, 51) != MFS_ROW_NONE);
	TEST_EQ_INT(mfs_model_reused_in_flight(m, 0), 1);
	mfs_model_reused_clear(m);
	TEST_EQ_INT(mfs_model_reused_in_flight(m, 0), 0);
	/* a synchronous engine (no applied_through): every earlier batch is applied */
	mfs_model_begin_batch(m, 203);
	TEST_ASSERT(user_row(m, 52) != MFS_ROW_NONE);
	TEST_EQ_INT(mfs_model_reused_in_flight(m, 0), 0);
	mfs_model_free(m);
	/* no tracking: a deleted row reused is flagged */
	m = new_model(0, 0, 0);
	mfs_model_begin_batch(m, 1);
	user_row(m, 1);
	mfs_id_t id1 = mfs_id_u64(1);
	TEST_EQ_INT(mfs_model_delete(m, 0, &id1), 1);
	mfs_model_begin_batch(m, 2);
	TEST_EQ_INT(user_row(m, 2), 0);
	TEST_EQ_INT(mfs_model_reused_in_flight(m, 0), 1);
	mfs_model_free(m);
}

/* Without eviction a full table drops new ids (the bound alone, as before). */
static void test_full_drops(void)
{
	mfs_model_t *m = new_model(3, 0, 0);
	mfs_model_begin_batch(m, 1);
	for (uint64_t u = 0; u < 3; u++)
		TEST_ASSERT(user_row(m, u) != MFS_ROW_NONE);
	mfs_model_begin_batch(m, 2);
	TEST_EQ_INT(user_row(m, 3), MFS_ROW_NONE);
	TEST_EQ_INT(user_row(m, 1), 1);
	mfs_model_free(m);
}

/* Expiry: rows not seen for ttl go, by the sweep or when the id is looked up again. */
static void test_ttl(void)
{
	mfs_model_t *m = new_model(0, 60, 0);
	mfs_model_begin_batch(m, 1000);
	for (uint64_t u = 0; u < 10; u++)
		user_row(m, u);
	mfs_model_begin_batch(m, 1050);
	user_row(m, 3);
	user_row(m, 4);
	mfs_model_begin_batch(m, 1061); /* 61 s after the first batch: the other 8 expire in the sweep */
	TEST_EQ_INT(mfs_model_freed(m, 0, MFS_FREED_EXPIRED), 8);
	TEST_EQ_INT(mfs_model_live(m, 0), 2);
	TEST_EQ_INT(mfs_model_gone_n(m, 0), 8);
	mfs_model_gone_clear(m);
	/* user 3 was seen at 1050; at 1111 it has expired: looked up, it starts fresh */
	mfs_model_t *n = new_model(0, 60, 0);
	mfs_model_begin_batch(n, 1000);
	uint32_t r3 = user_row(n, 3);
	n->P[(size_t)r3 * 8] = 7.0f;
	n->ttl_s = 0; /* no sweep: the lookup alone must expire it */
	mfs_model_begin_batch(n, 1100);
	n->ttl_s = 60;
	uint32_t again = user_row(n, 3);
	TEST_EQ_INT(mfs_model_freed(n, 0, MFS_FREED_EXPIRED), 1);
	TEST_ASSERT(n->P[(size_t)again * 8] != 7.0f);
	TEST_EQ_INT(mfs_model_gone_n(n, 0), 1);
	mfs_model_free(n);
	mfs_model_free(m);
}

/* Deletion: the id goes at once, its row only from the next batch on. */
static void test_delete(void)
{
	mfs_model_t *m = new_model(0, 0, 0);
	mfs_model_begin_batch(m, 1);
	const uint32_t r7 = user_row(m, 7);
	user_row(m, 8);
	mfs_id_t id7 = mfs_id_u64(7), id9 = mfs_id_u64(9);
	TEST_EQ_INT(mfs_model_delete(m, 0, &id7), 1);
	TEST_EQ_INT(mfs_model_delete(m, 0, &id9), 0);
	TEST_EQ_INT(mfs_model_delete_unknown(m, 0), 1);
	TEST_EQ_INT(mfs_idmap_find(m->users, &id7), MFS_ROW_NONE);
	TEST_EQ_INT(mfs_model_live(m, 0), 1);
	/* same batch: 7 comes back at a new row (its old one may still be named by this batch) */
	const uint32_t again = user_row(m, 7);
	TEST_ASSERT(again != r7 && again == 2);
	TEST_EQ_INT(mfs_model_gone_n(m, 0), 1);
	mfs_id_t g = mfs_model_gone_id(m, 0, 0);
	TEST_ASSERT(g.kind == MFS_ID_U64 && g.num == 7);
	/* next batch: the old row is reused, and listed for the engine */
	mfs_model_begin_batch(m, 2);
	TEST_EQ_INT(user_row(m, 10), r7);
	size_t nr;
	const uint32_t *ru = mfs_model_reused(m, 0, &nr);
	TEST_ASSERT(nr == 1 && ru[0] == r7);
	mfs_model_reused_clear(m);
	mfs_model_reused(m, 0, &nr);
	TEST_EQ_INT(nr, 0);
	TEST_EQ_INT(mfs_model_freed(m, 0, MFS_FREED_DELETED), 1);
	/* items too, string ids */
	mfs_id_t it = {MFS_ID_STR, 5, 0, "item1"};
	uint32_t ri;
	TEST_OK(mfs_model_item_row(m, &it, &ri));
	TEST_EQ_INT(mfs_model_delete(m, 1, &it), 1);
	mfs_id_t gi = mfs_model_gone_id(m, 1, 0);
	TEST_ASSERT(gi.kind == MFS_ID_STR && gi.len == 5 && memcmp(gi.str, "item1", 5) == 0);
	mfs_model_free(m);
}

int main(void)
{
	TEST_RUN(test_idmap_remove_reuse);
	TEST_RUN(test_evict_lru);
	TEST_RUN(test_evict_not_this_batch);
	TEST_RUN(test_evict_in_flight);
	TEST_RUN(test_full_drops);
	TEST_RUN(test_ttl);
	TEST_RUN(test_delete);
	return TEST_REPORT();
}
