/* cmd_gen.c - `mfstream gen`: synthetic ratings from a planted biased-MF model.
 *
 * The planted model (gen.* keys, docs/INPUT_FORMATS.md):
 *   b_u, b_i ~ N(0, bias_sd^2)
 *   p_u, q_i ~ N(0, s^2) per component, s = sqrt(signal_sd / sqrt(rank)), so that
 *              Var(p_u . q_i) = rank * s^4 = signal_sd^2
 *   r(u,i)   = clip(mean + b_u + b_i + p_u . q_i + N(0, noise^2), gen.min, gen.max)
 * written as a float (not rounded to a rating scale). Users are drawn with weight
 * (rank+1)^-user_skew and items with weight (rank+1)^-zipf, where "rank" is a position in
 * a seeded random permutation, so popular items are not ids 1, 2, 3, ...; exponent 0 is
 * uniform. Pairs (u, i) may repeat, each time with fresh noise.
 *
 * How good can a model get? The noise is independent of everything a model can learn, so
 * no predictor beats the Bayes predictor E[r | u, i], whose RMSE is the standard deviation
 * of the clipped noise: exactly gen.noise without clipping, slightly less with it (clipping
 * pulls the tails in). A biased MF of rank >= gen.rank trained on enough data approaches
 * that floor; test RMSE close to gen.noise (e.g. 0.50 at the default noise) means the
 * trainer has recovered the planted structure, and RMSE far above it means it has not.
 *
 * DESIGN: memory is bounded by users and items, never by ratings. Sampling uses Vose alias
 * tables (8 bytes per entry, O(1) per draw, two cache misses); the planted factors take
 * 4 * rank * (users + items) bytes; ratings stream straight to the writer. Every part has
 * its own RNG stream derived from gen.seed, so a run with --n N is a prefix of a run with
 * more ratings and the same other settings. Timestamps are 1_700_000_000_000 ms + n, one
 * millisecond per rating, so they strictly increase.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/timeutil.h"
#include "ingest/ratings_file.h"
#include "model_store/store.h"

#define GEN_T0_MS 1700000000000LL

/* A sampler over [0, n): uniform, or a Vose alias table. */
typedef struct gen_sampler {
	uint64_t n;
	uint32_t *thr;   /* keep index k when a 32-bit coin <= thr[k]; NULL = uniform */
	uint32_t *alias; /* else take alias[k] */
} gen_sampler_t;

static void sampler_free(gen_sampler_t *s)
{
	free(s->thr);
	free(s->alias);
	memset(s, 0, sizeof *s);
}

static inline uint64_t sampler_draw(const gen_sampler_t *s, mfs_rng_t *g)
{
	uint64_t k = mfs_rng_below(g, s->n);
	if (!s->thr)
		return k;
	uint32_t coin = (uint32_t)(mfs_rng_next(g) >> 32);
	return coin <= s->thr[k] ? k : s->alias[k];
}

/* Weights (rank+1)^-expo over a random permutation of [0, n), as an alias table. */
static int sampler_init(gen_sampler_t *s, uint64_t n, double expo, uint64_t seed)
{
	memset(s, 0, sizeof *s);
	s->n = n;
	if (expo == 0)
		return 0;
	int rc = ENOMEM;
	double *q = malloc(n * sizeof *q);
	uint32_t *work = malloc(n * sizeof *work);
	s->thr = malloc(n * sizeof *s->thr);
	s->alias = malloc(n * sizeof *s->alias);
	if (!q || !work || !s->thr || !s->alias)
		goto out;
	/* permutation: work[rank] = index */
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	for (uint64_t k = 0; k < n; k++)
		work[k] = (uint32_t)k;
	for (uint64_t k = n; k > 1; k--) {
		uint64_t j = mfs_rng_below(&g, k);
		uint32_t t = work[k - 1];
		work[k - 1] = work[j];
		work[j] = t;
	}
	double sum = 0;
	for (uint64_t k = 0; k < n; k++) {
		double w = pow((double)(k + 1), -expo);
		q[work[k]] = w;
		sum += w;
	}
	for (uint64_t k = 0; k < n; k++)
		q[k] *= (double)n / sum;
	/* Vose: small entries stack up from the front of work, large ones from the back */
	uint64_t ns = 0, nl = 0;
	for (uint64_t k = 0; k < n; k++) {
		if (q[k] < 1.0)
			work[ns++] = (uint32_t)k;
		else
			work[n - 1 - nl++] = (uint32_t)k;
	}
	while (ns && nl) {
		uint32_t sm = work[--ns], lg = work[n - nl];
		s->thr[sm] = (uint32_t)fmin(q[sm] * 4294967296.0, 4294967295.0);
		s->alias[sm] = lg;
		q[lg] -= 1.0 - q[sm];
		if (q[lg] < 1.0) { /* lg moves from the large stack to the small one */
			nl--;
			work[ns++] = lg;
		}
	}
	/* what is left has probability 1 up to rounding */
	while (ns) {
		uint32_t k = work[--ns];
		s->thr[k] = UINT32_MAX;
		s->alias[k] = k;
	}
	while (nl) {
		uint32_t k = work[n - nl--];
		s->thr[k] = UINT32_MAX;
		s->alias[k] = k;
	}
	rc = 0;
out:
	free(q);
	free(work);
	if (rc)
		sampler_free(s);
	return rc;
}

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
	const uint64_t N = (uint64_t)c.gen_ratings, U = (uint64_t)c.gen_users, I = (uint64_t)c.gen_items;
	const int r = (int)c.gen_rank;
	const uint64_t seed = (uint64_t)c.gen_seed;
	const char *out_path = c.gen_output && *c.gen_output ? c.gen_output : "-";
	double t0 = mfs_now_s();

	gen_sampler_t su = {0}, si = {0};
	float *P = malloc(U * (size_t)r * sizeof *P), *Q = malloc(I * (size_t)r * sizeof *Q);
	float *bu = malloc(U * sizeof *bu), *bi = malloc(I * sizeof *bi);
	uint8_t *tu = calloc((U + 7) / 8, 1), *ti = calloc((I + 7) / 8, 1);
	mfs_rfile_writer_t *w = NULL;
	char err[512];
	int rc;
	if (!P || !Q || !bu || !bi || !tu || !ti || (rc = sampler_init(&su, U, c.gen_user_skew, mfs_mix64(seed, 2))) ||
	    (rc = sampler_init(&si, I, c.gen_zipf, mfs_mix64(seed, 3)))) {
		fprintf(stderr, "mfstream gen: out of memory for %" PRIu64 " users x %" PRIu64 " items at rank %d\n", U,
		        I, r);
		goto done_free;
	}
	/* the planted model: one stream for users, one for items */
	const double fsd = sqrt(c.gen_signal_sd / sqrt((double)r));
	mfs_rng_t g;
	mfs_rng_seed(&g, mfs_mix64(seed, 0));
	for (uint64_t u = 0; u < U; u++) {
		bu[u] = (float)(c.gen_bias_sd * mfs_rng_normal(&g));
		for (int k = 0; k < r; k++)
			P[u * (size_t)r + (size_t)k] = (float)(fsd * mfs_rng_normal(&g));
	}
	mfs_rng_seed(&g, mfs_mix64(seed, 1));
	for (uint64_t i = 0; i < I; i++) {
		bi[i] = (float)(c.gen_bias_sd * mfs_rng_normal(&g));
		for (int k = 0; k < r; k++)
			Q[i * (size_t)r + (size_t)k] = (float)(fsd * mfs_rng_normal(&g));
	}

	if ((rc = mfs_rfile_writer_open(out_path, MFS_RFMT_AUTO, &w, err, sizeof err))) {
		fprintf(stderr, "mfstream gen: %s\n", err);
		goto done_free;
	}
	mfs_rng_seed(&g, mfs_mix64(seed, 4));
	uint64_t users_touched = 0, items_touched = 0;
	for (uint64_t n = 0; n < N; n++) {
		uint64_t u = sampler_draw(&su, &g), i = sampler_draw(&si, &g);
		const float *pu = P + u * (size_t)r, *qi = Q + i * (size_t)r;
		double dot = 0;
		for (int k = 0; k < r; k++)
			dot += (double)pu[k] * (double)qi[k];
		double x = c.gen_mean + bu[u] + bi[i] + dot + c.gen_noise * mfs_rng_normal(&g);
		x = x < c.gen_min ? c.gen_min : x > c.gen_max ? c.gen_max : x;
		users_touched += !(tu[u >> 3] & (1u << (u & 7)));
		tu[u >> 3] |= (uint8_t)(1u << (u & 7));
		items_touched += !(ti[i >> 3] & (1u << (i & 7)));
		ti[i >> 3] |= (uint8_t)(1u << (i & 7));
		mfs_id_t uid = mfs_id_u64(u + 1), iid = mfs_id_u64(i + 1);
		if ((rc = mfs_rfile_write(w, &uid, &iid, (float)x, GEN_T0_MS + (int64_t)n))) {
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
	double dt = mfs_now_s() - t0;
	fprintf(stderr,
	        "mfstream gen: ratings=%" PRIu64 " users_touched=%" PRIu64 " items_touched=%" PRIu64
	        " seconds=%.3f ratings_per_s=%.0f output=%s\n",
	        N, users_touched, items_touched, dt, dt > 0 ? (double)N / dt : 0.0, out_path);
	ret = 0;
done_free:
	mfs_rfile_writer_close(w);
	sampler_free(&su);
	sampler_free(&si);
	free(P);
	free(Q);
	free(bu);
	free(bi);
	free(tu);
	free(ti);
done:
	mfs_conf_free(&c);
	return ret;
}
