/* replay.c - see replay.h.
 *
 * DESIGN: runs of consecutive ratings rather than single ones: the window is in arrival order,
 * so a run costs three short memcpy instead of three cache misses per rating, and runs at
 * random places still mix time like single samples do (a run is 32 of up to millions). The
 * order the stream gave the events is what makes one pass worse than shuffled epochs; replay
 * in random order is what undoes it. Drawing the least replayed of two or four runs instead
 * (to even out the passes per rating) measured no better on ml-1m at 20 000 events/s.
 */
#include "serve/replay.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "model_store/life.h"

void mfs_replay_init(mfs_replay_t *rp, double share, size_t window_cap, size_t chunk, double beta, uint64_t seed)
{
	memset(rp, 0, sizeof *rp);
	rp->share = share > 0 ? share : 0;
	rp->beta = beta > 0 ? beta : 0;
	rp->lr_scale = 1.0f;
	rp->debt_cap = rp->share * (double)window_cap;
	rp->chunk = chunk < MFS_REPLAY_RUN ? MFS_REPLAY_RUN : chunk;
	mfs_rng_seed(&rp->rng, seed ^ 0x7265706c6179ull);
}

void mfs_replay_credit(mfs_replay_t *rp, size_t n)
{
	rp->debt += rp->share * (double)n;
	if (rp->debt > rp->debt_cap)
		rp->debt = rp->debt_cap;
}

int mfs_replay_due(const mfs_replay_t *rp, const mfs_window_t *w)
{
	return rp->share > 0 && w->n > 0 && rp->debt >= 1.0;
}

int mfs_replay_next(mfs_replay_t *rp, mfs_window_t *w, mfs_batch_t *out)
{
	*out = (mfs_batch_t){0};
	size_t n = rp->debt < (double)rp->chunk ? (size_t)rp->debt : rp->chunk;
	if (!n || !w->n)
		return 0;
	if (mfs_grow((void **)&rp->u, &rp->cap_u, n, sizeof *rp->u) ||
	    mfs_grow((void **)&rp->i, &rp->cap_i, n, sizeof *rp->i) || mfs_grow((void **)&rp->r, &rp->cap_r, n, sizeof *rp->r))
		return ENOMEM;
	/* the starts first, so the copy loop can prefetch a later run's lines: the window is far
	 * larger than the caches and each run sits at a random place in it (on the GPU machine,
	 * DRAM misses made this loop 43 % of the learner's replay time) */
	const size_t len = w->n < MFS_REPLAY_RUN ? w->n : MFS_REPLAY_RUN;
	const size_t runs = (n + len - 1) / len;
	if (mfs_grow((void **)&rp->at, &rp->cap_at, runs, sizeof *rp->at))
		return ENOMEM;
	size_t nr = 0;
	const double span = (double)(w->n - len + 1); /* run starts, or ages of a run's oldest slot */
	const double tail = rp->tau > 0 ? 1.0 - exp(-span / rp->tau) : 0;
	for (size_t got = 0; got < n; nr++) {
		const size_t run = n - got < len ? n - got : len;
		if (rp->tau > 0) { /* by age: truncated exponential; then the ring slot of that age */
			size_t age = (size_t)(-rp->tau * log1p(-mfs_rng_uniform(&rp->rng) * tail)) + run - 1;
			if (age > w->n - 1)
				age = w->n - 1;
			const size_t newest = w->n < w->cap ? w->n - 1 : (w->pos + w->cap - 1) % w->cap;
			size_t j = (newest + w->n - age) % w->n;
			rp->at[nr] = j + run > w->n ? w->n - run : j;
		} else {
			/* a run that starts in the last run-1 slots would wrap: starts are drawn so it cannot */
			rp->at[nr] = (size_t)(mfs_rng_next(&rp->rng) % (uint64_t)(w->n - run + 1));
		}
		got += run;
	}
	size_t got = 0, kept = 0;
	uint64_t seen = 0;
	const int check = w->m && mfs_model_frees(w->m) > 0;
	for (size_t x = 0; x < nr; x++) {
		if (x + MFS_REPLAY_AHEAD < nr) {
			const size_t a = rp->at[x + MFS_REPLAY_AHEAD], e = a + len - 1 < w->n ? a + len - 1 : w->n - 1;
			__builtin_prefetch(w->u + a);
			__builtin_prefetch(w->u + e);
			__builtin_prefetch(w->i + a);
			__builtin_prefetch(w->i + e);
			__builtin_prefetch(w->r + a);
			__builtin_prefetch(w->r + e);
			__builtin_prefetch(w->seen + a, 1);
			__builtin_prefetch(w->seen + e, 1);
		}
		const size_t run = n - got < len ? n - got : len;
		const size_t at = rp->at[x];
		if (check) { /* rows were freed: slots whose rows name other ids now are left out */
			for (size_t j = at; j < at + run; j++)
				if (mfs_window_slot_ok(w, j)) {
					rp->u[kept] = w->u[j];
					rp->i[kept] = w->i[j];
					rp->r[kept++] = w->r[j];
					seen += w->seen[j];
					w->seen[j] += w->seen[j] < UINT8_MAX;
				}
			got += run;
			continue;
		}
		memcpy(rp->u + got, w->u + at, run * sizeof *rp->u);
		memcpy(rp->i + got, w->i + at, run * sizeof *rp->i);
		memcpy(rp->r + got, w->r + at, run * sizeof *rp->r);
		for (size_t j = at; j < at + run; j++) {
			seen += w->seen[j];
			w->seen[j] += w->seen[j] < UINT8_MAX;
		}
		got += run;
		kept += run;
	}
	/* the pass this is for its ratings: the stream's was the first */
	const double c = 1.0 + (double)seen / (double)(kept ? kept : 1);
	rp->lr_scale = (float)(1.0 / (1.0 + rp->beta * pow(c, 1.5)));
	rp->debt -= (double)n;
	rp->replayed += kept;
	*out = (mfs_batch_t){rp->u, rp->i, rp->r, kept};
	return 0;
}

void mfs_replay_free(mfs_replay_t *rp)
{
	free(rp->u);
	free(rp->i);
	free(rp->r);
	free(rp->at);
	rp->u = rp->i = NULL;
	rp->r = NULL;
	rp->at = NULL;
	rp->cap_u = rp->cap_i = rp->cap_r = rp->cap_at = 0;
}
