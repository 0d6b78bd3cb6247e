/* test_cuda_persistent.c - streaming batches through the persistent kernel's device ring
 * (engine.persistent = 1): every rating applied exactly once across ring laps, slot splits,
 * table growth (kernel stop and relaunch), loss kernels beside it (and a grid too large for
 * them to fit, which the engine must notice), a learning rate changed while it runs; and
 * Hogwild accuracy equal to the per-batch launch path.
 *
 * Exactly-once probe: ratings with pairwise distinct users and items, r = 1, zero factors
 * (init sd 0), mu = 0, no regularization. One update gives bu = bi = lr * (1 - 0) = lr
 * exactly; a second one would add lr * (1 - 2 lr); a missing one leaves 0. So every bias must
 * equal the learning rate in force for its batch, bit for bit, in fp32 and in fp16 storage
 * (biases are fp32 in both).
 * MFS_TEST_QUICK=1 shortens it for compute-sanitizer. Exits 77 where no CUDA device answers.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "gpu/engine.h"
#include "model_store/life.h"
#include "model_store/store.h"
#include "testhelp.h"
#include "model_help.h"

static int g_fp16;
static int g_whole; /* the persistent kernel takes the whole GPU: loss and gather calls stop it */
static int g_oversubscribe; /* engine.cuda.pk_oversubscribe */

static mfs_engine_t *open_cuda(mfs_model_t *m, int persistent)
{
	mfs_engine_conf_t ec = {MFS_ENGINE_CUDA, 1, 0, 0, 1, g_fp16 ? MFS_DTYPE_FP16 : MFS_DTYPE_FP32, persistent,
	                        !g_whole};
	ec.cuda_pk_oversubscribe = g_oversubscribe;
	mfs_engine_t *e = NULL;
	char err[256];
	int rc = mfs_engine_open(&ec, m, &e, err, sizeof err);
	TEST_ASSERT_MSG(rc == 0, "open cuda (persistent=%d): %s", persistent, err);
	return e;
}

static void add_rows(mfs_model_t *m, uint32_t users, uint32_t items)
{
	uint32_t r;
	for (uint32_t u = m->n_users; u < users; u++) {
		mfs_id_t id = mfs_id_u64(u);
		TEST_OK(mfs_model_user_row(m, &id, &r));
	}
	for (uint32_t i = m->n_items; i < items; i++) {
		mfs_id_t id = mfs_id_u64(i);
		TEST_OK(mfs_model_item_row(m, &id, &r));
	}
}

/* Distinct rows per rating; batch sizes that hit 1, odd sizes, a chunk boundary and more than
 * one ring slot (256 Ki ratings); rows are created batch by batch so the device tables grow
 * (and the kernel is stopped and relaunched) while streaming; a loss pass between batches;
 * the learning rate halves for the second half; every fourth batch goes as a replay at half
 * the rate (its slot's own scale; not counted in events_applied). */
static void exactly_once(int k)
{
	/* MFS_TEST_QUICK (compute-sanitizer runs): fewer ratings, still more than two ring slots */
	const size_t N = getenv("MFS_TEST_QUICK") ? 600000 : 1200000;
	static const size_t sizes[] = {1, 7, 256, 257, 4096, 300000, 33, 100000, 524289};
	mfs_model_conf_t mc = {k, 0.0, 1};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&mc, &m));
	m->mu = 0;
	/* a random order of rows so neighbouring ratings touch far-apart rows */
	uint32_t *perm = malloc(N * sizeof *perm), *pi = malloc(N * sizeof *pi);
	float *r = malloc(N * sizeof *r);
	double *lr_of = malloc(N * sizeof *lr_of);
	TEST_ASSERT(perm && pi && r && lr_of);
	mfs_rng_t g;
	mfs_rng_seed(&g, 7);
	for (size_t x = 0; x < N; x++)
		perm[x] = pi[x] = (uint32_t)x, r[x] = 1.0f;
	for (size_t x = N - 1; x > 0; x--) {
		size_t j = mfs_rng_below(&g, x + 1), t = perm[x];
		perm[x] = perm[j], perm[j] = (uint32_t)t;
		j = mfs_rng_below(&g, x + 1), t = pi[x];
		pi[x] = pi[j], pi[j] = (uint32_t)t;
	}
	add_rows(m, 1000, 1000);
	mfs_engine_t *e = open_cuda(m, 1);
	mfs_hparams_t hp = {0.25f, 0, 0, 0, 0, 1.0f, 5.0f};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
	size_t done = 0, nb = 0, replayed = 0;
	while (done < N) {
		size_t n = sizes[nb++ % (sizeof sizes / sizeof sizes[0])];
		if (n > N - done)
			n = N - done;
		if (done < N / 2 && done + n > N / 2)
			n = N / 2 - done;
		if (done == N / 2) { /* new rate: quiesce first so no earlier rating sees it */
			TEST_OK(mfs_engine_sync(e));
			hp.lr = 0.125f;
			TEST_OK(mfs_engine_set_hparams(e, &hp));
		}
		/* the rows this batch needs: the tables grow as the stream goes */
		uint32_t need_u = 0, need_i = 0;
		const int replay = nb % 4 == 0;
		for (size_t x = done; x < done + n; x++) {
			if (perm[x] + 1 > need_u)
				need_u = perm[x] + 1;
			if (pi[x] + 1 > need_i)
				need_i = pi[x] + 1;
			lr_of[x] = replay ? hp.lr * 0.5f : hp.lr;
		}
		if (need_u > m->n_users || need_i > m->n_items) {
			add_rows(m, need_u > m->n_users ? need_u : m->n_users, need_i > m->n_items ? need_i : m->n_items);
			TEST_OK(mfs_engine_grow(e));
		}
		mfs_batch_t b = {perm + done, pi + done, r + done, n};
		if (replay) {
			TEST_OK(mfs_engine_replay(e, &b, 0.5f));
			replayed += n;
		} else {
			TEST_OK(mfs_engine_sgd(e, &b));
		}
		if (nb % 5 == 0) { /* a loss kernel beside the persistent one (reads, no updates) */
			mfs_batch_t lb = {perm, pi, r, done + n < 50000 ? done + n : 50000};
			mfs_loss_t ls;
			TEST_OK(mfs_engine_loss(e, &lb, &ls));
			TEST_ASSERT(isfinite(ls.rmse));
		}
		done += n;
	}
	/* snapshots bring back only the touched rows: every 7th rating's rows (one twice) come
	 * back applied; the host copy of the others is what the full sync at N/2 (before the
	 * rate change) left: applied for the first half, the initial 0 for the second */
	size_t ns = 0;
	uint32_t *su = malloc((N / 7 + 2) * sizeof *su), *si = malloc((N / 7 + 2) * sizeof *si);
	for (size_t x = 0; x < N; x += 7)
		su[ns] = perm[x], si[ns++] = pi[x];
	su[ns] = perm[0], si[ns++] = pi[0];
	TEST_OK(test_sync_rows(e, m, su, ns, si, ns));
	size_t bad_rows = 0, early = 0;
	for (size_t x = 0; x < N; x++) {
		float want = x % 7 == 0 || x < N / 2 ? (float)lr_of[x] : 0.0f;
		bad_rows += m->bu[perm[x]] != want || m->bi[pi[x]] != want;
		early += x % 7 != 0 && x >= N / 2 && m->bu[perm[x]] != 0;
	}
	TEST_ASSERT_MSG(bad_rows == 0, "sync_rows: %zu ratings' rows not as expected (%zu synced that were not asked)",
	                bad_rows, early);
	const uint32_t out_of_range = m->n_users;
	TEST_EQ_INT(test_sync_rows(e, m, &out_of_range, 1, NULL, 0), MFS_EINVAL);
	free(su);
	free(si);
	TEST_OK(mfs_engine_sync(e));
	TEST_ASSERT(replayed > 0 && replayed < N);
	TEST_EQ_INT(m->events_applied, N - replayed);
	size_t bad = 0;
	for (size_t x = 0; x < N; x++) {
		float want = (float)lr_of[x], bu = m->bu[perm[x]], bi = m->bi[pi[x]];
		if (bu != want || bi != want) {
			if (bad < 5)
				fprintf(stderr, "    rating %zu (user %u, item %u): bu %.9g bi %.9g, want %.9g\n", x, perm[x], pi[x], bu,
				        bi, want);
			bad++;
		}
	}
	TEST_ASSERT_MSG(bad == 0, "k=%d fp16=%d: %zu of %zu ratings not applied exactly once", k, g_fp16, bad, N);
	/* factors stayed zero (no gradient reaches them) */
	double fsum = 0;
	for (size_t x = 0; x < (size_t)m->n_users * (size_t)k; x++)
		fsum += fabs(m->P[x]);
	TEST_ASSERT_MSG(fsum == 0, "factors moved: sum |P| = %g", fsum);
	/* a set epoch after streaming stops the kernel; streaming again relaunches it */
	mfs_batch_t one = {perm, pi, r, 1};
	mfs_resident_t *set = NULL;
	TEST_OK(mfs_engine_resident_load(e, &one, &set));
	TEST_OK(mfs_engine_sgd_epoch(e, set, 0));
	mfs_engine_resident_free(e, set);
	mfs_batch_t again = {perm + 1, pi + 1, r + 1, 1000};
	TEST_OK(mfs_engine_sgd(e, &again));
	TEST_OK(mfs_engine_sync(e));
	TEST_ASSERT(m->bu[perm[1]] != (float)lr_of[1]); /* applied a second time: it moved */
	mfs_engine_close(e);
	mfs_model_free(m);
	free(perm);
	free(pi);
	free(r);
	free(lr_of);
}

/* Held-out RMSE after 3 passes of the same stream of batches (a planted problem with a
 * Zipf-skewed item side, so hot rows take the sampled path) through engine `kind`. */
static double planted_rmse(int kind, int k, int persistent)
{
	const uint32_t U = 20000, I = 4000;
	const size_t N = 3000000, H = 100000, B = 20000;
	mfs_model_conf_t mc = {k, 0.1, 3};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&mc, &m));
	add_rows(m, U, I);
	m->mu = 3.5;
	/* planted rank-4 model */
	mfs_rng_t g;
	mfs_rng_seed(&g, 11);
	float *pu = malloc((size_t)U * 4 * sizeof *pu), *qi = malloc((size_t)I * 4 * sizeof *qi);
	for (size_t x = 0; x < (size_t)U * 4; x++)
		pu[x] = (float)(mfs_rng_normal(&g) * 0.6);
	for (size_t x = 0; x < (size_t)I * 4; x++)
		qi[x] = (float)(mfs_rng_normal(&g) * 0.6);
	uint32_t *u = malloc((N + H) * 4), *i = malloc((N + H) * 4);
	float *r = malloc((N + H) * 4);
	for (size_t x = 0; x < N + H; x++) {
		u[x] = (uint32_t)mfs_rng_below(&g, U);
		double z = mfs_rng_uniform(&g); /* item popularity ~ x^-1 (Zipf-like) */
		i[x] = (uint32_t)(pow((double)I, z) - 1.0);
		if (i[x] >= I)
			i[x] = I - 1;
		double s = 3.5;
		for (int f = 0; f < 4; f++)
			s += pu[(size_t)u[x] * 4 + f] * qi[(size_t)i[x] * 4 + f];
		r[x] = (float)(s + 0.3 * mfs_rng_normal(&g));
	}
	mfs_engine_t *e = NULL;
	if (kind == MFS_ENGINE_CUDA) {
		e = open_cuda(m, persistent);
	} else {
		mfs_engine_conf_t ec = {MFS_ENGINE_CPU, 0, 0, 0, 1, MFS_DTYPE_FP32, 0};
		char err[256];
		TEST_ASSERT_MSG(mfs_engine_open(&ec, m, &e, err, sizeof err) == 0, "cpu engine: %s", err);
	}
	mfs_hparams_t hp = {0.01f, 0.02f, 0.02f, 0.01f, 0.01f, -100.0f, 100.0f};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
	for (int ep = 0; ep < 3; ep++)
		for (size_t x = 0; x < N; x += B) {
			mfs_batch_t b = {u + x, i + x, r + x, N - x < B ? N - x : B};
			TEST_OK(mfs_engine_sgd(e, &b));
		}
	mfs_batch_t hb = {u + N, i + N, r + N, H};
	mfs_loss_t ls;
	TEST_OK(mfs_engine_sync(e));
	TEST_OK(mfs_engine_loss(e, &hb, &ls));
	for (size_t x = 0; x < (size_t)U * k; x++)
		TEST_ASSERT_MSG(isfinite(m->P[x]), "P[%zu] not finite", x);
	mfs_engine_close(e);
	mfs_model_free(m);
	free(pu), free(qi), free(u), free(i), free(r);
	return ls.rmse;
}

static void test_exactly_once_k32(void) { exactly_once(32); }
static void test_exactly_once_k128(void) { exactly_once(128); }
/* the same with the whole GPU: every loss pass and gather stops the kernel, the next batch
 * relaunches it */
static void test_exactly_once_whole_gpu(void)
{
	g_whole = 1;
	exactly_once(32);
	g_whole = 0;
}

/* A grid that cannot all be resident (as under compute-sanitizer or MPS): the hidden hook
 * launches twice the blocks that fit while still counting on loss kernels beside it. The
 * engine must notice at launch and stop the kernel for loss passes instead; a loss kernel
 * queued behind blocks that never retire would hang this test. */
static void test_exactly_once_oversubscribed(void)
{
	g_oversubscribe = 1;
	exactly_once(32);
	g_oversubscribe = 0;
}

/* A snapshot's capture beside the running kernel: the values it delivers are those of the
 * moment of the call (every earlier batch applied, none later), in the order the rows were
 * named, even though the next batches change those rows before the copy is waited for; rows
 * not yet given to the device come from the host; bad arguments are refused. */
static void test_capture_beside_stream(void)
{
	const int k = 64;
	const uint32_t n = 3000;
	mfs_model_conf_t mc = {k, 0.1, 5}; /* random factors: fp16 storage shows in the conversion */
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&mc, &m));
	m->mu = 0;
	add_rows(m, n, n);
	mfs_engine_t *e = open_cuda(m, 1);
	mfs_hparams_t hp = {0.05f, 0.01f, 0.01f, 0.01f, 0.01f, 1.0f, 5.0f};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
	uint32_t *u = malloc(n * sizeof *u), *it = malloc(n * sizeof *it), *ur = malloc(n * sizeof *ur);
	float *r = malloc(n * sizeof *r), *want = malloc((size_t)n * (1 + k) * sizeof *want),
	      *du = malloc((size_t)n * (1 + k) * sizeof *du), *di = malloc((1 + k) * sizeof *di);
	TEST_ASSERT(u && it && ur && r && want && du && di);
	for (uint32_t x = 0; x < n; x++)
		u[x] = x, it[x] = (x * 7) % n, ur[x] = n - 1 - x, r[x] = 1.0f + (float)(x % 5);
	mfs_batch_t b = {u, it, r, n};
	for (int rep = 0; rep < 3; rep++) {
		TEST_OK(mfs_engine_sgd(e, &b));
		/* the reference: the whole tables copied back (a path of its own: test_sync_rows is a capture) */
		TEST_OK(mfs_engine_sync(e));
		for (uint32_t x = 0; x < n; x++) {
			want[(size_t)x * (1 + k)] = m->bu[ur[x]];
			memcpy(want + (size_t)x * (1 + k) + 1, m->P + (size_t)ur[x] * k, k * sizeof(float));
		}
		const float want_bi = m->bi[it[0]];
		TEST_OK(mfs_engine_capture(e, ur, n, du, it, 1, di));
		TEST_OK(mfs_engine_sgd(e, &b)); /* every captured user row moves before the copy is waited for */
		TEST_OK(mfs_engine_sgd(e, &b));
		TEST_OK(mfs_engine_drain(e));
		TEST_OK(mfs_engine_capture_wait(e));
		size_t diff = 0;
		for (size_t x = 0; x < (size_t)n * (1 + k); x++)
			diff += du[x] != want[x];
		TEST_ASSERT_MSG(diff == 0 && di[0] == want_bi, "fp16=%d rep %d: %zu of %zu captured values differ", g_fp16,
		                rep, diff, (size_t)n * (1 + k));
		TEST_OK(mfs_engine_sync(e));
		size_t moved = 0;
		for (uint32_t x = 0; x < n; x++)
			moved += m->bu[ur[x]] != want[(size_t)x * (1 + k)];
		TEST_ASSERT_MSG(moved == n, "the later batches moved %zu of %u captured rows", moved, n);
	}
	/* a row the device has not been given (grow not called yet): the host's value */
	add_rows(m, n + 1, n);
	const uint32_t fresh = n;
	m->bu[fresh] = 0.75f;
	TEST_OK(mfs_engine_capture(e, &fresh, 1, du, NULL, 0, NULL));
	TEST_OK(mfs_engine_capture_wait(e));
	TEST_ASSERT(du[0] == 0.75f);
	const uint32_t bad = m->n_users;
	TEST_EQ_INT(mfs_engine_capture(e, &bad, 1, du, NULL, 0, NULL), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_capture(e, ur, 1, NULL, NULL, 0, NULL), MFS_EINVAL);
	/* one outstanding at close: close waits for it */
	TEST_OK(mfs_engine_grow(e));
	TEST_OK(mfs_engine_capture(e, ur, n, du, NULL, 0, NULL));
	mfs_engine_close(e);
	mfs_model_free(m);
	free(u), free(it), free(ur), free(r), free(want), free(du), free(di);
}

/* The ring must learn at least as well as the launch-per-batch path it replaces (both use the
 * sampled hot-row modes of streaming batches). The CPU engine's RMSE is printed beside: on this
 * deliberately hot stream (one item takes 8 % of the ratings) the sampled modes of both GPU
 * paths learn the hottest rows more slowly than the CPU's Hogwild (docs/ENGINE.md). */
static void test_ring_accuracy(void)
{
	double ring = planted_rmse(MFS_ENGINE_CUDA, 64, 1), launch = planted_rmse(MFS_ENGINE_CUDA, 64, 0),
	       cpu = planted_rmse(MFS_ENGINE_CPU, 64, 0);
	fprintf(stderr, "  fp16=%d planted held-out RMSE: ring %.5f, launch per batch %.5f, CPU engine %.5f\n", g_fp16,
	        ring, launch, cpu);
	TEST_ASSERT_MSG(ring <= 1.01 * launch, "ring %.5f vs launch per batch %.5f", ring, launch);
}

/* mfs_engine_reset_rows: rows freed by deletion and given to new ids take the host's fresh
 * values on the device, after a batch still in flight that names them (its updates land on the
 * old values, then the reset replaces them), beside the running kernel; rows not reset keep
 * what the device learned. The CPU engine works on the host arrays: its reset is nothing. */
static void test_reset_rows(void)
{
	const int k = 32;
	const uint32_t n = 4096, nd = 300;
	mfs_model_conf_t mc = {k, 0.1, 9};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&mc, &m));
	m->mu = 0;
	add_rows(m, n, n);
	mfs_engine_t *e = open_cuda(m, 1);
	mfs_hparams_t hp = {0.05f, 0.0f, 0.0f, 0.0f, 0.0f, -INFINITY, INFINITY};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
	uint32_t *u = malloc(n * sizeof *u), *it = malloc(n * sizeof *it);
	float *r = malloc(n * sizeof *r), *want = malloc((size_t)nd * (1 + k) * sizeof *want);
	TEST_ASSERT(u && it && r && want);
	for (uint32_t x = 0; x < n; x++)
		u[x] = x, it[x] = x, r[x] = 1.0f;
	mfs_batch_t b = {u, it, r, n};
	TEST_OK(mfs_engine_sgd(e, &b)); /* every user's bias becomes lr exactly (zero mean, one update) */
	mfs_model_begin_batch(m, 1);
	for (uint32_t x = 0; x < nd; x++) {
		mfs_id_t id = mfs_id_u64(x);
		TEST_EQ_INT(mfs_model_delete(m, 0, &id), 1);
	}
	TEST_OK(mfs_engine_sgd(e, &b)); /* in flight while the host reuses the rows */
	mfs_model_begin_batch(m, 2);
	for (uint32_t x = 0; x < nd; x++) {
		mfs_id_t id = mfs_id_u64(100000 + x);
		uint32_t row;
		TEST_OK(mfs_model_user_row(m, &id, &row));
		TEST_ASSERT(row < nd);
		want[(size_t)row * (1 + k)] = m->bu[row];
		memcpy(want + (size_t)row * (1 + k) + 1, m->P + (size_t)row * k, k * sizeof(float));
	}
	size_t nr;
	const uint32_t *rows = mfs_model_reused(m, 0, &nr);
	TEST_EQ_INT(nr, nd);
	TEST_EQ_INT(mfs_model_reused_in_flight(m, 0), 1); /* deleted rows (no stamps): drained first */
	TEST_OK(mfs_engine_reset_rows(e, 0, rows, nr, mfs_model_reused_in_flight(m, 0)));
	mfs_model_reused_clear(m);
	TEST_OK(mfs_engine_sync(e));
	const float tol = g_fp16 ? 1e-3f : 0.0f;
	size_t bad = 0;
	for (uint32_t row = 0; row < n; row++) {
		if (row < nd) {
			bad += m->bu[row] != 0.0f;
			for (int j = 0; j < k; j++)
				bad += fabsf(m->P[(size_t)row * k + j] - want[(size_t)row * (1 + k) + 1 + j]) > tol;
		} else {
			bad += !(m->bu[row] > 0.07f); /* two updates: lr, then lr + lr (1 - lr - q.p) */
		}
	}
	TEST_ASSERT_MSG(bad == 0, "%zu values differ from the reset / the learned ones", bad);
	/* without in_flight (eviction took rows no batch in flight names): written beside a batch
	 * in flight that names every other row, which keeps learning */
	float *bu_before = malloc(n * sizeof *bu_before);
	TEST_ASSERT(bu_before);
	memcpy(bu_before, m->bu, n * sizeof *bu_before);
	mfs_batch_t rest = {u + nd, it + nd, r + nd, n - nd};
	TEST_OK(mfs_engine_sgd(e, &rest));
	for (uint32_t row = 0; row < nd; row++) {
		m->bu[row] = 0.5f;
		for (int j = 0; j < k; j++)
			m->P[(size_t)row * k + j] = 0.25f;
	}
	TEST_OK(mfs_engine_reset_rows(e, 0, u, nd, 0)); /* u[0 .. nd) = rows 0 .. nd - 1 */
	TEST_OK(mfs_engine_sync(e));
	bad = 0;
	for (uint32_t row = 0; row < n; row++) {
		if (row < nd) {
			bad += m->bu[row] != 0.5f;
			for (int j = 0; j < k; j++)
				bad += m->P[(size_t)row * k + j] != 0.25f;
		} else {
			bad += !(m->bu[row] > bu_before[row]); /* a third update, beside the reset */
		}
	}
	TEST_ASSERT_MSG(bad == 0, "%zu values differ from the reset beside a batch / the learned ones", bad);
	free(bu_before);
	mfs_engine_close(e);
	mfs_model_free(m);
	free(u), free(it), free(r), free(want);
}

/* mfs_engine_take_new_rows: rows the host had before are uploaded as they are; rows new after
 * it are drawn on the device with the host's formula (a few ulp apart: CUDA's logf/cosf/sinf),
 * with a zero bias, and the host leaves them zero until a sync; a batch then trains them. With
 * and without the persistent kernel (the upload stream differs). */
static void device_init(int persistent)
{
	const int k = 64;
	const uint32_t n0 = 1000, n1 = 50000, i0 = 300, i1 = 2000;
	mfs_model_conf_t mc = {k, 0.1, 21};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&mc, &m));
	add_rows(m, n0, i0);
	float *before = malloc((size_t)n0 * k * sizeof *before), *ref = malloc((size_t)k * sizeof *ref);
	TEST_ASSERT(before && ref);
	memcpy(before, m->P, (size_t)n0 * k * sizeof *before);
	mfs_engine_t *e = open_cuda(m, persistent);
	int taken = 0;
	TEST_OK(mfs_engine_take_new_rows(e, &taken));
	TEST_EQ_INT(taken, 1);
	TEST_EQ_INT(m->engine_init_from[0], n0);
	TEST_EQ_INT(m->engine_init_from[1], i0);
	add_rows(m, n1, i1);
	size_t zero = 0;
	for (size_t x = (size_t)n0 * k; x < (size_t)n1 * k; x++)
		zero += m->P[x] == 0.0f;
	TEST_EQ_INT(zero, (size_t)(n1 - n0) * k); /* not drawn on the host */
	TEST_OK(mfs_engine_grow(e));
	TEST_OK(mfs_engine_sync(e));
	/* fp32: within a relative 1e-5 (ulps of logf/sqrtf/cosf/sinf); fp16: the host value rounded
	 * to half, within one half ulp of it */
	size_t bad = 0, same = 0, total = 0;
	double worst = 0;
	for (int ent = 0; ent < 2; ent++) {
		const uint32_t a = ent ? i0 : n0, z = ent ? i1 : n1;
		const float *F = ent ? m->Q : m->P, *b = ent ? m->bi : m->bu;
		for (uint32_t row = a; row < z; row++) {
			mfs_model_init_row(m, ent, row, ref);
			bad += b[row] != 0.0f;
			for (int j = 0; j < k; j++) {
				const double got = F[(size_t)row * k + j], want = ref[j];
				const double tol = g_fp16 ? fabs(want) / 1024.0 + 1e-7 : fabs(want) * 1e-5 + 1e-9;
				const double d = fabs(got - want);
				worst = d > worst ? d : worst;
				bad += d > tol;
				same += got == want;
				total++;
			}
		}
	}
	TEST_ASSERT_MSG(bad == 0, "%zu device-drawn values off the host's formula (worst %.3g)", bad, worst);
	if (!g_fp16) /* most values agree to the bit: a formula mistake would not */
		TEST_ASSERT_MSG(same > total / 2, "only %zu of %zu values agree to the bit", same, total);
	size_t moved = 0;
	for (size_t x = 0; x < (size_t)n0 * k; x++) /* uploaded as they were (fp16: rounded) */
		moved += fabsf(m->P[x] - before[x]) > (g_fp16 ? fabsf(before[x]) / 1024.0f + 1e-7f : 0.0f);
	TEST_EQ_INT(moved, 0);
	/* they train: one update of every new user moves its bias off zero, to a finite value */
	const size_t nb = n1 - n0;
	uint32_t *u = malloc(nb * sizeof *u), *it = malloc(nb * sizeof *it);
	float *r = malloc(nb * sizeof *r);
	TEST_ASSERT(u && it && r);
	for (size_t x = 0; x < nb; x++)
		u[x] = n0 + (uint32_t)x, it[x] = (uint32_t)(x % i1), r[x] = 1.0f;
	mfs_hparams_t hp = {0.05f, 0.0f, 0.0f, 0.0f, 0.0f, -INFINITY, INFINITY};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
	m->mu = 0;
	mfs_batch_t bt = {u, it, r, nb};
	TEST_OK(mfs_engine_sgd(e, &bt));
	TEST_OK(mfs_engine_sync(e));
	size_t trained = 0;
	for (size_t x = 0; x < nb; x++)
		trained += m->bu[n0 + x] != 0.0f && isfinite(m->bu[n0 + x]);
	TEST_EQ_INT(trained, nb);
	mfs_engine_close(e);
	mfs_model_free(m);
	free(before), free(ref), free(u), free(it), free(r);
}

static void test_device_init(void) { device_init(0); }
static void test_device_init_persistent(void) { device_init(1); }
/* the kernel takes the whole GPU: drawing rows stops it (no room beside it for the draw) */
static void test_device_init_whole_gpu(void)
{
	g_whole = 1;
	device_init(1);
	g_whole = 0;
}

int main(void)
{
	if (!mfs_engine_cuda_available())
		TEST_SKIP("no CUDA device answers (or the CUDA engine is not built)");
	for (g_fp16 = 0; g_fp16 <= 1; g_fp16++) {
		TEST_RUN(test_exactly_once_k32);
		TEST_RUN(test_exactly_once_k128);
		TEST_RUN(test_exactly_once_whole_gpu);
		TEST_RUN(test_exactly_once_oversubscribed);
		TEST_RUN(test_capture_beside_stream);
		TEST_RUN(test_reset_rows);
		TEST_RUN(test_device_init);
		TEST_RUN(test_device_init_persistent);
		TEST_RUN(test_device_init_whole_gpu);
		if (!getenv("MFS_TEST_QUICK"))
			TEST_RUN(test_ring_accuracy);
	}
	return TEST_REPORT();
}
