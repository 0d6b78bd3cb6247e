/* test_sharded.c - the sharded engine (gpu/sharded.c, engine.devices) over CPU shards.
 *
 * Covers: with deterministic CPU shards the engine reproduces the CPU reference of the sharded
 * algorithm (gpu/cpu/shard_ref.c, allreduce with BLEND and hot rows) bit for bit - factors,
 * biases, events applied and the loss - for 2 and 3 shards, several merge periods and hot
 * thresholds; the replicas agree after a sync; progress and drain; capture gives the values sync
 * gives; rows added between batches (grow) and rows given to new ids (reset_rows) reach their
 * shards; resident epochs on 2 shards reach the one-engine test RMSE within 2 % on a planted
 * problem (uniform and Zipf 1.2 items); validation of the shard count; the driver thread
 * (streaming batches applied off the caller's thread: the same bits as inline, tickets and events
 * counted when sgd returns, a shard's failure reaching the caller, fault point engine.shard);
 * a capture waited for on a second thread while the first captures again (the snapshot writer
 * beside exchange.topic's publish) gives both their values; a merge of a non-finite item row
 * fails (MFS_ENAN); an epoch in one piece ends with BLEND's epoch step (the shard count's, or
 * engine.merge_epoch_g's, validated). No timing: the tests hold on a slow, loaded machine.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/rng.h"
#include "gpu/cpu/shard_ref.h"
#include "gpu/engine.h"
#include "gpu/shard.h"
#include "testhelp.h"
#include "model_help.h"
#include "planted_help.h"

static mfs_engine_t *open_sharded_hs(mfs_model_t *m, uint32_t S, uint32_t every, uint32_t hot, uint32_t pieces,
                                     int det, int inl, int hot_stream)
{
	mfs_engine_conf_t ec = {.kind = MFS_ENGINE_CPU, .threads = 1, .deterministic = det, .seed = 3, .shards = S,
	                        .merge_batches = every, .merge_hot = hot, .merge_pieces = pieces, .batches_inline = inl,
	                        .merge_hot_stream = hot_stream};
	mfs_engine_t *e = NULL;
	char err[256];
	int rc = mfs_engine_open(&ec, m, &e, err, sizeof err);
	TEST_ASSERT_MSG(rc == 0, "open: %s", err);
	return e;
}

/* Hot rows merged after every streaming batch, as the reference does */
static mfs_engine_t *open_sharded_as(mfs_model_t *m, uint32_t S, uint32_t every, uint32_t hot, uint32_t pieces,
                                     int det, int inl)
{
	return open_sharded_hs(m, S, every, hot, pieces, det, inl, 1);
}

/* Streaming batches go through the engine's driver thread (the default) */
static mfs_engine_t *open_sharded(mfs_model_t *m, uint32_t S, uint32_t every, uint32_t hot, uint32_t pieces, int det)
{
	return open_sharded_as(m, S, every, hot, pieces, det, 0);
}

static int same_floats(const float *a, const float *b, size_t n)
{
	for (size_t x = 0; x < n; x++)
		if (memcmp(&a[x], &b[x], sizeof *a)) {
			fprintf(stderr, "  first difference at %zu: %.9g vs %.9g\n", x, (double)a[x], (double)b[x]);
			return 0;
		}
	return 1;
}

static const mfs_hparams_t HP = {0.05f, 0.04f, 0.04f, 0.02f, 0.02f, 1.0f, 5.0f};

/* The engine against the reference on the same batches: bit for bit after a final merge
 * (batches through the driver thread, or inline: conf.batches_inline). Without
 * merge_hot_stream the engine's batches merge no hot rows: the reference without them. */
static void parity_case_hs(uint32_t S, uint32_t every, uint32_t hot, double zipf, int inl, int hot_stream)
{
	const int k = 8;
	const uint32_t nu = 300, ni = 120;
	const size_t batch = 500;
	struct planted pl;
	planted(&pl, nu, ni, 20000, 3000, zipf, 5 + S);
	mfs_model_t *a = mk_model(k, nu, ni, pl.mean), *b = mk_model(k, nu, ni, pl.mean);
	TEST_ASSERT(a && b);
	mfs_engine_t *e = open_sharded_hs(a, S, every, hot, 1, 1, inl, hot_stream);
	mfs_shard_conf_t rc_conf = {.shards = S, .scheme = MFS_SHARD_ALLREDUCE, .batch = batch, .exchange_every = every,
	                            .combine = MFS_SHARD_BLEND, .threads = 1, .hot_ratings = hot_stream ? hot : 0};
	mfs_shard_ref_t *r = NULL;
	char err[256];
	TEST_ASSERT_MSG(mfs_shard_ref_init(&rc_conf, b, &r, err, sizeof err) == 0, "%s", err);
	TEST_OK(mfs_engine_set_hparams(e, &HP));
	TEST_OK(mfs_shard_ref_set_hparams(r, &HP));
	for (size_t off = 0; off < pl.n; off += batch) {
		const mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, pl.n - off < batch ? pl.n - off : batch};
		TEST_OK(mfs_engine_sgd(e, &bt));
		TEST_OK(mfs_shard_ref_sgd(r, &bt));
	}
	/* the loss before any final merge: each shard against its own replica, summed in order */
	const mfs_batch_t te = {pl.u + pl.n, pl.i + pl.n, pl.r + pl.n, pl.tn};
	mfs_loss_t la, lb;
	TEST_OK(mfs_engine_loss(e, &te, &la));
	TEST_OK(mfs_shard_ref_loss(r, &te, &lb));
	TEST_ASSERT_MSG(la.sse == lb.sse && la.sae == lb.sae && la.n == lb.n, "loss %.17g vs %.17g", la.sse, lb.sse);
	TEST_OK(mfs_engine_sync(e));      /* merges what is pending */
	TEST_OK(mfs_shard_ref_exchange(r)); /* the same */
	TEST_ASSERT_MSG(same_floats(a->P, b->P, (size_t)nu * k), "S=%u every=%u hot=%u: P", S, every, hot);
	TEST_ASSERT_MSG(same_floats(a->Q, b->Q, (size_t)ni * k), "S=%u every=%u hot=%u: Q", S, every, hot);
	TEST_ASSERT(same_floats(a->bu, b->bu, nu));
	TEST_ASSERT(same_floats(a->bi, b->bi, ni));
	TEST_EQ_INT(a->events_applied, b->events_applied);
	TEST_EQ_INT(a->events_applied, pl.n);
	/* after the merge every replica is the table: the loss agrees again */
	TEST_OK(mfs_engine_loss(e, &te, &la));
	TEST_OK(mfs_shard_ref_loss(r, &te, &lb));
	TEST_ASSERT(la.sse == lb.sse);
	uint64_t ticket = 0, applied = 0;
	mfs_engine_progress(e, &ticket, &applied);
	TEST_EQ_INT(ticket, (pl.n + batch - 1) / batch);
	TEST_EQ_INT(applied, ticket);
	mfs_engine_close(e);
	mfs_shard_ref_free(r);
	mfs_model_free(a);
	mfs_model_free(b);
	planted_free(&pl);
}

static void parity_case(uint32_t S, uint32_t every, uint32_t hot, double zipf)
{
	parity_case_hs(S, every, hot, zipf, 0, 1);
}

static void test_parity_with_reference(void)
{
	parity_case_hs(2, 4, 3, 1.2, 1, 1);
	parity_case_hs(3, 5, 8, 0.8, 1, 1);
	parity_case_hs(2, 4, 3, 1.2, 0, 0); /* engine.merge_hot_stream off (the default) */
	parity_case(2, 1, 0, 0);
	parity_case(2, 4, 0, 1.2);
	parity_case(2, 4, 3, 1.2);
	parity_case(3, 5, 8, 0.8);
	parity_case(3, 1000, 2, 1.2); /* hot rows only, until the final merge */
}

/* A model that did not merge in between differs from one that did: the parity above is not
 * an accident of rows no two shards share. */
static void test_merges_matter(void)
{
	const int k = 8;
	struct planted pl;
	planted(&pl, 200, 50, 6000, 10, 1.2, 9);
	mfs_model_t *a = mk_model(k, 200, 50, pl.mean), *b = mk_model(k, 200, 50, pl.mean);
	mfs_engine_t *ea = open_sharded(a, 2, 1, 0, 1, 1), *eb = open_sharded(b, 2, 1000, 0, 1, 1);
	TEST_OK(mfs_engine_set_hparams(ea, &HP));
	TEST_OK(mfs_engine_set_hparams(eb, &HP));
	for (size_t off = 0; off < pl.n; off += 500) {
		const mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, 500};
		TEST_OK(mfs_engine_sgd(ea, &bt));
		TEST_OK(mfs_engine_sgd(eb, &bt));
	}
	TEST_OK(mfs_engine_sync(ea));
	TEST_OK(mfs_engine_sync(eb));
	TEST_ASSERT(memcmp(a->Q, b->Q, 50 * (size_t)k * sizeof(float)) != 0);
	mfs_engine_close(ea);
	mfs_engine_close(eb);
	mfs_model_free(a);
	mfs_model_free(b);
	planted_free(&pl);
}

/* Capture returns what sync writes, users from their shards in the order asked, items merged. */
static void test_capture_and_growth(void)
{
	const int k = 8;
	struct planted pl;
	planted(&pl, 100, 40, 4000, 10, 0.8, 13);
	mfs_model_t *m = mk_model(k, 60, 40, pl.mean); /* users 60..99 arrive later */
	mfs_engine_t *e = open_sharded(m, 3, 3, 4, 1, 1);
	TEST_OK(mfs_engine_set_hparams(e, &HP));
	size_t off = 0;
	for (; off < pl.n; off += 400) {
		mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, 400};
		for (size_t j = 0; j < bt.n; j++) /* a new user gets its row first */
			while (bt.u[j] >= m->n_users)
				add_user(m, mfs_id_u64(m->n_users));
		TEST_OK(mfs_engine_grow(e));
		TEST_OK(mfs_engine_sgd(e, &bt));
	}
	TEST_EQ_INT(m->n_users, 100);
	const uint32_t ur[] = {99, 0, 61, 5, 61}, ir[] = {3, 0, 39};
	float du[5 * 9], di[3 * 9];
	TEST_OK(mfs_engine_capture(e, ur, 5, du, ir, 3, di));
	TEST_OK(mfs_engine_capture_wait(e));
	TEST_OK(mfs_engine_sync(e));
	for (int j = 0; j < 5; j++) {
		TEST_ASSERT(du[j * 9] == m->bu[ur[j]]);
		TEST_ASSERT(!memcmp(du + j * 9 + 1, m->P + (size_t)ur[j] * k, k * sizeof(float)));
	}
	for (int j = 0; j < 3; j++) {
		TEST_ASSERT(di[j * 9] == m->bi[ir[j]]);
		TEST_ASSERT(!memcmp(di + j * 9 + 1, m->Q + (size_t)ir[j] * k, k * sizeof(float)));
	}
	/* a user row and an item row given to new ids: fresh values on their shards */
	const uint32_t ru = 61, ri = 3;
	for (int f = 0; f < k; f++) {
		m->P[(size_t)ru * k + f] = 0.5f;
		m->Q[(size_t)ri * k + f] = -0.25f;
	}
	m->bu[ru] = 0.125f;
	m->bi[ri] = -0.125f;
	TEST_OK(mfs_engine_reset_rows(e, 0, &ru, 1, 0));
	TEST_OK(mfs_engine_reset_rows(e, 1, &ri, 1, 0));
	TEST_OK(mfs_engine_capture(e, &ru, 1, du, &ri, 1, di));
	TEST_OK(mfs_engine_capture_wait(e));
	TEST_ASSERT(du[0] == 0.125f && du[1] == 0.5f && du[8] == 0.5f);
	TEST_ASSERT(di[0] == -0.125f && di[1] == -0.25f && di[8] == -0.25f);
	TEST_OK(mfs_engine_drain(e));
	mfs_engine_close(e);
	mfs_model_free(m);
	planted_free(&pl);
}

/* Users and items arriving, and rows given to new ids, on a stream: the driver thread takes the
 * new rows and the reset ones queued behind the batches given before them (the caller does not
 * wait) and ends with the bits of the inline engine, and of one with the driver idle at every
 * grow and reset (a drain before each). */
static void test_growth_queued(void)
{
	const int k = 8;
	struct planted pl;
	planted(&pl, 120, 50, 6000, 10, 1.2, 19);
	mfs_model_t *ms[3];
	for (int v = 0; v < 3; v++) {
		mfs_model_t *m = ms[v] = mk_model(k, 40, 20, pl.mean); /* users 40..119, items 20..49 arrive */
		mfs_engine_t *e = open_sharded_as(m, 3, 2, 3, 1, 1, v == 0); /* 0: inline, the reference */
		TEST_OK(mfs_engine_set_hparams(e, &HP));
		for (size_t off = 0; off + 300 <= pl.n; off += 300) {
			const mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, 300};
			for (size_t j = 0; j < bt.n; j++) {
				while (bt.u[j] >= m->n_users)
					add_user(m, mfs_id_u64(m->n_users));
				while (bt.i[j] >= m->n_items)
					add_item(m, mfs_id_u64(m->n_items));
			}
			if (v == 2)
				TEST_OK(mfs_engine_drain(e));
			TEST_OK(mfs_engine_grow(e));
			if (off / 300 % 4 == 3) { /* a user row and an item row given to new ids */
				const uint32_t ru = (uint32_t)(off / 300 % 40), ri = (uint32_t)(off / 300 % 20);
				for (int f = 0; f < k; f++) {
					m->P[(size_t)ru * k + f] = 0.01f * (float)(f + 1);
					m->Q[(size_t)ri * k + f] = -0.02f * (float)(f + 1);
				}
				m->bu[ru] = 0.25f, m->bi[ri] = -0.25f;
				TEST_OK(mfs_engine_reset_rows(e, 0, &ru, 1, 1));
				TEST_OK(mfs_engine_reset_rows(e, 1, &ri, 1, 1));
			}
			TEST_OK(mfs_engine_sgd(e, &bt));
		}
		TEST_OK(mfs_engine_sync(e));
		TEST_EQ_INT(m->n_users, 120);
		TEST_EQ_INT(m->n_items, 50);
		uint64_t t, a;
		mfs_engine_progress(e, &t, &a);
		TEST_EQ_INT(a, t);
		mfs_engine_close(e);
	}
	for (int v = 1; v < 3; v++) {
		TEST_ASSERT_MSG(same_floats(ms[0]->P, ms[v]->P, 120 * (size_t)k), "P, variant %d", v);
		TEST_ASSERT_MSG(same_floats(ms[0]->Q, ms[v]->Q, 50 * (size_t)k), "Q, variant %d", v);
		TEST_ASSERT(same_floats(ms[0]->bi, ms[v]->bi, 50));
		TEST_EQ_INT(ms[0]->events_applied, ms[v]->events_applied);
	}
	for (int v = 0; v < 3; v++)
		mfs_model_free(ms[v]);
	planted_free(&pl);
}

/* Resident epochs: pieces, hot rows after each, every row at the end; 2 shards within 2 % of one
 * engine on the test set, uniform and skewed items. */
static void epochs_case(double zipf)
{
	const int k = 16;
	const uint32_t nu = 2000, ni = 500;
	struct planted pl;
	planted(&pl, nu, ni, 200000, 20000, zipf, 17);
	const mfs_batch_t tr = {pl.u, pl.i, pl.r, pl.n}, te = {pl.u + pl.n, pl.i + pl.n, pl.r + pl.n, pl.tn};
	double rmse[2];
	for (int v = 0; v < 2; v++) {
		mfs_model_t *m = mk_model(k, nu, ni, pl.mean);
		mfs_engine_t *e = NULL;
		if (v == 0) {
			mfs_engine_conf_t ec = {.kind = MFS_ENGINE_CPU, .threads = 1, .deterministic = 1, .seed = 3};
			char err[256];
			TEST_ASSERT_MSG(mfs_engine_open(&ec, m, &e, err, sizeof err) == 0, "%s", err);
		} else {
			e = open_sharded(m, 2, 1, 16, 8, 0);
		}
		TEST_OK(mfs_engine_set_hparams(e, &HP));
		mfs_resident_t *set = NULL, *tset = NULL;
		TEST_OK(mfs_engine_resident_load(e, &tr, &set));
		TEST_OK(mfs_engine_resident_load(e, &te, &tset));
		for (uint64_t ep = 0; ep < 12; ep++)
			TEST_OK(mfs_engine_sgd_epoch(e, set, ep));
		TEST_EQ_INT(m->events_applied, 12 * pl.n);
		mfs_loss_t l, l2;
		TEST_OK(mfs_engine_loss_resident(e, tset, &l));
		TEST_OK(mfs_engine_loss(e, &te, &l2));
		TEST_NEAR(l.rmse, l2.rmse, 1e-5);
		rmse[v] = l.rmse;
		mfs_engine_resident_free(e, set);
		mfs_engine_resident_free(e, tset);
		mfs_engine_close(e);
		mfs_model_free(m);
	}
	fprintf(stderr, "  zipf %.1f: one engine %.5f, 2 shards %.5f (%+.2f %%)\n", zipf, rmse[0], rmse[1],
	        100 * (rmse[1] - rmse[0]) / rmse[0]);
	TEST_ASSERT(rmse[0] < 0.6); /* it learned something */
	TEST_ASSERT_MSG(rmse[1] <= rmse[0] * 1.02, "%.5f vs %.5f", rmse[1], rmse[0]);
	planted_free(&pl);
}

static void test_epochs_accuracy(void)
{
	epochs_case(0);
	epochs_case(1.2);
}

/* An epoch run in one piece ends with a merge that takes BLEND's epoch step: by default
 * mfs_shard_blend_epoch_g(S) (g / 4 for two shards), engine.merge_epoch_g overriding it.
 * Deterministic CPU shards, uniform items, no row hot in a piece (one piece): the default is
 * 0.25 bit for bit, 1 (BLEND's own step) ends elsewhere. */
static void test_epoch_step(void)
{
	const int k = 8;
	const uint32_t nu = 200, ni = 60;
	struct planted pl;
	planted(&pl, nu, ni, 20000, 10, 0, 29);
	const mfs_batch_t tr = {pl.u, pl.i, pl.r, pl.n};
	const double epoch_g[3] = {0, 0.25, 1};
	mfs_model_t *m[3];
	for (int v = 0; v < 3; v++) {
		m[v] = mk_model(k, nu, ni, pl.mean);
		mfs_engine_conf_t ec = {.kind = MFS_ENGINE_CPU, .threads = 1, .deterministic = 1, .seed = 3, .shards = 2,
		                        .merge_batches = 1, .merge_hot = 1000, .merge_pieces = 8, .merge_epoch_g = epoch_g[v]};
		mfs_engine_t *e = NULL;
		char err[256];
		TEST_ASSERT_MSG(mfs_engine_open(&ec, m[v], &e, err, sizeof err) == 0, "open: %s", err);
		TEST_OK(mfs_engine_set_hparams(e, &HP));
		mfs_resident_t *set = NULL;
		TEST_OK(mfs_engine_resident_load(e, &tr, &set));
		for (uint64_t ep = 0; ep < 3; ep++)
			TEST_OK(mfs_engine_sgd_epoch(e, set, ep));
		mfs_engine_resident_free(e, set);
		TEST_OK(mfs_engine_sync(e));
		mfs_engine_close(e);
	}
	TEST_NEAR(mfs_shard_blend_epoch_g(2), 0.25, 0);
	TEST_ASSERT(same_floats(m[0]->Q, m[1]->Q, (size_t)ni * k) && same_floats(m[0]->P, m[1]->P, (size_t)nu * k));
	TEST_ASSERT(memcmp(m[0]->Q, m[2]->Q, (size_t)ni * k * sizeof(float)) != 0);
	for (int v = 0; v < 3; v++)
		mfs_model_free(m[v]);
	planted_free(&pl);
}

static void test_validation(void)
{
	mfs_model_t *m = mk_model(8, 10, 10, 3);
	mfs_engine_conf_t ec = {.kind = MFS_ENGINE_CPU, .shards = MFS_SHARD_MAX + 1, .merge_batches = 1,
	                        .merge_pieces = 1};
	mfs_engine_t *e = NULL;
	char err[256] = "";
	TEST_EQ_INT(mfs_engine_open(&ec, m, &e, err, sizeof err), MFS_EINVAL);
	TEST_ASSERT(e == NULL && strstr(err, "shards"));
	ec.shards = 2;
	ec.merge_batches = 0;
	TEST_EQ_INT(mfs_engine_open(&ec, m, &e, err, sizeof err), MFS_EINVAL);
	ec.merge_batches = 1;
	ec.merge_epoch_g = 1.5; /* a fraction of BLEND's step: 0..1 */
	TEST_EQ_INT(mfs_engine_open(&ec, m, &e, err, sizeof err), MFS_EINVAL);
	TEST_ASSERT(e == NULL && strstr(err, "merge_epoch_g"));
	ec.merge_epoch_g = NAN;
	TEST_EQ_INT(mfs_engine_open(&ec, m, &e, err, sizeof err), MFS_EINVAL);
	ec.merge_epoch_g = 0;
	TEST_OK(mfs_engine_open(&ec, m, &e, err, sizeof err));
	TEST_STR_EQ(mfs_engine_name(e), "sharded");
	const uint32_t bad_u[] = {10}, ok_i[] = {0};
	const float r1[] = {3};
	TEST_EQ_INT(mfs_engine_sgd(e, &(mfs_batch_t){bad_u, ok_i, r1, 1}), MFS_EINVAL);
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* The driver thread: a batch's ticket is taken and its events counted when sgd returns, before
 * it is applied; drain applies every queued batch. A shard that fails (fault point engine.shard)
 * on the driver's thread: the caller gets the error from a later call, the failed batch and
 * every one after it are never reported applied, and close still returns. A failed merge
 * (engine.shard_merge): its batch is never reported applied either. */
static void test_driver(void)
{
	const int k = 8;
	const size_t batch = 400;
	struct planted pl;
	planted(&pl, 200, 60, 8000, 10, 0.8, 13);
	mfs_model_t *a = mk_model(k, 200, 60, pl.mean);
	mfs_engine_t *e = open_sharded(a, 2, 3, 4, 1, 1);
	TEST_OK(mfs_engine_set_hparams(e, &HP));
	uint64_t ticket = 0, applied = 0;
	for (size_t off = 0, j = 1; off + batch <= pl.n; off += batch, j++) {
		const mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, batch};
		TEST_OK(mfs_engine_sgd(e, &bt));
		mfs_engine_progress(e, &ticket, &applied);
		TEST_EQ_INT(ticket, j);
		TEST_ASSERT(applied <= ticket);
		TEST_EQ_INT(a->events_applied, j * batch);
	}
	TEST_OK(mfs_engine_drain(e));
	mfs_engine_progress(e, &ticket, &applied);
	TEST_EQ_INT(applied, ticket);
	mfs_engine_close(e);

	/* the third batch fails on its first shard (two shard parts a batch: the fifth pass) */
	char err[256];
	TEST_OK(mfs_fault_arm("engine.shard=EIO@5", err, sizeof err));
	e = open_sharded(a, 2, 3, 4, 1, 1);
	TEST_OK(mfs_engine_set_hparams(e, &HP));
	size_t given = 0;
	int rc = 0;
	for (size_t off = 0; off + batch <= pl.n && !rc; off += batch) {
		const mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, batch};
		if ((rc = mfs_engine_sgd(e, &bt)) == 0)
			given++;
	}
	TEST_ASSERT_MSG(rc == 0 || rc == EIO, "sgd: %d", rc);
	TEST_ASSERT(given >= 2);
	TEST_EQ_INT(mfs_engine_drain(e), EIO);
	TEST_EQ_INT(mfs_engine_sync(e), EIO);
	mfs_engine_progress(e, &ticket, &applied);
	TEST_EQ_INT(ticket, given);
	TEST_EQ_INT(applied, 2);
	mfs_engine_close(e);

	/* the second merge fails (every row merged after every batch): the second batch is never
	 * reported applied, through the driver or inline */
	for (int inl = 0; inl < 2; inl++) {
		TEST_OK(mfs_fault_arm("engine.shard_merge=EIO@2", err, sizeof err));
		e = open_sharded_hs(a, 2, 1, 0, 1, 1, inl, 0);
		TEST_OK(mfs_engine_set_hparams(e, &HP));
		given = 0, rc = 0;
		for (size_t off = 0; off + batch <= pl.n && !rc; off += batch) {
			const mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, batch};
			if ((rc = mfs_engine_sgd(e, &bt)) == 0)
				given++;
		}
		if (inl)
			TEST_EQ_INT(rc, EIO);
		else
			TEST_EQ_INT(mfs_engine_drain(e), EIO);
		mfs_engine_progress(e, &ticket, &applied);
		TEST_EQ_INT(ticket, given);
		TEST_EQ_INT(applied, 1);
		mfs_engine_close(e);
	}
	TEST_OK(mfs_fault_arm(NULL, err, sizeof err));
	mfs_model_free(a);
	planted_free(&pl);
}

/* The snapshot writer waits for a capture on its thread while the learner captures again and
 * waits itself (exchange.topic's publish): each must find its own values whole. Without the
 * engine's capture lock the writer could return while the learner was still copying the
 * writer's rows, or copy from buffers the learner's next capture was regrowing. */
struct cap_job {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	mfs_engine_t *e;
	const float *want; /* per row asked: bias then k factors, as capture writes them */
	float *dst;
	size_t n;
	int posted, done, quit, bad, failed;
};

static void *cap_writer(void *arg)
{
	struct cap_job *j = arg;
	pthread_mutex_lock(&j->mu);
	for (;;) {
		while (!j->posted && !j->quit)
			pthread_cond_wait(&j->cv, &j->mu);
		if (!j->posted)
			break;
		j->posted = 0;
		pthread_mutex_unlock(&j->mu);
		int rc = mfs_engine_capture_wait(j->e);
		int bad = memcmp(j->dst, j->want, j->n * sizeof *j->dst) != 0;
		pthread_mutex_lock(&j->mu);
		j->failed += rc != 0;
		j->bad += bad;
		j->done = 1;
		pthread_cond_broadcast(&j->cv);
	}
	pthread_mutex_unlock(&j->mu);
	return NULL;
}

/* per row, the bias then the k factors: what capture gives */
static void want_rows(const float *b, const float *F, int k, const uint32_t *rows, size_t n, float *dst)
{
	for (size_t j = 0; j < n; j++) {
		dst[j * (1 + (size_t)k)] = b[rows[j]];
		memcpy(dst + j * (1 + (size_t)k) + 1, F + (size_t)rows[j] * k, (size_t)k * sizeof *F);
	}
}

static void test_capture_two_threads(void)
{
	const int k = 16;
	const size_t row = 1 + (size_t)k;
	struct planted pl;
	planted(&pl, 300, 80, 6000, 10, 0.8, 21);
	mfs_model_t *m = mk_model(k, 300, 80, pl.mean);
	mfs_engine_t *e = open_sharded(m, 2, 2, 4, 1, 1);
	TEST_OK(mfs_engine_set_hparams(e, &HP));
	for (size_t off = 0; off + 500 <= pl.n; off += 500) {
		mfs_batch_t bt = {pl.u + off, pl.i + off, pl.r + off, 500};
		TEST_OK(mfs_engine_sgd(e, &bt));
	}
	TEST_OK(mfs_engine_sync(e)); /* the host model is what every capture must give from here */
	enum { ROUNDS = 3000, MAXU = 4096 };
	uint32_t *ur = malloc(MAXU * sizeof *ur), *ir = malloc(MAXU * sizeof *ir);
	float *wu = malloc(MAXU * row * sizeof *wu), *wi = malloc(MAXU * row * sizeof *wi);
	float *du = malloc(MAXU * row * sizeof *du), *di = malloc(MAXU * row * sizeof *di);
	TEST_ASSERT(ur && ir && wu && wi && du && di);
	mfs_rng_t rng;
	mfs_rng_seed(&rng, 5);
	struct cap_job j = {.e = e, .want = wu, .dst = du};
	pthread_mutex_init(&j.mu, NULL);
	pthread_cond_init(&j.cv, NULL);
	pthread_t th;
	TEST_ASSERT(pthread_create(&th, NULL, cap_writer, &j) == 0);
	int learner_bad = 0;
	for (int r = 0; r < ROUNDS; r++) {
		/* the snapshot's users (growing now and then, so the shards' capture buffers regrow),
		 * posted to the writer */
		const size_t nu = 1 + (size_t)r * MAXU / ROUNDS, ni = 1 + (uint32_t)mfs_rng_below(&rng, 64);
		for (size_t x = 0; x < nu; x++)
			ur[x] = (uint32_t)mfs_rng_below(&rng, 300);
		want_rows(m->bu, m->P, k, ur, nu, wu);
		TEST_OK(mfs_engine_capture(e, ur, nu, du, NULL, 0, NULL));
		pthread_mutex_lock(&j.mu);
		j.n = nu * row, j.posted = 1, j.done = 0;
		pthread_cond_broadcast(&j.cv);
		pthread_mutex_unlock(&j.mu);
		/* the publish: items only, captured and waited for on this thread */
		for (size_t x = 0; x < ni; x++)
			ir[x] = (uint32_t)mfs_rng_below(&rng, 80);
		want_rows(m->bi, m->Q, k, ir, ni, wi);
		TEST_OK(mfs_engine_capture(e, NULL, 0, NULL, ir, ni, di));
		TEST_OK(mfs_engine_capture_wait(e));
		learner_bad += memcmp(di, wi, ni * row * sizeof *di) != 0;
		pthread_mutex_lock(&j.mu);
		while (!j.done)
			pthread_cond_wait(&j.cv, &j.mu);
		pthread_mutex_unlock(&j.mu);
	}
	pthread_mutex_lock(&j.mu);
	j.quit = 1;
	pthread_cond_broadcast(&j.cv);
	pthread_mutex_unlock(&j.mu);
	pthread_join(th, NULL);
	TEST_EQ_INT(j.failed, 0);
	TEST_EQ_INT(j.bad, 0);
	TEST_EQ_INT(learner_bad, 0);
	pthread_mutex_destroy(&j.mu);
	pthread_cond_destroy(&j.cv);
	free(ur), free(ir), free(wu), free(wi), free(du), free(di);
	mfs_engine_close(e);
	mfs_model_free(m);
	planted_free(&pl);
}

/* No NaN reaches the factors unseen: an item row that is not finite on the replicas (here put in
 * the caller's model before open; on devices, SGD that diverged) fails the merge that takes it,
 * MFS_ENAN through sync, and the engine closes. */
static void test_merge_nonfinite(void)
{
	const int k = 8;
	const uint32_t nu = 200, ni = 50;
	struct planted pl;
	planted(&pl, nu, ni, 5000, 10, 0, 9);
	mfs_model_t *m = mk_model(k, nu, ni, pl.mean);
	TEST_ASSERT(m);
	for (size_t j = 0; j < pl.n; j++) /* item 7 is rated (by both shards' users) */
		if (j % 100 == 0)
			pl.i[j] = 7;
	m->Q[7 * k + 3] = NAN;
	mfs_engine_t *e = open_sharded(m, 2, 1000, 0, 1, 1);
	TEST_OK(mfs_engine_set_hparams(e, &HP));
	TEST_OK(mfs_engine_sgd(e, &(mfs_batch_t){pl.u, pl.i, pl.r, pl.n}));
	TEST_EQ_INT(mfs_engine_sync(e), MFS_ENAN);
	mfs_engine_close(e);
	/* the same stream without the NaN merges */
	mfs_model_t *ok = mk_model(k, nu, ni, pl.mean);
	e = open_sharded(ok, 2, 1000, 0, 1, 1);
	TEST_OK(mfs_engine_set_hparams(e, &HP));
	TEST_OK(mfs_engine_sgd(e, &(mfs_batch_t){pl.u, pl.i, pl.r, pl.n}));
	TEST_OK(mfs_engine_sync(e));
	mfs_engine_close(e);
	mfs_model_free(m);
	mfs_model_free(ok);
	planted_free(&pl);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	TEST_RUN(test_parity_with_reference);
	TEST_RUN(test_driver);
	TEST_RUN(test_merges_matter);
	TEST_RUN(test_capture_and_growth);
	TEST_RUN(test_capture_two_threads);
	TEST_RUN(test_growth_queued);
	TEST_RUN(test_epochs_accuracy);
	TEST_RUN(test_epoch_step);
	TEST_RUN(test_validation);
	TEST_RUN(test_merge_nonfinite);
	return TEST_REPORT();
}
