/* model_help.h - building models row by row in tests, and bringing chosen rows of an engine's
 * model back to the host (include after testhelp.h). */
#ifndef MFS_TEST_MODEL_HELP_H
#define MFS_TEST_MODEL_HELP_H

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpu/engine.h"
#include "model_store/store.h"

/* The row of user (item) id, created on first sight; a failure is a failed check. */
static inline uint32_t add_user(mfs_model_t *m, mfs_id_t id)
{
	uint32_t row = MFS_ROW_NONE;
	TEST_OK(mfs_model_user_row(m, &id, &row));
	return row;
}

static inline uint32_t add_item(mfs_model_t *m, mfs_id_t id)
{
	uint32_t row = MFS_ROW_NONE;
	TEST_OK(mfs_model_item_row(m, &id, &row));
	return row;
}

/* A string id borrowing s (NUL-terminated). */
/* A model (init scale 0.1) with users 0..nu-1 and items 0..ni-1 at rows 0.. in order; NULL on
 * failure. */
static inline mfs_model_t *model_with_rows(int k, uint32_t nu, uint32_t ni, uint64_t seed)
{
	mfs_model_conf_t mc = {k, 0.1, seed};
	mfs_model_t *m = NULL;
	if (mfs_model_init(&mc, &m))
		return NULL;
	uint32_t row;
	for (uint32_t u = 0; u < nu; u++) {
		mfs_id_t id = mfs_id_u64(u);
		if (mfs_model_user_row(m, &id, &row) || row != u) {
			mfs_model_free(m);
			return NULL;
		}
	}
	for (uint32_t i = 0; i < ni; i++) {
		mfs_id_t id = mfs_id_u64(i);
		if (mfs_model_item_row(m, &id, &row) || row != i) {
			mfs_model_free(m);
			return NULL;
		}
	}
	return m;
}

static inline mfs_id_t str_id(const char *s)
{
	mfs_id_t id = {MFS_ID_STR, (uint16_t)strlen(s), 0, s};
	return id;
}

/* Bring only the given rows of m (the model engine e trains) up to date on the host: a capture
 * of just these rows, waited for, scattered into m's tables. Rows must be < m's rows; repeats
 * are allowed; no rows at all: every batch applied (drain).
 * @return 0, MFS_EINVAL (a row out of range, or no list where there are rows), ENOMEM, MFS_EGPU. */
static inline int test_sync_rows(mfs_engine_t *e, mfs_model_t *m, const uint32_t *user_rows, size_t n_users,
                                 const uint32_t *item_rows, size_t n_items)
{
	if (!e || !m || (n_users && !user_rows) || (n_items && !item_rows))
		return MFS_EINVAL;
	for (size_t j = 0; j < n_users; j++)
		if (user_rows[j] >= m->n_users)
			return MFS_EINVAL;
	for (size_t j = 0; j < n_items; j++)
		if (item_rows[j] >= m->n_items)
			return MFS_EINVAL;
	if (n_users + n_items == 0)
		return mfs_engine_drain(e);
	const size_t w = 1 + (size_t)m->k;
	float *du = malloc((n_users + n_items) * w * sizeof *du);
	if (!du)
		return ENOMEM;
	float *di = du + n_users * w;
	int rc = mfs_engine_capture(e, user_rows, n_users, du, item_rows, n_items, di);
	if (!rc && !(rc = mfs_engine_capture_wait(e))) {
		for (size_t j = 0; j < n_users; j++) {
			m->bu[user_rows[j]] = du[j * w];
			memcpy(m->P + (size_t)user_rows[j] * (size_t)m->k, du + j * w + 1, (size_t)m->k * sizeof *du);
		}
		for (size_t j = 0; j < n_items; j++) {
			m->bi[item_rows[j]] = di[j * w];
			memcpy(m->Q + (size_t)item_rows[j] * (size_t)m->k, di + j * w + 1, (size_t)m->k * sizeof *di);
		}
	}
	free(du);
	return rc;
}

#endif
