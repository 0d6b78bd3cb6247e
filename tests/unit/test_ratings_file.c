/* test_ratings_file.c - rating file readers and writers: every format, compression,
 * auto-detection, ids, bad-line policy (skip and fail), binary records, round trips. */
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <stdint.h>
#include <zlib.h>
#include <zstd.h>

#include "common/check.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rng.h"
#include "ingest/ratings_file.h"
#include "model_store/store.h"
#include "testhelp.h"

static const char *tmp;

/* ---- a collecting callback ---------------------------------------------------------- */
#define REC_MAX 64
typedef struct rec {
	char user[300], item[300];
	int ukind, ikind;
	float r;
	int64_t ts;
	uint64_t line;
} rec_t;

typedef struct coll {
	rec_t rec[REC_MAX];
	size_t n;     /* ratings seen */
	int stop_at;  /* return 99 at this rating (1-based), 0 = never */
} coll_t;

static int collect(void *ctx, const mfs_id_t *u, const mfs_id_t *i, float r, int64_t ts, uint64_t line)
{
	coll_t *c = ctx;
	if (c->n < REC_MAX) {
		rec_t *x = &c->rec[c->n];
		mfs_id_format(u, x->user, sizeof x->user);
		mfs_id_format(i, x->item, sizeof x->item);
		x->ukind = u->kind;
		x->ikind = i->kind;
		x->r = r;
		x->ts = ts;
		x->line = line;
	}
	c->n++;
	return c->stop_at && (int)c->n == c->stop_at ? 99 : 0;
}

static mfs_rfile_opts_t opts_default(void)
{
	mfs_rfile_opts_t o = {MFS_RFMT_AUTO, 0, 0.5, 5.0, 5};
	return o;
}

static const char *path_of(const char *name)
{
	static char buf[8][512];
	static int k;
	char *p = buf[k++ % 8];
	snprintf(p, 512, "%s/%s", tmp, name);
	return p;
}

static const char *put(const char *name, const char *text)
{
	const char *p = path_of(name);
	if (test_write_file(p, text, strlen(text)))
		exit(2);
	return p;
}

static int read_file(const char *p, const mfs_rfile_opts_t *o, coll_t *c, mfs_rfile_stats_t *st, char *err,
                     size_t errsz)
{
	memset(c, 0, sizeof *c);
	err[0] = 0;
	return mfs_rfile_read(p, o, collect, c, st, err, errsz);
}

/* ---- formats ------------------------------------------------------------------------ */
static void test_formats(void)
{
	static const struct {
		const char *name, *text;
		int fmt;
		uint64_t lines;
	} cases[] = {
		{"a.tsv", "196\t242\t3\t881250949\n186\t302\t3.5\t891717742\n", MFS_RFMT_TSV, 2},
		{"a.dat", "1::1193::5::978300760\n1::661::3::978302109\n", MFS_RFMT_DAT, 2},
		{"a.csv", "userId,movieId,rating,timestamp\n196,242,3,881250949\n186,302,3.5,891717742\n",
		 MFS_RFMT_CSV, 3},
		{"b.csv", "196,242,3,881250949\n186,302,3.5,891717742\n", MFS_RFMT_CSV, 2},
		{"c.csv", "user,item,rating\n196,242,3\n186,302,3.5\n", MFS_RFMT_CSV, 3},
	};
	for (size_t k = 0; k < MFS_ARRAY_LEN(cases); k++) {
		const char *p = put(cases[k].name, cases[k].text);
		mfs_rfile_opts_t o = opts_default();
		for (int explicit_fmt = 0; explicit_fmt < 2; explicit_fmt++) {
			o.format = explicit_fmt ? cases[k].fmt : MFS_RFMT_AUTO;
			coll_t c;
			mfs_rfile_stats_t st;
			char err[256];
			TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
			TEST_EQ_INT(st.format, cases[k].fmt);
			TEST_EQ_INT(st.lines, cases[k].lines);
			TEST_EQ_INT(st.accepted, 2);
			TEST_EQ_INT(st.rejected, 0);
			TEST_EQ_INT(c.n, 2);
			TEST_EQ_INT(c.rec[0].ukind, MFS_ID_U64);
			TEST_EQ_INT(c.rec[1].line, cases[k].lines);
			if (cases[k].fmt == MFS_RFMT_DAT) {
				TEST_STR_EQ(c.rec[0].item, "1193");
				TEST_NEAR(c.rec[0].r, 5, 0);
				TEST_EQ_INT(c.rec[1].ts, 978302109);
			} else {
				TEST_STR_EQ(c.rec[0].user, "196");
				TEST_STR_EQ(c.rec[1].item, "302");
				TEST_NEAR(c.rec[1].r, 3.5, 0);
				TEST_EQ_INT(c.rec[1].ts, strcmp(cases[k].name, "c.csv") ? 891717742 : 0);
			}
		}
	}
	TEST_STR_EQ(mfs_rfmt_name(MFS_RFMT_TSV), "tsv");
	TEST_STR_EQ(mfs_rfmt_name(MFS_RFMT_BIN), "bin");
	TEST_STR_EQ(mfs_rfmt_name(MFS_RFMT_CSV), "csv");
	TEST_STR_EQ(mfs_rfmt_name(MFS_RFMT_DAT), "dat");
}

static void test_detect_errors(void)
{
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	const char *p = put("nosep.txt", "1 2 3 4\n");
	TEST_EQ_INT(read_file(p, &o, &c, &st, err, sizeof err), MFS_EFORMAT);
	TEST_ASSERT(strstr(err, "nosep.txt") != NULL);
	o.format = MFS_RFMT_BIN;
	p = put("notbin.tsv", "1\t2\t3\n");
	TEST_EQ_INT(read_file(p, &o, &c, &st, err, sizeof err), MFS_EFORMAT);
	TEST_ASSERT(strstr(err, "MFSRAT01") != NULL);
	o.format = MFS_RFMT_AUTO;
	TEST_EQ_INT(read_file(path_of("does-not-exist.tsv"), &o, &c, &st, err, sizeof err), ENOENT);
	TEST_ASSERT(strstr(err, "does-not-exist") != NULL);
	/* blank lines before the first line are skipped for detection and parsing */
	p = put("blank.tsv", "\n\r\n1\t2\t3\n\n");
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.format, MFS_RFMT_TSV);
	TEST_EQ_INT(st.accepted, 1);
	TEST_EQ_INT(c.rec[0].line, 3);
}

static void test_crlf_and_last_line(void)
{
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	const char *p = put("crlf.csv", "userId,movieId,rating,timestamp\r\n1,2,4.5,100\r\n3,4,1,200");
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.format, MFS_RFMT_CSV);
	TEST_EQ_INT(st.accepted, 2);
	TEST_EQ_INT(st.rejected, 0);
	TEST_EQ_INT(c.rec[0].ts, 100);
	TEST_EQ_INT(c.rec[1].ts, 200);
	TEST_STR_EQ(c.rec[1].user, "3");
	p = put("crlf.tsv", "1\t2\t4.5\t100\r\n");
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 1);
	TEST_EQ_INT(c.rec[0].ts, 100);
	p = put("crlf.dat", "1::2::4::100\r\n");
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 1);
	TEST_EQ_INT(c.rec[0].ts, 100);
}

/* ---- bad lines ---------------------------------------------------------------------- */
static const char bad_text[] =
	"1\t1\t4\t100\n"              /* 1 ok */
	"1\t2\n"                      /* 2 too few fields */
	"1\t2\t3\t4\t5\n"             /* 3 too many fields */
	"\t2\t3\t4\n"                 /* 4 empty user */
	"1\t\t3\t4\n"                 /* 5 empty item */
	"1\t2\tabc\t4\n"              /* 6 rating not a number */
	"1\t2\tnan\t4\n"              /* 7 NaN */
	"1\t2\tinf\t4\n"              /* 8 inf */
	"1\t2\t7\t4\n"                /* 9 above max */
	"1\t2\t0.1\t4\n"              /* 10 below min */
	"1\t2\t3\t12x\n"              /* 11 garbage timestamp */
	"1\t2\t3\t1.5\n"              /* 12 fractional timestamp */
	"1\t2\t3\t99999999999999999999\n" /* 13 timestamp overflow */
	"2\t2\t3.5e0\t-5\n"           /* 14 ok: exponent, negative timestamp */
	"3\t3\t 2.5 \t\n"             /* 15 ok: blanks around rating, empty timestamp */
	"4\t4\t5\n";                  /* 16 ok: no timestamp */

static void test_bad_lines_skip(void)
{
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	const char *p = put("bad.tsv", bad_text);
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.lines, 16);
	TEST_EQ_INT(st.accepted, 4);
	TEST_EQ_INT(st.rejected, 12);
	TEST_EQ_INT(st.first_bad_line, 2);
	TEST_ASSERT_MSG(strstr(st.first_error, "line 2") && strstr(st.first_error, "field count"), "%s",
	                st.first_error);
	TEST_EQ_INT(c.rec[0].line, 1);
	TEST_EQ_INT(c.rec[1].line, 14);
	TEST_NEAR(c.rec[1].r, 3.5, 0);
	TEST_EQ_INT(c.rec[1].ts, -5);
	TEST_EQ_INT(c.rec[2].line, 15);
	TEST_NEAR(c.rec[2].r, 2.5, 0);
	TEST_EQ_INT(c.rec[2].ts, 0);
	TEST_EQ_INT(c.rec[3].line, 16);
	/* the same with range checks open: only the structural errors remain */
	o.rating_min = -DBL_MAX;
	o.rating_max = DBL_MAX;
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 6);
	TEST_EQ_INT(st.rejected, 10);
}

static void test_bad_lines_fail(void)
{
	static const struct {
		const char *text;
		uint64_t line;
		const char *reason;
	} cases[] = {
		{"1\t1\t4\n1\t2\n", 2, "field count"},
		{"1\t1\t4\n2\t1\t4\n\t2\t3\n", 3, "empty user id"},
		{"1\t1\t4\n1\t\t3\n", 2, "empty item id"},
		{"1\t1\tx\n", 1, "not a number"},
		{"1\t1\tnan\n", 1, "NaN"},
		{"1\t1\t9\n", 1, "outside"},
		{"1\t1\t4\t1x\n", 1, "timestamp"},
	};
	for (size_t k = 0; k < MFS_ARRAY_LEN(cases); k++) {
		mfs_rfile_opts_t o = opts_default();
		o.fail_on_error = 1;
		coll_t c;
		mfs_rfile_stats_t st;
		char err[256];
		const char *p = put("fail.tsv", cases[k].text);
		TEST_EQ_INT(read_file(p, &o, &c, &st, err, sizeof err), MFS_EPARSE);
		char want[64];
		snprintf(want, sizeof want, "line %llu", (unsigned long long)cases[k].line);
		TEST_ASSERT_MSG(strstr(err, "fail.tsv") && strstr(err, want) && strstr(err, cases[k].reason),
		                "case %zu: %s", k, err);
		TEST_EQ_INT(st.first_bad_line, cases[k].line);
		TEST_EQ_INT(st.rejected, 1);
		TEST_EQ_INT(c.n, cases[k].line - 1); /* stopped at the bad line */
	}
}

static void test_empty_and_cb_stop(void)
{
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	const char *p = put("empty.tsv", "");
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 0);
	TEST_EQ_INT(st.lines, 0);
	p = put("blank-only.csv", "\n\n");
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 0);
	p = put("stop.tsv", "1\t1\t1\n2\t2\t2\n3\t3\t3\n");
	memset(&c, 0, sizeof c);
	c.stop_at = 2;
	TEST_EQ_INT(mfs_rfile_read(p, &o, collect, &c, &st, err, sizeof err), 99);
	TEST_EQ_INT(c.n, 2);
	/* NULL opts and stats are allowed */
	TEST_OK(mfs_rfile_read(p, NULL, NULL, NULL, NULL, err, sizeof err));
}

/* ---- ids ---------------------------------------------------------------------------- */
static void test_ids(void)
{
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	const char *p = put("ids.tsv",
	                    "18446744073709551615\t0\t1\n"
	                    "18446744073709551616\t007\t1\n"
	                    "7\tstr:7\t1\n"
	                    "alice\tfilm\xc3\xa9\t1\n");
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 4);
	TEST_EQ_INT(c.rec[0].ukind, MFS_ID_U64);
	TEST_STR_EQ(c.rec[0].user, "18446744073709551615");
	TEST_EQ_INT(c.rec[0].ikind, MFS_ID_U64);
	TEST_EQ_INT(c.rec[1].ukind, MFS_ID_STR); /* 2^64 does not fit: a string */
	TEST_EQ_INT(c.rec[1].ikind, MFS_ID_STR); /* "007" is not canonical: a string */
	TEST_STR_EQ(c.rec[1].item, "007");
	TEST_EQ_INT(c.rec[2].ukind, MFS_ID_U64);
	TEST_EQ_INT(c.rec[2].ikind, MFS_ID_STR);
	TEST_STR_EQ(c.rec[2].item, "str:7");
	TEST_EQ_INT(c.rec[3].ukind, MFS_ID_STR);
	TEST_STR_EQ(c.rec[3].item, "film\xc3\xa9");

	/* 256 bytes ok, 257 rejected, invalid UTF-8 rejected */
	char *text = malloc(4096);
	char id256[257], id257[258];
	memset(id256, 'a', 256);
	id256[256] = 0;
	memset(id257, 'b', 257);
	id257[257] = 0;
	snprintf(text, 4096, "%s\t1\t1\n1\t%s\t1\n%s\t1\t1\n\xff\xfe\t1\t1\n1\t\xc3\t1\n1\t\xed\xa0\x80\t1\n", id256,
	         id256, id257);
	p = put("longids.tsv", text);
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 2);
	TEST_EQ_INT(st.rejected, 4);
	TEST_EQ_INT(st.first_bad_line, 3);
	TEST_ASSERT_MSG(strstr(st.first_error, "longer than 256"), "%s", st.first_error);
	TEST_EQ_INT(strlen(c.rec[0].user), 256);
	o.fail_on_error = 1;
	p = put("utf8.tsv", "1\t1\t1\n\xff\xfe\t1\t1\n");
	TEST_EQ_INT(read_file(p, &o, &c, &st, err, sizeof err), MFS_EPARSE);
	TEST_ASSERT_MSG(strstr(err, "line 2") && strstr(err, "UTF-8"), "%s", err);
	free(text);
}

/* ---- binary ------------------------------------------------------------------------- */
static void put_le(unsigned char *p, uint64_t v, int n)
{
	for (int k = 0; k < n; k++)
		p[k] = (unsigned char)(v >> (8 * k));
}

static void test_binary_layout(void)
{
	unsigned char b[8 + 3 * 28 + 10];
	memcpy(b, "MFSRAT01", 8);
	float r1 = 4.5f, r2 = 9.0f, r3 = 1.25f;
	uint32_t f;
	memcpy(&f, &r1, 4);
	put_le(b + 8, 18446744073709551615ull, 8);
	put_le(b + 16, 42, 8);
	put_le(b + 24, f, 4);
	put_le(b + 28, (uint64_t)1700000000123ll, 8);
	memcpy(&f, &r2, 4); /* out of range */
	put_le(b + 36, 1, 8);
	put_le(b + 44, 2, 8);
	put_le(b + 52, f, 4);
	put_le(b + 56, 0, 8);
	memcpy(&f, &r3, 4);
	put_le(b + 64, 3, 8);
	put_le(b + 72, 4, 8);
	put_le(b + 80, f, 4);
	put_le(b + 84, (uint64_t)-7ll, 8);
	memset(b + 92, 0xab, 10); /* a partial fourth record */
	const char *p = path_of("layout.bin");
	TEST_OK(test_write_file(p, (const char *)b, 92));
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.format, MFS_RFMT_BIN);
	TEST_EQ_INT(st.lines, 3);
	TEST_EQ_INT(st.accepted, 2);
	TEST_EQ_INT(st.rejected, 1);
	TEST_EQ_INT(st.first_bad_line, 2);
	TEST_STR_EQ(c.rec[0].user, "18446744073709551615");
	TEST_STR_EQ(c.rec[0].item, "42");
	TEST_NEAR(c.rec[0].r, 4.5, 0);
	TEST_EQ_INT(c.rec[0].ts, 1700000000123ll);
	TEST_EQ_INT(c.rec[1].ts, -7);
	TEST_EQ_INT(c.rec[1].line, 3);
	/* truncated trailing record: reported, and fatal in fail mode */
	TEST_OK(test_write_file(p, (const char *)b, sizeof b));
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.rejected, 2);
	TEST_EQ_INT(st.lines, 4);
	o.rating_max = 10;
	o.fail_on_error = 1;
	TEST_EQ_INT(read_file(p, &o, &c, &st, err, sizeof err), MFS_EPARSE);
	TEST_ASSERT_MSG(strstr(err, "record 4") && strstr(err, "truncated") && strstr(err, "layout.bin"), "%s", err);
	TEST_EQ_INT(c.n, 3);
	/* magic only: an empty binary file */
	TEST_OK(test_write_file(p, (const char *)b, 8));
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.format, MFS_RFMT_BIN);
	TEST_EQ_INT(st.accepted, 0);
}

/* ---- compression -------------------------------------------------------------------- */
static const char small_tsv[] = "1\t10\t4\t1\n2\t20\t3.5\t2\n3\t30\t1\t3\n";

static void check_small(const char *p, int expect_rc)
{
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	int rc = read_file(p, &o, &c, &st, err, sizeof err);
	TEST_ASSERT_MSG(rc == expect_rc, "%s: rc=%d (%s) %s", p, rc, mfs_strerror(rc), err);
	if (expect_rc == 0) {
		TEST_EQ_INT(st.accepted, 3);
		TEST_EQ_INT(st.format, MFS_RFMT_TSV);
		TEST_STR_EQ(c.rec[2].item, "30");
	} else {
		TEST_ASSERT_MSG(strstr(err, p) != NULL, "%s", err);
	}
}

static void test_compression(void)
{
	/* gzip by hand (zlib gzwrite), one member and two concatenated members */
	const char *gz = path_of("hand.tsv.gz");
	gzFile g = gzopen(gz, "wb");
	TEST_ASSERT(g != NULL);
	gzwrite(g, small_tsv, (unsigned)strlen(small_tsv));
	gzclose(g);
	check_small(gz, 0);
	const char *gz2 = path_of("two.gz");
	g = gzopen(gz2, "wb");
	gzwrite(g, small_tsv, 10);
	gzclose(g);
	g = gzopen(gz2, "ab");
	gzwrite(g, small_tsv + 10, (unsigned)strlen(small_tsv) - 10);
	gzclose(g);
	check_small(gz2, 0);

	/* zstd by hand, two frames */
	size_t cap = ZSTD_compressBound(sizeof small_tsv) * 2;
	char *z = malloc(cap);
	size_t n1 = ZSTD_compress(z, cap, small_tsv, 7, 3);
	size_t n2 = ZSTD_compress(z + n1, cap - n1, small_tsv + 7, strlen(small_tsv) - 7, 19);
	TEST_ASSERT(!ZSTD_isError(n1) && !ZSTD_isError(n2));
	const char *zp = path_of("hand.zst");
	TEST_OK(test_write_file(zp, z, n1 + n2));
	check_small(zp, 0);
	/* truncated and corrupt streams */
	TEST_OK(test_write_file(zp, z, n1 + n2 - 3));
	check_small(zp, MFS_ECOMPRESS);
	z[n1 + 6] ^= 0x5a;
	z[n1 + 9] ^= 0x5a;
	TEST_OK(test_write_file(zp, z, n1 + n2));
	{
		mfs_rfile_opts_t o = opts_default();
		coll_t c;
		mfs_rfile_stats_t st;
		char err[256];
		int rc = read_file(zp, &o, &c, &st, err, sizeof err);
		TEST_ASSERT_MSG(rc == MFS_ECOMPRESS || (rc == 0 && st.accepted <= 3), "rc=%d", rc);
	}
	free(z);
	FILE *f = fopen(gz, "rb");
	char gzb[256];
	size_t gn = fread(gzb, 1, sizeof gzb, f);
	fclose(f);
	const char *gzt = path_of("trunc.gz");
	TEST_OK(test_write_file(gzt, gzb, gn - 6));
	check_small(gzt, MFS_ECOMPRESS);
	gzb[gn / 2] ^= 0x33;
	gzb[gn / 2 + 1] ^= 0x33;
	TEST_OK(test_write_file(gzt, gzb, gn));
	check_small(gzt, MFS_ECOMPRESS);
	/* gzip followed by garbage */
	memcpy(gzb + gn, "junk", 4);
	gzb[gn / 2] ^= 0x33;
	gzb[gn / 2 + 1] ^= 0x33;
	TEST_OK(test_write_file(gzt, gzb, gn + 4));
	check_small(gzt, MFS_ECOMPRESS);
}

static void test_stdin(void)
{
	const char *gz = path_of("stdin.tsv.gz");
	gzFile g = gzopen(gz, "wb");
	gzwrite(g, small_tsv, (unsigned)strlen(small_tsv));
	gzclose(g);
	int saved = dup(0);
	int fd = open(gz, O_RDONLY);
	TEST_ASSERT(saved >= 0 && fd >= 0);
	dup2(fd, 0);
	close(fd);
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	TEST_OK(read_file("-", &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 3);
	dup2(saved, 0);
	close(saved);
}

/* ---- long lines and many lines ------------------------------------------------------ */
static void test_long_line(void)
{
	size_t big = (1u << 20) + 5000;
	char *t = malloc(big + 64);
	size_t n = (size_t)sprintf(t, "1\t1\t1\n");
	memset(t + n, 'x', big);
	n += big;
	n += (size_t)sprintf(t + n, "\t1\t1\n2\t2\t2\n");
	const char *p = path_of("long.tsv");
	TEST_OK(test_write_file(p, t, n));
	mfs_rfile_opts_t o = opts_default();
	coll_t c;
	mfs_rfile_stats_t st;
	char err[256];
	TEST_OK(read_file(p, &o, &c, &st, err, sizeof err));
	TEST_EQ_INT(st.accepted, 2);
	TEST_EQ_INT(st.rejected, 1);
	TEST_EQ_INT(st.first_bad_line, 2);
	TEST_EQ_INT(c.rec[1].line, 3);
	free(t);
}

/* ---- writer round trips ------------------------------------------------------------- */
typedef struct rt_ctx {
	mfs_rng_t g;
	uint64_t n, bad;
	int strings;
} rt_ctx_t;

/* The i-th record of the round-trip stream (ids may be strings in text formats). */
static void rt_record(mfs_rng_t *g, int strings, uint64_t k, mfs_id_t *u, mfs_id_t *i, float *r, int64_t *ts,
                      char *sbuf)
{
	uint64_t v = mfs_rng_next(g), shift = mfs_rng_next(g) & 63;
	*u = mfs_id_u64(v >> shift); /* ids of every magnitude, up to 2^64 - 1 */
	*i = mfs_id_u64(k % 1000);
	if (strings && k % 7 == 3) {
		int len = snprintf(sbuf, 64, "user-%llu-\xc3\xa9", (unsigned long long)k);
		u->kind = MFS_ID_STR;
		u->str = sbuf;
		u->len = (uint16_t)len;
		u->num = 0;
	}
	if (strings && k % 11 == 5) { /* a string that looks like a number: written with str: */
		i->kind = MFS_ID_STR;
		i->str = "0042";
		i->len = 4;
		i->num = 0;
	}
	*r = (float)(0.5 + 4.5 * mfs_rng_uniform(g));
	if (k % 5 == 0)
		*r = (float)(1 + (int)(k / 5 % 5)); /* whole numbers too */
	*ts = (int64_t)(mfs_rng_next(g) >> 1) - (int64_t)(k % 3 == 0 ? INT64_MAX / 2 : 0);
}

static int rt_check(void *ctx, const mfs_id_t *u, const mfs_id_t *i, float r, int64_t ts, uint64_t line)
{
	rt_ctx_t *c = ctx;
	mfs_id_t eu, ei;
	float er;
	int64_t ets;
	char sbuf[64];
	(void)line;
	rt_record(&c->g, c->strings, c->n++, &eu, &ei, &er, &ets, sbuf);
	int same_u = eu.kind == u->kind && (eu.kind == MFS_ID_U64 ? eu.num == u->num
	                                                            : eu.len == u->len && !memcmp(eu.str, u->str, eu.len));
	int same_i = ei.kind == i->kind && (ei.kind == MFS_ID_U64 ? ei.num == i->num
	                                                            : ei.len == i->len && !memcmp(ei.str, i->str, ei.len));
	if (!same_u || !same_i || er != r || ets != ts) {
		if (c->bad++ < 5)
			fprintf(stderr, "  mismatch at %llu: r %.9g vs %.9g ts %lld vs %lld u %d i %d\n",
			        (unsigned long long)c->n, (double)r, (double)er, (long long)ts, (long long)ets, same_u, same_i);
	}
	return 0;
}

static void test_round_trip(void)
{
	static const char *const names[] = {"rt.tsv", "rt.csv", "rt.dat", "rt.bin", "rt.tsv.gz", "rt.csv.zst",
	                                    "rt.bin.gz", "rt.bin.zst", "rt.dat.zst"};
	static const int fmts[] = {MFS_RFMT_TSV, MFS_RFMT_CSV, MFS_RFMT_DAT, MFS_RFMT_BIN, MFS_RFMT_TSV,
	                           MFS_RFMT_CSV, MFS_RFMT_BIN, MFS_RFMT_BIN, MFS_RFMT_DAT};
	const uint64_t N = 150000; /* several 1 MiB buffers */
	for (size_t k = 0; k < MFS_ARRAY_LEN(names); k++) {
		const char *p = path_of(names[k]);
		int strings = fmts[k] != MFS_RFMT_BIN;
		mfs_rfile_writer_t *w;
		char err[256];
		TEST_OK(mfs_rfile_writer_open(p, MFS_RFMT_AUTO, &w, err, sizeof err));
		mfs_rng_t g;
		mfs_rng_seed(&g, 11);
		int wrc = 0;
		for (uint64_t j = 0; j < N && !wrc; j++) {
			mfs_id_t u, i;
			float r;
			int64_t ts;
			char sbuf[64];
			rt_record(&g, strings, j, &u, &i, &r, &ts, sbuf);
			wrc = mfs_rfile_write(w, &u, &i, r, ts);
		}
		TEST_OK(wrc);
		TEST_OK(mfs_rfile_writer_close(w));
		rt_ctx_t c;
		memset(&c, 0, sizeof c);
		mfs_rng_seed(&c.g, 11);
		c.strings = strings;
		mfs_rfile_opts_t o = opts_default();
		mfs_rfile_stats_t st;
		int rc = mfs_rfile_read(p, &o, rt_check, &c, &st, err, sizeof err);
		TEST_ASSERT_MSG(rc == 0, "%s: %s", names[k], err);
		TEST_ASSERT_MSG(st.format == fmts[k], "%s: format %s", names[k], mfs_rfmt_name(st.format));
		TEST_EQ_INT(st.accepted, N);
		TEST_EQ_INT(st.rejected, 0);
		TEST_ASSERT_MSG(c.bad == 0, "%s: %llu mismatches", names[k], (unsigned long long)c.bad);
	}
}

static void test_writer_refusals(void)
{
	char err[256];
	mfs_rfile_writer_t *w;
	mfs_id_t s = {MFS_ID_STR, 3, 0, "abc"}, one = mfs_id_u64(1);
	TEST_OK(mfs_rfile_writer_open(path_of("w.bin"), MFS_RFMT_AUTO, &w, err, sizeof err));
	TEST_EQ_INT(mfs_rfile_write(w, &s, &one, 1, 0), MFS_EFORMAT);
	TEST_EQ_INT(mfs_rfile_write(w, &one, &s, 1, 0), MFS_EFORMAT);
	TEST_OK(mfs_rfile_write(w, &one, &one, 1, 0));
	TEST_OK(mfs_rfile_writer_close(w));
	static const struct {
		const char *name, *id;
	} bad[] = {{"w.tsv", "a\tb"}, {"w.csv", "a,b"}, {"w.dat", "a::b"}, {"w.dat", "a:"}, {"w.tsv", "a\nb"}};
	for (size_t k = 0; k < MFS_ARRAY_LEN(bad); k++) {
		mfs_id_t b = {MFS_ID_STR, (uint16_t)strlen(bad[k].id), 0, bad[k].id};
		TEST_OK(mfs_rfile_writer_open(path_of(bad[k].name), MFS_RFMT_AUTO, &w, err, sizeof err));
		TEST_EQ_INT(mfs_rfile_write(w, &b, &one, 1, 0), MFS_EFORMAT);
		TEST_OK(mfs_rfile_write(w, &one, &one, 1, 0));
		TEST_OK(mfs_rfile_writer_close(w));
	}
	/* explicit format over the extension; the csv header */
	TEST_OK(mfs_rfile_writer_open(path_of("x.txt"), MFS_RFMT_CSV, &w, err, sizeof err));
	TEST_OK(mfs_rfile_write(w, &one, &one, 2.5f, 9));
	TEST_OK(mfs_rfile_writer_close(w));
	FILE *f = fopen(path_of("x.txt"), "r");
	char line[128] = "";
	TEST_ASSERT(f && fgets(line, sizeof line, f));
	TEST_STR_EQ(line, "userId,movieId,rating,timestamp\n");
	TEST_ASSERT(fgets(line, sizeof line, f) != NULL);
	TEST_STR_EQ(line, "1,1,2.5,9\n");
	fclose(f);
	TEST_EQ_INT(mfs_rfile_writer_open(path_of("nodir/x.tsv"), MFS_RFMT_AUTO, &w, err, sizeof err), ENOENT);
	TEST_EQ_INT(mfs_rfile_writer_close(NULL), 0);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_ERROR); /* the bad-line warnings are expected here */
	tmp = test_tmpdir();
	TEST_RUN(test_formats);
	TEST_RUN(test_detect_errors);
	TEST_RUN(test_crlf_and_last_line);
	TEST_RUN(test_bad_lines_skip);
	TEST_RUN(test_bad_lines_fail);
	TEST_RUN(test_empty_and_cb_stop);
	TEST_RUN(test_ids);
	TEST_RUN(test_binary_layout);
	TEST_RUN(test_compression);
	TEST_RUN(test_stdin);
	TEST_RUN(test_long_line);
	TEST_RUN(test_round_trip);
	TEST_RUN(test_writer_refusals);
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", tmp);
	return TEST_REPORT();
}
