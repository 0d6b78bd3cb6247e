/* window.h - a retained window: the last `cap` ratings (as rows) the learner applied or held
 * out, in a ring, for the periodic full pass (docs/STREAMING.md "Accuracy while streaming").
 * Rows are stable for the life of the model, so a retained rating stays valid. Memory grows by
 * doubling up to cap, then the oldest ratings are overwritten. Each slot counts the times replay
 * (serve/replay.h) has given its rating to the engine again, saturating at 255.
 */
#ifndef MFS_WINDOW_H
#define MFS_WINDOW_H

#include <stddef.h>
#include <stdint.h>

#include "model_store/store.h"

typedef struct mfs_window {
	uint32_t *u, *i;
	float *r;
	uint8_t *seen;   /* replays of each slot's rating */
	size_t n, cap, alloc, pos;
} mfs_window_t;

/** Append b (cap 0: keeps nothing). @return 0 or ENOMEM. */
int mfs_window_add(mfs_window_t *w, const mfs_batch_t *b);
/** The ratings retained (in no particular order: a full pass does not need one). */
static inline mfs_batch_t mfs_window_batch(const mfs_window_t *w)
{
	mfs_batch_t b = {w->u, w->i, w->r, w->n};
	return b;
}
void mfs_window_free(mfs_window_t *w);

#endif
