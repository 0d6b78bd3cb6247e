/* mfs_snap.h - libmfsnap: read mfstream model snapshots from LMDB in serving processes.
 *
 * The only external API of mfstream. C only, opaque handles, no CUDA or Kafka types.
 * Thread-safety: a handle may be used by one thread at a time; open one per thread (they
 * share the memory map through LMDB). Every call runs in its own short read transaction,
 * so it sees one whole snapshot; the map growing under the reader is handled transparently.
 *
 * Return codes: 0, a positive errno, or a negative code; mfs_snap_strerror() names them all.
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

/** Open the snapshot directory read-only. @return 0, errno, MFS_ELMDB, MFS_EVERSION, MFS_ENOTFOUND (no snapshot yet). */
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
/** The k best items for user by predicted score (unclipped), best first. *n_out <= k.
 *  @return 0, MFS_ENOTFOUND (unknown user), ENOMEM, MFS_EIDLEN, MFS_EFORMAT, MFS_ELMDB. */
MFS_SNAP_API int mfs_snap_topk(mfs_snap_t *s, const mfs_snap_id_t *user, size_t k, mfs_snap_hit_t *out,
                               size_t *n_out);
/** Text for any code these functions return (mfstream codes, errno and raw LMDB codes). */
MFS_SNAP_API const char *mfs_snap_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif
