/* cmd_gen.c - `mfstream gen`: synthetic ratings from a planted biased-MF model (ingest/synth.c
 * describes the model; docs/INPUT_FORMATS.md the flags). Ratings stream to the writer; memory
 * depends on users and items only. A test RMSE close to gen.noise means a trainer has
 * recovered the planted structure.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "common/timeutil.h"
#include "ingest/ratings_file.h"
#include "ingest/synth.h"
#include "model_store/store.h"

static const mfs_conf_alias_t gen_aliases[] = {
	{"--n", "gen.ratings"},       {"--ratings", "gen.ratings"}, {"--users", "gen.users"},
	{"--items", "gen.items"},     {"--rank", "gen.rank"},       {"--noise", "gen.noise"},
	{"--zipf", "gen.zipf"},       {"--seed", "gen.seed"},       {"--output", "gen.output"},
	{"--user-skew", "gen.user_skew"}, {"--mean", "gen.mean"},   {"--min", "gen.min"},
	{"--max", "gen.max"},         {NULL, NULL},
};

static void gen_usage(FILE *f)
{
	fprintf(f,
	        "usage: mfstream gen [--n N] [--users U] [--items I] [--rank R] [--noise SD]\n"
	        "                    [--zipf S] [--user-skew A] [--seed S] [--output FILE] [--gen.KEY V ...]\n"
	        "Writes N ratings of a planted biased-MF model (docs/INPUT_FORMATS.md).\n"
	        "FILE: - (stdout, tsv), *.tsv, *.csv, *.bin, optionally + .gz or .zst.\n");
}

int mfs_cmd_gen(int argc, char **argv)
{
	for (int k = 1; k < argc; k++)
		if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0) {
			gen_usage(stdout);
			return 0;
		}
	mfs_conf_t c;
	char *pos[1];
	int n_pos = 0;
	if (mfs_cmd_conf("gen", argc - 1, argv + 1, gen_aliases, &c, pos, 1, &n_pos))
		return 2;
	int ret = 2;
	if (n_pos) {
		fprintf(stderr, "mfstream gen: unexpected argument '%s'\n", pos[0]);
		gen_usage(stderr);
		goto done;
	}
	if (c.gen_min > c.gen_max) {
		fprintf(stderr, "mfstream gen: gen.min (%g) is above gen.max (%g)\n", c.gen_min, c.gen_max);
		goto done;
	}
	ret = 1;
	const uint64_t I = (uint64_t)c.gen_items;
	const char *out_path = c.gen_output && *c.gen_output ? c.gen_output : "-";
	double t0 = mfs_now_s();
	mfs_synth_t *syn = NULL;
	mfs_rfile_writer_t *w = NULL;
	uint8_t *tu = NULL, *ti = calloc((I + 7) / 8, 1);
	char err[512];
	int rc;
	if ((rc = mfs_synth_open(&c, &syn, err, sizeof err))) {
		fprintf(stderr, "mfstream gen: %s\n", err);
		goto done_free;
	}
	const uint64_t ubase = mfs_synth_user_base(syn);
	if (!ti || !(tu = calloc((mfs_synth_user_span(syn) + 7) / 8, 1))) {
		fprintf(stderr, "mfstream gen: out of memory\n");
		goto done_free;
	}
	if ((rc = mfs_rfile_writer_open(out_path, MFS_RFMT_AUTO, &w, err, sizeof err))) {
		fprintf(stderr, "mfstream gen: %s\n", err);
		goto done_free;
	}
	uint64_t users_touched = 0, items_touched = 0, u, i;
	float x;
	int64_t ts;
	while (mfs_synth_next(syn, &u, &i, &x, &ts)) {
		const uint64_t ub = u - ubase;
		users_touched += !(tu[ub >> 3] & (1u << (ub & 7)));
		tu[ub >> 3] |= (uint8_t)(1u << (ub & 7));
		items_touched += !(ti[i >> 3] & (1u << (i & 7)));
		ti[i >> 3] |= (uint8_t)(1u << (i & 7));
		mfs_id_t uid = mfs_id_u64(u + 1), iid = mfs_id_u64(i + 1);
		if ((rc = mfs_rfile_write(w, &uid, &iid, x, ts))) {
			fprintf(stderr, "mfstream gen: writing %s: %s\n", out_path, mfs_strerror(rc));
			goto done_free;
		}
	}
	rc = mfs_rfile_writer_close(w);
	w = NULL;
	if (rc) {
		fprintf(stderr, "mfstream gen: writing %s: %s\n", out_path, mfs_strerror(rc));
		goto done_free;
	}
	const uint64_t N = mfs_synth_count(syn);
	double dt = mfs_now_s() - t0;
	fprintf(stderr,
	        "mfstream gen: ratings=%" PRIu64 " users_touched=%" PRIu64 " items_touched=%" PRIu64
	        " seconds=%.3f ratings_per_s=%.0f output=%s\n",
	        N, users_touched, items_touched, dt, dt > 0 ? (double)N / dt : 0.0, out_path);
	ret = 0;
done_free:
	mfs_rfile_writer_close(w);
	mfs_synth_close(syn);
	free(tu);
	free(ti);
done:
	mfs_conf_free(&c);
	return ret;
}
