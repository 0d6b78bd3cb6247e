/* snap_load.h - load the newest snapshot of a directory back into a model (service restart).
 *
 * Every user and item record becomes a row of the model (ids added in key order) with the
 * stored bias and factors; the model's own meta (mu, events_applied, and mu_count and mu_sum
 * where present) is restored into it. Every "offset/<topic>/<partition>" record is returned:
 * the next offset to consume for the events the loaded rows contain. Every other meta record
 * a writer added (mfs_snap_info_t.extra: the service's counters) is handed back as it was
 * written, by key, for its writer to read. All of it is read in one LMDB read txn, so it is
 * one whole snapshot.
 */
#ifndef MFS_SNAP_LOAD_H
#define MFS_SNAP_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "common/offsets.h"
#include "model_store/store.h"
#include "snapshots/snap_writer.h"

typedef struct mfs_snap_loaded {
	uint64_t seq;
	uint64_t n_users, n_items;
	mfs_offset_t *offsets; /* their topic strings are this struct's */
	size_t n_offsets;
	mfs_snap_extra_t *extra; /* the 8-byte records that are neither core meta nor offsets, in key
	                          order; typed by snap_format.h (MFS_SNAP_T_U64 where it does not
	                          know the key); keys are this struct's */
	size_t n_extra;
	double learning_rate;  /* NaN when absent */
} mfs_snap_loaded_t;

/** Load dir's snapshot into m (which must be empty and have the snapshot's k).
 *  @return 0, MFS_ENOTFOUND (no snapshot in dir: m untouched), MFS_EINVAL (k differs, m not
 *  empty), MFS_EFORMAT, MFS_EVERSION, MFS_ELMDB, ENOMEM, errno. */
int mfs_snap_load(const char *dir, mfs_model_t *m, mfs_snap_loaded_t *out, char *errstr, size_t errstr_size);
void mfs_snap_loaded_free(mfs_snap_loaded_t *l);
/** The extra record `key` of a loaded snapshot, or NULL when it has none. */
const mfs_snap_extra_t *mfs_snap_loaded_extra(const mfs_snap_loaded_t *l, const char *key);

#endif
