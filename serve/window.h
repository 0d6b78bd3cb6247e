/* window.h - a retained window: the last `cap` ratings (as rows) the learner applied or held
 * out, in a ring, for the periodic full pass (docs/STREAMING.md "Accuracy while streaming").
 * Memory grows by doubling up to cap, then the oldest ratings are overwritten. Each slot counts
 * the times replay (serve/replay.h) has given its rating to the engine again, saturating at 255.
 *
 * A row can be freed and given to another id (model_store/life.h). With a model set (w->m),
 * each slot keeps the generations of its two rows when it was added, and a slot whose row has
 * been freed since is stale: it names another id now. Replay skips stale slots
 * (mfs_window_slot_ok) and the full pass scores only live ones (mfs_window_live). Until the
 * model has freed a row, no generation is read: the check costs nothing.
 */
#ifndef MFS_WINDOW_H
#define MFS_WINDOW_H

#include <stddef.h>
#include <stdint.h>

#include "model_store/store.h"

typedef struct mfs_window {
	uint32_t *u, *i;  /* MFS_ROW_NONE in a slot found stale */
	float *r;
	uint8_t *seen;    /* replays of each slot's rating */
	size_t n, cap, alloc, pos;
	const mfs_model_t *m; /* the rows' model (NULL: rows are never freed) */
	uint16_t *gu, *gi;    /* the rows' generations when the slot was added (with m) */
	uint64_t checked;     /* the model's frees when every slot was last checked */
	size_t stale;         /* slots marked stale */
	uint32_t *lu, *li;    /* mfs_window_live's copy */
	float *lr;
	size_t lcap;
} mfs_window_t;

/** Append b (cap 0: keeps nothing). @return 0 or ENOMEM. */
int mfs_window_add(mfs_window_t *w, const mfs_batch_t *b);
/** 1 when slot j still names the ids it was added with (else it is marked stale). */
int mfs_window_slot_ok(mfs_window_t *w, size_t j);
/** The retained ratings whose rows name their ids still (in no particular order): the window's
 *  own arrays while none is stale, else a copy without the stale ones. @return 0 or ENOMEM. */
int mfs_window_live(mfs_window_t *w, mfs_batch_t *out);
/** The ratings retained (in no particular order: a full pass does not need one). */
static inline mfs_batch_t mfs_window_batch(const mfs_window_t *w)
{
	mfs_batch_t b = {w->u, w->i, w->r, w->n};
	return b;
}
void mfs_window_free(mfs_window_t *w);

#endif
