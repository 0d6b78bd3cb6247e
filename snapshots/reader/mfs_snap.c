/* mfs_snap.c - libmfsnap: the serving-side reader of snapshot format v1 (snap_format.h).
 *
 * Built from this file and common/err.c only: it links LMDB and libc, never mfs_core.
 *
 * DESIGN
 * Environments. LMDB forbids opening one environment twice in a process (closing either
 * copy drops the other's POSIX locks on lock.mdb). So handles on the same directory share
 * one MDB_env, found in a process-wide registry by (st_dev, st_ino) and reference counted;
 * the three DBIs are opened once, when the env is, in a read txn that is committed so the
 * handles stay valid for everyone.
 *
 * Transactions. Each handle owns one MDB_RDONLY txn (the env is MDB_NOTLS, so the txn is
 * not tied to a thread). A call renews it, reads, and resets it: no read txn outlives a
 * call, so the writer can always reuse pages, and every call sees one whole snapshot (the
 * meta it uses and the rows it reads come from the same txn). The decoded meta is cached
 * per handle under the txn id (mdb_txn_id), so a call pays the meta lookups only after a
 * new snapshot was published.
 *
 * MAP_RESIZED. When the writer grows the map beyond ours, mdb_txn_renew fails with
 * MDB_MAP_RESIZED (leaving the txn reset, not freed). We then adopt the new size with
 * mdb_env_set_mapsize(env, 0) and renew again. set_mapsize remaps the file, which is only
 * allowed with no live txn in the process: every call holds the env's map lock shared from
 * renew to reset, and the remap takes it exclusive.
 *
 * Errors. LMDB's MDB_NOTFOUND becomes MFS_ENOTFOUND, its other negative codes MFS_ELMDB,
 * and positive errnos pass through. A row whose value is not 4 * (1 + k) bytes, or a meta
 * record of the wrong size, is MFS_EFORMAT.
 */
#include "snapshots/reader/mfs_snap.h"

#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "snapshots/snap_format.h"

/* One MDB_env per directory per process (see DESIGN). */
struct snap_env {
	struct snap_env *e_next;
	dev_t e_dev;
	ino_t e_ino;
	unsigned e_refs;
	MDB_env *e_env;
	MDB_dbi e_meta, e_users, e_items;
	pthread_rwlock_t e_maplock; /* shared: a txn is live; exclusive: remapping */
};

static pthread_mutex_t snap_envs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct snap_env *snap_envs;

/* One item in the top-K heap: the key points into the map, valid until the txn resets. */
struct snap_cand {
	float score;
	const unsigned char *key;
	size_t key_len;
};

struct mfs_snap {
	struct snap_env *sn_env;
	MDB_txn *sn_txn;          /* reset between calls */
	size_t sn_meta_txnid;     /* txn id sn_meta was read in; 0 = none */
	mfs_snap_meta_t sn_meta;
	float *sn_vec;            /* k floats: the user's factors during topk */
	uint32_t sn_vec_k;
	struct snap_cand *sn_heap;
	size_t sn_heap_cap;
};

static int snap_err(int rc)
{
	if (rc == 0 || rc > 0)
		return rc;
	if (rc == MDB_NOTFOUND)
		return MFS_ENOTFOUND;
	if (rc >= MFS_E_FIRST && rc <= MFS_E_LAST)
		return rc;
	return MFS_ELMDB;
}

const char *mfs_snap_strerror(int err)
{
	if (err >= MDB_KEYEXIST && err <= MDB_LAST_ERRCODE)
		return mdb_strerror(err);
	return mfs_strerror(err);
}

int mfs_snap_id_parse(const char *text, mfs_snap_id_t *out)
{
	if (!text || !out)
		return MFS_EINVAL;
	size_t len = strlen(text);
	uint64_t v;
	memset(out, 0, sizeof *out);
	if (mfs_snap_parse_canonical_u64(text, len, &v)) {
		out->kind = MFS_SNAP_ID_U64;
		out->num = v;
		return 0;
	}
	if (len >= 4 && memcmp(text, "str:", 4) == 0) {
		text += 4;
		len -= 4;
	}
	if (len == 0 || len > MFS_SNAP_ID_MAX)
		return MFS_EIDLEN;
	out->kind = MFS_SNAP_ID_STR;
	out->str = text;
	out->len = len;
	return 0;
}

/* Encode id into key[MFS_SNAP_KEY_MAX]. @return 0, MFS_EIDLEN, MFS_EINVAL. */
static int snap_key(const mfs_snap_id_t *id, unsigned char *key, MDB_val *kv)
{
	if (!id)
		return MFS_EINVAL;
	if (id->kind == MFS_SNAP_ID_U64) {
		kv->mv_size = mfs_snap_key_u64(key, id->num);
	} else if (id->kind == MFS_SNAP_ID_STR) {
		if (id->len == 0 || id->len > MFS_SNAP_ID_MAX)
			return MFS_EIDLEN;
		if (!id->str)
			return MFS_EINVAL;
		kv->mv_size = mfs_snap_key_str(key, id->str, id->len);
	} else {
		return MFS_EINVAL;
	}
	kv->mv_data = key;
	return 0;
}

/* ---- meta ------------------------------------------------------------------------------- */
static int meta_get(MDB_txn *txn, MDB_dbi dbi, const char *key, size_t size, MDB_val *v)
{
	MDB_val k = {strlen(key), (void *)(uintptr_t)key};
	int rc = mdb_get(txn, dbi, &k, v);
	if (rc)
		return snap_err(rc);
	return v->mv_size == size ? 0 : MFS_EFORMAT;
}

/* Read and check the whole meta record of txn's snapshot. A missing seq (the writer has
 * opened the env but published nothing) is MFS_ENOTFOUND. */
static int meta_load(MDB_txn *txn, MDB_dbi dbi, mfs_snap_meta_t *m)
{
	MDB_val v;
	int rc;
	memset(m, 0, sizeof *m);
	if ((rc = meta_get(txn, dbi, MFS_META_SEQ, 8, &v)))
		return rc;
	m->seq = mfs_snap_get_u64(v.mv_data);
	if ((rc = meta_get(txn, dbi, MFS_META_VERSION, 4, &v)))
		return rc == MFS_ENOTFOUND ? MFS_EFORMAT : rc;
	m->format_version = mfs_snap_get_u32(v.mv_data);
	if (m->format_version != MFS_SNAP_VERSION)
		return MFS_EVERSION;
	if ((rc = meta_get(txn, dbi, MFS_META_DTYPE, 3, &v)) || memcmp(v.mv_data, MFS_SNAP_DTYPE, 3) != 0)
		return rc && rc != MFS_ENOTFOUND ? rc : MFS_EFORMAT;

#define META_FIELD(key, size, expr)                                                    \
	do {                                                                               \
		if ((rc = meta_get(txn, dbi, key, size, &v)))                                  \
			return rc == MFS_ENOTFOUND ? MFS_EFORMAT : rc;                             \
		expr;                                                                          \
	} while (0)
	META_FIELD(MFS_META_K, 4, m->k = mfs_snap_get_u32(v.mv_data));
	META_FIELD(MFS_META_MU, 8, m->mu = mfs_snap_get_f64(v.mv_data));
	META_FIELD(MFS_META_N_USERS, 8, m->n_users = mfs_snap_get_u64(v.mv_data));
	META_FIELD(MFS_META_N_ITEMS, 8, m->n_items = mfs_snap_get_u64(v.mv_data));
	META_FIELD(MFS_META_WALL_MS, 8, m->wall_time_ms = (int64_t)mfs_snap_get_u64(v.mv_data));
	META_FIELD(MFS_META_EVENTS, 8, m->events_applied = mfs_snap_get_u64(v.mv_data));
	META_FIELD(MFS_META_LR, 8, m->learning_rate = mfs_snap_get_f64(v.mv_data));
	META_FIELD(MFS_META_LOSS, 8, m->last_loss = mfs_snap_get_f64(v.mv_data));
	META_FIELD(MFS_META_RMIN, 8, m->rating_min = mfs_snap_get_f64(v.mv_data));
	META_FIELD(MFS_META_RMAX, 8, m->rating_max = mfs_snap_get_f64(v.mv_data));
#undef META_FIELD
	if (m->k == 0)
		return MFS_EFORMAT;
	return 0;
}

/* ---- the shared environment --------------------------------------------------------------- */
static void env_destroy(struct snap_env *e)
{
	if (e->e_env)
		mdb_env_close(e->e_env);
	pthread_rwlock_destroy(&e->e_maplock);
	free(e);
}

/* Open dir's env read-only and its three DBIs. Called with snap_envs_lock held. */
static int env_create(const char *dir, const struct stat *st, struct snap_env **out, char *errstr, size_t es)
{
	struct snap_env *e = calloc(1, sizeof *e);
	MDB_txn *txn = NULL;
	int rc;
	if (!e)
		return mfs_errf(errstr, es, ENOMEM, "out of memory");
	if ((rc = pthread_rwlock_init(&e->e_maplock, NULL))) {
		free(e);
		return mfs_errf(errstr, es, rc, "pthread_rwlock_init: %s", strerror(rc));
	}
	e->e_dev = st->st_dev;
	e->e_ino = st->st_ino;
	e->e_refs = 1;
	if ((rc = mdb_env_create(&e->e_env))) {
		e->e_env = NULL;
		goto lmdb_fail;
	}
	if ((rc = mdb_env_set_maxdbs(e->e_env, MFS_SNAP_MAX_DBS)) ||
	    (rc = mdb_env_set_maxreaders(e->e_env, MFS_SNAP_MAX_READERS)))
		goto lmdb_fail;
	/* MDB_NOTLS: txns belong to handles, not threads. Never MDB_NOLOCK: the writer
	 * must see our reader slots or it would overwrite pages we are reading. */
	if ((rc = mdb_env_open(e->e_env, dir, MDB_RDONLY | MDB_NOTLS, 0644))) {
		if (rc == ENOENT) {
			rc = mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s yet (no data.mdb)", dir);
			goto fail;
		}
		goto lmdb_fail;
	}
	for (int tries = 0;; tries++) {
		rc = mdb_txn_begin(e->e_env, NULL, MDB_RDONLY, &txn);
		if (rc != MDB_MAP_RESIZED || tries >= 8)
			break;
		if ((rc = mdb_env_set_mapsize(e->e_env, 0)))
			break;
	}
	if (rc) {
		txn = NULL;
		goto lmdb_fail;
	}
	if ((rc = mdb_dbi_open(txn, MFS_SNAP_DB_META, 0, &e->e_meta)) ||
	    (rc = mdb_dbi_open(txn, MFS_SNAP_DB_USERS, 0, &e->e_users)) ||
	    (rc = mdb_dbi_open(txn, MFS_SNAP_DB_ITEMS, 0, &e->e_items))) {
		if (rc == MDB_NOTFOUND) {
			rc = mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s yet (no \"%s\" database)", dir,
			              MFS_SNAP_DB_META);
			goto fail;
		}
		goto lmdb_fail;
	}
	/* committing a read txn keeps the DBI handles open for every later txn */
	rc = mdb_txn_commit(txn);
	txn = NULL;
	if (rc)
		goto lmdb_fail;
	*out = e;
	return 0;
lmdb_fail:
	rc = mfs_errf(errstr, es, rc > 0 ? rc : MFS_ELMDB, "LMDB: opening %s: %s", dir, mdb_strerror(rc));
fail:
	if (txn)
		mdb_txn_abort(txn);
	env_destroy(e);
	return rc;
}

static int env_acquire(const char *dir, struct snap_env **out, char *errstr, size_t es)
{
	struct stat st;
	if (stat(dir, &st) != 0) {
		int err = errno;
		if (err == ENOENT)
			return mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s yet (no such directory)", dir);
		return mfs_errf(errstr, es, err, "%s: %s", dir, strerror(err));
	}
	if (!S_ISDIR(st.st_mode))
		return mfs_errf(errstr, es, ENOTDIR, "%s: not a directory (a snapshot is an LMDB directory)", dir);
	int rc = 0;
	pthread_mutex_lock(&snap_envs_lock);
	struct snap_env *e;
	for (e = snap_envs; e; e = e->e_next)
		if (e->e_dev == st.st_dev && e->e_ino == st.st_ino)
			break;
	if (e) {
		e->e_refs++;
	} else if ((rc = env_create(dir, &st, &e, errstr, es)) == 0) {
		e->e_next = snap_envs;
		snap_envs = e;
	}
	pthread_mutex_unlock(&snap_envs_lock);
	if (rc == 0)
		*out = e;
	return rc;
}

static void env_release(struct snap_env *e)
{
	pthread_mutex_lock(&snap_envs_lock);
	if (--e->e_refs == 0) {
		struct snap_env **pp = &snap_envs;
		while (*pp != e)
			pp = &(*pp)->e_next;
		*pp = e->e_next;
		env_destroy(e);
	}
	pthread_mutex_unlock(&snap_envs_lock);
}

/* ---- per-call transactions ------------------------------------------------------------------ */
/* Renew the handle's txn (adopting a grown map if needed) and make sn_meta current. On
 * success the map lock is held shared until snap_end. */
static int snap_begin(mfs_snap_t *s)
{
	struct snap_env *e = s->sn_env;
	int rc;
	for (int tries = 0;; tries++) {
		pthread_rwlock_rdlock(&e->e_maplock);
		rc = mdb_txn_renew(s->sn_txn);
		if (rc == 0)
			break;
		pthread_rwlock_unlock(&e->e_maplock);
		if (rc != MDB_MAP_RESIZED || tries >= 16)
			return snap_err(rc);
		/* the writer grew the file past our map: remap with no txn live in the process */
		pthread_rwlock_wrlock(&e->e_maplock);
		rc = mdb_env_set_mapsize(e->e_env, 0);
		pthread_rwlock_unlock(&e->e_maplock);
		if (rc)
			return snap_err(rc);
	}
	size_t id = mdb_txn_id(s->sn_txn);
	if (id != s->sn_meta_txnid) {
		s->sn_meta_txnid = 0;
		if ((rc = meta_load(s->sn_txn, e->e_meta, &s->sn_meta))) {
			mdb_txn_reset(s->sn_txn);
			pthread_rwlock_unlock(&e->e_maplock);
			return rc;
		}
		s->sn_meta_txnid = id;
	}
	return 0;
}

static void snap_end(mfs_snap_t *s)
{
	mdb_txn_reset(s->sn_txn);
	pthread_rwlock_unlock(&s->sn_env->e_maplock);
}

int mfs_snap_open(const char *dir, mfs_snap_t **out, char *errstr, size_t errstr_size)
{
	if (!dir || !*dir || !out)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "mfs_snap_open: no directory given");
	*out = NULL;
	mfs_snap_t *s = calloc(1, sizeof *s);
	if (!s)
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	int rc = env_acquire(dir, &s->sn_env, errstr, errstr_size);
	if (rc) {
		free(s);
		return rc;
	}
	rc = mdb_txn_begin(s->sn_env->e_env, NULL, MDB_RDONLY, &s->sn_txn);
	if (rc == 0) {
		mdb_txn_reset(s->sn_txn);
	} else if (rc == MDB_MAP_RESIZED) {
		/* begin failed before the txn existed; make one through the remap path */
		pthread_rwlock_wrlock(&s->sn_env->e_maplock);
		rc = mdb_env_set_mapsize(s->sn_env->e_env, 0);
		pthread_rwlock_unlock(&s->sn_env->e_maplock);
		if (rc == 0 && (rc = mdb_txn_begin(s->sn_env->e_env, NULL, MDB_RDONLY, &s->sn_txn)) == 0)
			mdb_txn_reset(s->sn_txn);
	}
	if (rc) {
		s->sn_txn = NULL;
		rc = mfs_errf(errstr, errstr_size, rc > 0 ? rc : MFS_ELMDB, "LMDB: read txn on %s: %s", dir,
		              mdb_strerror(rc));
		goto fail;
	}
	/* validate the snapshot now, so a bad directory fails at open and not at first use */
	if ((rc = snap_begin(s))) {
		if (rc == MFS_ENOTFOUND)
			mfs_errf(errstr, errstr_size, rc, "no snapshot in %s yet (nothing published)", dir);
		else if (rc == MFS_EVERSION)
			mfs_errf(errstr, errstr_size, rc, "%s holds snapshot format version %u; this reader reads %u",
			         dir, s->sn_meta.format_version, MFS_SNAP_VERSION);
		else
			mfs_errf(errstr, errstr_size, rc, "%s: reading the snapshot meta: %s", dir,
			         mfs_snap_strerror(rc));
		goto fail;
	}
	snap_end(s);
	*out = s;
	return 0;
fail:
	mfs_snap_close(s);
	return rc;
}

void mfs_snap_close(mfs_snap_t *s)
{
	if (!s)
		return;
	if (s->sn_txn)
		mdb_txn_abort(s->sn_txn);
	if (s->sn_env)
		env_release(s->sn_env);
	free(s->sn_vec);
	free(s->sn_heap);
	free(s);
}

int mfs_snap_get_meta(mfs_snap_t *s, mfs_snap_meta_t *out)
{
	if (!s || !out)
		return MFS_EINVAL;
	int rc = snap_begin(s);
	if (rc)
		return rc;
	*out = s->sn_meta;
	snap_end(s);
	return 0;
}

int mfs_snap_meta_each(struct mfs_snap *s, mfs_snap_meta_fn fn, void *ctx)
{
	if (!s || !fn)
		return MFS_EINVAL;
	int rc = snap_begin(s);
	if (rc)
		return rc;
	MDB_cursor *cur;
	MDB_val k, v;
	if ((rc = mdb_cursor_open(s->sn_txn, s->sn_env->e_meta, &cur)) == 0) {
		int stop = 0;
		for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0 && !stop;
		     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
			stop = fn(ctx, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
		rc = stop ? stop : rc == MDB_NOTFOUND ? 0 : snap_err(rc);
		mdb_cursor_close(cur);
	} else {
		rc = snap_err(rc);
	}
	snap_end(s);
	return rc;
}

/* ---- rows --------------------------------------------------------------------------------------- */
/* Find id in dbi inside the live txn; *row points at the raw value (4 * (1 + k) bytes). */
static int row_find(mfs_snap_t *s, MDB_dbi dbi, const mfs_snap_id_t *id, const unsigned char **row)
{
	unsigned char key[MFS_SNAP_KEY_MAX];
	MDB_val kv, v;
	int rc = snap_key(id, key, &kv);
	if (rc)
		return rc;
	if ((rc = mdb_get(s->sn_txn, dbi, &kv, &v)))
		return snap_err(rc);
	if (v.mv_size != mfs_snap_row_bytes(s->sn_meta.k))
		return MFS_EFORMAT;
	*row = v.mv_data;
	return 0;
}

static int row_get(mfs_snap_t *s, int items, const mfs_snap_id_t *id, float *bias, float *vec)
{
	if (!s)
		return MFS_EINVAL;
	int rc = snap_begin(s);
	if (rc)
		return rc;
	const unsigned char *row;
	rc = row_find(s, items ? s->sn_env->e_items : s->sn_env->e_users, id, &row);
	if (rc == 0) {
		if (bias)
			*bias = mfs_snap_get_f32(row);
		if (vec)
			for (uint32_t j = 0; j < s->sn_meta.k; j++)
				vec[j] = mfs_snap_get_f32(row + 4 + 4 * (size_t)j);
	}
	snap_end(s);
	return rc;
}

int mfs_snap_user(mfs_snap_t *s, const mfs_snap_id_t *id, float *bias, float *vec)
{
	return row_get(s, 0, id, bias, vec);
}

int mfs_snap_item(mfs_snap_t *s, const mfs_snap_id_t *id, float *bias, float *vec)
{
	return row_get(s, 1, id, bias, vec);
}

/* p . q over two raw rows (skipping the bias), accumulated in double. */
static double row_dot(const unsigned char *a, const unsigned char *b, uint32_t k)
{
	double acc = 0.0;
	for (uint32_t j = 0; j < k; j++)
		acc += (double)mfs_snap_get_f32(a + 4 + 4 * (size_t)j) * (double)mfs_snap_get_f32(b + 4 + 4 * (size_t)j);
	return acc;
}

int mfs_snap_predict(mfs_snap_t *s, const mfs_snap_id_t *user, const mfs_snap_id_t *item, float *out,
                     int *known)
{
	if (!s || !out)
		return MFS_EINVAL;
	unsigned char scratch[MFS_SNAP_KEY_MAX];
	MDB_val kv;
	int rc;
	/* reject malformed ids before touching the txn */
	if ((rc = snap_key(user, scratch, &kv)) || (rc = snap_key(item, scratch, &kv)))
		return rc;
	if ((rc = snap_begin(s)))
		return rc;
	const unsigned char *ru = NULL, *ri = NULL;
	int ku = row_find(s, s->sn_env->e_users, user, &ru);
	int ki = row_find(s, s->sn_env->e_items, item, &ri);
	if ((ku && ku != MFS_ENOTFOUND) || (ki && ki != MFS_ENOTFOUND)) {
		snap_end(s);
		return ku && ku != MFS_ENOTFOUND ? ku : ki;
	}
	const mfs_snap_meta_t *m = &s->sn_meta;
	double r = m->mu;
	if (!ku)
		r += (double)mfs_snap_get_f32(ru);
	if (!ki)
		r += (double)mfs_snap_get_f32(ri);
	if (!ku && !ki)
		r += row_dot(ru, ri, m->k);
	if (m->rating_min <= m->rating_max) {
		if (r < m->rating_min)
			r = m->rating_min;
		if (r > m->rating_max)
			r = m->rating_max;
	}
	snap_end(s);
	*out = (float)r;
	if (known)
		*known = (ku ? 0 : 1) | (ki ? 0 : 2);
	return 0;
}

/* ---- top-K ---------------------------------------------------------------------------------------- */
/* a ranks before b: higher score, then the smaller key (deterministic ties) */
static int cand_better(const struct snap_cand *a, const struct snap_cand *b)
{
	if (a->score != b->score)
		return a->score > b->score;
	size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
	int c = memcmp(a->key, b->key, n);
	return c ? c < 0 : a->key_len < b->key_len;
}

/* The heap keeps the worst candidate at h[0]. */
static void heap_sift_down(struct snap_cand *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, w = i;
		if (l < n && cand_better(&h[w], &h[l]))
			w = l;
		if (l + 1 < n && cand_better(&h[w], &h[l + 1]))
			w = l + 1;
		if (w == i)
			return;
		struct snap_cand t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

static void heap_sift_up(struct snap_cand *h, size_t i)
{
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!cand_better(&h[p], &h[i]))
			return;
		struct snap_cand t = h[i];
		h[i] = h[p];
		h[p] = t;
		i = p;
	}
}

int mfs_snap_topk(mfs_snap_t *s, const mfs_snap_id_t *user, size_t k, mfs_snap_hit_t *out, size_t *n_out)
{
	if (!s || !n_out || (k && !out))
		return MFS_EINVAL;
	*n_out = 0;
	unsigned char scratch[MFS_SNAP_KEY_MAX];
	MDB_val kv, v;
	int rc;
	if ((rc = snap_key(user, scratch, &kv)))
		return rc;
	if ((rc = snap_begin(s)))
		return rc;
	const mfs_snap_meta_t *m = &s->sn_meta;
	struct snap_env *e = s->sn_env;
	MDB_cursor *cur = NULL;
	const unsigned char *ru;
	if ((rc = row_find(s, e->e_users, user, &ru)))
		goto out;
	if (k == 0)
		goto out;
	MDB_stat st;
	if ((rc = mdb_stat(s->sn_txn, e->e_items, &st))) {
		rc = snap_err(rc);
		goto out;
	}
	size_t cap = k < st.ms_entries ? k : (size_t)st.ms_entries;
	if (cap > s->sn_heap_cap) {
		struct snap_cand *h = realloc(s->sn_heap, cap * sizeof *h);
		if (!h) {
			rc = ENOMEM;
			goto out;
		}
		s->sn_heap = h;
		s->sn_heap_cap = cap;
	}
	if (m->k > s->sn_vec_k) {
		float *vec = realloc(s->sn_vec, m->k * sizeof *vec);
		if (!vec) {
			rc = ENOMEM;
			goto out;
		}
		s->sn_vec = vec;
		s->sn_vec_k = m->k;
	}
	/* decode the user once; items are read in place from the map */
	float *p = s->sn_vec;
	for (uint32_t j = 0; j < m->k; j++)
		p[j] = mfs_snap_get_f32(ru + 4 + 4 * (size_t)j);
	double base = m->mu + (double)mfs_snap_get_f32(ru);
	const size_t row_bytes = mfs_snap_row_bytes(m->k);
	struct snap_cand *h = s->sn_heap;
	size_t n = 0;
	if ((rc = mdb_cursor_open(s->sn_txn, e->e_items, &cur))) {
		rc = snap_err(rc);
		goto out;
	}
	for (rc = mdb_cursor_get(cur, &kv, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &kv, &v, MDB_NEXT)) {
		if (v.mv_size != row_bytes) {
			rc = MFS_EFORMAT;
			goto out;
		}
		const unsigned char *q = v.mv_data;
		double acc = 0.0;
		for (uint32_t j = 0; j < m->k; j++)
			acc += (double)p[j] * (double)mfs_snap_get_f32(q + 4 + 4 * (size_t)j);
		struct snap_cand c = {(float)(base + (double)mfs_snap_get_f32(q) + acc), kv.mv_data, kv.mv_size};
		if (n < cap) {
			h[n] = c;
			heap_sift_up(h, n++);
		} else if (cand_better(&c, &h[0])) {
			h[0] = c;
			heap_sift_down(h, n, 0);
		}
	}
	if (rc != MDB_NOTFOUND) {
		rc = snap_err(rc);
		goto out;
	}
	rc = 0;
	/* pop worst-first into the tail of out: best ends up first; keys are copied out
	 * before the txn resets and the map may move */
	for (size_t left = n; left > 0; left--) {
		mfs_snap_hit_t *hit = &out[left - 1];
		const char *str;
		size_t len;
		memset(hit, 0, sizeof *hit);
		hit->score = h[0].score;
		hit->kind = mfs_snap_key_decode(h[0].key, h[0].key_len, &hit->num, &str, &len);
		if (hit->kind == MFS_SNAP_KEY_TAG_STR) {
			hit->kind = MFS_SNAP_ID_STR;
			hit->len = len;
			memcpy(hit->str, str, len);
			hit->str[len] = '\0';
		} else if (hit->kind == MFS_SNAP_KEY_TAG_U64) {
			hit->kind = MFS_SNAP_ID_U64;
		} else {
			rc = MFS_EFORMAT;
			goto out;
		}
		h[0] = h[left - 1];
		heap_sift_down(h, left - 1, 0);
	}
	*n_out = n;
out:
	if (cur)
		mdb_cursor_close(cur);
	snap_end(s);
	return rc;
}
