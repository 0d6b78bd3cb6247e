/* cmd_inspect.c - `mfstream inspect`: print a snapshot's meta record, offsets included.
 *
 *   mfstream inspect --snapshot DIR [--json]
 *
 * Text: one "key = value" line per meta record - the fixed keys in the order of
 * docs/SNAPSHOT_FORMAT.md, then "offset/<topic>/<partition> = <next offset>" lines, then any
 * key this build does not know (value in hex). --json: one object with the same keys
 * (last_loss NaN is null). All of it is read in one transaction through libmfsnap, so the
 * offsets printed are those of the rows of the same snapshot.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"

static const char inspect_usage[] = "usage: mfstream inspect --snapshot DIR [--json]\n";

/* the documented order of the fixed keys */
static const char *const inspect_order[] = {
	MFS_META_VERSION, MFS_META_K,      MFS_META_DTYPE, MFS_META_MU,   MFS_META_N_USERS,
	MFS_META_N_ITEMS, MFS_META_SEQ,    MFS_META_WALL_MS, MFS_META_EVENTS, MFS_META_LR,
	MFS_META_LOSS,    MFS_META_RMIN,   MFS_META_RMAX,
};

struct meta_rec {
	char *key;
	unsigned char *val;
	size_t val_len;
	int type;
	int printed;
};

struct meta_list {
	struct meta_rec *r;
	size_t n, cap;
};

static int collect(void *ctx, const char *key, size_t key_len, const unsigned char *val, size_t val_len)
{
	struct meta_list *l = ctx;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 32;
		struct meta_rec *r = realloc(l->r, cap * sizeof *r);
		if (!r)
			return ENOMEM;
		l->r = r;
		l->cap = cap;
	}
	struct meta_rec *m = &l->r[l->n];
	m->key = malloc(key_len + 1);
	m->val = malloc(val_len ? val_len : 1);
	if (!m->key || !m->val) {
		free(m->key);
		free(m->val);
		return ENOMEM;
	}
	memcpy(m->key, key, key_len);
	m->key[key_len] = '\0';
	memcpy(m->val, val, val_len);
	m->val_len = val_len;
	m->type = mfs_snap_meta_type(key, key_len);
	m->printed = 0;
	l->n++;
	return 0;
}

/* A value in text form; JSON gets null for non-finite doubles and quotes for text. */
static void print_value(const struct meta_rec *m, int json)
{
	static const size_t need[] = {[MFS_SNAP_T_U32] = 4, [MFS_SNAP_T_U64] = 8, [MFS_SNAP_T_I64] = 8,
	                              [MFS_SNAP_T_F64] = 8};
	int t = m->type;
	if ((t == MFS_SNAP_T_U32 || t == MFS_SNAP_T_U64 || t == MFS_SNAP_T_I64 || t == MFS_SNAP_T_F64) &&
	    m->val_len != need[t])
		t = MFS_SNAP_T_UNKNOWN; /* malformed: show the bytes */
	switch (t) {
	case MFS_SNAP_T_U32:
		printf("%lu", (unsigned long)mfs_snap_get_u32(m->val));
		return;
	case MFS_SNAP_T_U64:
		printf("%llu", (unsigned long long)mfs_snap_get_u64(m->val));
		return;
	case MFS_SNAP_T_I64:
		printf("%lld", (long long)(int64_t)mfs_snap_get_u64(m->val));
		return;
	case MFS_SNAP_T_F64: {
		double d = mfs_snap_get_f64(m->val);
		if (json && !isfinite(d))
			printf("null");
		else
			printf("%.17g", d);
		return;
	}
	case MFS_SNAP_T_ASCII: {
		int plain = 1;
		for (size_t i = 0; i < m->val_len; i++)
			plain &= m->val[i] >= 0x20 && m->val[i] < 0x7f && m->val[i] != '"' && m->val[i] != '\\';
		if (plain) {
			printf(json ? "\"%.*s\"" : "%.*s", (int)m->val_len, (const char *)m->val);
			return;
		}
	} /* not printable: show hex */
	/* fall through */
	default:
		printf(json ? "\"" : "0x");
		for (size_t i = 0; i < m->val_len; i++)
			printf("%02x", m->val[i]);
		if (json)
			printf("\"");
		return;
	}
}

static void print_rec(struct meta_rec *m, int json, int *first)
{
	if (json) {
		printf("%s\n  \"", *first ? "{" : ",");
		for (const unsigned char *k = (const unsigned char *)m->key; *k; k++)
			printf(*k == '"' || *k == '\\' ? "\\%c" : *k < 0x20 ? "\\u%04x" : "%c", *k);
		printf("\": ");
	} else {
		printf("%s = ", m->key);
	}
	print_value(m, json);
	if (!json)
		printf("\n");
	m->printed = 1;
	*first = 0;
}

int mfs_cmd_inspect(int argc, char **argv)
{
	int ac = argc - 1;
	char **av = argv + 1;
	int json = 0;
	for (int i = 0; i < ac;) {
		if (strcmp(av[i], "-h") == 0 || strcmp(av[i], "--help") == 0) {
			fputs(inspect_usage, stdout);
			return 0;
		}
		if (strcmp(av[i], "--json") == 0) {
			json = 1;
			memmove(&av[i], &av[i + 1], (size_t)(ac - i - 1) * sizeof *av);
			ac--;
			continue;
		}
		i++;
	}
	mfs_conf_t conf;
	int n_pos = 0;
	if (mfs_cmd_conf("inspect", ac, av, NULL, &conf, NULL, 0, &n_pos))
		return 2;
	int ret = 2;
	mfs_snap_t *s = NULL;
	struct meta_list l = {NULL, 0, 0};
	if (!conf.snapshot_dir || !*conf.snapshot_dir) {
		fprintf(stderr, "mfstream inspect: no snapshot directory (--snapshot DIR)\n%s", inspect_usage);
		goto out;
	}
	ret = 1;
	char err[1024];
	int rc = mfs_snap_open(conf.snapshot_dir, &s, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream inspect: %s\n", err);
		goto out;
	}
	if ((rc = mfs_snap_meta_each(s, collect, &l))) {
		fprintf(stderr, "mfstream inspect: reading meta: %s\n", mfs_snap_strerror(rc));
		goto out;
	}
	int first = 1;
	for (size_t o = 0; o < sizeof inspect_order / sizeof inspect_order[0]; o++)
		for (size_t i = 0; i < l.n; i++)
			if (!l.r[i].printed && strcmp(l.r[i].key, inspect_order[o]) == 0)
				print_rec(&l.r[i], json, &first);
	for (size_t i = 0; i < l.n; i++) /* offsets, in key order */
		if (!l.r[i].printed && l.r[i].type == MFS_SNAP_T_I64)
			print_rec(&l.r[i], json, &first);
	for (size_t i = 0; i < l.n; i++) /* whatever a newer writer added */
		if (!l.r[i].printed)
			print_rec(&l.r[i], json, &first);
	if (json)
		printf(first ? "{}\n" : "\n}\n");
	if (fflush(stdout) != 0) {
		fprintf(stderr, "mfstream inspect: writing output: %s\n", strerror(errno));
		goto out;
	}
	ret = 0;
out:
	for (size_t i = 0; i < l.n; i++) {
		free(l.r[i].key);
		free(l.r[i].val);
	}
	free(l.r);
	mfs_snap_close(s);
	mfs_conf_free(&conf);
	return ret;
}
