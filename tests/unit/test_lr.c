/* test_lr.c - the learning-rate controller (gpu/lr.h, gpu/lr.c): each schedule's
 * formula exactly, clamping to [lr.min, lr.max], the bold driver's patience, non-finite losses.
 */
#include <math.h>

#include "config/config.h"
#include "gpu/lr.h"
#include "serve/stage_conf.h"
#include "testhelp.h"

/* A controller from the configuration table with the given overrides. */
static void lr_from(mfs_lr_t *c, const char *schedule, const char *const *kv)
{
	mfs_conf_t conf;
	char err[256];
	TEST_OK(mfs_conf_init(&conf));
	TEST_OK(mfs_conf_set(&conf, "lr.schedule", schedule, err, sizeof err));
	for (; kv && kv[0]; kv += 2)
		TEST_ASSERT_MSG(mfs_conf_set(&conf, kv[0], kv[1], err, sizeof err) == 0, "%s", err);
	mfs_lr_conf_t lc;
	mfs_lr_conf_from(&conf, conf.lr_schedule, &lc);
	mfs_lr_init(c, &lc);
	mfs_conf_free(&conf);
}

static void test_fixed(void)
{
	mfs_lr_t c;
	const char *kv[] = {"sgd.lr", "0.02", NULL};
	lr_from(&c, "fixed", kv);
	TEST_ASSERT(c.schedule == MFS_LR_FIXED);
	TEST_ASSERT(c.lr == 0.02);
	const double losses[] = {1.0, 0.5, 2.0, NAN, INFINITY, 0.1};
	for (int j = 0; j < 6; j++)
		TEST_ASSERT(mfs_lr_update(&c, losses[j]) == 0.02);
	TEST_EQ_INT(c.t, 6);
}

static void test_decay(void)
{
	mfs_lr_t c;
	const char *kv[] = {"sgd.lr", "0.1", "lr.beta", "0.3", NULL}; /* a falling loss: no plateau start */
	lr_from(&c, "decay", kv);
	TEST_ASSERT(c.lr == 0.1); /* before any pass: lr0 */
	for (uint64_t t = 1; t <= 50; t++) {
		double want = 0.1 / (1.0 + 0.3 * pow((double)t, 1.5));
		double got = mfs_lr_update(&c, t == 7 ? NAN : 1.0 / (double)t); /* the loss plays no part */
		TEST_ASSERT_MSG(got == want, "t=%llu: %.17g vs %.17g", (unsigned long long)t, got, want);
	}
	/* beta = 0: the decay schedule is constant */
	const char *kv0[] = {"sgd.lr", "0.05", "lr.beta", "0", "lr.plateau_gain", "1", NULL};
	lr_from(&c, "decay", kv0);
	TEST_ASSERT(mfs_lr_update(&c, 1) == 0.05 && mfs_lr_update(&c, 1) == 0.05);
}

/* The start off a plateau: held passes multiply the base and stop the decay clock; the first
 * pass that beats the best loss by plateau_tol ends it; a loss falling from pass 2 on is the
 * plain schedule; no take-off in MFS_LR_PLATEAU_MAX held passes gives up; NaN steps back. */
static void test_plateau_start(void)
{
	mfs_lr_t c, plain;
	const char *kv[] = {"sgd.lr", "0.03", "lr.beta", "0.05", "lr.plateau_gain", "2", NULL}; /* tol 0.003, cap 4 */
	const char *kvp[] = {"sgd.lr", "0.03", "lr.beta", "0.05", "lr.plateau_gain", "1", NULL};
	lr_from(&c, "decay", kv);
	lr_from(&plain, "decay", kvp);
	/* MovieLens-like: -1.2 %, -0.6 %, ... from the second pass: the plain schedule bit for bit */
	const double ml[] = {0.938, 0.9265, 0.9211, 0.9162, 0.9079, 0.95, 0.94};
	for (int j = 0; j < 7; j++) {
		const double a = mfs_lr_update(&c, ml[j]), b = mfs_lr_update(&plain, ml[j]);
		TEST_ASSERT_MSG(a == b, "pass %d: %.17g vs %.17g", j + 1, a, b);
		TEST_ASSERT(!mfs_lr_holding(&c));
	}
	/* a plateau: 0.695, then within 0.3 % of it (a rise too) for 4 passes, then -4 % */
	lr_from(&c, "decay", kv);
	const double pl[] = {0.695, 0.6948, 0.7045, 0.7260, 0.7151, 0.667, 0.64};
	const double base[] = {0.03, 0.06, 0.12, 0.12, 0.12, 0.12, 0.12}; /* cap 4 x 0.03 */
	const uint64_t held[] = {0, 1, 2, 3, 4, 4, 4};
	for (int j = 0; j < 7; j++) {
		const double got = mfs_lr_update(&c, pl[j]);
		const double want = base[j] / (1.0 + 0.05 * pow((double)(j + 1) - (double)held[j], 1.5));
		TEST_ASSERT_MSG(fabs(got - want) < 1e-15, "pass %d: %.17g vs %.17g", j + 1, got, want);
		TEST_EQ_INT(c.held, held[j]);
		TEST_EQ_INT(mfs_lr_holding(&c), j >= 1 && j <= 4);
	}
	/* no take-off: after MFS_LR_PLATEAU_MAX held passes the plain schedule from there */
	lr_from(&c, "decay", kv);
	for (int j = 0; j < 20; j++)
		mfs_lr_update(&c, 0.7);
	TEST_EQ_INT(c.held, MFS_LR_PLATEAU_MAX);
	TEST_ASSERT(!mfs_lr_holding(&c) && c.base == 0.03);
	TEST_ASSERT(fabs(c.lr - 0.03 / (1.0 + 0.05 * pow(20.0 - MFS_LR_PLATEAU_MAX, 1.5))) < 1e-15);
	/* a NaN while held: one step back, the start is over */
	lr_from(&c, "decay", kv);
	mfs_lr_update(&c, 0.7);
	mfs_lr_update(&c, 0.7);
	mfs_lr_update(&c, 0.7); /* base 0.12 */
	mfs_lr_update(&c, NAN);
	TEST_ASSERT(c.base == 0.06 && !mfs_lr_holding(&c));
}

static void test_clamp(void)
{
	mfs_lr_t c;
	/* decay floors at lr.min */
	const char *kv[] = {"sgd.lr", "0.1", "lr.beta", "1", "lr.min", "0.02", "lr.plateau_gain", "1", NULL};
	lr_from(&c, "decay", kv);
	for (uint64_t t = 1; t <= 20; t++) {
		double f = 0.1 / (1.0 + pow((double)t, 1.5));
		double got = mfs_lr_update(&c, 1);
		TEST_ASSERT_MSG(got == (f < 0.02 ? 0.02 : f), "t=%llu: %.17g", (unsigned long long)t, got);
	}
	/* an initial rate above lr.max is clamped from the start */
	const char *kv2[] = {"sgd.lr", "0.5", "lr.max", "0.2", NULL};
	lr_from(&c, "fixed", kv2);
	TEST_ASSERT(c.lr == 0.2);
	TEST_ASSERT(mfs_lr_update(&c, 1) == 0.2);
	/* bold grows up to lr.max and stays there; the clamped value is what it multiplies next */
	const char *kv3[] = {"sgd.lr", "0.1", "lr.up", "2", "lr.down", "0.5", "lr.max", "0.3", NULL};
	lr_from(&c, "bold", kv3);
	TEST_ASSERT(mfs_lr_update(&c, 1.0) == 0.1);  /* baseline */
	TEST_ASSERT(mfs_lr_update(&c, 0.9) == 0.2);
	TEST_ASSERT(mfs_lr_update(&c, 0.8) == 0.3);  /* 0.4 clamped */
	TEST_ASSERT(mfs_lr_update(&c, 0.7) == 0.3);
	TEST_ASSERT(mfs_lr_update(&c, 0.9) == 0.15); /* 0.3 * 0.5, not 0.4 * 0.5 */
	/* bold shrinks down to lr.min and stays there */
	const char *kv4[] = {"sgd.lr", "0.1", "lr.down", "0.1", "lr.min", "0.005", NULL};
	lr_from(&c, "bold", kv4);
	TEST_ASSERT(mfs_lr_update(&c, 1.0) == 0.1);
	TEST_NEAR(mfs_lr_update(&c, 2.0), 0.01, 1e-17);
	TEST_ASSERT(mfs_lr_update(&c, 2.0) == 0.005);
	TEST_ASSERT(mfs_lr_update(&c, 2.0) == 0.005);
}

static void test_bold_patience(void)
{
	mfs_lr_t c;
	const char *kv[] = {"sgd.lr", "0.1", "lr.up", "1.5", "lr.down", "0.5", "lr.patience", "2", NULL};
	lr_from(&c, "bold", kv);
	TEST_EQ_INT(c.patience, 2);
	struct {
		double loss, lr;
	} seq[] = {
		{1.00, 0.1},             /* the first pass is the baseline */
		{0.90, 0.1 * 1.5},       /* a new best: up */
		{0.95, 0.1 * 1.5},       /* worse 1 */
		{0.92, 0.1 * 1.5 * 0.5}, /* worse 2 (still above the best 0.90): down, count restarts */
		{0.91, 0.1 * 1.5 * 0.5}, /* worse 1 */
		{0.85, 0.1 * 1.5 * 0.5 * 1.5}, /* new best: up, count restarts */
		{0.85, 0.1 * 1.5 * 0.5 * 1.5}, /* equal is not lower: worse 1 */
		{NAN, 0.1 * 1.5 * 0.5 * 1.5 * 0.5}, /* non-finite: worse 2 -> down */
		{INFINITY, 0.1 * 1.5 * 0.5 * 1.5 * 0.5}, /* worse 1 */
		{0.80, 0.1 * 1.5 * 0.5 * 1.5 * 0.5 * 1.5}, /* new best */
	};
	for (size_t j = 0; j < sizeof seq / sizeof seq[0]; j++) {
		double got = mfs_lr_update(&c, seq[j].loss);
		TEST_ASSERT_MSG(got == seq[j].lr, "step %zu: %.17g vs %.17g", j, got, seq[j].lr);
	}
	TEST_ASSERT(c.best_loss == 0.80);
	TEST_ASSERT(c.last_loss == 0.80);
	TEST_EQ_INT(c.t, 10);
	TEST_EQ_INT(c.worse, 0);

	/* patience 1 (the classic bold driver): every worse pass cuts */
	const char *kv1[] = {"sgd.lr", "0.1", "lr.up", "1.25", "lr.down", "0.5", "lr.patience", "1", NULL};
	lr_from(&c, "bold", kv1);
	TEST_ASSERT(mfs_lr_update(&c, 1.0) == 0.1);
	TEST_ASSERT(mfs_lr_update(&c, 1.1) == 0.05);
	TEST_ASSERT(mfs_lr_update(&c, 1.2) == 0.025);
	TEST_ASSERT(mfs_lr_update(&c, 0.5) == 0.025 * 1.25);
}

static void test_bold_nonfinite_first(void)
{
	mfs_lr_t c;
	const char *kv[] = {"sgd.lr", "0.1", "lr.up", "2", "lr.down", "0.5", "lr.patience", "1", NULL};
	lr_from(&c, "bold", kv);
	/* a diverged first pass counts as worse; the first finite loss is then only a baseline */
	TEST_ASSERT(mfs_lr_update(&c, NAN) == 0.05);
	TEST_ASSERT(mfs_lr_update(&c, -INFINITY) == 0.025); /* -inf is not an improvement either */
	TEST_ASSERT(mfs_lr_update(&c, 3.0) == 0.025);
	TEST_ASSERT(mfs_lr_update(&c, 2.0) == 0.05);
	TEST_ASSERT(isfinite(c.lr));
}

int main(void)
{
	TEST_RUN(test_fixed);
	TEST_RUN(test_decay);
	TEST_RUN(test_plateau_start);
	TEST_RUN(test_clamp);
	TEST_RUN(test_bold_patience);
	TEST_RUN(test_bold_nonfinite_first);
	return TEST_REPORT();
}
