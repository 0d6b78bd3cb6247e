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
	c->plateau_gain = conf->plateau_gain;
	c->plateau_tol = conf->plateau_tol;
	c->plateau_cap = conf->plateau_cap;
	c->base = c->lr0;
	c->held = 0;
	c->started = !(conf->plateau_gain > 1);
	c->lr = lr_clamp(c, c->lr0);
}

/* Decay: the start off a plateau (lr.h): pass t >= 2 against the best pass before it. */
static void plateau_step(mfs_lr_t *c, double loss)
{
	if (c->started)
		return;
	if (!isfinite(loss)) { /* one step back, and the start is over */
		if (c->held)
			c->base /= c->plateau_gain;
		c->started = 1;
		return;
	}
	if (c->t >= 2 && (c->best_loss - loss) / c->best_loss >= c->plateau_tol) {
		c->started = 1;
		return;
	}
	if (loss < c->best_loss)
		c->best_loss = loss;
	if (c->t < 2)
		return;
	if (c->held == MFS_LR_PLATEAU_MAX) { /* no take-off: the plain schedule from here */
		c->base = c->lr0;
		c->started = 1;
		return;
	}
	c->held++;
	c->base = fmin(c->base * c->plateau_gain, c->lr0 * c->plateau_cap);
}

double mfs_lr_update(mfs_lr_t *c, double loss)
{
	c->t++;
	switch (c->schedule) {
	case MFS_LR_DECAY:
		plateau_step(c, loss);
		c->lr = c->base / (1.0 + c->beta * pow((double)(c->t - c->held), 1.5));
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
