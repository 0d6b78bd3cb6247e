/* par.h - a small pool of worker threads for "parallel for" steps of one thread's work: the
 * caller runs fn(arg, task) for task = 0 .. n-1 (n < 2^32), spread over the workers and itself,
 * and returns when every task has run. Tasks are handed out one at a time through an atomic
 * counter, so uneven tasks balance; a pool runs one such step at a time (its one caller). The
 * caller waits for tasks, not for workers: a worker the scheduler has not run yet (its cores busy
 * with other work) holds up nothing, it takes no task of a step that is over.
 *
 * Used where a thread's step is many independent pieces (serve/rows.c: id lookups of a batch,
 * initial rows of new ids). A pool of 1 thread has no workers: mfs_par_run runs the tasks in
 * order on the caller, the same results with no hand-over.
 */
#ifndef MFS_COMMON_PAR_H
#define MFS_COMMON_PAR_H

#include <stddef.h>

typedef struct mfs_par mfs_par_t;
typedef void (*mfs_par_fn)(void *arg, size_t task);

/** A pool of `threads` (>= 1) threads counting the caller: threads - 1 workers named
 *  name-0, name-1, ... @return 0, ENOMEM or a pthread error. */
int mfs_par_init(mfs_par_t **out, int threads, const char *name);
/** The threads of the pool, the caller counted. */
int mfs_par_threads(const mfs_par_t *p);
/** fn(arg, t) for every t < n; returns when all have returned. One caller at a time. */
void mfs_par_run(mfs_par_t *p, size_t n, mfs_par_fn fn, void *arg);
/** The same on the workers, returning at once: the caller goes on with other work and calls
 *  mfs_par_wait before it uses what the tasks write (and there takes any task left) (a pool without workers runs them
 *  here). mfs_par_run and mfs_par_free wait for a started step first. */
void mfs_par_start(mfs_par_t *p, size_t n, mfs_par_fn fn, void *arg);
/** 1 while a step begun with mfs_par_start has not been waited for (a next step would wait). */
int mfs_par_pending(const mfs_par_t *p);
/** Return when the step mfs_par_start began has run every task (at once if none is under way).
 *  The caller takes the tasks no worker has taken yet, then waits for those under way. */
void mfs_par_wait(mfs_par_t *p);
/** Tests: fn (NULL: none) runs on a worker when it has seen a job, before it takes a task (a
 *  test holds a worker there, as the scheduler may). Set it while no pool runs. */
void mfs_par_test_on_wake(void (*fn)(void));
/** Stop and join the workers (idle), and free the pool. NULL is a no-op. */
void mfs_par_free(mfs_par_t *p);

#endif
