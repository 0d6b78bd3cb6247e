/* fault.h - fault points in our own code, for tests of the fatal paths (SQLite's way: the
 * error comes from a named place in our code, not from a full disk or a broken GPU).
 *
 * A spec, from the hidden key test.fault, names points and the error each is to fail with:
 *     POINT=ERROR[@N][,POINT=ERROR[@N]...]
 * ERROR is ENOSPC, EIO, ENOMEM, MDB_MAP_FULL or MDB_PANIC; the Nth pass through POINT (default
 * 1: the first) and every pass after it fail. The points (docs/OPERATIONS.md, "Failing"):
 *     snapshot.commit   the snapshot's LMDB commit
 *     snapshot.grow     growing the LMDB map after MDB_MAP_FULL
 *     snapshot.reserve  reserving disk for the snapshot's pages (posix_fallocate)
 *     engine.sgd        the engine taking a batch (on the GPU: its copy into the ring)
 *     engine.shard      a shard of the sharded engine taking its part of a batch (its driver's
 *                       thread: the error reaches the caller at its next call)
 *     engine.shard_merge a merge of the sharded engine's item replicas
 * With no spec set every point costs one relaxed atomic load.
 */
#ifndef MFS_FAULT_H
#define MFS_FAULT_H

#include <stddef.h>

/** Arm the points of spec (NULL or "" disarms all). @return 0, or MFS_ECONFIG with errstr. */
int mfs_fault_arm(const char *spec, char *errstr, size_t es);
/** The error to fail with at this pass through point, or 0 to go on. */
int mfs_fault(const char *point);

#endif
