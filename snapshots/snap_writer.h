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

#include "common/offsets.h"
#include "common/par.h"
#include "model_store/store.h"
#include "snapshots/snap_rated.h"

typedef struct mfs_snap_writer mfs_snap_writer_t;

/** An optional extra meta record (format v1 allows keys readers do not know; they ignore
 *  them): "mu_count", "mu_sum", "rejected/<reason>" of `mfstream serve` (docs/SNAPSHOT_FORMAT.md).
 *  The key must not be one the writer owns nor start with "offset/". */
typedef struct mfs_snap_extra {
	const char *key;
	int type;     /* MFS_SNAP_T_U64 or MFS_SNAP_T_F64 (snap_format.h) */
	uint64_t u64;
	double f64;
} mfs_snap_extra_t;

typedef struct mfs_snap_info {
	double learning_rate;
	double last_loss;            /* NaN when unknown */
	double rating_min, rating_max;
	const mfs_offset_t *offsets;  /* topic strings are the caller's */
	size_t n_offsets;
	/* rows to write; NULL = every row of the model */
	const uint32_t *user_rows;
	size_t n_user_rows;
	const uint32_t *item_rows;
	size_t n_item_rows;
	/* optional extra meta records, written in the same txn (NULL / 0: none) */
	const mfs_snap_extra_t *extra;
	size_t n_extra;
	/* 1: this snapshot replaces what the environment holds: the users, items and meta
	 * records are emptied first, in the same txn, so readers see the old model or this one,
	 * never a mix; seq goes on from the old one. k must still match: readers size their
	 * buffers by it (mfs_snap_user's vec), so it never changes in a directory */
	int replace;
	/* the items users rated (snapshot.seen_items; the user_rated DB): the lists this tracker
	 * holds are staged with the rows and written in the same txn (NULL: none are written).
	 * rated_merge = 1 (serve): the tracker holds the ratings since the last snapshot, merged
	 * into each stored list; 0 (train): it holds them all, each list replaces the stored one.
	 * Either way a list keeps the last mfs_snap_rated_max() distinct items, newest last. */
	const mfs_snap_rated_t *rated;
	int rated_merge;
	/* instead of rated (serve, mfs_snap_stage_fill_ids): the stage takes this tracker as it is,
	 * and mfs_snap_publish_stage, on the publishing thread, turns its lists into ids (through
	 * the rows the stage holds, checked by generation: each rating named a row the snapshot
	 * writes), merges them into the stored ones and clears it. The caller adds to another
	 * tracker meanwhile and takes this one back once the publish returned. Staging a list per
	 * user on the learner's thread held it about 0.3 us a user (docs/BENCHMARKS.md, growth). */
	mfs_snap_rated_t *rated_take;
} mfs_snap_info_t;

/** When a commit reaches the disk (config key snapshot.sync). */
typedef enum mfs_snap_sync {
	MFS_SNAP_SYNC_FULL = 0, /* flush data and meta at every commit (LMDB default) */
	MFS_SNAP_SYNC_META = 1, /* MDB_NOMETASYNC: integrity kept, an OS crash may undo the last commit */
	MFS_SNAP_SYNC_NONE = 2, /* MDB_WRITEMAP|MDB_NOSYNC: no flush; safe against process crashes only */
} mfs_snap_sync_t;

/** Open (creating) the environment directory dir with MFS_SNAP_SYNC_FULL. map_size: initial map size in bytes.
 *  @return 0, errno, MFS_ELMDB, MFS_EVERSION (dir holds another format version). */
int mfs_snap_writer_open(const char *dir, size_t map_size, mfs_snap_writer_t **out, char *errstr,
                         size_t errstr_size);
/** Open with a sync mode. */
int mfs_snap_writer_open_sync(const char *dir, size_t map_size, mfs_snap_sync_t sync, mfs_snap_writer_t **out,
                              char *errstr, size_t errstr_size);
/** What the environment holds already (`mfstream train` checks it before any epoch). */
typedef struct mfs_snap_existing {
	uint64_t seq;             /* 0: nothing published yet */
	uint32_t k;               /* 0 when seq is 0 */
	uint64_t n_users, n_items; /* rows in the users and items DBs */
} mfs_snap_existing_t;

/** Read what the writer's environment holds, in a read txn. @return 0, MFS_EFORMAT (a
 *  malformed seq or k record), MFS_ELMDB or an errno; errstr names the directory. */
int mfs_snap_writer_existing(mfs_snap_writer_t *w, mfs_snap_existing_t *out, char *errstr, size_t errstr_size);
/** Close; in the meta and none modes the environment is flushed first (a clean stop is durable). */
void mfs_snap_writer_close(mfs_snap_writer_t *w);
/** Publish; on success *seq (if not NULL) is the new snapshot's sequence number.
 *  Same as mfs_snap_stage_fill into a stage of the writer's, then mfs_snap_publish_stage.
 *  @return 0, MFS_ELMDB, MFS_EINVAL (k differs from the snapshot's), MFS_ENAN, ENOMEM. */
int mfs_snap_publish(mfs_snap_writer_t *w, const mfs_model_t *m, const mfs_snap_info_t *info,
                     uint64_t *seq, char *errstr, size_t errstr_size);

/** A staged snapshot: copies of the rows to write (ids, bias, factors), k, mu and events
 *  applied, checked, independent of the model afterwards. So the model can go on learning
 *  while another thread sorts and writes the stage (`mfs_snap_publish_stage`). */
typedef struct mfs_snap_stage mfs_snap_stage_t;
mfs_snap_stage_t *mfs_snap_stage_new(void);
void mfs_snap_stage_free(mfs_snap_stage_t *s);
/** Copy the rows info names (user_rows/item_rows; NULL = every row) of m into s, replacing
 *  what s held. Nothing is kept when a row is out of range, not finite or has a bad id.
 *  @return 0, MFS_EINVAL, MFS_ENAN, MFS_EIDLEN, ENOMEM. */
int mfs_snap_stage_fill(mfs_snap_stage_t *s, const mfs_model_t *m, const mfs_snap_info_t *info, char *errstr,
                        size_t errstr_size);
/** As mfs_snap_stage_fill, but only the ids of the rows: their values come later, possibly
 *  from another thread (a device engine's mfs_engine_capture), into mfs_snap_stage_values()
 *  before mfs_snap_publish_stage, which checks them (all finite) before it writes anything.
 *  @param[in] par  a pool that stages a long rows list in chunks (the caller waits; it must
 *                  have no step under way), or NULL: the caller's thread alone
 *  @return 0, MFS_EINVAL, MFS_EIDLEN, ENOMEM. */
int mfs_snap_stage_fill_ids(mfs_snap_stage_t *s, const mfs_model_t *m, const mfs_snap_info_t *info, mfs_par_t *par,
                            char *errstr, size_t errstr_size);
/** The values of side 0 (users) or 1 (items) of a stage filled by ids and not yet published:
 *  n x (1 + k) floats, per row the bias then the k factors, rows in the order info listed them;
 *  *n (if not NULL) the rows. NULL when the stage was not filled by ids or is published
 *  already, or side is neither 0 nor 1; with no rows it may be NULL too (nothing to fill). */
float *mfs_snap_stage_values(mfs_snap_stage_t *s, int side, size_t *n);
/** Publish a filled stage with info's meta, offsets and extra records (its row lists are not
 *  used: the stage has the rows). Sorts the stage's rows by key first (in place, once).
 *  Errors as mfs_snap_publish. */
int mfs_snap_publish_stage(mfs_snap_writer_t *w, mfs_snap_stage_t *s, const mfs_snap_info_t *info,
                           uint64_t *seq, char *errstr, size_t errstr_size);

/** Where a writer's publishes spend their time, cumulative seconds since it opened, by phase:
 *  prepare (encode rated lists, check values, sort by key), reserve (disk blocks and map size
 *  ahead of the txn), rows (the users' and items' rows and last-seen times, deletes included),
 *  rated (users' rated lists), commit (mdb_txn_commit). What metrics call
 *  mfstream_snapshot_seconds{phase}. */
enum { MFS_SNAP_PH_PREPARE, MFS_SNAP_PH_RESERVE, MFS_SNAP_PH_ROWS, MFS_SNAP_PH_RATED, MFS_SNAP_PH_COMMIT, MFS_SNAP_PH__COUNT };
void mfs_snap_writer_phases(const mfs_snap_writer_t *w, double seconds[MFS_SNAP_PH__COUNT]);
/** A phase's name ("prepare", ...); NULL out of range. */
const char *mfs_snap_phase_name(int phase);

#endif
