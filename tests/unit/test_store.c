/* test_store.c - model_store: id text form, UTF-8 rules, idmap growth, model rows. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "model_store/admit.h"
#include "model_store/store.h"
#include "testhelp.h"

static void test_id_parse(void)
{
	mfs_id_t id;
	TEST_OK(mfs_id_parse("42", 2, &id));
	TEST_EQ_INT(id.kind, MFS_ID_U64);
	TEST_EQ_INT(id.num, 42);
	TEST_OK(mfs_id_parse("0", 1, &id));
	TEST_EQ_INT(id.kind, MFS_ID_U64);
	TEST_OK(mfs_id_parse("18446744073709551615", 20, &id));
	TEST_ASSERT(id.kind == MFS_ID_U64 && id.num == UINT64_MAX);
	TEST_OK(mfs_id_parse("18446744073709551616", 20, &id)); /* overflows: a string id */
	TEST_EQ_INT(id.kind, MFS_ID_STR);
	TEST_OK(mfs_id_parse("007", 3, &id)); /* not canonical: a string, distinct from 7 */
	TEST_ASSERT(id.kind == MFS_ID_STR && id.len == 3);
	TEST_OK(mfs_id_parse("str:42", 6, &id));
	TEST_ASSERT(id.kind == MFS_ID_STR && id.len == 2 && memcmp(id.str, "42", 2) == 0);
	TEST_EQ_INT(mfs_id_parse("", 0, &id), MFS_EIDLEN);
	TEST_EQ_INT(mfs_id_parse("str:", 4, &id), MFS_EIDLEN);
	char big[300];
	memset(big, 'a', sizeof big);
	TEST_OK(mfs_id_parse(big, 256, &id));
	TEST_EQ_INT(mfs_id_parse(big, 257, &id), MFS_EIDLEN);

	char buf[300];
	mfs_id_t s42 = {MFS_ID_STR, 2, 0, "42"};
	TEST_STR_EQ(mfs_id_format(&s42, buf, sizeof buf), "str:42"); /* round-trips as a string */
	mfs_id_t n42 = mfs_id_u64(42);
	TEST_STR_EQ(mfs_id_format(&n42, buf, sizeof buf), "42");
	mfs_id_t alice = {MFS_ID_STR, 5, 0, "alice"};
	TEST_STR_EQ(mfs_id_format(&alice, buf, sizeof buf), "alice");
}

static void test_id_utf8(void)
{
	mfs_id_t id = {MFS_ID_STR, 0, 0, NULL};
	const char *good[] = {"caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "plain"};
	for (size_t i = 0; i < 4; i++) {
		id.str = good[i];
		id.len = (uint16_t)strlen(good[i]);
		TEST_ASSERT_MSG(mfs_id_check(&id) == 0, "good[%zu]", i);
	}
	const char *bad[] = {"\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xff", "a\x80"};
	for (size_t i = 0; i < 6; i++) {
		id.str = bad[i];
		id.len = (uint16_t)strlen(bad[i]);
		TEST_ASSERT_MSG(mfs_id_check(&id) == MFS_EINVAL, "bad[%zu]", i);
	}
	id.len = 0;
	TEST_EQ_INT(mfs_id_check(&id), MFS_EIDLEN);
}

/* Rows are dense, stable and found again through many rehashes (checked mid-migration too). */
static void test_idmap_growth(void)
{
	mfs_idmap_t *m;
	TEST_OK(mfs_idmap_init(&m));
	const uint32_t N = 300000;
	for (uint32_t n = 0; n < N; n++) {
		uint64_t v = (uint64_t)n * 2654435761u + 17; /* spread, not sequential */
		mfs_id_t id = mfs_id_u64(v);
		uint32_t row;
		int added;
		TEST_OK(mfs_idmap_get_or_add(m, &id, &row, &added));
		if (row != n || !added) {
			TEST_ASSERT_MSG(0, "id %u got row %u added %d", n, row, added);
			break;
		}
		/* a sample of earlier ids must be found at every step, whatever the rehash state */
		if (n % 997 == 0) {
			for (uint32_t j = 0; j <= n; j += 1 + n / 50) {
				mfs_id_t e = mfs_id_u64((uint64_t)j * 2654435761u + 17);
				if (mfs_idmap_find(m, &e) != j) {
					TEST_ASSERT_MSG(0, "lost id %u after %u inserts", j, n);
					break;
				}
			}
		}
	}
	TEST_EQ_INT(mfs_idmap_size(m), N);
	/* string ids, and a string that looks like a number is distinct from the number */
	char buf[64];
	for (uint32_t n = 0; n < 50000; n++) {
		int len = snprintf(buf, sizeof buf, "user-%u", n);
		mfs_id_t id = {MFS_ID_STR, (uint16_t)len, 0, buf};
		uint32_t row;
		TEST_OK(mfs_idmap_get_or_add(m, &id, &row, NULL));
		if (row != N + n) {
			TEST_ASSERT_MSG(0, "string %u row %u", n, row);
			break;
		}
	}
	mfs_id_t s17 = {MFS_ID_STR, 2, 0, "17"};
	TEST_EQ_INT(mfs_idmap_find(m, &s17), MFS_ROW_NONE);
	mfs_id_t n17 = mfs_id_u64(17);
	TEST_EQ_INT(mfs_idmap_find(m, &n17), 0);
	for (uint32_t n = 0; n < 50000; n += 7) {
		int len = snprintf(buf, sizeof buf, "user-%u", n);
		mfs_id_t id = {MFS_ID_STR, (uint16_t)len, 0, buf};
		TEST_EQ_INT(mfs_idmap_find(m, &id), N + n);
		mfs_id_t k = mfs_idmap_key(m, N + n);
		TEST_ASSERT(k.kind == MFS_ID_STR && k.len == len && memcmp(k.str, buf, (size_t)len) == 0);
	}
	mfs_id_t k0 = mfs_idmap_key(m, 5);
	TEST_ASSERT(k0.kind == MFS_ID_U64 && k0.num == 5ull * 2654435761u + 17);
	/* invalid ids are refused and change nothing */
	mfs_id_t bad = {MFS_ID_STR, 1, 0, "\xff"};
	uint32_t row;
	TEST_EQ_INT(mfs_idmap_get_or_add(m, &bad, &row, NULL), MFS_EINVAL);
	TEST_EQ_INT(mfs_idmap_size(m), N + 50000);
	mfs_idmap_free(m);
}

/* ---- many new ids at once (mfs_idmap_add_*) ------------------------------------------- */

typedef struct cand_ev {
	mfs_id_t id;
	char name[24];
} cand_ev_t;

/* Event x of batch b: mostly new ids (u64 and strings, some looking like numbers), every
 * fifth repeating an earlier one of the batch, some known already. */
static void make_cand(cand_ev_t *e, size_t x, uint32_t b)
{
	const uint64_t v = x % 5 == 4 ? x / 2 : x;
	const uint64_t key = ((uint64_t)b << 32) + v;
	if (x % 13 == 7)
		*e = (cand_ev_t){.id = mfs_id_u64(key / 3)}; /* often known from an earlier batch */
	else if (v % 3 == 0) {
		int len = snprintf(e->name, sizeof e->name, v % 2 ? "s-%llx" : "%llu", (unsigned long long)key);
		e->id = (mfs_id_t){MFS_ID_STR, (uint16_t)len, 0, e->name};
	} else
		e->id = mfs_id_u64(key * 2654435761u);
}

/* Batches of events through the shard steps (shards in a scrambled order, as threads would take
 * them) against get_or_add one event after another: the same rows, keys and lookups, across
 * table growth inside a batch, rehashes under way at a batch's start, and tombstones. */
static void test_idmap_add_many(void)
{
	mfs_idmap_t *ref, *m;
	TEST_OK(mfs_idmap_init(&ref));
	TEST_OK(mfs_idmap_init(&m));
	const size_t sizes[] = {1, 9, 700, 70000, 3, 5000, 200000, 40};
	const size_t nb = sizeof sizes / sizeof *sizes;
	mfs_idmap_add_t a = {0};
	size_t placed = 0;
	for (uint32_t b = 0; b < nb; b++) {
		const size_t n = sizes[b];
		cand_ev_t *ev = calloc(n, sizeof *ev);
		uint64_t *h = calloc(n, sizeof *h);
		uint32_t *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got), *idx = calloc(n, sizeof *idx);
		TEST_ASSERT(ev && h && want && got && idx);
		size_t nc = 0;
		for (size_t x = 0; x < n; x++) {
			make_cand(&ev[x], x, b);
			h[x] = mfs_idmap_hash(&ev[x].id);
			if ((got[x] = mfs_idmap_find_h(m, &ev[x].id, h[x])) == MFS_ROW_NONE)
				idx[nc++] = (uint32_t)x;
		}
		for (size_t x = 0; x < n; x++)
			TEST_OK(mfs_idmap_get_or_add(ref, &ev[x].id, &want[x], NULL));
		a.n = nc;
		a.base = (const char *)&ev[0].id;
		a.stride = sizeof *ev;
		a.idx = idx;
		a.h = h;
		TEST_OK(mfs_idmap_add_begin(m, &a));
		TEST_EQ_INT(a.start[MFS_IDMAP_SHARDS], nc);
		for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++)
			mfs_idmap_add_shard(m, &a, (s * 7 + b) % MFS_IDMAP_SHARDS);
		const uint32_t added = mfs_idmap_add_number(m, &a, got);
		for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++)
			mfs_idmap_add_end(m, &a, got, (s * 11 + b) % MFS_IDMAP_SHARDS);
		placed += added;
		size_t bad = 0;
		for (size_t x = 0; x < n; x++)
			bad += got[x] != want[x] || mfs_idmap_find_h(m, &ev[x].id, h[x]) != want[x];
		TEST_ASSERT_MSG(bad == 0, "batch %u: %zu of %zu events with other rows", b, bad, n);
		TEST_EQ_INT(mfs_idmap_size(m), mfs_idmap_size(ref));
		TEST_EQ_INT(mfs_idmap_live(m), mfs_idmap_live(ref));
		for (uint32_t r = a.n0; r < mfs_idmap_size(m); r++) {
			const mfs_id_t k1 = mfs_idmap_key(m, r), k2 = mfs_idmap_key(ref, r);
			if (k1.kind != k2.kind || k1.len != k2.len ||
			    (k1.kind == MFS_ID_U64 ? k1.num != k2.num : memcmp(k1.str, k2.str, k1.len) != 0)) {
				TEST_ASSERT_MSG(0, "batch %u: row %u holds another key", b, r);
				break;
			}
		}
		/* between batches: one id at a time, and removals (tombstones on later chains) */
		for (uint32_t j = 0; j < 50; j++) {
			mfs_id_t one = mfs_id_u64(0xabc000000ull + b * 100 + j);
			uint32_t r1, r2;
			TEST_OK(mfs_idmap_get_or_add(ref, &one, &r1, NULL));
			TEST_OK(mfs_idmap_get_or_add(m, &one, &r2, NULL));
			TEST_EQ_INT(r1, r2);
		}
		for (uint32_t r = b; r < mfs_idmap_size(m); r += 97) {
			mfs_idmap_remove(ref, r);
			mfs_idmap_remove(m, r);
		}
		free(ev);
		free(h);
		free(want);
		free(got);
		free(idx);
	}
	TEST_ASSERT(placed > 200000); /* most events were new: the steps did the work */
	/* every id of the reference is found at its row, and removed ones nowhere */
	size_t bad = 0;
	for (uint32_t r = 0; r < mfs_idmap_size(ref); r++) {
		const mfs_id_t k = mfs_idmap_key(ref, r);
		if (k.kind)
			bad += mfs_idmap_find(m, &k) != r;
	}
	TEST_EQ_INT(bad, 0);
	/* a bad id: refused before anything changes */
	const uint32_t size = mfs_idmap_size(m);
	cand_ev_t ev[3] = {{.id = mfs_id_u64(0x5eed01)}, {.id = {MFS_ID_STR, 1, 0, "\xff"}}, {.id = mfs_id_u64(0x5eed02)}};
	uint64_t h[3];
	uint32_t idx[3] = {0, 1, 2};
	for (int x = 0; x < 3; x++)
		h[x] = mfs_idmap_hash(&ev[x].id);
	a.n = 3;
	a.base = (const char *)&ev[0].id;
	a.idx = idx;
	a.h = h;
	TEST_EQ_INT(mfs_idmap_add_begin(m, &a), MFS_EINVAL);
	TEST_EQ_INT(mfs_idmap_size(m), size);
	TEST_EQ_INT(mfs_idmap_find(m, &ev[0].id), MFS_ROW_NONE);
	mfs_idmap_add_free(&a);
	mfs_idmap_free(ref);
	mfs_idmap_free(m);
}

/* Tables prepared ahead (mfs_idmap_prepare_ahead): 32 shards pass 3/8 of their 65,536 slots
 * (the first size whose next table is mapped), the helper prepares every next table (waited
 * for as a condition: on a busy machine it may take a while), then the shards pass 1/2 and
 * every rehash takes its prepared table. Every id keeps its row throughout, inserted one at a
 * time and many at once, with removals between; a map without the helper gives the same rows. */
static void test_idmap_prepare_ahead(void)
{
	mfs_idmap_t *m, *ref;
	TEST_OK(mfs_idmap_init(&m));
	TEST_OK(mfs_idmap_init(&ref));
	TEST_OK(mfs_idmap_prepare_ahead(m));
	TEST_OK(mfs_idmap_prepare_ahead(m)); /* a second call: nothing more */
	const uint32_t n1 = 880000, n2 = 1200000; /* 27,500 and 37,500 ids a shard on average */
	uint32_t row, rref;
	for (uint32_t x = 0; x < n1; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x * 2654435761u + 17);
		TEST_OK(mfs_idmap_get_or_add(m, &id, &row, NULL));
		TEST_OK(mfs_idmap_get_or_add(ref, &id, &rref, NULL));
		if (row != rref) {
			TEST_ASSERT_MSG(0, "id %u: row %u, %u without the helper", x, row, rref);
			break;
		}
	}
	uint64_t prepared = 0, used = 0, own = 0;
	for (int waited = 0; waited < 120000; waited += 10) { /* a condition, bounded generously */
		mfs_idmap_prepare_counts(m, &prepared, &used, &own);
		if (prepared >= MFS_IDMAP_SHARDS)
			break;
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	TEST_EQ_INT(prepared, MFS_IDMAP_SHARDS);
	TEST_EQ_INT(used, 0);
	/* the rest many at once, removals of every 97th id first (tombstones in the old tables) */
	for (uint32_t x = 0; x < n1; x += 97) {
		mfs_id_t id = mfs_id_u64((uint64_t)x * 2654435761u + 17);
		mfs_idmap_remove(m, mfs_idmap_find(m, &id));
		mfs_idmap_remove(ref, mfs_idmap_find(ref, &id));
	}
	const size_t n = n2 - n1;
	mfs_id_t *ids = calloc(n, sizeof *ids);
	uint64_t *h = calloc(n, sizeof *h);
	uint32_t *idx = calloc(n, sizeof *idx), *got = calloc(n, sizeof *got);
	TEST_ASSERT(ids && h && idx && got);
	for (size_t x = 0; x < n; x++) {
		ids[x] = mfs_id_u64((uint64_t)(n1 + x) * 2654435761u + 17);
		h[x] = mfs_idmap_hash(&ids[x]);
		idx[x] = (uint32_t)x;
	}
	mfs_idmap_add_t a = {0};
	a.n = n;
	a.base = (const char *)ids;
	a.stride = sizeof *ids;
	a.idx = idx;
	a.h = h;
	TEST_OK(mfs_idmap_add_begin(m, &a));
	for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++)
		mfs_idmap_add_shard(m, &a, s);
	TEST_EQ_INT(mfs_idmap_add_number(m, &a, got), n);
	for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++)
		mfs_idmap_add_end(m, &a, got, s);
	mfs_idmap_prepare_counts(m, &prepared, &used, &own);
	TEST_EQ_INT(used, MFS_IDMAP_SHARDS); /* every shard's rehash at 1/2 took its prepared table */
	size_t bad = 0;
	for (size_t x = 0; x < n; x++) {
		TEST_OK(mfs_idmap_get_or_add(ref, &ids[x], &rref, NULL));
		bad += got[x] != rref;
	}
	for (uint32_t x = 0; x < n2; x++) {
		mfs_id_t id = mfs_id_u64((uint64_t)x * 2654435761u + 17);
		bad += mfs_idmap_find(m, &id) != mfs_idmap_find(ref, &id);
	}
	TEST_ASSERT_MSG(bad == 0, "%zu ids with rows other than without the helper", bad);
	TEST_EQ_INT(mfs_idmap_live(m), mfs_idmap_live(ref));
	mfs_idmap_add_free(&a);
	free(ids), free(h), free(idx), free(got);
	mfs_idmap_free(m); /* ends the helper */
	mfs_idmap_free(ref);
}

static void test_model_rows(void)
{
	mfs_model_conf_t conf = {16, 0.1, 99};
	mfs_model_t *a, *b;
	TEST_OK(mfs_model_init(&conf, &a));
	TEST_OK(mfs_model_init(&conf, &b));
	/* grow far past the initial capacity; factors are a function of (seed, entity, row) only */
	for (uint64_t u = 0; u < 5000; u++) {
		mfs_id_t id = mfs_id_u64(u * 7);
		uint32_t r;
		TEST_OK(mfs_model_user_row(a, &id, &r));
		TEST_EQ_INT(r, u);
	}
	for (uint64_t u = 0; u < 5000; u++) {
		mfs_id_t id = mfs_id_u64(1000000 + u); /* different ids, same rows */
		uint32_t r;
		TEST_OK(mfs_model_user_row(b, &id, &r));
	}
	TEST_EQ_INT(a->n_users, 5000);
	TEST_ASSERT(a->cap_users >= 5000);
	TEST_ASSERT(((uintptr_t)a->P % 64) == 0);
	TEST_ASSERT(memcmp(a->P, b->P, 5000 * 16 * sizeof(float)) == 0);
	double ss = 0;
	for (size_t j = 0; j < 5000 * 16; j++)
		ss += (double)a->P[j] * a->P[j];
	/* sd of each entry is init_scale / sqrt(k) = 0.025 */
	TEST_NEAR(sqrt(ss / (5000 * 16)), 0.025, 0.001);
	TEST_EQ_INT(a->bu[4999], 0);
	/* items are seeded apart from users */
	mfs_id_t i0 = mfs_id_u64(0);
	uint32_t r;
	TEST_OK(mfs_model_item_row(a, &i0, &r));
	TEST_ASSERT(memcmp(a->Q, a->P, 16 * sizeof(float)) != 0);
	/* the running mean */
	mfs_model_observe(a, 10.0, 4);
	mfs_model_observe(a, 2.0, 2);
	TEST_NEAR(a->mu, 2.0, 1e-12);
	TEST_EQ_INT(mfs_model_init(&(mfs_model_conf_t){0, 0.1, 1}, &b), MFS_EINVAL);
	mfs_model_free(a);
	mfs_model_free(b);
}

/* Initial factors are N(0, init_scale^2 / k): mean, sd, the mass within 1 and 2 sd, and no
 * correlation between neighbours (drawn in Box-Muller pairs), with an odd k (the last factor
 * of a row uses half a pair). */
static void test_model_init_normal(void)
{
	const int k = 15, rows = 20000;
	mfs_model_conf_t conf = {k, 0.3, 7};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&conf, &m));
	const double sd = 0.3 / sqrt(k);
	double s = 0, ss = 0, pair = 0, last = 0;
	long in1 = 0, in2 = 0, n = 0;
	float row[15], again[15];
	for (uint32_t r = 0; r < (uint32_t)rows; r++) {
		mfs_model_init_row(m, 0, r, row);
		for (int j = 0; j < k; j++) {
			double z = row[j] / sd;
			s += z;
			ss += z * z;
			in1 += fabs(z) < 1;
			in2 += fabs(z) < 2;
			n++;
			if (j % 2 == 1)
				pair += z * (row[j - 1] / sd);
		}
		last += (row[k - 1] / sd) * (row[k - 1] / sd);
	}
	mfs_model_init_row(m, 0, 123, row);
	mfs_model_init_row(m, 0, 123, again);
	TEST_ASSERT(memcmp(row, again, sizeof row) == 0);
	mfs_model_init_row(m, 1, 123, again);
	TEST_ASSERT(memcmp(row, again, sizeof row) != 0);
	/* n = 300000 values: the mean's sd is 0.0018, the variance's 0.0026 */
	TEST_NEAR(s / n, 0, 0.01);
	TEST_NEAR(ss / n, 1, 0.015);
	TEST_NEAR((double)in1 / n, 0.6827, 0.005);
	TEST_NEAR((double)in2 / n, 0.9545, 0.003);
	TEST_NEAR(pair / (rows * (k / 2)), 0, 0.015);
	TEST_NEAR(last / rows, 1, 0.04);
	mfs_model_free(m);
}

/* mfs_model_rows (hashed and prefetched ahead) against one call per id: same rows, same
 * tables, for u64 and string ids with repeats, through several rehashes, in batches of sizes
 * around its look-ahead (1 .. 9) and larger, and with a stride like the learner's events. */
static void test_model_rows_batched(void)
{
	enum { N = 30000 };
	struct ev {
		mfs_id_t user, item;
		float r;
	};
	static struct ev evs[N];
	static char names[N][16];
	static uint32_t ru[N], ri[N];
	mfs_model_conf_t conf = {8, 0.1, 5};
	mfs_model_t *a, *b;
	TEST_OK(mfs_model_init(&conf, &a));
	TEST_OK(mfs_model_init(&conf, &b));
	uint64_t x = 88172645463325252ull;
	for (int j = 0; j < N; j++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		uint64_t u = (x % 7 == 0) ? x % 50 : x % 9000; /* a few hot users, many repeats */
		evs[j].user = mfs_id_u64(u);
		snprintf(names[j], sizeof names[j], "item-%u", (unsigned)((x >> 20) % 6000));
		evs[j].item = (mfs_id_t){MFS_ID_STR, (uint16_t)strlen(names[j]), 0, names[j]};
		if (j % 5 == 0)
			evs[j].item = mfs_id_u64((x >> 32) % 3000); /* the other kind in the same map */
		evs[j].r = 1;
	}
	static const size_t sizes[] = {1, 2, 3, 7, 8, 9, 16, 1000, 4096};
	size_t at = 0, si = 0;
	while (at < N) {
		size_t n = sizes[si++ % (sizeof sizes / sizeof sizes[0])];
		if (n > N - at)
			n = N - at;
		TEST_OK(mfs_model_rows(a, 0, &evs[at].user, sizeof evs[0], n, ru + at));
		TEST_OK(mfs_model_rows(a, 1, &evs[at].item, sizeof evs[0], n, ri + at));
		at += n;
	}
	long bad = 0;
	for (int j = 0; j < N; j++) {
		uint32_t u, i;
		TEST_OK(mfs_model_user_row(b, &evs[j].user, &u));
		TEST_OK(mfs_model_item_row(b, &evs[j].item, &i));
		bad += u != ru[j] || i != ri[j];
	}
	TEST_EQ_INT(bad, 0);
	TEST_EQ_INT(a->n_users, b->n_users);
	TEST_EQ_INT(a->n_items, b->n_items);
	TEST_ASSERT(a->n_users > 4000 && a->n_items > 4000); /* past several rehashes */
	TEST_ASSERT(memcmp(a->P, b->P, (size_t)a->n_users * 8 * sizeof(float)) == 0);
	TEST_ASSERT(memcmp(a->Q, b->Q, (size_t)a->n_items * 8 * sizeof(float)) == 0);
	/* lookups of the batched map find every id at the row it was given */
	for (int j = 0; j < N; j += 97) {
		TEST_EQ_INT(mfs_idmap_find(a->users, &evs[j].user), ru[j]);
		TEST_EQ_INT(mfs_idmap_find(a->items, &evs[j].item), ri[j]);
	}
	TEST_OK(mfs_model_rows(a, 0, &evs[0].user, sizeof evs[0], 0, ru)); /* empty */
	mfs_model_free(a);
	mfs_model_free(b);
}

/* The count-min sketch never undercounts, also when a tiny one is full of collisions: an id
 * is never admitted late; with room, the counts are exact. */
static void test_admit_sketch(void)
{
	enum { IDS = 5000, SEEN = 7 };
	for (int tiny = 0; tiny < 2; tiny++) {
		mfs_admit_t a;
		TEST_OK(mfs_admit_init(&a, tiny ? 64 : 1 << 20));
		int under = 0, over = 0;
		for (int round = 1; round <= SEEN; round++)
			for (uint64_t id = 0; id < IDS; id++) {
				mfs_id_t x = mfs_id_u64(id);
				unsigned est = mfs_admit_see(&a, mfs_idmap_hash(&x));
				under += est < (unsigned)round;
				over += est > (unsigned)round;
			}
		fprintf(stderr, "  sketch of %s counters per row: %d overcounts of %d\n", tiny ? "64" : "2^20", over,
		        IDS * SEEN);
		TEST_EQ_INT(under, 0);
		if (!tiny)
			TEST_ASSERT_MSG(over < IDS * SEEN / 1000, "%d overcounts", over);
		mfs_admit_free(&a);
	}
}

int main(void)
{
	TEST_RUN(test_id_parse);
	TEST_RUN(test_id_utf8);
	TEST_RUN(test_idmap_growth);
	TEST_RUN(test_idmap_add_many);
	TEST_RUN(test_idmap_prepare_ahead);
	TEST_RUN(test_model_rows);
	TEST_RUN(test_model_init_normal);
	TEST_RUN(test_model_rows_batched);
	TEST_RUN(test_admit_sketch);
	return TEST_REPORT();
}
