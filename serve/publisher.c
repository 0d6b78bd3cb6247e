/* publisher.c - see publisher.h.
 *
 * DESIGN: one mutex and one condition variable guard the job's state (idle, posted, done);
 * the job's contents belong to the learner while idle or done and to this thread while posted,
 * so they need no lock of their own.
 */
#include "serve/publisher.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/thread.h"
#include "common/timeutil.h"

enum { JOB_IDLE, JOB_POSTED, JOB_DONE };

struct mfs_publisher {
	mfs_publisher_conf_t conf;
	mfs_snap_writer_t *w;
	mfs_engine_t *e;
	pthread_t thread;
	int started, quit, state;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	mfs_pubjob_t job;
};

int mfs_publisher_open(const mfs_publisher_conf_t *conf, mfs_publisher_t **out, char *errstr, size_t es)
{
	*out = NULL;
	mfs_publisher_t *p = calloc(1, sizeof *p);
	if (!p)
		return mfs_errf(errstr, es, ENOMEM, "out of memory");
	p->conf = *conf;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	int rc = mfs_snap_writer_open_sync(conf->dir, conf->map_size, (mfs_snap_sync_t)conf->sync, &p->w, errstr, es);
	if (rc) {
		mfs_publisher_close(p);
		return rc;
	}
	*out = p;
	return 0;
}

/* The thread: publishes each posted job in one LMDB txn, off the learner's path. */
static void *publisher_main(void *arg)
{
	mfs_publisher_t *p = arg;
	mfs_thread_name("mfs-snapwriter");
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (p->state != JOB_POSTED && !p->quit)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->state != JOB_POSTED)
			break;
		pthread_mutex_unlock(&p->mu);
		mfs_pubjob_t *j = &p->job;
		mfs_snap_info_t info = {
			.learning_rate = j->lr, .last_loss = j->last_loss, .rating_min = p->conf.rating_min,
			.rating_max = p->conf.rating_max, .offsets = j->offs, .n_offsets = j->n_offs,
			.extra = j->meta.ex, .n_extra = j->n_meta,
		};
		j->err[0] = '\0';
		if (p->conf.publish_delay_ms > 0)
			mfs_sleep_ms(p->conf.publish_delay_ms);
		/* the rows' values: a device engine's copy to the host ends here (mfs_engine_capture) */
		const double tw = mfs_now_s();
		int crc = mfs_engine_capture_wait(p->e);
		j->t0 = mfs_now_s();
		j->capture_s = j->t0 - tw;
		double ph0[MFS_SNAP_PH__COUNT], ph1[MFS_SNAP_PH__COUNT];
		mfs_snap_writer_phases(p->w, ph0);
		if (crc)
			j->rc = mfs_errf(j->err, sizeof j->err, crc, "engine capture: %s", mfs_strerror(crc));
		else
			j->rc = mfs_snap_publish_stage(p->w, j->stage, &info, &j->seq, j->err, sizeof j->err);
		j->t1 = mfs_now_s();
		j->commit_ms = mfs_wall_ms();
		mfs_snap_writer_phases(p->w, ph1);
		for (int x = 0; x < MFS_SNAP_PH__COUNT; x++)
			j->phase_s[x] = ph1[x] - ph0[x];
#ifdef __GLIBC__
		/* give the heap's free pages back: a publish frees a snapshot's worth of LMDB dirty
		 * pages and the batches' messages in many small blocks, which glibc otherwise keeps
		 * (under an id flood the process grew ~1 MiB/s without this, flat with it; off the
		 * learner's path, on this thread) */
		const double tt = mfs_now_s();
		malloc_trim(0);
		j->trim_s = mfs_now_s() - tt;
#endif
		pthread_mutex_lock(&p->mu);
		p->state = JOB_DONE;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int mfs_publisher_start(mfs_publisher_t *p, mfs_engine_t *e)
{
	p->e = e;
	int rc = pthread_create(&p->thread, NULL, publisher_main, p);
	p->started = rc == 0;
	return rc;
}

mfs_pubjob_t *mfs_publisher_job(mfs_publisher_t *p)
{
	return &p->job;
}

void mfs_publisher_post(mfs_publisher_t *p)
{
	pthread_mutex_lock(&p->mu);
	p->state = JOB_POSTED;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int mfs_publisher_busy(mfs_publisher_t *p)
{
	pthread_mutex_lock(&p->mu);
	int busy = p->state == JOB_POSTED;
	pthread_mutex_unlock(&p->mu);
	return busy;
}

mfs_pubjob_t *mfs_publisher_take(mfs_publisher_t *p, int wait)
{
	pthread_mutex_lock(&p->mu);
	while (wait && p->state == JOB_POSTED)
		pthread_cond_wait(&p->cv, &p->mu);
	int done = p->state == JOB_DONE;
	if (done)
		p->state = JOB_IDLE;
	pthread_mutex_unlock(&p->mu);
	return done ? &p->job : NULL;
}

void mfs_publisher_stop(mfs_publisher_t *p)
{
	if (!p || !p->started)
		return;
	pthread_mutex_lock(&p->mu);
	p->quit = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	p->started = 0;
}

void mfs_publisher_close(mfs_publisher_t *p)
{
	if (!p)
		return;
	mfs_publisher_stop(p);
	mfs_snap_writer_close(p->w);
	mfs_snap_stage_free(p->job.stage);
	free(p->job.offs);
	free(p->job.pend_ts);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}
