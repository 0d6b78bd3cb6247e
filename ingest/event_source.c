/* event_source.c - event streams for the producer: a ratings file in timestamp order, or the
 * planted synthetic model of `mfstream gen`.
 *
 * DESIGN: a file is read whole (mfs_rfile_read) into 32-byte records plus one arena for
 * string ids (records hold offsets, so the arena may grow while reading), then ordered by
 * a bottom-up merge sort on the timestamp: merge sort is stable, so ties keep file order,
 * and it is O(n log n) in the worst case; a file already in order skips it. Tens of
 * millions of ratings fit (about 64 bytes each at the peak, while sorting).
 *
 * The synthetic stream copies the minimum of cmd_gen.c (Vose alias sampler, planted
 * factors, the per-part RNG streams derived from gen.seed) so that for the same gen.* keys
 * it yields exactly the ratings `mfstream gen` writes, in the same order. cmd_gen.c keeps
 * its own copy (it is not ours to edit); the two must change together.
 */
#include "ingest/event_source.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"

#define SYNTH_T0_MS 1700000000000LL /* gen's first timestamp */
#define SECONDS_BELOW 100000000000LL /* |ts| < 1e11 in a text file: seconds (year < 5138) */

/* One rating of a file. An id with len 0 is the u64 in u/i; otherwise u/i is the offset of
 * len bytes in the arena. */
typedef struct fs_rec {
	int64_t ts;
	uint64_t u, i;
	float r;
	uint16_t ulen, ilen;
} fs_rec_t;

/* A sampler over [0, n): uniform, or a Vose alias table (from cmd_gen.c). */
typedef struct synth_sampler {
	uint64_t n;
	uint32_t *thr;   /* keep index k when a 32-bit coin <= thr[k]; NULL = uniform */
	uint32_t *alias; /* else take alias[k] */
} synth_sampler_t;

enum { SRC_FILE = 1, SRC_SYNTH = 2 };

struct mfs_evsrc {
	int es_kind;
	uint64_t es_n, es_pos; /* events in all, events returned */
	/* file */
	fs_rec_t *es_rec;
	char *es_arena;
	size_t es_arena_len, es_arena_cap, es_rec_cap;
	int es_sorted;
	/* synthetic */
	synth_sampler_t es_su, es_si;
	float *es_P, *es_Q, *es_bu, *es_bi;
	int es_rank;
	double es_mean, es_noise, es_min, es_max;
	mfs_rng_t es_g;
};

/* ---- file ------------------------------------------------------------------------------ */

static int arena_put(mfs_evsrc_t *s, const char *p, size_t len, uint64_t *off)
{
	if (s->es_arena_len + len > s->es_arena_cap) {
		size_t cap = s->es_arena_cap ? s->es_arena_cap * 2 : 1 << 16;
		while (cap < s->es_arena_len + len)
			cap *= 2;
		char *a = realloc(s->es_arena, cap);
		if (!a)
			return ENOMEM;
		s->es_arena = a;
		s->es_arena_cap = cap;
	}
	memcpy(s->es_arena + s->es_arena_len, p, len);
	*off = s->es_arena_len;
	s->es_arena_len += len;
	return 0;
}

static int put_id(mfs_evsrc_t *s, const mfs_id_t *id, uint64_t *v, uint16_t *len)
{
	if (id->kind == MFS_ID_U64) {
		*v = id->num;
		*len = 0;
		return 0;
	}
	*len = id->len; /* 1..256: the reader rejects empty and longer ids */
	return arena_put(s, id->str, id->len, v);
}

static int file_cb(void *ctx, const mfs_id_t *user, const mfs_id_t *item, float rating, int64_t ts, uint64_t line)
{
	(void)line;
	mfs_evsrc_t *s = ctx;
	if (s->es_n == s->es_rec_cap) {
		size_t cap = s->es_rec_cap ? s->es_rec_cap * 2 : 1 << 16;
		fs_rec_t *r = realloc(s->es_rec, cap * sizeof *r);
		if (!r)
			return ENOMEM;
		s->es_rec = r;
		s->es_rec_cap = cap;
	}
	fs_rec_t *r = &s->es_rec[s->es_n];
	r->ts = ts;
	r->r = rating;
	int rc;
	if ((rc = put_id(s, user, &r->u, &r->ulen)) || (rc = put_id(s, item, &r->i, &r->ilen)))
		return rc;
	s->es_n++;
	return 0;
}

/* Stable bottom-up merge sort of a[0..n) by ts, using tmp[0..n). */
static void sort_by_ts(fs_rec_t *a, fs_rec_t *tmp, size_t n)
{
	fs_rec_t *src = a, *dst = tmp;
	for (size_t w = 1; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
			size_t i = lo, j = mid, k = lo;
			while (i < mid && j < hi) /* <= keeps the left (earlier) one first: stable */
				dst[k++] = src[j].ts < src[i].ts ? src[j++] : src[i++];
			while (i < mid)
				dst[k++] = src[i++];
			while (j < hi)
				dst[k++] = src[j++];
		}
		fs_rec_t *t = src;
		src = dst;
		dst = t;
	}
	if (src != a)
		memcpy(a, src, n * sizeof *a);
}

int mfs_evsrc_open_file(const char *path, const mfs_rfile_opts_t *opts, mfs_evsrc_t **out,
                        mfs_rfile_stats_t *st, char *errstr, size_t errstr_size)
{
	*out = NULL;
	mfs_rfile_stats_t st_local;
	if (!st)
		st = &st_local;
	mfs_evsrc_t *s = calloc(1, sizeof *s);
	if (!s)
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	s->es_kind = SRC_FILE;
	int rc = mfs_rfile_read(path, opts, file_cb, s, st, errstr, errstr_size);
	if (rc) {
		if (rc == ENOMEM)
			mfs_errf(errstr, errstr_size, ENOMEM, "%s: out of memory after %llu ratings", path,
			         (unsigned long long)s->es_n);
		goto fail;
	}
	if (s->es_n == 0) {
		rc = mfs_errf(errstr, errstr_size, MFS_EEMPTY, "%s: no valid rating", path);
		goto fail;
	}
	int64_t maxabs = 0;
	int ordered = 1;
	for (uint64_t k = 0; k < s->es_n; k++) {
		int64_t t = s->es_rec[k].ts;
		maxabs = llabs(t) > maxabs ? llabs(t) : maxabs;
		if (k && t < s->es_rec[k - 1].ts)
			ordered = 0;
	}
	if (st->format != MFS_RFMT_BIN && maxabs < SECONDS_BELOW)
		for (uint64_t k = 0; k < s->es_n; k++)
			s->es_rec[k].ts *= 1000;
	if (!ordered) {
		fs_rec_t *tmp = malloc(s->es_n * sizeof *tmp);
		if (!tmp) {
			rc = mfs_errf(errstr, errstr_size, ENOMEM, "%s: out of memory sorting %llu ratings", path,
			              (unsigned long long)s->es_n);
			goto fail;
		}
		sort_by_ts(s->es_rec, tmp, s->es_n);
		free(tmp);
		s->es_sorted = 1;
	}
	*out = s;
	return 0;
fail:
	mfs_evsrc_close(s);
	return rc;
}

static inline mfs_id_t rec_id(const mfs_evsrc_t *s, uint64_t v, uint16_t len)
{
	if (!len)
		return mfs_id_u64(v);
	mfs_id_t id = {MFS_ID_STR, len, 0, s->es_arena + v};
	return id;
}

/* ---- synthetic (from cmd_gen.c) --------------------------------------------------------- */

static void sampler_free(synth_sampler_t *s)
{
	free(s->thr);
	free(s->alias);
	memset(s, 0, sizeof *s);
}

static inline uint64_t sampler_draw(const synth_sampler_t *s, mfs_rng_t *g)
{
	uint64_t k = mfs_rng_below(g, s->n);
	if (!s->thr)
		return k;
	uint32_t coin = (uint32_t)(mfs_rng_next(g) >> 32);
	return coin <= s->thr[k] ? k : s->alias[k];
}

/* Weights (rank+1)^-expo over a random permutation of [0, n), as an alias table. */
static int sampler_init(synth_sampler_t *s, uint64_t n, double expo, uint64_t seed)
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
	mfs_rng_t g; /* permutation: work[rank] = index */
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
		if (q[lg] < 1.0) {
			nl--;
			work[ns++] = lg;
		}
	}
	while (ns) { /* what is left has probability 1 up to rounding */
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

int mfs_evsrc_open_synth(const mfs_conf_t *c, mfs_evsrc_t **out, char *errstr, size_t errstr_size)
{
	*out = NULL;
	if (c->gen_min > c->gen_max)
		return mfs_errf(errstr, errstr_size, MFS_ECONFIG, "gen.min (%g) is above gen.max (%g)", c->gen_min,
		                c->gen_max);
	mfs_evsrc_t *s = calloc(1, sizeof *s);
	if (!s)
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	s->es_kind = SRC_SYNTH;
	const uint64_t U = (uint64_t)c->gen_users, I = (uint64_t)c->gen_items, seed = (uint64_t)c->gen_seed;
	const int r = (int)c->gen_rank;
	s->es_n = (uint64_t)c->gen_ratings;
	s->es_rank = r;
	s->es_mean = c->gen_mean;
	s->es_noise = c->gen_noise;
	s->es_min = c->gen_min;
	s->es_max = c->gen_max;
	s->es_P = malloc(U * (size_t)r * sizeof *s->es_P);
	s->es_Q = malloc(I * (size_t)r * sizeof *s->es_Q);
	s->es_bu = malloc(U * sizeof *s->es_bu);
	s->es_bi = malloc(I * sizeof *s->es_bi);
	if (!s->es_P || !s->es_Q || !s->es_bu || !s->es_bi ||
	    sampler_init(&s->es_su, U, c->gen_user_skew, mfs_mix64(seed, 2)) ||
	    sampler_init(&s->es_si, I, c->gen_zipf, mfs_mix64(seed, 3))) {
		mfs_evsrc_close(s);
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory for %llu users x %llu items at rank %d",
		                (unsigned long long)U, (unsigned long long)I, r);
	}
	/* the planted model: one stream for users, one for items (as in gen) */
	const double fsd = sqrt(c->gen_signal_sd / sqrt((double)r));
	mfs_rng_t g;
	mfs_rng_seed(&g, mfs_mix64(seed, 0));
	for (uint64_t u = 0; u < U; u++) {
		s->es_bu[u] = (float)(c->gen_bias_sd * mfs_rng_normal(&g));
		for (int k = 0; k < r; k++)
			s->es_P[u * (size_t)r + (size_t)k] = (float)(fsd * mfs_rng_normal(&g));
	}
	mfs_rng_seed(&g, mfs_mix64(seed, 1));
	for (uint64_t i = 0; i < I; i++) {
		s->es_bi[i] = (float)(c->gen_bias_sd * mfs_rng_normal(&g));
		for (int k = 0; k < r; k++)
			s->es_Q[i * (size_t)r + (size_t)k] = (float)(fsd * mfs_rng_normal(&g));
	}
	mfs_rng_seed(&s->es_g, mfs_mix64(seed, 4));
	*out = s;
	return 0;
}

/* ---- common ---------------------------------------------------------------------------- */

int mfs_evsrc_next(mfs_evsrc_t *s, mfs_event_t *ev)
{
	if (s->es_pos >= s->es_n)
		return 0;
	if (s->es_kind == SRC_FILE) {
		const fs_rec_t *r = &s->es_rec[s->es_pos++];
		ev->user = rec_id(s, r->u, r->ulen);
		ev->item = rec_id(s, r->i, r->ilen);
		ev->rating = r->r;
		ev->has_ts = r->ts != 0;
		ev->ts_ms = r->ts;
		return 1;
	}
	const int rk = s->es_rank;
	uint64_t u = sampler_draw(&s->es_su, &s->es_g), i = sampler_draw(&s->es_si, &s->es_g);
	const float *pu = s->es_P + u * (size_t)rk, *qi = s->es_Q + i * (size_t)rk;
	double dot = 0;
	for (int k = 0; k < rk; k++)
		dot += (double)pu[k] * (double)qi[k];
	double x = s->es_mean + s->es_bu[u] + s->es_bi[i] + dot + s->es_noise * mfs_rng_normal(&s->es_g);
	x = x < s->es_min ? s->es_min : x > s->es_max ? s->es_max : x;
	ev->user = mfs_id_u64(u + 1);
	ev->item = mfs_id_u64(i + 1);
	ev->rating = (float)x;
	ev->has_ts = 1;
	ev->ts_ms = SYNTH_T0_MS + (int64_t)s->es_pos++;
	return 1;
}

uint64_t mfs_evsrc_count(const mfs_evsrc_t *s) { return s->es_n; }

int mfs_evsrc_was_sorted(const mfs_evsrc_t *s) { return s->es_sorted; }

void mfs_evsrc_close(mfs_evsrc_t *s)
{
	if (!s)
		return;
	free(s->es_rec);
	free(s->es_arena);
	sampler_free(&s->es_su);
	sampler_free(&s->es_si);
	free(s->es_P);
	free(s->es_Q);
	free(s->es_bu);
	free(s->es_bi);
	free(s);
}
