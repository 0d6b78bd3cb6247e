/* par.c - see par.h.
 *
 * DESIGN: one job slot (fn, arg, n) and a generation number under a mutex; a worker that sees
 * a new generation takes task numbers until they run out, then sleeps until the next one. The
 * caller takes tasks too, then waits until every task has *finished* (a task may still run on a
 * worker after the numbers ran out): it never waits for a worker that took none, so a worker
 * the scheduler has not run yet (cores busy elsewhere) holds up nothing. Each task number is
 * taken with the job's generation in the same atomic word (the generation's low 32 bits above
 * the task's 32), by compare-and-swap: a worker that woke for a job already over finds another
 * generation there and takes nothing from the job after it. Workers sleep on a condition
 * variable between jobs: a step costs one broadcast and a wake per worker (~10-50 us), so
 * callers use the pool for steps of a millisecond or more. A step begun with mfs_par_start is
 * the same job with the caller taking its tasks only once it waits (those left then); `pending`
 * says a wait is owed before the next job.
 */
#include "common/par.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/thread.h"

struct mfs_par {
	int threads; /* counting the caller */
	pthread_t *tid;
	int started;
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	unsigned long gen; /* job number; a worker runs each once */
	int quit;
	int pending;       /* a job from mfs_par_start not waited for yet */
	uint32_t pending_gen; /* its generation's low bits */
	int waiting;       /* the caller sleeps on `done` */
	mfs_par_fn fn;
	void *arg;
	size_t n;
	_Atomic uint64_t next;     /* (gen's low 32 bits) << 32 | the next task number */
	atomic_size_t finished;    /* tasks of the current job that have returned */
	char name[12];
	int seq;           /* worker numbering at start */
};

/* The next task of job `g` (n tasks) into *t; 0 when they ran out or the job is over. */
static int claim(mfs_par_t *p, uint32_t g, size_t n, size_t *t)
{
	uint64_t v = atomic_load_explicit(&p->next, memory_order_relaxed);
	for (;;) {
		if ((uint32_t)(v >> 32) != g || (v & UINT32_MAX) >= n)
			return 0;
		if (atomic_compare_exchange_weak_explicit(&p->next, &v, v + 1, memory_order_relaxed, memory_order_relaxed)) {
			*t = (size_t)(v & UINT32_MAX);
			return 1;
		}
	}
}

static void take_tasks(mfs_par_t *p, uint32_t g, mfs_par_fn fn, void *arg, size_t n)
{
	for (size_t t; claim(p, g, n, &t);) {
		fn(arg, t);
		/* (release: what the task wrote is seen by the caller that reads `finished`) */
		if (atomic_fetch_add_explicit(&p->finished, 1, memory_order_acq_rel) + 1 == n) {
			pthread_mutex_lock(&p->mu);
			if (p->waiting)
				pthread_cond_signal(&p->done);
			pthread_mutex_unlock(&p->mu);
		}
	}
}

static void (*g_on_wake)(void); /* mfs_par_test_on_wake */

void mfs_par_test_on_wake(void (*fn)(void)) { g_on_wake = fn; }

static void *worker(void *a)
{
	mfs_par_t *p = a;
	char nm[16];
	pthread_mutex_lock(&p->mu);
	snprintf(nm, sizeof nm, "%s-%d", p->name, p->seq++);
	mfs_thread_name(nm);
	unsigned long seen = 0; /* jobs are numbered from 1: a worker that starts late still runs the first */
	for (;;) {
		while (!p->quit && p->gen == seen)
			pthread_cond_wait(&p->go, &p->mu);
		if (p->quit)
			break;
		seen = p->gen;
		mfs_par_fn fn = p->fn;
		void *arg = p->arg;
		size_t n = p->n;
		pthread_mutex_unlock(&p->mu);
		if (g_on_wake)
			g_on_wake();
		take_tasks(p, (uint32_t)seen, fn, arg, n);
		pthread_mutex_lock(&p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int mfs_par_init(mfs_par_t **out, int threads, const char *name)
{
	*out = NULL;
	mfs_par_t *p = calloc(1, sizeof *p);
	if (!p)
		return ENOMEM;
	p->threads = threads < 1 ? 1 : threads;
	snprintf(p->name, sizeof p->name, "%s", name ? name : "mfs-par");
	int rc = pthread_mutex_init(&p->mu, NULL);
	if (rc) {
		free(p);
		return rc;
	}
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	if (p->threads > 1 && !(p->tid = calloc((size_t)p->threads - 1, sizeof *p->tid))) {
		mfs_par_free(p);
		return ENOMEM;
	}
	for (int w = 0; w < p->threads - 1; w++) {
		if ((rc = pthread_create(&p->tid[w], NULL, worker, p))) {
			mfs_par_free(p);
			return rc;
		}
		p->started++;
	}
	*out = p;
	return 0;
}

int mfs_par_threads(const mfs_par_t *p) { return p ? p->threads : 1; }

/* Hand job (fn, arg, n) to the workers (the pool has some, and no job is under way); its
 * generation's low bits, for the caller's own claims. */
static uint32_t post(mfs_par_t *p, size_t n, mfs_par_fn fn, void *arg)
{
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->arg = arg;
	p->n = n;
	p->gen++;
	const uint32_t g = (uint32_t)p->gen;
	atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
	atomic_store_explicit(&p->next, (uint64_t)g << 32, memory_order_relaxed);
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	return g;
}

/* Until every task of the job has returned (not every worker: one not yet woken took none). */
static void wait_tasks(mfs_par_t *p)
{
	const size_t n = p->n; /* (the caller's own job: set by post) */
	for (int spin = 0; spin < 256; spin++)
		if (atomic_load_explicit(&p->finished, memory_order_acquire) == n)
			return;
	pthread_mutex_lock(&p->mu);
	p->waiting = 1;
	while (atomic_load_explicit(&p->finished, memory_order_acquire) != n)
		pthread_cond_wait(&p->done, &p->mu);
	p->waiting = 0;
	pthread_mutex_unlock(&p->mu);
}

void mfs_par_run(mfs_par_t *p, size_t n, mfs_par_fn fn, void *arg)
{
	if (!n)
		return;
	mfs_par_wait(p);
	if (!p || p->started == 0 || n == 1) {
		for (size_t t = 0; t < n; t++)
			fn(arg, t);
		return;
	}
	const uint32_t g = post(p, n, fn, arg);
	take_tasks(p, g, fn, arg, n);
	wait_tasks(p);
}

void mfs_par_start(mfs_par_t *p, size_t n, mfs_par_fn fn, void *arg)
{
	if (!n)
		return;
	mfs_par_wait(p);
	if (!p || p->started == 0) {
		for (size_t t = 0; t < n; t++)
			fn(arg, t);
		return;
	}
	p->pending_gen = post(p, n, fn, arg);
	p->pending = 1;
}

int mfs_par_pending(const mfs_par_t *p) { return p && p->pending; }

void mfs_par_wait(mfs_par_t *p)
{
	if (!p || !p->pending)
		return;
	take_tasks(p, p->pending_gen, p->fn, p->arg, p->n); /* (what the workers have not taken yet) */
	wait_tasks(p);
	p->pending = 0;
}

void mfs_par_free(mfs_par_t *p)
{
	if (!p)
		return;
	mfs_par_wait(p);
	pthread_mutex_lock(&p->mu);
	p->quit = 1;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	for (int w = 0; w < p->started; w++)
		pthread_join(p->tid[w], NULL);
	free(p->tid);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	free(p);
}
