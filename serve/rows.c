/* rows.c - see rows.h. */
#include "serve/rows.h"

#include <errno.h>
#include <stdlib.h>

#include "common/grow.h"
#include "common/thread.h"
#include "model_store/life.h"

enum { ROWS_IDLE, ROWS_POSTED, ROWS_DONE };

int mfs_rows_init(mfs_rows_t *r, mfs_model_t *m)
{
	*r = (mfs_rows_t){0};
	r->m = m;
	int rc = pthread_mutex_init(&r->mu, NULL);
	if (rc)
		return rc;
	if ((rc = pthread_cond_init(&r->cv, NULL)))
		pthread_mutex_destroy(&r->mu);
	return rc;
}

/* One side of a batch (0 users, 1 items): its events' rows in event order, new ids added and
 * initialized, and the rows marked touched. Touches only that side's half of the model and its
 * own arrays, so the two sides can run at once. */
static int side_rows(mfs_rows_t *r, int side, const mfs_ebatch_t *b)
{
	uint32_t *rows = side ? r->i : r->u;
	mfs_touched_t *t = side ? &r->ti : &r->tu;
	const size_t stride = sizeof *b->ev;
	const char *ids = b->n ? (const char *)(side ? &b->ev[0].item : &b->ev[0].user) : NULL;
	size_t a = 0;
	int rc;
	/* deletions of this side's ids at their place among the ratings (model_store/life.h) */
	for (size_t d = 0; d < b->n_del; d++) {
		const mfs_event_t *de = &b->del[d];
		if ((de->op == MFS_OP_DEL_ITEM) != side)
			continue;
		const size_t at = b->del_at[d];
		if (at > a && (rc = mfs_model_rows(r->m, side, (const mfs_id_t *)(ids + a * stride), stride, at - a, rows + a)))
			return rc;
		if (at > a)
			a = at;
		if ((rc = mfs_model_delete(r->m, side, side ? &de->item : &de->user)) < 0)
			return -rc;
	}
	if (b->n > a && (rc = mfs_model_rows(r->m, side, (const mfs_id_t *)(ids + a * stride), stride, b->n - a, rows + a)))
		return rc;
	return mfs_touched_mark_many(t, rows, b->n);
}

static void *rows_main(void *arg)
{
	mfs_rows_t *r = arg;
	mfs_thread_name("mfs-rows");
	pthread_mutex_lock(&r->mu);
	for (;;) {
		while (!r->quit && r->state != ROWS_POSTED)
			pthread_cond_wait(&r->cv, &r->mu);
		if (r->quit)
			break;
		const mfs_ebatch_t *b = r->batch;
		pthread_mutex_unlock(&r->mu);
		int rc = side_rows(r, 0, b);
		pthread_mutex_lock(&r->mu);
		r->rc = rc;
		r->state = ROWS_DONE;
		pthread_cond_broadcast(&r->cv);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

void mfs_rows_start(mfs_rows_t *r)
{
	r->started = pthread_create(&r->thread, NULL, rows_main, r) == 0;
}

int mfs_rows_resolve(mfs_rows_t *r, const mfs_ebatch_t *b)
{
	if (!b->n && !b->n_del)
		return 0;
	if (mfs_grow((void **)&r->u, &r->cap_u, b->n, sizeof *r->u) || mfs_grow((void **)&r->i, &r->cap_i, b->n, sizeof *r->i))
		return ENOMEM;
	if (!r->started || b->n < MFS_ROWS_SPLIT_MIN) {
		int rc = side_rows(r, 0, b);
		return rc ? rc : side_rows(r, 1, b);
	}
	pthread_mutex_lock(&r->mu);
	r->batch = b;
	r->state = ROWS_POSTED;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	int rc = side_rows(r, 1, b);
	pthread_mutex_lock(&r->mu);
	while (r->state != ROWS_DONE)
		pthread_cond_wait(&r->cv, &r->mu);
	r->state = ROWS_IDLE;
	int urc = r->rc;
	pthread_mutex_unlock(&r->mu);
	return urc ? urc : rc;
}

void mfs_rows_stop(mfs_rows_t *r)
{
	if (!r->started)
		return;
	pthread_mutex_lock(&r->mu);
	r->quit = 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->thread, NULL);
	r->started = 0;
}

void mfs_rows_free(mfs_rows_t *r)
{
	mfs_rows_stop(r);
	free(r->u);
	free(r->i);
	mfs_touched_free(&r->tu);
	mfs_touched_free(&r->ti);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
}
