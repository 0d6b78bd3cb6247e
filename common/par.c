/* par.c - see par.h.
 *
 * DESIGN: one job slot (fn, arg, n) and a generation number under a mutex; a worker that sees
 * a new generation takes task numbers from an atomic counter until they run out, then counts
 * itself done. The caller takes tasks too, then waits until every worker of that generation
 * has finished its last task (a task may still run on a worker after the counter ran out).
 * Workers sleep on a condition variable between jobs: a step costs one broadcast and one wake
 * per worker (~10-50 us), so callers use the pool for steps of a millisecond or more. A step
 * begun with mfs_par_start is the same job without the caller taking tasks; `pending` says a
 * wait is owed before the next job.
 */
#include "common/par.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
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
	int busy;          /* workers still in the current job */
	int pending;       /* a job from mfs_par_start not waited for yet */
	mfs_par_fn fn;
	void *arg;
	size_t n;
	atomic_size_t next; /* next task to hand out */
	char name[12];
	int seq;           /* worker numbering at start */
};

static void take_tasks(mfs_par_t *p, mfs_par_fn fn, void *arg, size_t n)
{
	for (size_t t; (t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < n;)
		fn(arg, t);
}

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
		take_tasks(p, fn, arg, n);
		pthread_mutex_lock(&p->mu);
		if (--p->busy == 0)
			pthread_cond_signal(&p->done);
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

/* Hand job (fn, arg, n) to the workers (the pool has some, and no job is under way). */
static void post(mfs_par_t *p, size_t n, mfs_par_fn fn, void *arg)
{
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->arg = arg;
	p->n = n;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	p->busy = p->started;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
}

static void wait_workers(mfs_par_t *p)
{
	pthread_mutex_lock(&p->mu);
	while (p->busy)
		pthread_cond_wait(&p->done, &p->mu);
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
	post(p, n, fn, arg);
	take_tasks(p, fn, arg, n);
	wait_workers(p);
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
	post(p, n, fn, arg);
	p->pending = 1;
}

void mfs_par_wait(mfs_par_t *p)
{
	if (!p || !p->pending)
		return;
	wait_workers(p);
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
