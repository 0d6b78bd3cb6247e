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
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"
#include "common/rng.h"
#include "model_store/admit.h"
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
	void *p = old ? mremap(old, page_round(old_bytes), page_round(new_bytes), MREMAP_MAYMOVE)
	              : mmap(NULL, page_round(new_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
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
	m->seed = conf->seed;
	if (mfs_idmap_init(&m->users) || mfs_idmap_init(&m->items) || mfs_model_reserve(m, 1024, 1024)) {
		mfs_model_free(m);
		return ENOMEM;
	}
	*out = m;
	return 0;
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
	mfs_idmap_free(m->users);
	mfs_idmap_free(m->items);
	for (int e = 0; e < 2; e++)
		if (m->admit[e]) {
			mfs_admit_free(m->admit[e]);
			free(m->admit[e]);
		}
	free(m);
}

/* Grow one entity's arrays to at least `need` rows (doubling). */
static int grow_entity(mfs_model_t *m, float **F, float **b, uint32_t *cap, uint32_t need)
{
	if (need <= *cap)
		return 0;
	uint64_t nc = *cap ? *cap : 1024;
	while (nc < need)
		nc *= 2;
	if (nc > MFS_ROW_NONE)
		nc = MFS_ROW_NONE;
	size_t k = (size_t)m->k;
	float *nb = table_grow(*b, (size_t)*cap * sizeof(float), (size_t)nc * sizeof(float));
	if (!nb)
		return ENOMEM;
	*b = nb;
	float *nf = table_grow(*F, (size_t)*cap * k * sizeof(float), (size_t)nc * k * sizeof(float));
	if (!nf) { /* the biases back to the capacity the free path assumes */
		void *back = mremap(nb, page_round((size_t)nc * sizeof(float)), page_round((size_t)*cap * sizeof(float)), 0);
		if (back != MAP_FAILED)
			*b = back;
		return ENOMEM;
	}
	*F = nf;
	*cap = (uint32_t)nc;
	return 0;
}

int mfs_model_reserve(mfs_model_t *m, uint32_t users, uint32_t items)
{
	int rc = grow_entity(m, &m->P, &m->bu, &m->cap_users, users);
	if (!rc)
		rc = grow_entity(m, &m->Q, &m->bi, &m->cap_items, items);
	return rc;
}

void mfs_model_init_row(const mfs_model_t *m, int ent, uint32_t row, float *out)
{
	mfs_rng_t r;
	mfs_rng_seed(&r, mfs_mix64(m->seed ^ (0x5851F42D4C957F2Dull * (uint64_t)(ent + 1)), row));
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

static int entity_row_h(mfs_model_t *m, int ent, const mfs_id_t *id, uint64_t h, uint32_t *row)
{
	mfs_idmap_t *map = ent ? m->items : m->users;
	const uint32_t max = ent ? m->max_items : m->max_users;
	if (max && (ent ? m->n_items : m->n_users) >= max) { /* full: known ids only */
		*row = mfs_idmap_find(map, id);
		return 0;
	}
	if (m->admit[ent]) {
		if ((*row = mfs_idmap_find(map, id)) != MFS_ROW_NONE)
			return 0;
		if (mfs_admit_see(m->admit[ent], h) < m->admit_after) { /* new, and not seen often enough yet */
			m->admit[ent]->refused++;
			return 0;
		}
	}
	int added;
	int rc = mfs_idmap_get_or_add_h(map, id, h, row, &added);
	if (rc || !added)
		return rc;
	/* the idmap has handed out row == old count; give it storage and initial values */
	rc = ent ? grow_entity(m, &m->Q, &m->bi, &m->cap_items, *row + 1)
	         : grow_entity(m, &m->P, &m->bu, &m->cap_users, *row + 1);
	if (rc)
		return rc; /* the id keeps its row; a later call retries the allocation */
	float *F = ent ? m->Q : m->P;
	float *b = ent ? m->bi : m->bu;
	mfs_model_init_row(m, ent, *row, F + (size_t)*row * (size_t)m->k);
	b[*row] = 0.0f;
	if (ent)
		m->n_items = *row + 1;
	else
		m->n_users = *row + 1;
	return 0;
}

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
	return entity_row_h(m, ent, id, mfs_idmap_hash(id), row);
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
		int rc = entity_row_h(m, ent, (const mfs_id_t *)(base + j * stride), hj, &rows[j]);
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
