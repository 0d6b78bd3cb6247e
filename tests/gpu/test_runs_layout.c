/* test_runs_layout.c - the runs layout of resident sets (gpu/cuda/runs.cu, mfs_runs_layout):
 * host code, checked without a device; built where the CUDA engine is (exit 77 elsewhere).
 * Every live rating lands in exactly one run of its user, in the order it came in; runs are
 * at most run_max long and of near equal length per user; RUN_SPLIT marks exactly the users
 * with more than one run; unknown rows go to the tail in their order; the run order is a
 * seeded shuffle (same seed, same order; another seed, another). */
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "model_store/store.h"
#include "testhelp.h"

#ifdef MFS_HAVE_CUDA
#include "gpu/cuda/runs_layout.h"

struct set {
	uint32_t *u, *i;
	float *r;
	size_t n;
};

/* n ratings over `users` users, user u drawn with weight ~ 1 / (u + 1) (a few heavy users),
 * some with an unknown user or item; r = the rating's input position, to check order. */
static struct set make(size_t n, uint32_t users, uint64_t seed)
{
	struct set s = {malloc(n * 4), malloc(n * 4), malloc(n * 4), n};
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	for (size_t x = 0; x < n; x++) {
		double w = mfs_rng_uniform(&g);
		s.u[x] = (uint32_t)((double)users * w * w * w); /* skewed to low rows */
		s.i[x] = (uint32_t)mfs_rng_below(&g, 1000);
		if (x % 97 == 5)
			s.i[x] = MFS_ROW_NONE;
		if (x % 89 == 7)
			s.u[x] = MFS_ROW_NONE;
		if (x % 83 == 3)
			s.u[x] = users + 3; /* beyond the table: unknown as well */
		s.r[x] = (float)x;
	}
	return s;
}

static void check(uint32_t users, size_t n, uint32_t run_max)
{
	struct set s = make(n, users, 11 + run_max);
	uint32_t *ou = malloc(n * 4), *oi = malloc(n * 4);
	float *orr = malloc(n * 4);
	struct user_run *runs = NULL;
	size_t nruns = 0;
	TEST_OK(mfs_runs_layout(s.u, s.i, s.r, n, users, run_max, 5, ou, oi, orr, &runs, &nruns));
	size_t live = 0;
	uint32_t *cnt = calloc(users, 4), *nrun = calloc(users, 4);
	for (size_t x = 0; x < n; x++)
		if (s.u[x] < users && s.i[x] != MFS_ROW_NONE)
			live++, cnt[s.u[x]]++;
	/* the output is a permutation of the input: r holds the input position */
	char *seen = calloc(n, 1);
	for (size_t y = 0; y < n; y++) {
		size_t x = (size_t)orr[y];
		TEST_ASSERT_MSG(x < n && !seen[x], "position %zu: input %zu twice or out of range", y, x);
		seen[x] = 1;
		TEST_ASSERT(ou[y] == s.u[x] && oi[y] == s.i[x]);
		/* live ratings first, then the tail in input order */
		int is_live = s.u[x] < users && s.i[x] != MFS_ROW_NONE;
		TEST_ASSERT_MSG(is_live == (y < live), "rating %zu at %zu: live %d, live count %zu", x, y, is_live, live);
		if (y > live)
			TEST_ASSERT(orr[y] > orr[y - 1]);
	}
	/* runs: each covers one user's ratings, cover the live part exactly once, keep order */
	char *cov = calloc(live ? live : 1, 1);
	size_t total = 0;
	for (size_t k = 0; k < nruns; k++) {
		const uint32_t len = runs[k].n & RUN_LEN_MASK, u = runs[k].u;
		TEST_ASSERT_MSG(len >= 1 && len <= run_max, "run %zu length %u (max %u)", k, len, run_max);
		TEST_ASSERT(u < users && runs[k].start + len <= live);
		for (uint32_t j = 0; j < len; j++) {
			size_t y = runs[k].start + j;
			TEST_ASSERT_MSG(!cov[y], "rating %zu in two runs", y);
			cov[y] = 1;
			TEST_ASSERT(ou[y] == u);
			if (j)
				TEST_ASSERT_MSG(orr[y] > orr[y - 1], "user %u: order not kept", u);
		}
		total += len;
		nrun[u]++;
	}
	TEST_ASSERT_MSG(total == live, "runs cover %zu of %zu live ratings", total, live);
	for (size_t k = 0; k < nruns; k++) {
		const uint32_t u = runs[k].u, len = runs[k].n & RUN_LEN_MASK;
		const uint32_t want = (cnt[u] + run_max - 1) / run_max;
		TEST_ASSERT_MSG(nrun[u] == want, "user %u: %u runs, want %u", u, nrun[u], want);
		TEST_ASSERT_MSG(((runs[k].n & RUN_SPLIT) != 0) == (want > 1), "user %u: split flag", u);
		TEST_ASSERT(len == cnt[u] / want || len == cnt[u] / want + 1); /* near equal */
	}
	/* shuffled, seeded: the same seed gives the same run order, another seed another one */
	struct user_run *r2 = NULL, *r3 = NULL;
	size_t n2 = 0, n3 = 0;
	TEST_OK(mfs_runs_layout(s.u, s.i, s.r, n, users, run_max, 5, ou, oi, orr, &r2, &n2));
	TEST_OK(mfs_runs_layout(s.u, s.i, s.r, n, users, run_max, 6, ou, oi, orr, &r3, &n3));
	TEST_ASSERT(n2 == nruns && n3 == nruns && memcmp(r2, runs, nruns * sizeof *runs) == 0);
	if (nruns > 10)
		TEST_ASSERT(memcmp(r3, runs, nruns * sizeof *runs) != 0);
	size_t inorder = 0;
	for (size_t k = 1; k < nruns; k++)
		inorder += runs[k].u >= runs[k - 1].u;
	if (nruns > 100)
		TEST_ASSERT_MSG(inorder < nruns * 3 / 4, "runs look sorted: %zu of %zu in order", inorder, nruns);
	free(r2);
	free(r3);
	free(cov);
	free(seen);
	free(cnt);
	free(nrun);
	free(runs);
	free(ou);
	free(oi);
	free(orr);
	free(s.u);
	free(s.i);
	free(s.r);
}

static void test_layouts(void)
{
	check(1000, 200000, 256); /* heavy low rows: split users beside single-run ones */
	check(1000, 200000, 1);   /* a run per rating */
	check(50, 20000, 7);
	check(3, 10, 256); /* tiny */
	check(100, 0, 256); /* empty */
}

int main(void)
{
	TEST_RUN(test_layouts);
	return TEST_REPORT();
}
#else
int main(void)
{
	TEST_SKIP("the CUDA engine is not built");
}
#endif
