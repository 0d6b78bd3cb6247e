/* test_reader_topk.c - libmfsnap top-K against a brute-force oracle, the item cache
 * following new snapshots, staleness, and stale-reader cleanup.
 *
 * The oracle scores every item of the model the writer published with the contract's
 * formula ((float)(((mu + b_u) + b_i) + sum_j p_j q_j), double, j in order), sorts by score
 * then encoded key, drops excluded ids and keeps K. Every path of mfs_snap_topk_ex (int8
 * default, EXACT, NOCACHE) must return exactly that: same ids, same order, same float32
 * bits. The fixtures are built to break an approximate top-K: exact ties, scores one ulp
 * apart, duplicated rows, subnormal and huge factors, K up to and beyond n_items.
 * LMDB allows one env per process, so publishes while a reader is open run in a child.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"
#include "model_help.h"

static char errbuf[1024];

/* ---- fixtures ------------------------------------------------------------------------- */
static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rng_next(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static double rng_unit(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }

static double rng_gauss(void)
{
	double u = rng_unit(), v = rng_unit();
	return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static float rand_bits(void)
{
	for (;;) {
		uint32_t b = (uint32_t)rng_next();
		float f;
		memcpy(&f, &b, 4);
		if (isfinite(f))
			return f;
	}
}

static mfs_model_t *model_new(int k)
{
	mfs_model_conf_t c = {k, 0.1, 11};
	mfs_model_t *m = NULL;
	TEST_OK(mfs_model_init(&c, &m));
	return m;
}

/* n items: mostly u64 ids (spaced, so unknown ids exist between them), every 10th a string */
static void add_items(mfs_model_t *m, uint32_t n)
{
	char buf[32];
	for (uint32_t i = 0; i < n; i++) {
		if (i % 10 == 3) {
			snprintf(buf, sizeof buf, "item-%u", i);
			add_item(m, str_id(buf));
		} else {
			add_item(m, mfs_id_u64(7ull * i + 1));
		}
	}
}

static void add_users(mfs_model_t *m, uint32_t n)
{
	for (uint32_t u = 0; u < n; u++)
		add_user(m, mfs_id_u64(u));
}

static mfs_snap_info_t info_default(void)
{
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.01;
	in.last_loss = NAN;
	in.rating_min = 1.0;
	in.rating_max = 5.0;
	return in;
}

static int publish(const char *dir, const mfs_model_t *m, const mfs_snap_info_t *in, uint64_t *seq)
{
	mfs_snap_writer_t *w = NULL;
	int rc = mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf);
	if (rc)
		return rc;
	rc = mfs_snap_publish(w, m, in, seq, errbuf, sizeof errbuf);
	mfs_snap_writer_close(w);
	return rc;
}

/* Publish from a forked child (a reader is open in this process). @return 0 on success. */
static int publish_in_child(const char *dir, const mfs_model_t *m, const mfs_snap_info_t *in, uint64_t want_seq)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		uint64_t seq = 0;
		int rc = publish(dir, m, in, &seq);
		if (rc)
			fprintf(stderr, "child publish: %s\n", errbuf);
		_exit(rc == 0 && seq == want_seq ? 0 : 1);
	}
	int status = 0;
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static mfs_snap_id_t snap_id_of(mfs_id_t id)
{
	mfs_snap_id_t s = {id.kind == MFS_ID_U64 ? MFS_SNAP_ID_U64 : MFS_SNAP_ID_STR, id.num, id.str, id.len};
	return s;
}

/* ---- the oracle ------------------------------------------------------------------------- */
struct ref {
	unsigned char key[MFS_SNAP_KEY_MAX];
	size_t len;
	float score;
};

static int key_cmp(const unsigned char *a, size_t al, const unsigned char *b, size_t bl)
{
	int r = memcmp(a, b, al < bl ? al : bl);
	return r ? r : al < bl ? -1 : al > bl;
}

static int ref_cmp(const void *pa, const void *pb)
{
	const struct ref *a = pa, *b = pb;
	if (a->score != b->score)
		return a->score > b->score ? -1 : 1;
	return key_cmp(a->key, a->len, b->key, b->len);
}

static size_t encode(mfs_id_t id, unsigned char *key)
{
	return id.kind == MFS_ID_U64 ? mfs_snap_key_u64(key, id.num) : mfs_snap_key_str(key, id.str, id.len);
}

static size_t encode_snap(const mfs_snap_id_t *id, unsigned char *key)
{
	return id->kind == MFS_SNAP_ID_U64 ? mfs_snap_key_u64(key, id->num) : mfs_snap_key_str(key, id->str, id->len);
}

/* All items ranked for user row urow (sorted best first); the caller frees it. */
static struct ref *oracle_rank(const mfs_model_t *m, uint32_t urow)
{
	struct ref *r = calloc(m->n_items ? m->n_items : 1, sizeof *r);
	const float *p = m->P + (size_t)urow * m->k;
	double base = m->mu + (double)m->bu[urow];
	for (uint32_t i = 0; i < m->n_items; i++) {
		const float *q = m->Q + (size_t)i * m->k;
		double acc = 0.0;
		for (int j = 0; j < m->k; j++)
			acc += (double)p[j] * (double)q[j];
		r[i].score = (float)((base + (double)m->bi[i]) + acc);
		r[i].len = encode(mfs_idmap_key(m->items, i), r[i].key);
	}
	qsort(r, m->n_items, sizeof *r, ref_cmp);
	return r;
}

static int excluded(const struct ref *r, const mfs_snap_id_t *ex, size_t nx)
{
	unsigned char key[MFS_SNAP_KEY_MAX];
	for (size_t x = 0; x < nx; x++) {
		size_t len = encode_snap(&ex[x], key);
		if (key_cmp(key, len, r->key, r->len) == 0)
			return 1;
	}
	return 0;
}

static const unsigned flag_sets[] = {0, MFS_SNAP_TOPK_EXACT, MFS_SNAP_TOPK_NOCACHE};
static const char *flag_names[] = {"int8", "exact", "nocache"};

/* Run one query through every path and compare with the oracle. @return mismatching paths.
 * *int8_scored gets the default path's candidate count (or SIZE_MAX if it took another). */
static int check_query(mfs_snap_t *s, const mfs_model_t *m, const struct ref *rank, uint32_t urow, size_t K,
                       const mfs_snap_id_t *ex, size_t nx, size_t *int8_scored)
{
	/* the expected answer */
	size_t cap = K < m->n_items ? K : m->n_items, nw = 0;
	struct ref **want = calloc(cap ? cap : 1, sizeof *want);
	for (uint32_t i = 0; i < m->n_items && nw < K; i++)
		if (!excluded(&rank[i], ex, nx))
			want[nw++] = (struct ref *)&rank[i];
	mfs_snap_id_t uid = snap_id_of(mfs_idmap_key(m->users, urow));
	mfs_snap_hit_t *hits = calloc(K ? K : 1, sizeof *hits);
	int bad_paths = 0;
	for (size_t f = 0; f < 3; f++) {
		mfs_snap_topk_opts_t o = {ex, nx, flag_sets[f]};
		mfs_snap_topk_stats_t st;
		size_t n = 12345;
		int rc = mfs_snap_topk_ex(s, &uid, K, &o, hits, &n, &st);
		int bad = rc != 0 || n != nw;
		for (size_t h = 0; !bad && h < n; h++) {
			unsigned char key[MFS_SNAP_KEY_MAX];
			size_t len = hits[h].kind == MFS_SNAP_ID_U64 ? mfs_snap_key_u64(key, hits[h].num)
			                                             : mfs_snap_key_str(key, hits[h].str, hits[h].len);
			if (key_cmp(key, len, want[h]->key, want[h]->len) != 0 ||
			    memcmp(&hits[h].score, &want[h]->score, 4) != 0) {
				fprintf(stderr, "  %s K=%zu nx=%zu: rank %zu: got score %a, want %a\n", flag_names[f], K, nx, h,
				        (double)hits[h].score, (double)want[h]->score);
				bad = 1;
			}
		}
		if (rc || n != nw)
			fprintf(stderr, "  %s K=%zu nx=%zu: rc %d, %zu hits, want %zu\n", flag_names[f], K, nx, rc, n, nw);
		if (f == 0 && int8_scored)
			*int8_scored = st.path == MFS_SNAP_PATH_INT8 ? (size_t)st.n_scored : SIZE_MAX;
		if (!rc)
			bad |= st.n_items != m->n_items ||
			       st.path != (f == 2 ? MFS_SNAP_PATH_NOCACHE : f == 1 ? MFS_SNAP_PATH_EXACT : st.path);
		bad_paths += bad;
	}
	free(hits);
	free(want);
	return bad_paths;
}

/* Random exclude list: some known items (with repeats), the oracle's best few, unknown ids. */
static size_t make_excludes(const mfs_model_t *m, const struct ref *rank, mfs_snap_id_t *ex, size_t cap)
{
	size_t nx = 0;
	for (size_t t = 0; t < 5 && t < m->n_items && nx < cap; t++) {
		uint64_t num;
		const char *str;
		size_t len;
		int tag = mfs_snap_key_decode(rank[t].key, rank[t].len, &num, &str, &len);
		ex[nx].kind = tag == MFS_SNAP_KEY_TAG_U64 ? MFS_SNAP_ID_U64 : MFS_SNAP_ID_STR;
		ex[nx].num = num;
		ex[nx].str = tag == MFS_SNAP_KEY_TAG_STR ? str : NULL;
		ex[nx].len = tag == MFS_SNAP_KEY_TAG_STR ? len : 0;
		nx++;
	}
	for (size_t t = 0; t < 20 && m->n_items && nx < cap; t++)
		ex[nx++] = snap_id_of(mfs_idmap_key(m->items, (uint32_t)(rng_next() % m->n_items)));
	if (nx && nx < cap) {
		ex[nx] = ex[0]; /* a repeat */
		nx++;
	}
	static const char *unknown = "no-such-item";
	if (nx + 2 <= cap) {
		ex[nx++] = (mfs_snap_id_t){MFS_SNAP_ID_U64, 2, NULL, 0}; /* 7i+1 never hits 2 */
		ex[nx++] = (mfs_snap_id_t){MFS_SNAP_ID_STR, 0, unknown, strlen(unknown)};
	}
	return nx;
}

/* Publish m, then run every K / exclude combination for a few users through every path. */
static void check_model(const char *name, mfs_model_t *m, int want_int8)
{
	const char *dir = test_tmpdir();
	mfs_snap_info_t in = info_default();
	TEST_OK(publish(dir, m, &in, NULL));
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	const size_t n = m->n_items;
	const size_t Ks[] = {1, 7, 100, 1000, n - 1, n, n + 10};
	mfs_snap_id_t ex[64];
	int bad = 0, int8_used = 0, int8_pruned = 0;
	for (uint32_t u = 0; u < m->n_users && u < 4; u++) {
		struct ref *rank = oracle_rank(m, u);
		size_t nx = make_excludes(m, rank, ex, 64);
		for (size_t t = 0; t < sizeof Ks / sizeof Ks[0]; t++) {
			for (int use_ex = 0; use_ex < 2; use_ex++) {
				size_t scored = SIZE_MAX;
				bad += check_query(s, m, rank, u, Ks[t], ex, use_ex ? nx : 0, &scored);
				if (scored != SIZE_MAX) {
					int8_used++;
					int8_pruned += scored < n;
				}
			}
		}
		free(rank);
	}
	TEST_ASSERT_MSG(bad == 0, "%s: %d mismatching queries", name, bad);
	if (want_int8) {
		/* the fast path really ran, and pruned (K small against n) */
		TEST_ASSERT_MSG(int8_used >= 8 && int8_pruned >= 4, "%s: int8 path used %d times, pruned %d", name,
		                int8_used, int8_pruned);
	} else {
		TEST_ASSERT_MSG(int8_used == 0, "%s: int8 path used %d times on data it cannot bound", name, int8_used);
	}
	mfs_snap_close(s);
}

/* ---- top-K against the oracle --------------------------------------------------------- */
static void test_topk_gauss(void)
{
	mfs_model_t *m = model_new(16);
	m->mu = 3.5;
	add_users(m, 4);
	add_items(m, 3000);
	for (size_t j = 0; j < (size_t)m->n_users * 16; j++)
		m->P[j] = (float)rng_gauss();
	for (size_t j = 0; j < (size_t)m->n_items * 16; j++)
		m->Q[j] = (float)rng_gauss();
	for (uint32_t i = 0; i < m->n_items; i++)
		m->bi[i] = (float)(0.3 * rng_gauss());
	for (uint32_t u = 0; u < m->n_users; u++)
		m->bu[u] = (float)(0.3 * rng_gauss());
	check_model("gauss", m, 1);
	mfs_model_free(m);
}

/* Planted structure: items in topics with a popularity scale (norms spread over ~10x). */
static void test_topk_planted(void)
{
	const int k = 32, topics = 12;
	mfs_model_t *m = model_new(k);
	m->mu = 3.0;
	add_users(m, 4);
	add_items(m, 4000);
	float centers[12][32];
	for (int t = 0; t < topics; t++)
		for (int j = 0; j < k; j++)
			centers[t][j] = (float)rng_gauss();
	for (uint32_t i = 0; i < m->n_items; i++) {
		int t = (int)(rng_next() % topics);
		double pop = exp(0.8 * rng_gauss());
		for (int j = 0; j < k; j++)
			m->Q[(size_t)i * k + j] = (float)(pop * (centers[t][j] + 0.4 * rng_gauss()) / sqrt(k));
		m->bi[i] = (float)(0.2 * log(pop) + 0.1 * rng_gauss());
	}
	for (uint32_t u = 0; u < m->n_users; u++)
		for (int j = 0; j < k; j++)
			m->P[(size_t)u * k + j] = (float)((centers[u % topics][j] + 0.5 * rng_gauss()) / sqrt(k));
	check_model("planted", m, 1);
	mfs_model_free(m);
}

/* Exact ties (duplicated rows) and scores one float32 ulp apart, which no int8 approximation
 * can tell apart: only the bound and the exact rescoring get the order right. */
static void test_topk_ties(void)
{
	const int k = 8;
	mfs_model_t *m = model_new(k);
	m->mu = 0.0;
	add_users(m, 3);
	add_items(m, 900);
	for (size_t j = 0; j < (size_t)m->n_users * k; j++)
		m->P[j] = (float)rng_gauss();
	for (uint32_t i = 0; i < m->n_items; i++) {
		uint32_t src = i / 3; /* rows come in threes */
		uint64_t save = rng_state;
		rng_state = 0x9E3779B97F4A7C15ull ^ (src * 0x100000001B3ull);
		for (int j = 0; j < k; j++)
			m->Q[(size_t)i * k + j] = (float)rng_gauss();
		rng_state = save;
		/* the first of three ties exactly with the second; the third is one ulp of the bias
		 * above (with the dot product at 0 for every 5th group, that is one ulp of the score) */
		float b = 1.0f + (float)(src % 7) * 0.125f;
		m->bi[i] = i % 3 == 2 ? nextafterf(b, 10.0f) : b;
		if (src % 5 == 0)
			memset(m->Q + (size_t)i * k, 0, k * sizeof(float));
	}
	check_model("ties", m, 1);
	mfs_model_free(m);
}

/* Any finite float: huge values make the int8 bounds overflow, so the exact path answers. */
static void test_topk_extreme(void)
{
	const int k = 4;
	mfs_model_t *m = model_new(k);
	m->mu = 0.5;
	add_users(m, 3);
	add_items(m, 400);
	for (size_t j = 0; j < (size_t)m->n_users * k; j++)
		m->P[j] = rand_bits();
	for (size_t j = 0; j < (size_t)m->n_items * k; j++)
		m->Q[j] = rand_bits();
	for (uint32_t i = 0; i < m->n_items; i++)
		m->bi[i] = rand_bits();
	for (uint32_t u = 0; u < m->n_users; u++)
		m->bu[u] = 0.0f;
	check_model("extreme", m, 0);
	mfs_model_free(m);
}

/* Tiny and subnormal factors (scores from 1e-30 down to float32 zero, many exact ties at
 * zero; row and user scales below SNAP_SCALE_MIN): the int8 path works at any scale. */
static void test_topk_tiny(void)
{
	const int k = 16;
	mfs_model_t *m = model_new(k);
	m->mu = 0.0;
	add_users(m, 3);
	add_items(m, 1500);
	for (size_t j = 0; j < (size_t)m->n_users * k; j++)
		m->P[j] = (float)(rng_gauss() * 1e-15);
	for (uint32_t i = 0; i < m->n_items; i++) {
		double scale = i % 3 == 0 ? 1e-41 : i % 3 == 1 ? 1e-25 : 1e-15;
		for (int j = 0; j < k; j++)
			m->Q[(size_t)i * k + j] = (float)(rng_gauss() * scale);
		m->bi[i] = 0.0f;
	}
	for (uint32_t u = 0; u < m->n_users; u++)
		m->bu[u] = 0.0f;
	check_model("tiny", m, 1);
	mfs_model_free(m);
}

/* K = 1000 (the CLI's limit) over more items than that, with and without excludes. */
static void test_topk_k1000(void)
{
	const int k = 24;
	mfs_model_t *m = model_new(k);
	m->mu = 1.0;
	add_users(m, 2);
	add_items(m, 6000);
	for (size_t j = 0; j < (size_t)m->n_users * k; j++)
		m->P[j] = (float)rng_gauss();
	for (size_t j = 0; j < (size_t)m->n_items * k; j++)
		m->Q[j] = (float)(rng_gauss() * 0.5);
	check_model("k1000", m, 1);
	mfs_model_free(m);
}

static void test_topk_errors(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(4);
	add_users(m, 1);
	add_items(m, 10);
	mfs_snap_info_t in = info_default();
	TEST_OK(publish(dir, m, &in, NULL));
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	mfs_snap_hit_t hits[20];
	size_t n = 99;
	mfs_snap_id_t nobody = {MFS_SNAP_ID_U64, 777, NULL, 0}, u0 = {MFS_SNAP_ID_U64, 0, NULL, 0};
	for (size_t f = 0; f < 3; f++) {
		mfs_snap_topk_opts_t o = {NULL, 0, flag_sets[f]};
		TEST_EQ_INT(mfs_snap_topk_ex(s, &nobody, 5, &o, hits, &n, NULL), MFS_ENOTFOUND);
		TEST_EQ_INT(n, 0);
		TEST_OK(mfs_snap_topk_ex(s, &u0, 0, &o, hits, &n, NULL));
		TEST_EQ_INT(n, 0);
	}
	mfs_snap_id_t bad = {MFS_SNAP_ID_STR, 0, "", 0};
	mfs_snap_topk_opts_t o = {&bad, 1, 0};
	TEST_EQ_INT(mfs_snap_topk_ex(s, &u0, 5, &o, hits, &n, NULL), MFS_EIDLEN);
	o.exclude = NULL;
	TEST_EQ_INT(mfs_snap_topk_ex(s, &u0, 5, &o, hits, &n, NULL), MFS_EINVAL);
	TEST_EQ_INT(mfs_snap_topk_ex(s, &u0, 5, NULL, NULL, &n, NULL), MFS_EINVAL);
	TEST_EQ_INT(mfs_snap_topk_ex(NULL, &u0, 5, NULL, hits, &n, NULL), MFS_EINVAL);
	/* excluding every item leaves nothing */
	mfs_snap_id_t all[10];
	for (uint32_t i = 0; i < 10; i++)
		all[i] = snap_id_of(mfs_idmap_key(m->items, i));
	o.exclude = all;
	o.n_exclude = 10;
	TEST_OK(mfs_snap_topk_ex(s, &u0, 5, &o, hits, &n, NULL));
	TEST_EQ_INT(n, 0);
	mfs_snap_close(s);
	mfs_model_free(m);
}

/* ---- the cache follows the snapshots ------------------------------------------------------- */
static void fill_gauss(mfs_model_t *m)
{
	for (size_t j = 0; j < (size_t)m->n_users * m->k; j++)
		m->P[j] = (float)rng_gauss();
	for (size_t j = 0; j < (size_t)m->n_items * m->k; j++)
		m->Q[j] = (float)rng_gauss();
	for (uint32_t i = 0; i < m->n_items; i++)
		m->bi[i] = (float)(0.2 * rng_gauss());
}

/* The oracle's top K ids and scores vs. one default-path call. @return 0 if equal. */
static int same_as_oracle(mfs_snap_t *s, const mfs_model_t *m, uint32_t urow, size_t K, mfs_snap_topk_stats_t *st)
{
	struct ref *rank = oracle_rank(m, urow);
	mfs_snap_id_t uid = snap_id_of(mfs_idmap_key(m->users, urow));
	mfs_snap_hit_t hits[64];
	size_t n = 0;
	int bad = mfs_snap_topk_ex(s, &uid, K, NULL, hits, &n, st) != 0 || n != (K < m->n_items ? K : m->n_items);
	for (size_t h = 0; !bad && h < n; h++) {
		unsigned char key[MFS_SNAP_KEY_MAX];
		size_t len = hits[h].kind == MFS_SNAP_ID_U64 ? mfs_snap_key_u64(key, hits[h].num)
		                                             : mfs_snap_key_str(key, hits[h].str, hits[h].len);
		bad = key_cmp(key, len, rank[h].key, rank[h].len) != 0 || memcmp(&hits[h].score, &rank[h].score, 4) != 0;
	}
	free(rank);
	return bad;
}

static void test_cache_refresh(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(16);
	m->mu = 3.0;
	add_users(m, 2);
	add_items(m, 2000);
	fill_gauss(m);
	mfs_snap_info_t in = info_default();
	TEST_OK(publish(dir, m, &in, NULL));
	mfs_snap_t *s = NULL, *s2 = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	TEST_OK(mfs_snap_open(dir, &s2, errbuf, sizeof errbuf));
	if (!s || !s2)
		return;
	mfs_snap_topk_stats_t st;
	int bad;
	/* the first call builds the cache; the next, on either handle, uses it */
	bad = same_as_oracle(s, m, 0, 50, &st);
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT(st.refreshed == 1 && st.seq == 1 && st.path == MFS_SNAP_PATH_INT8);
	bad = same_as_oracle(s, m, 1, 50, &st);
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT(st.refreshed == 0 && st.seq == 1);
	bad = same_as_oracle(s2, m, 0, 50, &st);
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT_MSG(st.refreshed == 0, "handles on one directory share the cache");

	/* snapshot 2 rewrites only some rows (as the service does): a few items get new factors,
	 * one becomes every user's best, and new items appear */
	uint32_t touched[40];
	for (uint32_t t = 0; t < 30; t++) {
		touched[t] = (uint32_t)(rng_next() % m->n_items);
		for (int j = 0; j < 16; j++)
			m->Q[(size_t)touched[t] * 16 + j] = (float)rng_gauss();
	}
	touched[30] = 5;
	m->bi[5] = 1000.0f;
	for (uint32_t t = 31; t < 40; t++)
		touched[t] = add_item(m, mfs_id_u64(1000000 + t));
	for (uint32_t t = 31; t < 40; t++)
		for (int j = 0; j < 16; j++)
			m->Q[(size_t)touched[t] * 16 + j] = (float)rng_gauss();
	in.item_rows = touched;
	in.n_item_rows = 40;
	in.n_user_rows = 0;
	in.user_rows = touched; /* no user rows */
	TEST_OK(publish_in_child(dir, m, &in, 2));
	bad = same_as_oracle(s, m, 0, 50, &st);
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT_MSG(st.refreshed == 1 && st.seq == 2 && st.n_items == m->n_items, "refreshed %d seq %llu",
	                st.refreshed, (unsigned long long)st.seq);
	bad = same_as_oracle(s2, m, 1, 50, &st);
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT(st.refreshed == 0 && st.seq == 2);
	mfs_snap_id_t u0 = {MFS_SNAP_ID_U64, 0, NULL, 0};
	mfs_snap_hit_t hit;
	size_t n = 0;
	TEST_OK(mfs_snap_topk(s, &u0, 1, &hit, &n));
	TEST_ASSERT(n == 1 && hit.kind == MFS_SNAP_ID_U64 && hit.num == 7 * 5 + 1);

	/* mfs_snap_cache_refresh takes the rebuild off the query path */
	m->bi[6] = 2000.0f;
	uint32_t six = 6;
	in.item_rows = &six;
	in.n_item_rows = 1;
	TEST_OK(publish_in_child(dir, m, &in, 3));
	uint64_t seq = 0;
	int refreshed = 0;
	TEST_OK(mfs_snap_cache_refresh(s2, &seq, &refreshed));
	TEST_ASSERT(seq == 3 && refreshed == 1);
	TEST_OK(mfs_snap_cache_refresh(s2, &seq, &refreshed));
	TEST_ASSERT(seq == 3 && refreshed == 0);
	bad = same_as_oracle(s, m, 0, 50, &st);
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT(st.refreshed == 0 && st.seq == 3);
	TEST_OK(mfs_snap_topk(s, &u0, 1, &hit, &n));
	TEST_ASSERT(n == 1 && hit.num == 7 * 6 + 1);
	mfs_snap_close(s);
	mfs_snap_close(s2);
	mfs_model_free(m);
}

/* ---- staleness ---------------------------------------------------------------------------- */
static int64_t realtime_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_staleness(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(2);
	add_users(m, 1);
	add_items(m, 3);
	mfs_snap_info_t in = info_default();
	TEST_OK(publish(dir, m, &in, NULL));
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	uint64_t seq = 0;
	int64_t age = -1;
	TEST_OK(mfs_snap_staleness(s, &seq, &age));
	TEST_EQ_INT(seq, 1);
	TEST_ASSERT_MSG(age >= 0 && age < 5000, "age %lld ms", (long long)age);
	struct timespec ts = {0, 120 * 1000000L};
	nanosleep(&ts, NULL);
	int64_t age2 = -1;
	TEST_OK(mfs_snap_staleness(s, NULL, &age2));
	TEST_ASSERT_MSG(age2 >= age + 100, "age %lld then %lld ms", (long long)age, (long long)age2);
	mfs_snap_meta_t meta;
	TEST_OK(mfs_snap_get_meta(s, &meta));
	/* The new snapshot was written after t0, so its age is at most the time since t0. Comparing it with
	 * age2 instead failed under ASan, where the forked writer's exit (leak check) took longer than the
	 * 120 ms sleep. */
	int64_t t0 = realtime_ms();
	TEST_OK(publish_in_child(dir, m, &in, 2));
	TEST_OK(mfs_snap_staleness(s, &seq, &age));
	int64_t since = realtime_ms() - t0;
	TEST_EQ_INT(seq, 2);
	TEST_ASSERT_MSG(age >= 0 && age <= since + 1, "the new snapshot is %lld ms old, written at most %lld ms ago",
	                (long long)age, (long long)since);
	TEST_OK(mfs_snap_staleness(s, NULL, NULL));
	TEST_EQ_INT(mfs_snap_staleness(NULL, &seq, &age), MFS_EINVAL);
	mfs_snap_close(s);
	mfs_model_free(m);
}

/* ---- stale readers ---------------------------------------------------------------------------- */
/* A reader process killed while holding its slot: the slot is cleared by mfs_snap_reader_check. */
static void test_reader_check(void)
{
	const char *dir = test_tmpdir();
	mfs_model_t *m = model_new(2);
	add_users(m, 1);
	add_items(m, 3);
	mfs_snap_info_t in = info_default();
	TEST_OK(publish(dir, m, &in, NULL));
	int pfd[2];
	TEST_OK(pipe(pfd));
	fflush(NULL);
	pid_t pid = fork(); /* before this process opens the env: the child opens its own */
	if (pid == 0) {
		mfs_snap_t *c = NULL;
		char ok = mfs_snap_open(dir, &c, errbuf, sizeof errbuf) == 0 ? 'y' : 'n';
		if (write(pfd[1], &ok, 1) != 1)
			_exit(1);
		pause(); /* holds its reader slot until killed */
		_exit(0);
	}
	char ok = 0;
	TEST_ASSERT(pid > 0 && read(pfd[0], &ok, 1) == 1 && ok == 'y');
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	int dead = -1;
	if (s) {
		TEST_OK(mfs_snap_reader_check(s, &dead));
		TEST_EQ_INT(dead, 0); /* the child is alive */
	}
	kill(pid, SIGKILL);
	int status;
	waitpid(pid, &status, 0);
	if (s) {
		TEST_OK(mfs_snap_reader_check(s, &dead));
		TEST_ASSERT_MSG(dead == 1, "dead slots cleared: %d", dead);
		TEST_OK(mfs_snap_reader_check(s, &dead));
		TEST_EQ_INT(dead, 0);
	}
	close(pfd[0]);
	close(pfd[1]);
	mfs_snap_close(s);
	mfs_model_free(m);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	char root[512], cmd[600];
	snprintf(root, sizeof root, "%s", test_tmpdir());
	setenv("TMPDIR", root, 1);
	TEST_RUN(test_topk_gauss);
	TEST_RUN(test_topk_planted);
	TEST_RUN(test_topk_ties);
	TEST_RUN(test_topk_extreme);
	TEST_RUN(test_topk_tiny);
	TEST_RUN(test_topk_k1000);
	TEST_RUN(test_topk_errors);
	TEST_RUN(test_cache_refresh);
	TEST_RUN(test_staleness);
	TEST_RUN(test_reader_check);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return TEST_REPORT();
}
