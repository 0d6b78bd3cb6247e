/* meta.c - see meta.h. */
#include "serve/meta.h"

#include <math.h>
#include <stdio.h>

#include "snapshots/snap_format.h"

const char *const mfs_meta_freed_key[2][3] = {
	{"users_evicted", "users_expired", "users_deleted"},
	{"items_evicted", "items_expired", "items_deleted"},
};

static void reject_key(char *buf, size_t size, int reason)
{
	snprintf(buf, size, "%s%s", MFS_META_REJECTED_PREFIX, mfs_reject_name(reason));
}

size_t mfs_serve_meta_records(const mfs_serve_meta_t *m, int with_pq, mfs_serve_meta_buf_t *buf)
{
	mfs_snap_extra_t *ex = buf->ex;
	size_t nx = 0;
	ex[nx++] = (mfs_snap_extra_t){MFS_META_MU_COUNT, MFS_SNAP_T_U64, m->mu_count, 0};
	ex[nx++] = (mfs_snap_extra_t){MFS_META_MU_SUM, MFS_SNAP_T_F64, 0, m->mu_sum};
	ex[nx++] = (mfs_snap_extra_t){MFS_META_HELD_OUT, MFS_SNAP_T_U64, m->held_out, 0};
	ex[nx++] = (mfs_snap_extra_t){MFS_META_DIGEST, MFS_SNAP_T_U64, m->digest, 0};
	ex[nx++] = (mfs_snap_extra_t){MFS_META_REPLAYED, MFS_SNAP_T_U64, m->replayed, 0};
	ex[nx++] = (mfs_snap_extra_t){MFS_META_DROPPED, MFS_SNAP_T_U64, m->dropped, 0};
	for (int e = 0; e < 2; e++)
		for (int w = 0; w < 3; w++)
			ex[nx++] = (mfs_snap_extra_t){mfs_meta_freed_key[e][w], MFS_SNAP_T_U64, m->freed[e][w], 0};
	if (with_pq && isfinite(m->pq_rmse)) {
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_RMSE, MFS_SNAP_T_F64, 0, m->pq_rmse};
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_N, MFS_SNAP_T_U64, m->pq_n, 0};
	}
	if (with_pq && isfinite(m->pq_window_rmse)) {
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_WINDOW_RMSE, MFS_SNAP_T_F64, 0, m->pq_window_rmse};
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_WINDOW_N, MFS_SNAP_T_U64, m->pq_window_n, 0};
	}
	if (isfinite(m->pq_cumulative_rmse)) { /* carried through restarts, so kept with scoring off too */
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_CUM_RMSE, MFS_SNAP_T_F64, 0, m->pq_cumulative_rmse};
		ex[nx++] = (mfs_snap_extra_t){MFS_META_PQ_CUM_N, MFS_SNAP_T_U64, m->pq_cumulative_n, 0};
	}
	if (isfinite(m->holdout_rmse))
		ex[nx++] = (mfs_snap_extra_t){MFS_META_HOLDOUT_RMSE, MFS_SNAP_T_F64, 0, m->holdout_rmse};
	if (isfinite(m->window_rmse))
		ex[nx++] = (mfs_snap_extra_t){MFS_META_WINDOW_RMSE, MFS_SNAP_T_F64, 0, m->window_rmse};
	for (int r = 0; r < MFS_REJ__COUNT; r++) {
		reject_key(buf->names[r], sizeof buf->names[r], r);
		ex[nx++] = (mfs_snap_extra_t){buf->names[r], MFS_SNAP_T_U64, m->rejected[r], 0};
	}
	return nx;
}

static uint64_t u64_of(const mfs_snap_loaded_t *ld, const char *key)
{
	const mfs_snap_extra_t *x = mfs_snap_loaded_extra(ld, key);
	return x && x->type == MFS_SNAP_T_U64 ? x->u64 : 0;
}

void mfs_serve_meta_restore(const mfs_snap_loaded_t *ld, mfs_serve_meta_t *out)
{
	*out = (mfs_serve_meta_t){0};
	out->pq_rmse = out->holdout_rmse = out->window_rmse = out->pq_window_rmse = out->pq_cumulative_rmse = NAN;
	out->mu_count = u64_of(ld, MFS_META_MU_COUNT);
	const mfs_snap_extra_t *x = mfs_snap_loaded_extra(ld, MFS_META_MU_SUM);
	out->mu_sum = x && x->type == MFS_SNAP_T_F64 ? x->f64 : 0;
	out->held_out = u64_of(ld, MFS_META_HELD_OUT);
	out->digest = u64_of(ld, MFS_META_DIGEST);
	out->replayed = u64_of(ld, MFS_META_REPLAYED);
	out->dropped = u64_of(ld, MFS_META_DROPPED);
	for (int e = 0; e < 2; e++)
		for (int w = 0; w < 3; w++)
			out->freed[e][w] = u64_of(ld, mfs_meta_freed_key[e][w]);
	x = mfs_snap_loaded_extra(ld, MFS_META_PQ_CUM_RMSE);
	out->pq_cumulative_n = u64_of(ld, MFS_META_PQ_CUM_N);
	if (x && x->type == MFS_SNAP_T_F64 && out->pq_cumulative_n)
		out->pq_cumulative_rmse = x->f64;
	char key[64];
	for (int r = 0; r < MFS_REJ__COUNT; r++) {
		reject_key(key, sizeof key, r);
		out->rejected[r] = u64_of(ld, key);
	}
}
