/* test_keycount.c - common/keycount: counts of keys in a batch against a sorted count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/keycount.h"
#include "common/rng.h"
#include "testhelp.h"

static int cmp_u32(const void *a, const void *b)
{
	const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* Every key's count is its number of occurrences; keys not in the batch count 0. Batches of
 * several sizes one after another (a smaller one after a larger: the old counts forgotten),
 * keys at the ends of the range, many repeats, and keys that share their low bits. */
static void test_counts(void)
{
	mfs_keycount_t t = {0};
	const size_t sizes[] = {0, 1, 7, 5000, 100000, 300, 70000};
	mfs_rng_t g;
	mfs_rng_seed(&g, 11);
	for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) {
		const size_t n = sizes[b];
		uint32_t *keys = malloc((n + 1) * sizeof *keys), *sorted = malloc((n + 1) * sizeof *sorted);
		TEST_ASSERT(keys && sorted);
		for (size_t j = 0; j < n; j++) {
			const uint64_t pick = mfs_rng_below(&g, 6);
			keys[j] = pick == 0   ? 0u
			          : pick == 1 ? UINT32_MAX
			          : pick == 2 ? (uint32_t)mfs_rng_below(&g, 50) << 20 /* low bits all zero */
			          : (uint32_t)mfs_rng_below(&g, n / 3 + 2) + 17;
		}
		TEST_OK(mfs_keycount_fill(&t, keys, n));
		memcpy(sorted, keys, n * sizeof *keys);
		qsort(sorted, n, sizeof *sorted, cmp_u32);
		size_t bad = 0, distinct = 0;
		for (size_t j = 0; j < n;) {
			size_t e = j;
			while (e < n && sorted[e] == sorted[j])
				e++;
			bad += mfs_keycount_get(&t, sorted[j]) != e - j;
			distinct++;
			j = e;
		}
		TEST_ASSERT_MSG(bad == 0, "batch %zu: %zu of %zu keys with another count", n, bad, distinct);
		/* keys of an earlier batch that are not in this one: 0 */
		TEST_EQ_INT(mfs_keycount_get(&t, 5u << 28), 0);
		if (n < 1000) {
			size_t gone = 0;
			for (uint32_t k = 17 + (uint32_t)n; k < 40000; k += 13)
				gone += mfs_keycount_get(&t, k) != 0;
			TEST_EQ_INT(gone, 0);
		}
		free(keys);
		free(sorted);
	}
	mfs_keycount_free(&t);
	mfs_keycount_free(&t); /* (twice: a no-op) */
}

/* The bound is at least every key's count (a key's count adds up in its bucket), small when
 * no key is frequent, and at least a frequent key's count. */
static void test_bound(void)
{
	mfs_keycount_t t = {0};
	enum { N = 65536 };
	uint32_t *keys = malloc(N * sizeof *keys);
	TEST_ASSERT(keys != NULL);
	mfs_rng_t g;
	mfs_rng_seed(&g, 5);
	for (int c = 0; c < 3; c++) {
		for (size_t j = 0; j < N; j++) /* rows of a window of recent users; then with one hot row */
			keys[j] = c == 1 && j % 50 == 0 ? 123456u : 20000000u + (uint32_t)mfs_rng_below(&g, 1000000);
		if (c == 2) /* every key the same */
			for (size_t j = 0; j < N; j++)
				keys[j] = 7;
		uint32_t bound;
		TEST_OK(mfs_keycount_bound(&t, keys, N, &bound));
		TEST_OK(mfs_keycount_fill(&t, keys, N));
		uint32_t top = 0;
		for (size_t j = 0; j < N; j++) {
			const uint32_t v = mfs_keycount_get(&t, keys[j]);
			top = v > top ? v : top;
		}
		TEST_ASSERT_MSG(bound >= top, "case %d: bound %u below a count %u", c, bound, top);
		if (c == 0) /* ~8 keys a bucket: far below a hot row's count at any batch size */
			TEST_ASSERT_MSG(bound < 64, "uniform keys: bound %u", bound);
		else
			TEST_ASSERT(top == (c == 1 ? (N + 49) / 50 : N));
	}
	free(keys);
	mfs_keycount_free(&t);
}

int main(void)
{
	TEST_RUN(test_counts);
	TEST_RUN(test_bound);
	return TEST_REPORT();
}
