/* test_err.c - every error code has its own string; errno passes through; the installed
 * reader header defines every code it documents, with mfstream's values. */
#include "snapshots/reader/mfs_snap.h"

/* the reader header alone, as a serving process sees it */
static const int snap_codes[] = {MFS_EINVAL, MFS_EFORMAT, MFS_EVERSION, MFS_EIDLEN, MFS_ENOTFOUND, MFS_ELMDB};
#undef MFS_EINVAL
#undef MFS_EFORMAT
#undef MFS_EVERSION
#undef MFS_EIDLEN
#undef MFS_ENOTFOUND
#undef MFS_ELMDB

#include "common/err.h"
#include "testhelp.h"

/* The numbers libmfsnap.so.1 has always returned (a serving binary compares against them). */
static void test_reader_header_codes(void)
{
	const int abi[] = {-31000, -30997, -30996, -30994, -30990, -30988};
	for (size_t j = 0; j < sizeof abi / sizeof abi[0]; j++)
		TEST_EQ_INT(snap_codes[j], abi[j]);
	const int ours[] = {MFS_EINVAL, MFS_EFORMAT, MFS_EVERSION, MFS_EIDLEN, MFS_ENOTFOUND, MFS_ELMDB};
	for (size_t j = 0; j < sizeof ours / sizeof ours[0]; j++)
		TEST_EQ_INT(snap_codes[j], ours[j]);
}

static void test_every_code_has_a_string(void)
{
	TEST_STR_EQ(mfs_strerror(0), "success");
	for (int e = MFS_E_FIRST; e <= MFS_E_LAST; e++) {
		if (MFS_E_RETIRED(e)) { /* a removed code keeps its number out of use */
			TEST_STR_EQ(mfs_strerror(e), "unknown error code");
			continue;
		}
		const char *s = mfs_strerror(e);
		TEST_ASSERT_MSG(s && *s && strcmp(s, "unknown error code") != 0, "code %d has no string", e);
		for (int f = MFS_E_FIRST; f < e; f++)
			TEST_ASSERT_MSG(MFS_E_RETIRED(f) || strcmp(s, mfs_strerror(f)) != 0, "codes %d and %d share \"%s\"", e,
			                f, s);
		/* the serving library reports the same vocabulary */
		TEST_STR_EQ(mfs_snap_strerror(e), s);
	}
	TEST_STR_EQ(mfs_strerror(MFS_E_LAST + 1), "unknown error code");
	TEST_STR_EQ(mfs_strerror(MFS_E_FIRST - 1), "unknown error code");
	TEST_STR_EQ(mfs_strerror(ENOENT), strerror(ENOENT));
}

static void test_errf(void)
{
	char buf[32];
	TEST_EQ_INT(mfs_errf(buf, sizeof buf, MFS_EPARSE, "line %d: %s", 7, "bad"), MFS_EPARSE);
	TEST_STR_EQ(buf, "line 7: bad");
	TEST_EQ_INT(mfs_errf(NULL, 0, MFS_EINVAL, "x"), MFS_EINVAL);
}

int main(void)
{
	TEST_RUN(test_every_code_has_a_string);
	TEST_RUN(test_reader_header_codes);
	TEST_RUN(test_errf);
	return TEST_REPORT();
}
