/* lr.h - the learning-rate controller (gpu/lr.c): host arithmetic, no kernel.
 *
 * Called once after every full pass with that pass's loss (offline: the training RMSE;
 * streaming: the holdout's RMSE when there is a holdout, else the retained window's); returns
 * the rate for the next pass.
 *   fixed : lr stays lr0.
 *   decay : lr_t = lr0 / (1 + beta * t^1.5), t = passes done (the CuMF_SGD / NOMAD schedule).
 *   bold  : bold driver with patience: a pass that lowered the loss multiplies lr by `up`;
 *           after `patience` passes in a row that did not, lr is multiplied by `down`.
 * The result is clamped to [min, max]. A non-finite loss counts as a worse pass.
 */
#ifndef MFS_LR_H
#define MFS_LR_H

#include <stdint.h>

enum mfs_lr_schedule { MFS_LR_FIXED = 0, MFS_LR_DECAY = 1, MFS_LR_BOLD = 2 };

/** Its parameters (callers fill it from the configuration table: lr.*, sgd.lr). */
typedef struct mfs_lr_conf {
	int schedule;                   /* enum mfs_lr_schedule */
	double lr0;                     /* the starting rate */
	double beta, up, down, min, max;
	int patience;
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
} mfs_lr_t;

/** A controller at the start of its schedule: lr = lr0 clamped to [min, max]. */
void mfs_lr_init(mfs_lr_t *c, const mfs_lr_conf_t *conf);
/** Record a pass with loss `loss`; @return the learning rate for the next pass. */
double mfs_lr_update(mfs_lr_t *c, double loss);

#endif
