/* snap_rated.h - the items each user rated lately, kept for the snapshot's user_rated database
 * (docs/SNAPSHOT_FORMAT.md; snapshot.seen_items): readers leave them out of the user's top-K
 * by default (docs/READER.md). Issue 20.
 *
 * A tracker keeps, per user row, the item rows of that user's last `max` ratings since it was
 * last cleared (a ring), with the generation of both rows (model_store/life.h: a freed row that
 * a new id took names another id, so an entry whose row changed hands is dropped). A snapshot
 * stage takes the lists as external ids (mfs_snap_stage_fill / _fill_ids with
 * mfs_snap_info_t.rated); the caller then clears the tracker. `mfstream serve` so holds only
 * the ratings since the last snapshot, and the writer merges them into the stored lists;
 * `mfstream train` adds every training rating and the writer stores the lists whole.
 *
 * Memory: 4 bytes per user row (the index), 24 bytes per user rated since the clear, 8 bytes
 * per kept rating (capacity doubles up to `max`): at most 4 U + (24 + 8 max) R bytes for U user
 * rows and R users rated since the clear (R <= U); after a clear the index stays, and the
 * entries' blocks the last round filled, kept for the next (a clear gives back those it kept
 * before and the round did not need).
 *
 * Threads: none of its own (add_many runs the shards on a pool the caller gives); one thread
 * (the learner, or train's) adds, stages and clears, or
 * (serve) adds and hands the tracker to a stage whose publishing thread reads and clears it
 * (mfs_snap_info_t.rated_take) while the adding thread goes on with another one.
 */
#ifndef MFS_SNAP_RATED_H
#define MFS_SNAP_RATED_H

#include <stddef.h>
#include <stdint.h>

#include "model_store/store.h"

typedef struct mfs_snap_rated mfs_snap_rated_t;
struct mfs_par;

/** A tracker keeping the last max (1..65535) ratings per user. @return 0, MFS_EINVAL, ENOMEM. */
int mfs_snap_rated_init(uint32_t max, mfs_snap_rated_t **out);
/** The same in `shards` (1..1024) parts by user row, for mfs_snap_rated_add_many on a pool. */
int mfs_snap_rated_init_shards(uint32_t max, uint32_t shards, mfs_snap_rated_t **out);
void mfs_snap_rated_free(mfs_snap_rated_t *r);
/** The ratings kept per user. */
uint32_t mfs_snap_rated_max(const mfs_snap_rated_t *r);
/** Note that the user of row u (of model m) rated the item of row i. MFS_ROW_NONE on either
 *  side is ignored. @return 0 or ENOMEM (the rating is not kept). */
int mfs_snap_rated_add(mfs_snap_rated_t *r, const mfs_model_t *m, uint32_t u, uint32_t i);
/** mfs_snap_rated_add for (u[j], i[j]), j < n, in order: each shard on one task of par (NULL or
 *  one shard: on the caller). The lists are those of the adds one by one. @return 0 or ENOMEM
 *  (some ratings of the batch may not be kept). */
int mfs_snap_rated_add_many(mfs_snap_rated_t *r, const mfs_model_t *m, const uint32_t *u, const uint32_t *i, size_t n,
                            struct mfs_par *par);
/** The same begun on par's workers alone (mfs_par_start): the caller goes on, and must call
 *  mfs_snap_rated_add_finish before it reads or changes r, m's rows or u and i, or uses par.
 *  Without workers it adds here. */
void mfs_snap_rated_add_start(mfs_snap_rated_t *r, const mfs_model_t *m, const uint32_t *u, const uint32_t *i, size_t n,
                              struct mfs_par *par);
/** Wait for the adds mfs_snap_rated_add_start began. @return as mfs_snap_rated_add_many. */
int mfs_snap_rated_add_finish(mfs_snap_rated_t *r, struct mfs_par *par);
/** Users with ratings kept since the last clear. */
size_t mfs_snap_rated_users(const mfs_snap_rated_t *r);
/** Bytes the tracker holds now. */
size_t mfs_snap_rated_bytes(const mfs_snap_rated_t *r);
/** Forget every kept rating (after a stage took them); the per-row index keeps its size, the
 *  entries' blocks this round filled are kept for the next round, the others freed. */
void mfs_snap_rated_clear(mfs_snap_rated_t *r);

/** One user's kept list as m's rows, oldest first: the user row, and up to max item rows in
 *  items[] (the caller's, room for max). Entries whose user or item row changed hands (or
 *  died) since they were added are left out. @return the items written; 0 also when the
 *  user row no longer holds the user the list was kept for (*user = MFS_ROW_NONE then).
 *  j < mfs_snap_rated_users(r). */
size_t mfs_snap_rated_list(const mfs_snap_rated_t *r, const mfs_model_t *m, size_t j, uint32_t *user,
                           uint32_t *items);
/** List j as kept, without a model to check it against: the user row and its generation when
 *  added, and every entry oldest first (item rows to items, their generations to igens; the
 *  caller's, room for max each). For a thread that checks the generations itself (the snapshot
 *  writer, against those of the rows it staged). @return the entries written. */
size_t mfs_snap_rated_raw(const mfs_snap_rated_t *r, size_t j, uint32_t *user, uint16_t *ugen, uint32_t *items,
                          uint16_t *igens);

#endif
