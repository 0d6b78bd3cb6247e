/* testhelp.h - a tiny test harness (after Redis testhelp.h / librdkafka RD_UT_ASSERT).
 *
 *   static void test_x(void) { TEST_ASSERT(1 + 1 == 2); TEST_NEAR(x, 0.5, 1e-6); }
 *   int main(void) { TEST_RUN(test_x); return TEST_REPORT(); }
 *
 * A failed check prints file:line and the expression and counts a failure; the test
 * function goes on (so one run shows every broken check). TEST_REPORT() prints
 * "N passed, N failed" and returns the exit code. TEST_SKIP() exits 77 (ctest: skipped).
 * MFS_TEST_ONLY=substring runs only the tests whose function name contains it (compute-
 * sanitizer runs on the GPU machine); the others are listed and counted as filtered, never
 * as passed.
 */
#ifndef MFS_TESTHELP_H
#define MFS_TESTHELP_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int th_checks, th_failed_checks, th_tests, th_failed_tests, th_cur_failed, th_filtered;

#define TEST_ASSERT_MSG(cond, ...)                                                        \
	do {                                                                                  \
		th_checks++;                                                                      \
		if (!(cond)) {                                                                    \
			th_failed_checks++;                                                           \
			th_cur_failed = 1;                                                            \
			fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);             \
			fprintf(stderr, __VA_ARGS__);                                                 \
			fputc('\n', stderr);                                                          \
		}                                                                                 \
	} while (0)
#define TEST_ASSERT(cond) TEST_ASSERT_MSG(cond, "%s", "")
#define TEST_EQ_INT(a, b)                                                                 \
	TEST_ASSERT_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))
#define TEST_OK(rc) TEST_ASSERT_MSG((rc) == 0, "rc=%d", (int)(rc))
#define TEST_NEAR(a, b, tol)                                                              \
	TEST_ASSERT_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %g)", (double)(a), \
	                (double)(b), (double)(tol))
#define TEST_STR_EQ(a, b) TEST_ASSERT_MSG(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))

#define TEST_RUN(fn)                                                                      \
	do {                                                                                  \
		const char *th_only = getenv("MFS_TEST_ONLY");                                    \
		if (th_only && *th_only && !strstr(#fn, th_only)) {                               \
			th_filtered++;                                                                \
			fprintf(stderr, "[ SKIP ] %s (MFS_TEST_ONLY=%s)\n", #fn, th_only);            \
			break;                                                                        \
		}                                                                                 \
		th_cur_failed = 0;                                                                \
		th_tests++;                                                                       \
		fprintf(stderr, "[ RUN  ] %s\n", #fn);                                            \
		fn();                                                                             \
		if (th_cur_failed)                                                                \
			th_failed_tests++;                                                            \
		fprintf(stderr, "[ %s ] %s\n", th_cur_failed ? "FAIL" : " OK ", #fn);             \
	} while (0)

#define TEST_REPORT()                                                                     \
	(th_filtered ? fprintf(stderr, "%d filtered out by MFS_TEST_ONLY\n", th_filtered) : 0, \
	 fprintf(stderr, "%d passed, %d failed (%d checks)\n", th_tests - th_failed_tests,  \
	         th_failed_tests, th_checks),                                                 \
	 th_failed_tests || (th_filtered && !th_tests) ? 1 : 0) /* a filter that ran nothing fails */

#define TEST_SKIP(...)                                                                    \
	do {                                                                                  \
		fprintf(stderr, "SKIP: " __VA_ARGS__);                                            \
		fputc('\n', stderr);                                                              \
		exit(77);                                                                         \
	} while (0)

/** A fresh temporary directory (removed by the OS's tmp cleaning; tests may rm it). */
static inline const char *test_tmpdir(void)
{
	static char dir[256];
	const char *base = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/mfs-test-XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		exit(2);
	}
	return dir;
}

/** A test's time limit in seconds, times MFS_TEST_TIMEOUT_SCALE (default 3; testhelp.py reads
 *  the same variable). Limits bound waits on conditions, so a passing test takes no longer with a
 *  larger factor; only a machine too busy for the unscaled limit needs one. Deliberate delays and
 *  the product's own deadlines (a probe answered within 1 s) are not limits and do not scale. */
static inline double test_seconds(double s)
{
	const char *e = getenv("MFS_TEST_TIMEOUT_SCALE");
	double f = e && *e ? atof(e) : 3.0;
	return s * (f > 0 ? f : 3.0);
}

/** Path of the mfstream binary (set by ctest as MFS_BIN). */
static inline const char *test_bin(void)
{
	const char *b = getenv("MFS_BIN");
	return b ? b : "./build/mfstream";
}

/** Read a file into buf (at most size - 1 bytes, NUL-terminated; empty when it cannot be
 *  opened). @return 0, or -1 when it cannot be opened. */
static inline int test_slurp(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "rb");
	size_t n = 0;
	if (f) {
		n = fread(buf, 1, size - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
	return f ? 0 : -1;
}

/** Write a whole file; returns 0 on success. */
static inline int test_write_file(const char *path, const char *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = fwrite(data, 1, len, f);
	return (fclose(f) == 0 && w == len) ? 0 : -1;
}

#endif
