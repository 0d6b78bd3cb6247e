/* snap_rated.c - per-user rings of the items rated lately (see snap_rated.h).
 *
 * DESIGN
 * rt_slot[user row] is 1 + the index of the row's list in rt_lists (0: none since the clear), so
 * an add is one array lookup and, for a list not yet full, an append; a full list is a ring
 * (rl_head is the oldest entry). A list grows by doubling up to max, so a user with one rating
 * costs one small piece of a block, not max entries. Clearing drops the lists and zeroes the
 * slots of the users it held (not the whole index): O(users rated), not O(user rows); it keeps
 * the blocks the round filled for the next one, which on a steady stream spares a page fault
 * per 4 KiB of entries (fresh memory) every round.
 *
 * Shards (mfs_snap_rated_init_shards): user row u belongs to shard u % shards, which holds the
 * index for its rows (u / shards) and their lists. mfs_snap_rated_add_many gives each shard to
 * one task of a pool; a user's ratings all land in one shard, in event order, so the lists are
 * those of one shard; only the order in which users are listed (j) differs: shard by shard.
 */
#include "snapshots/snap_rated.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/grow.h"
#include "common/par.h"
#include "model_store/life.h"
#include "model_store/store.h"

struct rated_ent {
	uint32_t item;
	uint16_t igen;
};

struct rated_list {
	uint32_t rl_user;
	uint16_t rl_ugen;
	uint32_t rl_n, rl_cap, rl_head; /* entries, room, the oldest one once full (a ring) */
	struct rated_ent *rl_e;
};

/* A shard's list entries come from an arena of blocks, bumped and never freed one by one: a
 * list that doubles takes a new piece and leaves the old (a list of n entries leaves at most
 * n of garbage), and a clear frees the blocks. On a stream of new users the
 * malloc/realloc/free per list was the larger part of an add (and of the writer's clear). */
struct rated_block {
	struct rated_block *next;
	size_t used, size; /* entries */
	struct rated_ent e[];
};

struct rated_shard {
	struct rated_block *blocks; /* the one being filled first */
	struct rated_block *spare;  /* blocks the last clear kept for the next lists */
	uint32_t *mine;             /* add_many: the batch's events of this shard */
	size_t mine_cap;
	uint32_t *rt_slot; /* per user row of the shard (row / shards): 1 + index into rt_lists, 0 = none */
	size_t rt_slot_cap;
	struct rated_list *rt_lists;
	size_t rt_n, rt_cap;
	size_t rt_ents; /* entries the arena holds (its blocks' sizes) */
	size_t spare_ents; /* entries the spare blocks hold */
	int rc;         /* add_many: this shard's result */
};

struct mfs_snap_rated {
	uint32_t rt_max;
	uint32_t nsh;
	uint64_t nsh_m; /* UINT64_MAX / nsh + 1 (0 for one shard): u / nsh and u % nsh without a divide */
	struct rated_shard *sh;
	/* add_many's batch, for the pool's tasks */
	const mfs_model_t *m;
	const uint32_t *au, *ai;
	size_t an;
};

/* u / nsh and u % nsh for 32-bit u by two multiplications (Lemire, Kaser and Kurz, "Faster
 * remainder by direct computation", 2019): exact for every 32-bit u and divisor. A divide per
 * event and shard cost more than the rest of a shard's scan. */
__extension__ typedef unsigned __int128 u128; /* (GCC and Clang on 64-bit targets) */

static inline uint32_t fast_div(const mfs_snap_rated_t *r, uint32_t u)
{
	return r->nsh == 1 ? u : (uint32_t)(((u128)r->nsh_m * u) >> 64);
}

static inline uint32_t fast_mod(const mfs_snap_rated_t *r, uint32_t u)
{
	const uint64_t low = r->nsh_m * u;
	return r->nsh == 1 ? 0 : (uint32_t)(((u128)low * r->nsh) >> 64);
}

static uint16_t row_gen(const mfs_model_t *m, int ent, uint32_t row)
{
	const uint32_t cap = ent ? m->cap_items : m->cap_users;
	return m->gen[ent] && row < cap ? m->gen[ent][row] : 0;
}

int mfs_snap_rated_init_shards(uint32_t max, uint32_t shards, mfs_snap_rated_t **out)
{
	*out = NULL;
	if (max < 1 || max > UINT16_MAX || shards < 1 || shards > 1024)
		return MFS_EINVAL;
	mfs_snap_rated_t *r = calloc(1, sizeof *r);
	if (!r || !(r->sh = calloc(shards, sizeof *r->sh))) {
		free(r);
		return ENOMEM;
	}
	r->rt_max = max;
	r->nsh = shards;
	r->nsh_m = UINT64_MAX / shards + 1;
	*out = r;
	return 0;
}

int mfs_snap_rated_init(uint32_t max, mfs_snap_rated_t **out) { return mfs_snap_rated_init_shards(max, 1, out); }

void mfs_snap_rated_clear(mfs_snap_rated_t *r)
{
	if (!r)
		return;
	for (uint32_t x = 0; x < r->nsh; x++) {
		struct rated_shard *h = &r->sh[x];
		for (size_t j = 0; j < h->rt_n; j++)
			h->rt_slot[h->rt_lists[j].rl_user / r->nsh] = 0;
		/* the blocks this round filled are kept for the next (a steady stream needs as many
		 * again, and fresh memory costs a page fault per 4 KiB); those it did not need are
		 * given back */
		while (h->spare) {
			struct rated_block *nx = h->spare->next;
			free(h->spare);
			h->spare = nx;
		}
		h->spare = h->blocks;
		h->blocks = NULL;
		h->spare_ents = h->rt_ents;
		h->rt_n = 0;
		h->rt_ents = 0;
		/* the list headers stay (their room is reused); give back a burst's worth */
		if (h->rt_cap > 4096) {
			free(h->rt_lists);
			h->rt_lists = NULL;
			h->rt_cap = 0;
		}
	}
}

void mfs_snap_rated_free(mfs_snap_rated_t *r)
{
	if (!r)
		return;
	mfs_snap_rated_clear(r);
	mfs_snap_rated_clear(r); /* (the second gives back the blocks the first kept) */
	for (uint32_t x = 0; x < r->nsh; x++) {
		free(r->sh[x].rt_lists);
		free(r->sh[x].rt_slot);
		free(r->sh[x].mine);
	}
	free(r->sh);
	free(r);
}

uint32_t mfs_snap_rated_max(const mfs_snap_rated_t *r) { return r ? r->rt_max : 0; }

size_t mfs_snap_rated_users(const mfs_snap_rated_t *r)
{
	size_t n = 0;
	for (uint32_t x = 0; r && x < r->nsh; x++)
		n += r->sh[x].rt_n;
	return n;
}

size_t mfs_snap_rated_bytes(const mfs_snap_rated_t *r)
{
	if (!r)
		return 0;
	size_t b = sizeof *r + r->nsh * sizeof *r->sh;
	for (uint32_t x = 0; x < r->nsh; x++) {
		const struct rated_shard *h = &r->sh[x];
		b += h->rt_slot_cap * sizeof *h->rt_slot + h->rt_cap * sizeof *h->rt_lists +
		     (h->rt_ents + h->spare_ents) * sizeof(struct rated_ent);
	}
	return b;
}

/* List j over all shards: shard by shard. */
static const struct rated_list *list_at(const mfs_snap_rated_t *r, size_t j)
{
	uint32_t x = 0;
	while (j >= r->sh[x].rt_n)
		j -= r->sh[x++].rt_n;
	return &r->sh[x].rt_lists[j];
}

/* Room for n entries from shard h's arena (blocks of at least 64 Ki entries and max). */
static struct rated_ent *arena_take(struct rated_shard *h, uint32_t max, size_t n)
{
	struct rated_block *bl = h->blocks;
	if (!bl || bl->size - bl->used < n) {
		const size_t size = (size_t)max > (1u << 16) ? max : (1u << 16);
		struct rated_block *nb = h->spare;
		if (nb) {
			h->spare = nb->next;
			h->spare_ents -= nb->size;
		} else if (!(nb = malloc(sizeof *nb + size * sizeof nb->e[0])))
			return NULL;
		h->rt_ents += size;
		nb->used = 0;
		nb->size = size;
		nb->next = bl;
		h->blocks = bl = nb;
	}
	struct rated_ent *p = bl->e + bl->used;
	bl->used += n;
	return p;
}

/* ug, ig: the generations of rows u and i (row_gen) */
static int shard_add(mfs_snap_rated_t *r, struct rated_shard *h, uint32_t u, uint16_t ug, uint32_t i, uint16_t ig)
{
	const uint32_t su = fast_div(r, u);
	if (su >= h->rt_slot_cap) {
		size_t cap = h->rt_slot_cap ? h->rt_slot_cap : 1024;
		while (cap <= su)
			cap *= 2;
		uint32_t *s = realloc(h->rt_slot, cap * sizeof *s);
		if (!s)
			return ENOMEM;
		memset(s + h->rt_slot_cap, 0, (cap - h->rt_slot_cap) * sizeof *s);
		h->rt_slot = s;
		h->rt_slot_cap = cap;
	}
	struct rated_list *l;
	if (h->rt_slot[su]) {
		l = &h->rt_lists[h->rt_slot[su] - 1];
		if (l->rl_ugen != ug) /* the row went to another user since: the old list is not theirs */
			l->rl_ugen = ug, l->rl_n = 0, l->rl_head = 0;
	} else {
		if (mfs_grow((void **)&h->rt_lists, &h->rt_cap, h->rt_n + 1, sizeof *h->rt_lists))
			return ENOMEM;
		l = &h->rt_lists[h->rt_n++];
		*l = (struct rated_list){.rl_user = u, .rl_ugen = ug};
		h->rt_slot[su] = (uint32_t)h->rt_n;
	}
	const struct rated_ent e = {i, ig};
	if (l->rl_n == r->rt_max) { /* full: overwrite the oldest */
		l->rl_e[l->rl_head] = e;
		l->rl_head = l->rl_head + 1 == r->rt_max ? 0 : l->rl_head + 1;
		return 0;
	}
	if (l->rl_n == l->rl_cap) {
		uint32_t cap = l->rl_cap ? l->rl_cap * 2 : 4;
		if (cap > r->rt_max)
			cap = r->rt_max;
		struct rated_ent *ne = arena_take(h, r->rt_max, cap);
		if (!ne)
			return ENOMEM;
		if (l->rl_n)
			memcpy(ne, l->rl_e, l->rl_n * sizeof *ne);
		l->rl_e = ne;
		l->rl_cap = cap;
	}
	l->rl_e[l->rl_n++] = e;
	return 0;
}

int mfs_snap_rated_add(mfs_snap_rated_t *r, const mfs_model_t *m, uint32_t u, uint32_t i)
{
	if (u == MFS_ROW_NONE || i == MFS_ROW_NONE)
		return 0;
	return shard_add(r, &r->sh[fast_mod(r, u)], u, row_gen(m, 0, u), i, row_gen(m, 1, i));
}

/* A shard's events of the batch: first gathered (without a branch), so that the slots, the list
 * headers and the lists' next entries can be prefetched ahead in three stages, each using what
 * the one before brought in (the tables span far more than the caches on a stream of new
 * users). Row generations are read only once rows have been freed (model_store/life.h: before
 * that every generation is 0). */
static void add_task(void *arg, size_t x)
{
	enum { AHEAD_SLOT = 24, AHEAD_LIST = 16, AHEAD_ENT = 8 };
	mfs_snap_rated_t *r = arg;
	struct rated_shard *h = &r->sh[x];
	const uint32_t *au = r->au, *ai = r->ai;
	h->rc = 0;
	if (mfs_grow((void **)&h->mine, &h->mine_cap, r->an, sizeof *h->mine)) {
		h->rc = ENOMEM;
		return;
	}
	uint32_t *mine = h->mine;
	size_t k = 0;
	for (size_t j = 0; j < r->an; j++) {
		const uint32_t u = au[j];
		mine[k] = (uint32_t)j;
		k += u != MFS_ROW_NONE && ai[j] != MFS_ROW_NONE && fast_mod(r, u) == x;
	}
	const int gens = mfs_model_frees(r->m) != 0;
	for (size_t y = 0; y < k && !h->rc; y++) {
		if (y + AHEAD_SLOT < k) {
			const uint32_t su = fast_div(r, au[mine[y + AHEAD_SLOT]]);
			if (su < h->rt_slot_cap)
				__builtin_prefetch(&h->rt_slot[su]);
		}
		if (y + AHEAD_LIST < k) {
			const uint32_t su = fast_div(r, au[mine[y + AHEAD_LIST]]);
			if (su < h->rt_slot_cap && h->rt_slot[su])
				__builtin_prefetch(&h->rt_lists[h->rt_slot[su] - 1]);
		}
		if (y + AHEAD_ENT < k) {
			const uint32_t su = fast_div(r, au[mine[y + AHEAD_ENT]]);
			if (su < h->rt_slot_cap && h->rt_slot[su]) {
				const struct rated_list *l = &h->rt_lists[h->rt_slot[su] - 1];
				if (l->rl_n < l->rl_cap)
					__builtin_prefetch(&l->rl_e[l->rl_n], 1);
			}
		}
		const uint32_t j = mine[y], u = au[j], i = ai[j];
		h->rc = shard_add(r, h, u, gens ? row_gen(r->m, 0, u) : 0, i, gens ? row_gen(r->m, 1, i) : 0);
	}
}

/* The batch the shards' tasks add (add_task), and their result once they have run. */
static void batch_set(mfs_snap_rated_t *r, const mfs_model_t *m, const uint32_t *u, const uint32_t *i, size_t n)
{
	r->m = m;
	r->au = u;
	r->ai = i;
	r->an = n;
}

static int batch_done(mfs_snap_rated_t *r)
{
	r->m = NULL;
	for (uint32_t x = 0; x < r->nsh; x++)
		if (r->sh[x].rc)
			return r->sh[x].rc;
	return 0;
}

int mfs_snap_rated_add_many(mfs_snap_rated_t *r, const mfs_model_t *m, const uint32_t *u, const uint32_t *i, size_t n,
                            mfs_par_t *par)
{
	if (r->nsh == 1 || !par) {
		for (size_t j = 0; j < n; j++) {
			int rc = mfs_snap_rated_add(r, m, u[j], i[j]);
			if (rc)
				return rc;
		}
		return 0;
	}
	batch_set(r, m, u, i, n);
	mfs_par_run(par, r->nsh, add_task, r);
	return batch_done(r);
}

void mfs_snap_rated_add_start(mfs_snap_rated_t *r, const mfs_model_t *m, const uint32_t *u, const uint32_t *i, size_t n,
                              mfs_par_t *par)
{
	batch_set(r, m, u, i, n);
	mfs_par_start(par, r->nsh, add_task, r);
}

int mfs_snap_rated_add_finish(mfs_snap_rated_t *r, mfs_par_t *par)
{
	mfs_par_wait(par);
	return batch_done(r);
}

size_t mfs_snap_rated_list(const mfs_snap_rated_t *r, const mfs_model_t *m, size_t j, uint32_t *user,
                           uint32_t *items)
{
	const struct rated_list *l = list_at(r, j);
	*user = MFS_ROW_NONE;
	if (!mfs_idmap_alive(m->users, l->rl_user) || row_gen(m, 0, l->rl_user) != l->rl_ugen)
		return 0; /* freed (its record is deleted by the gone list), or another user's now */
	*user = l->rl_user;
	size_t n = 0;
	for (uint32_t x = 0; x < l->rl_n; x++) {
		const struct rated_ent *e = &l->rl_e[l->rl_n == r->rt_max ? (l->rl_head + x) % r->rt_max : x];
		if (mfs_idmap_alive(m->items, e->item) && row_gen(m, 1, e->item) == e->igen)
			items[n++] = e->item;
	}
	return n;
}

size_t mfs_snap_rated_raw(const mfs_snap_rated_t *r, size_t j, uint32_t *user, uint16_t *ugen, uint32_t *items,
                          uint16_t *igens)
{
	const struct rated_list *l = list_at(r, j);
	*user = l->rl_user;
	*ugen = l->rl_ugen;
	for (uint32_t x = 0; x < l->rl_n; x++) {
		const struct rated_ent *e = &l->rl_e[l->rl_n == r->rt_max ? (l->rl_head + x) % r->rt_max : x];
		items[x] = e->item;
		igens[x] = e->igen;
	}
	return l->rl_n;
}
