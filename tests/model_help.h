/* model_help.h - building models row by row in tests (include after testhelp.h). */
#ifndef MFS_TEST_MODEL_HELP_H
#define MFS_TEST_MODEL_HELP_H

#include <string.h>

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
static inline mfs_id_t str_id(const char *s)
{
	mfs_id_t id = {MFS_ID_STR, (uint16_t)strlen(s), 0, s};
	return id;
}

#endif
