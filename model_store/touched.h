/* touched.h - the set of rows changed since the last snapshot (a bitmap for O(1) dedup plus
 * the list of rows in first-touch order), so a snapshot writes only what changed. */
#ifndef MFS_TOUCHED_H
#define MFS_TOUCHED_H

#include <stddef.h>
#include <stdint.h>

typedef struct mfs_touched {
	uint64_t *bits;
	size_t nwords;
	uint32_t *rows;
	size_t n, cap;
} mfs_touched_t;

/** Add row (no-op if already present). @return 0 or ENOMEM. */
int mfs_touched_mark(mfs_touched_t *t, uint32_t row);
/** Add n rows (UINT32_MAX, MFS_ROW_NONE, skipped), the bitmap words prefetched ahead (a batch's rows are scattered over tables
 *  larger than the caches). @return 0 or ENOMEM. */
int mfs_touched_mark_many(mfs_touched_t *t, const uint32_t *rows, size_t n);
/** Empty the set (keeps the memory). */
void mfs_touched_clear(mfs_touched_t *t);
void mfs_touched_free(mfs_touched_t *t);

#endif
