/* cmd_query.c - `mfstream query`: a vector, a prediction or the top-K items from a snapshot.
 *
 *   mfstream query --snapshot DIR --user ID              bias and factors of a user
 *   mfstream query --snapshot DIR --item ID              bias and factors of an item
 *   mfstream query --snapshot DIR --user ID --item ID    predicted rating (clipped; fallback
 *                                                        mu + known biases for unknown ids)
 *   mfstream query --snapshot DIR --user ID --top K      K lines "item score", best first,
 *                                                        leaving out the items the user rated
 *                                                        (the snapshot's user_rated list)
 *                  [--exclude ID,ID,...]                 ... nor those items
 *                  [--include-seen]                      ... listing the rated items too
 *   --json prints the same as one JSON value.
 *
 * Reads through libmfsnap only (the serving API), like any other client would: top-K is
 * mfs_snap_topk_ex's default path (the int8 scan with exact rescoring; docs/READER.md).
 * An --exclude list is split at commas, so a string id holding a comma cannot be named
 * there. --user, --item, --top, --exclude, --include-seen and --json are not configuration keys: they are taken out of argv before
 * the rest goes to the configuration chain (which gives --snapshot / snapshot.dir).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"

#define QUERY_TOP_MAX 1000

static const char query_usage[] =
	"usage: mfstream query --snapshot DIR --user ID [--item ID | --top K [--exclude ID,ID,...] [--include-seen]]\n"
	"                      [--json]\n"
	"       mfstream query --snapshot DIR --item ID [--json]\n"
	"ids: a canonical decimal is a u64 id; anything else (or \"str:...\") is a string id\n"
	"--top leaves out the items the snapshot lists as rated by the user; --include-seen keeps them\n";



/* JSON string with the escapes JSON requires; other bytes (UTF-8) go through as they are. */
static void json_str(FILE *f, const char *s, size_t len)
{
	fputc('"', f);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* The text form of an id (the inverse of mfs_snap_id_parse). */
static const char *id_text(int kind, uint64_t num, const char *str, size_t len, char *buf, size_t size)
{
	if (kind == MFS_SNAP_ID_U64)
		snprintf(buf, size, "%llu", (unsigned long long)num);
	else
		snprintf(buf, size, "%s%.*s", mfs_snap_str_needs_prefix(str, len) ? "str:" : "", (int)len, str);
	return buf;
}

static int print_vector(mfs_snap_t *s, const char *what, const char *text, const mfs_snap_id_t *id, int json)
{
	mfs_snap_meta_t meta;
	int rc = mfs_snap_get_meta(s, &meta);
	if (rc) {
		fprintf(stderr, "mfstream query: %s\n", mfs_snap_strerror(rc));
		return 1;
	}
	float bias, *vec = malloc((size_t)meta.k * sizeof *vec);
	if (!vec) {
		fprintf(stderr, "mfstream query: out of memory\n");
		return 1;
	}
	/* a snapshot published between the two calls has the same k (the writer refuses a
	 * k change), so vec is large enough */
	rc = *what == 'u' ? mfs_snap_user(s, id, &bias, vec) : mfs_snap_item(s, id, &bias, vec);
	if (rc) {
		if (rc == MFS_ENOTFOUND)
			fprintf(stderr, "mfstream query: %s %s is not in the snapshot\n", what, text);
		else
			fprintf(stderr, "mfstream query: %s %s: %s\n", what, text, mfs_snap_strerror(rc));
		free(vec);
		return 1;
	}
	char buf[MFS_SNAP_ID_MAX + 8];
	const char *t = id_text(id->kind, id->num, id->str, id->len, buf, sizeof buf);
	if (json) {
		printf("{\"%s\": ", what);
		json_str(stdout, t, strlen(t));
		printf(", \"bias\": %.9g, \"factors\": [", (double)bias);
		for (uint32_t j = 0; j < meta.k; j++)
			printf("%s%.9g", j ? ", " : "", (double)vec[j]);
		printf("]}\n");
	} else {
		printf("%s = %s\nbias = %.9g\nfactors =", what, t, (double)bias);
		for (uint32_t j = 0; j < meta.k; j++)
			printf(" %.9g", (double)vec[j]);
		printf("\n");
	}
	free(vec);
	return 0;
}

static int print_predict(mfs_snap_t *s, const char *utext, const mfs_snap_id_t *u, const char *itext,
                         const mfs_snap_id_t *i, int json)
{
	float r;
	int known = 0;
	int rc = mfs_snap_predict(s, u, i, &r, &known);
	if (rc) {
		fprintf(stderr, "mfstream query: predict: %s\n", mfs_snap_strerror(rc));
		return 1;
	}
	if (!(known & 1))
		fprintf(stderr, "mfstream query: user %s is not in the snapshot; fallback used\n", utext);
	if (!(known & 2))
		fprintf(stderr, "mfstream query: item %s is not in the snapshot; fallback used\n", itext);
	if (json) {
		char bu[MFS_SNAP_ID_MAX + 8], bi[MFS_SNAP_ID_MAX + 8];
		id_text(u->kind, u->num, u->str, u->len, bu, sizeof bu);
		id_text(i->kind, i->num, i->str, i->len, bi, sizeof bi);
		printf("{\"user\": ");
		json_str(stdout, bu, strlen(bu));
		printf(", \"item\": ");
		json_str(stdout, bi, strlen(bi));
		printf(", \"prediction\": %.9g, \"known_user\": %s, \"known_item\": %s}\n", (double)r,
		       known & 1 ? "true" : "false", known & 2 ? "true" : "false");
	} else {
		printf("%.9g\n", (double)r);
	}
	return 0;
}

/* Split "a,b,c" (in place) into ids; empty items are skipped. @return count, or -1 (bad id). */
static long parse_exclude(char *list, mfs_snap_id_t *ids, size_t cap)
{
	size_t n = 0;
	for (char *tok = list, *next; tok; tok = next) {
		next = strchr(tok, ',');
		if (next)
			*next++ = '\0';
		if (!*tok)
			continue;
		if (n >= cap || mfs_snap_id_parse(tok, &ids[n])) {
			fprintf(stderr, "mfstream query: bad id \"%s\" in --exclude (1..256 bytes)\n", tok);
			return -1;
		}
		n++;
	}
	return (long)n;
}

static int print_top(mfs_snap_t *s, const char *utext, const mfs_snap_id_t *u, size_t k, const mfs_snap_id_t *ex,
                     size_t n_ex, int include_seen, int json)
{
	mfs_snap_hit_t *hits = malloc(k * sizeof *hits);
	size_t n = 0;
	if (!hits) {
		fprintf(stderr, "mfstream query: out of memory\n");
		return 1;
	}
	mfs_snap_topk_opts_t opts = {ex, n_ex, include_seen ? MFS_SNAP_TOPK_INCLUDE_SEEN : 0u};
	int rc = mfs_snap_topk_ex(s, u, k, &opts, hits, &n, NULL);
	if (rc) {
		if (rc == MFS_ENOTFOUND)
			fprintf(stderr, "mfstream query: user %s is not in the snapshot\n", utext);
		else
			fprintf(stderr, "mfstream query: top-K: %s\n", mfs_snap_strerror(rc));
		free(hits);
		return 1;
	}
	char buf[MFS_SNAP_ID_MAX + 8];
	if (json)
		printf("[");
	for (size_t h = 0; h < n; h++) {
		const char *t = id_text(hits[h].kind, hits[h].num, hits[h].str, hits[h].len, buf, sizeof buf);
		if (json) {
			printf("%s{\"item\": ", h ? ", " : "");
			json_str(stdout, t, strlen(t));
			printf(", \"score\": %.9g}", (double)hits[h].score);
		} else {
			printf("%s %.9g\n", t, (double)hits[h].score);
		}
	}
	if (json)
		printf("]\n");
	free(hits);
	return 0;
}

int mfs_cmd_query(int argc, char **argv)
{
	const char *user = NULL, *item = NULL, *top = NULL, *exclude = NULL;
	int ac = argc - 1;
	char **av = argv + 1;
	if ((ac == 1 && (strcmp(av[0], "-h") == 0 || strcmp(av[0], "--help") == 0))) {
		fputs(query_usage, stdout);
		return 0;
	}
	if (mfs_cmd_take_flag(&ac, av, "--user", &user) < 0 || mfs_cmd_take_flag(&ac, av, "--item", &item) < 0 ||
	    mfs_cmd_take_flag(&ac, av, "--top", &top) < 0 || mfs_cmd_take_flag(&ac, av, "--exclude", &exclude) < 0) {
		fprintf(stderr, "mfstream query: a flag is missing its value\n%s", query_usage);
		return 2;
	}
	int json = mfs_cmd_take_bool(&ac, av, "--json");
	int include_seen = mfs_cmd_take_bool(&ac, av, "--include-seen");
	mfs_conf_t conf;
	int n_pos = 0;
	if (mfs_cmd_conf("query", ac, av, NULL, &conf, NULL, 0, &n_pos))
		return 2;
	int ret = 2;
	mfs_snap_t *s = NULL;
	mfs_snap_id_t uid, iid, *ex = NULL;
	char *exbuf = NULL;
	long n_ex = 0;
	unsigned long long k = 0;
	if (!conf.snapshot_dir || !*conf.snapshot_dir) {
		fprintf(stderr, "mfstream query: no snapshot directory (--snapshot DIR)\n%s", query_usage);
		goto out;
	}
	if ((!user && !item) || (top && !user) || (top && item)) {
		fprintf(stderr, "mfstream query: give --user ID [--item ID | --top K], or --item ID\n%s", query_usage);
		goto out;
	}
	if ((exclude || include_seen) && !top) {
		fprintf(stderr, "mfstream query: --%s goes with --top\n%s", exclude ? "exclude" : "include-seen",
		        query_usage);
		goto out;
	}
	if (exclude) {
		/* the ids point into exbuf, which lives until the end */
		size_t cap = 1;
		for (const char *c = exclude; *c; c++)
			cap += *c == ',';
		exbuf = strdup(exclude);
		ex = calloc(cap, sizeof *ex);
		if (!exbuf || !ex) {
			fprintf(stderr, "mfstream query: out of memory\n");
			ret = 1;
			goto out;
		}
		if ((n_ex = parse_exclude(exbuf, ex, cap)) < 0)
			goto out;
	}
	if (user && mfs_snap_id_parse(user, &uid)) {
		fprintf(stderr, "mfstream query: bad user id \"%s\" (1..256 bytes)\n", user);
		goto out;
	}
	if (item && mfs_snap_id_parse(item, &iid)) {
		fprintf(stderr, "mfstream query: bad item id \"%s\" (1..256 bytes)\n", item);
		goto out;
	}
	if (top) {
		char *end;
		errno = 0;
		k = strtoull(top, &end, 10);
		if (errno || *end || end == top || *top == '-' || k < 1 || k > QUERY_TOP_MAX) {
			fprintf(stderr, "mfstream query: --top needs a count in 1..%d, not \"%s\"\n", QUERY_TOP_MAX, top);
			goto out;
		}
	}
	char err[1024];
	int rc = mfs_snap_open(conf.snapshot_dir, &s, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream query: %s\n", err);
		ret = 1;
		goto out;
	}
	if (top)
		ret = print_top(s, user, &uid, (size_t)k, ex, (size_t)n_ex, include_seen, json);
	else if (user && item)
		ret = print_predict(s, user, &uid, item, &iid, json);
	else if (user)
		ret = print_vector(s, "user", user, &uid, json);
	else
		ret = print_vector(s, "item", item, &iid, json);
	if (fflush(stdout) != 0) {
		fprintf(stderr, "mfstream query: writing output: %s\n", strerror(errno));
		ret = 1;
	}
out:
	mfs_snap_close(s);
	free(ex);
	free(exbuf);
	mfs_conf_free(&conf);
	return ret;
}
