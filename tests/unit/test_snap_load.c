/* test_snap_load.c - snapshots/snap_load.c and model_store/touched.c.
 *
 * A model with u64 and string ids is published with the optional serve keys (extra), then
 * loaded into a fresh model: every id has the same bias and factors bit for bit, mu,
 * mu_count/mu_sum, events_applied, rejected counters and offsets come back. A partial publish
 * (touched rows only) after a change is loaded again. Also: no snapshot -> MFS_ENOTFOUND, k
 * mismatch -> MFS_EINVAL, reserved extra keys are refused, touched dedups and clears.
 */
#include <math.h>
#include <stdint.h>

#include <string.h>

#include "common/err.h"
#include "model_store/store.h"
#include "model_store/touched.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_load.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"

static char errbuf[1024];

static mfs_model_t *make_model(int k)
{
	mfs_model_conf_t c = {k, 0.1, 5};
	mfs_model_t *m = NULL;
	TEST_OK(mfs_model_init(&c, &m));
	return m;
}

static void same_row(mfs_model_t *a, mfs_model_t *b, int ent, const mfs_id_t *id)
{
	uint32_t ra = mfs_idmap_find(ent ? a->items : a->users, id), rb = mfs_idmap_find(ent ? b->items : b->users, id);
	TEST_ASSERT(ra != MFS_ROW_NONE && rb != MFS_ROW_NONE);
	if (ra == MFS_ROW_NONE || rb == MFS_ROW_NONE)
		return;
	float *fa = (ent ? a->Q : a->P) + (size_t)ra * (size_t)a->k, *fb = (ent ? b->Q : b->P) + (size_t)rb * (size_t)b->k;
	TEST_ASSERT(memcmp(fa, fb, sizeof *fa * (size_t)a->k) == 0);
	TEST_ASSERT((ent ? a->bi : a->bu)[ra] == (ent ? b->bi : b->bu)[rb]);
}

static void test_roundtrip(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = make_model(8), *l = make_model(8), *bad = make_model(4);
	mfs_snap_loaded_t ld;
	TEST_EQ_INT(mfs_snap_load(dir, l, &ld, errbuf, sizeof errbuf), MFS_ENOTFOUND);
	mfs_id_t ids[5] = {mfs_id_u64(1), mfs_id_u64(1ull << 40), {MFS_ID_STR, 3, 0, "abc"}, {MFS_ID_STR, 2, 0, "42"},
	                   mfs_id_u64(0)};
	uint32_t row;
	for (int j = 0; j < 5; j++) {
		TEST_OK(mfs_model_user_row(m, &ids[j], &row));
		m->bu[row] = 0.25f * (float)j;
		TEST_OK(mfs_model_item_row(m, &ids[4 - j], &row));
		m->bi[row] = -0.5f * (float)j;
	}
	mfs_model_observe(m, 17.5, 5);
	m->events_applied = 12345;
	mfs_offset_t offs[2] = {{"ratings", 0, 100}, {"ratings", 3, 7}};
	mfs_snap_extra_t ex[3] = {{MFS_META_MU_COUNT, MFS_SNAP_T_U64, m->mu_count, 0},
	                          {MFS_META_MU_SUM, MFS_SNAP_T_F64, 0, m->mu_sum},
	                          {"rejected/nan", MFS_SNAP_T_U64, 9, 0}};
	mfs_snap_info_t info = {.learning_rate = 0.01, .last_loss = NAN, .rating_min = 0.5, .rating_max = 5,
	                        .offsets = offs, .n_offsets = 2, .extra = ex, .n_extra = 3};
	mfs_snap_writer_t *w = NULL;
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf));
	/* reserved keys are refused */
	mfs_snap_extra_t bad_ex = {"mu", MFS_SNAP_T_F64, 0, 1.0};
	mfs_snap_info_t bi = info;
	bi.extra = &bad_ex;
	bi.n_extra = 1;
	TEST_EQ_INT(mfs_snap_publish(w, m, &bi, NULL, errbuf, sizeof errbuf), MFS_EINVAL);
	TEST_OK(mfs_snap_publish(w, m, &info, NULL, errbuf, sizeof errbuf));

	/* a change to one user, published partially */
	uint32_t r2 = mfs_idmap_find(m->users, &ids[2]);
	m->P[(size_t)r2 * 8 + 3] = 1.5f;
	m->bu[r2] = 2.0f;
	offs[0].next = 150;
	static const uint32_t none = 0;
	info.user_rows = &r2;
	info.n_user_rows = 1;
	info.item_rows = &none;
	info.n_item_rows = 0;
	TEST_OK(mfs_snap_publish(w, m, &info, NULL, errbuf, sizeof errbuf));
	mfs_snap_writer_close(w);

	TEST_EQ_INT(mfs_snap_load(dir, bad, &ld, errbuf, sizeof errbuf), MFS_EINVAL);
	TEST_OK(mfs_snap_load(dir, l, &ld, errbuf, sizeof errbuf));
	TEST_EQ_INT(ld.seq, 2);
	TEST_EQ_INT(l->n_users, 5);
	TEST_EQ_INT(l->n_items, 5);
	for (int j = 0; j < 5; j++) {
		same_row(m, l, 0, &ids[j]);
		same_row(m, l, 1, &ids[j]);
	}
	TEST_ASSERT(l->mu == m->mu && l->mu_sum == m->mu_sum);
	TEST_EQ_INT(l->mu_count, 5);
	TEST_EQ_INT(l->events_applied, 12345);
	/* the writer's extra records come back as written; one never written is absent */
	const mfs_snap_extra_t *x = mfs_snap_loaded_extra(&ld, "rejected/nan");
	TEST_ASSERT(x && x->type == MFS_SNAP_T_U64);
	TEST_EQ_INT(x->u64, 9);
	TEST_ASSERT(mfs_snap_loaded_extra(&ld, "rejected/empty") == NULL);
	x = mfs_snap_loaded_extra(&ld, MFS_META_MU_SUM);
	TEST_ASSERT(x && x->type == MFS_SNAP_T_F64 && x->f64 == m->mu_sum);
	TEST_EQ_INT(ld.n_extra, 3);
	TEST_EQ_INT(ld.n_offsets, 2);
	for (size_t j = 0; j < ld.n_offsets; j++) {
		TEST_STR_EQ(ld.offsets[j].topic, "ratings");
		TEST_ASSERT((ld.offsets[j].partition == 0 && ld.offsets[j].next == 150) ||
		            (ld.offsets[j].partition == 3 && ld.offsets[j].next == 7));
	}
	mfs_snap_loaded_free(&ld);
	mfs_model_free(m);
	mfs_model_free(l);
	mfs_model_free(bad);
}

static void test_touched(void)
{
	mfs_touched_t t = {0};
	uint32_t rows[] = {5, 70000, 5, 0, 63, 64, 70000, 0};
	for (size_t j = 0; j < sizeof rows / sizeof rows[0]; j++)
		TEST_OK(mfs_touched_mark(&t, rows[j]));
	TEST_EQ_INT(t.n, 5);
	TEST_EQ_INT(t.rows[0], 5);
	TEST_EQ_INT(t.rows[1], 70000);
	mfs_touched_clear(&t);
	TEST_EQ_INT(t.n, 0);
	TEST_OK(mfs_touched_mark(&t, 70000));
	TEST_OK(mfs_touched_mark(&t, 70000));
	TEST_EQ_INT(t.n, 1);
	mfs_touched_free(&t);
	/* marking many at once: the same rows in the same first-touch order as one by one, also
	 * after a clear and with rows that grow the bitmap past what the first call saw */
	mfs_touched_t one = {0}, many = {0};
	uint32_t seq[5000];
	uint64_t x = 88172645463325252ull;
	for (int round = 0; round < 3; round++) {
		for (size_t j = 0; j < 5000; j++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			seq[j] = (uint32_t)(x % (2000u << (4 * round)));
		}
		for (size_t j = 0; j < 5000; j++)
			TEST_OK(mfs_touched_mark(&one, seq[j]));
		TEST_OK(mfs_touched_mark_many(&many, seq, 1000));
		TEST_OK(mfs_touched_mark_many(&many, seq + 1000, 4000));
		TEST_OK(mfs_touched_mark_many(&many, seq, 0));
		TEST_EQ_INT(many.n, one.n);
		TEST_ASSERT(one.n > 0 && !memcmp(one.rows, many.rows, one.n * sizeof *one.rows));
		if (round == 1) {
			mfs_touched_clear(&one);
			mfs_touched_clear(&many);
		}
	}
	mfs_touched_free(&one);
	mfs_touched_free(&many);
}

int main(void)
{
	TEST_RUN(test_roundtrip);
	TEST_RUN(test_touched);
	return TEST_REPORT();
}
