/* snap_writer.h - publish the model as a snapshot (format v1, snap_format.h).
 *
 * mfs_snap_publish() writes the given rows (or all rows), the meta record and the Kafka
 * offsets in ONE LMDB write transaction: its commit is the publish point. The map grows
 * (doubling) when it fills; readers handle MDB_MAP_RESIZED.
 */
#ifndef MFS_SNAP_WRITER_H
#define MFS_SNAP_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "model_store/store.h"

typedef struct mfs_snap_writer mfs_snap_writer_t;

typedef struct mfs_snap_offset {
	const char *topic;
	int32_t partition;
	int64_t next_offset;
} mfs_snap_offset_t;

typedef struct mfs_snap_info {
	double learning_rate;
	double last_loss;            /* NaN when unknown */
	double rating_min, rating_max;
	const mfs_snap_offset_t *offsets;
	size_t n_offsets;
	/* rows to write; NULL = every row of the model */
	const uint32_t *user_rows;
	size_t n_user_rows;
	const uint32_t *item_rows;
	size_t n_item_rows;
} mfs_snap_info_t;

/** Open (creating) the environment directory dir. map_size: initial map size in bytes.
 *  @return 0, errno, MFS_ELMDB, MFS_EVERSION (dir holds another format version). */
int mfs_snap_writer_open(const char *dir, size_t map_size, mfs_snap_writer_t **out, char *errstr,
                         size_t errstr_size);
void mfs_snap_writer_close(mfs_snap_writer_t *w);
/** Publish; on success *seq (if not NULL) is the new snapshot's sequence number.
 *  @return 0, MFS_ELMDB, MFS_EINVAL (k differs from the snapshot's), MFS_ENAN, ENOMEM. */
int mfs_snap_publish(mfs_snap_writer_t *w, const mfs_model_t *m, const mfs_snap_info_t *info,
                     uint64_t *seq, char *errstr, size_t errstr_size);

#endif
