/* model.c - the host copy of the model: biases, factors, global mean; growth by doubling.
 *
 * DESIGN: factor arrays are capacity x k floats, page-aligned, and double when full, so
 * adding a row is amortized O(k). Each array is a mapping of its own that grows with mremap:
 * the kernel moves page-table entries, not bytes, so doubling a table neither copies it nor
 * faults its pages in again (with aligned_alloc + memcpy, 2 M -> 4 M users at k = 128 held the
 * learner's rows phase for 6.7 s on the 2-core VM; docs/BENCHMARKS.md). A row's initial factors
 * depend only on (seed, entity, row), never on timing, so replaying the same stream gives the
 * same model.
 */
#define _GNU_SOURCE /* mremap */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"
#include "common/rng.h"
#include "model_store/admit.h"
#include "model_store/life.h"
#include "model_store/store.h"

static size_t page_round(size_t bytes)
{
	const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return bytes ? (bytes + pg - 1) / pg * pg : pg;
}

/* A table of new_bytes holding the old one's old_bytes (zeros after them). NULL when out of
 * memory, the old table intact. */
static void *table_grow(void *old, size_t old_bytes, size_t new_bytes)
{
#if defined(__SANITIZE_THREAD__)
	/* ThreadSanitizer does not follow mremap (the moved pages keep the shadow of whatever was
	 * mapped there before, and it reports races against that): a copy under TSan builds */
	void *p = mmap(NULL, page_round(new_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED && old) {
		memcpy(p, old, old_bytes);
		munmap(old, page_round(old_bytes));
	}
#else
	void *p = old ? mremap(old, page_round(old_bytes), page_round(new_bytes), MREMAP_MAYMOVE)
	              : mmap(NULL, page_round(new_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
#endif
	if (p == MAP_FAILED)
		return NULL;
#ifdef MADV_HUGEPAGE
	/* 2 MiB pages where the kernel has them for the asking (transparent_hugepage=madvise, the
	 * usual default): new rows fill fresh pages, and on a stream of new ids a 4 KiB page fault
	 * every 8 rows of k = 128 was a fifth of the time spent giving ids rows (bench_rows) */
	if (new_bytes >= (2u << 20))
		(void)madvise(p, page_round(new_bytes), MADV_HUGEPAGE);
#endif
	return p;
}

static void table_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, page_round(bytes));
}

int mfs_model_init(const mfs_model_conf_t *conf, mfs_model_t **out)
{
	if (!conf || conf->k < 1 || conf->k > 4096 || !(conf->init_scale >= 0))
		return MFS_EINVAL;
	mfs_model_t *m = calloc(1, sizeof *m);
	if (!m)
		return ENOMEM;
	m->k = conf->k;
	m->init_scale = conf->init_scale;
	m->engine_init_from[0] = m->engine_init_from[1] = MFS_ROW_NONE;
	m->seed = conf->seed;
	for (int e = 0; e < 2; e++)
		if (!(m->life[e] = calloc(1, sizeof *m->life[e]))) {
			mfs_model_free(m);
			return ENOMEM;
		} else {
			mfs_rng_seed(&m->life[e]->rng, mfs_mix64(conf->seed ^ 0x6c696665ull, (uint64_t)e));
		}
	if (mfs_idmap_init(&m->users) || mfs_idmap_init(&m->items) || mfs_model_reserve(m, 1024, 1024)) {
		mfs_model_free(m);
		return ENOMEM;
	}
	*out = m;
	return 0;
}

int mfs_model_prepare_ahead(mfs_model_t *m)
{
	int rc = mfs_idmap_prepare_ahead(m->users);
	return rc ? rc : mfs_idmap_prepare_ahead(m->items);
}

void mfs_model_free(mfs_model_t *m)
{
	if (!m)
		return;
	const size_t k = (size_t)m->k * sizeof(float);
	table_free(m->P, (size_t)m->cap_users * k);
	table_free(m->Q, (size_t)m->cap_items * k);
	table_free(m->bu, (size_t)m->cap_users * sizeof(float));
	table_free(m->bi, (size_t)m->cap_items * sizeof(float));
	for (int e = 0; e < 2; e++) {
		const size_t cap = e ? m->cap_items : m->cap_users;
		table_free(m->gen[e], cap * sizeof *m->gen[e]);
		table_free(m->seen[e], cap * sizeof *m->seen[e]);
		table_free(m->stamp[e], cap * sizeof *m->stamp[e]);
	}
	mfs_life_release(m);
	mfs_idmap_free(m->users);
	mfs_idmap_free(m->items);
	for (int e = 0; e < 2; e++)
		if (m->admit[e]) {
			mfs_admit_free(m->admit[e]);
			free(m->admit[e]);
		}
	free(m);
}

/* One per-row array of `es` bytes an element from cap to nc rows (created at nc rows when
 * *p is NULL and cap rows were never allocated for it). */
static int grow_array(void **p, size_t es, uint32_t cap, uint64_t nc)
{
	void *np = table_grow(*p, *p ? (size_t)cap * es : 0, (size_t)nc * es);
	if (!np)
		return ENOMEM;
	*p = np;
	return 0;
}

/* Grow one entity's arrays to at least `need` rows (doubling); with need <= cap, only create
 * the lifecycle arrays that tracking needs and that do not exist yet. */
static int grow_entity(mfs_model_t *m, int ent, uint32_t need)
{
	float **F = ent ? &m->Q : &m->P, **b = ent ? &m->bi : &m->bu;
	uint32_t *cap = ent ? &m->cap_items : &m->cap_users;
	if (need <= *cap && *F && m->gen[ent] && (!m->track || (m->seen[ent] && m->stamp[ent])))
		return 0;
	uint64_t nc = *cap ? *cap : 1024;
	while (nc < need)
		nc *= 2;
	if (nc > MFS_ROW_NONE)
		nc = MFS_ROW_NONE;
	size_t k = (size_t)m->k;
	/* the per-row lifecycle arrays first (out of memory part way leaves some of them larger
	 * than cap: room never used, and the service stops on ENOMEM anyway) */
	void *arr[3] = {m->gen[ent], m->seen[ent], m->stamp[ent]};
	const size_t es[3] = {sizeof *m->gen[ent], sizeof *m->seen[ent], sizeof *m->stamp[ent]};
	for (int a = 0; a < 3; a++) {
		if (a > 0 && !m->track)
			break;
		if (arr[a] && nc == *cap)
			continue;
		if (grow_array(&arr[a], es[a], *cap, nc))
			return ENOMEM;
		m->gen[ent] = arr[0];
		m->seen[ent] = arr[1];
		m->stamp[ent] = arr[2];
	}
	if (nc == *cap && *F)
		return 0;
	float *nb = table_grow(*b, (size_t)*cap * sizeof(float), (size_t)nc * sizeof(float));
	if (!nb)
		return ENOMEM;
	*b = nb;
	float *nf = table_grow(*F, (size_t)*cap * k * sizeof(float), (size_t)nc * k * sizeof(float));
	if (!nf)
		return ENOMEM;
	*F = nf;
	*cap = (uint32_t)nc;
	return 0;
}

int mfs_model_reserve(mfs_model_t *m, uint32_t users, uint32_t items)
{
	int rc = grow_entity(m, 0, users);
	if (!rc)
		rc = grow_entity(m, 1, items);
	return rc;
}

void mfs_model_init_row(const mfs_model_t *m, int ent, uint32_t row, float *out)
{
	mfs_rng_t r;
	/* a reused row (gen > 0): its own values, not its last id's starting point */
	const uint16_t gen = m->gen[ent] && row < (ent ? m->cap_items : m->cap_users) ? m->gen[ent][row] : 0;
	mfs_rng_seed(&r, mfs_row_seed(m->seed, ent, row, gen));
	/* float Box-Muller pairs: new ids' rows were ~20 % of the learner on a stream of new ids
	 * with one double normal per factor, 3x the cost */
	const float sd = (float)(m->init_scale / sqrt((double)m->k));
	for (int j = 0; j < m->k; j += 2) {
		float z0, z1;
		mfs_rng_normal2f(&r, &z0, &z1);
		out[j] = sd * z0;
		if (j + 1 < m->k)
			out[j + 1] = sd * z1;
	}
}

/* Mark row seen now (tracking). */
static inline void touch(mfs_model_t *m, int ent, uint32_t row)
{
	m->seen[ent][row] = m->clock_s;
	m->stamp[ent][row] = m->batch_stamp;
}

void mfs_model_init_fresh(mfs_model_t *m, int ent, uint32_t row)
{
	/* only this side's fields are read: the other side's thread may be growing its tables
	 * (serve/rows.c runs the two sides at once) */
	if (ent) {
		mfs_model_init_row(m, 1, row, m->Q + (size_t)row * (size_t)m->k);
		m->bi[row] = 0.0f;
	} else {
		mfs_model_init_row(m, 0, row, m->P + (size_t)row * (size_t)m->k);
		m->bu[row] = 0.0f;
	}
}

uint32_t mfs_model_find_h(const mfs_model_t *m, int ent, const mfs_id_t *id, uint64_t h)
{
	return mfs_idmap_find_h(ent ? m->items : m->users, id, h);
}

/* The row of id (new ids get one); a new row's values are written unless fresh is given
 * (*fresh = 1 then: the caller writes them, mfs_model_init_fresh). */
static int entity_row_h(mfs_model_t *m, int ent, const mfs_id_t *id, uint64_t h, uint32_t *row, int *fresh)
{
	mfs_idmap_t *map = ent ? m->items : m->users;
	const uint32_t max = ent ? m->max_items : m->max_users;
	const uint32_t n = mfs_idmap_size(map);
	uint32_t r = mfs_idmap_find_h(map, id, h);
	if (r != MFS_ROW_NONE) {
		if (!m->track) {
			*row = r;
			return 0;
		}
		/* an expired row the sweep has not reached: freed now, the id starts fresh (it was
		 * not seen in this batch, so no event of it is in this batch's rows yet) */
		if (!(m->ttl_s && m->clock_s > m->ttl_s && m->seen[ent][r] < m->clock_s - m->ttl_s)) {
			touch(m, ent, r);
			*row = r;
			return 0;
		}
		int rc = mfs_life_free_row(m, ent, r, MFS_FREED_EXPIRED);
		if (rc)
			return rc;
	}
	*row = MFS_ROW_NONE;
	const mfs_life_t *L = m->life[ent];
	if (max && n >= max && !L->n_free && !m->evict) /* full: known ids only */
		return 0;
	if (m->admit[ent] && mfs_admit_see(m->admit[ent], h) < m->admit_after) { /* not seen often enough yet */
		m->admit[ent]->refused++;
		return 0;
	}
	uint32_t nr = mfs_life_pop_free(m, ent);
	if (nr == MFS_ROW_NONE && (!max || n < max))
		nr = n;
	if (nr == MFS_ROW_NONE && (nr = mfs_life_evict(m, ent)) == MFS_ROW_NONE)
		return 0; /* full, and no row to evict: dropped */
	int rc;
	if (nr == n && (rc = grow_entity(m, ent, nr + 1)))
		return rc;
	if ((rc = mfs_idmap_insert_h(map, id, h, nr))) {
		if (nr < n) { /* back on the free list */
			mfs_life_t *Lw = m->life[ent];
			Lw->free_rows[Lw->n_free++] = nr;
		}
		return rc;
	}
	if (nr < n && (rc = mfs_life_reused(m, ent, nr)))
		return rc;
	if (nr == n && nr >= m->engine_init_from[ent]) /* the engine draws its values (store.h) */
		(ent ? m->bi : m->bu)[nr] = 0.0f;
	else if (fresh)
		*fresh = 1;
	else
		mfs_model_init_fresh(m, ent, nr);
	if (m->track)
		touch(m, ent, nr);
	if (nr == n) {
		if (ent)
			m->n_items = nr + 1;
		else
			m->n_users = nr + 1;
	}
	*row = nr;
	return 0;
}

int mfs_model_add_many_ok(const mfs_model_t *m, int ent)
{
	return !m->track && !(ent ? m->max_items : m->max_users) && !m->admit[ent] && !m->life[ent]->n_free;
}

int mfs_model_add_begin(mfs_model_t *m, int ent, mfs_idmap_add_t *a)
{
	if (!mfs_model_add_many_ok(m, ent))
		return MFS_EINVAL;
	int rc = mfs_idmap_add_begin(ent ? m->items : m->users, a);
	return rc ? rc : a->n ? grow_entity(m, ent, a->n0 + (uint32_t)a->n) : 0;
}

uint32_t mfs_model_add_number(mfs_model_t *m, int ent, mfs_idmap_add_t *a, uint32_t *rows)
{
	const uint32_t nn = mfs_idmap_add_number(ent ? m->items : m->users, a, rows), end = a->n0 + nn;
	float *b = ent ? m->bi : m->bu;
	for (uint32_t r = a->n0 > m->engine_init_from[ent] ? a->n0 : m->engine_init_from[ent]; r < end; r++)
		b[r] = 0.0f; /* the engine draws its values (store.h) */
	if (ent)
		m->n_items = end;
	else
		m->n_users = end;
	return nn;
}

int mfs_model_restore_row(mfs_model_t *m, int ent, const mfs_id_t *id, uint32_t *row)
{
	/* no admission, eviction or bound: the snapshot's rows are the model's */
	struct mfs_admit *admit = m->admit[ent];
	const uint32_t max_u = m->max_users, max_i = m->max_items;
	m->admit[ent] = NULL;
	m->max_users = m->max_items = 0;
	int rc = entity_row_h(m, ent, id, mfs_idmap_hash(id), row, NULL);
	m->admit[ent] = admit;
	m->max_users = max_u;
	m->max_items = max_i;
	return rc;
}

uint32_t mfs_model_live(const mfs_model_t *m, int ent) { return mfs_idmap_live(ent ? m->items : m->users); }

int mfs_model_admit(mfs_model_t *m, unsigned n, size_t width)
{
	m->admit_after = n;
	for (int e = 0; e < 2 && n >= 2; e++) {
		if (m->admit[e])
			continue;
		if (!(m->admit[e] = malloc(sizeof *m->admit[e])) || mfs_admit_init(m->admit[e], width)) {
			free(m->admit[e]);
			m->admit[e] = NULL;
			return ENOMEM;
		}
	}
	return 0;
}

uint64_t mfs_model_refused(const mfs_model_t *m, int ent)
{
	return m->admit[ent] ? m->admit[ent]->refused : 0;
}

static int entity_row(mfs_model_t *m, int ent, const mfs_id_t *id, uint32_t *row)
{
	return entity_row_h(m, ent, id, mfs_idmap_hash(id), row, NULL);
}

int mfs_model_row_h(mfs_model_t *m, int ent, const mfs_id_t *id, uint64_t h, uint32_t *row, int *fresh)
{
	*fresh = 0;
	return entity_row_h(m, ent, id, h, row, fresh);
}

int mfs_model_user_row(mfs_model_t *m, const mfs_id_t *id, uint32_t *row) { return entity_row(m, 0, id, row); }
int mfs_model_item_row(mfs_model_t *m, const mfs_id_t *id, uint32_t *row) { return entity_row(m, 1, id, row); }

#define ROWS_AHEAD 8 /* ids hashed and prefetched ahead of the one being resolved */

int mfs_model_rows(mfs_model_t *m, int ent, const mfs_id_t *ids, size_t stride, size_t n, uint32_t *rows)
{
	const mfs_idmap_t *map = ent ? m->items : m->users;
	const char *base = (const char *)ids;
	uint64_t h[ROWS_AHEAD];
	for (size_t j = 0; j < n && j < ROWS_AHEAD; j++) {
		h[j] = mfs_idmap_hash((const mfs_id_t *)(base + j * stride));
		mfs_idmap_prefetch(map, h[j]);
	}
	for (size_t j = 0; j < n; j++) {
		const uint64_t hj = h[j % ROWS_AHEAD];
		if (j + ROWS_AHEAD < n) {
			h[j % ROWS_AHEAD] = mfs_idmap_hash((const mfs_id_t *)(base + (j + ROWS_AHEAD) * stride));
			mfs_idmap_prefetch(map, h[j % ROWS_AHEAD]);
		}
		int rc = entity_row_h(m, ent, (const mfs_id_t *)(base + j * stride), hj, &rows[j], NULL);
		if (rc)
			return rc;
	}
	return 0;
}

void mfs_model_observe(mfs_model_t *m, double rating_sum, uint64_t count)
{
	m->mu_sum += rating_sum;
	m->mu_count += count;
	if (m->mu_count)
		m->mu = m->mu_sum / (double)m->mu_count;
}

/* a[perm[r]] = a[r] for r < n, elements of es bytes, in place: each cycle of perm is walked
 * once, carrying one element (tmp: 2 x es bytes; done: n bits, zeroed here). O(n x es) bytes
 * moved and no second copy of the table, which for the factors can be most of the memory. */
static void permute_in_place(void *a, size_t es, uint32_t n, const uint32_t *perm, uint64_t *done, unsigned char *tmp)
{
	unsigned char *base = a, *carry = tmp, *swap = tmp + es;
	memset(done, 0, ((size_t)n + 63) / 64 * sizeof *done);
	for (uint32_t s = 0; s < n; s++) {
		if (done[s / 64] >> (s % 64) & 1)
			continue;
		memcpy(carry, base + (size_t)s * es, es);
		for (uint32_t j = perm[s];; j = perm[j]) {
			done[j / 64] |= 1ull << (j % 64);
			if (j == s) {
				memcpy(base + (size_t)s * es, carry, es);
				break;
			}
			memcpy(swap, base + (size_t)j * es, es);
			memcpy(base + (size_t)j * es, carry, es);
			memcpy(carry, swap, es);
		}
	}
}

int mfs_model_permute_rows(mfs_model_t *m, int ent, const uint32_t *perm)
{
	mfs_idmap_t *map = ent ? m->items : m->users;
	const uint32_t n = mfs_idmap_size(map);
	const size_t row_bytes = (size_t)m->k * sizeof(float);
	assert(n == (ent ? m->n_items : m->n_users));
	uint64_t *done = calloc(((size_t)n + 63) / 64 + 1, sizeof *done);
	unsigned char *tmp = malloc(2 * row_bytes);
	int rc = done && tmp ? 0 : ENOMEM;
	for (uint32_t r = 0; !rc && r < n; r++) { /* a bijection: every target in range, none twice */
		if (perm[r] >= n || (done[perm[r] / 64] >> (perm[r] % 64) & 1))
			rc = MFS_EINVAL;
		else
			done[perm[r] / 64] |= 1ull << (perm[r] % 64);
	}
	/* the one step that can fail (it allocates) first: the model is unchanged on error */
	if (rc || (rc = mfs_idmap_permute(map, perm)))
		goto out;
	mfs_life_permute(m, ent, perm);
	float *F = ent ? m->Q : m->P, *b = ent ? m->bi : m->bu;
	permute_in_place(F, row_bytes, n, perm, done, tmp);
	permute_in_place(b, sizeof *b, n, perm, done, tmp);
	permute_in_place(m->gen[ent], sizeof *m->gen[ent], n, perm, done, tmp);
	if (m->track) {
		permute_in_place(m->seen[ent], sizeof *m->seen[ent], n, perm, done, tmp);
		permute_in_place(m->stamp[ent], sizeof *m->stamp[ent], n, perm, done, tmp);
	}
out:
	free(done);
	free(tmp);
	return rc;
}

void mfs_model_draw_order(const mfs_model_t *m, int ent, uint32_t *perm)
{
	const uint32_t n = mfs_idmap_size(ent ? m->items : m->users);
	mfs_rng_t g;
	mfs_rng_seed(&g, mfs_mix64(m->seed ^ 0x6f72646572ull /* "order" */, (uint64_t)ent));
	for (uint32_t r = 0; r < n; r++)
		perm[r] = r;
	for (uint32_t r = n; r > 1; r--) { /* Fisher-Yates */
		const uint32_t j = (uint32_t)mfs_rng_below(&g, r), t = perm[r - 1];
		perm[r - 1] = perm[j];
		perm[j] = t;
	}
}
