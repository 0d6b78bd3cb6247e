/* test_engine_cpu.c - the CPU engine (the oracle of every CUDA kernel) and the engine registry.
 *
 * Covers: the SGD step against finite differences of the per-rating regularized loss, one
 * update worked by hand, deterministic mode (bit-reproducible, independent of engine.threads),
 * the loss reduction (bit-identical for any thread count), MFS_ROW_NONE and clipping in loss
 * passes, batch validation (nothing applied on error), the non-finite guard, model growth
 * between batches, Hogwild mode vs deterministic mode on a planted problem, convergence to the
 * noise floor, replay (the batch at a scaled learning rate, not counted as events), and the
 * registry (AUTO -> cpu here, CUDA -> MFS_ENODEV).
 */
#include <stdint.h>

#include "common/clones.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "config/config.h"
#include "gpu/cpu/cpu_ref.h"
#include "gpu/engine.h"
#include "serve/stage_conf.h"
#include "testhelp.h"
#include "model_help.h"

/* ThreadSanitizer makes every float access ~100x slower: the learning tests shrink there (they
 * still exercise the pool, the scheduler and the racy batch path). */
#define UNDER_TSAN MFS_UNDER_TSAN

/* ---- helpers ---------------------------------------------------------------------------- */


static mfs_engine_t *open_cpu(mfs_model_t *m, int threads, int det, uint64_t seed)
{
	mfs_engine_conf_t ec = {MFS_ENGINE_CPU, threads, det, 0, seed};
	mfs_engine_t *e = NULL;
	char err[256];
	int rc = mfs_engine_open(&ec, m, &e, err, sizeof err);
	TEST_ASSERT_MSG(rc == 0, "open: %s", err);
	return e;
}

static void set_hp(mfs_engine_t *e, float lr, float lambda, float clip_min, float clip_max)
{
	mfs_hparams_t hp = {lr, lambda, lambda, lambda, lambda, clip_min, clip_max};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
}

/* A copy of a model's parameters, for "unchanged" and "identical" checks. */
struct snap {
	float *P, *Q, *bu, *bi;
	size_t np, nq;
	uint32_t nu, ni;
	uint64_t applied;
};

static void snap_take(struct snap *s, const mfs_model_t *m)
{
	s->nu = m->n_users;
	s->ni = m->n_items;
	s->np = (size_t)m->n_users * (size_t)m->k;
	s->nq = (size_t)m->n_items * (size_t)m->k;
	s->P = malloc(s->np * sizeof(float) + 1);
	s->Q = malloc(s->nq * sizeof(float) + 1);
	s->bu = malloc(s->nu * sizeof(float) + 1);
	s->bi = malloc(s->ni * sizeof(float) + 1);
	memcpy(s->P, m->P, s->np * sizeof(float));
	memcpy(s->Q, m->Q, s->nq * sizeof(float));
	memcpy(s->bu, m->bu, s->nu * sizeof(float));
	memcpy(s->bi, m->bi, s->ni * sizeof(float));
	s->applied = m->events_applied;
}

static int snap_same(const struct snap *s, const mfs_model_t *m)
{
	return s->nu == m->n_users && s->ni == m->n_items && !memcmp(s->P, m->P, s->np * sizeof(float)) &&
	       !memcmp(s->Q, m->Q, s->nq * sizeof(float)) && !memcmp(s->bu, m->bu, s->nu * sizeof(float)) &&
	       !memcmp(s->bi, m->bi, s->ni * sizeof(float)) && s->applied == m->events_applied;
}

static void snap_free(struct snap *s)
{
	free(s->P);
	free(s->Q);
	free(s->bu);
	free(s->bi);
}

/* A planted problem: r = mu + b_u + b_i + p*_u . q*_i + N(0, sigma^2), rank `rank`, uniform
 * users and items, no clipping (so the noise floor is exactly sigma). */
struct planted {
	uint32_t nu, ni;
	uint32_t *u, *i;
	float *r;
	size_t n;
	uint32_t *tu, *ti;
	float *tr;
	size_t tn;
	double mean;
};

static void planted_make(struct planted *pl, uint32_t nu, uint32_t ni, size_t n, size_t tn, int rank,
                         double sigma, uint64_t seed)
{
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	double fs = sqrt(0.5 / sqrt((double)rank)); /* sd of p.q = 0.5 */
	double *P = malloc((size_t)nu * (size_t)rank * sizeof *P), *Q = malloc((size_t)ni * (size_t)rank * sizeof *Q);
	double *bu = malloc(nu * sizeof *bu), *bi = malloc(ni * sizeof *bi);
	for (size_t x = 0; x < (size_t)nu * (size_t)rank; x++)
		P[x] = fs * mfs_rng_normal(&g);
	for (size_t x = 0; x < (size_t)ni * (size_t)rank; x++)
		Q[x] = fs * mfs_rng_normal(&g);
	for (uint32_t x = 0; x < nu; x++)
		bu[x] = 0.3 * mfs_rng_normal(&g);
	for (uint32_t x = 0; x < ni; x++)
		bi[x] = 0.3 * mfs_rng_normal(&g);
	pl->nu = nu;
	pl->ni = ni;
	pl->n = n;
	pl->tn = tn;
	pl->u = malloc(n * sizeof *pl->u);
	pl->i = malloc(n * sizeof *pl->i);
	pl->r = malloc(n * sizeof *pl->r);
	pl->tu = malloc(tn * sizeof *pl->tu);
	pl->ti = malloc(tn * sizeof *pl->ti);
	pl->tr = malloc(tn * sizeof *pl->tr);
	double sum = 0;
	for (size_t x = 0; x < n + tn; x++) {
		uint32_t u = (uint32_t)mfs_rng_below(&g, nu), i = (uint32_t)mfs_rng_below(&g, ni);
		double d = 3.0 + bu[u] + bi[i];
		for (int f = 0; f < rank; f++)
			d += P[(size_t)u * (size_t)rank + (size_t)f] * Q[(size_t)i * (size_t)rank + (size_t)f];
		float r = (float)(d + sigma * mfs_rng_normal(&g));
		if (x < n) {
			pl->u[x] = u;
			pl->i[x] = i;
			pl->r[x] = r;
			sum += r;
		} else {
			pl->tu[x - n] = u;
			pl->ti[x - n] = i;
			pl->tr[x - n] = r;
		}
	}
	pl->mean = sum / (double)n;
	free(P);
	free(Q);
	free(bu);
	free(bi);
}

static void planted_free(struct planted *pl)
{
	free(pl->u);
	free(pl->i);
	free(pl->r);
	free(pl->tu);
	free(pl->ti);
	free(pl->tr);
}

static mfs_batch_t train_batch(const struct planted *pl) { return (mfs_batch_t){pl->u, pl->i, pl->r, pl->n}; }
static mfs_batch_t test_batch(const struct planted *pl) { return (mfs_batch_t){pl->tu, pl->ti, pl->tr, pl->tn}; }

static mfs_model_t *planted_model(const struct planted *pl, int k, uint64_t seed)
{
	mfs_model_t *m = model_with_rows(k, pl->nu, pl->ni, seed);
	if (m)
		mfs_model_observe(m, pl->mean * (double)pl->n, pl->n);
	return m;
}

/* Train `epochs` set epochs; return the test RMSE. */
static double train_sets(mfs_engine_t *e, const struct planted *pl, int epochs)
{
	mfs_batch_t tb = train_batch(pl), vb = test_batch(pl);
	mfs_resident_t *s = NULL;
	TEST_OK(mfs_engine_resident_load(e, &tb, &s));
	for (int ep = 0; ep < epochs; ep++)
		TEST_OK(mfs_engine_sgd_epoch(e, s, (uint64_t)ep));
	mfs_loss_t l;
	TEST_OK(mfs_engine_loss(e, &vb, &l));
	mfs_engine_resident_free(e, s);
	return l.rmse;
}

/* ---- the SGD step ----------------------------------------------------------------------- */

/* The per-rating regularized loss in double. */
static double rating_loss(int k, double mu, const double *p, const double *q, double bu, double bi, double r,
                          const mfs_hparams_t *hp)
{
	double dot = 0, pp = 0, qq = 0;
	for (int f = 0; f < k; f++) {
		dot += p[f] * q[f];
		pp += p[f] * p[f];
		qq += q[f] * q[f];
	}
	double e = r - (mu + bu + bi + dot);
	return 0.5 * e * e + 0.5 * hp->lambda_p * pp + 0.5 * hp->lambda_q * qq + 0.5 * hp->lambda_bu * bu * bu +
	       0.5 * hp->lambda_bi * bi * bi;
}

/* Every parameter's update equals -lr x the central finite difference of the loss. */
static void test_step_gradient(void)
{
	enum { K = 21 }; /* not a multiple of 16: exercises the dot product's tail */
	const mfs_hparams_t hp = {0.05f, 0.07f, 0.03f, 0.11f, 0.02f, -INFINITY, INFINITY};
	mfs_rng_t g;
	mfs_rng_seed(&g, 99);
	for (int trial = 0; trial < 5; trial++) {
		float p[K], q[K], bu = (float)(0.2 * mfs_rng_normal(&g)), bi = (float)(0.2 * mfs_rng_normal(&g));
		double pd[K + 1], qd[K + 1];
		for (int f = 0; f < K; f++) {
			p[f] = (float)(0.3 * mfs_rng_normal(&g));
			q[f] = (float)(0.3 * mfs_rng_normal(&g));
			pd[f] = p[f];
			qd[f] = q[f];
		}
		const float mu = 3.25f, r = (float)(1.0 + 4.0 * mfs_rng_uniform(&g));
		float p1[K], q1[K], bu1 = bu, bi1 = bi;
		memcpy(p1, p, sizeof p);
		memcpy(q1, q, sizeof q);
		TEST_EQ_INT(mfs_sgd_step_ref(&hp, K, mu, p1, q1, &bu1, &bi1, r), 1);
		const double h = 1e-6, tol = 2e-5;
		/* parameters: p[0..K), q[0..K), bu, bi */
		for (int x = 0; x < 2 * K + 2; x++) {
			double *slot = x < K ? &pd[x] : x < 2 * K ? &qd[x - K] : NULL;
			double bud = bu, bid = bi;
			double *bslot = x == 2 * K ? &bud : x == 2 * K + 1 ? &bid : slot;
			double keep = *bslot;
			*bslot = keep + h;
			double lp = rating_loss(K, mu, pd, qd, bud, bid, r, &hp);
			*bslot = keep - h;
			double lm = rating_loss(K, mu, pd, qd, bud, bid, r, &hp);
			*bslot = keep;
			double grad = (lp - lm) / (2 * h);
			double before = x < K ? p[x] : x < 2 * K ? q[x - K] : x == 2 * K ? bu : bi;
			double after = x < K ? p1[x] : x < 2 * K ? q1[x - K] : x == 2 * K ? bu1 : bi1;
			TEST_ASSERT_MSG(fabs((after - before) - (-(double)hp.lr * grad)) <= tol,
			                "trial %d param %d: step %.9g, -lr*grad %.9g", trial, x, after - before,
			                -(double)hp.lr * grad);
		}
	}
}

/* One update worked by hand, through the engine (a batch of one rating). */
static void test_hand_update(void)
{
	mfs_model_t *m = model_with_rows(2, 1, 1, 1);
	TEST_ASSERT(m != NULL);
	mfs_engine_t *e = open_cpu(m, 1, 1, 1);
	mfs_hparams_t hp = {0.1f, 0.2f, 0.1f, 0.3f, 0.4f, -INFINITY, INFINITY};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
	m->mu = 3.0;
	m->P[0] = 1, m->P[1] = 2, m->Q[0] = 3, m->Q[1] = -1, m->bu[0] = 0.5f, m->bi[0] = -0.25f;
	uint64_t before = m->events_applied;
	uint32_t u = 0, i = 0;
	float r = 4.0f;
	mfs_batch_t b = {&u, &i, &r, 1};
	TEST_OK(mfs_engine_sgd(e, &b));
	/* pred = 3 + 0.5 - 0.25 + (3 - 2) = 4.25, e = -0.25 */
	TEST_NEAR(m->P[0], 0.905, 1e-6); /* 1 + 0.1 (-0.25*3 - 0.2*1) */
	TEST_NEAR(m->P[1], 1.985, 1e-6); /* 2 + 0.1 (-0.25*-1 - 0.2*2) */
	TEST_NEAR(m->Q[0], 2.945, 1e-6); /* 3 + 0.1 (-0.25*1 - 0.1*3) */
	TEST_NEAR(m->Q[1], -1.04, 1e-6); /* -1 + 0.1 (-0.25*2 - 0.1*-1) */
	TEST_NEAR(m->bu[0], 0.46, 1e-6); /* 0.5 + 0.1 (-0.25 - 0.3*0.5) */
	TEST_NEAR(m->bi[0], -0.265, 1e-6); /* -0.25 + 0.1 (-0.25 - 0.4*-0.25) */
	TEST_EQ_INT(m->events_applied, before + 1);
	/* the dot product's fixed order: 32 lanes of fmaf, folded by halves (a CUDA warp's order) */
	for (int k = 1; k <= 200; k += 7) {
		float a[200], c[200];
		for (int f = 0; f < k; f++)
			a[f] = (float)f * 0.25f - 3.0f, c[f] = 1.0f / (float)(f + 1);
		float lane[32] = {0};
		for (int f = 0; f < k; f++)
			lane[f % 32] = fmaf(a[f], c[f], lane[f % 32]);
		for (int w = 16; w >= 1; w /= 2)
			for (int l = 0; l < w; l++)
				lane[l] += lane[l + w];
		float want = lane[0];
		float got = mfs_dot_ref(a, c, k);
		TEST_ASSERT_MSG(memcmp(&got, &want, sizeof got) == 0, "k=%d: dot %.9g vs %.9g", k, got, want);
	}
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* ---- determinism -------------------------------------------------------------------------- */

/* Deterministic mode: the same factors bit for bit on a second run and for any engine.threads. */
static void run_det(const struct planted *pl, int threads, struct snap *out)
{
	mfs_model_t *m = planted_model(pl, 16, 5);
	mfs_engine_t *e = open_cpu(m, threads, 1, 77);
	set_hp(e, 0.02f, 0.05f, 1, 5);
	(void)train_sets(e, pl, 3);
	/* and the streaming path: batches applied in order */
	mfs_batch_t b = train_batch(pl);
	b.n = 20000;
	TEST_OK(mfs_engine_sgd(e, &b));
	snap_take(out, m);
	mfs_engine_close(e);
	mfs_model_free(m);
}

static void test_deterministic(void)
{
	struct planted pl;
	planted_make(&pl, 500, 300, 60000, 1000, 4, 0.3, 11);
	struct snap a, b, c;
	run_det(&pl, 1, &a);
	run_det(&pl, 1, &b);
	run_det(&pl, 4, &c);
	TEST_ASSERT_MSG(a.applied == 3 * 60000 + 20000, "applied %llu", (unsigned long long)a.applied);
	mfs_model_t m = {.k = 16, .n_users = a.nu, .n_items = a.ni, .P = b.P, .Q = b.Q, .bu = b.bu, .bi = b.bi,
	                 .events_applied = b.applied};
	TEST_ASSERT_MSG(snap_same(&a, &m), "two deterministic runs differ");
	m.P = c.P, m.Q = c.Q, m.bu = c.bu, m.bi = c.bi, m.events_applied = c.applied;
	TEST_ASSERT_MSG(snap_same(&a, &m), "deterministic run depends on engine.threads");
	snap_free(&a);
	snap_free(&b);
	snap_free(&c);
	planted_free(&pl);
}

/* The loss reduction: bit-identical for 1, 2, 3 and 5 threads, on a batch and on a set. */
static void test_loss_threads(void)
{
	struct planted pl;
	planted_make(&pl, 800, 400, 50000, 70001, 4, 0.3, 12);
	mfs_model_t *m = planted_model(&pl, 16, 6);
	mfs_batch_t vb = test_batch(&pl), tb = train_batch(&pl);
	mfs_loss_t ref = {0}, refs = {0};
	const int T[] = {1, 2, 3, 5};
	for (size_t t = 0; t < sizeof T / sizeof T[0]; t++) {
		mfs_engine_t *e = open_cpu(m, T[t], 0, 3);
		set_hp(e, 0.02f, 0.05f, 1, 5);
		mfs_loss_t l, ls;
		mfs_resident_t *s = NULL;
		TEST_OK(mfs_engine_loss(e, &vb, &l));
		TEST_OK(mfs_engine_resident_load(e, &tb, &s));
		TEST_OK(mfs_engine_loss_resident(e, s, &ls));
		TEST_EQ_INT(l.n, vb.n);
		TEST_EQ_INT(ls.n, tb.n);
		if (t == 0) {
			ref = l;
			refs = ls;
			TEST_ASSERT(l.rmse > 0.3 && l.rmse < 2);
		}
		TEST_ASSERT_MSG(memcmp(&l.sse, &ref.sse, sizeof l.sse) == 0 && memcmp(&l.sae, &ref.sae, sizeof l.sae) == 0,
		                "threads=%d: sse %.17g vs %.17g", T[t], l.sse, ref.sse);
		TEST_ASSERT_MSG(memcmp(&ls.sse, &refs.sse, sizeof ls.sse) == 0, "set, threads=%d: sse %.17g vs %.17g",
		                T[t], ls.sse, refs.sse);
		mfs_engine_resident_free(e, s);
		mfs_engine_close(e);
	}
	/* the chunked reduction against a plain double sum: equal up to rounding */
	mfs_sgd_args_t a = {m->k, (float)m->mu, m->P, m->Q, m->bu, m->bi, {0.02f, 0, 0, 0, 0, 1, 5}};
	double sse = 0;
	for (size_t j = 0; j < vb.n; j++) {
		double e = (double)vb.r[j] - (double)mfs_predict_ref(&a, vb.u[j], vb.i[j]);
		sse += e * e;
	}
	TEST_NEAR(ref.sse, sse, 1e-9 * sse);
	mfs_model_free(m);
	planted_free(&pl);
}

/* MFS_ROW_NONE sides and clipping, worked by hand. */
static void test_loss_none_clip(void)
{
	mfs_model_t *m = model_with_rows(2, 2, 2, 1);
	mfs_engine_t *e = open_cpu(m, 2, 0, 1);
	set_hp(e, 0.01f, 0.05f, 1.0f, 5.0f);
	m->mu = 3.0;
	m->bu[0] = 0.5f, m->bu[1] = 0.25f, m->bi[0] = -1.0f, m->bi[1] = 0.125f;
	m->P[0] = 1, m->P[1] = 1, m->Q[0] = 1, m->Q[1] = 1; /* u0.i0 = 2 */
	m->P[2] = 2, m->P[3] = 2, m->Q[2] = 2, m->Q[3] = 2; /* u1.i1 = 8 */
	const uint32_t N = MFS_ROW_NONE;
	uint32_t u[] = {N, 0, N, 0, 1, 1};
	uint32_t i[] = {0, N, N, 0, 1, 0};
	float r[] = {3, 3, 3, 3, 4, 0.5f};
	/* predictions: mu + bi0 = 2; mu + bu0 = 3.5; mu = 3; 3 + 0.5 - 1 + 2 = 4.5;
	 * 3 + 0.25 + 0.125 + 8 = 11.375 -> clipped to 5; 3 + 0.25 - 1 + 4 = 6.25 -> clipped to 5 */
	double err[] = {1, -0.5, 0, -1.5, -1, -4.5};
	double sse = 0, sae = 0;
	for (int j = 0; j < 6; j++)
		sse += err[j] * err[j], sae += fabs(err[j]);
	mfs_batch_t b = {u, i, r, 6};
	mfs_loss_t l;
	TEST_OK(mfs_engine_loss(e, &b, &l));
	TEST_EQ_INT(l.n, 6);
	TEST_NEAR(l.sse, sse, 1e-12);
	TEST_NEAR(l.sae, sae, 1e-12);
	TEST_NEAR(l.rmse, sqrt(sse / 6), 1e-12);
	TEST_NEAR(l.mae, sae / 6, 1e-12);
	/* the lower clip: a prediction of 3 + 0.5 - 1 - 4 = -1.5 scores as 1 */
	m->Q[0] = -1, m->Q[1] = -1; /* u0.i0 = -2 -> 0.5 */
	m->P[0] = 2, m->P[1] = 2;   /* u0.i0 = -4 -> -1.5 */
	uint32_t u1 = 0, i1 = 0;
	float r1 = 2;
	mfs_batch_t b1 = {&u1, &i1, &r1, 1};
	TEST_OK(mfs_engine_loss(e, &b1, &l));
	TEST_NEAR(l.sse, 1.0, 1e-12);
	/* sets keep NONE rows for the loss and never train on them */
	mfs_resident_t *s = NULL;
	uint64_t applied = m->events_applied;
	TEST_OK(mfs_engine_resident_load(e, &b, &s));
	TEST_OK(mfs_engine_sgd_epoch(e, s, 0));
	TEST_EQ_INT(m->events_applied, applied + 3);
	TEST_OK(mfs_engine_loss_resident(e, s, &l));
	TEST_EQ_INT(l.n, 6);
	mfs_engine_resident_free(e, s);
	/* an empty pass: n = 0, rmse NaN */
	mfs_batch_t none = {NULL, NULL, NULL, 0};
	TEST_OK(mfs_engine_loss(e, &none, &l));
	TEST_ASSERT(l.n == 0 && isnan(l.rmse));
	/* a NaN prediction must not be clipped into a number */
	m->bu[0] = NAN;
	TEST_OK(mfs_engine_loss(e, &b1, &l));
	TEST_ASSERT(isnan(l.rmse));
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* ---- errors and the guard ----------------------------------------------------------------- */

static void test_validation(void)
{
	mfs_model_t *m = model_with_rows(8, 10, 5, 2);
	mfs_engine_t *e = open_cpu(m, 2, 0, 1);
	struct snap s0;
	snap_take(&s0, m);
	uint32_t u[] = {0, 1, 2, 3}, i[] = {0, 1, 2, 3};
	float r[] = {1, 2, 3, 4};
	mfs_batch_t b = {u, i, r, 4};
	u[3] = 10; /* one past the last user, at the end: nothing before it may be applied */
	TEST_EQ_INT(mfs_engine_sgd(e, &b), MFS_EINVAL);
	u[3] = 3, i[3] = 5;
	TEST_EQ_INT(mfs_engine_sgd(e, &b), MFS_EINVAL);
	i[3] = MFS_ROW_NONE; /* allowed in a loss pass, not in an update */
	TEST_EQ_INT(mfs_engine_sgd(e, &b), MFS_EINVAL);
	i[3] = 3, r[3] = NAN;
	TEST_EQ_INT(mfs_engine_sgd(e, &b), MFS_ENAN);
	r[3] = INFINITY;
	TEST_EQ_INT(mfs_engine_sgd(e, &b), MFS_ENAN);
	mfs_loss_t l;
	TEST_EQ_INT(mfs_engine_loss(e, &b, &l), MFS_ENAN);
	mfs_resident_t *s = NULL;
	TEST_EQ_INT(mfs_engine_resident_load(e, &b, &s), MFS_ENAN);
	TEST_ASSERT(s == NULL);
	r[3] = 4, u[1] = 10;
	TEST_EQ_INT(mfs_engine_loss(e, &b, &l), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_resident_load(e, &b, &s), MFS_EINVAL);
	TEST_ASSERT_MSG(snap_same(&s0, m), "a rejected batch changed the model");
	/* NULL arguments and bad hyperparameters */
	TEST_EQ_INT(mfs_engine_sgd(e, NULL), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_sgd(NULL, &b), MFS_EINVAL);
	mfs_batch_t holes = {NULL, i, r, 4};
	TEST_EQ_INT(mfs_engine_sgd(e, &holes), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_loss(e, &b, NULL), MFS_EINVAL);
	mfs_hparams_t hp = {0, 0.05f, 0.05f, 0.05f, 0.05f, 1, 5};
	TEST_EQ_INT(mfs_engine_set_hparams(e, &hp), MFS_EINVAL);
	hp.lr = NAN;
	TEST_EQ_INT(mfs_engine_set_hparams(e, &hp), MFS_EINVAL);
	hp.lr = 0.01f, hp.lambda_q = -1;
	TEST_EQ_INT(mfs_engine_set_hparams(e, &hp), MFS_EINVAL);
	hp.lambda_q = 0.05f, hp.clip_min = 6;
	TEST_EQ_INT(mfs_engine_set_hparams(e, &hp), MFS_EINVAL);
	/* an empty batch is a no-op */
	mfs_batch_t empty = {NULL, NULL, NULL, 0};
	TEST_OK(mfs_engine_sgd(e, &empty));
	TEST_ASSERT(snap_same(&s0, m));
	snap_free(&s0);
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* An update whose error is not finite is skipped, so NaN never reaches the factors. */
static void test_nonfinite_guard(void)
{
	mfs_model_t *m = model_with_rows(16, 3, 3, 3);
	mfs_engine_t *e = open_cpu(m, 1, 1, 1);
	set_hp(e, 0.05f, 0.05f, 1, 5);
	m->P[0] = INFINITY; /* user 0: p.q is +-inf (or NaN) for any item */
	m->bu[1] = NAN;     /* user 1: the prediction is NaN */
	struct snap s0;
	snap_take(&s0, m);
	uint32_t u[] = {0, 1, 2}, i[] = {0, 1, 2};
	float r[] = {3, 3, 3};
	mfs_batch_t b = {u, i, r, 3};
	TEST_OK(mfs_engine_sgd(e, &b));
	TEST_EQ_INT(m->events_applied, s0.applied + 1);
	/* items 0 and 1 were only paired with the broken users: untouched, and finite */
	TEST_ASSERT(memcmp(m->Q, s0.Q, 2 * 16 * sizeof(float)) == 0);
	TEST_ASSERT(m->bi[0] == s0.bi[0] && m->bi[1] == s0.bi[1]);
	/* the healthy rating was applied */
	TEST_ASSERT(memcmp(m->Q + 32, s0.Q + 32, 16 * sizeof(float)) != 0);
	for (int f = 0; f < 3 * 16; f++)
		TEST_ASSERT(isfinite(m->Q[f]));
	/* the same through a set epoch */
	mfs_resident_t *s = NULL;
	TEST_OK(mfs_engine_resident_load(e, &b, &s));
	TEST_OK(mfs_engine_sgd_epoch(e, s, 0));
	TEST_EQ_INT(m->events_applied, s0.applied + 2);
	for (int f = 0; f < 3 * 16; f++)
		TEST_ASSERT(isfinite(m->Q[f]));
	mfs_engine_resident_free(e, s);
	snap_free(&s0);
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* Rows added after the engine opened (arrays reallocated) are usable in the next batch. */
static void test_growth(void)
{
	mfs_model_t *m = model_with_rows(32, 4, 4, 4);
	mfs_engine_t *e = open_cpu(m, 2, 0, 1);
	const float *oldP = m->P;
	uint32_t row;
	for (uint32_t x = 4; x < 5000; x++) {
		mfs_id_t id = mfs_id_u64(x);
		TEST_OK(mfs_model_user_row(m, &id, &row));
	}
	TEST_ASSERT(m->P != oldP); /* the point of the test: the array moved */
	TEST_OK(mfs_engine_grow(e));
	uint32_t u = 4999, i = 3;
	float r = 4;
	mfs_batch_t b = {&u, &i, &r, 1};
	float before = m->P[(size_t)4999 * 32];
	TEST_OK(mfs_engine_sgd(e, &b));
	TEST_ASSERT(m->P[(size_t)4999 * 32] != before);
	TEST_OK(mfs_engine_sync(e));
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* Capture (snapshots): the values of the named rows, in the order named, bias then factors,
 * as they are at the call; later updates do not reach them; bad arguments are refused. */
static void test_capture(void)
{
	const int k = 8;
	mfs_model_t *m = model_with_rows(k, 6, 5, 3);
	mfs_engine_t *e = open_cpu(m, 2, 0, 1);
	static const uint32_t ur[] = {5, 0, 5}, ir[] = {4};
	float du[3 * (1 + 8)], di[1 + 8];
	TEST_OK(mfs_engine_capture(e, ur, 3, du, ir, 1, di));
	TEST_OK(mfs_engine_capture_wait(e));
	for (int j = 0; j < 3; j++) {
		TEST_ASSERT(du[j * (1 + k)] == m->bu[ur[j]]);
		TEST_ASSERT(memcmp(du + j * (1 + k) + 1, m->P + (size_t)ur[j] * k, k * sizeof(float)) == 0);
	}
	TEST_ASSERT(di[0] == m->bi[4] && memcmp(di + 1, m->Q + 4 * k, k * sizeof(float)) == 0);
	const float was = du[0];
	uint32_t u = 5, i = 4;
	float r = 5;
	mfs_batch_t b = {&u, &i, &r, 1};
	TEST_OK(mfs_engine_sgd(e, &b));
	TEST_ASSERT(m->bu[5] != was && du[0] == was); /* a copy, not a view */
	const uint32_t bad = m->n_users;
	TEST_EQ_INT(mfs_engine_capture(e, &bad, 1, du, NULL, 0, NULL), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_capture(e, ur, 1, NULL, NULL, 0, NULL), MFS_EINVAL);
	TEST_OK(mfs_engine_capture(e, NULL, 0, NULL, NULL, 0, NULL)); /* nothing to capture */
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* ---- learning ----------------------------------------------------------------------------- */

/* Hogwild! with 2 threads reaches the deterministic mode's test RMSE within 1%, both on set
 * epochs (conflict-free blocks) and on streaming batches (racy ranges). */
static void test_hogwild_vs_det(void)
{
	struct planted pl;
	const int epochs = UNDER_TSAN ? 6 : 20;
	const size_t bsz = UNDER_TSAN ? 8000 : 30000;
	if (UNDER_TSAN)
		planted_make(&pl, 800, 400, 40000, 4000, 4, 0.3, 13);
	else
		planted_make(&pl, 3000, 1500, 300000, 20000, 4, 0.3, 13);
	double rm[2], rb[2];
	for (int det = 0; det < 2; det++) {
		mfs_model_t *m = planted_model(&pl, 16, 7);
		mfs_engine_t *e = open_cpu(m, 2, det, 9);
		set_hp(e, 0.03f, 0.03f, -INFINITY, INFINITY);
		rm[det] = train_sets(e, &pl, epochs);
		TEST_EQ_INT(m->events_applied, (uint64_t)epochs * pl.n);
		mfs_engine_close(e);
		mfs_model_free(m);
		/* streaming: the training ratings in batches, same order for both modes */
		m = planted_model(&pl, 16, 7);
		e = open_cpu(m, 2, det, 9);
		set_hp(e, 0.03f, 0.03f, -INFINITY, INFINITY);
		for (int ep = 0; ep < epochs; ep++)
			for (size_t off = 0; off < pl.n; off += bsz) {
				mfs_batch_t b = {pl.u + off, pl.i + off, pl.r + off, pl.n - off < bsz ? pl.n - off : bsz};
				TEST_OK(mfs_engine_sgd(e, &b));
			}
		mfs_loss_t l;
		mfs_batch_t vb = test_batch(&pl);
		TEST_OK(mfs_engine_loss(e, &vb, &l));
		rb[det] = l.rmse;
		mfs_engine_close(e);
		mfs_model_free(m);
	}
	fprintf(stderr, "  sets: hogwild %.5f det %.5f; batches: hogwild %.5f det %.5f\n", rm[0], rm[1], rb[0], rb[1]);
	TEST_ASSERT_MSG(fabs(rm[0] - rm[1]) <= 0.01 * rm[1], "sets: %.5f vs %.5f", rm[0], rm[1]);
	TEST_ASSERT_MSG(fabs(rb[0] - rb[1]) <= 0.01 * rb[1], "batches: %.5f vs %.5f", rb[0], rb[1]);
	planted_free(&pl);
}

/* On a planted problem with noise sigma, the test RMSE comes down to close to sigma. */
static void test_convergence(void)
{
	const double sigma = 0.25;
	if (UNDER_TSAN) {
		fprintf(stderr, "  skipped under ThreadSanitizer (too slow; test_hogwild_vs_det covers the threads)\n");
		return;
	}
	struct planted pl;
	planted_make(&pl, 2000, 1000, 300000, 20000, 4, sigma, 14);
	mfs_model_t *m = planted_model(&pl, 16, 8);
	mfs_engine_t *e = open_cpu(m, 0, 0, 10);
	mfs_loss_t l0;
	mfs_batch_t vb = test_batch(&pl);
	set_hp(e, 0.02f, 0.03f, -INFINITY, INFINITY);
	TEST_OK(mfs_engine_loss(e, &vb, &l0));
	double rmse = train_sets(e, &pl, 25);
	fprintf(stderr, "  test rmse %.4f -> %.4f (sigma %.2f)\n", l0.rmse, rmse, sigma);
	TEST_ASSERT_MSG(rmse < 1.08 * sigma, "test rmse %.4f, sigma %.2f", rmse, sigma);
	TEST_ASSERT(l0.rmse > 2 * sigma);
	mfs_engine_close(e);
	mfs_model_free(m);
	planted_free(&pl);
}

/* ---- the registry ------------------------------------------------------------------------- */

/* The engine calls every engine has: drain, a capture of chosen rows (test_sync_rows: checked,
 * the host's own rows on the host engine), memory (a host engine has no device). */
static void test_streaming_calls(void)
{
	mfs_model_t *m = model_with_rows(8, 10, 10, 3);
	TEST_ASSERT(m != NULL);
	if (!m)
		return;
	mfs_engine_t *e = open_cpu(m, 1, 1, 1);
	set_hp(e, 0.05f, 0.0f, 1.0f, 5.0f);
	const uint32_t u[] = {1, 2, 3}, i[] = {4, 5, 6};
	const float r[] = {4, 2, 5};
	mfs_batch_t b = {u, i, r, 3};
	TEST_OK(mfs_engine_sgd(e, &b));
	TEST_OK(mfs_engine_drain(e));
	TEST_OK(test_sync_rows(e, m, u, 3, i, 3));
	TEST_OK(test_sync_rows(e, m, NULL, 0, NULL, 0));
	const uint32_t bad = 10;
	TEST_EQ_INT(test_sync_rows(e, m, &bad, 1, NULL, 0), MFS_EINVAL);
	TEST_EQ_INT(test_sync_rows(e, m, NULL, 0, &bad, 1), MFS_EINVAL);
	TEST_EQ_INT(test_sync_rows(e, m, NULL, 1, NULL, 0), MFS_EINVAL);
	uint64_t used = 1, total = 1;
	TEST_EQ_INT(mfs_engine_memory(e, &used, &total), MFS_ENODEV);
	mfs_engine_close(e);
	mfs_model_free(m);
}

/* mfs_engine_replay(b, s) is mfs_engine_sgd(b) at lr x s, bit for bit, and leaves events_applied
 * alone; progress counts it as a call; a scale that is not a finite positive is refused. */
static void test_replay(void)
{
	struct planted pl;
	planted_make(&pl, 200, 100, 5000, 10, 4, 0.3, 5);
	mfs_model_t *ma = planted_model(&pl, 16, 9), *mb = planted_model(&pl, 16, 9);
	TEST_ASSERT(ma && mb);
	if (!ma || !mb)
		return;
	mfs_engine_t *ea = open_cpu(ma, 1, 1, 1), *eb = open_cpu(mb, 1, 1, 1);
	const float lr = 0.03f, scale = 0.37f;
	set_hp(ea, lr, 0.04f, 1.0f, 5.0f);
	set_hp(eb, lr * scale, 0.04f, 1.0f, 5.0f);
	mfs_batch_t b = train_batch(&pl);
	TEST_OK(mfs_engine_replay(ea, &b, scale));
	TEST_OK(mfs_engine_sgd(eb, &b));
	TEST_EQ_INT(ma->events_applied, 0);
	TEST_EQ_INT(mb->events_applied, pl.n);
	ma->events_applied = mb->events_applied; /* all else must be identical */
	struct snap sb;
	snap_take(&sb, mb);
	TEST_ASSERT_MSG(snap_same(&sb, ma), "replay at lr x %g differs from sgd at that rate", (double)scale);
	snap_free(&sb);
	uint64_t ticket, applied;
	mfs_engine_progress(ea, &ticket, &applied);
	TEST_EQ_INT(ticket, 1);
	TEST_EQ_INT(applied, 1);
	TEST_EQ_INT(mfs_engine_replay(ea, &b, 0.0f), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_replay(ea, &b, -1.0f), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_replay(ea, &b, NAN), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_replay(ea, &b, INFINITY), MFS_EINVAL);
	mfs_engine_close(ea);
	mfs_engine_close(eb);
	mfs_model_free(ma);
	mfs_model_free(mb);
	planted_free(&pl);
}

static void test_registry(void)
{
	mfs_conf_t c;
	TEST_OK(mfs_conf_init(&c));
	mfs_engine_conf_t ec;
	TEST_OK(mfs_engine_conf_from(&c, &ec, NULL, 0));
	TEST_EQ_INT(ec.kind, MFS_ENGINE_AUTO);
	TEST_EQ_INT(ec.threads, 0);
	TEST_EQ_INT(ec.deterministic, 0);
	TEST_EQ_INT(ec.device, 0);
	TEST_EQ_INT(ec.seed, 42);
	TEST_EQ_INT(ec.frequent_loss, 1); /* serve.prequential scores every batch: room beside */
	char err[256];
	TEST_OK(mfs_conf_set(&c, "engine.kind", "cuda", err, sizeof err));
	TEST_OK(mfs_conf_set(&c, "engine.threads", "3", err, sizeof err));
	TEST_OK(mfs_conf_set(&c, "engine.deterministic", "true", err, sizeof err));
	TEST_OK(mfs_conf_set(&c, "model.seed", "1234", err, sizeof err));
	TEST_OK(mfs_conf_set(&c, "serve.prequential", "false", err, sizeof err));
	TEST_OK(mfs_engine_conf_from(&c, &ec, NULL, 0));
	TEST_EQ_INT(ec.frequent_loss, 0);
	TEST_EQ_INT(ec.kind, MFS_ENGINE_CUDA);
	TEST_EQ_INT(ec.threads, 3);
	TEST_EQ_INT(ec.deterministic, 1);
	TEST_EQ_INT(ec.seed, 1234);
	/* the hidden experiment keys reach the engine: unset, each leaves the choice to the engine */
	TEST_EQ_INT(ec.cuda_rows_per_warp, 0);
	TEST_ASSERT(ec.cuda_plain_c == 0);
	TEST_EQ_INT(ec.cuda_pk_blocks_per_sm + ec.cuda_pk_stop_for_loss + ec.cuda_pk_carveout, 0);
	TEST_EQ_INT(ec.cuda_pk_oversubscribe + (int)ec.cpu_grid_users + (int)ec.cpu_grid_items, 0);
	const char *hidden[][2] = {{"engine.cuda.rows_per_warp", "4"}, {"engine.cuda.plain_c", "-1"},
	                           {"engine.cuda.pk_blocks_per_sm", "3"}, {"engine.cuda.pk_stop_for_loss", "true"},
	                           {"engine.cuda.pk_carveout", "25"}, {"engine.cuda.pk_oversubscribe", "true"},
	                           {"engine.cpu.grid_users", "16"}, {"engine.cpu.grid_items", "12"}};
	for (size_t j = 0; j < sizeof hidden / sizeof hidden[0]; j++)
		TEST_OK(mfs_conf_set(&c, hidden[j][0], hidden[j][1], err, sizeof err));
	TEST_OK(mfs_engine_conf_from(&c, &ec, NULL, 0));
	TEST_EQ_INT(ec.cuda_rows_per_warp, 4);
	TEST_ASSERT(ec.cuda_plain_c == -1);
	TEST_EQ_INT(ec.cuda_pk_blocks_per_sm, 3);
	TEST_EQ_INT(ec.cuda_pk_stop_for_loss, 1);
	TEST_EQ_INT(ec.cuda_pk_carveout, 25);
	TEST_EQ_INT(ec.cuda_pk_oversubscribe, 1);
	TEST_EQ_INT(ec.cpu_grid_users, 16);
	TEST_EQ_INT(ec.cpu_grid_items, 12);
	mfs_conf_free(&c);

	/* an engine's hyperparameters before set_hparams are the table's sgd.* defaults, unclipped */
	TEST_OK(mfs_conf_init(&c));
	mfs_hparams_t want, dflt = MFS_HPARAMS_DEFAULT;
	mfs_hparams_from(&c, c.sgd_lr, &want);
	TEST_ASSERT(dflt.lr == want.lr && dflt.lambda_p == want.lambda_p && dflt.lambda_q == want.lambda_q);
	TEST_ASSERT(dflt.lambda_bu == want.lambda_bu && dflt.lambda_bi == want.lambda_bi);
	TEST_ASSERT(dflt.clip_min == -INFINITY && dflt.clip_max == INFINITY);
	mfs_conf_free(&c);

	mfs_model_t *m = model_with_rows(8, 2, 2, 1);
	mfs_engine_t *e = NULL;
	/* AUTO picks CUDA exactly when a CUDA engine is built in, a device answers and the engine
	 * can run the model (k a multiple of 32); otherwise the CPU, and engine.kind=cuda without
	 * a device is refused with MFS_ENODEV. */
	const int cuda = mfs_engine_cuda_available();
	mfs_engine_conf_t a = {MFS_ENGINE_AUTO, 1, 0, 0, 1};
	TEST_OK(mfs_engine_open(&a, m, &e, err, sizeof err));
	TEST_STR_EQ(mfs_engine_name(e), "cpu"); /* k = 8: no CUDA kernel for it */
	mfs_engine_close(e);
	e = NULL;
	mfs_model_t *m32 = model_with_rows(32, 2, 2, 1);
	/* the log line of that choice: where no GPU answers it says so plainly, and that the CPU
	 * engine runs (the CUDA runtime's own text, e.g. "driver version is insufficient" on a
	 * host without a driver, is only the detail) */
	FILE *logf = tmpfile();
	TEST_ASSERT(logf != NULL);
	int old_fd = logf ? mfs_log_set_fd(fileno(logf)) : -1, old_level = mfs_log_get_level();
	mfs_log_set_level(MFS_LOG_INFO);
	TEST_OK(mfs_engine_open(&a, m32, &e, err, sizeof err));
	mfs_log_set_level(old_level);
	if (logf) {
		mfs_log_set_fd(old_fd);
		char line[1024] = "";
		rewind(logf);
		while (fgets(line, sizeof line, logf) && !strstr(line, "engine chosen"))
			line[0] = 0;
		fclose(logf);
		TEST_ASSERT_MSG(cuda || (strstr(line, "engine=cpu") && strstr(line, "so the CPU engine runs") &&
		                         (strstr(line, "no usable GPU or driver found") ||
		                          strstr(line, "this build has no CUDA engine"))),
		                "auto without a GPU logged: %s", line);
	}
	TEST_STR_EQ(mfs_engine_name(e), cuda ? "cuda" : "cpu");
	mfs_engine_close(e);
	mfs_model_free(m32);
	e = NULL;
	if (!cuda) {
		mfs_engine_conf_t cu = {MFS_ENGINE_CUDA, 1, 0, 0, 1};
		err[0] = 0;
		TEST_EQ_INT(mfs_engine_open(&cu, m, &e, err, sizeof err), MFS_ENODEV);
		TEST_ASSERT(e == NULL);
		TEST_ASSERT_MSG(strstr(err, "CUDA") != NULL, "errstr \"%s\"", err);
	}
	mfs_engine_conf_t bad = {7, 1, 0, 0, 1};
	TEST_EQ_INT(mfs_engine_open(&bad, m, &e, err, sizeof err), MFS_EINVAL);
	bad.kind = MFS_ENGINE_CPU, bad.threads = -1;
	TEST_EQ_INT(mfs_engine_open(&bad, m, &e, err, sizeof err), MFS_EINVAL);
	TEST_EQ_INT(mfs_engine_open(&a, NULL, &e, err, sizeof err), MFS_EINVAL);
	TEST_STR_EQ(mfs_engine_name(NULL), "none");
	mfs_engine_close(NULL);
	mfs_model_free(m);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	TEST_RUN(test_step_gradient);
	TEST_RUN(test_hand_update);
	TEST_RUN(test_deterministic);
	TEST_RUN(test_loss_threads);
	TEST_RUN(test_loss_none_clip);
	TEST_RUN(test_validation);
	TEST_RUN(test_nonfinite_guard);
	TEST_RUN(test_growth);
	TEST_RUN(test_capture);
	TEST_RUN(test_hogwild_vs_det);
	TEST_RUN(test_convergence);
	TEST_RUN(test_registry);
	TEST_RUN(test_streaming_calls);
	TEST_RUN(test_replay);
	return TEST_REPORT();
}
