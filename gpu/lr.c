/* lr.c - the learning-rate controller (gpu/lr.h). Host arithmetic only: every engine reads
 * the rate it returns through mfs_engine_set_hparams (on a GPU, from device memory).
 *
 *   fixed : lr = lr0
 *   decay : lr = lr0 / (1 + beta * t^1.5)                     t = passes seen so far
 *   bold  : a pass whose loss is below the best loss so far multiplies lr by `up`; a pass that
 *           is not (equal, higher, or non-finite) counts as worse, and after `patience` worse
 *           passes in a row lr is multiplied by `down` and the count starts again.
 *           The first finite loss only sets the baseline (there is nothing it could have
 *           lowered); a non-finite loss before it still counts as worse.
 * The result is clamped to [min, max] (min wins if a configuration gives min > max), and the
 * clamped value is the one the next bold step multiplies.
 *
 * DESIGN: pure arithmetic on the caller's struct, in double; one caller (the thread that runs
 * the full passes). Comparing with the best loss rather than the previous one makes patience
 * mean "passes without a new best", so a noisy loss that wobbles below and above the best
 * does not reset it.
 */
#include <math.h>

#include "gpu/lr.h"

static double lr_clamp(const mfs_lr_t *c, double lr)
{
	if (lr > c->max)
		lr = c->max;
	if (lr < c->min)
		lr = c->min;
	return lr;
}

void mfs_lr_init(mfs_lr_t *c, const mfs_lr_conf_t *conf)
{
	c->schedule = conf->schedule;
	c->lr0 = conf->lr0;
	c->beta = conf->beta;
	c->up = conf->up;
	c->down = conf->down;
	c->min = conf->min;
	c->max = conf->max;
	c->patience = conf->patience;
	c->t = 0;
	c->best_loss = INFINITY;
	c->last_loss = NAN;
	c->worse = 0;
	c->lr = lr_clamp(c, c->lr0);
}

double mfs_lr_update(mfs_lr_t *c, double loss)
{
	c->t++;
	switch (c->schedule) {
	case MFS_LR_DECAY:
		c->lr = c->lr0 / (1.0 + c->beta * pow((double)c->t, 1.5));
		break;
	case MFS_LR_BOLD:
		if (isfinite(loss) && loss < c->best_loss) {
			if (isfinite(c->best_loss)) /* else: the first finite loss, a baseline */
				c->lr *= c->up;
			c->best_loss = loss;
			c->worse = 0;
		} else if (++c->worse >= (c->patience > 0 ? c->patience : 1)) {
			c->lr *= c->down;
			c->worse = 0;
		}
		break;
	case MFS_LR_FIXED:
	default:
		c->lr = c->lr0;
		break;
	}
	c->last_loss = loss;
	c->lr = lr_clamp(c, c->lr);
	return c->lr;
}
