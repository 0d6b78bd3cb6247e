/* life.h - the id lifecycle: eviction of the least recently seen row when a table is full,
 * expiry of rows not seen for model.ttl, deletion of an id (docs/OPERATIONS.md, "The id
 * lifecycle").
 *
 * A freed row is dead (its id removed from the idmap) until a new id takes it. Rows freed by
 * expiry and eviction are reused at once: neither can be a row the current batch names (a
 * row resolved in this batch was seen now, and eviction never picks one stamped with this
 * batch). Rows freed by a deletion can be: they wait (pending) until the next batch begins.
 * A reused row gets fresh initial values in the host model and is listed for the engine
 * (mfs_model_reused), which must take them before it applies a batch naming it. An engine
 * that applies batches asynchronously (the CUDA ring) may still hold batches given earlier
 * that name a row's last id: the learner says which batches are applied
 * (mfs_model_applied_through), eviction prefers rows no batch in flight names, and a reused
 * row that may be named is flagged (mfs_model_reused_in_flight) so that the engine applies
 * what it holds before it writes the row. Every
 * removed id is listed (mfs_model_gone_*) until a snapshot takes the list: the snapshot
 * deletes its record in the same transaction as the offsets that cover the removal.
 *
 * Time is event time in seconds: mfs_model_begin_batch's clock, the latest event time seen.
 * Eviction samples MFS_LIFE_SAMPLES live rows and frees the one seen longest ago (Redis's
 * approximate LRU); expiry is checked when an id is looked up (an expired row found is freed
 * and the id starts fresh) and by a sweep of MFS_LIFE_SWEEP rows per table per batch, so an
 * id that never comes back leaves within one sweep of the table after its ttl.
 *
 * Threads: the two entities share nothing here either (users on the rows thread, items on
 * the caller's; store.h); mfs_model_begin_batch runs between batches.
 */
#ifndef MFS_LIFE_H
#define MFS_LIFE_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "model_store/store.h"

#define MFS_LIFE_SAMPLES 16
#define MFS_LIFE_SWEEP 8192

enum mfs_free_why { MFS_FREED_EVICTED, MFS_FREED_EXPIRED, MFS_FREED_DELETED };

struct mfs_gone {
	uint8_t kind;
	uint16_t len;
	uint64_t v; /* u64 value, or offset of the string in gone_str */
};

typedef struct mfs_life {
	uint32_t *free_rows, *pending, *reused;
	size_t n_free, cap_free, n_pending, cap_pending, n_reused, cap_reused;
	struct mfs_gone *gone;
	size_t n_gone, cap_gone;
	char *gone_str;
	size_t gone_len, gone_cap;
	uint64_t freed[3];       /* by enum mfs_free_why */
	uint64_t delete_unknown; /* deletions of ids the table did not hold */
	uint64_t frees;          /* rows freed ever */
	uint32_t sweep;          /* the next row the expiry sweep looks at */
	int in_flight;           /* a row reused since the last clear may be named by a batch in flight */
	mfs_rng_t rng;           /* eviction's samples */
} mfs_life_t;

/** Configure: ttl_s (0: rows never expire), evict (a full table, model.max_*, frees its least
 *  recently seen row for a new id; else the new id's event is dropped). Either turns on the
 *  per-row seen time and batch stamp. Call before rows exist or before a load.
 *  @return 0 or ENOMEM. */
int mfs_model_life(mfs_model_t *m, uint32_t ttl_s, int evict);
/** Between batches: clock_s is the batch's event time (seconds; the clock never goes back).
 *  Deleted rows of the last batch become reusable; the expiry sweep takes its step. */
void mfs_model_begin_batch(mfs_model_t *m, uint32_t clock_s);
/** Delete id from entity ent: its row is freed (reusable from the next batch), its id listed
 *  as gone. @return 1 when the table held it, 0 when not (counted). */
int mfs_model_delete(mfs_model_t *m, int ent, const mfs_id_t *id);
/** Every update naming a row that batch `stamp` (mfs_model_begin_batch's count) or an earlier
 *  one resolved has been applied by the engine. mfs_model_begin_batch assumes every earlier
 *  batch is (a synchronous engine); an asynchronous one calls this after it. */
void mfs_model_applied_through(mfs_model_t *m, uint32_t stamp);
/** Rows named by updates given outside a batch (replay) count as resolved by this batch. */
void mfs_model_stamp_rows(mfs_model_t *m, int ent, const uint32_t *rows, size_t n);
/** Rows of ent given to a new id since mfs_model_reused_clear (host values fresh). */
const uint32_t *mfs_model_reused(const mfs_model_t *m, int ent, size_t *n);
/** 1 when a row mfs_model_reused lists may be named by a batch the engine has not applied. */
int mfs_model_reused_in_flight(const mfs_model_t *m, int ent);
void mfs_model_reused_clear(mfs_model_t *m);
/** Ids removed from ent since mfs_model_gone_clear: the j-th of *n (strings valid until the clear). */
size_t mfs_model_gone_n(const mfs_model_t *m, int ent);
mfs_id_t mfs_model_gone_id(const mfs_model_t *m, int ent, size_t j);
void mfs_model_gone_clear(mfs_model_t *m);
/** Rows freed so far for a reason (enum mfs_free_why); deletions of unknown ids. */
uint64_t mfs_model_freed(const mfs_model_t *m, int ent, int why);
uint64_t mfs_model_delete_unknown(const mfs_model_t *m, int ent);
/** Rows freed ever, both tables: 0 means every retained row index still names its id. */
uint64_t mfs_model_frees(const mfs_model_t *m);

/* model.c's side (life.c calls them) */
/** A freed row ready for a new id, taken off the free list; MFS_ROW_NONE when there is none. */
uint32_t mfs_life_pop_free(mfs_model_t *m, int ent);
/** Free the least recently seen of MFS_LIFE_SAMPLES sampled rows and return it for a new id:
 *  of rows no batch in flight names if a sample is one, else of rows this batch did not name;
 *  MFS_ROW_NONE when no sample qualified or out of memory. */
uint32_t mfs_life_evict(mfs_model_t *m, int ent);
/** Free live row `row` of ent: onto the free list, or (MFS_FREED_DELETED) the pending list.
 *  @return 0 or ENOMEM (the row stays as it was). */
int mfs_life_free_row(mfs_model_t *m, int ent, uint32_t row, int why);
/** Note that row of ent got a new id (the engine must take its fresh values); call before the
 *  row is stamped for its new id. @return 0 or ENOMEM. */
int mfs_life_reused(mfs_model_t *m, int ent, uint32_t row);
/** Renumber the rows on ent's free, pending and reused lists: row r becomes perm[r]
 *  (mfs_model_permute_rows). */
void mfs_life_permute(mfs_model_t *m, int ent, const uint32_t *perm);
void mfs_life_release(mfs_model_t *m);

#endif
