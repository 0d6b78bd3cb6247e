/* test_rows.c - serve/rows.c and common/par.c: a batch's rows over several threads are those one
 * thread gives (the same rows, the same new rows' values, the same touched marks), on every
 * path (three steps; tracked models and batches with deletions; small batches), and the pool
 * runs every task exactly once. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "common/par.h"
#include "common/rng.h"
#include "model_store/life.h"
#include "serve/rows.h"
#include "testhelp.h"

/* ---- the pool -------------------------------------------------------------------------- */

static atomic_int *g_hits;
static void hit(void *arg, size_t t)
{
	(void)arg;
	atomic_fetch_add(&g_hits[t], 1);
}

static void test_par_every_task_once(void)
{
	const int threads[] = {1, 2, 3, 8};
	const size_t ns[] = {0, 1, 2, 7, 1000};
	g_hits = calloc(1000, sizeof *g_hits);
	for (size_t a = 0; a < sizeof threads / sizeof *threads; a++) {
		mfs_par_t *p;
		TEST_OK(mfs_par_init(&p, threads[a], "test-par"));
		TEST_EQ_INT(mfs_par_threads(p), threads[a]);
		for (int rep = 0; rep < 50; rep++)
			for (size_t b = 0; b < sizeof ns / sizeof *ns; b++) {
				for (size_t t = 0; t < 1000; t++)
					atomic_store(&g_hits[t], 0);
				mfs_par_run(p, ns[b], hit, NULL);
				int bad = 0;
				for (size_t t = 0; t < 1000; t++)
					bad += atomic_load(&g_hits[t]) != (t < ns[b] ? 1 : 0);
				TEST_ASSERT_MSG(bad == 0, "threads %d n %zu rep %d: %d tasks not run once", threads[a], ns[b], rep, bad);
			}
		mfs_par_free(p);
	}
	free(g_hits);
	mfs_par_free(NULL);
}

/* A step begun with mfs_par_start runs every task once on the workers while the caller goes on
 * (the caller's own thread takes none until it waits), and is waited for by mfs_par_wait, by
 * the next mfs_par_run or by mfs_par_free. */
static pthread_t g_caller;
static atomic_int g_on_caller;
static void hit_elsewhere(void *arg, size_t t)
{
	hit(arg, t);
	if (pthread_equal(pthread_self(), g_caller))
		atomic_fetch_add(&g_on_caller, 1);
}

static void test_par_start_wait(void)
{
	const int threads[] = {1, 2, 8};
	g_hits = calloc(1000, sizeof *g_hits);
	g_caller = pthread_self();
	for (size_t a = 0; a < sizeof threads / sizeof *threads; a++) {
		mfs_par_t *p;
		TEST_OK(mfs_par_init(&p, threads[a], "test-par"));
		for (int rep = 0; rep < 60; rep++) {
			for (size_t t = 0; t < 1000; t++)
				atomic_store(&g_hits[t], 0);
			atomic_store(&g_on_caller, 0);
			mfs_par_start(p, 1000, hit_elsewhere, NULL);
			/* with workers, none on the caller while it goes on; without, all of them */
			TEST_EQ_INT(atomic_load(&g_on_caller), threads[a] > 1 ? 0 : 1000);
			if (rep % 3 == 0) {
				mfs_par_wait(p);
				mfs_par_wait(p); /* (nothing owed: returns) */
			} else if (rep % 3 == 1) {
				mfs_par_run(p, 0, hit, NULL); /* no tasks: nothing waited for */
				mfs_par_wait(p);
			} else {
				mfs_par_run(p, 1, hit, NULL); /* waits for the started step first */
				atomic_fetch_sub(&g_hits[0], 1);
			}
			int bad = 0;
			for (size_t t = 0; t < 1000; t++)
				bad += atomic_load(&g_hits[t]) != 1;
			TEST_ASSERT_MSG(bad == 0, "threads %d rep %d: %d tasks not run once", threads[a], rep, bad);
		}
		mfs_par_start(p, 1000, hit, NULL); /* freed with a step under way: waited for */
		mfs_par_free(p);
	}
	free(g_hits);
}

/* A step ends when its tasks have run, not when every worker has looked: with a worker held
 * between seeing a job and taking a task (as a scheduler may leave it, its cores busy), the
 * caller runs every task and returns; released later, the held worker takes nothing of the job
 * it saw (over) nor runs that job's function on the next job's tasks. (A caller that waited for
 * every worker would never return here: the alarm ends the test.) */
static pthread_mutex_t g_hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hold_cv = PTHREAD_COND_INITIALIZER;
static int g_holding, g_held, g_release;
static atomic_int *g_hits_b;

static void hold_worker(void)
{
	pthread_mutex_lock(&g_hold_mu);
	if (g_holding && !g_held) { /* the first wake only */
		g_held = 1;
		pthread_cond_broadcast(&g_hold_cv);
		while (!g_release)
			pthread_cond_wait(&g_hold_cv, &g_hold_mu);
	}
	pthread_mutex_unlock(&g_hold_mu);
}

static void hit_b(void *arg, size_t t)
{
	(void)arg;
	atomic_fetch_add(&g_hits_b[t], 1);
}

static void test_par_held_worker(void)
{
	alarm(120);
	g_hits = calloc(1000, sizeof *g_hits);
	g_hits_b = calloc(1000, sizeof *g_hits_b);
	g_holding = 1;
	mfs_par_test_on_wake(hold_worker);
	mfs_par_t *p;
	TEST_OK(mfs_par_init(&p, 2, "test-hold")); /* one worker */
	mfs_par_run(p, 100, hit, NULL);            /* the caller runs them all */
	pthread_mutex_lock(&g_hold_mu);            /* the worker saw that job and is held */
	while (!g_held)
		pthread_cond_wait(&g_hold_cv, &g_hold_mu);
	pthread_mutex_unlock(&g_hold_mu);
	mfs_par_run(p, 100, hit_b, NULL); /* the next job, the worker still holding the first's function */
	pthread_mutex_lock(&g_hold_mu);
	g_release = 1;
	pthread_cond_broadcast(&g_hold_cv);
	pthread_mutex_unlock(&g_hold_mu);
	for (int rep = 0; rep < 20; rep++)
		mfs_par_run(p, 1000, hit_b, NULL);
	mfs_par_free(p); /* (joins the worker: whatever it took has run) */
	/* a started step whose worker is held: the wait takes the tasks on the caller */
	g_held = g_release = 0;
	TEST_OK(mfs_par_init(&p, 2, "test-hold"));
	mfs_par_start(p, 100, hit, NULL);
	pthread_mutex_lock(&g_hold_mu);
	while (!g_held)
		pthread_cond_wait(&g_hold_cv, &g_hold_mu);
	pthread_mutex_unlock(&g_hold_mu);
	mfs_par_wait(p);
	for (size_t t = 0; t < 100; t++)
		TEST_ASSERT(atomic_fetch_sub(&g_hits[t], 1) == 2); /* (once more: the first job's run) */
	pthread_mutex_lock(&g_hold_mu);
	g_release = 1;
	pthread_cond_broadcast(&g_hold_cv);
	pthread_mutex_unlock(&g_hold_mu);
	mfs_par_free(p);
	int bad = 0;
	for (size_t t = 0; t < 1000; t++) {
		bad += atomic_load(&g_hits[t]) != (t < 100 ? 1 : 0);
		bad += atomic_load(&g_hits_b[t]) != (t < 100 ? 21 : 20);
	}
	TEST_ASSERT_MSG(bad == 0, "%d tasks not run the times asked, or by the wrong job's function", bad);
	mfs_par_test_on_wake(NULL);
	free(g_hits);
	free(g_hits_b);
	alarm(0);
}

/* ---- rows ------------------------------------------------------------------------------ */

enum { K = 16 };

typedef struct batchset {
	mfs_ebatch_t b;
	char (*names)[24]; /* string ids' bytes */
} batchset_t;

/* n events: users arriving (a few hundred new per thousand events, repeats and in-batch
 * duplicates), items from a few thousand, string ids for every third user when str. Users
 * first seen in an earlier batch recur. */
static void make_batch(batchset_t *s, size_t n, uint64_t seed, uint64_t base, int str)
{
	memset(s, 0, sizeof *s);
	s->b.ev = calloc(n, sizeof *s->b.ev);
	s->names = calloc(n, sizeof *s->names);
	s->b.n = s->b.cap = n;
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	for (size_t j = 0; j < n; j++) {
		const uint64_t joined = base + j / 3;
		const uint64_t u = joined - mfs_rng_below(&g, joined < 2000 ? joined + 1 : 2000);
		mfs_event_t *e = &s->b.ev[j];
		if (str && u % 3 == 0) {
			int len = snprintf(s->names[j], sizeof s->names[j], "user-%llu", (unsigned long long)u);
			e->user = (mfs_id_t){MFS_ID_STR, (uint16_t)len, 0, s->names[j]};
		} else {
			e->user = mfs_id_u64(u + 1);
		}
		e->item = mfs_id_u64(1 + mfs_rng_below(&g, 5000));
		e->rating = 1.0f + 0.5f * (float)(j % 9); /* (distinct neighbours: a misplaced copy shows) */
		e->op = MFS_OP_RATE;
	}
}

static void free_batch(batchset_t *s)
{
	free(s->b.ev);
	free(s->b.del);
	free(s->b.del_at);
	free(s->names);
}

static mfs_model_t *new_model(int tracked, unsigned admit)
{
	mfs_model_conf_t c = {K, 0.1, 7};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&c, &m));
	if (tracked)
		TEST_OK(mfs_model_life(m, 1000000, 0));
	if (admit)
		TEST_OK(mfs_model_admit(m, admit, 1 << 16));
	return m;
}

static int same_model(const mfs_model_t *a, const mfs_model_t *b)
{
	if (a->n_users != b->n_users || a->n_items != b->n_items)
		return 0;
	return !memcmp(a->P, b->P, (size_t)a->n_users * K * sizeof(float)) &&
	       !memcmp(a->Q, b->Q, (size_t)a->n_items * K * sizeof(float)) &&
	       !memcmp(a->bu, b->bu, a->n_users * sizeof(float)) && !memcmp(a->bi, b->bi, a->n_items * sizeof(float));
}

static int same_touched(const mfs_touched_t *a, const mfs_touched_t *b)
{
	return a->n == b->n && !memcmp(a->rows, b->rows, a->n * sizeof *a->rows);
}

/* Resolve `nb` batches of n events with one thread and with `threads`, compare everything;
 * want_path: the path (rows.h steps[]) the pool's side must have taken for every batch. */
static uint64_t g_placed_many; /* the pooled side's r->placed_many after the last check_same */

static void check_same(size_t n, int nb, int str, int tracked, unsigned admit, int deletions, int threads,
                       int want_path)
{
	mfs_model_t *m1 = new_model(tracked, admit), *m2 = new_model(tracked, admit);
	mfs_rows_t r1, r2;
	TEST_OK(mfs_rows_init(&r1, m1, 1));
	TEST_OK(mfs_rows_init(&r2, m2, threads));
	TEST_OK(mfs_rows_start(&r1));
	TEST_OK(mfs_rows_start(&r2));
	TEST_ASSERT(r1.par == NULL && r2.par != NULL);
	for (int k = 0; k < nb; k++) {
		batchset_t s;
		make_batch(&s, n, 100 + (uint64_t)k, (uint64_t)k * n / 4, str);
		if (deletions) { /* one user deleted half way: its id's later events get a new row */
			s.b.del = calloc(1, sizeof *s.b.del);
			s.b.del_at = calloc(1, sizeof *s.b.del_at);
			s.b.del[0] = (mfs_event_t){.user = s.b.ev[0].user, .op = MFS_OP_DEL_USER};
			s.b.del_at[0] = n / 2;
			s.b.n_del = 1;
		}
		if (tracked) {
			mfs_model_begin_batch(m1, 1000 + (uint32_t)k);
			mfs_model_begin_batch(m2, 1000 + (uint32_t)k);
		}
		TEST_OK(mfs_rows_resolve(&r1, &s.b));
		TEST_OK(mfs_rows_resolve(&r2, &s.b));
		TEST_ASSERT_MSG(!memcmp(r1.u, r2.u, n * sizeof *r1.u), "batch %d: user rows differ", k);
		TEST_ASSERT_MSG(!memcmp(r1.i, r2.i, n * sizeof *r1.i), "batch %d: item rows differ", k);
		/* every path copies the ratings too (rows.h r->r), in event order */
		size_t off = 0;
		for (size_t j = 0; j < n; j++)
			off += (r1.r[j] != s.b.ev[j].rating) + (r2.r[j] != s.b.ev[j].rating);
		TEST_ASSERT_MSG(off == 0, "batch %d: %zu ratings copied wrong", k, off);
		free_batch(&s);
	}
	TEST_ASSERT_MSG(same_model(m1, m2), "models differ (users %u/%u)", m1->n_users, m2->n_users);
	TEST_ASSERT(same_touched(&r1.tu, &r2.tu) && same_touched(&r1.ti, &r2.ti));
	TEST_EQ_INT(r2.steps[want_path], nb);
	TEST_EQ_INT(r1.steps[2], nb); /* one thread: always the caller alone */
	/* the batches brought new ids: the test would pass vacuously without */
	TEST_ASSERT(m1->n_users > n / 8 && m1->n_items > 1000);
	g_placed_many = r2.placed_many;
	mfs_rows_free(&r1);
	mfs_rows_free(&r2);
	mfs_model_free(m1);
	mfs_model_free(m2);
}

/* Lookups begun ahead (mfs_rows_ahead) give the rows one thread gives: the next batch's after
 * each resolve (taken up), and, every third batch, lookups begun for the batch after next
 * (stale once the next one has placed its ids: resolve must drop them and look up again) or
 * cancelled. Not begun for a small batch, a tracked model, or while a started step runs. */
static void test_rows_ahead_same_rows(void)
{
	enum { NB = 9 };
	const size_t n = 20000;
	mfs_model_t *m1 = new_model(0, 0), *m2 = new_model(0, 0);
	mfs_rows_t r1, r2;
	TEST_OK(mfs_rows_init(&r1, m1, 1));
	TEST_OK(mfs_rows_init(&r2, m2, 4));
	TEST_OK(mfs_rows_start(&r1));
	TEST_OK(mfs_rows_start(&r2));
	TEST_EQ_INT(mfs_rows_ahead(&r1, NULL) , 0); /* (no pool: never; b not read) */
	batchset_t s[NB];
	for (int k = 0; k < NB; k++)
		make_batch(&s[k], n, 300 + (uint64_t)k, (uint64_t)k * n / 4, 0);
	uint64_t taken = 0;
	for (int k = 0; k < NB; k++) {
		TEST_OK(mfs_rows_resolve(&r1, &s[k].b));
		TEST_OK(mfs_rows_resolve(&r2, &s[k].b));
		TEST_ASSERT_MSG(!memcmp(r1.u, r2.u, n * sizeof *r1.u), "batch %d: user rows differ", k);
		TEST_ASSERT_MSG(!memcmp(r1.i, r2.i, n * sizeof *r1.i), "batch %d: item rows differ", k);
		size_t off = 0;
		for (size_t j = 0; j < n; j++)
			off += r2.r[j] != s[k].b.ev[j].rating;
		TEST_ASSERT_MSG(off == 0, "batch %d: %zu ratings copied wrong", k, off);
		if (k + 1 == NB)
			break;
		if (k % 3 == 1 && k + 2 < NB) { /* the batch after next: stale at its resolve */
			TEST_EQ_INT(mfs_rows_ahead(&r2, &s[k + 2].b), 1);
			TEST_EQ_INT(mfs_rows_ahead(&r2, &s[k + 1].b), 0); /* (one at a time) */
		} else if (k % 3 == 2) { /* begun, then cancelled */
			TEST_EQ_INT(mfs_rows_ahead(&r2, &s[k + 1].b), 1);
			mfs_rows_ahead_cancel(&r2, &s[k].b); /* (another batch's: nothing) */
			TEST_ASSERT(r2.ahead == &s[k + 1].b);
			mfs_rows_ahead_cancel(&r2, &s[k + 1].b);
			TEST_ASSERT(r2.ahead == NULL);
		} else {
			TEST_EQ_INT(mfs_rows_ahead(&r2, &s[k + 1].b), 1);
			taken++;
		}
	}
	TEST_EQ_INT(r2.aheads, NB - 1);
	TEST_EQ_INT(r2.ahead_used, taken);
	TEST_EQ_INT(r2.steps[0], NB);
	TEST_ASSERT_MSG(same_model(m1, m2), "models differ (users %u/%u)", m1->n_users, m2->n_users);
	TEST_ASSERT(same_touched(&r1.tu, &r2.tu) && same_touched(&r1.ti, &r2.ti));
	TEST_ASSERT(m1->n_users > n && m1->n_items > 1000); /* (new ids all along: not vacuous) */
	/* a small batch, a step begun elsewhere: not begun */
	batchset_t small;
	make_batch(&small, MFS_ROWS_SPLIT_MIN - 1, 9, 0, 0);
	TEST_EQ_INT(mfs_rows_ahead(&r2, &small.b), 0);
	g_hits = calloc(1000, sizeof *g_hits);
	mfs_par_start(r2.par, 1000, hit, NULL);
	TEST_EQ_INT(mfs_rows_ahead(&r2, &s[0].b), 0);
	mfs_par_wait(r2.par);
	free(g_hits);
	free_batch(&small);
	/* a tracked model: lookups may touch or expire rows, never ahead */
	mfs_model_t *m3 = new_model(1, 0);
	mfs_rows_t r3;
	TEST_OK(mfs_rows_init(&r3, m3, 4));
	TEST_OK(mfs_rows_start(&r3));
	TEST_EQ_INT(mfs_rows_ahead(&r3, &s[0].b), 0);
	mfs_rows_free(&r3);
	mfs_model_free(m3);
	/* freed with lookups ahead under way: waited for */
	TEST_EQ_INT(mfs_rows_ahead(&r2, &s[0].b), 1);
	mfs_rows_free(&r1);
	mfs_rows_free(&r2);
	for (int k = 0; k < NB; k++)
		free_batch(&s[k]);
	mfs_model_free(m1);
	mfs_model_free(m2);
}

/* (each batch brings new users and new items: both sides placed by the shards, every batch) */
static void test_three_steps_same_rows(void)
{
	check_same(20000, 4, 0, 0, 0, 0, 4, 0);
	TEST_ASSERT(g_placed_many > 4); /* users every batch, items while some are new */
	check_same(20000, 3, 0, 0, 0, 0, 2, 0);
	check_same(50000, 2, 0, 0, 0, 0, 8, 0);
	TEST_ASSERT(g_placed_many > 2);
}

static void test_three_steps_string_ids(void)
{
	check_same(20000, 3, 1, 0, 0, 0, 4, 0);
	TEST_ASSERT(g_placed_many > 3);
}

static void test_three_steps_admission(void)
{
	/* ids seen fewer than 2 times get no row (MFS_ROW_NONE), in the same events either way;
	 * admission decides id by id: no side is placed by the shards */
	check_same(20000, 3, 0, 0, 2, 0, 4, 0);
	TEST_EQ_INT(g_placed_many, 0);
}

/* A bound (model.max_users, new ids dropped when full, no tracking) and rows freed for reuse
 * (a deletion in an earlier batch): new ids do not simply take the next row, so step 2 takes
 * them one by one, and the rows are still those of one thread. */
static void test_three_steps_bound_and_free_rows(void)
{
	for (int c = 0; c < 2; c++) {
		mfs_model_t *m1 = new_model(0, 0), *m2 = new_model(0, 0);
		if (c == 0)
			m1->max_users = m2->max_users = 8000;
		mfs_rows_t r1, r2;
		TEST_OK(mfs_rows_init(&r1, m1, 1));
		TEST_OK(mfs_rows_init(&r2, m2, 4));
		TEST_OK(mfs_rows_start(&r2));
		size_t dropped = 0;
		for (int k = 0; k < 4; k++) {
			batchset_t s;
			make_batch(&s, 20000, 200 + (uint64_t)k, (uint64_t)k * 5000, 0);
			if (c == 1 && k == 1) { /* rows of deleted users go on the free list */
				s.b.del = calloc(300, sizeof *s.b.del);
				s.b.del_at = calloc(300, sizeof *s.b.del_at);
				for (size_t d = 0; d < 300; d++) {
					s.b.del[d] = (mfs_event_t){.user = s.b.ev[d * 20].user, .op = MFS_OP_DEL_USER};
					s.b.del_at[d] = s.b.n;
				}
				s.b.n_del = 300;
			}
			mfs_model_begin_batch(m1, 1000 + (uint32_t)k); /* (last batch's deletions: reusable rows) */
			mfs_model_begin_batch(m2, 1000 + (uint32_t)k);
			TEST_OK(mfs_rows_resolve(&r1, &s.b));
			TEST_OK(mfs_rows_resolve(&r2, &s.b));
			TEST_ASSERT_MSG(!memcmp(r1.u, r2.u, s.b.n * sizeof *r1.u), "case %d batch %d: user rows differ", c, k);
			TEST_ASSERT_MSG(!memcmp(r1.i, r2.i, s.b.n * sizeof *r1.i), "case %d batch %d: item rows differ", c, k);
			for (size_t j = 0; j < s.b.n; j++)
				dropped += r2.u[j] == MFS_ROW_NONE;
			free_batch(&s);
		}
		TEST_ASSERT_MSG(same_model(m1, m2), "case %d: models differ", c);
		TEST_ASSERT(same_touched(&r1.tu, &r2.tu) && same_touched(&r1.ti, &r2.ti));
		if (c == 0) /* the bound was reached: later new users dropped */
			TEST_ASSERT_MSG(m2->n_users == 8000 && dropped > 0, "users %u dropped %zu", m2->n_users, dropped);
		else /* the batch after the deletions reused the freed rows */
			TEST_ASSERT_MSG(m2->life[0]->n_free == 0 && mfs_idmap_live(m2->users) == m2->n_users, "free %zu live %u users %u",
			                m2->life[0]->n_free, mfs_idmap_live(m2->users), m2->n_users);
		/* items always took the shards' path, users only where nothing stood in the way */
		TEST_ASSERT_MSG(r2.placed_many >= 3 && r2.placed_many < 8, "placed many %llu", (unsigned long long)r2.placed_many);
		mfs_rows_free(&r1);
		mfs_rows_free(&r2);
		mfs_model_free(m1);
		mfs_model_free(m2);
	}
}

static void test_tracked_and_deletions_serial_sides(void)
{
	check_same(20000, 3, 0, 1, 0, 0, 4, 1);
	check_same(20000, 3, 0, 0, 0, 1, 4, 1);
}

static void test_small_batch_on_caller(void) { check_same(MFS_ROWS_SPLIT_MIN - 1, 3, 0, 0, 0, 0, 4, 2); }

/* Rows at and above engine_init_from are the engine's to draw (store.h): the host leaves their
 * factors zero on every path, and draws the rows below as before. */
static void test_engine_draws_new_rows(void)
{
	for (int threads = 1; threads <= 4; threads += 3) {
		mfs_model_t *m = new_model(0, 0), *ref = new_model(0, 0);
		mfs_rows_t r, rr;
		TEST_OK(mfs_rows_init(&r, m, threads));
		TEST_OK(mfs_rows_init(&rr, ref, 1));
		TEST_OK(mfs_rows_start(&r));
		batchset_t s;
		make_batch(&s, 20000, 5, 0, 0);
		TEST_OK(mfs_rows_resolve(&r, &s.b));
		TEST_OK(mfs_rows_resolve(&rr, &s.b));
		const uint32_t from = m->n_users;
		m->engine_init_from[0] = from;
		free_batch(&s);
		make_batch(&s, 20000, 6, 20000, 0);
		TEST_OK(mfs_rows_resolve(&r, &s.b));
		TEST_OK(mfs_rows_resolve(&rr, &s.b));
		TEST_ASSERT(m->n_users > from + 1000 && m->n_users == ref->n_users);
		size_t nonzero = 0;
		for (size_t x = (size_t)from * K; x < (size_t)m->n_users * K; x++)
			nonzero += m->P[x] != 0.0f;
		TEST_EQ_INT(nonzero, 0);
		TEST_ASSERT(!memcmp(m->P, ref->P, (size_t)from * K * sizeof *m->P));
		TEST_ASSERT(!memcmp(m->Q, ref->Q, (size_t)m->n_items * K * sizeof *m->Q)); /* items: host as before */
		size_t bias = 0;
		for (uint32_t x = 0; x < m->n_users; x++)
			bias += m->bu[x] != 0.0f;
		TEST_EQ_INT(bias, 0);
		free_batch(&s);
		mfs_rows_free(&r);
		mfs_rows_free(&rr);
		mfs_model_free(m);
		mfs_model_free(ref);
	}
}

int main(void)
{
	TEST_RUN(test_par_every_task_once);
	TEST_RUN(test_par_start_wait);
	TEST_RUN(test_par_held_worker);
	TEST_RUN(test_three_steps_same_rows);
	TEST_RUN(test_rows_ahead_same_rows);
	TEST_RUN(test_three_steps_string_ids);
	TEST_RUN(test_three_steps_admission);
	TEST_RUN(test_three_steps_bound_and_free_rows);
	TEST_RUN(test_tracked_and_deletions_serial_sides);
	TEST_RUN(test_small_batch_on_caller);
	TEST_RUN(test_engine_draws_new_rows);
	return TEST_REPORT();
}
