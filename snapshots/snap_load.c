/* snap_load.c - see snap_load.h. */
#include "snapshots/snap_load.h"

#include <errno.h>
#include <math.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/grow.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_size.h"

static int meta_get(MDB_txn *txn, MDB_dbi d, const char *key, size_t size, const unsigned char **val, int *found)
{
	MDB_val k = {strlen(key), (void *)(uintptr_t)key}, v;
	int rc = mdb_get(txn, d, &k, &v);
	*found = 0;
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return rc;
	if (v.mv_size != size)
		return MFS_EFORMAT;
	*val = v.mv_data;
	*found = 1;
	return 0;
}

static int load_rows(MDB_txn *txn, MDB_dbi d, mfs_model_t *m, int ent, char *errstr, size_t es)
{
	MDB_cursor *cur;
	MDB_val k, v;
	int rc = mdb_cursor_open(txn, d, &cur);
	if (rc)
		return mfs_errf(errstr, es, MFS_ELMDB, "cursor: %s", mdb_strerror(rc));
	const size_t vbytes = mfs_snap_row_bytes((uint32_t)m->k);
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		uint64_t num = 0;
		const char *str = NULL;
		size_t len = 0;
		int tag = mfs_snap_key_decode(k.mv_data, k.mv_size, &num, &str, &len);
		if (!tag || v.mv_size != vbytes) {
			rc = mfs_errf(errstr, es, MFS_EFORMAT, "malformed %s record (key %zu bytes, value %zu bytes)",
			              ent ? "item" : "user", k.mv_size, v.mv_size);
			goto out;
		}
		mfs_id_t id = tag == MFS_SNAP_KEY_TAG_U64 ? mfs_id_u64(num)
		                                          : (mfs_id_t){MFS_ID_STR, (uint16_t)len, 0, str};
		uint32_t row;
		rc = mfs_model_restore_row(m, ent, &id, &row);
		if (rc) {
			rc = mfs_errf(errstr, es, rc, "adding a %s row: %s", ent ? "item" : "user", mfs_strerror(rc));
			goto out;
		}
		const unsigned char *p = v.mv_data;
		float *F = (ent ? m->Q : m->P) + (size_t)row * (size_t)m->k;
		(ent ? m->bi : m->bu)[row] = mfs_snap_get_f32(p);
		for (int j = 0; j < m->k; j++)
			F[j] = mfs_snap_get_f32(p + 4 + 4 * (size_t)j);
	}
	if (rc == MDB_NOTFOUND)
		rc = 0;
	else if (rc > 0 || rc < MFS_E_FIRST || rc > MFS_E_LAST)
		rc = mfs_errf(errstr, es, MFS_ELMDB, "cursor: %s", mdb_strerror(rc));
out:
	mdb_cursor_close(cur);
	return rc;
}

/* The last-seen times of a model that tracks them (model_store/life.h): from the writer's
 * user_seen / item_seen, where the snapshot has them; a row without one counts as seen at the
 * latest time the snapshot knows (never expired by a restart). The model's clock resumes there. */
static int load_seen(MDB_txn *txn, mfs_model_t *m, char *errstr, size_t es)
{
	uint32_t latest = 0;
	for (int ent = 0; ent < 2; ent++) {
		const uint32_t n = ent ? m->n_items : m->n_users;
		memset(m->seen[ent], 0, (size_t)n * sizeof *m->seen[ent]);
		MDB_dbi d;
		int rc = mdb_dbi_open(txn, ent ? MFS_SNAP_DB_ITEM_SEEN : MFS_SNAP_DB_USER_SEEN, 0, &d);
		if (rc == MDB_NOTFOUND)
			continue;
		if (rc)
			return mfs_errf(errstr, es, MFS_ELMDB, "last-seen times: %s", mdb_strerror(rc));
		MDB_cursor *cur;
		MDB_val k, v;
		if ((rc = mdb_cursor_open(txn, d, &cur)))
			return mfs_errf(errstr, es, MFS_ELMDB, "cursor: %s", mdb_strerror(rc));
		for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
			uint64_t num = 0;
			const char *str = NULL;
			size_t len = 0;
			const int tag = mfs_snap_key_decode(k.mv_data, k.mv_size, &num, &str, &len);
			if (!tag || v.mv_size != 4)
				continue; /* not ours to judge: the rows were checked */
			mfs_id_t id = tag == MFS_SNAP_KEY_TAG_U64 ? mfs_id_u64(num) : (mfs_id_t){MFS_ID_STR, (uint16_t)len, 0, str};
			const uint32_t row = mfs_idmap_find(ent ? m->items : m->users, &id);
			const uint32_t t = mfs_snap_get_u32(v.mv_data);
			if (row != MFS_ROW_NONE)
				m->seen[ent][row] = t;
			if (t > latest)
				latest = t;
		}
		mdb_cursor_close(cur);
	}
	for (int ent = 0; ent < 2; ent++)
		for (uint32_t r = 0, n = ent ? m->n_items : m->n_users; r < n; r++)
			if (!m->seen[ent][r])
				m->seen[ent][r] = latest;
	if (latest > m->clock_s)
		m->clock_s = latest;
	return 0;
}

static int load_meta(MDB_txn *txn, MDB_dbi d, mfs_snap_loaded_t *out, char *errstr, size_t es)
{
	MDB_cursor *cur;
	MDB_val k, v;
	int rc = mdb_cursor_open(txn, d, &cur);
	if (rc)
		return mfs_errf(errstr, es, MFS_ELMDB, "cursor: %s", mdb_strerror(rc));
	const size_t op = sizeof MFS_META_OFFSET_PREFIX - 1;
	size_t cap_extra = 0;
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		const char *key = k.mv_data;
		size_t kl = k.mv_size;
		if (kl > op && memcmp(key, MFS_META_OFFSET_PREFIX, op) == 0) {
			/* "offset/<topic>/<partition>": the topic has no '/', so split at the last one */
			const char *slash = NULL;
			for (size_t j = kl; j > op; j--)
				if (key[j - 1] == '/') {
					slash = key + j - 1;
					break;
				}
			if (!slash || v.mv_size != 8 || slash == key + op) {
				rc = mfs_errf(errstr, es, MFS_EFORMAT, "malformed offset record %.*s", (int)kl, key);
				goto out;
			}
			char part[16];
			size_t pl = (size_t)(key + kl - slash - 1);
			if (pl == 0 || pl >= sizeof part) {
				rc = mfs_errf(errstr, es, MFS_EFORMAT, "malformed offset record %.*s", (int)kl, key);
				goto out;
			}
			memcpy(part, slash + 1, pl);
			part[pl] = '\0';
			mfs_offset_t *no = realloc(out->offsets, (out->n_offsets + 1) * sizeof *no);
			if (!no) {
				rc = ENOMEM;
				goto out;
			}
			out->offsets = no;
			mfs_offset_t *o = &no[out->n_offsets];
			size_t tl = (size_t)(slash - key - (ptrdiff_t)op);
			if (!(o->topic = strndup(key + op, tl))) {
				rc = ENOMEM;
				goto out;
			}
			o->partition = (int32_t)atoi(part);
			o->next = (int64_t)mfs_snap_get_u64(v.mv_data);
			out->n_offsets++;
		} else if (mfs_snap_meta_type_core(key, kl) == MFS_SNAP_T_UNKNOWN && v.mv_size == 8) {
			/* a writer's extra record: handed back as written, for the writer to read */
			if (mfs_grow((void **)&out->extra, &cap_extra, out->n_extra + 1, sizeof *out->extra)) {
				rc = ENOMEM;
				goto out;
			}
			mfs_snap_extra_t *x = &out->extra[out->n_extra];
			int t = mfs_snap_meta_type_optional(key, kl);
			*x = (mfs_snap_extra_t){NULL, t == MFS_SNAP_T_F64 ? MFS_SNAP_T_F64 : MFS_SNAP_T_U64, 0, 0};
			if (x->type == MFS_SNAP_T_F64)
				x->f64 = mfs_snap_get_f64(v.mv_data);
			else
				x->u64 = mfs_snap_get_u64(v.mv_data);
			if (!(x->key = strndup(key, kl))) {
				rc = ENOMEM;
				goto out;
			}
			out->n_extra++;
		}
	}
	rc = rc == MDB_NOTFOUND ? 0 : mfs_errf(errstr, es, MFS_ELMDB, "cursor: %s", mdb_strerror(rc));
out:
	mdb_cursor_close(cur);
	return rc;
}

int mfs_snap_load(const char *dir, mfs_model_t *m, mfs_snap_loaded_t *out, char *errstr, size_t es)
{
	memset(out, 0, sizeof *out);
	out->learning_rate = NAN;
	char path[4096];
	struct stat st;
	snprintf(path, sizeof path, "%s/data.mdb", dir);
	if (stat(path, &st) != 0)
		return mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s", dir);
	if (m->n_users || m->n_items)
		return mfs_errf(errstr, es, MFS_EINVAL, "mfs_snap_load: the model is not empty");
	int rc;
	if ((rc = mfs_snap_check_size(dir, errstr, es))) /* a truncated file: an error, not a SIGBUS */
		return rc;
	MDB_env *env = NULL;
	MDB_txn *txn = NULL;
	MDB_dbi dm, du, di;
	if ((rc = mdb_env_create(&env)) || (rc = mdb_env_set_maxdbs(env, MFS_SNAP_MAX_DBS)) ||
	    (rc = mdb_env_set_maxreaders(env, MFS_SNAP_MAX_READERS)) ||
	    (rc = mdb_env_open(env, dir, MDB_RDONLY, 0644)) || (rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn))) {
		rc = mfs_errf(errstr, es, MFS_ELMDB, "opening %s: %s", dir, mdb_strerror(rc));
		goto out;
	}
	if ((rc = mdb_dbi_open(txn, MFS_SNAP_DB_META, 0, &dm))) {
		rc = rc == MDB_NOTFOUND ? mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s", dir)
		                        : mfs_errf(errstr, es, MFS_ELMDB, "meta: %s", mdb_strerror(rc));
		goto out;
	}
	const unsigned char *val;
	int found;
	if ((rc = meta_get(txn, dm, MFS_META_SEQ, 8, &val, &found)) || !found) {
		rc = rc ? mfs_errf(errstr, es, MFS_EFORMAT, "malformed seq") :
		          mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s", dir);
		goto out;
	}
	out->seq = mfs_snap_get_u64(val);
	if ((rc = meta_get(txn, dm, MFS_META_VERSION, 4, &val, &found)) || !found ||
	    mfs_snap_get_u32(val) != MFS_SNAP_VERSION) {
		rc = mfs_errf(errstr, es, MFS_EVERSION, "%s: format version is not %u", dir, MFS_SNAP_VERSION);
		goto out;
	}
	if ((rc = meta_get(txn, dm, MFS_META_K, 4, &val, &found)) || !found || mfs_snap_get_u32(val) != (uint32_t)m->k) {
		rc = mfs_errf(errstr, es, MFS_EINVAL, "%s holds k = %u, the model has k = %d", dir,
		              found && !rc ? mfs_snap_get_u32(val) : 0, m->k);
		goto out;
	}
	if ((rc = mdb_dbi_open(txn, MFS_SNAP_DB_USERS, 0, &du)) || (rc = mdb_dbi_open(txn, MFS_SNAP_DB_ITEMS, 0, &di))) {
		rc = mfs_errf(errstr, es, MFS_ELMDB, "users/items: %s", mdb_strerror(rc));
		goto out;
	}
	if ((rc = load_rows(txn, du, m, 0, errstr, es)) || (rc = load_rows(txn, di, m, 1, errstr, es)) ||
	    (m->track && (rc = load_seen(txn, m, errstr, es))) || (rc = load_meta(txn, dm, out, errstr, es)))
		goto out;
	out->n_users = m->n_users;
	out->n_items = m->n_items;
	if (!meta_get(txn, dm, MFS_META_MU, 8, &val, &found) && found)
		m->mu = mfs_snap_get_f64(val);
	if (!meta_get(txn, dm, MFS_META_EVENTS, 8, &val, &found) && found)
		m->events_applied = mfs_snap_get_u64(val);
	if (!meta_get(txn, dm, MFS_META_MU_COUNT, 8, &val, &found) && found)
		m->mu_count = mfs_snap_get_u64(val);
	if (!meta_get(txn, dm, MFS_META_MU_SUM, 8, &val, &found) && found)
		m->mu_sum = mfs_snap_get_f64(val);
	if (!meta_get(txn, dm, MFS_META_LR, 8, &val, &found) && found)
		out->learning_rate = mfs_snap_get_f64(val);
	rc = 0;
out:
	if (txn)
		mdb_txn_abort(txn);
	if (env)
		mdb_env_close(env);
	if (rc)
		mfs_snap_loaded_free(out);
	return rc;
}

void mfs_snap_loaded_free(mfs_snap_loaded_t *l)
{
	for (size_t i = 0; i < l->n_offsets; i++)
		free((void *)(uintptr_t)l->offsets[i].topic);
	free(l->offsets);
	for (size_t i = 0; i < l->n_extra; i++)
		free((void *)(uintptr_t)l->extra[i].key);
	free(l->extra);
	l->offsets = NULL;
	l->n_offsets = 0;
	l->extra = NULL;
	l->n_extra = 0;
}

const mfs_snap_extra_t *mfs_snap_loaded_extra(const mfs_snap_loaded_t *l, const char *key)
{
	for (size_t i = 0; i < l->n_extra; i++)
		if (strcmp(l->extra[i].key, key) == 0)
			return &l->extra[i];
	return NULL;
}
