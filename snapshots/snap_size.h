/* snap_size.h - a snapshot's data.mdb against its own header, before anything maps it.
 *
 * LMDB maps data.mdb and trusts its meta pages: a page the tree points to beyond the end of a
 * truncated file (a half-copied snapshot, a full disk during a copy) is a SIGBUS on first
 * touch, not an error. mfs_snap_check_size reads both meta pages with pread and refuses a file
 * shorter than the newest meta's last page. Used by the reader (libmfsnap) and by serve's and
 * train's loader (snap_load.c), before mdb_env_open. DESIGN notes in snapshots/reader/mfs_snap.c.
 */
#ifndef MFS_SNAP_SIZE_H
#define MFS_SNAP_SIZE_H

#include <stddef.h>

/** 0 when dir/data.mdb is long enough for its header, or when there is nothing to judge (no
 *  file, not an LMDB file: mdb_env_open then says why); MFS_EFORMAT with errstr "snapshot
 *  DIR/data.mdb is truncated: ..."; MFS_ENOTFOUND for an empty data.mdb. */
int mfs_snap_check_size(const char *dir, char *errstr, size_t es);

#endif
