/* snap_topk.c - libmfsnap's top-K: the k items with the highest score
 *     score(u, i) = (float)(((mu + b_u) + b_i) + sum_j p_j q_ij)      (double, j in order)
 * best first, equal scores to the smaller key, minus an exclude list.
 *
 * DESIGN
 * Three paths, one answer. Every path returns the same items in the same order with the
 * same float32 scores as scoring every item with the formula above (tests/unit/
 * test_reader_topk.c checks them against a brute-force oracle):
 *   int8 (default)  scan the cache's int8 copy (snap_dot_i8), keep the items whose score
 *                   can still reach the top (below), rescore those exactly from the fp32 copy;
 *   exact           score every item of the cache exactly (snap_dot_exact16);
 *   nocache         score every row straight from LMDB in the call's txn (the reference).
 *
 * Why the int8 path is exact. For item i the scan gets an approximation a_i of the dot
 * product with a proven error bound e_i:
 *   q_ij = s_i c_ij + r_ij,  |r_ij| <= s_i / 2       (c: int8, s: row scale; snap_quantize_row)
 *   p_j  = t u_j + g_j                                 (u: int16, t: user scale, G = sum |g_j|)
 *   p.q_i = s_i t D_i + s_i sum_j g_j c_ij + sum_j p_j r_ij,   D_i = sum_j u_j c_ij (exact int32)
 *   |p.q_i - s_i t D_i| <= s_i (127 G + ||p||_1 / 2) = s_i A = e_i.
 * So lo_i <= score_i <= up_i with lo/up = base + b_i + s_i t D_i -/+ (e_i + slack), where the
 * slack (2^-16 of the magnitudes, plus 2^-120) swamps the float rounding of computing them,
 * the rounding of the double j-order sum (<= k 2^-53 ||p||_1 127 s_i) and of the final
 * float32 score (snap_bounds_i8). Scales are at least SNAP_SCALE_MIN, so s_i t is a normal
 * float. Let L be the kk-th largest lo over all items (a min-heap of kk lower bounds kept
 * during the scan). At least kk items have score >= L, and any item with up_i < L scores
 * strictly below all of them, even after float32 rounding (the slack keeps a gap of more
 * than one ulp), so it cannot be in the top kk. The items with up_i >= L (the candidates)
 * are rescored exactly and ranked: that is the exact answer. The number of candidates
 * adapts to the data (how close the scores near the cut are, relative to e_i); it is never
 * wrong, only slower when many items tie within the bound (at worst all n are rescored).
 * With |q| or |p| beyond 1e15 (the float bounds could overflow) the exact path is used.
 * A block of SNAP_BLOCK items whose upper bounds all lie below L is skipped after the
 * bound computation: past the first blocks, almost all are.
 *
 * Excludes. The E exclude ids present in the snapshot are found (binary search over the
 * cache's keys, or mdb_get); the selection keeps the top kk = k + E, then drops them. So the
 * scan never tests membership per item.
 *
 * Transactions. The user row and the cache come from the same txn (same seq); then the txn
 * is reset and the scan runs on the cache alone (short read txns). A call that finds the
 * cache stale rebuilds it first, holding its txn for that scan (snap_cache.c).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "snapshots/reader/mfs_snap_int.h"
#include "snapshots/snap_format.h"

/* retries when another thread's rebuild overtakes our txn (then: the no-cache path) */
#define SNAP_ACQUIRE_TRIES 8
/* beyond this the float bounds of the int8 path could overflow: use the exact path */
#define SNAP_INT8_ABSMAX 1e15f

/* ---- selection heaps --------------------------------------------------------------------- */
/* a ranks before b: higher score, then the smaller key (= smaller idx) */
static int cand_better(const struct snap_cand *a, const struct snap_cand *b)
{
	if (a->score != b->score)
		return a->score > b->score;
	return a->idx < b->idx;
}

/* The heap keeps the worst candidate at h[0]. */
static void heap_sift_down(struct snap_cand *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, w = i;
		if (l < n && cand_better(&h[w], &h[l]))
			w = l;
		if (l + 1 < n && cand_better(&h[w], &h[l + 1]))
			w = l + 1;
		if (w == i)
			return;
		struct snap_cand t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

static void heap_sift_up(struct snap_cand *h, size_t i)
{
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!cand_better(&h[p], &h[i]))
			return;
		struct snap_cand t = h[i];
		h[i] = h[p];
		h[p] = t;
		i = p;
	}
}

/* Offer c to the heap of the cap best. */
static void heap_offer(struct snap_cand *h, size_t *n, size_t cap, const struct snap_cand *c)
{
	if (*n < cap) {
		h[*n] = *c;
		heap_sift_up(h, (*n)++);
	} else if (cap > 0 && cand_better(c, &h[0])) {
		h[0] = *c;
		heap_sift_down(h, *n, 0);
	}
}

/* Sort the heap in place, best first. */
static void heap_sort(struct snap_cand *h, size_t n)
{
	for (size_t left = n; left > 1; left--) {
		struct snap_cand t = h[0];
		h[0] = h[left - 1];
		h[left - 1] = t;
		heap_sift_down(h, left - 1, 0);
	}
}

/* Min-heap of floats holding the cap largest values offered (the int8 scan's lower bounds). */
static void lheap_sift_down(float *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, w = i;
		if (l < n && h[l] < h[w])
			w = l;
		if (l + 1 < n && h[l + 1] < h[w])
			w = l + 1;
		if (w == i)
			return;
		float t = h[i];
		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

static void lheap_push(float *h, size_t n, float v)
{
	size_t i = n;
	h[i] = v;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (h[p] <= h[i])
			return;
		float t = h[i];
		h[i] = h[p];
		h[p] = t;
		i = p;
	}
}

static int size_cmp(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	return x < y ? -1 : x > y;
}

/* LMDB's default key order. */
static int xkey_cmp(const void *a, const void *b)
{
	const struct snap_xkey *x = a, *y = b;
	int r = memcmp(x->key, y->key, x->len < y->len ? x->len : y->len);
	return r ? r : x->len < y->len ? -1 : x->len > y->len;
}

static float score_of(double base, float bias, double dot)
{
	return (float)((base + (double)bias) + dot);
}

/* Fill a hit from an encoded key. @return 0 or MFS_EFORMAT. */
static int hit_fill(mfs_snap_hit_t *hit, float score, const unsigned char *key, size_t len)
{
	const char *str;
	size_t slen;
	memset(hit, 0, sizeof *hit);
	hit->score = score;
	int tag = mfs_snap_key_decode(key, len, &hit->num, &str, &slen);
	if (tag == MFS_SNAP_KEY_TAG_STR) {
		hit->kind = MFS_SNAP_ID_STR;
		hit->len = slen;
		memcpy(hit->str, str, slen);
		hit->str[slen] = '\0';
	} else if (tag == MFS_SNAP_KEY_TAG_U64) {
		hit->kind = MFS_SNAP_ID_U64;
	} else {
		return MFS_EFORMAT;
	}
	return 0;
}

/* ---- the exact path ------------------------------------------------------------------------ */
/* Score every item of the cache exactly into the heap of the kk best. */
static void scan_exact(const struct snap_cache *c, const float *p, double base, struct snap_cand *h, size_t *nh,
                       size_t kk)
{
	const uint32_t k = c->c_k;
	const float *f = c->c_f32;
	size_t i = 0;
	double d[16];
	for (; i + 16 <= c->c_n; i += 16) {
		snap_dot_exact16(p, f + i * k, k, d);
		for (size_t b = 0; b < 16; b++) {
			struct snap_cand cd = {score_of(base, c->c_bias[i + b], d[b]), i + b, NULL, 0};
			heap_offer(h, nh, kk, &cd);
		}
	}
	for (; i + 4 <= c->c_n; i += 4) {
		const float *q = f + i * k;
		snap_dot_exact4(p, q, q + k, q + 2 * (size_t)k, q + 3 * (size_t)k, k, d);
		for (size_t b = 0; b < 4; b++) {
			struct snap_cand cd = {score_of(base, c->c_bias[i + b], d[b]), i + b, NULL, 0};
			heap_offer(h, nh, kk, &cd);
		}
	}
	for (; i < c->c_n; i++) {
		struct snap_cand cd = {score_of(base, c->c_bias[i], snap_dot_exact(p, f + i * k, k)), i, NULL, 0};
		heap_offer(h, nh, kk, &cd);
	}
}

/* ---- the int8 path -------------------------------------------------------------------------- */
/* Quantize the user: uq[j] = round(p_j / t), |uq| <= umax, and the bound factor A (DESIGN).
 * @return 0, or -1 when the int8 path cannot be used (the caller takes the exact path). */
static int user_quantize(const float *p, uint32_t k, uint32_t kpad, int16_t *uq, float *t_out, float *a_out)
{
	/* keep every row sum below 2^31: kpad * 127 * umax < 2^31 */
	int64_t umax = ((int64_t)1 << 31) / (127 * (int64_t)kpad) - 1;
	if (umax > 32767)
		umax = 32767;
	if (umax < 127)
		return -1;
	double pmax = 0.0, p1 = 0.0;
	for (uint32_t j = 0; j < k; j++) {
		double a = fabs((double)p[j]);
		pmax = a > pmax ? a : pmax;
		p1 += a;
	}
	memset(uq, 0, kpad * sizeof *uq);
	if (!(pmax <= SNAP_INT8_ABSMAX))
		return -1;
	if (pmax == 0.0) {
		*t_out = 0.0f;
		*a_out = 0.0f;
		return 0;
	}
	double td = pmax / (double)umax;
	float t = (float)td;
	if ((double)t < td)
		t = nextafterf(t, INFINITY);
	if (t < SNAP_SCALE_MIN)
		t = SNAP_SCALE_MIN; /* s * t >= 2^-120: a normal float (G absorbs the coarser steps) */
	double inv = 1.0 / (double)t, g = 0.0;
	for (uint32_t j = 0; j < k; j++) {
		double v = (double)p[j] * inv;
		int64_t r = (int64_t)(v >= 0.0 ? v + 0.5 : v - 0.5);
		r = r > umax ? umax : r < -umax ? -umax : r;
		uq[j] = (int16_t)r;
		g += fabs((double)p[j] - (double)t * (double)r);
	}
	/* |p.q - s t D| <= s (127 G + (1/2 + 2^-44) ||p||_1); the factor covers the rounding of
	 * G and ||p||_1 here */
	double a = (127.0 * g + 0.5 * p1) * (1.0 + 0x1p-20);
	float af = (float)a;
	if ((double)af < a)
		af = nextafterf(af, INFINITY);
	*t_out = t;
	*a_out = af;
	return 0;
}

/* Keep the candidates whose upper bound is >= thr (score holds the upper bound). */
static size_t cands_filter(struct snap_cand *cd, size_t n, float thr)
{
	size_t w = 0;
	for (size_t r = 0; r < n; r++)
		if (cd[r].score >= thr)
			cd[w++] = cd[r];
	return w;
}

/* The int8 scan, then the exact rescoring of the candidates into the heap of the kk best.
 * @return 0, ENOMEM, or -1 (int8 not usable here: take the exact path). */
static int scan_int8(mfs_snap_t *s, const struct snap_cache *c, const float *p, double base, struct snap_cand *h,
                     size_t *nh, size_t kk, uint64_t *n_scored)
{
	const size_t n = c->c_n, kpad = c->c_kpad;
	const uint32_t k = c->c_k;
	if (kk == 0 || kk >= n || !(c->c_absmax <= SNAP_INT8_ABSMAX) || !(c->c_bias_absmax <= 1e30f) ||
	    !(fabs(base) <= 1e30))
		return -1;
	if (snap_grow((void **)&s->sn_uq, &s->sn_uq_cap, kpad, sizeof *s->sn_uq) ||
	    snap_grow((void **)&s->sn_lheap, &s->sn_lheap_cap, kk, sizeof *s->sn_lheap) ||
	    snap_grow((void **)&s->sn_cands, &s->sn_cands_cap, 4 * kk + SNAP_BLOCK, sizeof *s->sn_cands))
		return ENOMEM;
	float t, a;
	if (user_quantize(p, k, (uint32_t)kpad, s->sn_uq, &t, &a))
		return -1;
	const float fbase = (float)base;
	const int16_t *uq = s->sn_uq;
	float *lh = s->sn_lheap;
	size_t nl = 0, nc = 0;
	float thr = -INFINITY;
	int32_t dot[SNAP_BLOCK];
	float up[SNAP_BLOCK], lo[SNAP_BLOCK];
	for (size_t i0 = 0; i0 < n; i0 += SNAP_BLOCK) {
		/* whole blocks (the cache is padded with zero rows); only nb of them are items */
		size_t nb = n - i0 < SNAP_BLOCK ? n - i0 : SNAP_BLOCK;
		snap_dot_i8(c->c_q8 + i0 * kpad, SNAP_BLOCK, kpad, uq, dot);
		if (!snap_bounds_i8(dot, c->c_scale + i0, c->c_bias + i0, fbase, t, a, thr, lo, up))
			continue; /* nothing in this block can reach the top kk */
		if (nc + nb > s->sn_cands_cap) {
			/* drop what the threshold has overtaken; grow if that was not enough */
			nc = cands_filter(s->sn_cands, nc, thr);
			if (nc + nb > s->sn_cands_cap / 2 &&
			    snap_grow((void **)&s->sn_cands, &s->sn_cands_cap, 2 * (nc + nb), sizeof *s->sn_cands))
				return ENOMEM;
		}
		struct snap_cand *cd = s->sn_cands;
		for (size_t b = 0; b < nb; b++) {
			if (up[b] < thr)
				continue;
			cd[nc].score = up[b];
			cd[nc].idx = i0 + b;
			cd[nc].key = NULL;
			cd[nc].key_len = 0;
			nc++;
			if (nl < kk) {
				lheap_push(lh, nl++, lo[b]);
				if (nl == kk)
					thr = lh[0];
			} else if (lo[b] > lh[0]) {
				lh[0] = lo[b];
				lheap_sift_down(lh, nl, 0);
				thr = lh[0];
			}
		}
	}
	nc = cands_filter(s->sn_cands, nc, thr);
	*n_scored = nc;
	/* exact rescoring, four rows in flight */
	const struct snap_cand *cd = s->sn_cands;
	const float *f = c->c_f32;
	size_t r = 0;
	double d[4];
	for (; r + 4 <= nc; r += 4) {
		snap_dot_exact4(p, f + cd[r].idx * k, f + cd[r + 1].idx * k, f + cd[r + 2].idx * k, f + cd[r + 3].idx * k, k,
		                d);
		for (size_t b = 0; b < 4; b++) {
			struct snap_cand x = {score_of(base, c->c_bias[cd[r + b].idx], d[b]), cd[r + b].idx, NULL, 0};
			heap_offer(h, nh, kk, &x);
		}
	}
	for (; r < nc; r++) {
		struct snap_cand x = {score_of(base, c->c_bias[cd[r].idx], snap_dot_exact(p, f + cd[r].idx * k, k)), cd[r].idx,
		                      NULL, 0};
		heap_offer(h, nh, kk, &x);
	}
	return 0;
}

/* ---- the paths -------------------------------------------------------------------------------- */
/* Top-K from the cache (no txn live). */
static int topk_cached(mfs_snap_t *s, const struct snap_cache *c, const float *p, double base, size_t k, size_t nx,
                       unsigned flags, mfs_snap_hit_t *out, size_t *n_out, mfs_snap_topk_stats_t *st)
{
	/* the exclude ids present, as sorted unique indices */
	size_t ne = 0;
	if (nx && snap_grow((void **)&s->sn_excl, &s->sn_excl_cap, nx, sizeof *s->sn_excl))
		return ENOMEM;
	for (size_t x = 0; x < nx; x++) {
		size_t idx = snap_cache_find(c, s->sn_xkeys[x].key, s->sn_xkeys[x].len);
		if (idx != SIZE_MAX)
			s->sn_excl[ne++] = idx;
	}
	if (ne > 1) {
		qsort(s->sn_excl, ne, sizeof *s->sn_excl, size_cmp);
		size_t w = 1;
		for (size_t r = 1; r < ne; r++)
			if (s->sn_excl[r] != s->sn_excl[w - 1])
				s->sn_excl[w++] = s->sn_excl[r];
		ne = w;
	}
	size_t kk = k + ne;
	if (kk > c->c_n || kk < k)
		kk = c->c_n;
	if (snap_grow((void **)&s->sn_heap, &s->sn_heap_cap, kk ? kk : 1, sizeof *s->sn_heap))
		return ENOMEM;
	size_t nh = 0;
	uint64_t scored = c->c_n;
	int path = MFS_SNAP_PATH_EXACT, rc = -1;
	if (!(flags & MFS_SNAP_TOPK_EXACT)) {
		rc = scan_int8(s, c, p, base, s->sn_heap, &nh, kk, &scored);
		if (rc > 0)
			return rc;
		if (rc == 0)
			path = MFS_SNAP_PATH_INT8;
	}
	if (rc != 0) {
		nh = 0;
		scan_exact(c, p, base, s->sn_heap, &nh, kk);
	}
	heap_sort(s->sn_heap, nh);
	size_t n = 0;
	for (size_t r = 0; r < nh && n < k; r++) {
		size_t idx = s->sn_heap[r].idx;
		if (ne && bsearch(&idx, s->sn_excl, ne, sizeof *s->sn_excl, size_cmp))
			continue;
		if ((rc = hit_fill(&out[n], s->sn_heap[r].score, c->c_keys + c->c_key_off[idx],
		                   c->c_key_off[idx + 1] - c->c_key_off[idx])))
			return rc;
		n++;
	}
	*n_out = n;
	if (st) {
		st->n_items = c->c_n;
		st->n_excluded = ne;
		st->n_scored = scored;
		st->path = path;
	}
	return 0;
}

/* Top-K streaming every item row from LMDB in the live txn: the reference path. */
static int topk_nocache(mfs_snap_t *s, const float *p, double base, size_t k, size_t nx, mfs_snap_hit_t *out,
                        size_t *n_out, mfs_snap_topk_stats_t *st)
{
	const mfs_snap_meta_t *m = &s->sn_meta;
	struct snap_env *e = s->sn_env;
	MDB_cursor *cur = NULL;
	MDB_stat mst;
	MDB_val kv, v;
	int rc;
	if ((rc = mdb_stat(s->sn_txn, e->e_items, &mst)))
		return snap_err(rc);
	/* the exclude ids present: sorted, unique, each looked up once */
	size_t ne = 0;
	if (nx > 1) {
		qsort(s->sn_xkeys, nx, sizeof *s->sn_xkeys, xkey_cmp);
		size_t w = 1;
		for (size_t r = 1; r < nx; r++)
			if (xkey_cmp(&s->sn_xkeys[r], &s->sn_xkeys[w - 1]) != 0)
				s->sn_xkeys[w++] = s->sn_xkeys[r];
		nx = w;
	}
	for (size_t x = 0; x < nx; x++) {
		MDB_val xk = {s->sn_xkeys[x].len, s->sn_xkeys[x].key};
		if ((rc = mdb_get(s->sn_txn, e->e_items, &xk, &v)) == 0)
			ne++;
		else if (rc != MDB_NOTFOUND)
			return snap_err(rc);
	}
	size_t n_items = (size_t)mst.ms_entries, kk = k + ne;
	if (kk > n_items || kk < k)
		kk = n_items;
	if (snap_grow((void **)&s->sn_heap, &s->sn_heap_cap, kk ? kk : 1, sizeof *s->sn_heap))
		return ENOMEM;
	struct snap_cand *h = s->sn_heap;
	const size_t row_bytes = mfs_snap_row_bytes(m->k);
	size_t nh = 0, ord = 0;
	if ((rc = mdb_cursor_open(s->sn_txn, e->e_items, &cur)))
		return snap_err(rc);
	for (rc = mdb_cursor_get(cur, &kv, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &kv, &v, MDB_NEXT)) {
		if (v.mv_size != row_bytes) {
			rc = MFS_EFORMAT;
			goto out;
		}
		const unsigned char *q = v.mv_data;
		double acc = 0.0;
		for (uint32_t j = 0; j < m->k; j++)
			acc += (double)p[j] * (double)mfs_snap_get_f32(q + 4 + 4 * (size_t)j);
		struct snap_cand cd = {score_of(base, mfs_snap_get_f32(q), acc), ord++, kv.mv_data, kv.mv_size};
		heap_offer(h, &nh, kk, &cd);
	}
	if (rc != MDB_NOTFOUND) {
		rc = snap_err(rc);
		goto out;
	}
	rc = 0;
	/* keys are copied out before the txn resets and the map may move */
	heap_sort(h, nh);
	size_t n = 0;
	for (size_t r = 0; r < nh && n < k; r++) {
		if (ne && h[r].key_len <= MFS_SNAP_KEY_MAX) {
			struct snap_xkey probe;
			probe.len = h[r].key_len;
			memcpy(probe.key, h[r].key, h[r].key_len);
			if (bsearch(&probe, s->sn_xkeys, nx, sizeof *s->sn_xkeys, xkey_cmp))
				continue;
		}
		if ((rc = hit_fill(&out[n], h[r].score, h[r].key, h[r].key_len)))
			goto out;
		n++;
	}
	*n_out = n;
	if (st) {
		st->n_items = n_items;
		st->n_excluded = ne;
		st->n_scored = n_items;
		st->path = MFS_SNAP_PATH_NOCACHE;
	}
out:
	mdb_cursor_close(cur);
	return rc;
}

/* Append the user's rated items (the user_rated record, in the live txn) to the call's nx
 * exclude keys: *nx grows by their count. No DB or no record: nothing. */
static int seen_keys(mfs_snap_t *s, const mfs_snap_id_t *user, size_t *nx)
{
	MDB_dbi dbi;
	unsigned char key[MFS_SNAP_KEY_MAX];
	MDB_val kv, v;
	if (!snap_rated_dbi(s, &dbi))
		return 0;
	int rc = snap_key(user, key, &kv);
	if (rc)
		return rc;
	rc = mdb_get(s->sn_txn, dbi, &kv, &v);
	if (rc == MDB_NOTFOUND || rc == EINVAL) /* EINVAL: the DBI is newer than this txn */
		return 0;
	if (rc)
		return snap_err(rc);
	const long n = mfs_snap_rated_check(v.mv_data, v.mv_size);
	if (n < 0)
		return MFS_EFORMAT;
	if (n && snap_grow((void **)&s->sn_xkeys, &s->sn_xkeys_cap, *nx + (size_t)n, sizeof *s->sn_xkeys))
		return ENOMEM;
	size_t pos = 4;
	for (long j = 0; j < n; j++) {
		const unsigned char *k;
		size_t len;
		mfs_snap_rated_next(v.mv_data, &pos, &k, &len);
		struct snap_xkey *x = &s->sn_xkeys[(*nx)++];
		x->len = len;
		memcpy(x->key, k, len);
	}
	return 0;
}

/* One attempt: begin, read the user, get the cache of this snapshot, scan. @return EAGAIN
 * (only if !last_try) when another thread's rebuild overtook our txn: try again. */
static int topk_once(mfs_snap_t *s, const mfs_snap_id_t *user, size_t k, size_t nx, unsigned flags, int last_try,
                     mfs_snap_hit_t *out, size_t *n_out, mfs_snap_topk_stats_t *stats)
{
	int rc = snap_begin(s);
	if (rc)
		return rc;
	const mfs_snap_meta_t *m = &s->sn_meta;
	const unsigned char *ru;
	if ((rc = snap_row_find(s, s->sn_env->e_users, user, &ru)) || k == 0)
		goto end;
	/* the user's rated items join the exclude list, from the same snapshot as the row */
	if (!(flags & MFS_SNAP_TOPK_INCLUDE_SEEN) && (rc = seen_keys(s, user, &nx)))
		goto end;
	if (snap_grow((void **)&s->sn_vec, &s->sn_vec_cap, m->k, sizeof *s->sn_vec)) {
		rc = ENOMEM;
		goto end;
	}
	/* decode the user once; every path reads it as floats */
	float *p = s->sn_vec;
	for (uint32_t j = 0; j < m->k; j++)
		p[j] = mfs_snap_get_f32(ru + 4 + 4 * (size_t)j);
	double base = m->mu + (double)mfs_snap_get_f32(ru);
	if (stats)
		stats->seq = m->seq;
	if (flags & MFS_SNAP_TOPK_NOCACHE) {
		rc = topk_nocache(s, p, base, k, nx, out, n_out, stats);
		goto end;
	}
	struct snap_cache *c = NULL;
	int built = 0;
	rc = snap_cache_acquire(s, &c, &built);
	if (rc == EAGAIN && !last_try)
		goto end;
	if (rc == EAGAIN || rc == ENOMEM) {
		/* no cache for this snapshot: answer without one */
		rc = topk_nocache(s, p, base, k, nx, out, n_out, stats);
		goto end;
	}
	if (rc)
		goto end;
	snap_end(s); /* the cache is our own copy: the scan needs no txn */
	if (stats) {
		stats->refreshed = built;
		stats->refresh_ms = built ? c->c_build_ms : 0.0;
	}
	rc = topk_cached(s, c, p, base, k, nx, flags, out, n_out, stats);
	snap_cache_release(s->sn_env, c);
	return rc;
end:
	snap_end(s);
	return rc;
}

int mfs_snap_topk_ex(mfs_snap_t *s, const mfs_snap_id_t *user, size_t k, const mfs_snap_topk_opts_t *opts,
                     mfs_snap_hit_t *out, size_t *n_out, mfs_snap_topk_stats_t *stats)
{
	if (!s || !n_out || (k && !out))
		return MFS_EINVAL;
	*n_out = 0;
	if (stats)
		memset(stats, 0, sizeof *stats);
	unsigned flags = opts ? opts->flags : 0;
	size_t nx = opts ? opts->n_exclude : 0;
	if (nx && !opts->exclude)
		return MFS_EINVAL;
	unsigned char ukey[MFS_SNAP_KEY_MAX];
	MDB_val kv;
	int rc;
	/* reject malformed ids before touching the txn */
	if ((rc = snap_key(user, ukey, &kv)))
		return rc;
	if (nx && snap_grow((void **)&s->sn_xkeys, &s->sn_xkeys_cap, nx, sizeof *s->sn_xkeys))
		return ENOMEM;
	for (size_t x = 0; x < nx; x++) {
		if ((rc = snap_key(&opts->exclude[x], s->sn_xkeys[x].key, &kv)))
			return rc;
		s->sn_xkeys[x].len = kv.mv_size;
	}
	int tries = 0;
	do
		rc = topk_once(s, user, k, nx, flags, tries + 1 == SNAP_ACQUIRE_TRIES, out, n_out, stats);
	while (rc == EAGAIN && ++tries < SNAP_ACQUIRE_TRIES);
	if (rc)
		*n_out = 0;
	return rc;
}

int mfs_snap_topk(mfs_snap_t *s, const mfs_snap_id_t *user, size_t k, mfs_snap_hit_t *out, size_t *n_out)
{
	return mfs_snap_topk_ex(s, user, k, NULL, out, n_out, NULL);
}

int mfs_snap_cache_refresh(mfs_snap_t *s, uint64_t *seq, int *refreshed)
{
	if (!s)
		return MFS_EINVAL;
	for (int tries = 0;; tries++) {
		int rc = snap_begin(s), built = 0;
		if (rc)
			return rc;
		struct snap_cache *c = NULL;
		rc = snap_cache_acquire(s, &c, &built);
		snap_end(s);
		if (rc == EAGAIN && tries + 1 < SNAP_ACQUIRE_TRIES)
			continue;
		if (rc)
			return rc == EAGAIN ? MFS_ELMDB : rc;
		if (seq)
			*seq = c->c_seq;
		if (refreshed)
			*refreshed = built;
		snap_cache_release(s->sn_env, c);
		return 0;
	}
}
