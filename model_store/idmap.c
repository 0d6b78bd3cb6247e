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
 *
 * The slots are split into MFS_IDMAP_SHARDS tables by the top bits of the hash, each with its
 * own load and its own incremental rehash, so that a batch's new ids can be placed on several
 * threads at once, a shard per thread (mfs_idmap_add_*: see store.h). Rows and keys stay one
 * dense array: the rows of a batch's new ids are numbered by one thread, in order.
 *
 * Tables prepared ahead (mfs_idmap_prepare_ahead): with uniform hashes every shard doubles at
 * about the same insert, and the first inserts into the new tables touch all their pages at
 * once: at 33.6 M ids 2 GB of fresh pages for the kernel to zero, ~0.3 s of the writer's time
 * (docs/BENCHMARKS.md, the id map's doublings). With it on, a helper thread maps and touches
 * a shard's next table when the shard passes 3/8 load, and the rehash at 1/2 takes that
 * table if it is ready (else it maps one as before). A shard's `prep` slot is handed between
 * the writer and the helper by its state alone: ASKED (writer) -> BUSY (helper) -> READY
 * (helper) -> taken (writer); the writer may cancel ASKED, or mark BUSY stale for the helper
 * to free.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
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
#define MIN_SLOTS 256 /* per shard */
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

/* A shard's next table, prepared by the helper (see the header) */
enum { PREP_NONE, PREP_ASKED, PREP_BUSY, PREP_READY, PREP_STALE };
struct prep {
	_Atomic int state;
	size_t slots;   /* asked for (set by the writer before ASKED) */
	struct table t; /* mapped and touched (valid in READY; the helper's in BUSY and STALE) */
};

/* The slots of the ids whose hash has these top bits. */
struct shard {
	struct table t;     /* where inserts go */
	struct table old;   /* draining (s == NULL when not rehashing) */
	size_t migrate_pos; /* next old slot to copy */
	size_t live;        /* ids held in this shard */
	struct prep prep;
};

#define SHARD_SHIFT (64 - MFS_IDMAP_SHARD_BITS)
static inline unsigned shard_of(uint64_t h) { return (unsigned)(h >> SHARD_SHIFT); }

struct key {
	uint64_t v; /* u64 value, or arena offset of the string */
	uint16_t len;
	uint8_t kind;
};

struct preparer {
	pthread_t tid;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int on, stop, asked;     /* asked: a shard's state went to ASKED since the helper looked */
	_Atomic uint64_t prepared; /* tables the helper made (its own count) */
	uint64_t used, inline_maps; /* rehashes that took a prepared table, that mapped their own */
};

struct mfs_idmap {
	struct shard sh[MFS_IDMAP_SHARDS];
	struct preparer pr;
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

/* Copy up to `steps` of a shard's old slots into its new table; free the old one when drained.
 * The destinations are random: their lines are prefetched for a group of slots before the
 * group is written. */
static void migrate(struct shard *sh, size_t steps)
{
	if (!sh->old.s)
		return;
	const size_t end = sh->old.mask + 1;
	enum { GROUP = 8 };
	while (steps && sh->migrate_pos < end) {
		size_t n = end - sh->migrate_pos;
		if (n > steps)
			n = steps;
		if (n > GROUP)
			n = GROUP;
		const struct slot *s = &sh->old.s[sh->migrate_pos];
		uint64_t h[GROUP];
		for (size_t j = 0; j < n; j++)
			if (s[j].row1 && s[j].row1 != TOMB) {
				h[j] = slot_hash(&s[j]);
#if defined(__GNUC__)
				__builtin_prefetch(&sh->t.s[h[j] & sh->t.mask], 1);
#endif
			}
		for (size_t j = 0; j < n; j++)
			if (s[j].row1 && s[j].row1 != TOMB)
				table_put_slot(&sh->t, h[j], s[j].row1, s[j].kind, s[j].key);
		sh->migrate_pos += n;
		steps -= n;
	}
	if (sh->migrate_pos == end) {
		table_free(&sh->old);
		sh->migrate_pos = 0;
	}
}

/* Room in a shard's table for `more` ids besides those it holds, tombstones counted as load:
 * past half load a new table, twice as large unless most of the load is tombstones (or as large
 * as `more` needs), drained step by step on later inserts. The new table past half load before
 * the old one drained (not expected: see MIGRATE_STEP): the old one is drained all at once
 * first rather than let the chains grow. @return 0 or ENOMEM (the shard as it was, or with a
 * rehash started: the same ids either way). */
static void prep_ask(mfs_idmap_t *m, struct shard *sh, size_t more);
static int prep_take(mfs_idmap_t *m, struct shard *sh, size_t slots, struct table *nt);

static int shard_room(mfs_idmap_t *m, struct shard *sh, size_t more)
{
	const size_t load = (sh->live + more) * 2 + sh->t.tombs * 2;
	if (m->pr.on)
		prep_ask(m, sh, more);
	if (load <= sh->t.mask + 1)
		return 0;
	if (sh->old.s)
		migrate(sh, SIZE_MAX);
	if ((sh->live + more) * 2 + sh->t.tombs * 2 <= sh->t.mask + 1)
		return 0;
	size_t slots = sh->t.mask + 1;
	if ((sh->live + more) * 4 > slots) /* not mostly tombstones: a larger table */
		slots *= 2;
	while ((sh->live + more) * 2 > slots)
		slots *= 2;
	struct table nt;
	if (!prep_take(m, sh, slots, &nt) && table_alloc(&nt, slots))
		return ENOMEM;
	sh->old = sh->t;
	sh->t = nt;
	sh->migrate_pos = 0;
	return 0;
}

/* ---- tables prepared ahead ------------------------------------------------------------- */

/* The writer: past 3/8 load, ask for the table the rehash at 1/2 will want (twice as large:
 * the usual case; a rehash that wants another size maps its own). Only tables big enough to be
 * mapped (BIG_TABLE) are worth it. */
static void prep_ask(mfs_idmap_t *m, struct shard *sh, size_t more)
{
	const size_t slots = sh->t.mask + 1;
	if ((sh->live + more) * 8 < slots * 3 || 2 * slots * sizeof(struct slot) < BIG_TABLE ||
	    atomic_load_explicit(&sh->prep.state, memory_order_acquire) != PREP_NONE)
		return;
	sh->prep.slots = 2 * slots;
	atomic_store_explicit(&sh->prep.state, PREP_ASKED, memory_order_release);
	pthread_mutex_lock(&m->pr.mu);
	m->pr.asked = 1;
	pthread_cond_signal(&m->pr.cv);
	pthread_mutex_unlock(&m->pr.mu);
}

/* The writer, at the rehash: the prepared table if it is ready and of this size (1), else 0
 * (the caller maps one); a request not started is cancelled, one under way left for the
 * helper to free. */
static int prep_take(mfs_idmap_t *m, struct shard *sh, size_t slots, struct table *nt)
{
	if (!m->pr.on)
		return 0;
	int took = 0;
	for (;;) {
		int st = atomic_load_explicit(&sh->prep.state, memory_order_acquire);
		if (st == PREP_READY) {
			if (sh->prep.t.mask + 1 == slots) {
				*nt = sh->prep.t;
				took = 1;
			} else {
				table_free(&sh->prep.t);
			}
			sh->prep.t.s = NULL;
			atomic_store_explicit(&sh->prep.state, PREP_NONE, memory_order_release);
			break;
		}
		if (st == PREP_ASKED || st == PREP_BUSY) { /* not started: cancel; under way: stale */
			if (atomic_compare_exchange_strong(&sh->prep.state, &st, st == PREP_ASKED ? PREP_NONE : PREP_STALE))
				break;
			continue; /* the helper moved it on meanwhile */
		}
		break; /* NONE, or STALE (the helper frees it) */
	}
	if (took)
		m->pr.used++;
	else
		m->pr.inline_maps++;
	return took;
}

/* Map a table of `slots` and touch every page of it, so that its first inserts find the pages
 * there (zeroed here, off the writer's path). */
static int prep_make(struct table *t, size_t slots)
{
	if (table_alloc(t, slots))
		return ENOMEM;
	const size_t bytes = slots * sizeof *t->s, page = (size_t)sysconf(_SC_PAGESIZE);
	volatile char *p = (volatile char *)t->s;
	for (size_t at = 0; at < bytes; at += page)
		p[at] = 0;
	return 0;
}

static void *preparer_main(void *arg)
{
	mfs_idmap_t *m = arg;
	pthread_mutex_lock(&m->pr.mu);
	for (;;) {
		while (!m->pr.asked && !m->pr.stop)
			pthread_cond_wait(&m->pr.cv, &m->pr.mu);
		if (m->pr.stop)
			break;
		m->pr.asked = 0;
		pthread_mutex_unlock(&m->pr.mu);
		for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++) {
			struct prep *pp = &m->sh[s].prep;
			int want = PREP_ASKED;
			if (!atomic_compare_exchange_strong(&pp->state, &want, PREP_BUSY))
				continue;
			struct table t = {0};
			const int rc = prep_make(&t, pp->slots);
			if (!rc)
				pp->t = t;
			want = PREP_BUSY;
			if (!rc && atomic_compare_exchange_strong(&pp->state, &want, PREP_READY)) {
				m->pr.prepared++;
				continue;
			}
			if (!rc) /* stale: the rehash came first */
				table_free(&pp->t);
			pp->t.s = NULL;
			atomic_store(&pp->state, PREP_NONE); /* (out of memory: the rehash maps its own) */
		}
		pthread_mutex_lock(&m->pr.mu);
	}
	pthread_mutex_unlock(&m->pr.mu);
	return NULL;
}

int mfs_idmap_prepare_ahead(mfs_idmap_t *m)
{
	if (m->pr.on)
		return 0;
	if (pthread_mutex_init(&m->pr.mu, NULL))
		return ENOMEM;
	if (pthread_cond_init(&m->pr.cv, NULL)) {
		pthread_mutex_destroy(&m->pr.mu);
		return ENOMEM;
	}
	if (pthread_create(&m->pr.tid, NULL, preparer_main, m)) {
		pthread_cond_destroy(&m->pr.cv);
		pthread_mutex_destroy(&m->pr.mu);
		return EAGAIN;
	}
	pthread_setname_np(m->pr.tid, "mfs-idmap-prep");
	m->pr.on = 1;
	return 0;
}

void mfs_idmap_prepare_counts(const mfs_idmap_t *m, uint64_t *prepared, uint64_t *used, uint64_t *inline_maps)
{
	*prepared = atomic_load(&m->pr.prepared);
	*used = m->pr.used;
	*inline_maps = m->pr.inline_maps;
}

int mfs_idmap_init(mfs_idmap_t **out)
{
	mfs_idmap_t *m = calloc(1, sizeof *m);
	if (!m)
		return ENOMEM;
	for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++)
		if (table_alloc(&m->sh[s].t, MIN_SLOTS)) {
			mfs_idmap_free(m);
			return ENOMEM;
		}
	*out = m;
	return 0;
}

void mfs_idmap_free(mfs_idmap_t *m)
{
	if (!m)
		return;
	if (m->pr.on) {
		pthread_mutex_lock(&m->pr.mu);
		m->pr.stop = 1;
		pthread_cond_signal(&m->pr.cv);
		pthread_mutex_unlock(&m->pr.mu);
		pthread_join(m->pr.tid, NULL);
		pthread_mutex_destroy(&m->pr.mu);
		pthread_cond_destroy(&m->pr.cv);
	}
	for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++) {
		table_free(&m->sh[s].t);
		table_free(&m->sh[s].old);
		if (atomic_load(&m->sh[s].prep.state) == PREP_READY) /* (the helper has ended: no BUSY) */
			table_free(&m->sh[s].prep.t);
	}
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
	else if (k->kind == MFS_ID_STR) /* (a dead row's v is whatever its id left there) */
		id.str = m->arena + k->v;
	return id;
}

uint32_t mfs_idmap_find(const mfs_idmap_t *m, const mfs_id_t *id) { return mfs_idmap_find_h(m, id, id_hash(id)); }

uint32_t mfs_idmap_find_h(const mfs_idmap_t *m, const mfs_id_t *id, uint64_t h)
{
	const struct shard *sh = &m->sh[shard_of(h)];
	uint32_t row = table_find(m, &sh->t, h, id);
	if (row == MFS_ROW_NONE && sh->old.s)
		row = table_find(m, &sh->old, h, id);
	return row;
}

uint64_t mfs_idmap_hash(const mfs_id_t *id) { return id_hash(id); }

void mfs_idmap_prefetch(const mfs_idmap_t *m, uint64_t h)
{
#if defined(__GNUC__)
	const struct shard *sh = &m->sh[shard_of(h)];
	__builtin_prefetch(&sh->t.s[h & sh->t.mask]);
	if (sh->old.s) /* a miss in the new table is looked for in the draining one too */
		__builtin_prefetch(&sh->old.s[h & sh->old.mask]);
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
	uint32_t r = mfs_idmap_find_h(m, id, h);
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

/* Room in keys[] for rows below `rows`. */
static int keys_room(mfs_idmap_t *m, size_t rows)
{
	if (rows <= m->cap)
		return 0;
	size_t nc = m->cap ? m->cap : 1024;
	while (nc < rows)
		nc = nc > UINT32_MAX / 2 ? UINT32_MAX : nc * 2;
	struct key *nk = realloc(m->keys, nc * sizeof *nk);
	if (!nk)
		return ENOMEM;
	m->keys = nk;
	m->cap = (uint32_t)nc;
	return 0;
}

/* keys[row] = id (string bytes appended to the arena, which has room). */
static void key_set(mfs_idmap_t *m, uint32_t row, const mfs_id_t *id)
{
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
	/* room for the key, its bytes and its slot first, so a failure leaves the ids unchanged */
	struct shard *sh = &m->sh[shard_of(h)];
	if ((rc = keys_room(m, (size_t)row + 1)) ||
	    (id->kind == MFS_ID_STR && mfs_grow((void **)&m->arena, &m->arena_cap, m->arena_len + id->len, 1)) ||
	    (rc = shard_room(m, sh, 1)))
		return rc ? rc : ENOMEM;
	migrate(sh, MIGRATE_STEP);
	key_set(m, row, id);
	table_put(&sh->t, h, row, id);
	if (row == m->n)
		m->n++;
	m->live++;
	sh->live++;
	return 0;
}

/* ---- many new ids at once (store.h: mfs_idmap_add_*) ---------------------------------- */

static inline const mfs_id_t *cand_id(const mfs_idmap_add_t *a, size_t x)
{
	return (const mfs_id_t *)(a->base + (size_t)a->idx[x] * a->stride);
}

static inline uint64_t cand_h(const mfs_idmap_add_t *a, size_t x) { return a->h[a->idx[x]]; }

int mfs_idmap_add_begin(mfs_idmap_t *m, mfs_idmap_add_t *a)
{
	size_t count[MFS_IDMAP_SHARDS] = {0}, bytes = 0;
	int rc;
	a->n0 = m->n;
	a->n_new = 0;
	if (a->n >= (size_t)MFS_ROW_NONE - 1 - m->n) /* rows and provisional rows below MFS_ROW_NONE - 1 */
		return MFS_EFULL;
	if (mfs_grow((void **)&a->order, &a->cap_order, a->n, sizeof *a->order) ||
	    mfs_grow((void **)&a->first, &a->cap_first, a->n, sizeof *a->first) ||
	    mfs_grow((void **)&a->slot, &a->cap_slot, a->n, sizeof *a->slot))
		return ENOMEM;
	for (size_t x = 0; x < a->n; x++) {
		const mfs_id_t *id = cand_id(a, x);
		if ((rc = mfs_id_check(id)))
			return rc;
		if (id->kind == MFS_ID_STR)
			bytes += id->len;
		count[shard_of(cand_h(a, x))]++;
	}
	if ((rc = keys_room(m, (size_t)m->n + a->n)) ||
	    (bytes && mfs_grow((void **)&m->arena, &m->arena_cap, m->arena_len + bytes, 1)))
		return rc ? rc : ENOMEM;
	size_t at = 0;
	for (unsigned s = 0; s < MFS_IDMAP_SHARDS; s++) {
		if (count[s] && (rc = shard_room(m, &m->sh[s], count[s])))
			return rc;
		a->start[s] = at;
		at += count[s];
		count[s] = a->start[s];
	}
	a->start[MFS_IDMAP_SHARDS] = at;
	for (size_t x = 0; x < a->n; x++) /* each shard's candidates in their order */
		a->order[count[shard_of(cand_h(a, x))]++] = (uint32_t)x;
	return 0;
}

void mfs_idmap_add_shard(mfs_idmap_t *m, mfs_idmap_add_t *a, unsigned s)
{
	enum { AHEAD = 8 };
	struct shard *sh = &m->sh[s];
	const uint32_t *o = a->order + a->start[s];
	const size_t n = a->start[s + 1] - a->start[s];
	const uint32_t lo = a->n0 + 1; /* row1 of this batch's first candidate */
	size_t added = 0;
	for (size_t y = 0; y < n; y++) {
		if (y + AHEAD < n) {
			const uint64_t ha = cand_h(a, o[y + AHEAD]);
			__builtin_prefetch(&sh->t.s[ha & sh->t.mask], 1);
		}
		const uint32_t x = o[y];
		const mfs_id_t *id = cand_id(a, x);
		const uint64_t h = cand_h(a, x), key = slot_key(id, h);
		/* the candidate is not in the map: it is either new, or the repeat of an earlier
		 * candidate of this batch, whose slot holds row1 = lo + its index */
		size_t i = h & sh->t.mask;
		uint32_t first = x;
		for (; sh->t.s[i].row1; i = (i + 1) & sh->t.mask) {
			const struct slot *sl = &sh->t.s[i];
			if (sl->row1 == TOMB || sl->row1 < lo || sl->key != key || sl->kind != id->kind)
				continue;
			const mfs_id_t *other = cand_id(a, sl->row1 - lo);
			if (id->kind == MFS_ID_U64 ||
			    (other->len == id->len && memcmp(other->str, id->str, id->len) == 0)) {
				first = sl->row1 - lo;
				break;
			}
		}
		a->first[x] = first;
		if (first != x)
			continue;
		/* new: the first empty or dead slot of its chain, a provisional row until numbered */
		i = h & sh->t.mask;
		while (sh->t.s[i].row1 && sh->t.s[i].row1 != TOMB)
			i = (i + 1) & sh->t.mask;
		if (sh->t.s[i].row1 == TOMB)
			sh->t.tombs--;
		sh->t.s[i] = (struct slot){lo + x, id->kind, key};
		a->slot[x] = i;
		added++;
		/* the old table's copies go to other slots of the new one: the slot just written
		 * stays where it is until the batch ends (shard_room made room for all of it) */
		migrate(sh, MIGRATE_STEP);
	}
	sh->live += added;
}

uint32_t mfs_idmap_add_number(mfs_idmap_t *m, mfs_idmap_add_t *a, uint32_t *rows)
{
	uint32_t next = a->n0;
	for (size_t x = 0; x < a->n; x++) {
		const uint32_t f = a->first[x];
		if (f != x) {
			rows[a->idx[x]] = rows[a->idx[f]]; /* f < x: numbered already */
			continue;
		}
		rows[a->idx[x]] = next;
		key_set(m, next++, cand_id(a, x));
	}
	a->n_new = next - a->n0;
	m->n = next;
	m->live += a->n_new;
	return a->n_new;
}

void mfs_idmap_add_end(mfs_idmap_t *m, const mfs_idmap_add_t *a, const uint32_t *rows, unsigned s)
{
	struct table *t = &m->sh[s].t;
	const uint32_t *o = a->order + a->start[s];
	const size_t n = a->start[s + 1] - a->start[s];
	for (size_t y = 0; y < n; y++) {
		const uint32_t x = o[y];
		if (a->first[x] == x)
			t->s[a->slot[x]].row1 = rows[a->idx[x]] + 1;
	}
}

void mfs_idmap_add_free(mfs_idmap_add_t *a)
{
	free(a->order);
	free(a->first);
	free(a->slot);
	a->order = a->first = NULL;
	a->slot = NULL;
	a->cap_order = a->cap_first = a->cap_slot = 0;
}

/* Mark the slot holding row in t dead (if t has it). */
static void table_remove(struct table *t, uint64_t h, const mfs_id_t *id, uint32_t row)
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
	struct shard *sh = &m->sh[shard_of(h)];
	table_remove(&sh->t, h, &id, row);
	if (sh->old.s)
		table_remove(&sh->old, h, &id, row);
	if (id.kind == MFS_ID_STR)
		m->garbage += id.len;
	m->keys[row].kind = 0;
	m->live--;
	sh->live--;
	arena_compact(m);
}

/* Renumber in place: keys move to their new rows, and every slot that names a row (in the tables
 * being filled and in those draining) names its new one. Slots stay where they are, since
 * their place follows the id's hash, not its row; tombstones and the drain positions are
 * untouched, so a rehash under way goes on as it was. O(rows + slots). */
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
	for (unsigned sx = 0; sx < MFS_IDMAP_SHARDS; sx++) {
		struct table *ts[2] = {&m->sh[sx].t, &m->sh[sx].old};
		for (int t = 0; t < 2; t++) {
			if (!ts[t]->s)
				continue;
			for (size_t i = 0; i <= ts[t]->mask; i++) {
				struct slot *s = &ts[t]->s[i];
				if (s->row1 && s->row1 != TOMB)
					s->row1 = perm[s->row1 - 1] + 1;
			}
		}
	}
	return 0;
}
