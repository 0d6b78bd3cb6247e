/* synth.c - the planted synthetic rating stream behind `mfstream gen`, `mfstream produce
 * --synthetic` and the benchmarks' data: one implementation, so they all draw the same data.
 *
 * The planted model (gen.* keys, docs/INPUT_FORMATS.md):
 *   b_u, b_i ~ N(0, bias_sd^2)
 *   p_u, q_i ~ N(0, s^2) per component, s = sqrt(signal_sd / sqrt(rank)), so that
 *              Var(p_u . q_i) = rank * s^4 = signal_sd^2
 *   r(u,i)   = clip(mean + b_u + b_i + p_u . q_i + N(0, noise^2), gen.min, gen.max)
 * and with gen.drift_period T > 0 (tastes that drift) the user side turns: at the n-th rating
 *   p_u(n)   = cos(phi) a_u + sin(phi) c_u,   phi = 2 pi (n / T + o_u)
 * with a_u, c_u planted as p_u and o_u a uniform phase per user, so |p_u| keeps its law and
 * E[p_u(n) . p_u(n + d)] falls as cos(2 pi d / T): an old estimate of a user goes stale.
 * Each rating is written as a float (not rounded to a rating scale). Users are drawn with weight
 * (rank+1)^-user_skew and items with weight (rank+1)^-zipf, where "rank" is a position in
 * a seeded random permutation, so popular items are not ids 1, 2, 3, ...; exponent 0 is
 * uniform. Pairs (u, i) may repeat, each time with fresh noise.
 *
 * How good can a model get? The noise is independent of everything a model can learn, so
 * no predictor beats the Bayes predictor E[r | u, i], whose RMSE is the standard deviation
 * of the clipped noise: exactly gen.noise without clipping, slightly less with it (clipping
 * pulls the tails in). A biased MF of rank >= gen.rank trained on enough data approaches
 * that floor.
 *
 * DESIGN: memory is bounded by users and items, never by ratings. Sampling uses Vose alias
 * tables (8 bytes per entry, O(1) per draw, two cache misses); the planted factors take
 * 4 * rank * (users + items) bytes. Every part has its own RNG stream derived from gen.seed
 * (0 users, 1 items, 2 user sampler, 3 item sampler, 4 the ratings), so N ratings are a
 * prefix of more ratings with the same other settings. Timestamps are 1_700_000_000_000 ms
 * + n, one millisecond per rating, so they strictly increase.
 *
 * Arriving users (gen.user_arrival A > 0): users join the stream at A per rating. Before
 * rating n, U + floor(A n) users have joined (the first U are there from the start); a rating's
 * user is the (k+1)-th most recent of them, k drawn by the user sampler over [0, U), so U
 * users are active at a time and each stays for about U / A ratings. The U planted rows are
 * a ring: a user who joins takes the slot of the one who left, and its bias and factors (and
 * drift) are drawn from an RNG stream of its own (6, and the user's index), so memory stays
 * bounded by U. The item side and every draw of stream 4 are the same as without arrivals.
 * gen.user_offset shifts every user index (ids offset+1 ...), so producers with different
 * offsets draw disjoint users.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "config/config.h"
#include "ingest/synth.h"

#define SYNTH_T0_MS 1700000000000LL

/* A sampler over [0, n): uniform, or a Vose alias table. */
typedef struct synth_sampler {
	uint64_t n;
	uint32_t *thr;   /* keep index k when a 32-bit coin <= thr[k]; NULL = uniform */
	uint32_t *alias; /* else take alias[k] */
} synth_sampler_t;

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

struct mfs_synth {
	uint64_t n, pos;
	int rank;
	double mean, noise, min, max;
	synth_sampler_t su, si;
	float *P, *Q, *bu, *bi;
	float *C;      /* drift: the second planted vector c_u of each user (NULL without drift) */
	float *phase;  /* drift: o_u */
	double period; /* gen.drift_period (0: none) */
	double arrival;  /* gen.user_arrival: users joining per rating (0: a fixed population) */
	uint64_t U;      /* gen.users: the active users, the planted rows' ring */
	uint64_t joined; /* users joined so far (arrivals) */
	uint64_t offset; /* gen.user_offset */
	uint64_t seed;
	double fsd, bias_sd;
	mfs_rng_t g;
	mfs_rng_t ahead;  /* g as it will be SYNTH_AHEAD events on: whose rows to prefetch */
	mfs_rng_t ahead2; /* g 2 x SYNTH_AHEAD events on: whose alias table entries to prefetch */
};

/* Events between the prefetch of an event's planted rows and its rating (and as many again
 * before that, for the skewed samplers' alias entries that pick the rows): the user rows and
 * the samplers' tables (gen.users of each, arriving users' rows written as they join) are far
 * larger than the caches, and their misses were most of a producer's time. */
#define SYNTH_AHEAD 16

void mfs_synth_close(mfs_synth_t *s)
{
	if (!s)
		return;
	sampler_free(&s->su);
	sampler_free(&s->si);
	free(s->P);
	free(s->Q);
	free(s->bu);
	free(s->bi);
	free(s->C);
	free(s->phase);
	free(s);
}

/* The draws sampler_draw makes, without reading the tables: the alias entry it will read. */
static inline uint64_t sampler_peek(const synth_sampler_t *s, mfs_rng_t *g)
{
	const uint64_t k = mfs_rng_below(g, s->n);
	if (s->thr)
		(void)mfs_rng_next(g);
	return k;
}

/* The alias entries of the event 2 x SYNTH_AHEAD on (s->ahead2), prefetched. */
static void ahead2_step(mfs_synth_t *s, int prefetch)
{
	const uint64_t ku = sampler_peek(&s->su, &s->ahead2), ki = sampler_peek(&s->si, &s->ahead2);
	(void)mfs_rng_next(&s->ahead2); /* mfs_rng_normal's two uniforms */
	(void)mfs_rng_next(&s->ahead2);
	if (!prefetch)
		return;
	if (s->su.thr) {
		__builtin_prefetch(s->su.thr + ku);
		__builtin_prefetch(s->su.alias + ku);
	}
	if (s->si.thr) {
		__builtin_prefetch(s->si.thr + ki);
		__builtin_prefetch(s->si.alias + ki);
	}
}

/* Draw event pos's user and item on s->ahead exactly as mfs_synth_next will on s->g (the same
 * draws in the same order, the noise's two uniforms skipped), and prefetch their planted rows.
 * The values drawn are unchanged: only the cache is warmed. */
static void ahead_step(mfs_synth_t *s, uint64_t pos, int prefetch)
{
	uint64_t user = sampler_draw(&s->su, &s->ahead);
	const uint64_t item = sampler_draw(&s->si, &s->ahead);
	(void)mfs_rng_next(&s->ahead); /* mfs_rng_normal's two uniforms */
	(void)mfs_rng_next(&s->ahead);
	if (!prefetch)
		return;
	if (s->arrival > 0) /* as mfs_synth_next: joined is then U + floor(arrival pos) */
		user = s->U + (uint64_t)(s->arrival * (double)pos) - 1 - user;
	const uint64_t slot = user % s->U;
	const size_t rk = (size_t)s->rank;
	__builtin_prefetch(s->P + slot * rk);
	__builtin_prefetch(s->bu + slot);
	__builtin_prefetch(s->Q + item * rk);
	__builtin_prefetch(s->bi + item);
	if (s->C) {
		__builtin_prefetch(s->C + slot * rk);
		__builtin_prefetch(s->phase + slot);
	}
}

int mfs_synth_open(const struct mfs_conf *c, mfs_synth_t **out, char *errstr, size_t errstr_size)
{
	*out = NULL;
	if (c->gen_min > c->gen_max)
		return mfs_errf(errstr, errstr_size, MFS_ECONFIG, "gen.min (%g) is above gen.max (%g)", c->gen_min,
		                c->gen_max);
	mfs_synth_t *s = calloc(1, sizeof *s);
	if (!s)
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	const uint64_t U = (uint64_t)c->gen_users, I = (uint64_t)c->gen_items, seed = (uint64_t)c->gen_seed;
	const int r = (int)c->gen_rank;
	s->n = (uint64_t)c->gen_ratings;
	s->rank = r;
	s->mean = c->gen_mean;
	s->noise = c->gen_noise;
	s->min = c->gen_min;
	s->max = c->gen_max;
	s->P = malloc(U * (size_t)r * sizeof *s->P);
	s->Q = malloc(I * (size_t)r * sizeof *s->Q);
	s->bu = malloc(U * sizeof *s->bu);
	s->bi = malloc(I * sizeof *s->bi);
	if (!s->P || !s->Q || !s->bu || !s->bi || sampler_init(&s->su, U, c->gen_user_skew, mfs_mix64(seed, 2)) ||
	    sampler_init(&s->si, I, c->gen_zipf, mfs_mix64(seed, 3))) {
		mfs_synth_close(s);
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory for %llu users x %llu items at rank %d",
		                (unsigned long long)U, (unsigned long long)I, r);
	}
	/* the planted model: one stream for users, one for items */
	const double fsd = sqrt(c->gen_signal_sd / sqrt((double)r));
	mfs_rng_t g;
	mfs_rng_seed(&g, mfs_mix64(seed, 0));
	for (uint64_t u = 0; u < U; u++) {
		s->bu[u] = (float)(c->gen_bias_sd * mfs_rng_normal(&g));
		for (int k = 0; k < r; k++)
			s->P[u * (size_t)r + (size_t)k] = (float)(fsd * mfs_rng_normal(&g));
	}
	mfs_rng_seed(&g, mfs_mix64(seed, 1));
	for (uint64_t i = 0; i < I; i++) {
		s->bi[i] = (float)(c->gen_bias_sd * mfs_rng_normal(&g));
		for (int k = 0; k < r; k++)
			s->Q[i * (size_t)r + (size_t)k] = (float)(fsd * mfs_rng_normal(&g));
	}
	if (c->gen_drift_period > 0) { /* a stream of its own (5), so the rest stays as without drift */
		s->period = (double)c->gen_drift_period;
		if (!(s->C = malloc(U * (size_t)r * sizeof *s->C)) || !(s->phase = malloc(U * sizeof *s->phase))) {
			mfs_synth_close(s);
			return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory for the drift of %llu users",
			                (unsigned long long)U);
		}
		mfs_rng_seed(&g, mfs_mix64(seed, 5));
		for (uint64_t u = 0; u < U; u++) {
			s->phase[u] = (float)mfs_rng_uniform(&g);
			for (int k = 0; k < r; k++)
				s->C[u * (size_t)r + (size_t)k] = (float)(fsd * mfs_rng_normal(&g));
		}
	}
	s->arrival = c->gen_user_arrival;
	s->U = s->joined = U;
	s->offset = (uint64_t)c->gen_user_offset;
	s->seed = seed;
	s->fsd = fsd;
	s->bias_sd = c->gen_bias_sd;
	mfs_rng_seed(&s->g, mfs_mix64(seed, 4));
	s->ahead = s->ahead2 = s->g;
	for (uint64_t j = 0; j < SYNTH_AHEAD; j++)
		ahead_step(s, j, 0);
	for (uint64_t j = 0; j < 2 * SYNTH_AHEAD; j++)
		ahead2_step(s, 0);
	*out = s;
	return 0;
}

/* A user joins (arrivals): its planted row, in the ring slot of the user who left. */
static void plant_user(mfs_synth_t *s, uint64_t user)
{
	const int rk = s->rank;
	const uint64_t slot = user % s->U;
	mfs_rng_t g;
	mfs_rng_seed(&g, mfs_mix64(mfs_mix64(s->seed, 6), user));
	s->bu[slot] = (float)(s->bias_sd * mfs_rng_normal(&g));
	for (int k = 0; k < rk; k++)
		s->P[slot * (size_t)rk + (size_t)k] = (float)(s->fsd * mfs_rng_normal(&g));
	if (s->C) {
		s->phase[slot] = (float)mfs_rng_uniform(&g);
		for (int k = 0; k < rk; k++)
			s->C[slot * (size_t)rk + (size_t)k] = (float)(s->fsd * mfs_rng_normal(&g));
	}
}

int mfs_synth_next(mfs_synth_t *s, uint64_t *u, uint64_t *i, float *rating, int64_t *ts_ms)
{
	if (s->pos >= s->n)
		return 0;
	if (s->pos + 2 * SYNTH_AHEAD < s->n)
		ahead2_step(s, 1);
	if (s->pos + SYNTH_AHEAD < s->n)
		ahead_step(s, s->pos + SYNTH_AHEAD, 1);
	const int rk = s->rank;
	uint64_t user = sampler_draw(&s->su, &s->g);
	*i = sampler_draw(&s->si, &s->g);
	if (s->arrival > 0) { /* the (user+1)-th most recent of the users joined so far */
		const uint64_t want = s->U + (uint64_t)(s->arrival * (double)s->pos);
		while (s->joined < want)
			plant_user(s, s->joined++);
		user = s->joined - 1 - user;
	}
	const uint64_t slot = user % s->U;
	*u = user + s->offset;
	const float *pu = s->P + slot * (size_t)rk, *qi = s->Q + *i * (size_t)rk;
	double dot = 0;
	for (int k = 0; k < rk; k++)
		dot += (double)pu[k] * (double)qi[k];
	if (s->C) { /* drift: cos(phi) a_u . q_i + sin(phi) c_u . q_i */
		const float *cu = s->C + slot * (size_t)rk;
		double dc = 0;
		for (int k = 0; k < rk; k++)
			dc += (double)cu[k] * (double)qi[k];
		const double phi = 2.0 * M_PI * ((double)s->pos / s->period + (double)s->phase[slot]);
		dot = cos(phi) * dot + sin(phi) * dc;
	}
	double x = s->mean + s->bu[slot] + s->bi[*i] + dot + s->noise * mfs_rng_normal(&s->g);
	*rating = (float)(x < s->min ? s->min : x > s->max ? s->max : x);
	*ts_ms = SYNTH_T0_MS + (int64_t)s->pos++;
	return 1;
}

uint64_t mfs_synth_count(const mfs_synth_t *s) { return s->n; }

uint64_t mfs_synth_user_base(const mfs_synth_t *s) { return s->offset; }

uint64_t mfs_synth_user_span(const mfs_synth_t *s)
{
	return s->U + (s->arrival > 0 ? (uint64_t)(s->arrival * (double)s->n) + 1 : 0);
}
