/* rated_help.h - read a user's user_rated list (docs/SNAPSHOT_FORMAT.md) straight from LMDB in
 * tests, as text: the item ids joined by ',', oldest first; "-" when the user has no record, "?"
 * when the environment or the database cannot be opened. Include after testhelp.h. Opens its
 * own MDB_env: never while libmfsnap holds the same directory open in this process. */
#ifndef MFS_TEST_RATED_HELP_H
#define MFS_TEST_RATED_HELP_H

#include <lmdb.h>
#include <stdio.h>

#include "snapshots/snap_format.h"

/* The user_rated list of encoded user key (ukey, ulen) in dir as text ids joined by ',' into
 * out ("-" when there is no record). */
static inline const char *list_of(const char *dir, const unsigned char *ukey, size_t ulen, char *out, size_t cap)
{
	MDB_env *env = NULL;
	MDB_txn *t = NULL;
	MDB_dbi d;
	MDB_val k = {ulen, (void *)ukey}, v;
	snprintf(out, cap, "?");
	TEST_OK(mdb_env_create(&env));
	mdb_env_set_maxdbs(env, MFS_SNAP_MAX_DBS);
	mdb_env_set_maxreaders(env, MFS_SNAP_MAX_READERS);
	if (mdb_env_open(env, dir, MDB_RDONLY, 0644) || mdb_txn_begin(env, NULL, MDB_RDONLY, &t) ||
	    mdb_dbi_open(t, MFS_SNAP_DB_USER_RATED, 0, &d))
		goto out;
	if (mdb_get(t, d, &k, &v)) {
		snprintf(out, cap, "-");
		goto out;
	}
	long n = mfs_snap_rated_check(v.mv_data, v.mv_size);
	TEST_ASSERT_MSG(n >= 0, "a well-formed record (%zu bytes)", v.mv_size);
	size_t pos = 4, o = 0;
	out[0] = '\0';
	for (long j = 0; j < n && o + 300 < cap; j++) {
		const unsigned char *key;
		size_t len;
		uint64_t num;
		const char *s;
		size_t sl;
		mfs_snap_rated_next(v.mv_data, &pos, &key, &len);
		int kind = mfs_snap_key_decode(key, len, &num, &s, &sl);
		if (kind == MFS_SNAP_KEY_TAG_U64)
			o += (size_t)snprintf(out + o, cap - o, "%s%llu", j ? "," : "", (unsigned long long)num);
		else
			o += (size_t)snprintf(out + o, cap - o, "%s%.*s", j ? "," : "", (int)sl, s);
	}
out:
	if (t)
		mdb_txn_abort(t);
	mdb_env_close(env);
	return out;
}

static inline const char *list_u64(const char *dir, uint64_t user, char *out, size_t cap)
{
	unsigned char key[9];
	mfs_snap_key_u64(key, user);
	return list_of(dir, key, 9, out, cap);
}

#endif
