/* life.c - see life.h. */
#include "model_store/life.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"

static mfs_life_t *life_of(const mfs_model_t *m, int ent) { return m->life[ent]; }

int mfs_model_life(mfs_model_t *m, uint32_t ttl_s, int evict)
{
	m->ttl_s = ttl_s;
	m->evict = evict != 0;
	if (!(ttl_s || evict) || m->track)
		return 0;
	m->track = 1;
	/* the arrays follow the tables' capacity from now on (model.c, grow_entity) */
	return mfs_model_reserve(m, m->cap_users, m->cap_items);
}

static int push(uint32_t **a, size_t *n, size_t *cap, uint32_t row)
{
	if (mfs_grow((void **)a, cap, *n + 1, sizeof **a))
		return ENOMEM;
	(*a)[(*n)++] = row;
	return 0;
}

uint32_t mfs_life_pop_free(mfs_model_t *m, int ent)
{
	mfs_life_t *L = life_of(m, ent);
	return L->n_free ? L->free_rows[--L->n_free] : MFS_ROW_NONE;
}

int mfs_life_reused(mfs_model_t *m, int ent, uint32_t row)
{
	mfs_life_t *L = life_of(m, ent);
	int rc = push(&L->reused, &L->n_reused, &L->cap_reused, row);
	/* without stamps (a deletion, no tracking) nothing says the row's last batch was applied */
	if (!rc && (!m->track || m->stamp[ent][row] > m->safe_stamp))
		L->in_flight = 1;
	return rc;
}

/* Copy the id of row into the gone list. */
static int gone_add(mfs_life_t *L, const mfs_id_t *id)
{
	if (mfs_grow((void **)&L->gone, &L->cap_gone, L->n_gone + 1, sizeof *L->gone))
		return ENOMEM;
	struct mfs_gone *g = &L->gone[L->n_gone];
	g->kind = id->kind;
	g->len = id->len;
	if (id->kind == MFS_ID_U64) {
		g->v = id->num;
	} else {
		if (mfs_grow((void **)&L->gone_str, &L->gone_cap, L->gone_len + id->len, 1))
			return ENOMEM;
		memcpy(L->gone_str + L->gone_len, id->str, id->len);
		g->v = L->gone_len;
		L->gone_len += id->len;
	}
	L->n_gone++;
	return 0;
}

int mfs_life_free_row(mfs_model_t *m, int ent, uint32_t row, int why)
{
	mfs_life_t *L = life_of(m, ent);
	mfs_idmap_t *map = ent ? m->items : m->users;
	if (!mfs_idmap_alive(map, row))
		return 0;
	/* room first, so a failure changes nothing */
	uint32_t **list = why == MFS_FREED_DELETED ? &L->pending : &L->free_rows;
	size_t *n = why == MFS_FREED_DELETED ? &L->n_pending : &L->n_free;
	size_t *cap = why == MFS_FREED_DELETED ? &L->cap_pending : &L->cap_free;
	if (mfs_grow((void **)list, cap, *n + 1, sizeof **list))
		return ENOMEM;
	mfs_id_t id = mfs_idmap_key(map, row);
	if (gone_add(L, &id))
		return ENOMEM;
	mfs_idmap_remove(map, row);
	(*list)[(*n)++] = row;
	m->gen[ent][row]++;
	L->freed[why]++;
	L->frees++;
	return 0;
}

uint32_t mfs_life_evict(mfs_model_t *m, int ent)
{
	mfs_life_t *L = life_of(m, ent);
	const mfs_idmap_t *map = ent ? m->items : m->users;
	const uint32_t n = mfs_idmap_size(map);
	const uint32_t *seen = m->seen[ent], *stamp = m->stamp[ent];
	if (!m->track || !n)
		return MFS_ROW_NONE;
	/* best[0]: of rows no batch in flight names (the engine writes such a row beside the batches
	 * it holds); best[1]: of rows named by a batch in flight, not this one (the engine applies
	 * what it holds first: the learner waits). A few more rounds while no sample is of the first
	 * kind (a small table, or one whose rows were all named lately). */
	uint32_t best[2] = {MFS_ROW_NONE, MFS_ROW_NONE}, best_seen[2] = {UINT32_MAX, UINT32_MAX};
	for (int s = 0; s < 4 * MFS_LIFE_SAMPLES && (s < MFS_LIFE_SAMPLES || best[0] == MFS_ROW_NONE); s++) {
		const uint32_t r = (uint32_t)mfs_rng_below(&L->rng, n);
		if (stamp[r] == m->batch_stamp || !mfs_idmap_alive(map, r))
			continue;
		const int t = stamp[r] > m->safe_stamp;
		if (best[t] == MFS_ROW_NONE || seen[r] < best_seen[t]) {
			best[t] = r;
			best_seen[t] = seen[r];
		}
	}
	const uint32_t best_row = best[0] != MFS_ROW_NONE ? best[0] : best[1];
	if (best_row == MFS_ROW_NONE || mfs_life_free_row(m, ent, best_row, MFS_FREED_EVICTED))
		return MFS_ROW_NONE;
	return mfs_life_pop_free(m, ent); /* the row just freed (the list was empty) */
}

static void sweep(mfs_model_t *m, int ent)
{
	mfs_life_t *L = life_of(m, ent);
	const mfs_idmap_t *map = ent ? m->items : m->users;
	const uint32_t n = mfs_idmap_size(map);
	if (!n || m->clock_s <= m->ttl_s)
		return;
	const uint32_t before = m->clock_s - m->ttl_s;
	for (uint32_t s = 0; s < MFS_LIFE_SWEEP && s < n; s++) {
		if (L->sweep >= n)
			L->sweep = 0;
		const uint32_t r = L->sweep++;
		if (m->seen[ent][r] < before && mfs_idmap_alive(map, r) && mfs_life_free_row(m, ent, r, MFS_FREED_EXPIRED))
			return; /* out of memory: the next batch tries again */
	}
}

void mfs_model_begin_batch(mfs_model_t *m, uint32_t clock_s)
{
	m->safe_stamp = m->batch_stamp++; /* every earlier batch applied, unless told otherwise */
	if (clock_s > m->clock_s)
		m->clock_s = clock_s;
	for (int ent = 0; ent < 2; ent++) {
		mfs_life_t *L = life_of(m, ent);
		/* last batch's deletions are reusable now (nothing applied later names them) */
		if (L->n_pending && !mfs_grow((void **)&L->free_rows, &L->cap_free, L->n_free + L->n_pending,
		                              sizeof *L->free_rows)) {
			memcpy(L->free_rows + L->n_free, L->pending, L->n_pending * sizeof *L->pending);
			L->n_free += L->n_pending;
			L->n_pending = 0;
		}
		if (m->ttl_s && m->track)
			sweep(m, ent);
	}
}

int mfs_model_delete(mfs_model_t *m, int ent, const mfs_id_t *id)
{
	mfs_idmap_t *map = ent ? m->items : m->users;
	const uint32_t row = mfs_idmap_find(map, id);
	if (row == MFS_ROW_NONE) {
		life_of(m, ent)->delete_unknown++;
		return 0;
	}
	int rc = mfs_life_free_row(m, ent, row, MFS_FREED_DELETED);
	return rc ? -rc : 1;
}

const uint32_t *mfs_model_reused(const mfs_model_t *m, int ent, size_t *n)
{
	*n = life_of(m, ent)->n_reused;
	return life_of(m, ent)->reused;
}

int mfs_model_reused_in_flight(const mfs_model_t *m, int ent) { return life_of(m, ent)->in_flight; }

void mfs_model_reused_clear(mfs_model_t *m)
{
	m->life[0]->n_reused = m->life[1]->n_reused = 0;
	m->life[0]->in_flight = m->life[1]->in_flight = 0;
}

void mfs_model_applied_through(mfs_model_t *m, uint32_t stamp)
{
	if (stamp < m->safe_stamp)
		m->safe_stamp = stamp;
}

void mfs_model_stamp_rows(mfs_model_t *m, int ent, const uint32_t *rows, size_t n)
{
	if (!m->track)
		return;
	uint32_t *stamp = m->stamp[ent];
	for (size_t j = 0; j < n; j++)
		stamp[rows[j]] = m->batch_stamp;
}

size_t mfs_model_gone_n(const mfs_model_t *m, int ent) { return life_of(m, ent)->n_gone; }

mfs_id_t mfs_model_gone_id(const mfs_model_t *m, int ent, size_t j)
{
	const mfs_life_t *L = life_of(m, ent);
	const struct mfs_gone *g = &L->gone[j];
	mfs_id_t id = {g->kind, g->len, 0, NULL};
	if (g->kind == MFS_ID_U64)
		id.num = g->v;
	else
		id.str = L->gone_str + g->v;
	return id;
}

void mfs_model_gone_clear(mfs_model_t *m)
{
	for (int ent = 0; ent < 2; ent++)
		m->life[ent]->n_gone = m->life[ent]->gone_len = 0;
}

uint64_t mfs_model_freed(const mfs_model_t *m, int ent, int why) { return life_of(m, ent)->freed[why]; }
uint64_t mfs_model_delete_unknown(const mfs_model_t *m, int ent) { return life_of(m, ent)->delete_unknown; }
uint64_t mfs_model_frees(const mfs_model_t *m) { return m->life[0]->frees + m->life[1]->frees; }

void mfs_life_release(mfs_model_t *m)
{
	for (int ent = 0; ent < 2; ent++) {
		mfs_life_t *L = m->life[ent];
		if (!L)
			continue;
		free(L->free_rows);
		free(L->pending);
		free(L->reused);
		free(L->gone);
		free(L->gone_str);
		free(L);
		m->life[ent] = NULL;
	}
}

void mfs_life_permute(mfs_model_t *m, int ent, const uint32_t *perm)
{
	mfs_life_t *L = life_of(m, ent);
	uint32_t *lists[3] = {L->free_rows, L->pending, L->reused};
	const size_t ns[3] = {L->n_free, L->n_pending, L->n_reused};
	for (int l = 0; l < 3; l++)
		for (size_t j = 0; j < ns[l]; j++)
			lists[l][j] = perm[lists[l][j]];
}
