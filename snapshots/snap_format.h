/* snap_format.h - snapshot format v1 in LMDB (docs/SNAPSHOT_FORMAT.md is the contract).
 *
 * One environment directory, three named databases:
 *   "meta"  : ASCII key -> little-endian value (types listed below)
 *   "users" : encoded external id -> row value
 *   "items" : encoded external id -> row value
 * and optional ones: "user_seen" / "item_seen" (the writer's last-seen times) and "user_rated"
 * (the items each user rated; MFS_SNAP_DB_USER_RATED below).
 * Encoded id: 1 tag byte, then the payload.
 *   tag 0x01 (u64):    8 bytes big-endian (so byte order = numeric order; MDB_APPEND works)
 *   tag 0x02 (string): 1..256 bytes of UTF-8
 * Row value: float32 LE bias, then k float32 LE factors (4 * (1 + k) bytes).
 * Each snapshot is one write transaction: readers see all of it or none of it.
 *
 * The static inline helpers below are the one implementation of the byte layout; both the
 * writer (the mfs_snapshots stage) and libmfsnap (which must not link it) include this header.
 */
#ifndef MFS_SNAP_FORMAT_H
#define MFS_SNAP_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MFS_SNAP_VERSION 1u
#define MFS_SNAP_DB_META "meta"
#define MFS_SNAP_DB_USERS "users"
#define MFS_SNAP_DB_ITEMS "items"
/* the writer's own: last-seen time per id (u32 LE seconds of event time), written where the model
 * tracks it (model.ttl_s, model.on_full=evict) and read back at a restart; readers ignore them */
#define MFS_SNAP_DB_USER_SEEN "user_seen"
#define MFS_SNAP_DB_ITEM_SEEN "item_seen"
/* the items each user rated, newest last (snapshot.seen_items; issue 20): encoded user id ->
 * u32 LE n, then n entries of u16 LE len + len bytes of an encoded item id. Optional: readers
 * that find no such DB, or no record for a user, exclude nothing by it */
#define MFS_SNAP_DB_USER_RATED "user_rated"
#define MFS_SNAP_KEY_TAG_U64 0x01
#define MFS_SNAP_KEY_TAG_STR 0x02
#define MFS_SNAP_KEY_MAX (1 + 256)
#define MFS_SNAP_STR_MAX 256
#define MFS_SNAP_DTYPE "f32"
#define MFS_SNAP_MAX_DBS 6
/* Reader slots in lock.mdb. Whoever creates the lock file fixes the table size, so the
 * writer, libmfsnap and the Python reader all ask for the same number. */
#define MFS_SNAP_MAX_READERS 1024
/* Kafka topic names are at most 249 bytes of [a-zA-Z0-9._-]. */
#define MFS_SNAP_TOPIC_MAX 249

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

/* ---- little-endian scalars (byte shifts: correct on any host, one mov on x86) -------- */
static inline void mfs_snap_put_u32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

static inline uint32_t mfs_snap_get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void mfs_snap_put_u64(unsigned char *p, uint64_t v)
{
	mfs_snap_put_u32(p, (uint32_t)v);
	mfs_snap_put_u32(p + 4, (uint32_t)(v >> 32));
}

static inline uint64_t mfs_snap_get_u64(const unsigned char *p)
{
	return (uint64_t)mfs_snap_get_u32(p) | (uint64_t)mfs_snap_get_u32(p + 4) << 32;
}

static inline void mfs_snap_put_f32(unsigned char *p, float f)
{
	uint32_t v;
	memcpy(&v, &f, 4);
	mfs_snap_put_u32(p, v);
}

/* n floats, little-endian: one copy on a little-endian host. */
static inline void mfs_snap_put_f32s(unsigned char *p, const float *f, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(p, f, n * 4);
#else
	for (size_t j = 0; j < n; j++)
		mfs_snap_put_f32(p + 4 * j, f[j]);
#endif
}

static inline float mfs_snap_get_f32(const unsigned char *p)
{
	uint32_t v = mfs_snap_get_u32(p);
	float f;
	memcpy(&f, &v, 4);
	return f;
}

static inline void mfs_snap_put_f64(unsigned char *p, double d)
{
	uint64_t v;
	memcpy(&v, &d, 8);
	mfs_snap_put_u64(p, v);
}

static inline double mfs_snap_get_f64(const unsigned char *p)
{
	uint64_t v = mfs_snap_get_u64(p);
	double d;
	memcpy(&d, &v, 8);
	return d;
}

/** Bytes of one row value: bias + k factors. */
static inline size_t mfs_snap_row_bytes(uint32_t k) { return 4u * (1u + (size_t)k); }

/* ---- keys ----------------------------------------------------------------------------- */
/** Encode a u64 id into out[9]. @return 9. */
static inline size_t mfs_snap_key_u64(unsigned char *out, uint64_t v)
{
	out[0] = MFS_SNAP_KEY_TAG_U64;
	for (int i = 0; i < 8; i++)
		out[1 + i] = (unsigned char)(v >> (56 - 8 * i));
	return 9;
}

/** Encode a string id (len 1..256, checked by the caller) into out[1 + len]. @return 1 + len. */
static inline size_t mfs_snap_key_str(unsigned char *out, const char *s, size_t len)
{
	out[0] = MFS_SNAP_KEY_TAG_STR;
	memcpy(out + 1, s, len);
	return 1 + len;
}

/** Decode a key. @return MFS_SNAP_KEY_TAG_U64 (*num set), MFS_SNAP_KEY_TAG_STR (*str, *len set),
 *  or 0 for a key that is not a valid encoded id. */
static inline int mfs_snap_key_decode(const unsigned char *key, size_t size, uint64_t *num, const char **str,
                                      size_t *len)
{
	if (size == 9 && key[0] == MFS_SNAP_KEY_TAG_U64) {
		uint64_t v = 0;
		for (int i = 0; i < 8; i++)
			v = v << 8 | key[1 + i];
		*num = v;
		return MFS_SNAP_KEY_TAG_U64;
	}
	if (size >= 2 && size <= MFS_SNAP_KEY_MAX && key[0] == MFS_SNAP_KEY_TAG_STR) {
		*str = (const char *)key + 1;
		*len = size - 1;
		return MFS_SNAP_KEY_TAG_STR;
	}
	return 0;
}

/* ---- user_rated values ---------------------------------------------------------------- */
/** Check a user_rated value: a u32 count, then that many entries of a u16 length (2..257)
 *  and an encoded id, nothing after. @return the count, or -1 when malformed. */
static inline long mfs_snap_rated_check(const unsigned char *v, size_t size)
{
	if (size < 4)
		return -1;
	const uint32_t n = mfs_snap_get_u32(v);
	size_t pos = 4;
	for (uint32_t j = 0; j < n; j++) {
		if (size - pos < 2)
			return -1;
		const size_t len = (size_t)v[pos] | (size_t)v[pos + 1] << 8;
		if (len < 2 || len > MFS_SNAP_KEY_MAX || size - pos - 2 < len)
			return -1;
		pos += 2 + len;
	}
	return pos == size ? (long)n : -1;
}

/** The entry at *pos of a checked user_rated value (start at *pos = 4): *key, *len; *pos moves
 *  to the next entry. */
static inline void mfs_snap_rated_next(const unsigned char *v, size_t *pos, const unsigned char **key, size_t *len)
{
	*len = (size_t)v[*pos] | (size_t)v[*pos + 1] << 8;
	*key = v + *pos + 2;
	*pos += 2 + *len;
}

/* ---- text form of ids (the same rules as model_store/id.c and mfsnap.py) -------------- */
/** Canonical decimal u64: "0" or 1..20 digits without a leading zero, < 2^64. @return 1 if so. */
static inline int mfs_snap_parse_canonical_u64(const char *s, size_t len, uint64_t *out)
{
	if (len == 0 || len > 20 || (len > 1 && s[0] == '0'))
		return 0;
	uint64_t v = 0;
	for (size_t i = 0; i < len; i++) {
		unsigned d = (unsigned)(unsigned char)s[i] - '0';
		if (d > 9 || v > (UINT64_MAX - d) / 10)
			return 0;
		v = v * 10 + d;
	}
	*out = v;
	return 1;
}

/** Does a string id need the "str:" prefix in text form (it would read back as a number,
 *  or it starts with "str:" itself)? */
static inline int mfs_snap_str_needs_prefix(const char *s, size_t len)
{
	uint64_t v;
	return mfs_snap_parse_canonical_u64(s, len, &v) || (len >= 4 && memcmp(s, "str:", 4) == 0);
}

/* ---- meta value types ------------------------------------------------------------------ */
enum mfs_snap_meta_type {
	MFS_SNAP_T_UNKNOWN = 0,
	MFS_SNAP_T_U32,
	MFS_SNAP_T_U64,
	MFS_SNAP_T_I64,
	MFS_SNAP_T_F64,
	MFS_SNAP_T_ASCII,
};

/* optional v1 meta keys written by `mfstream serve` (docs/SNAPSHOT_FORMAT.md) */
#define MFS_META_MU_COUNT "mu_count"          /* u64: ratings behind mu */
#define MFS_META_MU_SUM "mu_sum"              /* f64: their sum */
#define MFS_META_REPLAYED "events_replayed"  /* u64: replayed updates since the model began (serve.replay) */
#define MFS_META_DROPPED "events_dropped"    /* u64: valid events dropped: a new id found its table full */
#define MFS_META_PQ_RMSE "prequential_rmse"   /* f64: test-then-train RMSE since the previous snapshot */
#define MFS_META_PQ_N "prequential_n"         /* u64: events behind it (0: value carried over) */
#define MFS_META_PQ_WINDOW_RMSE "prequential_window_rmse" /* f64: over the last serve.prequential_window events */
#define MFS_META_PQ_WINDOW_N "prequential_window_n"       /* u64: events behind it */
#define MFS_META_PQ_CUM_RMSE "prequential_cumulative_rmse" /* f64: over every event scored since the model began */
#define MFS_META_PQ_CUM_N "prequential_cumulative_n"       /* u64: events behind it */
#define MFS_META_REJECTED_PREFIX "rejected/"  /* "rejected/<reason>" -> u64 messages rejected */
#define MFS_META_HELD_OUT "events_held_out"    /* u64: valid events held out (scored, never trained) */
#define MFS_META_DIGEST "events_digest"        /* u64: sum mod 2^64 of mfs_event_digest() of every valid event */
#define MFS_META_HOLDOUT_RMSE "holdout_rmse"   /* f64: RMSE over the retained holdout window (last full pass) */
#define MFS_META_WINDOW_RMSE "window_rmse"     /* f64: RMSE over the retained training window (last full pass) */

/** Type of an optional meta key (extra records a writer may add), or MFS_SNAP_T_UNKNOWN. */
static inline int mfs_snap_meta_type_optional(const char *key, size_t len)
{
	const size_t rlen = sizeof MFS_META_REJECTED_PREFIX - 1;
	if (len > rlen && memcmp(key, MFS_META_REJECTED_PREFIX, rlen) == 0)
		return MFS_SNAP_T_U64;
	static const struct {
		const char *k;
		int t;
	} tab[] = {
		{MFS_META_MU_COUNT, MFS_SNAP_T_U64}, {MFS_META_MU_SUM, MFS_SNAP_T_F64},
		{MFS_META_PQ_RMSE, MFS_SNAP_T_F64},  {MFS_META_PQ_N, MFS_SNAP_T_U64},
		{MFS_META_PQ_WINDOW_RMSE, MFS_SNAP_T_F64}, {MFS_META_PQ_WINDOW_N, MFS_SNAP_T_U64},
		{MFS_META_PQ_CUM_RMSE, MFS_SNAP_T_F64}, {MFS_META_PQ_CUM_N, MFS_SNAP_T_U64},
		{MFS_META_HELD_OUT, MFS_SNAP_T_U64}, {MFS_META_DIGEST, MFS_SNAP_T_U64},
		{MFS_META_REPLAYED, MFS_SNAP_T_U64},
		{MFS_META_DROPPED, MFS_SNAP_T_U64},
		{MFS_META_HOLDOUT_RMSE, MFS_SNAP_T_F64}, {MFS_META_WINDOW_RMSE, MFS_SNAP_T_F64},
	};
	for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
		if (strlen(tab[i].k) == len && memcmp(tab[i].k, key, len) == 0)
			return tab[i].t;
	return MFS_SNAP_T_UNKNOWN;
}

/** Type of a core meta key, the ones the writer owns (key is not NUL-terminated). Offsets
 *  keys are MFS_SNAP_T_I64. */
static inline int mfs_snap_meta_type_core(const char *key, size_t len)
{
	static const struct {
		const char *k;
		int t;
	} tab[] = {
		{MFS_META_VERSION, MFS_SNAP_T_U32}, {MFS_META_K, MFS_SNAP_T_U32},
		{MFS_META_DTYPE, MFS_SNAP_T_ASCII}, {MFS_META_MU, MFS_SNAP_T_F64},
		{MFS_META_N_USERS, MFS_SNAP_T_U64}, {MFS_META_N_ITEMS, MFS_SNAP_T_U64},
		{MFS_META_SEQ, MFS_SNAP_T_U64},     {MFS_META_WALL_MS, MFS_SNAP_T_I64},
		{MFS_META_EVENTS, MFS_SNAP_T_U64},  {MFS_META_LR, MFS_SNAP_T_F64},
		{MFS_META_LOSS, MFS_SNAP_T_F64},    {MFS_META_RMIN, MFS_SNAP_T_F64},
		{MFS_META_RMAX, MFS_SNAP_T_F64},
	};
	const size_t plen = sizeof MFS_META_OFFSET_PREFIX - 1;
	if (len > plen && memcmp(key, MFS_META_OFFSET_PREFIX, plen) == 0)
		return MFS_SNAP_T_I64;
	for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
		if (strlen(tab[i].k) == len && memcmp(tab[i].k, key, len) == 0)
			return tab[i].t;
	return MFS_SNAP_T_UNKNOWN;
}

/** Type of any known meta key, core or optional. */
static inline int mfs_snap_meta_type(const char *key, size_t len)
{
	int t = mfs_snap_meta_type_core(key, len);
	return t != MFS_SNAP_T_UNKNOWN ? t : mfs_snap_meta_type_optional(key, len);
}

#endif
