/* store.h - model_store: external ids -> dense rows, and the host copy of the model.
 *
 * An external id is an unsigned 64-bit integer or a UTF-8 string of 1..256 bytes; the two
 * kinds never compare equal (u64 7 and string "7" are different ids). Each entity (users,
 * items) has an idmap that hands out dense rows 0, 1, 2, ... in first-seen order, and the
 * model keeps bias + k factors per row plus the global mean mu. mfs_model_permute_rows
 * renumbers a table's rows afterwards (`mfstream train` spreads its items over the table so).
 *
 * Text form of an id (files, CLI): a token that is a canonical decimal u64 ("0", "42", no
 * leading zeros, < 2^64) is a u64 id; any other token is a string id. "str:" forces a
 * string ("str:42"). This keeps "007" and "7" distinct.
 *
 * DESIGN: growth never stops the world. The idmap is an open-addressing table in 32 shards by
 * hash, each rehashing incrementally (a bounded number of buckets per insert, Redis dict.c
 * style), so a batch's new ids can be placed a shard per thread (mfs_idmap_add_*); factor arrays
 * double in capacity, so a row index stays valid forever but the array pointers change when
 * rows are added (mfs_model_user_row, mfs_model_item_row, mfs_model_rows, mfs_model_reserve):
 * engines read m->P / m->Q afresh for every batch. Not thread-safe: one writer (the learner or
 * train thread) adds rows at batch boundaries. The one exception: the
 * users' and the items' halves (idmap, factors, bias, n_ and cap_) share nothing, so
 * mfs_model_rows may run for users on one thread while it runs for items on another, and the
 * steps of mfs_idmap_add_* say which of them may run on several threads.
 */
#ifndef MFS_STORE_H
#define MFS_STORE_H

#include <stddef.h>
#include <stdint.h>

#define MFS_ID_MAX_LEN 256
#define MFS_ROW_NONE UINT32_MAX

enum mfs_id_kind { MFS_ID_U64 = 1, MFS_ID_STR = 2 };

/** A borrowed external id: for MFS_ID_STR, str/len point into someone else's buffer. */
typedef struct mfs_id {
	uint8_t kind;
	uint16_t len;    /* string length in bytes (MFS_ID_STR) */
	uint64_t num;    /* value (MFS_ID_U64) */
	const char *str; /* not NUL-terminated (MFS_ID_STR) */
} mfs_id_t;

static inline mfs_id_t mfs_id_u64(uint64_t v)
{
	mfs_id_t id = {MFS_ID_U64, 0, v, 0};
	return id;
}

/** Parse the text form (see above) of len bytes. @return 0 or MFS_EIDLEN. */
int mfs_id_parse(const char *s, size_t len, mfs_id_t *out);
/** Write the text form into buf (NUL-terminated, truncated to size). @return buf. */
const char *mfs_id_format(const mfs_id_t *id, char *buf, size_t size);
/** Validate an id: strings must be 1..256 bytes of valid UTF-8. @return 0 or MFS_EIDLEN/MFS_EINVAL. */
int mfs_id_check(const mfs_id_t *id);

/* ---- idmap -------------------------------------------------------------------------- */
typedef struct mfs_idmap mfs_idmap_t;

int mfs_idmap_init(mfs_idmap_t **out);
void mfs_idmap_free(mfs_idmap_t *m);
/** From now on a helper thread (mfs-idmap-prep, ended by mfs_idmap_free) maps and touches a
 *  shard's next table when the shard passes 3/8 load, so the rehash at 1/2 finds its pages
 *  there instead of having the kernel zero them under the inserts (tables of 2 MiB and more).
 *  The map's contents and its calls' results are the same either way. @return 0, ENOMEM, EAGAIN. */
int mfs_idmap_prepare_ahead(mfs_idmap_t *m);
/** Tables the helper prepared, rehashes that took one, rehashes that mapped their own. */
void mfs_idmap_prepare_counts(const mfs_idmap_t *m, uint64_t *prepared, uint64_t *used, uint64_t *inline_maps);
/** Row of id, or MFS_ROW_NONE. */
uint32_t mfs_idmap_find(const mfs_idmap_t *m, const mfs_id_t *id);
/** The same with h = mfs_idmap_hash(id) computed beforehand. Reads only: several threads may
 *  look up at once while no thread adds or removes. */
uint32_t mfs_idmap_find_h(const mfs_idmap_t *m, const mfs_id_t *id, uint64_t h);
/** Row of id, adding it if new (*added = 1). @return 0, ENOMEM, MFS_EFULL (2^32-1 rows), MFS_EIDLEN. */
int mfs_idmap_get_or_add(mfs_idmap_t *m, const mfs_id_t *id, uint32_t *row, int *added);
/** The same with h = mfs_idmap_hash(id) computed beforehand (see mfs_idmap_prefetch). */
int mfs_idmap_get_or_add_h(mfs_idmap_t *m, const mfs_id_t *id, uint64_t h, uint32_t *row, int *added);
uint64_t mfs_idmap_hash(const mfs_id_t *id);
/** Hint that the slot of hash h will be probed soon (a cache prefetch; no effect on results). */
void mfs_idmap_prefetch(const mfs_idmap_t *m, uint64_t h);
/** Rows handed out so far, live or dead (the next new row, unless a dead one is reused). */
uint32_t mfs_idmap_size(const mfs_idmap_t *m);
/** Ids held (rows handed out less dead ones). */
uint32_t mfs_idmap_live(const mfs_idmap_t *m);
/** 1 when row holds an id, 0 when it is dead (removed, not reused yet) or out of range. */
int mfs_idmap_alive(const mfs_idmap_t *m, uint32_t row);
/** Add id, which must not be in the map (find gave MFS_ROW_NONE), at `row`: a dead row, or
 *  mfs_idmap_size(m) itself (a new row). @return 0, ENOMEM, MFS_EFULL, MFS_EIDLEN, MFS_EINVAL
 *  (row is live or beyond the size). */
int mfs_idmap_insert_h(mfs_idmap_t *m, const mfs_id_t *id, uint64_t h, uint32_t row);
/** Remove the id of row (no-op for a dead row): the row is dead until inserted into again. */
void mfs_idmap_remove(mfs_idmap_t *m, uint32_t row);
/** The external id of a row (kind 0 for a dead row). A string points into the map: valid
 *  until the next insert or removal. */
mfs_id_t mfs_idmap_key(const mfs_idmap_t *m, uint32_t row);
/** Renumber the rows: the id of row r (live or dead) is at row perm[r] afterwards, for every r
 *  < mfs_idmap_size(m); perm must be a bijection of [0, size) (mfs_model_permute_rows checks
 *  it). @return 0 or ENOMEM (the map unchanged). */
int mfs_idmap_permute(mfs_idmap_t *m, const uint32_t *perm);

/* Many new ids at once, on several threads. The map's slots are split into MFS_IDMAP_SHARDS
 * shards by the top bits of the hash; each shard is placed by one thread while the others place
 * theirs, and the rows are numbered by one thread in the candidates' order, so they are the rows
 * mfs_idmap_get_or_add would give one candidate after another. The candidates are ids that are
 * not in the map (a lookup gave MFS_ROW_NONE); one may repeat an earlier one. In order:
 *   mfs_idmap_add_begin   one thread: checks the ids, makes room (keys, bytes, slots)
 *   mfs_idmap_add_shard   for every shard, any thread: each new id's slot, repeats found
 *   mfs_idmap_add_number  one thread: rows, in order (a repeat gets its first's row)
 *   mfs_idmap_add_end     for every shard, any thread: the slots name their rows
 * Between begin and end the map may be neither read nor changed by anything else. */
#define MFS_IDMAP_SHARD_BITS 5
#define MFS_IDMAP_SHARDS (1u << MFS_IDMAP_SHARD_BITS)
typedef struct mfs_idmap_add {
	/* the candidates, set by the caller: candidate x is the id at base + idx[x] * stride,
	 * its hash (mfs_idmap_hash) h[idx[x]] */
	size_t n;
	const char *base;
	size_t stride;
	const uint32_t *idx;
	const uint64_t *h;
	/* set by the steps */
	uint32_t n0;                            /* mfs_idmap_size before the batch */
	uint32_t n_new;                         /* rows added (mfs_idmap_add_number) */
	size_t start[MFS_IDMAP_SHARDS + 1];     /* shard s's candidates: order[start[s] .. start[s+1]) */
	uint32_t *order;                        /* candidates by shard, each shard's in candidate order */
	uint32_t *first;                        /* first[x]: the candidate x repeats, or x */
	size_t *slot;                           /* a new candidate's slot in its shard */
	size_t cap_order, cap_first, cap_slot;
} mfs_idmap_add_t;

/** Check the candidates (MFS_EIDLEN, MFS_EINVAL), and make room for all of them as new ids.
 *  @return 0, or ENOMEM / MFS_EFULL / an id error with the map's ids unchanged. */
int mfs_idmap_add_begin(mfs_idmap_t *m, mfs_idmap_add_t *a);
/** Shard s's candidates: a slot for each new id, a repeat noted (a->first). Cannot fail. */
void mfs_idmap_add_shard(mfs_idmap_t *m, mfs_idmap_add_t *a, unsigned s);
/** rows[idx[x]] = candidate x's row: new ids get mfs_idmap_size, size + 1, ... in order.
 *  @return the rows added. */
uint32_t mfs_idmap_add_number(mfs_idmap_t *m, mfs_idmap_add_t *a, uint32_t *rows);
/** Shard s's new slots name their rows (rows as mfs_idmap_add_number left it). */
void mfs_idmap_add_end(mfs_idmap_t *m, const mfs_idmap_add_t *a, const uint32_t *rows, unsigned s);
/** Free the scratch arrays of a (the candidates are the caller's). */
void mfs_idmap_add_free(mfs_idmap_add_t *a);

/* ---- model -------------------------------------------------------------------------- */
typedef struct mfs_model_conf {
	int k;              /* factors per row */
	double init_scale;  /* factors ~ N(0, (init_scale)^2 / k) */
	uint64_t seed;      /* factor initialization seed */
} mfs_model_conf_t;

/** The host model. Row r of users: bias bu[r], factors P[r*k .. r*k+k). */
typedef struct mfs_model {
	int k;
	double init_scale;
	uint64_t seed;
	uint32_t n_users, n_items;     /* rows in use */
	uint32_t cap_users, cap_items; /* rows allocated */
	/* rows at and above engine_init_from[ent] that are new (not reused) get their initial factors
	 * from the engine, not here (mfs_engine_take_new_rows: the CUDA engine draws them on the device
	 * with mfs_model_init_row's formula); their host factors stay zero until a sync. MFS_ROW_NONE
	 * (the default): every row is drawn on the host. */
	uint32_t engine_init_from[2];
	float *P, *Q;                  /* cap x k, 64-byte aligned */
	float *bu, *bi;
	double mu;                     /* global mean of accepted ratings */
	double mu_sum;                 /* running sum / count behind mu (streaming) */
	uint64_t mu_count;
	uint64_t events_applied;       /* SGD updates applied since the model was created */
	mfs_idmap_t *users, *items;
	uint32_t max_users, max_items; /* rows a table may hold (0: no bound); a new id past it gets
	                                  MFS_ROW_NONE from mfs_model_rows (model.max_users, serve) */
	unsigned admit_after;          /* a new id takes a row at its Nth sighting (<= 1: the first) */
	struct mfs_admit *admit[2];    /* users, items: sightings of ids not admitted yet (admit.h) */
	/* the id lifecycle (model_store/life.h): rows freed by eviction, expiry and deletion are
	 * given to new ids; per row, indexed [0 users, 1 items], capacity cap_users / cap_items */
	uint16_t *gen[2];              /* times the row was freed (a retained rating of an older
	                                  generation names another id now) */
	uint32_t *seen[2];             /* event time the row was last resolved, seconds (track only) */
	uint32_t *stamp[2];            /* batch (mfs_model_begin_batch) that last resolved it (track only) */
	struct mfs_life *life[2];
	int track;                     /* seen and stamp are kept (model.ttl or model.on_full=evict) */
	int evict;                     /* a full table frees its least recently seen row for a new id */
	uint32_t ttl_s;                /* rows not seen for this long (event time) are freed; 0: never */
	uint32_t clock_s;              /* event time now: the latest given to mfs_model_begin_batch */
	uint32_t batch_stamp;          /* batches begun */
	uint32_t safe_stamp;           /* rows stamped no later are named by no update the engine has
	                                  not applied (mfs_model_applied_through, life.h) */
} mfs_model_t;

int mfs_model_init(const mfs_model_conf_t *conf, mfs_model_t **out);
void mfs_model_free(mfs_model_t *m);
/** Both id maps prepare their next tables ahead on helper threads (mfs_idmap_prepare_ahead):
 *  serve, where new ids arrive at stream speed. @return 0, ENOMEM, EAGAIN. */
int mfs_model_prepare_ahead(mfs_model_t *m);
/** Row for a user/item, adding and initializing it (bias 0, seeded factors) if new. */
int mfs_model_user_row(mfs_model_t *m, const mfs_id_t *id, uint32_t *row);
int mfs_model_item_row(mfs_model_t *m, const mfs_id_t *id, uint32_t *row);
/** rows[j] = the row of the j-th of n ids, `stride` bytes apart (e.g. &ev[0].user and
 * sizeof *ev), entity ent (0 users, 1 items), exactly as n calls of mfs_model_user_row /
 * mfs_model_item_row in order would give (MFS_ROW_NONE for a new id once the table holds
 * max_users / max_items rows); it hashes a few ids ahead and prefetches their
 * slots, so the cache misses of a stream's lookups overlap. @return 0 or the first error
 * (rows before it are resolved). */
int mfs_model_rows(mfs_model_t *m, int ent, const mfs_id_t *ids, size_t stride, size_t n, uint32_t *rows);
/** Turn on admission (model_store/admit.h): a new id takes a row at its n-th sighting (n >= 2;
 *  earlier sightings get MFS_ROW_NONE), counted in sketches of `width` counters per row.
 *  @return 0 or ENOMEM. */
int mfs_model_admit(mfs_model_t *m, unsigned n, size_t width);
/** Sightings of ids in entity ent that their table's admission refused so far. */
uint64_t mfs_model_refused(const mfs_model_t *m, int ent);
/** Row for id in entity ent as mfs_model_user_row / item_row, but past admission and bounds:
 *  restoring a snapshot's rows (snapshots/snap_load.h). @return as they. */
int mfs_model_restore_row(mfs_model_t *m, int ent, const mfs_id_t *id, uint32_t *row);
/** Rows of entity ent (0 users, 1 items) holding an id. */
uint32_t mfs_model_live(const mfs_model_t *m, int ent);
/** Make sure at least n rows are allocated (no rows are added). @return 0 or ENOMEM. */
int mfs_model_reserve(mfs_model_t *m, uint32_t users, uint32_t items);
/** Fold ratings into the running global mean. */
void mfs_model_observe(mfs_model_t *m, double rating_sum, uint64_t count);
/** Renumber the rows of entity ent (0 users, 1 items): what row r held (id, bias, factors,
 *  generation, last-seen time and stamp, a place on the free, pending or reused lists) is at
 *  row perm[r] afterwards, for every r < mfs_idmap_size (rows handed out, dead ones included).
 *  Every id keeps its values; only its row number changes. Rows held outside the model are
 *  the caller's to renumber with the same perm: rating arrays, touched sets, rated trackers,
 *  snapshot stages, an engine's mirror (so call it before an engine opens on the model, or
 *  while none is). Between batches, like every call that changes rows.
 *  @param[in] perm a bijection of [0, rows of ent)
 *  @return 0, MFS_EINVAL (perm is not a bijection), ENOMEM; the model unchanged on error. */
int mfs_model_permute_rows(mfs_model_t *m, int ent, const uint32_t *perm);
/** perm[r] for every row r < mfs_idmap_size of entity ent: a uniformly random permutation
 *  drawn from the model's seed and ent alone (the same on every machine and run), for
 *  mfs_model_permute_rows. */
void mfs_model_draw_order(const mfs_model_t *m, int ent, uint32_t *perm);
/** The deterministic initial factor vector of row `row` of entity `ent` (0 users, 1 items), of
 *  the row's generation: a row given to a new id after it was freed starts from other values. */
void mfs_model_init_row(const mfs_model_t *m, int ent, uint32_t row, float *out);
/* A batch's rows over several threads (serve/rows.c), giving the rows mfs_model_rows would:
 * lookups first (mfs_model_find_h, on any threads), then in event order the ids they did not
 * find (mfs_model_row_h, one thread per side), then the new rows' values
 * (mfs_model_init_fresh, on any threads, distinct rows). Only for models without lifecycle
 * tracking (m->track 0): there a lookup also touches, expires and evicts rows. */
/** Row of id (hash h = mfs_idmap_hash(id)), or MFS_ROW_NONE; adds, touches and frees nothing. */
uint32_t mfs_model_find_h(const mfs_model_t *m, int ent, const mfs_id_t *id, uint64_t h);
/** The row mfs_model_rows gives id, except that a new row's factors and bias are not written:
 *  *fresh = 1 then, and mfs_model_init_fresh must write them before the row is used.
 *  @return as mfs_model_rows. */
int mfs_model_row_h(mfs_model_t *m, int ent, const mfs_id_t *id, uint64_t h, uint32_t *row, int *fresh);
/** A new row's initial factors and zero bias (what mfs_model_rows writes for it). */
void mfs_model_init_fresh(mfs_model_t *m, int ent, uint32_t row);
/* The ids not found, many at once (serve/rows.c): the idmap's steps (mfs_idmap_add_*, on the
 * map of ent, m->users or m->items) with the model's tables grown in the first and its row
 * count set in the third. The rows are those mfs_model_row_h gives one id after another, which
 * they can only be where a new id always gets the next row: no bound, no admission, no free
 * row to reuse, no tracking (mfs_model_add_many_ok). */
/** 1 when entity ent's new ids may be added with mfs_model_add_begin .. _number. */
int mfs_model_add_many_ok(const mfs_model_t *m, int ent);
/** mfs_idmap_add_begin, then room in the model's tables for a->n new rows. @return as that,
 *  MFS_EINVAL (not mfs_model_add_many_ok); the rows held unchanged on error. */
int mfs_model_add_begin(mfs_model_t *m, int ent, mfs_idmap_add_t *a);
/** mfs_idmap_add_number, and the model holds the new rows, [a->n0, a->n0 + a->n_new): those
 *  at and above engine_init_from have bias 0 (the engine draws their factors), the others'
 *  values must be written with mfs_model_init_fresh before they are used. @return a->n_new. */
uint32_t mfs_model_add_number(mfs_model_t *m, int ent, mfs_idmap_add_t *a, uint32_t *rows);

/* ---- ratings as rows --------------------------------------------------------------- */
/** Ratings as dense rows of a model (structure of arrays): what every later stage (engines,
 *  offline sets, the streaming learner) works on. In a loss pass a row may be MFS_ROW_NONE
 *  (an id the model has never seen): it contributes no bias and no factors. */
typedef struct mfs_batch {
	const uint32_t *u;
	const uint32_t *i;
	const float *r;
	size_t n;
} mfs_batch_t;

#endif
