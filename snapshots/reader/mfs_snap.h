/* mfs_snap.h - libmfsnap: read mfstream model snapshots from LMDB in serving processes.
 *
 * The only external API of mfstream. C only, opaque handles, no CUDA or Kafka types.
 * Thread-safety: a handle may be used by one thread at a time; open one per thread (they
 * share the memory map through LMDB, and the top-K item cache). Every call runs in its own
 * short read transaction, so it sees one whole snapshot; the map growing under the reader
 * is handled transparently.
 *
 * Top-K (docs/READER.md): the first top-K call after a new snapshot copies every item row
 * into a cache keyed by the snapshot's seq (a full scan of the items: O(n_items * k)); later
 * calls on that snapshot scan an int8 copy with SIMD and rescore the candidates exactly.
 * The answer is always the exact one (same items, order and float32 scores as scoring every
 * item with the formula of docs/SNAPSHOT_FORMAT.md).
 *
 * Return codes: 0, a positive errno, or one of the negative codes below (the same values as
 * mfstream's own); mfs_snap_strerror() names them all.
 */
#ifndef MFS_SNAP_H
#define MFS_SNAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MFS_SNAP_BUILD)
#define MFS_SNAP_API __attribute__((visibility("default")))
#else
#define MFS_SNAP_API
#endif

/* The negative codes this library returns (identical definitions in mfstream's common/err.h). */
#define MFS_EINVAL (-31000)    /* invalid argument */
#define MFS_EFORMAT (-30997)   /* malformed record or unknown format */
#define MFS_EVERSION (-30996)  /* snapshot format version not supported */
#define MFS_EIDLEN (-30994)    /* id longer than 256 bytes or empty */
#define MFS_ENOTFOUND (-30990) /* no such id, or no snapshot yet */
#define MFS_ELMDB (-30988)     /* LMDB failure (the errstr or mfs_snap_strerror says more) */

typedef struct mfs_snap mfs_snap_t;

enum { MFS_SNAP_ID_U64 = 1, MFS_SNAP_ID_STR = 2 };
#define MFS_SNAP_ID_MAX 256

typedef struct mfs_snap_id {
	int kind;         /* MFS_SNAP_ID_U64 or MFS_SNAP_ID_STR */
	uint64_t num;
	const char *str;  /* not necessarily NUL-terminated */
	size_t len;
} mfs_snap_id_t;

typedef struct mfs_snap_meta {
	uint32_t format_version;
	uint32_t k;
	double mu;
	uint64_t n_users, n_items;
	uint64_t seq;
	int64_t wall_time_ms;
	uint64_t events_applied;
	double learning_rate;
	double last_loss;
	double rating_min, rating_max;
} mfs_snap_meta_t;

typedef struct mfs_snap_hit {
	int kind;
	uint64_t num;
	size_t len;
	char str[MFS_SNAP_ID_MAX + 1]; /* NUL-terminated string id */
	float score;
} mfs_snap_hit_t;

/** Parse an id's text form: canonical decimal -> u64, "str:" prefix or anything else -> string. */
MFS_SNAP_API int mfs_snap_id_parse(const char *text, mfs_snap_id_t *out);

/** Open the snapshot directory read-only. @return 0, errno, MFS_ELMDB, MFS_EVERSION, MFS_ENOTFOUND (no snapshot yet),
 *  MFS_EFORMAT (among others: data.mdb shorter than its header says, a truncated copy). */
MFS_SNAP_API int mfs_snap_open(const char *dir, mfs_snap_t **out, char *errstr, size_t errstr_size);
MFS_SNAP_API void mfs_snap_close(mfs_snap_t *s);
MFS_SNAP_API int mfs_snap_get_meta(mfs_snap_t *s, mfs_snap_meta_t *out);
/** Call fn for every meta record (fixed keys and "offset/<topic>/<partition>" -> i64 LE) of one
 *  snapshot, in key order, in one read txn. fn returning non-zero stops the walk and is returned.
 *  @return 0, MFS_ELMDB, errno, or fn's value. */
typedef int (*mfs_snap_meta_fn)(void *ctx, const char *key, size_t key_len, const unsigned char *val,
                                size_t val_len);
MFS_SNAP_API int mfs_snap_meta_each(mfs_snap_t *s, mfs_snap_meta_fn fn, void *ctx);
/** Bias and k factors of a user/item (vec holds k floats). @return 0, MFS_ENOTFOUND, ... */
MFS_SNAP_API int mfs_snap_user(mfs_snap_t *s, const mfs_snap_id_t *id, float *bias, float *vec);
MFS_SNAP_API int mfs_snap_item(mfs_snap_t *s, const mfs_snap_id_t *id, float *bias, float *vec);
/** Predicted rating, clipped to the snapshot's rating range. Unknown ids fall back:
 *  mu + (b_u if the user is known) + (b_i if the item is known), no factor term.
 *  *known (optional) gets bit 1 for a known user, bit 2 for a known item. */
MFS_SNAP_API int mfs_snap_predict(mfs_snap_t *s, const mfs_snap_id_t *user, const mfs_snap_id_t *item,
                                  float *out, int *known);
/** The k best items for user by predicted score (unclipped), best first; equal scores go
 *  to the smaller encoded key; the items the snapshot lists as rated by the user are left out
 *  (MFS_SNAP_TOPK_INCLUDE_SEEN). The fast path (mfs_snap_topk_ex with no options).
 *  @param[in]  s      handle
 *  @param[in]  user   the user
 *  @param[in]  k      how many items (any size; k > n_items gives them all)
 *  @param[out] out    k hits
 *  @param[out] n_out  hits written, <= k
 *  @return 0, MFS_ENOTFOUND (unknown user), ENOMEM, MFS_EIDLEN, MFS_EINVAL, MFS_EFORMAT, MFS_ELMDB. */
MFS_SNAP_API int mfs_snap_topk(mfs_snap_t *s, const mfs_snap_id_t *user, size_t k, mfs_snap_hit_t *out,
                               size_t *n_out);

/** mfs_snap_topk_opts_t.flags. Every path returns the same hits and scores. */
enum {
	/** Score every item exactly from the cache (no int8 prefilter). Reads 4x the bytes of the
	 *  default path; for checking it, and for data where the int8 bounds prune little. */
	MFS_SNAP_TOPK_EXACT = 1u << 0,
	/** Neither build nor use the item cache: stream every row from LMDB inside the call's
	 *  txn and score it (the reference path; no memory beyond k hits). */
	MFS_SNAP_TOPK_NOCACHE = 1u << 1,
	/** Also return the items the user rated. By default top-K leaves out the items the
	 *  snapshot lists as rated by the user (its user_rated database, written where
	 *  snapshot.seen_items > 0; docs/SNAPSHOT_FORMAT.md), as if they were in the exclude list;
	 *  a snapshot without that database or without a list for the user excludes nothing. */
	MFS_SNAP_TOPK_INCLUDE_SEEN = 1u << 2,
};

typedef struct mfs_snap_topk_opts {
	const mfs_snap_id_t *exclude; /* items never returned, besides the user's rated ones (see
	                                 MFS_SNAP_TOPK_INCLUDE_SEEN); unknown ids are ignored */
	size_t n_exclude;
	unsigned flags;               /* MFS_SNAP_TOPK_* */
} mfs_snap_topk_opts_t;

/** Which path answered a top-K call (mfs_snap_topk_stats_t.path). */
enum { MFS_SNAP_PATH_INT8 = 1, MFS_SNAP_PATH_EXACT = 2, MFS_SNAP_PATH_NOCACHE = 3 };

typedef struct mfs_snap_topk_stats {
	uint64_t seq;          /* the snapshot the answer comes from */
	uint64_t n_items;      /* items in it */
	uint64_t n_excluded;   /* exclude ids found among them (after removing repeats), the
	                          user's rated items included */
	uint64_t n_scored;     /* items scored exactly: the int8 path's candidates, else n_items */
	int path;              /* MFS_SNAP_PATH_* */
	int refreshed;         /* 1 if this call built the item cache (a new snapshot) */
	double refresh_ms;     /* if so, how long that took */
} mfs_snap_topk_stats_t;

/** Top-K with options: an exclude list and the flags (paths, MFS_SNAP_TOPK_INCLUDE_SEEN).
 *  Unless opts->flags has MFS_SNAP_TOPK_INCLUDE_SEEN, the user's rated items (read in the
 *  same txn as the user's row) are excluded as well.
 *  The cache follows the snapshot: a call that sees a new seq first rebuilds it (a full scan
 *  of the items, inside that call's read txn; calls on other handles of the same directory
 *  wait for it); mfs_snap_cache_refresh does it ahead of time. If the cache cannot be
 *  allocated the call answers on the no-cache path instead.
 *  @param[in]  s      handle
 *  @param[in]  user   the user
 *  @param[in]  k      how many items
 *  @param[in]  opts   exclude list and flags; NULL = none
 *  @param[out] out    k hits, best first (excluded items never appear)
 *  @param[out] n_out  hits written: min(k, n_items - excluded found)
 *  @param[out] stats  optional (NULL): how the call went
 *  @return 0, MFS_ENOTFOUND (unknown user), MFS_EINVAL, MFS_EIDLEN (a bad user or exclude id),
 *          ENOMEM, MFS_EFORMAT (also a malformed rated list), MFS_ELMDB. */
MFS_SNAP_API int mfs_snap_topk_ex(mfs_snap_t *s, const mfs_snap_id_t *user, size_t k,
                                  const mfs_snap_topk_opts_t *opts, mfs_snap_hit_t *out, size_t *n_out,
                                  mfs_snap_topk_stats_t *stats);

/** Bring the item cache up to the current snapshot now (so no query pays the rebuild):
 *  at startup, and e.g. from a background thread with its own handle after a publish.
 *  Cheap when the cache is current (one short txn).
 *  @param[in]  s          handle
 *  @param[out] seq        optional: the snapshot the cache now holds
 *  @param[out] refreshed  optional: 1 if this call rebuilt it
 *  @return 0, MFS_EINVAL, ENOMEM, MFS_EFORMAT, MFS_EVERSION, MFS_ELMDB. */
MFS_SNAP_API int mfs_snap_cache_refresh(mfs_snap_t *s, uint64_t *seq, int *refreshed);

/** The current snapshot's seq and age (now - its wall_time_ms, from this host's clock; may
 *  be negative if the clock stepped back). One short txn (~0.1 us); the meta is cached per
 *  snapshot. Cheap enough to check before every query, e.g. to alert or to fall back when
 *  the model is older than a limit.
 *  @param[in]  s       handle
 *  @param[out] seq     optional
 *  @param[out] age_ms  optional
 *  @return 0, MFS_EINVAL, MFS_EFORMAT, MFS_EVERSION, MFS_ELMDB. */
MFS_SNAP_API int mfs_snap_staleness(mfs_snap_t *s, uint64_t *seq, int64_t *age_ms);

/** Clear the reader slots of dead processes in lock.mdb now (mdb_reader_check). libmfsnap
 *  already does this at open and, at most every 10 s, when it sees a new snapshot.
 *  @param[in]  s     handle
 *  @param[out] dead  optional: slots cleared
 *  @return 0, MFS_EINVAL, MFS_ELMDB. */
MFS_SNAP_API int mfs_snap_reader_check(mfs_snap_t *s, int *dead);
/** Text for any code these functions return (mfstream codes, errno and raw LMDB codes). */
MFS_SNAP_API const char *mfs_snap_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif
