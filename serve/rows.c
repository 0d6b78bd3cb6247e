/* rows.c - see rows.h. */
#include "serve/rows.h"

#include <errno.h>
#include <stdlib.h>

#include "common/grow.h"
#include "common/timeutil.h"
#include "model_store/life.h"

#define LOOKUP_CHUNK 4096 /* events per lookup task (step 1) */
#define FRESH_CHUNK 256   /* new rows per task (step 3): ~0.3 ms of Box-Muller at k = 128 */
#define AHEAD 8           /* lookups between a slot's prefetch and its probe */

int mfs_rows_init(mfs_rows_t *r, mfs_model_t *m, int threads)
{
	*r = (mfs_rows_t){0};
	r->m = m;
	r->threads = threads < 1 ? 1 : threads;
	return 0;
}

static inline const mfs_id_t *side_id(const mfs_ebatch_t *b, int side, size_t j)
{
	return side ? &b->ev[j].item : &b->ev[j].user;
}

/* r->r[a, e) = the ratings of events [a, e) (rows.h) */
static void copy_ratings(mfs_rows_t *r, const mfs_ebatch_t *b, size_t a, size_t e)
{
	for (size_t j = a; j < e; j++)
		r->r[j] = b->ev[j].rating;
}

/* One side of a batch (0 users, 1 items) on one thread: its events' rows in event order, new
 * ids added and initialized, and the rows marked touched. Touches only that side's half of the
 * model and its own arrays, so the two sides can run at once. */
static int side_rows(mfs_rows_t *r, int side, const mfs_ebatch_t *b)
{
	uint32_t *rows = side ? r->i : r->u;
	mfs_touched_t *t = side ? &r->ti : &r->tu;
	const size_t stride = sizeof *b->ev;
	if (!side)
		copy_ratings(r, b, 0, b->n);
	const char *ids = b->n ? (const char *)side_id(b, side, 0) : NULL;
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

static void side_task(void *arg, size_t side)
{
	mfs_rows_t *r = arg;
	r->rc[side] = side_rows(r, (int)side, r->batch);
}

/* Step 1: a chunk of one side's lookups (task = side * chunks + chunk), of r->look's batch
 * into r->look's arrays. */
static void lookup_task(void *arg, size_t task)
{
	mfs_rows_t *r = arg;
	const mfs_ebatch_t *b = r->look.b;
	const size_t chunks = (b->n + LOOKUP_CHUNK - 1) / LOOKUP_CHUNK;
	const int side = task >= chunks;
	const size_t a = (task % chunks) * LOOKUP_CHUNK, e = a + LOOKUP_CHUNK < b->n ? a + LOOKUP_CHUNK : b->n;
	uint64_t *h = r->look.h[side];
	uint32_t *rows = side ? r->look.i : r->look.u;
	const mfs_idmap_t *map = side ? r->m->items : r->m->users;
	for (size_t j = a; j < e; j++)
		h[j] = mfs_idmap_hash(side_id(b, side, j));
	if (!side) /* (the event's user id and its rating share its cache lines) */
		for (size_t j = a; j < e; j++)
			r->look.r[j] = b->ev[j].rating;
	for (size_t j = a; j < e && j < a + AHEAD; j++)
		mfs_idmap_prefetch(map, h[j]);
	for (size_t j = a; j < e; j++) {
		if (j + AHEAD < e)
			mfs_idmap_prefetch(map, h[j + AHEAD]);
		rows[j] = mfs_model_find_h(r->m, side, side_id(b, side, j), h[j]);
	}
}

/* Step 2, a side whose new ids must come one at a time (mfs_model_add_many_ok 0): its ids that
 * the lookups did not find, in event order (an id new to the model twice in the batch gets its
 * row at the first and is found at the second), then the touched marks. Each one's slot is
 * prefetched AHEAD ids early. */
static void add_serial(mfs_rows_t *r, int side)
{
	const mfs_ebatch_t *b = r->batch;
	uint32_t *rows = side ? r->i : r->u;
	const uint64_t *h = r->h[side];
	const mfs_idmap_t *map = side ? r->m->items : r->m->users;
	const uint32_t *miss = r->miss[side];
	const size_t nm = r->n_miss[side];
	int rc = 0;
	for (size_t x = 0; x < nm && x < AHEAD; x++)
		mfs_idmap_prefetch(map, h[miss[x]]);
	for (size_t x = 0; x < nm && !rc; x++) {
		const size_t j = miss[x];
		if (x + AHEAD < nm)
			mfs_idmap_prefetch(map, h[miss[x + AHEAD]]);
		int fresh;
		if ((rc = mfs_model_row_h(r->m, side, side_id(b, side, j), h[j], &rows[j], &fresh)) || !fresh)
			continue;
		if (mfs_grow((void **)&r->fresh[side], &r->cap_fresh[side], r->n_fresh[side] + 1, sizeof *r->fresh[side]))
			rc = ENOMEM;
		else
			r->fresh[side][r->n_fresh[side]++] = rows[j];
	}
	r->rc[side] = rc ? rc : mfs_touched_mark_many(side ? &r->ti : &r->tu, rows, b->n);
}

/* Step 2 tasks: per side, one (serial) or one per shard of the map (many at once) or none. */
static size_t place_tasks(const mfs_rows_t *r, int side)
{
	return !r->many[side] ? 1 : r->n_miss[side] && !r->rc[side] ? MFS_IDMAP_SHARDS : 0;
}

static void place_task(void *arg, size_t task)
{
	mfs_rows_t *r = arg;
	const size_t t0 = place_tasks(r, 0);
	const int side = task >= t0;
	if (side)
		task -= t0;
	if (!r->many[side])
		add_serial(r, side);
	else
		mfs_idmap_add_shard(side ? r->m->items : r->m->users, &r->add[side], (unsigned)task);
}

/* Step 3 tasks: the touched marks of each side added many at once, then their slots named, a
 * task per shard, then the new rows' values in chunks (users' first). */
static void finish_task(void *arg, size_t task)
{
	mfs_rows_t *r = arg;
	for (int side = 0; side < 2; side++) {
		if (!r->many[side])
			continue;
		if (task == 0) {
			int rc = mfs_touched_mark_many(side ? &r->ti : &r->tu, side ? r->i : r->u, r->batch->n);
			if (!r->rc[side])
				r->rc[side] = rc;
			return;
		}
		task--;
	}
	for (int side = 0; side < 2; side++) {
		if (!r->many[side] || !r->add[side].n_new)
			continue;
		if (task < MFS_IDMAP_SHARDS) {
			mfs_idmap_add_end(side ? r->m->items : r->m->users, &r->add[side], side ? r->i : r->u, (unsigned)task);
			return;
		}
		task -= MFS_IDMAP_SHARDS;
	}
	const size_t cu = (r->n_fresh[0] + FRESH_CHUNK - 1) / FRESH_CHUNK;
	const int side = task >= cu;
	const size_t a = (side ? task - cu : task) * FRESH_CHUNK, n = r->n_fresh[side];
	for (size_t j = a; j < n && j < a + FRESH_CHUNK; j++)
		mfs_model_init_fresh(r->m, side, r->fresh[side][j]);
}

/* Step 2 on the caller, before the pool places the ids: each side's events whose id the lookups
 * did not find, and for a side whose new ids may come many at once, room for all of them. */
static void gather(mfs_rows_t *r, int side)
{
	const mfs_ebatch_t *b = r->batch;
	const uint32_t *rows = side ? r->i : r->u;
	uint32_t *miss = r->miss[side];
	size_t nm = 0;
	for (size_t j = 0; j < b->n; j++)
		if (rows[j] == MFS_ROW_NONE)
			miss[nm++] = (uint32_t)j;
	r->n_miss[side] = nm;
	r->n_fresh[side] = 0;
	r->many[side] = !r->one_by_one && mfs_model_add_many_ok(r->m, side);
	if (!r->many[side] || !nm)
		return;
	mfs_idmap_add_t *a = &r->add[side];
	a->n = nm;
	a->base = (const char *)side_id(b, side, 0);
	a->stride = sizeof *b->ev;
	a->idx = miss;
	a->h = r->h[side];
	/* (room in the fresh list for every candidate too, so that numbering cannot fail) */
	if (!(r->rc[side] = mfs_model_add_begin(r->m, side, a)) &&
	    mfs_grow((void **)&r->fresh[side], &r->cap_fresh[side], nm, sizeof *r->fresh[side]))
		r->rc[side] = ENOMEM;
}

/* Step 2 on the caller, after the pool placed them: the rows, numbered in event order. */
static void number(mfs_rows_t *r, int side)
{
	mfs_idmap_add_t *a = &r->add[side];
	a->n_new = 0;
	if (!r->many[side] || !r->n_miss[side] || r->rc[side])
		return;
	const uint32_t nn = mfs_model_add_number(r->m, side, a, side ? r->i : r->u);
	r->placed_many++;
	const uint32_t from = r->m->engine_init_from[side];
	const uint32_t end = a->n0 + nn < from ? a->n0 + nn : from < a->n0 ? a->n0 : from;
	for (uint32_t row = a->n0; row < end; row++) /* (room: gather) */
		r->fresh[side][r->n_fresh[side]++] = row;
}

int mfs_rows_start(mfs_rows_t *r)
{
	if (r->par || r->threads < 2)
		return 0;
	return mfs_par_init(&r->par, r->threads, "mfs-rows");
}

/* The three-step path's condition (rows.h): the lookups only read the maps. */
static int three_steps(const mfs_rows_t *r, const mfs_ebatch_t *b)
{
	return r->par && b->n >= MFS_ROWS_SPLIT_MIN && !r->m->track && !b->n_del && !r->sides_only;
}

/* Point step 1 (lookup_task) at batch b and the arrays it fills; @return its task count. */
static size_t look_at(mfs_rows_t *r, const mfs_ebatch_t *b, uint32_t *u, uint32_t *i, float *rt, uint64_t *h0,
                      uint64_t *h1)
{
	r->look.b = b;
	r->look.u = u;
	r->look.i = i;
	r->look.r = rt;
	r->look.h[0] = h0;
	r->look.h[1] = h1;
	return 2 * ((b->n + LOOKUP_CHUNK - 1) / LOOKUP_CHUNK);
}

#define SWAP(T, x, y) \
	do { \
		T t_ = (x); \
		(x) = (y); \
		(y) = t_; \
	} while (0)

int mfs_rows_ahead(mfs_rows_t *r, const mfs_ebatch_t *b)
{
	if (r->ahead || !three_steps(r, b) || mfs_par_threads(r->par) < 2 || mfs_par_pending(r->par))
		return 0;
	if (mfs_grow((void **)&r->au, &r->cap_au, b->n, sizeof *r->au) || mfs_grow((void **)&r->ai, &r->cap_ai, b->n, sizeof *r->ai) ||
	    mfs_grow((void **)&r->ar, &r->cap_ar, b->n, sizeof *r->ar) ||
	    mfs_grow((void **)&r->ah[0], &r->cap_ah[0], b->n, sizeof *r->ah[0]) ||
	    mfs_grow((void **)&r->ah[1], &r->cap_ah[1], b->n, sizeof *r->ah[1]))
		return 0; /* (resolve looks them up) */
	const size_t tasks = look_at(r, b, r->au, r->ai, r->ar, r->ah[0], r->ah[1]);
	r->ahead = b;
	r->aheads++;
	mfs_par_start(r->par, tasks, lookup_task, r);
	return 1;
}

void mfs_rows_ahead_cancel(mfs_rows_t *r, const mfs_ebatch_t *b)
{
	if (!r->ahead || (b && r->ahead != b))
		return;
	mfs_par_wait(r->par);
	r->ahead = NULL;
}

/* Lookups begun ahead: waited for, and when they are b's, their arrays become the batch's.
 * @return 1 when b's step 1 is done. */
static int take_ahead(mfs_rows_t *r, const mfs_ebatch_t *b)
{
	if (!r->ahead)
		return 0;
	const int mine = r->ahead == b;
	mfs_rows_ahead_cancel(r, NULL);
	if (!mine || !three_steps(r, b))
		return 0;
	SWAP(uint32_t *, r->u, r->au);
	SWAP(size_t, r->cap_u, r->cap_au);
	SWAP(uint32_t *, r->i, r->ai);
	SWAP(size_t, r->cap_i, r->cap_ai);
	SWAP(float *, r->r, r->ar);
	SWAP(size_t, r->cap_r, r->cap_ar);
	for (int s = 0; s < 2; s++) {
		SWAP(uint64_t *, r->h[s], r->ah[s]);
		SWAP(size_t, r->cap_h[s], r->cap_ah[s]);
	}
	r->ahead_used++;
	return 1;
}

int mfs_rows_resolve(mfs_rows_t *r, const mfs_ebatch_t *b)
{
	const double t0 = mfs_now_s();
	const int looked = take_ahead(r, b);
	if (!b->n && !b->n_del)
		return 0;
	if (mfs_grow((void **)&r->u, &r->cap_u, b->n, sizeof *r->u) || mfs_grow((void **)&r->i, &r->cap_i, b->n, sizeof *r->i) ||
	    mfs_grow((void **)&r->r, &r->cap_r, b->n, sizeof *r->r))
		return ENOMEM;
	if (!r->par || b->n < MFS_ROWS_SPLIT_MIN) {
		r->steps[2]++;
		int rc = side_rows(r, 0, b);
		return rc ? rc : side_rows(r, 1, b);
	}
	r->batch = b;
	r->rc[0] = r->rc[1] = 0;
	if (!three_steps(r, b)) { /* lookups may change rows: each side in order on its thread */
		r->steps[1]++;
		mfs_par_run(r->par, 2, side_task, r);
	} else {
		r->steps[0]++;
		for (int s = 0; s < 2; s++)
			if (mfs_grow((void **)&r->h[s], &r->cap_h[s], b->n, sizeof *r->h[s]) ||
			    mfs_grow((void **)&r->miss[s], &r->cap_miss[s], b->n, sizeof *r->miss[s]))
				return ENOMEM;
		if (!looked)
			mfs_par_run(r->par, look_at(r, b, r->u, r->i, r->r, r->h[0], r->h[1]), lookup_task, r);
		const double t1 = mfs_now_s(); /* (step 1: looked up here, or what was left of it ahead) */
		gather(r, 0);
		gather(r, 1);
		mfs_par_run(r->par, place_tasks(r, 0) + place_tasks(r, 1), place_task, r);
		number(r, 0);
		number(r, 1);
		const double t2 = mfs_now_s();
		size_t nt = (size_t)r->many[0] + (size_t)r->many[1];
		for (int s = 0; s < 2; s++)
			nt += r->many[s] && r->add[s].n_new ? MFS_IDMAP_SHARDS : 0;
		nt += (r->n_fresh[0] + FRESH_CHUNK - 1) / FRESH_CHUNK + (r->n_fresh[1] + FRESH_CHUNK - 1) / FRESH_CHUNK;
		mfs_par_run(r->par, nt, finish_task, r); /* (after an error too: rows handed out get values) */
		r->step_s[0] += t1 - t0;
		r->step_s[1] += t2 - t1;
		r->step_s[2] += mfs_now_s() - t2;
	}
	r->batch = NULL;
	return r->rc[0] ? r->rc[0] : r->rc[1];
}

void mfs_rows_stop(mfs_rows_t *r)
{
	mfs_rows_ahead_cancel(r, NULL);
	mfs_par_free(r->par);
	r->par = NULL;
}

void mfs_rows_free(mfs_rows_t *r)
{
	mfs_rows_stop(r);
	free(r->u);
	free(r->i);
	free(r->r);
	free(r->au);
	free(r->ai);
	free(r->ar);
	for (int s = 0; s < 2; s++) {
		free(r->h[s]);
		free(r->ah[s]);
		free(r->miss[s]);
		free(r->fresh[s]);
		mfs_idmap_add_free(&r->add[s]);
	}
	mfs_touched_free(&r->tu);
	mfs_touched_free(&r->ti);
}
