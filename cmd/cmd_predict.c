/* cmd_predict.c - `mfstream predict`: score "user item" pairs from a file against a snapshot.
 *
 *   mfstream predict --snapshot DIR --pairs FILE     (FILE "-" = stdin)
 *
 * Each input line is "user item": two ids separated by spaces, tabs or commas (a trailing
 * CR is ignored). Output is one predicted rating per input line, in input order (%.9g:
 * the float round-trips). Unknown ids get the fallback (mu + the known biases, clipped);
 * how many pairs had an unknown user / item is reported on stderr at the end. A line that
 * is not exactly two ids stops the run with its line number (exit 1); the lines before it
 * have been answered. Each pair is its own libmfsnap call, so a snapshot published
 * mid-file is picked up from the next line on.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "snapshots/reader/mfs_snap.h"

static const char predict_usage[] = "usage: mfstream predict --snapshot DIR --pairs FILE|-\n"
                                    "each line: \"user item\" (separated by spaces, tabs or a comma)\n";


static int is_sep(char c) { return c == ' ' || c == '\t' || c == ','; }

/* Split line (NUL-terminated, modified in place) into exactly two tokens. */
static int split_pair(char *line, char **a, char **b)
{
	char *tok[3];
	int n = 0;
	char *p = line;
	while (*p) {
		while (*p && is_sep(*p))
			p++;
		if (!*p)
			break;
		if (n == 3)
			return -1;
		tok[n++] = p;
		while (*p && !is_sep(*p))
			p++;
		if (*p)
			*p++ = '\0';
	}
	if (n != 2)
		return -1;
	*a = tok[0];
	*b = tok[1];
	return 0;
}

int mfs_cmd_predict(int argc, char **argv)
{
	const char *pairs = NULL;
	int ac = argc - 1;
	char **av = argv + 1;
	if (ac == 1 && (strcmp(av[0], "-h") == 0 || strcmp(av[0], "--help") == 0)) {
		fputs(predict_usage, stdout);
		return 0;
	}
	if (mfs_cmd_take_flag(&ac, av, "--pairs", &pairs) < 0) {
		fprintf(stderr, "mfstream predict: --pairs needs a file name\n%s", predict_usage);
		return 2;
	}
	mfs_conf_t conf;
	int n_pos = 0;
	if (mfs_cmd_conf("predict", ac, av, NULL, &conf, NULL, 0, &n_pos))
		return 2;
	int ret = 2;
	mfs_snap_t *s = NULL;
	FILE *in = NULL;
	char *line = NULL;
	size_t cap = 0;
	if (!conf.snapshot_dir || !*conf.snapshot_dir || !pairs || !*pairs) {
		fprintf(stderr, "mfstream predict: needs --snapshot DIR and --pairs FILE\n%s", predict_usage);
		goto out;
	}
	ret = 1;
	char err[1024];
	int rc = mfs_snap_open(conf.snapshot_dir, &s, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream predict: %s\n", err);
		goto out;
	}
	in = strcmp(pairs, "-") == 0 ? stdin : fopen(pairs, "r");
	if (!in) {
		fprintf(stderr, "mfstream predict: %s: %s\n", pairs, strerror(errno));
		goto out;
	}
	static char outbuf[1 << 16];
	setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
	unsigned long long lineno = 0, n = 0, unknown_users = 0, unknown_items = 0;
	ssize_t len;
	while ((len = getline(&line, &cap, in)) >= 0) {
		lineno++;
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		char *ut, *it;
		mfs_snap_id_t u, i;
		if ((size_t)len != strlen(line) || split_pair(line, &ut, &it)) {
			fprintf(stderr, "mfstream predict: %s:%llu: expected \"user item\"\n", pairs, lineno);
			goto out;
		}
		if (mfs_snap_id_parse(ut, &u) || mfs_snap_id_parse(it, &i)) {
			fprintf(stderr, "mfstream predict: %s:%llu: an id is longer than %d bytes\n", pairs, lineno,
			        MFS_SNAP_ID_MAX);
			goto out;
		}
		float r;
		int known = 0;
		if ((rc = mfs_snap_predict(s, &u, &i, &r, &known))) {
			fprintf(stderr, "mfstream predict: %s:%llu: %s\n", pairs, lineno, mfs_snap_strerror(rc));
			goto out;
		}
		unknown_users += !(known & 1);
		unknown_items += !(known & 2);
		n++;
		printf("%.9g\n", (double)r);
	}
	if (ferror(in)) {
		fprintf(stderr, "mfstream predict: reading %s: %s\n", pairs, strerror(errno));
		goto out;
	}
	if (fflush(stdout) != 0) {
		fprintf(stderr, "mfstream predict: writing output: %s\n", strerror(errno));
		goto out;
	}
	fprintf(stderr, "mfstream predict: %llu pairs, %llu with an unknown user, %llu with an unknown item "
	                "(fallback: mu + known biases)\n",
	        n, unknown_users, unknown_items);
	ret = 0;
out:
	fflush(stdout);
	if (in && in != stdin)
		fclose(in);
	free(line);
	mfs_snap_close(s);
	mfs_conf_free(&conf);
	return ret;
}
