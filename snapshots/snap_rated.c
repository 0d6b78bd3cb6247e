/* snap_rated.c - per-user rings of the items rated lately (see snap_rated.h).
 *
 * DESIGN
 * rt_slot[user row] is 1 + the index of the row's list in rt_lists (0: none since the clear), so
 * an add is one array lookup and, for a list not yet full, an append; a full list is a ring
 * (rl_head is the oldest entry). A list grows by doubling up to max, so a user with one rating
 * costs one small allocation, not max entries. Clearing frees the lists and zeroes the slots of
 * the users it held (not the whole index): O(users rated), not O(user rows).
 */
#include "snapshots/snap_rated.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/grow.h"
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

struct mfs_snap_rated {
	uint32_t rt_max;
	uint32_t *rt_slot; /* per user row: 1 + index into rt_lists, 0 = none */
	size_t rt_slot_cap;
	struct rated_list *rt_lists;
	size_t rt_n, rt_cap;
	size_t rt_ents; /* entries allocated over all lists */
};

static uint16_t row_gen(const mfs_model_t *m, int ent, uint32_t row)
{
	const uint32_t cap = ent ? m->cap_items : m->cap_users;
	return m->gen[ent] && row < cap ? m->gen[ent][row] : 0;
}

int mfs_snap_rated_init(uint32_t max, mfs_snap_rated_t **out)
{
	*out = NULL;
	if (max < 1 || max > UINT16_MAX)
		return MFS_EINVAL;
	mfs_snap_rated_t *r = calloc(1, sizeof *r);
	if (!r)
		return ENOMEM;
	r->rt_max = max;
	*out = r;
	return 0;
}

void mfs_snap_rated_clear(mfs_snap_rated_t *r)
{
	if (!r)
		return;
	for (size_t j = 0; j < r->rt_n; j++) {
		r->rt_slot[r->rt_lists[j].rl_user] = 0;
		free(r->rt_lists[j].rl_e);
	}
	r->rt_n = 0;
	r->rt_ents = 0;
	/* the list headers stay (their room is reused); give back a burst's worth */
	if (r->rt_cap > 4096) {
		free(r->rt_lists);
		r->rt_lists = NULL;
		r->rt_cap = 0;
	}
}

void mfs_snap_rated_free(mfs_snap_rated_t *r)
{
	if (!r)
		return;
	mfs_snap_rated_clear(r);
	free(r->rt_lists);
	free(r->rt_slot);
	free(r);
}

uint32_t mfs_snap_rated_max(const mfs_snap_rated_t *r) { return r ? r->rt_max : 0; }
size_t mfs_snap_rated_users(const mfs_snap_rated_t *r) { return r ? r->rt_n : 0; }

size_t mfs_snap_rated_bytes(const mfs_snap_rated_t *r)
{
	if (!r)
		return 0;
	return sizeof *r + r->rt_slot_cap * sizeof *r->rt_slot + r->rt_cap * sizeof *r->rt_lists +
	       r->rt_ents * sizeof(struct rated_ent);
}

int mfs_snap_rated_add(mfs_snap_rated_t *r, const mfs_model_t *m, uint32_t u, uint32_t i)
{
	if (u == MFS_ROW_NONE || i == MFS_ROW_NONE)
		return 0;
	if (u >= r->rt_slot_cap) {
		size_t cap = r->rt_slot_cap ? r->rt_slot_cap : 1024;
		while (cap <= u)
			cap *= 2;
		uint32_t *s = realloc(r->rt_slot, cap * sizeof *s);
		if (!s)
			return ENOMEM;
		memset(s + r->rt_slot_cap, 0, (cap - r->rt_slot_cap) * sizeof *s);
		r->rt_slot = s;
		r->rt_slot_cap = cap;
	}
	const uint16_t ug = row_gen(m, 0, u);
	struct rated_list *l;
	if (r->rt_slot[u]) {
		l = &r->rt_lists[r->rt_slot[u] - 1];
		if (l->rl_ugen != ug) /* the row went to another user since: the old list is not theirs */
			l->rl_ugen = ug, l->rl_n = 0, l->rl_head = 0;
	} else {
		if (mfs_grow((void **)&r->rt_lists, &r->rt_cap, r->rt_n + 1, sizeof *r->rt_lists))
			return ENOMEM;
		l = &r->rt_lists[r->rt_n++];
		*l = (struct rated_list){.rl_user = u, .rl_ugen = ug};
		r->rt_slot[u] = (uint32_t)r->rt_n;
	}
	const struct rated_ent e = {i, row_gen(m, 1, i)};
	if (l->rl_n == r->rt_max) { /* full: overwrite the oldest */
		l->rl_e[l->rl_head] = e;
		l->rl_head = l->rl_head + 1 == r->rt_max ? 0 : l->rl_head + 1;
		return 0;
	}
	if (l->rl_n == l->rl_cap) {
		uint32_t cap = l->rl_cap ? l->rl_cap * 2 : 4;
		if (cap > r->rt_max)
			cap = r->rt_max;
		struct rated_ent *ne = realloc(l->rl_e, cap * sizeof *ne);
		if (!ne)
			return ENOMEM;
		r->rt_ents += cap - l->rl_cap;
		l->rl_e = ne;
		l->rl_cap = cap;
	}
	l->rl_e[l->rl_n++] = e;
	return 0;
}

size_t mfs_snap_rated_list(const mfs_snap_rated_t *r, const mfs_model_t *m, size_t j, uint32_t *user,
                           uint32_t *items)
{
	const struct rated_list *l = &r->rt_lists[j];
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
	const struct rated_list *l = &r->rt_lists[j];
	*user = l->rl_user;
	*ugen = l->rl_ugen;
	for (uint32_t x = 0; x < l->rl_n; x++) {
		const struct rated_ent *e = &l->rl_e[l->rl_n == r->rt_max ? (l->rl_head + x) % r->rt_max : x];
		items[x] = e->item;
		igens[x] = e->igen;
	}
	return l->rl_n;
}
