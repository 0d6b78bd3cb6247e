/* test_model_permute.c - renumbering a table's rows (mfs_model_permute_rows, mfs_model_draw_order,
 * mfs_ratings_remap; what `mfstream train` does to its items, train.item_order): every id keeps
 * its values and predictions, only its row changes, and the table goes on working.
 *
 * Each id is looked up by id after the permutation, never by its old row, so a renumbering that
 * moved the values but not the id map (or the map but not the values) fails here. The tables
 * are set up with dead rows on the free and the pending lists, per-row tracking and an
 * incremental rehash under way, the states a permutation must carry across.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "gpu/engine.h"
#include "ingest/dataset.h"
#include "model_store/life.h"
#include "model_store/store.h"
#include "testhelp.h"

#define K 8
/* 560 items: the id map's first table (1024 slots) starts its rehash at 512 live ids and drains
 * 8 old slots per insert, so the permutation meets the rehash half done */
#define N_ITEMS 560
#define N_USERS 40
#define N_NEW 3000 /* inserted afterwards: the free rows, new rows, two more doublings */

/* item j: a u64 (3 * j + 1) or a string of 20..80 bytes */
static mfs_id_t item_id(int strings, uint32_t j, char *buf)
{
	if (!strings)
		return mfs_id_u64(3 * (uint64_t)j + 1);
	int len = snprintf(buf, 100, "item-%u-", j);
	while (len < 20 + (int)(j % 61))
		buf[len++] = (char)('a' + j % 26);
	mfs_id_t id = {MFS_ID_STR, (uint16_t)len, 0, buf};
	return id;
}

static int id_eq(const mfs_id_t *a, const mfs_id_t *b)
{
	if (a->kind != b->kind)
		return 0;
	return a->kind == MFS_ID_U64 ? a->num == b->num : a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
}

/* What an id held before, looked up by id. */
struct held {
	uint32_t row; /* MFS_ROW_NONE: deleted, or never added */
	float q[K], b;
	uint16_t gen;
	uint32_t seen, stamp;
};

static float predict(const mfs_model_t *m, uint32_t u, const mfs_id_t *item)
{
	const uint32_t i = mfs_idmap_find(m->items, item);
	float p = (float)m->mu + m->bu[u];
	if (i == MFS_ROW_NONE)
		return p;
	p += m->bi[i];
	for (int f = 0; f < K; f++)
		p += m->P[(size_t)u * K + f] * m->Q[(size_t)i * K + f];
	return p;
}

static double engine_sse(mfs_model_t *m, const mfs_ratings_t *rs)
{
	mfs_engine_conf_t ec = {.kind = MFS_ENGINE_CPU, .deterministic = 1, .seed = 1};
	mfs_engine_t *e = NULL;
	mfs_loss_t l = {0};
	char err[256];
	mfs_batch_t b = mfs_ratings_batch(rs);
	TEST_OK(mfs_engine_open(&ec, m, &e, err, sizeof err));
	if (e)
		TEST_OK(mfs_engine_loss(e, &b, &l));
	mfs_engine_close(e);
	return l.sse;
}

/* One table set-up, one permutation (reverse: perm[r] = n - 1 - r; else mfs_model_draw_order),
 * every check. */
static void permute_case(int strings, int track, int reverse)
{
	char buf[128];
	mfs_model_conf_t mc = {.k = K, .init_scale = 0.5, .seed = 5};
	mfs_model_t *m = NULL;
	TEST_OK(mfs_model_init(&mc, &m));
	if (!m)
		return;
	if (track)
		TEST_OK(mfs_model_life(m, 1u << 30, 0)); /* seen and stamp kept; nothing expires */
	uint32_t row;
	for (uint32_t u = 0; u < N_USERS; u++) {
		mfs_id_t id = mfs_id_u64(u);
		TEST_OK(mfs_model_user_row(m, &id, &row));
		m->bu[row] = 0.01f * (float)u;
	}
	for (uint32_t j = 0; j < N_ITEMS; j++) {
		if (j % 50 == 0)
			mfs_model_begin_batch(m, 1000 + j); /* distinct seen times and stamps */
		mfs_id_t id = item_id(strings, j, buf);
		TEST_OK(mfs_model_item_row(m, &id, &row));
		TEST_EQ_INT(row, j);
		m->bi[row] = 0.001f * (float)(j % 331) - 0.1f;
	}
	m->mu = 3.5;
	/* dead rows: deleted in one batch (on the free list after the next begins), then in the next
	 * (still pending) */
	for (uint32_t j = 7; j < N_ITEMS; j += 41) {
		if (j == 7 + 41 * 7)
			mfs_model_begin_batch(m, 5000);
		mfs_id_t id = item_id(strings, j, buf);
		TEST_EQ_INT(mfs_model_delete(m, 1, &id), 1);
	}
	mfs_life_t *L = m->life[1];
	TEST_ASSERT(L->n_free > 0 && L->n_pending > 0);
	const uint32_t n = m->n_items;
	TEST_EQ_INT(n, N_ITEMS);

	struct held *h = calloc(N_ITEMS, sizeof *h);
	uint16_t *dead_gen = calloc(n, sizeof *dead_gen);
	uint32_t *free0 = malloc(L->n_free * sizeof *free0), *pend0 = malloc(L->n_pending * sizeof *pend0);
	const size_t n_free = L->n_free, n_pending = L->n_pending;
	memcpy(free0, L->free_rows, n_free * sizeof *free0);
	memcpy(pend0, L->pending, n_pending * sizeof *pend0);
	for (uint32_t j = 0; j < N_ITEMS; j++) {
		mfs_id_t id = item_id(strings, j, buf);
		struct held *x = &h[j];
		x->row = mfs_idmap_find(m->items, &id);
		if (x->row == MFS_ROW_NONE)
			continue;
		memcpy(x->q, m->Q + (size_t)x->row * K, sizeof x->q);
		x->b = m->bi[x->row];
		x->gen = m->gen[1][x->row];
		if (track)
			x->seen = m->seen[1][x->row], x->stamp = m->stamp[1][x->row];
	}
	for (uint32_t r = 0; r < n; r++)
		if (!mfs_idmap_alive(m->items, r))
			dead_gen[r] = m->gen[1][r];

	/* predictions for (user, item) pairs, the deleted items and one never seen among them */
	enum { PAIRS = 400 };
	float pred[PAIRS];
	mfs_ratings_t rs = {0};
	mfs_rng_t g;
	mfs_rng_seed(&g, 11);
	for (int p = 0; p < PAIRS; p++) {
		const uint32_t u = (uint32_t)mfs_rng_below(&g, N_USERS), j = (uint32_t)mfs_rng_below(&g, N_ITEMS + 1);
		mfs_id_t id = item_id(strings, j, buf); /* j == N_ITEMS: never added */
		pred[p] = predict(m, u, &id);
		TEST_OK(mfs_ratings_push(&rs, u, mfs_idmap_find(m->items, &id), 1.0f + (float)(p % 5)));
	}
	const double sse0 = engine_sse(m, &rs);

	/* the permutation */
	uint32_t *perm = malloc(n * sizeof *perm), *again = malloc(n * sizeof *again);
	if (reverse) {
		for (uint32_t r = 0; r < n; r++)
			perm[r] = n - 1 - r;
	} else {
		mfs_model_draw_order(m, 1, perm);
		mfs_model_draw_order(m, 1, again);
		TEST_ASSERT(memcmp(perm, again, n * sizeof *perm) == 0); /* from the seed alone */
		uint32_t fixed = 0;
		for (uint32_t r = 0; r < n; r++)
			fixed += perm[r] == r;
		TEST_ASSERT_MSG(fixed < 10, "%u fixed points of %u", fixed, n); /* a shuffle, not the identity */
	}
	TEST_OK(mfs_model_permute_rows(m, 1, perm));
	mfs_ratings_remap(&rs, 1, perm);

	/* by id: the row is perm of the old one, and the values went with it */
	TEST_EQ_INT(m->n_items, n);
	TEST_EQ_INT(mfs_idmap_size(m->items), n);
	uint8_t *hit = calloc(n, 1);
	int bad_row = 0, bad_val = 0;
	for (uint32_t j = 0; j < N_ITEMS; j++) {
		mfs_id_t id = item_id(strings, j, buf);
		const uint32_t r = mfs_idmap_find(m->items, &id);
		const struct held *x = &h[j];
		if (x->row == MFS_ROW_NONE) {
			TEST_EQ_INT(r, MFS_ROW_NONE);
			continue;
		}
		if (r == MFS_ROW_NONE || r != perm[x->row] || hit[r]) {
			bad_row++;
			continue;
		}
		hit[r] = 1;
		mfs_id_t key = mfs_idmap_key(m->items, r);
		if (!id_eq(&key, &id) || memcmp(m->Q + (size_t)r * K, x->q, sizeof x->q) || m->bi[r] != x->b ||
		    m->gen[1][r] != x->gen || (track && (m->seen[1][r] != x->seen || m->stamp[1][r] != x->stamp)))
			bad_val++;
	}
	TEST_EQ_INT(bad_row, 0);
	TEST_EQ_INT(bad_val, 0);
	/* every other row is dead, and it is the old dead rows' image */
	uint32_t live = 0;
	for (uint32_t r = 0; r < n; r++) {
		live += hit[r];
		TEST_ASSERT_MSG(hit[r] == mfs_idmap_alive(m->items, r), "row %u", r);
	}
	TEST_EQ_INT(live, mfs_idmap_live(m->items));
	for (uint32_t j = 7; j < N_ITEMS; j += 41) /* the old rows of deleted items were rows j */
		TEST_ASSERT(!mfs_idmap_alive(m->items, perm[j]) && m->gen[1][perm[j]] == dead_gen[j]);
	TEST_EQ_INT(L->n_free, n_free);
	TEST_EQ_INT(L->n_pending, n_pending);
	for (size_t f = 0; f < n_free; f++)
		TEST_EQ_INT(L->free_rows[f], perm[free0[f]]);
	for (size_t f = 0; f < n_pending; f++)
		TEST_EQ_INT(L->pending[f], perm[pend0[f]]);

	/* predictions: bit for bit, looked up by id, and through the engine on the remapped rows */
	int bad_pred = 0;
	mfs_rng_seed(&g, 11);
	for (int p = 0; p < PAIRS; p++) {
		const uint32_t u = (uint32_t)mfs_rng_below(&g, N_USERS), j = (uint32_t)mfs_rng_below(&g, N_ITEMS + 1);
		mfs_id_t id = item_id(strings, j, buf);
		bad_pred += predict(m, u, &id) != pred[p];
		bad_pred += rs.i[p] != mfs_idmap_find(m->items, &id);
	}
	TEST_EQ_INT(bad_pred, 0);
	TEST_ASSERT_MSG(engine_sse(m, &rs) == sse0, "sse %.17g vs %.17g", engine_sse(m, &rs), sse0);

	/* new ids afterwards: the free rows first (their new numbers, last freed first), then new rows
	 * through two doublings of the map; every id, old and new, still found at its row */
	mfs_model_begin_batch(m, 6000); /* the pending rows join the free list */
	const size_t n_reuse = n_free + n_pending;
	uint32_t *expect = malloc(n_reuse * sizeof *expect);
	for (size_t f = 0; f < n_free; f++)
		expect[f] = perm[free0[f]];
	for (size_t f = 0; f < n_pending; f++)
		expect[n_free + f] = perm[pend0[f]];
	uint32_t *new_row = malloc(N_NEW * sizeof *new_row);
	for (uint32_t j = 0; j < N_NEW; j++) {
		mfs_id_t id = item_id(strings, N_ITEMS + 1 + j, buf);
		TEST_OK(mfs_model_item_row(m, &id, &new_row[j]));
		const uint32_t want = j < n_reuse ? expect[n_reuse - 1 - j] : n + (uint32_t)(j - n_reuse);
		if (new_row[j] != want) {
			TEST_ASSERT_MSG(0, "new id %u: row %u, want %u", j, new_row[j], want);
			break;
		}
	}
	int lost = 0;
	for (uint32_t j = 0; j < N_ITEMS; j++) {
		mfs_id_t id = item_id(strings, j, buf);
		if (h[j].row != MFS_ROW_NONE)
			lost += mfs_idmap_find(m->items, &id) != perm[h[j].row];
	}
	for (uint32_t j = 0; j < N_NEW; j++) {
		mfs_id_t id = item_id(strings, N_ITEMS + 1 + j, buf);
		lost += mfs_idmap_find(m->items, &id) != new_row[j];
	}
	TEST_EQ_INT(lost, 0);
	TEST_EQ_INT(mfs_idmap_live(m->items), live + N_NEW);

	free(expect);
	free(new_row);
	free(hit);
	free(perm);
	free(again);
	free(h);
	free(dead_gen);
	free(free0);
	free(pend0);
	mfs_ratings_free(&rs);
	mfs_model_free(m);
}

static void test_permute_u64_random(void) { permute_case(0, 0, 0); }
static void test_permute_u64_reverse_tracked(void) { permute_case(0, 1, 1); }
static void test_permute_str_random_tracked(void) { permute_case(1, 1, 0); }
static void test_permute_str_reverse(void) { permute_case(1, 0, 1); }

/* Not a bijection: refused, and nothing moved. The draw depends on the seed and the side. */
static void test_permute_refused(void)
{
	char buf[128];
	mfs_model_conf_t mc = {.k = K, .init_scale = 0.5, .seed = 5};
	mfs_model_t *m = NULL;
	TEST_OK(mfs_model_init(&mc, &m));
	if (!m)
		return;
	uint32_t row, perm[100], other[100], users[100];
	for (uint32_t j = 0; j < 100; j++) {
		mfs_id_t id = item_id(1, j, buf);
		TEST_OK(mfs_model_item_row(m, &id, &row));
		mfs_id_t u = mfs_id_u64(j);
		TEST_OK(mfs_model_user_row(m, &u, &row));
	}
	float q0[K];
	memcpy(q0, m->Q, sizeof q0);
	for (uint32_t r = 0; r < 100; r++)
		perm[r] = (r + 1) % 100;
	perm[5] = perm[6]; /* a row twice, one never */
	TEST_EQ_INT(mfs_model_permute_rows(m, 1, perm), MFS_EINVAL);
	perm[5] = 100; /* out of range */
	TEST_EQ_INT(mfs_model_permute_rows(m, 1, perm), MFS_EINVAL);
	mfs_id_t id0 = item_id(1, 0, buf);
	TEST_EQ_INT(mfs_idmap_find(m->items, &id0), 0);
	TEST_ASSERT(memcmp(m->Q, q0, sizeof q0) == 0);

	mfs_model_draw_order(m, 1, perm);
	mfs_model_draw_order(m, 0, users);
	TEST_ASSERT(memcmp(perm, users, sizeof perm) != 0); /* the side is in the seed */
	m->seed = 6;
	mfs_model_draw_order(m, 1, other);
	TEST_ASSERT(memcmp(perm, other, sizeof perm) != 0);
	m->seed = 5;
	mfs_model_draw_order(m, 1, other);
	TEST_ASSERT(memcmp(perm, other, sizeof perm) == 0);
	mfs_model_free(m);
}

/* mfs_ratings_remap: one side only, MFS_ROW_NONE kept. */
static void test_ratings_remap(void)
{
	mfs_ratings_t rs = {0};
	const uint32_t perm[4] = {2, 0, 3, 1};
	TEST_OK(mfs_ratings_push(&rs, 0, 0, 1));
	TEST_OK(mfs_ratings_push(&rs, 1, 3, 2));
	TEST_OK(mfs_ratings_push(&rs, 2, MFS_ROW_NONE, 3));
	mfs_ratings_remap(&rs, 1, perm);
	TEST_EQ_INT(rs.i[0], 2);
	TEST_EQ_INT(rs.i[1], 1);
	TEST_EQ_INT(rs.i[2], MFS_ROW_NONE);
	TEST_EQ_INT(rs.u[0], 0);
	TEST_EQ_INT(rs.u[2], 2);
	TEST_ASSERT(rs.r[1] == 2.0f);
	mfs_ratings_free(&rs);
}

int main(void)
{
	TEST_RUN(test_permute_u64_random);
	TEST_RUN(test_permute_u64_reverse_tracked);
	TEST_RUN(test_permute_str_random_tracked);
	TEST_RUN(test_permute_str_reverse);
	TEST_RUN(test_permute_refused);
	TEST_RUN(test_ratings_remap);
	return TEST_REPORT();
}
