/* snap_format.h - snapshot format v1 in LMDB (docs/SNAPSHOT_FORMAT.md is the contract).
 *
 * One environment directory, three named databases:
 *   "meta"  : ASCII key -> little-endian value (types listed below)
 *   "users" : encoded external id -> row value
 *   "items" : encoded external id -> row value
 * Encoded id: 1 tag byte, then the payload.
 *   tag 0x01 (u64):    8 bytes big-endian (so byte order = numeric order; MDB_APPEND works)
 *   tag 0x02 (string): 1..256 bytes of UTF-8
 * Row value: float32 LE bias, then k float32 LE factors (4 * (1 + k) bytes).
 * Each snapshot is one write transaction: readers see all of it or none of it.
 */
#ifndef MFS_SNAP_FORMAT_H
#define MFS_SNAP_FORMAT_H

#define MFS_SNAP_VERSION 1u
#define MFS_SNAP_DB_META "meta"
#define MFS_SNAP_DB_USERS "users"
#define MFS_SNAP_DB_ITEMS "items"
#define MFS_SNAP_KEY_TAG_U64 0x01
#define MFS_SNAP_KEY_TAG_STR 0x02
#define MFS_SNAP_KEY_MAX (1 + 256)

/* meta keys and their value types */
#define MFS_META_VERSION "format_version"     /* u32 */
#define MFS_META_K "k"                        /* u32 */
#define MFS_META_DTYPE "dtype"                /* ASCII "f32" */
#define MFS_META_MU "mu"                      /* f64 */
#define MFS_META_N_USERS "n_users"            /* u64 */
#define MFS_META_N_ITEMS "n_items"            /* u64 */
#define MFS_META_SEQ "seq"                    /* u64, 1 for the first snapshot */
#define MFS_META_WALL_MS "wall_time_ms"       /* i64, ms since the Unix epoch */
#define MFS_META_EVENTS "events_applied"      /* u64 */
#define MFS_META_LR "learning_rate"           /* f64 */
#define MFS_META_LOSS "last_loss"             /* f64 (RMSE of the last full pass; NaN if none) */
#define MFS_META_RMIN "rating_min"            /* f64 */
#define MFS_META_RMAX "rating_max"            /* f64 */
#define MFS_META_OFFSET_PREFIX "offset/"      /* "offset/<topic>/<partition>" -> i64 next offset */

#endif
