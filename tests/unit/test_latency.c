/* test_latency.c - serve/latency.c: quantiles without samples, also beyond the fixed range
 * (a backlog's create -> visible latencies of minutes were logged as 10000.5 ms). */
#include <math.h>

#include "serve/latency.h"
#include "testhelp.h"

static void test_quantiles(void)
{
	mfs_hist_t h;
	TEST_OK(mfs_hist_init(&h, 10001, 1.0)); /* 1 ms buckets up to 10 s, as the learner's */
	TEST_ASSERT(isnan(mfs_hist_quantile(&h, 0.5)));
	for (int j = 1; j <= 100; j++)
		mfs_hist_add(&h, j); /* 1..100 ms */
	TEST_ASSERT(fabs(mfs_hist_quantile(&h, 0.5) - 50.5) <= 0.5);
	TEST_ASSERT(fabs(mfs_hist_quantile(&h, 0.99) - 99.5) <= 0.5);
	for (int j = 0; j < 300; j++)
		mfs_hist_add(&h, 60000.0 + j); /* a minute: beyond the fixed range */
	const double p50 = mfs_hist_quantile(&h, 0.5), p99 = mfs_hist_quantile(&h, 0.99);
	TEST_ASSERT_MSG(fabs(p50 / 60150.0 - 1) < 0.02 && fabs(p99 / 60150.0 - 1) < 0.02, "p50 %.1f p99 %.1f", p50, p99);
	mfs_hist_add(&h, 1e12); /* beyond every bucket */
	TEST_ASSERT(isinf(mfs_hist_quantile(&h, 1.0)));
	mfs_hist_add(&h, NAN);
	mfs_hist_add(&h, -5);
	TEST_EQ_INT(h.n, 403);
	mfs_hist_free(&h);
}

int main(void)
{
	TEST_RUN(test_quantiles);
	return TEST_REPORT();
}
