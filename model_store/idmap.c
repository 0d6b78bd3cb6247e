/* idmap.c - external id -> dense row, an open-addressing hash table that grows without
 * stopping.
 *
 * DESIGN: rows are handed out 0, 1, 2, ...; a removed id leaves its row dead (keys[row].kind
 * 0) until the model gives the row to another id (mfs_idmap_insert_h), and its slot a
 * tombstone, so the linear-probe chains through it stay intact. Incremental rehashing: when
 * live slots plus tombstones pass half the table we allocate a new one (twice as large, or the
 * same size when most of the load is tombstones) and, on every later insert, copy a bounded
 * number (MIGRATE_STEP) of old slots into it. The old table only ever gains tombstones while
 * it drains, so a lookup can fall back to it; a key inserted during the migration goes to the
 * new table only, and a removal marks the key in both, so no key is in both with different
 * rows. Once every old slot is copied the old table is freed. Per insert the work is
 * O(MIGRATE_STEP), never O(table) (Redis dict.c's idea).
 *
 * A slot holds row + 1 (0 = empty), the id's kind, and for a u64 id the value itself, for a
 * string id its full 64-bit hash. A u64 lookup is then decided inside the slot (one cache
 * miss, not two); a string lookup compares bytes only when the hashes agree. Keys live in
 * keys[row]; string bytes in an arena that is appended to and, once more than half of it
 * belongs to removed ids, rewritten with the live ones (O(live bytes), amortized over the
 * removals that made the garbage).
 */
#include <stdint.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/err.h"
#include "common/grow.h"
#include "model_store/store.h"

/* Old slots copied per insert while a table drains. The copies are random writes into the new
 * table, so the step sets how much extra each insert costs and for how long: 256 made the
 * inserts right after a doubling of 4 M ids hold the learner for about a second (bench/growth.sh);
 * 8 spreads the same copies over old slots / 8 inserts. It must stay >= 4: a same-size rehash
 * (tombstones, at most a quarter live) has a quarter of the slots' inserts before the new table
 * reaches half load, and the old one must be drained by then. */
#define MIGRATE_STEP 8
#define MIN_SLOTS 1024
#define TOMB UINT32_MAX     /* a slot's row1 after its id was removed */
#define ARENA_SLACK (1u << 20) /* garbage bytes tolerated before the arena is rewritten */

struct slot {
	uint32_t row1; /* row + 1; 0 = empty */
	uint32_t kind; /* MFS_ID_U64 or MFS_ID_STR */
	uint64_t key;  /* u64: the value; string: the hash */
};

struct table {
	struct slot *s;
	size_t mask;  /* slots - 1 (power of two) */
	size_t tombs; /* slots holding TOMB */
};

struct key {
	uint64_t v; /* u64 value, or arena offset of the string */
	uint16_t len;
	uint8_t kind;
};

struct mfs_idmap {
	struct table t;     /* where inserts go */
	struct table old;   /* draining (s == NULL when not rehashing) */
	size_t migrate_pos; /* next old slot to copy */
	struct key *keys;   /* kind 0: a dead row */
	uint32_t n, cap;    /* rows handed out (live or dead), allocated */
	uint32_t live;      /* ids held */
	char *arena;
	size_t arena_len, arena_cap, garbage;
};

static uint64_t id_hash(const mfs_id_t *id)
{
	if (id->kind == MFS_ID_U64)
		return XXH3_64bits_withSeed(&id->num, sizeof id->num, MFS_ID_U64);
	return XXH3_64bits_withSeed(id->str, id->len, MFS_ID_STR);
}

static int key_eq(const mfs_idmap_t *m, uint32_t row, const mfs_id_t *id)
{
	const struct key *k = &m->keys[row];
	if (k->kind != id->kind)
		return 0;
	if (k->kind == MFS_ID_U64)
		return k->v == id->num;
	return k->len == id->len && memcmp(m->arena + k->v, id->str, id->len) == 0;
}

/* Tables of 2 MiB and more are mapped with 2 MiB pages where the kernel gives them for the
 * asking: inserts and the rehash's copies write random slots, and with 4 KiB pages nearly every
 * one into a page not touched yet (a fault each) until the table is dense. */
#define BIG_TABLE (2u << 20)

static int table_alloc(struct table *t, size_t slots)
{
	const size_t bytes = slots * sizeof *t->s;
	if (bytes >= BIG_TABLE) {
		void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		t->s = p == MAP_FAILED ? NULL : p;
#ifdef MADV_HUGEPAGE
		if (t->s)
			(void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
	} else {
		t->s = calloc(slots, sizeof *t->s);
	}
	if (!t->s)
		return ENOMEM;
	t->mask = slots - 1;
	t->tombs = 0;
	return 0;
}

static void table_free(struct table *t)
{
	if (t->s && (t->mask + 1) * sizeof *t->s >= BIG_TABLE)
		munmap(t->s, (t->mask + 1) * sizeof *t->s);
	else
		free(t->s);
	t->s = NULL;
}

static inline uint64_t slot_key(const mfs_id_t *id, uint64_t h) { return id->kind == MFS_ID_U64 ? id->num : h; }

static uint32_t table_find(const mfs_idmap_t *m, const struct table *t, uint64_t h, const mfs_id_t *id)
{
	const uint64_t key = slot_key(id, h);
	for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
		const struct slot *s = &t->s[i];
		if (!s->row1)
			return MFS_ROW_NONE;
		if (s->row1 == TOMB)
			continue;
		if (s->key == key && s->kind == id->kind && (id->kind == MFS_ID_U64 || key_eq(m, s->row1 - 1, id)))
			return s->row1 - 1;
	}
}

/* Put a slot's contents (row + 1, kind, key: see struct slot) at the first empty or dead slot
 * of h's chain. The id must not be in t (a lookup came first). */
static void table_put_slot(struct table *t, uint64_t h, uint32_t row1, uint32_t kind, uint64_t key)
{
	size_t i = h & t->mask;
	while (t->s[i].row1 && t->s[i].row1 != TOMB)
		i = (i + 1) & t->mask;
	if (t->s[i].row1 == TOMB)
		t->tombs--;
	t->s[i].row1 = row1;
	t->s[i].kind = kind;
	t->s[i].key = key;
}

static void table_put(struct table *t, uint64_t h, uint32_t row, const mfs_id_t *id)
{
	table_put_slot(t, h, row + 1, id->kind, slot_key(id, h));
}

/* The hash of the id an occupied slot holds, from the slot alone: a u64 slot keeps the value
 * (hashed again), a string slot the hash itself. Copying a slot then reads no keys[] entry
 * (a random read per live slot, when the rehash runs inside every insert). */
static inline uint64_t slot_hash(const struct slot *s)
{
	if (s->kind == MFS_ID_STR)
		return s->key;
	const mfs_id_t id = {.kind = MFS_ID_U64, .num = s->key};
	return id_hash(&id);
}

/* Copy up to `steps` old slots into the new table; free the old one when drained. The
 * destinations are random: their lines are prefetched for a group of slots before the group
 * is written. */
static void migrate(mfs_idmap_t *m, size_t steps)
{
	if (!m->old.s)
		return;
	const size_t end = m->old.mask + 1;
	enum { GROUP = 8 };
	while (steps && m->migrate_pos < end) {
		size_t n = end - m->migrate_pos;
		if (n > steps)
			n = steps;
		if (n > GROUP)
			n = GROUP;
		const struct slot *s = &m->old.s[m->migrate_pos];
		uint64_t h[GROUP];
		for (size_t j = 0; j < n; j++)
			if (s[j].row1 && s[j].row1 != TOMB) {
				h[j] = slot_hash(&s[j]);
#if defined(__GNUC__)
				__builtin_prefetch(&m->t.s[h[j] & m->t.mask], 1);
#endif
			}
		for (size_t j = 0; j < n; j++)
			if (s[j].row1 && s[j].row1 != TOMB)
				table_put_slot(&m->t, h[j], s[j].row1, s[j].kind, s[j].key);
		m->migrate_pos += n;
		steps -= n;
	}
	if (m->migrate_pos == end) {
		table_free(&m->old);
		m->migrate_pos = 0;
	}
}

int mfs_idmap_init(mfs_idmap_t **out)
{
	mfs_idmap_t *m = calloc(1, sizeof *m);
	if (!m || table_alloc(&m->t, MIN_SLOTS)) {
		free(m);
		return ENOMEM;
	}
	*out = m;
	return 0;
}

void mfs_idmap_free(mfs_idmap_t *m)
{
	if (!m)
		return;
	table_free(&m->t);
	table_free(&m->old);
	free(m->keys);
	free(m->arena);
	free(m);
}

uint32_t mfs_idmap_size(const mfs_idmap_t *m) { return m->n; }
uint32_t mfs_idmap_live(const mfs_idmap_t *m) { return m->live; }
int mfs_idmap_alive(const mfs_idmap_t *m, uint32_t row) { return row < m->n && m->keys[row].kind != 0; }

mfs_id_t mfs_idmap_key(const mfs_idmap_t *m, uint32_t row)
{
	const struct key *k = &m->keys[row];
	mfs_id_t id = {k->kind, k->len, 0, NULL};
	if (k->kind == MFS_ID_U64)
		id.num = k->v;
	else
		id.str = m->arena + k->v;
	return id;
}

uint32_t mfs_idmap_find(const mfs_idmap_t *m, const mfs_id_t *id) { return mfs_idmap_find_h(m, id, id_hash(id)); }

uint32_t mfs_idmap_find_h(const mfs_idmap_t *m, const mfs_id_t *id, uint64_t h)
{
	uint32_t row = table_find(m, &m->t, h, id);
	if (row == MFS_ROW_NONE && m->old.s)
		row = table_find(m, &m->old, h, id);
	return row;
}

uint64_t mfs_idmap_hash(const mfs_id_t *id) { return id_hash(id); }

void mfs_idmap_prefetch(const mfs_idmap_t *m, uint64_t h)
{
#if defined(__GNUC__)
	__builtin_prefetch(&m->t.s[h & m->t.mask]);
	if (m->old.s) /* a miss in the new table is looked for in the draining one too */
		__builtin_prefetch(&m->old.s[h & m->old.mask]);
#else
	(void)m;
	(void)h;
#endif
}

int mfs_idmap_get_or_add(mfs_idmap_t *m, const mfs_id_t *id, uint32_t *row, int *added)
{
	return mfs_idmap_get_or_add_h(m, id, id_hash(id), row, added);
}

int mfs_idmap_get_or_add_h(mfs_idmap_t *m, const mfs_id_t *id, uint64_t h, uint32_t *row, int *added)
{
	int rc = mfs_id_check(id);
	if (rc)
		return rc;
	uint32_t r = table_find(m, &m->t, h, id);
	if (r == MFS_ROW_NONE && m->old.s)
		r = table_find(m, &m->old, h, id);
	if (added)
		*added = 0;
	if (r != MFS_ROW_NONE) {
		*row = r;
		return 0;
	}
	if ((rc = mfs_idmap_insert_h(m, id, h, m->n)))
		return rc;
	*row = m->n - 1;
	if (added)
		*added = 1;
	return 0;
}

int mfs_idmap_insert_h(mfs_idmap_t *m, const mfs_id_t *id, uint64_t h, uint32_t row)
{
	int rc = mfs_id_check(id);
	if (rc)
		return rc;
	if (row > m->n || (row < m->n && m->keys[row].kind))
		return MFS_EINVAL;
	if (row == MFS_ROW_NONE - 1)
		return MFS_EFULL;
	/* room for the key and its bytes first, so a failure leaves the map unchanged */
	if (row == m->cap) {
		uint32_t nc = m->cap ? (m->cap > UINT32_MAX / 2 ? UINT32_MAX : m->cap * 2) : 1024;
		struct key *nk = realloc(m->keys, (size_t)nc * sizeof *nk);
		if (!nk)
			return ENOMEM;
		m->keys = nk;
		m->cap = nc;
	}
	if (id->kind == MFS_ID_STR && mfs_grow((void **)&m->arena, &m->arena_cap, m->arena_len + id->len, 1))
		return ENOMEM;
	/* past half load (tombstones count: they lengthen chains): a new table, drained step by
	 * step; twice as large unless most of the load is tombstones */
	if (!m->old.s && (size_t)(m->live + 1) * 2 + m->t.tombs * 2 > m->t.mask + 1) {
		const size_t slots = m->t.mask + 1;
		struct table nt;
		if (table_alloc(&nt, (size_t)(m->live + 1) * 4 > slots ? slots * 2 : slots))
			return ENOMEM;
		m->old = m->t;
		m->t = nt;
		m->migrate_pos = 0;
	}
	/* the new table past half load before the old one drained (not expected: see MIGRATE_STEP):
	 * drain it all now rather than let the chains grow */
	migrate(m, (size_t)(m->live + 1) * 2 + m->t.tombs * 2 > m->t.mask + 1 ? SIZE_MAX : MIGRATE_STEP);

	struct key *k = &m->keys[row];
	k->kind = id->kind;
	k->len = id->len;
	if (id->kind == MFS_ID_U64) {
		k->v = id->num;
	} else {
		memcpy(m->arena + m->arena_len, id->str, id->len);
		k->v = m->arena_len;
		m->arena_len += id->len;
	}
	table_put(&m->t, h, row, id);
	if (row == m->n)
		m->n++;
	m->live++;
	return 0;
}

/* Mark the slot holding row in t dead (if t has it). */
static void table_remove(mfs_idmap_t *m, struct table *t, uint64_t h, const mfs_id_t *id, uint32_t row)
{
	const uint64_t key = slot_key(id, h);
	for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
		struct slot *s = &t->s[i];
		if (!s->row1)
			return;
		if (s->row1 == row + 1 && s->key == key && s->kind == id->kind) {
			s->row1 = TOMB;
			t->tombs++;
			return;
		}
	}
	(void)m;
}

/* Rewrite the arena with the live ids' bytes only (once garbage passes half of it). */
static void arena_compact(mfs_idmap_t *m)
{
	if (m->garbage < ARENA_SLACK || m->garbage * 2 < m->arena_len)
		return;
	char *na = malloc(m->arena_len - m->garbage + 1);
	if (!na)
		return; /* kept as it is: correct, only larger */
	size_t len = 0;
	for (uint32_t r = 0; r < m->n; r++) {
		struct key *k = &m->keys[r];
		if (k->kind != MFS_ID_STR)
			continue;
		memcpy(na + len, m->arena + k->v, k->len);
		k->v = len;
		len += k->len;
	}
	free(m->arena);
	m->arena = na;
	m->arena_len = len;
	m->arena_cap = len + 1;
	m->garbage = 0;
}

void mfs_idmap_remove(mfs_idmap_t *m, uint32_t row)
{
	if (!mfs_idmap_alive(m, row))
		return;
	mfs_id_t id = mfs_idmap_key(m, row);
	const uint64_t h = id_hash(&id);
	table_remove(m, &m->t, h, &id, row);
	if (m->old.s)
		table_remove(m, &m->old, h, &id, row);
	if (id.kind == MFS_ID_STR)
		m->garbage += id.len;
	m->keys[row].kind = 0;
	m->live--;
	arena_compact(m);
}

/* Renumber in place: keys move to their new rows, and every slot that names a row (in the table
 * being filled and in the one draining) names its new one. Slots stay where they are, since
 * their place follows the id's hash, not its row; tombstones and the drain position are
 * untouched, so an incremental rehash under way goes on as it was. O(rows + slots). */
int mfs_idmap_permute(mfs_idmap_t *m, const uint32_t *perm)
{
	if (!m->n)
		return 0;
	struct key *nk = malloc((size_t)m->cap * sizeof *nk);
	if (!nk)
		return ENOMEM;
	for (uint32_t r = 0; r < m->n; r++)
		nk[perm[r]] = m->keys[r];
	free(m->keys);
	m->keys = nk;
	struct table *ts[2] = {&m->t, &m->old};
	for (int t = 0; t < 2; t++) {
		if (!ts[t]->s)
			continue;
		for (size_t i = 0; i <= ts[t]->mask; i++) {
			struct slot *s = &ts[t]->s[i];
			if (s->row1 && s->row1 != TOMB)
				s->row1 = perm[s->row1 - 1] + 1;
		}
	}
	return 0;
}
