/* mfs_snap.c - libmfsnap: the serving-side reader of snapshot format v1 (snap_format.h).
 *
 * Built from the .c files of snapshots/reader/ and common/err.c only: it links LMDB and
 * libc, never the stage libraries (mfs_snapshots, ...). This file holds the environments, the
 * per-call txns, meta, lookups, predict and staleness; top-K and its item cache live in snap_topk.c and snap_cache.c,
 * the kernels in snap_dot.c (shared layouts: mfs_snap_int.h).
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
 * Stale readers. A reader process that dies without closing leaves its slot in lock.mdb,
 * and the writer then cannot reuse the pages that slot pins (the file grows). Every
 * process that opens the env clears dead slots (mdb_reader_check) at open, again when a
 * begin finds the table full (MDB_READERS_FULL), and, rate-limited to once per
 * SNAP_READER_CHECK_MS, when a handle notices a new snapshot - never on the lookup path.
 *
 * Truncated files. LMDB maps data.mdb and trusts its meta pages: a page the tree points to
 * beyond the end of a truncated file (a half-copied snapshot, a full disk during a copy) is
 * a SIGBUS on first touch, not an error. So before mdb_env_open, mfs_snap_check_size
 * (snapshots/snap_size.c, shared with serve's loader) reads both
 * meta pages with pread and refuses a file shorter than the newest meta's last page
 * (MFS_EFORMAT, naming both sizes). Reading the metas before fstat keeps the check free of
 * false alarms while a writer runs: LMDB writes a commit's pages before the meta that points
 * at them, and never shrinks the file. The check holds for the files our writer makes; LMDB
 * itself allows a file to stop short of mm_last_pg when the last pages are free ones (a page
 * a txn allocated and freed again is never written), which needs deletes outside the free
 * DB - the snapshot writer only puts. The check runs at open; a file cut while mapped still
 * faults.
 *
 * Errors. LMDB's MDB_NOTFOUND becomes MFS_ENOTFOUND, its other negative codes MFS_ELMDB,
 * and positive errnos pass through. A row whose value is not 4 * (1 + k) bytes, or a meta
 * record of the wrong size, is MFS_EFORMAT.
 */
#include "snapshots/reader/mfs_snap.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "snapshots/reader/mfs_snap_int.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_size.h"

static pthread_mutex_t snap_envs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct snap_env *snap_envs;

int64_t snap_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int snap_grow(void **buf, size_t *cap, size_t n, size_t size)
{
	if (n <= *cap)
		return 0;
	size_t want = *cap ? *cap : 16;
	while (want < n)
		want = want > SIZE_MAX / 2 ? n : want * 2;
	if (want > SIZE_MAX / size)
		return ENOMEM;
	void *p = realloc(*buf, want * size);
	if (!p)
		return ENOMEM;
	*buf = p;
	*cap = want;
	return 0;
}

int snap_err(int rc)
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

int snap_key(const mfs_snap_id_t *id, unsigned char *key, MDB_val *kv)
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
	snap_cache_drop(e);
	if (e->e_env)
		mdb_env_close(e->e_env);
	pthread_rwlock_destroy(&e->e_maplock);
	pthread_mutex_destroy(&e->e_cache_lock);
	pthread_mutex_destroy(&e->e_build_lock);
	pthread_mutex_destroy(&e->e_dbi_lock);
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
	/* default mutexes cannot fail to initialise on Linux; env_destroy destroys all three */
	pthread_mutex_init(&e->e_cache_lock, NULL);
	pthread_mutex_init(&e->e_build_lock, NULL);
	pthread_mutex_init(&e->e_dbi_lock, NULL);
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
	/* before the map exists: a truncated file must be an error, not a SIGBUS (see DESIGN) */
	if ((rc = mfs_snap_check_size(dir, errstr, es)))
		goto fail;
	/* MDB_NOTLS: txns belong to handles, not threads. Never MDB_NOLOCK: the writer
	 * must see our reader slots or it would overwrite pages we are reading. */
	if ((rc = mdb_env_open(e->e_env, dir, MDB_RDONLY | MDB_NOTLS, 0644))) {
		if (rc == ENOENT) {
			rc = mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s yet (no data.mdb)", dir);
			goto fail;
		}
		goto lmdb_fail;
	}
	/* clear the slots of reader processes that died (see DESIGN) */
	mdb_reader_check(e->e_env, NULL);
	atomic_store(&e->e_checked_ms, snap_mono_ms());
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
	/* optional (docs/SNAPSHOT_FORMAT.md): absent in environments an older writer made */
	if ((rc = mdb_dbi_open(txn, MFS_SNAP_DB_USER_RATED, 0, &e->e_rated)) == 0)
		atomic_store(&e->e_rated_ok, 1);
	else if (rc != MDB_NOTFOUND)
		goto lmdb_fail;
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

/* mdb_reader_check, at most once per SNAP_READER_CHECK_MS per env unless forced. It takes
 * LMDB's reader-table mutex, so it must not run on every call. */
static int env_reader_check(struct snap_env *e, int force, int *dead)
{
	int64_t now = snap_mono_ms(), last = atomic_load(&e->e_checked_ms);
	if (!force && (now - last < SNAP_READER_CHECK_MS ||
	               !atomic_compare_exchange_strong(&e->e_checked_ms, &last, now)))
		return 0;
	if (force)
		atomic_store(&e->e_checked_ms, now);
	int n = 0, rc = mdb_reader_check(e->e_env, &n);
	if (dead)
		*dead = n;
	return snap_err(rc);
}

/* ---- per-call transactions ------------------------------------------------------------------ */
/* Renew the handle's txn (adopting a grown map if needed) and make sn_meta current. On
 * success the map lock is held shared until snap_end. */
int snap_begin(mfs_snap_t *s)
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
		/* a new snapshot: a good moment to clear dead readers' slots (rate-limited) */
		env_reader_check(e, 0, NULL);
	}
	return 0;
}

void snap_end(mfs_snap_t *s)
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
	if (rc == MDB_READERS_FULL) {
		/* dead processes may hold slots: clear them and try once more */
		env_reader_check(s->sn_env, 1, NULL);
		rc = mdb_txn_begin(s->sn_env->e_env, NULL, MDB_RDONLY, &s->sn_txn);
	}
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
	free(s->sn_uq);
	free(s->sn_heap);
	free(s->sn_cands);
	free(s->sn_lheap);
	free(s->sn_excl);
	free(s->sn_xkeys);
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

int mfs_snap_staleness(mfs_snap_t *s, uint64_t *seq, int64_t *age_ms)
{
	if (!s)
		return MFS_EINVAL;
	int rc = snap_begin(s);
	if (rc)
		return rc;
	uint64_t q = s->sn_meta.seq;
	int64_t wall = s->sn_meta.wall_time_ms;
	snap_end(s);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	if (seq)
		*seq = q;
	if (age_ms)
		*age_ms = ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000) - wall;
	return 0;
}

int mfs_snap_reader_check(mfs_snap_t *s, int *dead)
{
	if (!s)
		return MFS_EINVAL;
	if (dead)
		*dead = 0;
	return env_reader_check(s->sn_env, 1, dead);
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
int snap_rated_dbi(mfs_snap_t *s, MDB_dbi *dbi)
{
	struct snap_env *e = s->sn_env;
	if (!atomic_load(&e->e_rated_ok)) {
		if (atomic_load(&e->e_rated_seq) == s->sn_meta.seq)
			return 0;
		pthread_mutex_lock(&e->e_dbi_lock);
		MDB_txn *t;
		if (!atomic_load(&e->e_rated_ok) && mdb_txn_begin(e->e_env, NULL, MDB_RDONLY, &t) == 0) {
			MDB_dbi d;
			if (mdb_dbi_open(t, MFS_SNAP_DB_USER_RATED, 0, &d) == 0) {
				if (mdb_txn_commit(t) == 0) /* a committed read txn keeps the DBI */
					e->e_rated = d, atomic_store(&e->e_rated_ok, 1);
			} else {
				mdb_txn_abort(t);
			}
		}
		atomic_store(&e->e_rated_seq, s->sn_meta.seq);
		pthread_mutex_unlock(&e->e_dbi_lock);
		if (!atomic_load(&e->e_rated_ok))
			return 0;
	}
	*dbi = e->e_rated;
	return 1;
}

int snap_row_find(mfs_snap_t *s, MDB_dbi dbi, const mfs_snap_id_t *id, const unsigned char **row)
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
	rc = snap_row_find(s, items ? s->sn_env->e_items : s->sn_env->e_users, id, &row);
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
	int ku = snap_row_find(s, s->sn_env->e_users, user, &ru);
	int ki = snap_row_find(s, s->sn_env->e_items, item, &ri);
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
