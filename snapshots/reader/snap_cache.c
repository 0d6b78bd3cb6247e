/* snap_cache.c - libmfsnap's item cache: every item row of one snapshot in contiguous
 * arrays (exact fp32 factors and biases, an int8 copy with per-row scales, the keys), for
 * the top-K scans of snap_topk.c.
 *
 * DESIGN
 * Keyed by seq. A snapshot may rewrite any subset of rows (only the touched ones), and the
 * format keeps no list of what changed, so the cache is valid for exactly one seq and a new
 * seq means a full rebuild: one cursor pass over the items DB inside the caller's read txn
 * (which therefore stays open for the whole build; O(n_items * k), measured by
 * bench/reader.sh). Rebuilding only what changed would need a change log in the format.
 *
 * Sharing. One cache per environment (so per directory per process), not per handle: at
 * 1 M items x k = 128 it is ~670 MB. e_cache holds a reference to the newest cache; a
 * query holds one for its duration, so a rebuild never frees rows under a running scan
 * (the old cache goes when its last query does; peak memory is two caches). Builds are
 * serialized by e_build_lock; a query whose txn is older than the cache (another thread
 * built a newer one meanwhile) gets EAGAIN and begins a fresh txn - it never mixes a
 * user row of one snapshot with items of another.
 *
 * Lock order: e_maplock (shared, held by the caller) -> e_build_lock -> e_cache_lock.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "snapshots/reader/mfs_snap_int.h"
#include "snapshots/snap_format.h"

static void cache_free(struct snap_cache *c)
{
	if (!c)
		return;
	free(c->c_f32);
	free(c->c_bias);
	free(c->c_q8);
	free(c->c_scale);
	free(c->c_keys);
	free(c->c_key_off);
	free(c);
}

/* aligned_alloc wants a size that is a multiple of the alignment */
static void *alloc64(size_t bytes)
{
	size_t sz = (bytes + 63) & ~(size_t)63;
	return aligned_alloc(64, sz ? sz : 64);
}

/* Copy every item row of the live txn into a new cache. @return 0, ENOMEM, MFS_EFORMAT,
 * MFS_ELMDB. */
static int cache_build(mfs_snap_t *s, struct snap_cache **out)
{
	struct snap_env *e = s->sn_env;
	const uint32_t k = s->sn_meta.k;
	const size_t row_bytes = mfs_snap_row_bytes(k);
	int64_t t0 = snap_mono_ms();
	MDB_stat st;
	MDB_cursor *cur = NULL;
	MDB_val kv, v;
	int rc = mdb_stat(s->sn_txn, e->e_items, &st);
	if (rc)
		return snap_err(rc);
	struct snap_cache *c = calloc(1, sizeof *c);
	if (!c)
		return ENOMEM;
	size_t n = (size_t)st.ms_entries;
	c->c_seq = s->sn_meta.seq;
	c->c_k = k;
	c->c_kpad = (uint32_t)(((size_t)k + SNAP_KBLOCK - 1) / SNAP_KBLOCK * SNAP_KBLOCK);
	c->c_n = n;
	c->c_npad = (n + SNAP_BLOCK - 1) / SNAP_BLOCK * SNAP_BLOCK;
	size_t npad = c->c_npad, keys_cap = n * 9 + 64; /* u64 ids; string ids grow it */
	if (n > SIZE_MAX / 8 / ((size_t)c->c_kpad + 1) ||
	    !(c->c_f32 = alloc64(n * k * sizeof(float))) || !(c->c_bias = alloc64(npad * sizeof(float))) ||
	    !(c->c_q8 = alloc64(npad * c->c_kpad)) || !(c->c_scale = alloc64(npad * sizeof(float))) ||
	    !(c->c_key_off = malloc((n + 1) * sizeof(size_t))) || !(c->c_keys = malloc(keys_cap))) {
		rc = ENOMEM;
		goto fail;
	}
	if ((rc = mdb_cursor_open(s->sn_txn, e->e_items, &cur))) {
		rc = snap_err(rc);
		goto fail;
	}
	size_t i = 0, key_bytes = 0;
	float absmax = 0.0f, bias_absmax = 0.0f;
	for (rc = mdb_cursor_get(cur, &kv, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &kv, &v, MDB_NEXT)) {
		if (v.mv_size != row_bytes || i >= n) {
			rc = MFS_EFORMAT;
			goto fail;
		}
		if (key_bytes + kv.mv_size > keys_cap) {
			size_t cap = keys_cap * 2 + kv.mv_size;
			unsigned char *nk = realloc(c->c_keys, cap);
			if (!nk) {
				rc = ENOMEM;
				goto fail;
			}
			c->c_keys = nk;
			keys_cap = cap;
		}
		c->c_key_off[i] = key_bytes;
		memcpy(c->c_keys + key_bytes, kv.mv_data, kv.mv_size);
		key_bytes += kv.mv_size;
		const unsigned char *row = v.mv_data;
		float *f = c->c_f32 + i * k;
		c->c_bias[i] = mfs_snap_get_f32(row);
		bias_absmax = fabsf(c->c_bias[i]) > bias_absmax ? fabsf(c->c_bias[i]) : bias_absmax;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		memcpy(f, row + 4, 4 * (size_t)k); /* the format is little-endian floats */
#else
		for (uint32_t j = 0; j < k; j++)
			f[j] = mfs_snap_get_f32(row + 4 + 4 * (size_t)j);
#endif
		c->c_scale[i] = snap_quantize_row(f, k, c->c_kpad, c->c_q8 + i * c->c_kpad);
		/* 127 * scale >= max |f| (the scale is rounded up) */
		absmax = 127.0f * c->c_scale[i] > absmax ? 127.0f * c->c_scale[i] : absmax;
		i++;
	}
	if (rc != MDB_NOTFOUND) {
		rc = snap_err(rc);
		goto fail;
	}
	if (i != n) {
		rc = MFS_EFORMAT;
		goto fail;
	}
	mdb_cursor_close(cur);
	/* the padding rows: zero factors, scale and bias (the scan never returns them) */
	memset(c->c_q8 + n * c->c_kpad, 0, (npad - n) * c->c_kpad);
	memset(c->c_scale + n, 0, (npad - n) * sizeof(float));
	memset(c->c_bias + n, 0, (npad - n) * sizeof(float));
	c->c_key_off[n] = key_bytes;
	c->c_absmax = absmax;
	c->c_bias_absmax = bias_absmax;
	c->c_build_ms = (double)(snap_mono_ms() - t0);
	*out = c;
	return 0;
fail:
	if (cur)
		mdb_cursor_close(cur);
	cache_free(c);
	return rc;
}

/* Take a reference to e_cache if it is for seq. Called with e_cache_lock held.
 * @return 0 (taken), EAGAIN (newer than seq), MFS_ENOTFOUND (none or older). */
static int cache_take(struct snap_env *e, uint64_t seq, struct snap_cache **out)
{
	struct snap_cache *c = e->e_cache;
	if (!c || c->c_seq < seq)
		return MFS_ENOTFOUND;
	if (c->c_seq > seq)
		return EAGAIN;
	c->c_refs++;
	*out = c;
	return 0;
}

int snap_cache_acquire(mfs_snap_t *s, struct snap_cache **out, int *built)
{
	struct snap_env *e = s->sn_env;
	uint64_t seq = s->sn_meta.seq;
	*built = 0;
	pthread_mutex_lock(&e->e_cache_lock);
	int rc = cache_take(e, seq, out);
	pthread_mutex_unlock(&e->e_cache_lock);
	if (rc != MFS_ENOTFOUND)
		return rc;
	pthread_mutex_lock(&e->e_build_lock);
	/* another thread may have built it while we waited */
	pthread_mutex_lock(&e->e_cache_lock);
	rc = cache_take(e, seq, out);
	pthread_mutex_unlock(&e->e_cache_lock);
	if (rc != MFS_ENOTFOUND) {
		pthread_mutex_unlock(&e->e_build_lock);
		return rc;
	}
	struct snap_cache *c = NULL, *old = NULL;
	if ((rc = cache_build(s, &c)) == 0) {
		c->c_refs = 2; /* the environment's and the caller's */
		pthread_mutex_lock(&e->e_cache_lock);
		old = e->e_cache;
		e->e_cache = c;
		if (old && --old->c_refs != 0)
			old = NULL; /* a running query still holds it; it frees it */
		pthread_mutex_unlock(&e->e_cache_lock);
		*out = c;
		*built = 1;
	}
	pthread_mutex_unlock(&e->e_build_lock);
	cache_free(old); /* outside the locks: freeing ~GB takes a while */
	return rc;
}

void snap_cache_release(struct snap_env *e, struct snap_cache *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&e->e_cache_lock);
	int last = --c->c_refs == 0;
	pthread_mutex_unlock(&e->e_cache_lock);
	if (last)
		cache_free(c);
}

void snap_cache_drop(struct snap_env *e)
{
	pthread_mutex_lock(&e->e_cache_lock);
	struct snap_cache *c = e->e_cache;
	e->e_cache = NULL;
	int last = c && --c->c_refs == 0;
	pthread_mutex_unlock(&e->e_cache_lock);
	if (last)
		cache_free(c);
}

/* LMDB's default key order: memcmp over the shorter length, then the shorter key first. */
static int key_cmp(const unsigned char *a, size_t al, const unsigned char *b, size_t bl)
{
	int r = memcmp(a, b, al < bl ? al : bl);
	return r ? r : al < bl ? -1 : al > bl;
}

size_t snap_cache_find(const struct snap_cache *c, const unsigned char *key, size_t len)
{
	size_t lo = 0, hi = c->c_n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const unsigned char *mk = c->c_keys + c->c_key_off[mid];
		int r = key_cmp(mk, c->c_key_off[mid + 1] - c->c_key_off[mid], key, len);
		if (r == 0)
			return mid;
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return SIZE_MAX;
}
