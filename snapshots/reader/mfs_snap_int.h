/* mfs_snap_int.h - libmfsnap's private layouts: the shared environment, the handle, the
 * item cache, and the helpers its files share. Only the files of snapshots/reader/ include it.
 *
 * Files: mfs_snap.c (environments, per-call txns, meta, lookups, predict, staleness),
 * snap_cache.c (the per-environment item cache, keyed by snapshot seq), snap_topk.c (the
 * top-K paths), snap_dot.c (the dot-product kernels and the int8 quantizer).
 */
#ifndef MFS_SNAP_INT_H
#define MFS_SNAP_INT_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"

/* int8 rows are padded to a multiple of this many bytes (zeros), so the kernel's inner
 * loop has a constant trip count the compiler vectorizes at -O2. */
#define SNAP_KBLOCK 64
/* Items per step of the int8 scan (its D, lower and upper bounds stay in L1). The int8 copy,
 * scales and biases are padded with zero rows to a multiple of it, so every step has the
 * same trip count and the bound loop vectorizes at -O2. */
#define SNAP_BLOCK 256
/* The smallest row or user scale of the int8 scan: their product (>= 2^-120) stays a normal
 * float, and the scan's absolute slack (2^-120) covers any rounding below it. */
#define SNAP_SCALE_MIN 0x1p-60f
/* mdb_reader_check at most this often per environment from the query path (ms). */
#define SNAP_READER_CHECK_MS 10000

/* The item cache of one snapshot: every item row copied out of LMDB into contiguous
 * arrays, in key order (so index order is key order: ties go to the smaller index), plus
 * an int8 copy for the approximate scan. Immutable once built; shared by every handle on
 * the environment and freed when the last reference goes. */
struct snap_cache {
	unsigned c_refs;        /* guarded by the env's e_cache_lock */
	uint64_t c_seq;         /* the snapshot it was built from */
	uint32_t c_k;           /* factors per row */
	uint32_t c_kpad;        /* int8 row stride: k rounded up to SNAP_KBLOCK */
	size_t c_n;             /* items */
	size_t c_npad;          /* c_n rounded up to SNAP_BLOCK: rows of q8, scale and bias */
	float *c_f32;           /* n x k factors, exact */
	float *c_bias;          /* npad biases, exact (zero padded) */
	int8_t *c_q8;           /* npad x kpad: q[i][j] = scale[i] * q8[i][j] + r, |r| <= scale[i] / 2 */
	float *c_scale;         /* npad row scales (>= max_j |q[i][j]| / 127) */
	float c_absmax;         /* max |factor| over all items */
	float c_bias_absmax;    /* max |bias| */
	unsigned char *c_keys;  /* the encoded keys, concatenated in key order */
	size_t *c_key_off;      /* n + 1 offsets into c_keys */
	double c_build_ms;      /* how long the build took */
};

/* One MDB_env per directory per process (see mfs_snap.c DESIGN). */
struct snap_env {
	struct snap_env *e_next;
	dev_t e_dev;
	ino_t e_ino;
	unsigned e_refs;
	MDB_env *e_env;
	MDB_dbi e_meta, e_users, e_items;
	MDB_dbi e_rated;              /* user_rated, when e_rated_ok */
	_Atomic int e_rated_ok;       /* the environment has a user_rated DB (an older writer's has not) */
	_Atomic uint64_t e_rated_seq; /* the snapshot of the last failed try to open it */
	pthread_mutex_t e_dbi_lock;   /* mdb_dbi_open calls, one at a time (LMDB's rule) */
	pthread_rwlock_t e_maplock;   /* shared: a txn is live; exclusive: remapping */
	pthread_mutex_t e_cache_lock; /* guards e_cache and every c_refs */
	pthread_mutex_t e_build_lock; /* one cache build at a time */
	struct snap_cache *e_cache;   /* the newest cache built (one reference), or NULL */
	_Atomic int64_t e_checked_ms; /* monotonic ms of the last mdb_reader_check */
};

/* One entry of a top-K selection heap. idx is the item's position in key order (cache
 * index, or cursor ordinal on the no-cache path), so the smaller idx is the smaller key;
 * key points into the map on the no-cache path (valid until the txn resets), else NULL. */
struct snap_cand {
	float score;
	size_t idx;
	const unsigned char *key;
	size_t key_len;
};

/* An encoded exclude id. */
struct snap_xkey {
	size_t len;
	unsigned char key[MFS_SNAP_KEY_MAX];
};

struct mfs_snap {
	struct snap_env *sn_env;
	MDB_txn *sn_txn;          /* reset between calls */
	size_t sn_meta_txnid;     /* txn id sn_meta was read in; 0 = none */
	mfs_snap_meta_t sn_meta;
	/* scratch reused by top-K calls (a handle serves one thread at a time) */
	float *sn_vec;            /* k floats: the user's factors */
	size_t sn_vec_cap;
	int16_t *sn_uq;           /* kpad: the user's factors quantized for the int8 scan */
	size_t sn_uq_cap;
	struct snap_cand *sn_heap;
	size_t sn_heap_cap;
	struct snap_cand *sn_cands; /* candidates of the int8 scan (score = upper bound) */
	size_t sn_cands_cap;
	float *sn_lheap;          /* min-heap of lower bounds during the int8 scan */
	size_t sn_lheap_cap;
	size_t *sn_excl;          /* excluded item indices, sorted */
	size_t sn_excl_cap;
	struct snap_xkey *sn_xkeys; /* the call's exclude ids, encoded */
	size_t sn_xkeys_cap;
};

/* ---- mfs_snap.c ---------------------------------------------------------------------------- */
/** LMDB/mfstream code -> the reader's code (MDB_NOTFOUND -> MFS_ENOTFOUND, others MFS_ELMDB). */
int snap_err(int rc);
/** Encode id into key[MFS_SNAP_KEY_MAX]. @return 0, MFS_EIDLEN, MFS_EINVAL. */
int snap_key(const mfs_snap_id_t *id, unsigned char *key, MDB_val *kv);
/** Renew the handle's txn and make sn_meta current; holds the map lock shared until snap_end.
 *  @return 0, MFS_ENOTFOUND, MFS_EFORMAT, MFS_EVERSION, MFS_ELMDB, errno. */
int snap_begin(mfs_snap_t *s);
void snap_end(mfs_snap_t *s);
/** Find id in dbi inside the live txn; *row points at the raw value (4 * (1 + k) bytes).
 *  @return 0, MFS_ENOTFOUND, MFS_EFORMAT, MFS_EIDLEN, MFS_EINVAL, MFS_ELMDB. */
int snap_row_find(mfs_snap_t *s, MDB_dbi dbi, const mfs_snap_id_t *id, const unsigned char **row);
/** The user_rated DBI, opened at the environment's open or, once per new snapshot until it
 *  exists, in a short txn of its own (a DBI opened after the live txn began is not valid in
 *  it: mdb_get then says EINVAL, read as "no list"). @return 1 and *dbi, or 0 when absent. */
int snap_rated_dbi(mfs_snap_t *s, MDB_dbi *dbi);
/** Grow *buf to hold n elements of size bytes. @return 0 or ENOMEM. */
int snap_grow(void **buf, size_t *cap, size_t n, size_t size);
/** Monotonic milliseconds. */
int64_t snap_mono_ms(void);

/* ---- snap_cache.c -------------------------------------------------------------------------- */
/** A reference to the cache of the handle's current snapshot (txn live, sn_meta current),
 *  building it from the txn if the environment has none for this seq. *built = 1 if this
 *  call built it. @return 0, EAGAIN (the environment's cache is from a newer snapshot than
 *  this txn: begin again), ENOMEM, MFS_EFORMAT, MFS_ELMDB. */
int snap_cache_acquire(mfs_snap_t *s, struct snap_cache **out, int *built);
void snap_cache_release(struct snap_env *e, struct snap_cache *c);
/** Drop the environment's own reference (at env destroy). */
void snap_cache_drop(struct snap_env *e);
/** Index of an encoded key in the cache, or SIZE_MAX. O(log n). */
size_t snap_cache_find(const struct snap_cache *c, const unsigned char *key, size_t len);

/* ---- snap_dot.c ---------------------------------------------------------------------------- */
/** out[i] = sum_j q8[i * kpad + j] * uq[j] (int32, exact) for i < n; kpad % SNAP_KBLOCK == 0. */
void snap_dot_i8(const int8_t *q8, size_t n, size_t kpad, const int16_t *uq, int32_t *out);
/** The int8 scan's lower and upper score bounds of one block of SNAP_BLOCK items (see
 *  snap_topk.c DESIGN). @return 1 if some up[b] >= thr, else 0 (skip the block). */
int snap_bounds_i8(const int32_t *dot, const float *scale, const float *bias, float base, float t, float a,
                   float thr, float *lo, float *up);
/** sum_j (double)p[j] * (double)q[j] in j order: the reference score's dot product. */
double snap_dot_exact(const float *p, const float *q, uint32_t k);
/** snap_dot_exact of four rows at once (same results; four independent chains). */
void snap_dot_exact4(const float *p, const float *q0, const float *q1, const float *q2, const float *q3,
                     uint32_t k, double out[4]);
/** snap_dot_exact of 16 consecutive rows q[r * k ..] at once (same results, bit for bit). */
void snap_dot_exact16(const float *p, const float *q, uint32_t k, double out[16]);
/** Quantize row x (k floats) into c (kpad int8, zero padded). @return the scale s: 0 for a
 *  zero row, else the smallest float >= max |x| / 127 but at least SNAP_SCALE_MIN; always
 *  |x[j] - s * c[j]| <= s / 2 (up to 2^-44 s). */
float snap_quantize_row(const float *x, uint32_t k, uint32_t kpad, int8_t *c);

#endif
