/* lr.h - the learning-rate controller (gpu/lr.c): host arithmetic, no kernel.
 *
 * Called once after every full pass with that pass's loss (offline: the training RMSE;
 * streaming: the holdout's RMSE when there is a holdout, else the retained window's); returns
 * the rate for the next pass.
 *   fixed : lr stays lr0.
 *   decay : lr_t = lr0 / (1 + beta * t^1.5), t = passes done (the CuMF_SGD / NOMAD schedule).
 *           With plateau_gain > 1 (train), a start off a plateau: while pass t >= 2 lowers the
 *           loss below the best before it by less than plateau_tol (relative), the base rate is
 *           multiplied by plateau_gain (up to plateau_cap x lr0) and t does not count (held);
 *           the first pass that lowers it more ends the start for good, and from then on
 *           lr_t = base / (1 + beta * (t - held)^1.5). After MFS_LR_PLATEAU_MAX held passes
 *           without that the start gives up (base back to lr0); a non-finite loss ends it one
 *           step back. A loss that falls from the second pass on is the plain schedule, bit
 *           for bit. Small initial factors on a large sparse set sit on the bias-only solution
 *           for many epochs at lr0 (docs/ENGINE.md, "Learning-rate controller").
 *   bold  : bold driver with patience: a pass that lowered the loss multiplies lr by `up`;
 *           after `patience` passes in a row that did not, lr is multiplied by `down`.
 * The result is clamped to [min, max]. A non-finite loss counts as a worse pass.
 */
#ifndef MFS_LR_H
#define MFS_LR_H

#include <stdint.h>

#define MFS_LR_PLATEAU_MAX 8 /* passes a start off a plateau may hold the decay */

enum mfs_lr_schedule { MFS_LR_FIXED = 0, MFS_LR_DECAY = 1, MFS_LR_BOLD = 2 };

/** Its parameters (callers fill it from the configuration table: lr.*, sgd.lr). */
typedef struct mfs_lr_conf {
	int schedule;                   /* enum mfs_lr_schedule */
	double lr0;                     /* the starting rate */
	double beta, up, down, min, max;
	int patience;
	double plateau_gain, plateau_tol, plateau_cap; /* decay: the start off a plateau (1: off) */
} mfs_lr_conf_t;

typedef struct mfs_lr {
	int schedule;
	double lr0, lr;
	double beta, up, down, min, max;
	int patience;
	uint64_t t;       /* passes seen */
	double best_loss; /* lowest loss so far (bold) */
	double last_loss;
	int worse;        /* consecutive passes without improvement (bold) */
	double plateau_gain, plateau_tol, plateau_cap;
	double base;      /* decay: the rate the decay divides (lr0, or the start's) */
	uint64_t held;    /* decay: passes held on the plateau */
	int started;      /* decay: the start off the plateau is over */
} mfs_lr_t;

/** A controller at the start of its schedule: lr = lr0 clamped to [min, max]. */
void mfs_lr_init(mfs_lr_t *c, const mfs_lr_conf_t *conf);
/** 1 while a start off a plateau holds the decay (train's early stopping does not count it). */
static inline int mfs_lr_holding(const mfs_lr_t *c) { return c->schedule == MFS_LR_DECAY && !c->started && c->t >= 2; }
/** Record a pass with loss `loss`; @return the learning rate for the next pass. */
double mfs_lr_update(mfs_lr_t *c, double loss);

#endif
