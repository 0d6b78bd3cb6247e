/* snap_load.h - load the newest snapshot of a directory back into a model (service restart).
 *
 * Every user and item record becomes a row of the model (ids added in key order) with the
 * stored bias and factors; mu, events_applied and the optional streaming keys mu_count,
 * mu_sum and rejected/<reason> are restored, and every "offset/<topic>/<partition>" record is
 * returned: the next offset to consume for the events the loaded rows contain. All of it is
 * read in one LMDB read txn, so it is one whole snapshot.
 */
#ifndef MFS_SNAP_LOAD_H
#define MFS_SNAP_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "model_store/store.h"

/* the optional meta keys of `mfstream serve` are defined in snapshots/snap_format.h */

typedef struct mfs_snap_loaded_offset {
	char *topic;
	int32_t partition;
	int64_t next_offset;
} mfs_snap_loaded_offset_t;

typedef struct mfs_snap_loaded {
	uint64_t seq;
	uint64_t n_users, n_items;
	mfs_snap_loaded_offset_t *offsets;
	size_t n_offsets;
	uint64_t rejected[16]; /* by enum mfs_reject (ingest/event.h); MFS_REJ__COUNT <= 16 */
	uint64_t held_out;     /* events_held_out (0 when absent) */
	uint64_t digest;       /* events_digest (0 when absent) */
	double learning_rate;  /* NaN when absent */
} mfs_snap_loaded_t;

/** Load dir's snapshot into m (which must be empty and have the snapshot's k).
 *  @return 0, MFS_ENOTFOUND (no snapshot in dir: m untouched), MFS_EINVAL (k differs, m not
 *  empty), MFS_EFORMAT, MFS_EVERSION, MFS_ELMDB, ENOMEM, errno. */
int mfs_snap_load(const char *dir, mfs_model_t *m, mfs_snap_loaded_t *out, char *errstr, size_t errstr_size);
void mfs_snap_loaded_free(mfs_snap_loaded_t *l);

#endif
