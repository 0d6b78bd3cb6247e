/* snap_writer.c - publish the model to LMDB as snapshot format v1 (snap_format.h).
 *
 * DESIGN
 * One snapshot = one LMDB write txn holding the rows, the meta record and the Kafka
 * offsets; mdb_txn_commit is the publish point, so a reader (libmfsnap, mfsnap.py) sees the
 * whole snapshot or the previous one, and the offsets stored always describe exactly the
 * rows stored with them. seq is read and incremented inside that same txn.
 *
 * Order of work in mfs_snap_publish (= stage + mfs_snap_publish_stage):
 *   1. stage: collect the rows to write, checking indices, finite values and ids, and sort
 *      them by encoded key (u64 ids first, numerically, then strings bytewise: the order
 *      LMDB's default comparator gives the encoded keys). mfs_snap_stage_fill copies ids,
 *      biases and factors, so a writer thread can publish the stage while the model learns,
 *      and leaves the sort to mfs_snap_publish_stage (the writer thread's share: it was a
 *      quarter of the learner's time on a stream of new ids); mfs_snap_publish borrows them
 *      from the model for the length of the call;
 *   2. validate meta and offsets - nothing is written if any check fails, so a NaN never
 *      reaches a reader;
 *   3. in the txn: check format_version and k against what is stored, read seq, write the
 *      rows (MDB_APPEND for the sorted run beyond the DB's current last key, plain puts
 *      before it), count the DB entries, write meta and offsets, commit.
 * On MDB_MAP_FULL (from a put or from the commit itself) the txn is aborted, the map size
 * doubled with mdb_env_set_mapsize (legal here: this process has no other txn) and the whole
 * txn retried; readers adopt the larger map on their next MDB_MAP_RESIZED. MDB_PANIC marks
 * the writer unusable (MFS_EFATAL afterwards): the process must restart.
 *
 * Sync modes (snapshot.sync, docs/OPERATIONS.md): full flushes every commit; meta is
 * MDB_NOMETASYNC; none is MDB_WRITEMAP|MDB_NOSYNC. Exactly-once does not need durability of
 * the newest commit: the offsets travel with the rows, so an undone snapshot only means
 * re-reading more of the topic. What none gives up is integrity after an OS crash (the meta
 * page may reach the disk before the pages it points to); a killed process is safe in every
 * mode because the page cache outlives it. Measured in docs/BENCHMARKS.md.
 *
 * Rated lists (issue 20; info->rated, snap_rated.h): staged as external ids with the rows, and
 * written in the same txn after them (user key order): a train publish replaces each user's
 * user_rated record, a serve publish merges the ratings since the last one into it (stored
 * entries, then new; an item keeps its newest place; the last max kept), so only the users who
 * rated are rewritten. The records of removed users are deleted with their rows.
 *
 * n_users / n_items in meta are the number of rows in the users / items DB after the
 * commit (a partial publish leaves the rows it does not name as they were). A replacing
 * publish (info->replace, `mfstream train --snapshot.mode replace`) empties the users, items
 * and meta DBs inside its txn, after reading seq, before writing anything: the commit swaps
 * the whole old model for the new one.
 */
#include "snapshots/snap_writer.h"

#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/statvfs.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/par.h"
#include "common/timeutil.h"
#include "model_store/life.h"
#include "snapshots/snap_format.h"

#define SNAP_MAP_MAX ((size_t)1 << 46) /* 64 TiB: beyond this, map full is final */

struct mfs_snap_writer {
	MDB_env *sw_env;
	MDB_dbi sw_meta, sw_users, sw_items;
	MDB_dbi sw_seen[2]; /* user_seen, item_seen */
	MDB_dbi sw_rated;   /* user_rated */
	char *sw_dir;
	mfs_snap_sync_t sw_sync;
	int sw_fatal;
	mfs_snap_stage_t *sw_stage; /* mfs_snap_publish's */
	size_t sw_reserved;         /* bytes of data.mdb known to have disk blocks (reserve) */
	int sw_lock_fd;             /* DIR/writer.lock, flock'ed for the writer's life (-1: none) */
	size_t sw_need;             /* what the publish in progress reserved beyond that */
	double sw_phase[MFS_SNAP_PH__COUNT]; /* seconds by phase (mfs_snap_writer_phases) */
	/* merging a user_rated list: the entries (stored, then new) and the value written */
	struct rated_ent *sw_rent;
	size_t sw_rent_cap;
	unsigned char *sw_rkeep;
	size_t sw_rkeep_cap;
	unsigned char *sw_rval;
	size_t sw_rval_cap;
};

/* One entry of a user_rated list being merged: an encoded item id and its place in the list. */
struct rated_ent {
	const unsigned char *k;
	size_t len, pos;
};

/* A row to write, with its external id (the sort key); row indexes the stage's values. */
struct snap_row {
	mfs_id_t id;
	uint32_t row;
};

/* One entity's staged rows: sorted ids (strings in `str`) and bias + k factors per row. */
struct stage_side {
	struct snap_row *r;
	size_t n, cap;
	float *v; /* n x (1 + k): bias, then factors (copied stages) */
	size_t v_cap;
	const float *mb, *mF; /* borrowed stages (mfs_snap_publish): the model's own arrays, row = model row */
	char *str; /* the string ids' bytes */
	size_t str_n, str_cap;
	int sorted; /* r[] is in key order without repeats (copied stages sort on the writer's side) */
	int unchecked; /* v[] is filled after staging (mfs_snap_stage_fill_ids): check it publishing */
	/* ids staged by mfs_snap_stage_fill_ids: per value row, its model row and the row's
	 * generation (a taken rated tracker's lists are checked against them when published) */
	uint32_t *mrow;
	uint16_t *mgen;
	size_t m_cap;
	uint32_t mrow_end; /* 1 + the largest model row staged */
	/* last-seen times (a model that tracks them): per value row as v[] (copied), or the model's */
	uint32_t *seen;
	size_t seen_cap;
	const uint32_t *mseen;
	int has_seen;
	/* ids removed from the model since the last snapshot: their records are deleted first */
	mfs_id_t *del;
	size_t n_del, cap_del;
	char *del_str;
	size_t del_str_n, del_str_cap;
};

/* The users' rated lists to write (snap_rated.h), as external ids: r[j].row indexes off[], the
 * list's entries (u16 LE length + encoded item id each, oldest first) are val[off[row] ..
 * off[row + 1]). */
struct stage_rated {
	int on;        /* write lists (info->rated was given) */
	int merge;     /* merge into the stored list (serve) rather than replace it (train) */
	uint32_t max;  /* distinct items a list keeps */
	struct snap_row *r;
	size_t n, cap;
	char *str;     /* the users' string ids */
	size_t str_n, str_cap;
	unsigned char *val;
	size_t val_n, val_cap;
	size_t *off;
	size_t off_cap;
	uint32_t *items; /* scratch: one list's item rows */
	size_t items_cap;
	int sorted;
	/* a tracker taken as it is (mfs_snap_info_t.rated_take): turned into lists when published,
	 * through model row -> staged row maps (1 + index, 0: not staged) and the scratch igens */
	mfs_snap_rated_t *take;
	uint32_t *umap, *imap;
	size_t umap_cap, imap_cap;
	uint16_t *igens;
	size_t igens_cap;
};

struct mfs_snap_stage {
	int k;
	double mu;
	uint64_t events_applied;
	struct stage_side side[2]; /* users, items */
	struct stage_rated rated;
};

/* A full or failing disk, in words: what is free there and what the snapshot wanted. */
static int disk_fail(mfs_snap_writer_t *w, int rc, const char *what, char *errstr, size_t es)
{
	struct statvfs sv;
	double free_mib = -1;
	if (statvfs(w->sw_dir, &sv) == 0)
		free_mib = (double)sv.f_bavail * (double)sv.f_frsize / 1048576.0;
	char need[96] = "";
	if (w->sw_need)
		snprintf(need, sizeof need, ", the snapshot needs up to %.1f MiB more", (double)w->sw_need / 1048576.0);
	if (rc == ENOSPC || rc == EDQUOT)
		mfs_errf(errstr, es, rc, "no space left on device at snapshot.dir=%s (%s): %.1f MiB free%s", w->sw_dir, what,
		         free_mib, need);
	else
		mfs_errf(errstr, es, rc, "%s at snapshot.dir=%s (%s): %.1f MiB free%s (a full filesystem can report a "
		                         "failed write or flush this way)",
		         strerror(rc), w->sw_dir, what, free_mib, need);
	mfs_error("snap", "msg=\"snapshot not written\" err=\"%s\"", errstr ? errstr : strerror(rc));
	return rc;
}

static int lmdb_fail(mfs_snap_writer_t *w, int rc, const char *what, char *errstr, size_t es)
{
	if (rc == ENOSPC || rc == EDQUOT || rc == EIO)
		return disk_fail(w, rc, what, errstr, es);
	if (rc == MDB_PANIC)
		w->sw_fatal = 1;
	mfs_error("snap", "msg=\"LMDB failure\" op=%s err=\"%s\"", what, mdb_strerror(rc));
	return mfs_errf(errstr, es, rc > 0 ? rc : MFS_ELMDB, "LMDB %s on %s: %s", what, w->sw_dir,
	                mdb_strerror(rc));
}

static int put_meta(MDB_txn *txn, MDB_dbi dbi, const char *key, const void *val, size_t size)
{
	MDB_val k = {strlen(key), (void *)(uintptr_t)key};
	MDB_val v = {size, (void *)(uintptr_t)val};
	return mdb_put(txn, dbi, &k, &v, 0);
}

static int put_meta_u32(MDB_txn *txn, MDB_dbi dbi, const char *key, uint32_t x)
{
	unsigned char b[4];
	mfs_snap_put_u32(b, x);
	return put_meta(txn, dbi, key, b, 4);
}

static int put_meta_u64(MDB_txn *txn, MDB_dbi dbi, const char *key, uint64_t x)
{
	unsigned char b[8];
	mfs_snap_put_u64(b, x);
	return put_meta(txn, dbi, key, b, 8);
}

static int put_meta_f64(MDB_txn *txn, MDB_dbi dbi, const char *key, double x)
{
	unsigned char b[8];
	mfs_snap_put_f64(b, x);
	return put_meta(txn, dbi, key, b, 8);
}

/* Read a u32 meta value; *found = 0 when the key is absent. */
static int get_meta_u32(MDB_txn *txn, MDB_dbi dbi, const char *key, uint32_t *out, int *found)
{
	MDB_val k = {strlen(key), (void *)(uintptr_t)key}, v;
	int rc = mdb_get(txn, dbi, &k, &v);
	*found = 0;
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return rc;
	if (v.mv_size != 4)
		return MFS_EFORMAT;
	*out = mfs_snap_get_u32(v.mv_data);
	*found = 1;
	return 0;
}

void mfs_snap_writer_close(mfs_snap_writer_t *w)
{
	if (!w)
		return;
	if (w->sw_env && w->sw_sync != MFS_SNAP_SYNC_FULL && !w->sw_fatal) {
		int rc = mdb_env_sync(w->sw_env, 1);
		if (rc)
			mfs_error("snap", "msg=\"flush at close failed\" dir=%s err=\"%s\"", w->sw_dir, mdb_strerror(rc));
	}
	if (w->sw_env)
		mdb_env_close(w->sw_env);
	if (w->sw_lock_fd >= 0)
		close(w->sw_lock_fd); /* releases the lock */
	free(w->sw_dir);
	free(w->sw_rent);
	free(w->sw_rkeep);
	free(w->sw_rval);
	mfs_snap_stage_free(w->sw_stage);
	free(w);
}

const char *mfs_snap_phase_name(int phase)
{
	static const char *const names[MFS_SNAP_PH__COUNT] = {"prepare", "reserve", "rows", "rated", "commit"};
	return phase >= 0 && phase < MFS_SNAP_PH__COUNT ? names[phase] : NULL;
}

void mfs_snap_writer_phases(const mfs_snap_writer_t *w, double seconds[MFS_SNAP_PH__COUNT])
{
	for (int j = 0; j < MFS_SNAP_PH__COUNT; j++)
		seconds[j] = w ? w->sw_phase[j] : 0.0;
}

/* One writer per directory: LMDB serialises writers but would let two services interleave
 * their models in one environment (seen: meta at offsets covering 106,637 users beside 115,490
 * user rows). An exclusive flock on DIR/writer.lock, held while the writer is open, with the
 * holder's pid in the file for the message; the kernel drops it when the process dies, so a
 * kill -9 leaves no stale lock. */
static int lock_dir(mfs_snap_writer_t *w, char *errstr, size_t es)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/writer.lock", w->sw_dir);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		int rc = errno;
		return mfs_errf(errstr, es, rc, "snapshot directory %s: cannot open %s: %s", w->sw_dir, path, strerror(rc));
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int rc = errno;
		char pid[32] = "";
		ssize_t n = rc == EWOULDBLOCK ? pread(fd, pid, sizeof pid - 1, 0) : -1;
		close(fd);
		if (rc != EWOULDBLOCK)
			return mfs_errf(errstr, es, rc, "snapshot directory %s: cannot lock %s: %s", w->sw_dir, path, strerror(rc));
		pid[n > 0 ? strcspn(pid, "\n") : 0] = 0;
		return mfs_errf(errstr, es, EBUSY,
		                "snapshot directory %s is in use by another writer (pid %s, holding %s); two writers "
		                "would mix their models: stop it or use another directory",
		                w->sw_dir, *pid ? pid : "unknown", path);
	}
	char buf[32];
	int len = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)len, 0) != len)
		mfs_warn("snap", "msg=\"could not write the pid into the writer lock\" path=%s", path);
	w->sw_lock_fd = fd;
	return 0;
}

int mfs_snap_writer_open(const char *dir, size_t map_size, mfs_snap_writer_t **out, char *errstr,
                         size_t errstr_size)
{
	return mfs_snap_writer_open_sync(dir, map_size, MFS_SNAP_SYNC_FULL, out, errstr, errstr_size);
}

int mfs_snap_writer_open_sync(const char *dir, size_t map_size, mfs_snap_sync_t sync, mfs_snap_writer_t **out,
                              char *errstr, size_t errstr_size)
{
	int rc;
	static const unsigned sync_flags[] = {0, MDB_NOMETASYNC, MDB_WRITEMAP | MDB_NOSYNC};
	if ((unsigned)sync > MFS_SNAP_SYNC_NONE)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "snapshot writer: unknown sync mode %d", (int)sync);
	MDB_txn *txn = NULL;
	if (!dir || !*dir || !out)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "snapshot writer: no directory given");
	*out = NULL;
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		rc = errno;
		return mfs_errf(errstr, errstr_size, rc, "snapshot directory %s: %s", dir, strerror(rc));
	}
	mfs_snap_writer_t *w = calloc(1, sizeof *w);
	if (!w || !(w->sw_dir = strdup(dir))) {
		free(w);
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	}
	w->sw_sync = sync;
	w->sw_lock_fd = -1;
	if ((rc = lock_dir(w, errstr, errstr_size)))
		goto fail;
	if ((rc = mdb_env_create(&w->sw_env))) {
		w->sw_env = NULL;
		rc = lmdb_fail(w, rc, "env_create", errstr, errstr_size);
		goto fail;
	}
	if ((rc = mdb_env_set_maxdbs(w->sw_env, MFS_SNAP_MAX_DBS)) ||
	    (rc = mdb_env_set_maxreaders(w->sw_env, MFS_SNAP_MAX_READERS))) {
		rc = lmdb_fail(w, rc, "env_set", errstr, errstr_size);
		goto fail;
	}
	/* Open without a size so an existing env keeps its (possibly grown) map; only raise it. */
	if ((rc = mdb_env_open(w->sw_env, dir, sync_flags[sync], 0644))) {
		rc = lmdb_fail(w, rc, "env_open", errstr, errstr_size);
		goto fail;
	}
	MDB_envinfo info;
	mdb_env_info(w->sw_env, &info);
	if (info.me_mapsize < map_size && (rc = mdb_env_set_mapsize(w->sw_env, map_size))) {
		rc = lmdb_fail(w, rc, "env_set_mapsize", errstr, errstr_size);
		goto fail;
	}
	/* reader slots of killed readers pin old pages: clear them on start */
	int dead = 0;
	mdb_reader_check(w->sw_env, &dead);
	/* create the three DBs and check the version of what is there */
	for (int tries = 0;; tries++) {
		rc = mdb_txn_begin(w->sw_env, NULL, 0, &txn);
		if (rc != MDB_MAP_RESIZED || tries >= 8)
			break;
		mdb_env_set_mapsize(w->sw_env, 0);
	}
	if (rc) {
		txn = NULL;
		rc = lmdb_fail(w, rc, "txn_begin", errstr, errstr_size);
		goto fail;
	}
	if ((rc = mdb_dbi_open(txn, MFS_SNAP_DB_META, MDB_CREATE, &w->sw_meta)) ||
	    (rc = mdb_dbi_open(txn, MFS_SNAP_DB_USERS, MDB_CREATE, &w->sw_users)) ||
	    (rc = mdb_dbi_open(txn, MFS_SNAP_DB_ITEMS, MDB_CREATE, &w->sw_items)) ||
	    (rc = mdb_dbi_open(txn, MFS_SNAP_DB_USER_SEEN, MDB_CREATE, &w->sw_seen[0])) ||
	    (rc = mdb_dbi_open(txn, MFS_SNAP_DB_ITEM_SEEN, MDB_CREATE, &w->sw_seen[1])) ||
	    (rc = mdb_dbi_open(txn, MFS_SNAP_DB_USER_RATED, MDB_CREATE, &w->sw_rated))) {
		rc = lmdb_fail(w, rc, "dbi_open", errstr, errstr_size);
		goto fail;
	}
	uint32_t ver;
	int found;
	if ((rc = get_meta_u32(txn, w->sw_meta, MFS_META_VERSION, &ver, &found))) {
		rc = rc == MFS_EFORMAT ? mfs_errf(errstr, errstr_size, rc, "%s: malformed %s record", dir,
		                                  MFS_META_VERSION)
		                       : lmdb_fail(w, rc, "get", errstr, errstr_size);
		goto fail;
	}
	if (found && ver != MFS_SNAP_VERSION) {
		rc = mfs_errf(errstr, errstr_size, MFS_EVERSION,
		              "%s holds snapshot format version %u; this build writes version %u (see "
		              "docs/SNAPSHOT_FORMAT.md, version policy)",
		              dir, ver, MFS_SNAP_VERSION);
		goto fail;
	}
	rc = mdb_txn_commit(txn);
	txn = NULL;
	if (rc) {
		rc = lmdb_fail(w, rc, "txn_commit", errstr, errstr_size);
		goto fail;
	}
	mdb_env_info(w->sw_env, &info);
	static const char *const sync_names[] = {"full", "meta", "none"};
	mfs_info("snap", "msg=\"snapshot writer open\" dir=%s map_size=%zu sync=%s stale_readers=%d", dir,
	         (size_t)info.me_mapsize, sync_names[sync], dead);
	*out = w;
	return 0;
fail:
	if (txn)
		mdb_txn_abort(txn);
	mfs_snap_writer_close(w);
	return rc;
}

int mfs_snap_writer_existing(mfs_snap_writer_t *w, mfs_snap_existing_t *out, char *errstr, size_t es)
{
	MDB_txn *txn = NULL;
	MDB_val k = {strlen(MFS_META_SEQ), (void *)(uintptr_t)MFS_META_SEQ}, v;
	MDB_stat su, si;
	uint32_t kk = 0;
	int rc, found = 0;
	if (!w || !out)
		return mfs_errf(errstr, es, MFS_EINVAL, "mfs_snap_writer_existing: NULL argument");
	memset(out, 0, sizeof *out);
	if ((rc = mdb_txn_begin(w->sw_env, NULL, MDB_RDONLY, &txn)))
		return lmdb_fail(w, rc, "txn_begin", errstr, es);
	rc = mdb_get(txn, w->sw_meta, &k, &v);
	if (rc == 0 && v.mv_size != 8)
		rc = MFS_EFORMAT;
	else if (rc == 0)
		out->seq = mfs_snap_get_u64(v.mv_data);
	else if (rc == MDB_NOTFOUND)
		rc = 0;
	if (!rc && out->seq && !(rc = get_meta_u32(txn, w->sw_meta, MFS_META_K, &kk, &found)))
		out->k = found ? kk : 0;
	if (!rc && !(rc = mdb_stat(txn, w->sw_users, &su)) && !(rc = mdb_stat(txn, w->sw_items, &si))) {
		out->n_users = su.ms_entries;
		out->n_items = si.ms_entries;
	}
	mdb_txn_abort(txn);
	if (rc == MFS_EFORMAT)
		return mfs_errf(errstr, es, rc, "%s: malformed %s or %s record", w->sw_dir, MFS_META_SEQ, MFS_META_K);
	return rc ? lmdb_fail(w, rc, "read", errstr, es) : 0;
}

/* ---- validation and row lists ---------------------------------------------------------------- */
static int row_cmp(const void *pa, const void *pb)
{
	const mfs_id_t *a = &((const struct snap_row *)pa)->id, *b = &((const struct snap_row *)pb)->id;
	if (a->kind != b->kind)
		return a->kind < b->kind ? -1 : 1; /* tag 0x01 (u64) sorts before 0x02 (string) */
	if (a->kind == MFS_ID_U64)
		return a->num < b->num ? -1 : a->num > b->num;
	size_t n = a->len < b->len ? a->len : b->len;
	int c = memcmp(a->str, b->str, n);
	return c ? c : (a->len > b->len) - (a->len < b->len);
}

static int row_finite(const float *b, const float *F, uint32_t row, int k)
{
	if (!isfinite(b[row]))
		return 0;
	const float *f = F + (size_t)row * (size_t)k;
	for (int j = 0; j < k; j++)
		if (!isfinite(f[j]))
			return 0;
	return 1;
}

/* Sort rows whose ids are all u64 by id: an LSD radix sort, 11 bits a pass, stable (the first
 * of equal ids stays first), passes whose digit is the same in
 * every row skipped (ids of one range share their high bits). A stream's snapshot sorts
 * millions of rows on the writer thread, where qsort's comparisons were ~20 % of its time
 * (perf, a new-users stream). Returns 0 when it could not (a string id, or no memory for the
 * second buffer): the caller sorts with qsort. */
#define RADIX_BITS 11
#define RADIX_PASSES ((64 + RADIX_BITS - 1) / RADIX_BITS)
static int rows_radix_sort(struct snap_row *r, size_t n)
{
	static const uint64_t mask = ((uint64_t)1 << RADIX_BITS) - 1;
	size_t(*cnt)[1 << RADIX_BITS] = calloc(RADIX_PASSES, sizeof *cnt);
	struct snap_row *tmp = cnt ? malloc(n * sizeof *tmp) : NULL;
	if (!tmp) {
		free(cnt);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (r[i].id.kind != MFS_ID_U64) {
			free(tmp);
			free(cnt);
			return 0;
		}
		for (int p = 0; p < RADIX_PASSES; p++)
			cnt[p][(r[i].id.num >> (p * RADIX_BITS)) & mask]++;
	}
	struct snap_row *src = r, *dst = tmp;
	for (int p = 0; p < RADIX_PASSES; p++) {
		size_t *c = cnt[p], sum = 0;
		if (c[(src[0].id.num >> (p * RADIX_BITS)) & mask] == n)
			continue; /* one digit value: this pass would not move a row */
		for (size_t d = 0; d <= mask; d++) {
			size_t x = c[d];
			c[d] = sum;
			sum += x;
		}
		for (size_t i = 0; i < n; i++)
			dst[c[(src[i].id.num >> (p * RADIX_BITS)) & mask]++] = src[i];
		struct snap_row *t = src;
		src = dst;
		dst = t;
	}
	if (src != r)
		memcpy(r, src, n * sizeof *r);
	free(tmp);
	free(cnt);
	return 1;
}

static void rows_sort(struct snap_row *r, size_t n)
{
	if (n > 64 && rows_radix_sort(r, n))
		return;
	qsort(r, n, sizeof *r, row_cmp);
}

/* Sort side ss by encoded key and drop repeated rows (MDB_APPEND needs strictly increasing
 * keys). */
static void side_sort(struct stage_side *ss)
{
	if (ss->sorted || ss->n == 0) {
		ss->sorted = 1;
		return;
	}
	rows_sort(ss->r, ss->n);
	size_t m = 1;
	for (size_t i = 1; i < ss->n; i++)
		if (row_cmp(&ss->r[i], &ss->r[m - 1]) != 0)
			ss->r[m++] = ss->r[i];
	ss->n = m;
	ss->sorted = 1;
}

/* Collect and check one entity's rows into side ss. rows == NULL: every row. copy: the values
 * and string ids are copied into ss (the model may change afterwards) and the sort is left to
 * mfs_snap_publish_stage, i.e. to the writer thread; else ss borrows the model's arrays and
 * ids, valid until the model changes (mfs_snap_publish's own use), and is sorted here.
 * copy == 2: the ids only; v[] is sized and left for the caller to fill (checked publishing). */
#define STAGE_KEEP_ROWS 65536 /* rows a stage keeps room for whatever it held before */

/* Give back room a much larger snapshot left: the buffers hold the most rows any snapshot has
 * held, which after a burst of touched rows (a snapshot put off while the writer was busy) can
 * be the whole table for the rest of the run (an id flood through a 1 M-user table ratcheted up
 * ~250 MiB that way, docs/BENCHMARKS.md). Room for more than 4 x this snapshot's rows (and
 * 2 x STAGE_KEEP_ROWS) is shrunk to 2 x its rows (or STAGE_KEEP_ROWS); a realloc to less that
 * fails leaves the old buffer. */
static void side_trim(struct stage_side *ss, size_t n, size_t w)
{
	const size_t keep = n * 2 > STAGE_KEEP_ROWS ? n * 2 : STAGE_KEEP_ROWS;
	if (ss->cap <= 2 * keep) /* keep = max(2 n, STAGE_KEEP_ROWS): trimmed above 4 n */
		return;
	struct snap_row *r = realloc(ss->r, keep * sizeof *r);
	if (r)
		ss->r = r, ss->cap = keep;
	if (ss->v && ss->v_cap > keep * w) {
		float *v = realloc(ss->v, keep * w * sizeof *v);
		if (v)
			ss->v = v, ss->v_cap = keep * w;
	}
	if (ss->seen && ss->seen_cap > keep) {
		uint32_t *sn = realloc(ss->seen, keep * sizeof *sn);
		if (sn)
			ss->seen = sn, ss->seen_cap = keep;
	}
}

/* Staging ids by a rows list (side_fill, copy == 2: serve's stages) in chunks: one on the
 * caller's thread, or, for a long list, several on a pool. Each task checks and stages its
 * chunk of rows, counting its string ids' bytes; the bytes are copied into the arena once its
 * size is known, each chunk at its own offset. The first failing row (lowest index) is the
 * one reported, as when one thread walks them. */
#define STAGE_PAR_MIN 65536 /* rows below which one thread stages them */
enum { FILL_OK, FILL_RANGE, FILL_DEAD, FILL_IDLEN };
struct fill_chunk {
	size_t bytes; /* its string ids' bytes, then their offset in the arena */
	size_t bad;   /* the index of its first failing row (SIZE_MAX: none) */
	int why;      /* FILL_* of that row */
	uint32_t end; /* 1 + its largest model row */
};
struct fill_job {
	struct stage_side *ss;
	const mfs_idmap_t *map;
	const uint32_t *seen, *rows;
	const uint16_t *gen;
	uint32_t n_model;
	size_t n, chunk;
	struct fill_chunk *c;
};

static int fill_error(const char *ent, int why, uint32_t row, uint32_t n_model, const mfs_idmap_t *map, char *errstr,
                      size_t es)
{
	if (why == FILL_RANGE)
		return mfs_errf(errstr, es, MFS_EINVAL, "%s row %u out of range (model has %u)", ent, row, n_model);
	if (why == FILL_DEAD)
		return mfs_errf(errstr, es, MFS_EINVAL, "%s row %u holds no id", ent, row);
	return mfs_errf(errstr, es, MFS_EIDLEN, "%s row %u: string id of %u bytes", ent, row,
	                (unsigned)mfs_idmap_key(map, row).len);
}

static void fill_ids_task(void *arg, size_t t)
{
	struct fill_job *j = arg;
	struct stage_side *ss = j->ss;
	struct fill_chunk *c = &j->c[t];
	const size_t a = t * j->chunk, e = a + j->chunk < j->n ? a + j->chunk : j->n;
	c->bytes = 0;
	c->bad = SIZE_MAX;
	c->end = 0;
	for (size_t i = a; i < e; i++) {
		const uint32_t row = j->rows[i];
		int why = FILL_OK;
		mfs_id_t id = {0};
		if (row >= j->n_model)
			why = FILL_RANGE;
		else if (!mfs_idmap_alive(j->map, row))
			why = FILL_DEAD;
		else if ((id = mfs_idmap_key(j->map, row)).kind == MFS_ID_STR && (id.len == 0 || id.len > MFS_SNAP_STR_MAX))
			why = FILL_IDLEN;
		if (why) {
			c->bad = i;
			c->why = why;
			return;
		}
		if (id.kind == MFS_ID_STR)
			c->bytes += id.len; /* id.str points into the id map until fill_strs_task */
		ss->r[i].id = id;
		ss->r[i].row = (uint32_t)i;
		if (j->seen)
			ss->seen[i] = j->seen[row];
		ss->mrow[i] = row;
		ss->mgen[i] = j->gen ? j->gen[row] : 0;
		if (row >= c->end)
			c->end = row + 1;
	}
}

static void fill_strs_task(void *arg, size_t t)
{
	struct fill_job *j = arg;
	struct stage_side *ss = j->ss;
	const size_t a = t * j->chunk, e = a + j->chunk < j->n ? a + j->chunk : j->n;
	size_t o = j->c[t].bytes;
	for (size_t i = a; i < e; i++) {
		mfs_id_t *id = &ss->r[i].id;
		if (id->kind != MFS_ID_STR)
			continue;
		memcpy(ss->str + o, id->str, id->len);
		id->str = ss->str + o;
		o += id->len;
	}
}

/* side_fill's ids-only staging of a rows list (room for n > 0 rows is made): one chunk on the
 * caller's thread, or chunks on par for a long list. */
static int side_fill_ids_list(struct stage_side *ss, const char *ent, const mfs_idmap_t *map, const uint32_t *seen,
                              const uint16_t *gen, uint32_t n_model, const uint32_t *rows, size_t n, mfs_par_t *par,
                              char *errstr, size_t es)
{
	struct fill_chunk one;
	struct fill_job j = {ss, map, seen, rows, gen, n_model, n, n, &one};
	if (n >= STAGE_PAR_MIN && mfs_par_threads(par) > 1) {
		const size_t tasks_max = 4 * (size_t)mfs_par_threads(par);
		j.chunk = (n + tasks_max - 1) / tasks_max;
		if (j.chunk < 8192)
			j.chunk = 8192;
	}
	const size_t tasks = (n + j.chunk - 1) / j.chunk;
	if (tasks > 1 && !(j.c = malloc(tasks * sizeof *j.c)))
		return mfs_errf(errstr, es, ENOMEM, "out of memory for %zu %s rows", n, ent);
	mfs_par_run(par, tasks, fill_ids_task, &j);
	size_t bytes = 0;
	int rc = 0;
	for (size_t t = 0; t < tasks && !rc; t++) {
		if (j.c[t].bad != SIZE_MAX) {
			rc = fill_error(ent, j.c[t].why, rows[j.c[t].bad], n_model, map, errstr, es);
			break;
		}
		const size_t b = j.c[t].bytes;
		j.c[t].bytes = bytes; /* now the chunk's offset */
		bytes += b;
		if (j.c[t].end > ss->mrow_end)
			ss->mrow_end = j.c[t].end;
	}
	if (!rc && bytes && mfs_grow((void **)&ss->str, &ss->str_cap, bytes, 1))
		rc = mfs_errf(errstr, es, ENOMEM, "out of memory for %s ids", ent);
	if (!rc && bytes) {
		mfs_par_run(par, tasks, fill_strs_task, &j);
		ss->str_n = bytes;
	}
	if (j.c != &one)
		free(j.c);
	if (rc) {
		ss->mrow_end = 0;
		return rc;
	}
	ss->n = n;
	return 0;
}

static int side_fill(struct stage_side *ss, const char *ent, const mfs_idmap_t *map, const float *b, const float *F,
                     const uint32_t *seen, const uint16_t *gen, int k, uint32_t n_model, const uint32_t *rows,
                     size_t n_rows, int copy, mfs_par_t *par, char *errstr, size_t es)
{
	size_t n = rows ? n_rows : n_model;
	ss->n = 0;
	ss->sorted = 0;
	ss->unchecked = copy == 2;
	ss->str_n = 0;
	ss->mb = copy ? NULL : b;
	ss->mF = copy ? NULL : F;
	ss->has_seen = seen != NULL;
	ss->mseen = copy ? NULL : seen;
	side_trim(ss, n, 1 + (size_t)k);
	if (n == 0)
		return 0;
	if (n > ss->cap) {
		struct snap_row *r = realloc(ss->r, n * sizeof *r);
		if (!r)
			return mfs_errf(errstr, es, ENOMEM, "out of memory for %zu %s rows", n, ent);
		ss->r = r;
		ss->cap = n;
	}
	const size_t w = 1 + (size_t)k;
	if (copy && n * w > ss->v_cap) {
		float *v = realloc(ss->v, n * w * sizeof *v);
		if (!v)
			return mfs_errf(errstr, es, ENOMEM, "out of memory for %zu %s rows", n, ent);
		ss->v = v;
		ss->v_cap = n * w;
	}
	if (copy && seen && mfs_grow((void **)&ss->seen, &ss->seen_cap, n, sizeof *ss->seen))
		return mfs_errf(errstr, es, ENOMEM, "out of memory for %zu %s rows", n, ent);
	ss->mrow_end = 0;
	if (copy == 2 && n > ss->m_cap) {
		uint32_t *mr = realloc(ss->mrow, n * sizeof *mr);
		if (mr)
			ss->mrow = mr;
		uint16_t *mg = mr ? realloc(ss->mgen, n * sizeof *mg) : NULL;
		if (!mg)
			return mfs_errf(errstr, es, ENOMEM, "out of memory for %zu %s rows", n, ent);
		ss->mgen = mg;
		ss->m_cap = n;
	}
	if (copy == 2 && rows) /* serve's stages */
		return side_fill_ids_list(ss, ent, map, seen, gen, n_model, rows, n, par, errstr, es);
	/* string ids: their bytes first (pointers are set once the arena stops moving) */
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t row = rows ? rows[i] : (uint32_t)i;
		if (row >= n_model)
			return fill_error(ent, FILL_RANGE, row, n_model, map, errstr, es);
		if (!mfs_idmap_alive(map, row)) { /* freed (model_store/life.h): every row skips it, a list may not name it */
			if (rows)
				return fill_error(ent, FILL_DEAD, row, n_model, map, errstr, es);
			continue;
		}
		if (copy != 2 && !row_finite(b, F, row, k))
			return mfs_errf(errstr, es, MFS_ENAN, "%s row %u has a NaN or infinite value; nothing published", ent,
			                row);
		mfs_id_t id = mfs_idmap_key(map, row);
		if (id.kind == MFS_ID_STR && (id.len == 0 || id.len > MFS_SNAP_STR_MAX))
			return fill_error(ent, FILL_IDLEN, row, n_model, map, errstr, es);
		if (id.kind == MFS_ID_STR && copy) {
			if (mfs_grow((void **)&ss->str, &ss->str_cap, ss->str_n + id.len, 1))
				return mfs_errf(errstr, es, ENOMEM, "out of memory for %s ids", ent);
			memcpy(ss->str + ss->str_n, id.str, id.len);
			id.str = NULL;
			id.num = ss->str_n; /* offset until the arena is final */
			ss->str_n += id.len;
		}
		ss->r[o].id = id;
		if (!copy) {
			ss->r[o++].row = row;
			continue;
		}
		ss->r[o].row = (uint32_t)o;
		if (seen)
			ss->seen[o] = seen[row];
		if (copy == 2) {
			ss->mrow[o] = row;
			ss->mgen[o] = gen ? gen[row] : 0;
			if (row >= ss->mrow_end)
				ss->mrow_end = row + 1;
		}
		if (copy != 2) {
			float *v = ss->v + o * w;
			v[0] = b[row];
			memcpy(v + 1, F + (size_t)row * (size_t)k, (size_t)k * sizeof(float));
		}
		o++;
	}
	for (size_t i = 0; copy && i < o; i++)
		if (ss->r[i].id.kind == MFS_ID_STR)
			ss->r[i].id.str = ss->str + ss->r[i].id.num, ss->r[i].id.num = 0;
	ss->n = o;
	if (!copy)
		side_sort(ss);
	return 0;
}

/* Copy the ids entity ent removed since the last snapshot (model_store/life.h) into ss. */
static int side_gone(struct stage_side *ss, const mfs_model_t *m, int ent, const char *name, char *errstr, size_t es)
{
	const size_t n = mfs_model_gone_n(m, ent);
	ss->n_del = 0;
	ss->del_str_n = 0;
	if (!n)
		return 0;
	if (mfs_grow((void **)&ss->del, &ss->cap_del, n, sizeof *ss->del))
		return mfs_errf(errstr, es, ENOMEM, "out of memory for %zu removed %s ids", n, name);
	for (size_t j = 0; j < n; j++) {
		mfs_id_t id = mfs_model_gone_id(m, ent, j);
		if (id.kind == MFS_ID_STR) {
			if (mfs_grow((void **)&ss->del_str, &ss->del_str_cap, ss->del_str_n + id.len, 1))
				return mfs_errf(errstr, es, ENOMEM, "out of memory for removed %s ids", name);
			memcpy(ss->del_str + ss->del_str_n, id.str, id.len);
			id.num = ss->del_str_n;
			id.str = NULL;
			ss->del_str_n += id.len;
		}
		ss->del[j] = id;
	}
	for (size_t j = 0; j < n; j++)
		if (ss->del[j].kind == MFS_ID_STR)
			ss->del[j].str = ss->del_str + ss->del[j].num, ss->del[j].num = 0;
	ss->n_del = n;
	return 0;
}

mfs_snap_stage_t *mfs_snap_stage_new(void)
{
	return calloc(1, sizeof(mfs_snap_stage_t));
}

void mfs_snap_stage_free(mfs_snap_stage_t *s)
{
	if (!s)
		return;
	for (int j = 0; j < 2; j++) {
		free(s->side[j].r);
		free(s->side[j].v);
		free(s->side[j].str);
		free(s->side[j].seen);
		free(s->side[j].del);
		free(s->side[j].del_str);
		free(s->side[j].mrow);
		free(s->side[j].mgen);
	}
	free(s->rated.umap);
	free(s->rated.imap);
	free(s->rated.igens);
	free(s->rated.r);
	free(s->rated.str);
	free(s->rated.val);
	free(s->rated.off);
	free(s->rated.items);
	free(s);
}

/* Copy the lists of tracker t (snap_rated.h) into sr as external ids: users whose row changed
 * hands, and items likewise, are left out (snap_rated.c); a user left with no item too. */
static int rated_fill(struct stage_rated *sr, const mfs_model_t *m, const mfs_snap_rated_t *t, int merge,
                      mfs_snap_rated_t *take, char *errstr, size_t es)
{
	if (take) /* taken whole: the lists are made publishing (rated_encode), merged */
		t = take, merge = 1;
	sr->n = sr->str_n = sr->val_n = 0;
	sr->sorted = 0;
	sr->on = t != NULL;
	/* room a burst of lists left (a snapshot put off while many users rated) is given back: the
	 * buffers grow again by doubling, which costs little beside writing that many lists */
	if (sr->val_cap > ((size_t)1 << 20) || sr->cap > STAGE_KEEP_ROWS) {
		free(sr->val), sr->val = NULL, sr->val_cap = 0;
		free(sr->r), sr->r = NULL, sr->cap = 0;
		free(sr->off), sr->off = NULL, sr->off_cap = 0;
		free(sr->str), sr->str = NULL, sr->str_cap = 0;
	}
	if (!t)
		return 0;
	sr->merge = merge;
	sr->max = mfs_snap_rated_max(t);
	if (take) {
		sr->take = take;
		return 0;
	}
	const size_t nl = mfs_snap_rated_users(t);
	if (mfs_grow((void **)&sr->items, &sr->items_cap, sr->max, sizeof *sr->items) ||
	    mfs_grow((void **)&sr->r, &sr->cap, nl ? nl : 1, sizeof *sr->r) ||
	    mfs_grow((void **)&sr->off, &sr->off_cap, nl + 1, sizeof *sr->off))
		return mfs_errf(errstr, es, ENOMEM, "out of memory for %zu rated lists", nl);
	sr->off[0] = 0;
	for (size_t j = 0; j < nl; j++) {
		uint32_t u;
		const size_t ni = mfs_snap_rated_list(t, m, j, &u, sr->items);
		if (!ni)
			continue;
		mfs_id_t id = mfs_idmap_key(m->users, u);
		if (id.kind == MFS_ID_STR && (id.len == 0 || id.len > MFS_SNAP_STR_MAX))
			return mfs_errf(errstr, es, MFS_EIDLEN, "user row %u: string id of %u bytes", u, (unsigned)id.len);
		if (id.kind == MFS_ID_STR) {
			if (mfs_grow((void **)&sr->str, &sr->str_cap, sr->str_n + id.len, 1))
				return mfs_errf(errstr, es, ENOMEM, "out of memory for rated lists");
			memcpy(sr->str + sr->str_n, id.str, id.len);
			id.str = NULL;
			id.num = sr->str_n; /* offset until the arena is final */
			sr->str_n += id.len;
		}
		if (mfs_grow((void **)&sr->val, &sr->val_cap, sr->val_n + ni * (2 + MFS_SNAP_KEY_MAX), 1))
			return mfs_errf(errstr, es, ENOMEM, "out of memory for rated lists");
		for (size_t x = 0; x < ni; x++) {
			const mfs_id_t it = mfs_idmap_key(m->items, sr->items[x]);
			unsigned char *p = sr->val + sr->val_n;
			size_t len;
			if (it.kind == MFS_ID_U64)
				len = mfs_snap_key_u64(p + 2, it.num);
			else if (it.len >= 1 && it.len <= MFS_SNAP_STR_MAX)
				len = mfs_snap_key_str(p + 2, it.str, it.len);
			else
				continue;
			p[0] = (unsigned char)len;
			p[1] = (unsigned char)(len >> 8);
			sr->val_n += 2 + len;
		}
		sr->r[sr->n].id = id;
		sr->r[sr->n].row = (uint32_t)sr->n;
		sr->off[++sr->n] = sr->val_n;
	}
	for (size_t j = 0; j < sr->n; j++)
		if (sr->r[j].id.kind == MFS_ID_STR)
			sr->r[j].id.str = sr->str + sr->r[j].id.num, sr->r[j].id.num = 0;
	return 0;
}

/* Model row -> 1 + staged index for the rows of ss (the rest 0), in *map (grown, zeroed). */
static int map_rows(const struct stage_side *ss, uint32_t **map, size_t *cap)
{
	if (ss->mrow_end > *cap) {
		uint32_t *nm = realloc(*map, (size_t)ss->mrow_end * sizeof *nm);
		if (!nm)
			return ENOMEM;
		memset(nm + *cap, 0, ((size_t)ss->mrow_end - *cap) * sizeof *nm);
		*map = nm;
		*cap = ss->mrow_end;
	}
	for (size_t o = 0; o < ss->n; o++)
		(*map)[ss->mrow[o]] = (uint32_t)o + 1;
	return 0;
}

static void unmap_rows(const struct stage_side *ss, uint32_t *map)
{
	for (size_t o = 0; o < ss->n && map; o++)
		map[ss->mrow[o]] = 0;
}

/* The lists of a taken tracker (rated_fill with take) as external ids, on the publishing
 * thread, before the sides are sorted (ids still at their staged index): a list's user and
 * items are rows this snapshot writes (each rating named them since the last one), so the ids
 * come from the stage, checked by generation like rated_fill checks them against the model.
 * Then the tracker is cleared for the adding thread to take back. */
static int rated_encode(mfs_snap_stage_t *s, char *errstr, size_t es)
{
	struct stage_rated *sr = &s->rated;
	const struct stage_side *su = &s->side[0], *si = &s->side[1];
	mfs_snap_rated_t *t = sr->take;
	const size_t nl = mfs_snap_rated_users(t);
	int rc = 0;
	sr->take = NULL;
	if (mfs_grow((void **)&sr->items, &sr->items_cap, sr->max, sizeof *sr->items) ||
	    mfs_grow((void **)&sr->igens, &sr->igens_cap, sr->max, sizeof *sr->igens) ||
	    mfs_grow((void **)&sr->r, &sr->cap, nl ? nl : 1, sizeof *sr->r) ||
	    mfs_grow((void **)&sr->off, &sr->off_cap, nl + 1, sizeof *sr->off) ||
	    map_rows(su, &sr->umap, &sr->umap_cap) || map_rows(si, &sr->imap, &sr->imap_cap)) {
		rc = mfs_errf(errstr, es, ENOMEM, "out of memory for %zu rated lists", nl);
		goto done;
	}
	sr->off[0] = 0;
	for (size_t j = 0; j < nl; j++) {
		uint32_t u;
		uint16_t ug;
		const size_t ne = mfs_snap_rated_raw(t, j, &u, &ug, sr->items, sr->igens);
		const uint32_t ou = u < sr->umap_cap ? sr->umap[u] : 0;
		if (!ou || su->mgen[ou - 1] != ug) /* freed since, or another user's row now */
			continue;
		if (mfs_grow((void **)&sr->val, &sr->val_cap, sr->val_n + ne * (2 + MFS_SNAP_KEY_MAX), 1)) {
			rc = mfs_errf(errstr, es, ENOMEM, "out of memory for rated lists");
			goto done;
		}
		const size_t at = sr->val_n;
		for (size_t x = 0; x < ne; x++) {
			const uint32_t oi = sr->items[x] < sr->imap_cap ? sr->imap[sr->items[x]] : 0;
			if (!oi || si->mgen[oi - 1] != sr->igens[x])
				continue;
			const mfs_id_t it = si->r[oi - 1].id;
			unsigned char *p = sr->val + sr->val_n;
			const size_t len = it.kind == MFS_ID_U64 ? mfs_snap_key_u64(p + 2, it.num)
			                                         : mfs_snap_key_str(p + 2, it.str, it.len);
			p[0] = (unsigned char)len;
			p[1] = (unsigned char)(len >> 8);
			sr->val_n += 2 + len;
		}
		if (sr->val_n == at) /* no item left */
			continue;
		sr->r[sr->n].id = su->r[ou - 1].id; /* a string's bytes stay in the users' side */
		sr->r[sr->n].row = (uint32_t)sr->n;
		sr->off[++sr->n] = sr->val_n;
	}
done:
	unmap_rows(su, sr->umap);
	unmap_rows(si, sr->imap);
	mfs_snap_rated_clear(t);
	return rc;
}

static int stage_fill(mfs_snap_stage_t *s, const mfs_model_t *m, const mfs_snap_info_t *info, int copy,
                      mfs_par_t *par, char *errstr, size_t errstr_size)
{
	int rc;
	s->side[0].n = s->side[1].n = 0;
	if (m->k < 1)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "model has k = %d", m->k);
	const int tr = m->track;
	s->rated.take = NULL;
	if ((rc = side_fill(&s->side[0], "user", m->users, m->bu, m->P, tr ? m->seen[0] : NULL, m->gen[0], m->k,
	                    m->n_users, info->user_rows, info->n_user_rows, copy, par, errstr, errstr_size)) ||
	    (rc = side_fill(&s->side[1], "item", m->items, m->bi, m->Q, tr ? m->seen[1] : NULL, m->gen[1], m->k,
	                    m->n_items, info->item_rows, info->n_item_rows, copy, par, errstr, errstr_size)) ||
	    (rc = side_gone(&s->side[0], m, 0, "user", errstr, errstr_size)) ||
	    (rc = side_gone(&s->side[1], m, 1, "item", errstr, errstr_size)) ||
	    (rc = rated_fill(&s->rated, m, info->rated, info->rated_merge, copy == 2 ? info->rated_take : NULL, errstr,
	                     errstr_size))) {
		s->side[0].n = s->side[1].n = 0;
		s->rated.n = 0;
		s->side[0].n_del = s->side[1].n_del = 0;
		return rc;
	}
	s->k = m->k;
	s->mu = m->mu;
	s->events_applied = m->events_applied;
	return 0;
}

int mfs_snap_stage_fill(mfs_snap_stage_t *s, const mfs_model_t *m, const mfs_snap_info_t *info, char *errstr,
                        size_t errstr_size)
{
	if (!s || !m || !info)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "mfs_snap_stage_fill: NULL argument");
	return stage_fill(s, m, info, 1, NULL, errstr, errstr_size);
}

int mfs_snap_stage_fill_ids(mfs_snap_stage_t *s, const mfs_model_t *m, const mfs_snap_info_t *info, mfs_par_t *par,
                            char *errstr, size_t errstr_size)
{
	if (!s || !m || !info)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "mfs_snap_stage_fill_ids: NULL argument");
	return stage_fill(s, m, info, 2, par, errstr, errstr_size);
}

float *mfs_snap_stage_values(mfs_snap_stage_t *s, int side, size_t *n)
{
	if (n)
		*n = s && (side == 0 || side == 1) ? s->side[side].n : 0;
	if (!s || (side != 0 && side != 1) || !s->side[side].unchecked || s->side[side].sorted)
		return NULL;
	return s->side[side].v;
}

/* The values a stage filled by ids got later: every one finite, or the stage is not published. */
static int side_check_values(const struct stage_side *ss, const char *ent, int k, char *errstr, size_t es)
{
	const size_t w = 1 + (size_t)k;
	for (size_t i = 0; ss->unchecked && i < ss->n; i++) {
		const float *v = ss->v + (size_t)ss->r[i].row * w;
		for (size_t j = 0; j < w; j++) {
			if (isfinite(v[j]))
				continue;
			const mfs_id_t id = ss->r[i].id;
			if (id.kind == MFS_ID_STR)
				return mfs_errf(errstr, es, MFS_ENAN, "%s \"%.*s\" has a NaN or infinite value; nothing published",
				                ent, (int)id.len, id.str);
			return mfs_errf(errstr, es, MFS_ENAN, "%s %" PRIu64 " has a NaN or infinite value; nothing published", ent,
			                (uint64_t)id.num);
		}
	}
	return 0;
}

static int check_info(const mfs_snap_stage_t *st, const mfs_snap_info_t *info, char *errstr, size_t es)
{
	if (st->k < 1)
		return mfs_errf(errstr, es, MFS_EINVAL, "model has k = %d", st->k);
	if (!isfinite(st->mu))
		return mfs_errf(errstr, es, MFS_ENAN, "mu is %g; nothing published", st->mu);
	if (!isfinite(info->learning_rate))
		return mfs_errf(errstr, es, MFS_ENAN, "learning_rate is %g; nothing published", info->learning_rate);
	if (isinf(info->last_loss))
		return mfs_errf(errstr, es, MFS_ENAN, "last_loss is infinite (NaN means unknown); nothing published");
	if (!isfinite(info->rating_min) || !isfinite(info->rating_max))
		return mfs_errf(errstr, es, MFS_ENAN, "rating range is not finite; nothing published");
	if (info->rating_min > info->rating_max)
		return mfs_errf(errstr, es, MFS_EINVAL, "rating_min %g > rating_max %g", info->rating_min,
		                info->rating_max);
	if (info->n_offsets && !info->offsets)
		return mfs_errf(errstr, es, MFS_EINVAL, "n_offsets = %zu but no offsets", info->n_offsets);
	for (size_t i = 0; i < info->n_offsets; i++) {
		const mfs_offset_t *o = &info->offsets[i];
		size_t len = o->topic ? strlen(o->topic) : 0;
		if (len == 0 || len > MFS_SNAP_TOPIC_MAX || strchr(o->topic, '/'))
			return mfs_errf(errstr, es, MFS_EINVAL, "offset %zu: bad topic name \"%s\"", i,
			                o->topic ? o->topic : "(null)");
		if (o->partition < 0)
			return mfs_errf(errstr, es, MFS_EINVAL, "offset %zu: partition %d < 0", i, (int)o->partition);
	}
	if (info->n_extra && !info->extra)
		return mfs_errf(errstr, es, MFS_EINVAL, "n_extra = %zu but no extra records", info->n_extra);
	for (size_t i = 0; i < info->n_extra; i++) {
		const mfs_snap_extra_t *x = &info->extra[i];
		size_t len = x->key ? strlen(x->key) : 0;
		if (len == 0 || len > 200 || mfs_snap_meta_type_core(x->key, len) != MFS_SNAP_T_UNKNOWN)
			return mfs_errf(errstr, es, MFS_EINVAL, "extra %zu: bad or reserved meta key \"%s\"", i,
			                x->key ? x->key : "(null)");
		if (x->type != MFS_SNAP_T_U64 && x->type != MFS_SNAP_T_F64)
			return mfs_errf(errstr, es, MFS_EINVAL, "extra %zu (%s): type must be u64 or f64", i, x->key);
		if (x->type == MFS_SNAP_T_F64 && !isfinite(x->f64))
			return mfs_errf(errstr, es, MFS_ENAN, "extra %s is %g; nothing published", x->key, x->f64);
	}
	return 0;
}

/* ---- the txn --------------------------------------------------------------------------------- */
/* Write sorted rows into dbi: plain puts up to the DB's last key, MDB_APPEND after it. */
/* Delete the records (row and last-seen time) of the ids ss lists as removed; an id never
 * published has none. */
static int delete_rows(MDB_txn *txn, MDB_dbi dbi, MDB_dbi seen_dbi, const struct stage_side *ss)
{
	unsigned char kbuf[MFS_SNAP_KEY_MAX];
	for (size_t j = 0; j < ss->n_del; j++) {
		const mfs_id_t *id = &ss->del[j];
		MDB_val key = {id->kind == MFS_ID_U64 ? mfs_snap_key_u64(kbuf, id->num) : mfs_snap_key_str(kbuf, id->str, id->len),
		               kbuf};
		int rc = mdb_del(txn, dbi, &key, NULL);
		if (rc && rc != MDB_NOTFOUND)
			return rc;
		rc = mdb_del(txn, seen_dbi, &key, NULL);
		if (rc && rc != MDB_NOTFOUND)
			return rc;
	}
	return 0;
}

/* Delete the rated lists of the users ss lists as removed: a deleted user leaves none behind. */
static int delete_rated(MDB_txn *txn, MDB_dbi dbi, const struct stage_side *ss)
{
	unsigned char kbuf[MFS_SNAP_KEY_MAX];
	for (size_t j = 0; j < ss->n_del; j++) {
		const mfs_id_t *id = &ss->del[j];
		MDB_val key = {id->kind == MFS_ID_U64 ? mfs_snap_key_u64(kbuf, id->num) : mfs_snap_key_str(kbuf, id->str, id->len),
		               kbuf};
		int rc = mdb_del(txn, dbi, &key, NULL);
		if (rc && rc != MDB_NOTFOUND)
			return rc;
	}
	return 0;
}

/* by item id bytes, then by place in the list */
static int rated_ent_cmp(const void *pa, const void *pb)
{
	const struct rated_ent *a = pa, *b = pb;
	int c = memcmp(a->k, b->k, a->len < b->len ? a->len : b->len);
	if (c)
		return c;
	if (a->len != b->len)
		return a->len < b->len ? -1 : 1;
	return (a->pos > b->pos) - (a->pos < b->pos);
}

/* Append the entries of a user_rated list (v, size, checked) to w->sw_rent from *n on. */
static int rated_ents(mfs_snap_writer_t *w, const unsigned char *v, size_t size, size_t count, size_t *n)
{
	if (mfs_grow((void **)&w->sw_rent, &w->sw_rent_cap, *n + count, sizeof *w->sw_rent))
		return ENOMEM;
	for (size_t pos = 4, j = 0; j < count && pos < size; j++, (*n)++) {
		struct rated_ent *e = &w->sw_rent[*n];
		mfs_snap_rated_next(v, &pos, &e->k, &e->len);
		e->pos = *n;
	}
	return 0;
}

/* The rows a put is this far ahead of get their values prefetched: the sort by key reads them
 * in another order than they were staged, and each row's first touch was a cache (and often a
 * TLB) miss, most of write_rows' time in a stream of new users (perf). */
#define WRITE_AHEAD 8

static void prefetch_bytes(const void *p, size_t n)
{
	for (size_t o = 0; o < n; o += 64)
		__builtin_prefetch((const char *)p + o);
}

/* The last key of the DB under cursor c (last_len 0: the DB is empty). */
static int last_key(MDB_cursor *c, unsigned char *last, size_t *last_len)
{
	MDB_val key, val;
	int rc = mdb_cursor_get(c, &key, &val, MDB_LAST);
	*last_len = 0;
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return rc;
	*last_len = key.mv_size < MFS_SNAP_KEY_MAX ? key.mv_size : MFS_SNAP_KEY_MAX;
	memcpy(last, key.mv_data, *last_len);
	return 0;
}

/* Whether key (encoded) sorts after last (LMDB's default order: bytewise, then shorter first). */
static int key_after(const unsigned char *key, size_t len, const unsigned char *last, size_t last_len)
{
	size_t m = len < last_len ? len : last_len;
	int c = memcmp(key, last, m);
	return c > 0 || (c == 0 && len > last_len);
}

/* Write the stage's rated lists (sorted by user key) into dbi. A list keeps the last sr->max
 * distinct items, newest last: entries are the stored list's (when merging) then the new ones,
 * an item rated again keeps only its newest place. A stored value that is malformed is not
 * merged (it is replaced, with a warning): the lists are advisory, the snapshot goes on. */
static int write_rated(mfs_snap_writer_t *w, MDB_txn *txn, MDB_dbi dbi, const struct stage_rated *sr)
{
	unsigned char kbuf[MFS_SNAP_KEY_MAX], last[MFS_SNAP_KEY_MAX];
	size_t last_len = 0;
	MDB_cursor *cur;
	int rc = 0;
	if (!sr->on || !sr->n)
		return 0;
	if ((rc = mdb_cursor_open(txn, dbi, &cur)))
		return rc;
	if ((rc = last_key(cur, last, &last_len))) {
		mdb_cursor_close(cur);
		return rc;
	}
	for (size_t j = 0; j < sr->n && rc == 0; j++) {
		/* the lists are read in user key order, not staged order: fetch ahead (write_rows) */
		if (j + 2 * WRITE_AHEAD < sr->n)
			__builtin_prefetch(sr->off + sr->r[j + 2 * WRITE_AHEAD].row);
		if (j + WRITE_AHEAD < sr->n) {
			const uint32_t pr = sr->r[j + WRITE_AHEAD].row;
			prefetch_bytes(sr->val + sr->off[pr], sr->off[pr + 1] - sr->off[pr]);
		}
		const mfs_id_t *id = &sr->r[j].id;
		MDB_val key = {id->kind == MFS_ID_U64 ? mfs_snap_key_u64(kbuf, id->num) : mfs_snap_key_str(kbuf, id->str, id->len),
		               kbuf}, old;
		size_t n = 0;
		/* past the last key written (users in key order): no list is stored, nothing to look
		 * up, and the put is an append (new users with growing ids are all here) */
		const int append = last_len == 0 || key_after(kbuf, key.mv_size, last, last_len);
		if (sr->merge && !append) {
			/* through the cursor: in key order the next user's list is most often on its page */
			rc = mdb_cursor_get(cur, &key, &old, MDB_SET);
			if (rc == 0) {
				long c = mfs_snap_rated_check(old.mv_data, old.mv_size);
				if (c < 0)
					mfs_warn("snap", "msg=\"malformed user_rated record replaced\" bytes=%zu", old.mv_size);
				else if ((rc = rated_ents(w, old.mv_data, old.mv_size, (size_t)c, &n)))
					break;
			} else if (rc != MDB_NOTFOUND) {
				break;
			}
			rc = 0;
		}
		/* the new entries: the stage's bytes have the value's entry layout without the count */
		const size_t a = sr->off[sr->r[j].row], b = sr->off[sr->r[j].row + 1];
		size_t cnt = 0;
		for (size_t pos = a; pos < b; cnt++)
			pos += 2 + ((size_t)sr->val[pos] | (size_t)sr->val[pos + 1] << 8);
		if (mfs_grow((void **)&w->sw_rent, &w->sw_rent_cap, n + cnt, sizeof *w->sw_rent)) {
			rc = ENOMEM;
			break;
		}
		for (size_t pos = a; pos < b; n++) {
			struct rated_ent *e = &w->sw_rent[n];
			e->len = (size_t)sr->val[pos] | (size_t)sr->val[pos + 1] << 8;
			e->k = sr->val + pos + 2;
			e->pos = n;
			pos += 2 + e->len;
		}
		/* keep each item's newest place only, then the last max of those */
		if (mfs_grow((void **)&w->sw_rkeep, &w->sw_rkeep_cap, n ? n : 1, 1)) {
			rc = ENOMEM;
			break;
		}
		memset(w->sw_rkeep, 0, n);
		qsort(w->sw_rent, n, sizeof *w->sw_rent, rated_ent_cmp);
		for (size_t x = 0; x < n; x++) /* the last of a run of one item is its newest */
			if (x + 1 == n || w->sw_rent[x].len != w->sw_rent[x + 1].len ||
			    memcmp(w->sw_rent[x].k, w->sw_rent[x + 1].k, w->sw_rent[x].len) != 0)
				w->sw_rkeep[w->sw_rent[x].pos] = 1;
		/* sw_rent is sorted by item now; put the entries back by place to write them in order */
		if (mfs_grow((void **)&w->sw_rval, &w->sw_rval_cap, 4 + n * (2 + MFS_SNAP_KEY_MAX), 1)) {
			rc = ENOMEM;
			break;
		}
		struct rated_ent *byp = w->sw_rent;
		for (size_t x = 0; x < n;) { /* cycle sort by pos: pos is a permutation of 0..n-1 */
			if (byp[x].pos == x) {
				x++;
				continue;
			}
			struct rated_ent t = byp[byp[x].pos];
			byp[byp[x].pos] = byp[x];
			byp[x] = t;
		}
		size_t kept = 0;
		for (size_t x = 0; x < n; x++)
			kept += w->sw_rkeep[x];
		size_t skip = kept > sr->max ? kept - sr->max : 0, out = 4, nout = 0;
		for (size_t x = 0; x < n; x++) {
			if (!w->sw_rkeep[x] || (skip && skip--))
				continue;
			w->sw_rval[out] = (unsigned char)byp[x].len;
			w->sw_rval[out + 1] = (unsigned char)(byp[x].len >> 8);
			memcpy(w->sw_rval + out + 2, byp[x].k, byp[x].len);
			out += 2 + byp[x].len;
			nout++;
		}
		mfs_snap_put_u32(w->sw_rval, (uint32_t)nout);
		MDB_val v = {out, w->sw_rval};
		if (nout && !(rc = mdb_cursor_put(cur, &key, &v, append ? MDB_APPEND : 0)) && append) {
			last_len = key.mv_size; /* the DB's last key now */
			memcpy(last, kbuf, last_len);
		}
	}
	mdb_cursor_close(cur);
	return rc;
}

/* Put side ss's rows (sorted) and their last-seen times. Each DB is written through its own
 * cursor: in key order a put finds its place from the cursor's page, and a key past the DB's
 * last one is an MDB_APPEND. A row's value is encoded straight into its page (MDB_RESERVE). */
static int write_rows(MDB_txn *txn, MDB_dbi dbi, MDB_dbi seen_dbi, const struct stage_side *ss,
                      int k)
{
	const struct snap_row *r = ss->r;
	const size_t n = ss->n;
	MDB_cursor *cur = NULL, *scur = NULL;
	unsigned char kbuf[MFS_SNAP_KEY_MAX], last[MFS_SNAP_KEY_MAX], slast[MFS_SNAP_KEY_MAX];
	size_t last_len = 0, slast_len = 0;
	int rc;
	if (n == 0)
		return 0;
	if ((rc = mdb_cursor_open(txn, dbi, &cur)) || (rc = last_key(cur, last, &last_len)))
		goto out;
	if (ss->has_seen &&
	    ((rc = mdb_cursor_open(txn, seen_dbi, &scur)) || (rc = last_key(scur, slast, &slast_len))))
		goto out;
	const size_t vbytes = mfs_snap_row_bytes((uint32_t)k), w1 = 1 + (size_t)k;
	int append = last_len == 0, sappend = slast_len == 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (i + WRITE_AHEAD < n) {
			const uint32_t pr = r[i + WRITE_AHEAD].row;
			if (ss->mb) {
				__builtin_prefetch(ss->mb + pr);
				prefetch_bytes(ss->mF + (size_t)pr * (size_t)k, (size_t)k * 4);
			} else {
				prefetch_bytes(ss->v + (size_t)pr * w1, w1 * 4);
			}
		}
		const mfs_id_t *id = &r[i].id;
		MDB_val key, val;
		key.mv_data = kbuf;
		key.mv_size = id->kind == MFS_ID_U64 ? mfs_snap_key_u64(kbuf, id->num)
		                                     : mfs_snap_key_str(kbuf, id->str, id->len);
		if (!append)
			append = key_after(kbuf, key.mv_size, last, last_len);
		val.mv_data = NULL;
		val.mv_size = vbytes;
		if ((rc = mdb_cursor_put(cur, &key, &val, MDB_RESERVE | (append ? MDB_APPEND : 0))))
			break;
		unsigned char *v = val.mv_data;
		if (ss->mb) { /* borrowed: the model's arrays */
			mfs_snap_put_f32(v, ss->mb[r[i].row]);
			mfs_snap_put_f32s(v + 4, ss->mF + (size_t)r[i].row * (size_t)k, (size_t)k);
		} else { /* copied: bias, then factors */
			mfs_snap_put_f32s(v, ss->v + (size_t)r[i].row * w1, w1);
		}
		if (scur) {
			unsigned char sv[4];
			mfs_snap_put_u32(sv, ss->mseen ? ss->mseen[r[i].row] : ss->seen[r[i].row]);
			MDB_val s4 = {sizeof sv, sv};
			if (!sappend)
				sappend = key_after(kbuf, key.mv_size, slast, slast_len);
			rc = mdb_cursor_put(scur, &key, &s4, sappend ? MDB_APPEND : 0);
		}
	}
out:
	if (scur)
		mdb_cursor_close(scur);
	if (cur)
		mdb_cursor_close(cur);
	return rc;
}

/* The encoded keys' bytes of n rows (u64: 9; a string: 1 + its length). */
static size_t rows_key_bytes(const struct snap_row *r, size_t n)
{
	size_t b = 0;
	for (size_t i = 0; i < n; i++)
		b += r[i].id.kind == MFS_ID_U64 ? 9 : 1 + (size_t)r[i].id.len;
	return b;
}

/* Pages reachable from the last commit's roots: every DB's branch, leaf and overflow pages,
 * LMDB's free DB (dbi 0) and main DB (dbi 1) included (a txn copies each at most once), and in
 * *depth the deepest tree's depth. 0 when they cannot be counted. */
static size_t reachable_pages(mfs_snap_writer_t *w, size_t *depth)
{
	MDB_txn *txn;
	MDB_stat st;
	size_t n = 0;
	*depth = 0;
	if (mdb_txn_begin(w->sw_env, NULL, MDB_RDONLY, &txn))
		return 0;
	const MDB_dbi dbis[] = {0, 1, w->sw_meta, w->sw_users, w->sw_items, w->sw_seen[0], w->sw_seen[1], w->sw_rated};
	for (size_t j = 0; j < sizeof dbis / sizeof dbis[0]; j++) {
		if (mdb_stat(txn, dbis[j], &st)) {
			n = 0;
			break;
		}
		n += st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages;
		if (st.ms_depth > *depth)
			*depth = st.ms_depth;
	}
	mdb_txn_abort(txn);
	return n;
}

/* Disk blocks for every page this txn can write, before it writes any (docs/OPERATIONS.md,
 * "Full disks"). With snapshot.sync=none LMDB writes through a shared map of a sparse file,
 * and storing to a page with no block behind it on a full filesystem is a SIGBUS, not an
 * error; in the other modes a full disk surfaces at the commit's write or flush (often as
 * EIO). posix_fallocate turns both into ENOSPC here. Worst case, for `puts` records put or
 * deleted that add at most `add` bytes: a copy of each page on a put's path from the root (no
 * more than the pages reachable from the roots: a page is copied once a txn), twice the added
 * bytes in new leaf pages (splits leave pages half full) and half as many again of new branch
 * pages (long string keys make branches narrow), the records of the freed pages.
 * The reservation is a high-water mark of the file: LMDB reuses freed pages below it. */
static int reserve(mfs_snap_writer_t *w, size_t puts, size_t add, char *errstr, size_t es)
{
	MDB_envinfo ei;
	MDB_stat st;
	int fd, rc;
	if (mdb_env_info(w->sw_env, &ei) || mdb_env_stat(w->sw_env, &st) || mdb_env_get_fd(w->sw_env, &fd))
		return 0;
	const size_t psz = st.ms_psize, used = (size_t)ei.me_last_pgno + 1;
	size_t depth, reach = reachable_pages(w, &depth);
	if (reach == 0 || reach > used)
		reach = used, depth = 8;
	const size_t path = puts * (depth + 1), copies = path < reach ? path : reach, add_pages = add / psz + 1;
	size_t want = (used + copies + 2 * add_pages + add_pages + copies / 64 + 64) * psz;
	/* a map too small for the txn would only be found at MDB_MAP_FULL, after writing most of
	 * it, and the whole txn would be written again: grow it first (no txn is open here; the
	 * map is address space, not disk) */
	size_t map = (size_t)ei.me_mapsize;
	while (map < want && map * 2 <= SNAP_MAP_MAX)
		map *= 2;
	if (map > (size_t)ei.me_mapsize) {
		if ((rc = mfs_fault("snapshot.grow")) || (rc = mdb_env_set_mapsize(w->sw_env, map)))
			return lmdb_fail(w, rc, "env_set_mapsize", errstr, es);
		mfs_info("snap", "msg=\"map grown ahead of the snapshot\" map_size=%zu puts=%zu", map, puts);
	}
	if (want > map)
		want = map;
	if (w->sw_reserved == SIZE_MAX)
		return 0;
	w->sw_need = 0;
	if (want <= w->sw_reserved)
		return 0;
	w->sw_need = want - w->sw_reserved;
	if (!(rc = mfs_fault("snapshot.reserve")))
		rc = posix_fallocate(fd, (off_t)w->sw_reserved, (off_t)(want - w->sw_reserved));
	if (rc == EOPNOTSUPP || rc == EINVAL) { /* the filesystem cannot: rely on the write's own error */
		mfs_warn("snap", "msg=\"cannot reserve disk for snapshots: a full disk may only show at the write\" "
		                 "dir=%s err=\"%s\"", w->sw_dir, strerror(rc));
		w->sw_reserved = SIZE_MAX;
		return 0;
	}
	if (rc)
		return disk_fail(w, rc, "reserving disk", errstr, es);
	w->sw_reserved = want;
	return 0;
}

/* Everything inside one write txn. LMDB codes come back as is (MDB_MAP_FULL is retried by
 * the caller); MFS_EINVAL / MFS_EVERSION / MFS_EFORMAT are set with errstr. A replacing
 * publish checks k and reads seq like any other, then empties the DBs (users, items, meta and
 * the last-seen times; mdb_drop with del = 0 keeps the handles) before it writes: seq still
 * grows. */
static int publish_txn(mfs_snap_writer_t *w, MDB_txn *txn, const mfs_snap_stage_t *m, const mfs_snap_info_t *info,
                       uint64_t *seq_out, uint64_t *n_users, uint64_t *n_items, char *errstr, size_t es)
{
	int rc, found;
	uint32_t stored;
	MDB_val k, v;
	if ((rc = get_meta_u32(txn, w->sw_meta, MFS_META_VERSION, &stored, &found)))
		return rc == MFS_EFORMAT ? mfs_errf(errstr, es, rc, "malformed %s record", MFS_META_VERSION) : rc;
	if (found && stored != MFS_SNAP_VERSION)
		return mfs_errf(errstr, es, MFS_EVERSION, "%s holds format version %u, this build writes %u",
		                w->sw_dir, stored, MFS_SNAP_VERSION);
	if ((rc = get_meta_u32(txn, w->sw_meta, MFS_META_K, &stored, &found)))
		return rc == MFS_EFORMAT ? mfs_errf(errstr, es, rc, "malformed %s record", MFS_META_K) : rc;
	if (found && stored != (uint32_t)m->k)
		return mfs_errf(errstr, es, MFS_EINVAL,
		                "model has k = %d but the snapshot in %s has k = %u (use a new directory)", m->k,
		                w->sw_dir, stored);
	uint64_t seq = 1;
	k.mv_data = (void *)(uintptr_t)MFS_META_SEQ;
	k.mv_size = strlen(MFS_META_SEQ);
	rc = mdb_get(txn, w->sw_meta, &k, &v);
	if (rc == 0 && v.mv_size == 8)
		seq = mfs_snap_get_u64(v.mv_data) + 1;
	else if (rc == 0)
		return mfs_errf(errstr, es, MFS_EFORMAT, "malformed %s record", MFS_META_SEQ);
	else if (rc != MDB_NOTFOUND)
		return rc;
	if (info->replace && ((rc = mdb_drop(txn, w->sw_users, 0)) || (rc = mdb_drop(txn, w->sw_items, 0)) ||
	                      (rc = mdb_drop(txn, w->sw_meta, 0)) || (rc = mdb_drop(txn, w->sw_seen[0], 0)) ||
	                      (rc = mdb_drop(txn, w->sw_seen[1], 0)) || (rc = mdb_drop(txn, w->sw_rated, 0))))
		return rc;

	double t0 = mfs_now_s();
	if ((rc = delete_rows(txn, w->sw_users, w->sw_seen[0], &m->side[0])) ||
	    (rc = delete_rows(txn, w->sw_items, w->sw_seen[1], &m->side[1])) ||
	    (rc = write_rows(txn, w->sw_users, w->sw_seen[0], &m->side[0], m->k)) ||
	    (rc = write_rows(txn, w->sw_items, w->sw_seen[1], &m->side[1], m->k)))
		return rc;
	double t1 = mfs_now_s();
	w->sw_phase[MFS_SNAP_PH_ROWS] += t1 - t0;
	if ((rc = delete_rated(txn, w->sw_rated, &m->side[0])) || (rc = write_rated(w, txn, w->sw_rated, &m->rated)))
		return rc;
	w->sw_phase[MFS_SNAP_PH_RATED] += mfs_now_s() - t1;
	MDB_stat su, si;
	if ((rc = mdb_stat(txn, w->sw_users, &su)) || (rc = mdb_stat(txn, w->sw_items, &si)))
		return rc;

	MDB_dbi d = w->sw_meta;
	if ((rc = put_meta_u32(txn, d, MFS_META_VERSION, MFS_SNAP_VERSION)) ||
	    (rc = put_meta_u32(txn, d, MFS_META_K, (uint32_t)m->k)) ||
	    (rc = put_meta(txn, d, MFS_META_DTYPE, MFS_SNAP_DTYPE, 3)) ||
	    (rc = put_meta_f64(txn, d, MFS_META_MU, m->mu)) ||
	    (rc = put_meta_u64(txn, d, MFS_META_N_USERS, su.ms_entries)) ||
	    (rc = put_meta_u64(txn, d, MFS_META_N_ITEMS, si.ms_entries)) ||
	    (rc = put_meta_u64(txn, d, MFS_META_SEQ, seq)) ||
	    (rc = put_meta_u64(txn, d, MFS_META_WALL_MS, (uint64_t)mfs_wall_ms())) ||
	    (rc = put_meta_u64(txn, d, MFS_META_EVENTS, m->events_applied)) ||
	    (rc = put_meta_f64(txn, d, MFS_META_LR, info->learning_rate)) ||
	    (rc = put_meta_f64(txn, d, MFS_META_LOSS, info->last_loss)) ||
	    (rc = put_meta_f64(txn, d, MFS_META_RMIN, info->rating_min)) ||
	    (rc = put_meta_f64(txn, d, MFS_META_RMAX, info->rating_max)))
		return rc;
	for (size_t i = 0; i < info->n_offsets; i++) {
		const mfs_offset_t *o = &info->offsets[i];
		char key[sizeof MFS_META_OFFSET_PREFIX + MFS_SNAP_TOPIC_MAX + 16];
		snprintf(key, sizeof key, "%s%s/%d", MFS_META_OFFSET_PREFIX, o->topic, (int)o->partition);
		if ((rc = put_meta_u64(txn, d, key, (uint64_t)o->next)))
			return rc;
	}
	for (size_t i = 0; i < info->n_extra; i++) {
		const mfs_snap_extra_t *x = &info->extra[i];
		rc = x->type == MFS_SNAP_T_U64 ? put_meta_u64(txn, d, x->key, x->u64) : put_meta_f64(txn, d, x->key, x->f64);
		if (rc)
			return rc;
	}
	*seq_out = seq;
	*n_users = su.ms_entries;
	*n_items = si.ms_entries;
	return 0;
}

int mfs_snap_publish(mfs_snap_writer_t *w, const mfs_model_t *m, const mfs_snap_info_t *info, uint64_t *seq,
                     char *errstr, size_t errstr_size)
{
	int rc;
	if (!w || !m || !info)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "mfs_snap_publish: NULL argument");
	if (!w->sw_stage && !(w->sw_stage = mfs_snap_stage_new()))
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	/* borrowed, not copied: the model does not change during this call, and a whole-model
	 * publish (`mfstream train`) must not need the model's size again in memory */
	if ((rc = stage_fill(w->sw_stage, m, info, 0, NULL, errstr, errstr_size)))
		return rc;
	return mfs_snap_publish_stage(w, w->sw_stage, info, seq, errstr, errstr_size);
}

int mfs_snap_publish_stage(mfs_snap_writer_t *w, mfs_snap_stage_t *m, const mfs_snap_info_t *info,
                           uint64_t *seq, char *errstr, size_t errstr_size)
{
	int rc;
	if (!w || !m || !info)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "mfs_snap_publish: NULL argument");
	const double tp = mfs_now_s();
	if (m->rated.take && (rc = rated_encode(m, errstr, errstr_size)))
		return rc;
	if ((rc = side_check_values(&m->side[0], "user", m->k, errstr, errstr_size)) ||
	    (rc = side_check_values(&m->side[1], "item", m->k, errstr, errstr_size)))
		return rc;
	side_sort(&m->side[0]);
	side_sort(&m->side[1]);
	if (!m->rated.sorted && m->rated.n) /* user key order: the puts walk the B-tree forward */
		rows_sort(m->rated.r, m->rated.n);
	m->rated.sorted = 1;
	w->sw_phase[MFS_SNAP_PH_PREPARE] += mfs_now_s() - tp;
	if (w->sw_fatal)
		return mfs_errf(errstr, errstr_size, MFS_EFATAL, "snapshot writer on %s is unusable after a fatal "
		                                                 "LMDB error", w->sw_dir);
	double t0 = mfs_now_s();
	/* 1. validate (nothing is written unless all of it is good; rows were checked staging) */
	if ((rc = check_info(m, info, errstr, errstr_size)))
		return rc;
	size_t vbytes = mfs_snap_row_bytes((uint32_t)m->k);
	const size_t nu = m->side[0].n, ni = m->side[1].n;
	int dead = 0;
	mdb_reader_check(w->sw_env, &dead);
	if (dead)
		mfs_warn("snap", "msg=\"cleared stale reader slots\" count=%d", dead);

	/* 2. one txn; retried whole after growing the map */
	/* what the txn puts (and deletes), and the bytes it can add: a row, its key and its node
	 * (+ the same for its last-seen time) where it is new; a user's rated list grows by its new
	 * entries at most (the merged list replaces the stored one), and a new list by its count,
	 * key and node too */
	size_t puts = 0, add = 0;
	for (int j = 0; j < 2; j++) {
		const struct stage_side *ss = &m->side[j];
		const size_t keys = rows_key_bytes(ss->r, ss->n), per = ss->has_seen ? 2 : 1;
		puts += (ss->n + ss->n_del) * per + (j == 0 ? ss->n_del : 0); /* a user's rated list goes too */
		add += (ss->n * (vbytes + 16) + keys) + (ss->has_seen ? ss->n * (4 + 16) + keys : 0);
	}
	if (m->rated.on) {
		puts += m->rated.n;
		add += m->rated.val_n + m->rated.n * (4 + 16) + rows_key_bytes(m->rated.r, m->rated.n);
	}
	const double tr = mfs_now_s();
	rc = reserve(w, puts, add, errstr, errstr_size);
	w->sw_phase[MFS_SNAP_PH_RESERVE] += mfs_now_s() - tr;
	if (rc)
		return rc;
	uint64_t s = 0, n_users = 0, n_items = 0;
	for (int attempt = 0;; attempt++) {
		MDB_txn *txn;
		rc = mdb_txn_begin(w->sw_env, NULL, 0, &txn);
		if (rc == MDB_MAP_RESIZED && attempt < 8) {
			/* another writer process grew the map: adopt its size */
			if ((rc = mdb_env_set_mapsize(w->sw_env, 0)))
				return lmdb_fail(w, rc, "env_set_mapsize", errstr, errstr_size);
			continue;
		}
		if (rc)
			return lmdb_fail(w, rc, "txn_begin", errstr, errstr_size);
		rc = publish_txn(w, txn, m, info, &s, &n_users, &n_items, errstr, errstr_size);
		if (rc == 0 && (rc = mfs_fault("snapshot.commit")))
			mdb_txn_abort(txn);
		else if (rc == 0) {
			const double tc = mfs_now_s();
			rc = mdb_txn_commit(txn); /* the publish point */
			w->sw_phase[MFS_SNAP_PH_COMMIT] += mfs_now_s() - tc;
		}
		else
			mdb_txn_abort(txn);
		if (rc == 0)
			break;
		if (rc != MDB_MAP_FULL) {
			if (rc >= MFS_E_FIRST && rc <= MFS_E_LAST)
				return rc; /* errstr already says why */
			return lmdb_fail(w, rc, "publish", errstr, errstr_size);
		}
		MDB_envinfo ei;
		mdb_env_info(w->sw_env, &ei);
		size_t grown = (size_t)ei.me_mapsize * 2;
		if (grown > SNAP_MAP_MAX || attempt >= 40)
			return mfs_errf(errstr, errstr_size, MFS_ELMDB, "LMDB map full at %zu bytes on %s; not growing further",
			                (size_t)ei.me_mapsize, w->sw_dir);
		if ((rc = mfs_fault("snapshot.grow")) || (rc = mdb_env_set_mapsize(w->sw_env, grown)))
			return lmdb_fail(w, rc, "env_set_mapsize", errstr, errstr_size);
		mfs_info("snap", "msg=\"map full, doubled\" map_size=%zu", grown);
		if ((rc = reserve(w, puts, add, errstr, errstr_size)))
			return rc;
	}
	if (seq)
		*seq = s;
	mfs_debug("snap", "msg=\"published\" seq=%llu users_written=%zu items_written=%zu n_users=%llu "
	                  "n_items=%llu ms=%.3f",
	          (unsigned long long)s, nu, ni, (unsigned long long)n_users, (unsigned long long)n_items,
	          (mfs_now_s() - t0) * 1e3);
	return 0;
}
