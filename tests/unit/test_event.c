/* test_event.c - the wire event (ingest/event.c): encode -> decode round trips in both forms,
 * one test per rejection reason on hand-built bytes, the precedence of message-level reasons,
 * every truncation of valid messages, msgpack-c-packed ratings of every numeric type, unknown
 * and duplicate keys, max_events and header counts that lie, and a seeded mutation loop.
 *
 * Every decode goes through decode_both(), which also runs the msgpack-c reference decoder
 * (tests/fuzz/event_ref.h) on the same bytes and requires the same verdict and events: each
 * case here is a differential test as well as a test of the contract. */
#include <float.h>
#include <stdint.h>

#include <msgpack.h>

#include "common/check.h"
#include "common/err.h"
#include "common/rng.h"
#include "fuzz/event_ref.h"
#include "ingest/event.h"
#include "testhelp.h"

static mfs_events_t es, ref_es;
static msgpack_unpacked ref_u;
static const mfs_event_opts_t opts15 = {1.0, 5.0, 0};
static int last_reason;
static long last_index;
static char last_detail[256];
static long ref_compared, ref_unsure;

static int id_eq(const mfs_id_t *a, const mfs_id_t *b)
{
	if (a->kind != b->kind)
		return 0;
	if (a->kind == MFS_ID_U64)
		return a->num == b->num;
	if (a->kind == 0) /* a delete event's other id: none */
		return 1;
	return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
}

static int ev_eq(const mfs_event_t *a, const mfs_event_t *b)
{
	return a->op == b->op && id_eq(&a->user, &b->user) && id_eq(&a->item, &b->item) &&
	       memcmp(&a->rating, &b->rating, sizeof a->rating) == 0 && a->has_ts == b->has_ts &&
	       (!a->has_ts || a->ts_ms == b->ts_ms);
}

/* Decode with event.c and, where msgpack-c can judge it, with the reference; they must agree. */
static int decode_both_at(const char *file, int line, const void *buf, size_t len,
                          const mfs_event_opts_t *o)
{
	last_reason = -2;
	last_index = -2;
	int rc = mfs_event_decode(buf, len, o, &es, &last_reason, &last_index, last_detail,
	                          sizeof last_detail);
	TEST_ASSERT_MSG(rc == 0 || rc == MFS_EDECODE, "%s:%d: rc=%d", file, line, rc);
	if (rc == MFS_EDECODE) {
		TEST_ASSERT_MSG(es.n == 0, "%s:%d: rejected but n=%zu", file, line, es.n);
		TEST_ASSERT_MSG(last_detail[0] != '\0', "%s:%d: no detail", file, line);
	} else {
		TEST_ASSERT_MSG(es.n >= 1 && last_reason == -1 && last_index == -1, "%s:%d: n=%zu", file,
		                line, es.n);
	}
	if (!ref_event_safe(buf, len))
		return rc;
	int rr = -1;
	long ri = -1;
	int ref = ref_event_decode(&ref_u, buf, len, o, &ref_es, &rr, &ri);
	if (ref == REF_UNSURE) {
		ref_unsure++;
		return rc;
	}
	ref_compared++;
	TEST_ASSERT_MSG((ref == REF_ACCEPT) == (rc == 0), "%s:%d: event.c rc=%d (%s@%ld: %s), ref %s (%s@%ld)",
	                file, line, rc, mfs_reject_name(last_reason), last_index, last_detail,
	                ref == REF_ACCEPT ? "accepts" : "rejects", mfs_reject_name(rr), ri);
	if (ref == REF_REJECT && rc == MFS_EDECODE)
		TEST_ASSERT_MSG(rr == last_reason && ri == last_index, "%s:%d: event.c %s@%ld (%s), ref %s@%ld",
		                file, line, mfs_reject_name(last_reason), last_index, last_detail,
		                mfs_reject_name(rr), ri);
	if (ref == REF_ACCEPT && rc == 0) {
		TEST_ASSERT_MSG(ref_es.n == es.n, "%s:%d: %zu vs %zu events", file, line, ref_es.n, es.n);
		for (size_t k = 0; k < es.n && k < ref_es.n; k++)
			TEST_ASSERT_MSG(ev_eq(&es.ev[k], &ref_es.ev[k]), "%s:%d: event %zu differs", file, line, k);
	}
	return rc;
}
#define decode_both(buf, len, o) decode_both_at(__FILE__, __LINE__, buf, len, o)

#define EXPECT_REJECT(...) EXPECT_REJECT_(__VA_ARGS__) /* lets LIT() expand to two arguments */
#define EXPECT_REJECT_(buf, len, o, why, idx)                                                     \
	do {                                                                                         \
		int rc_ = decode_both(buf, len, o);                                                      \
		TEST_ASSERT_MSG(rc_ == MFS_EDECODE && last_reason == (why) && last_index == (idx),       \
		                "rc=%d %s@%ld (%s), want %s@%ld", rc_, mfs_reject_name(last_reason),     \
		                last_index, last_detail, mfs_reject_name(why), (long)(idx));             \
	} while (0)
#define EXPECT_ACCEPT(...) EXPECT_ACCEPT_(__VA_ARGS__)
#define EXPECT_ACCEPT_(buf, len, o, nev)                                                          \
	do {                                                                                         \
		int rc_ = decode_both(buf, len, o);                                                      \
		TEST_ASSERT_MSG(rc_ == 0 && es.n == (size_t)(nev), "rc=%d %s@%ld (%s) n=%zu, want %zu", \
		                rc_, mfs_reject_name(last_reason), last_index, last_detail, es.n,        \
		                (size_t)(nev));                                                          \
	} while (0)
/* string literal bytes, without the terminating NUL */
#define LIT(s) (s), (sizeof(s) - 1)

/* ---- packing helpers ------------------------------------------------------------------ */

static msgpack_sbuffer sb;
static msgpack_packer pk;

static void pk_reset(void)
{
	msgpack_sbuffer_clear(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
}

static void pk_key(const char *k)
{
	msgpack_pack_str(&pk, strlen(k));
	msgpack_pack_str_body(&pk, k, strlen(k));
}

static void pk_strv(const char *s)
{
	msgpack_pack_str(&pk, strlen(s));
	msgpack_pack_str_body(&pk, s, strlen(s));
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_reject_names(void)
{
	static const char *const want[] = {"not_msgpack", "wrong_type", "missing_field", "nan",
	                                   "rating_range", "id_length", "trailing_bytes", "empty"};
	TEST_EQ_INT(MFS_REJ__COUNT, 8);
	for (int r = 0; r < MFS_REJ__COUNT; r++)
		TEST_STR_EQ(mfs_reject_name(r), want[r]);
	TEST_STR_EQ(mfs_reject_name(-1), "unknown");
	TEST_STR_EQ(mfs_reject_name(MFS_REJ__COUNT), "unknown");
}

static mfs_id_t str_id(const char *s, size_t len)
{
	mfs_id_t id = {MFS_ID_STR, (uint16_t)len, 0, s};
	return id;
}

static void test_round_trip(void)
{
	static char s256[256];
	memset(s256, 'x', sizeof s256);
	memcpy(s256 + 250, "\xc3\xa9\xe2\x82\xac", 5); /* é€ at the very end: still 256 bytes */
	const char *utf8 = "Zo\xc3\xab \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\xac"; /* Zoë 日本 🎬 */
	mfs_event_t ev[6] = {
		{mfs_id_u64(0), mfs_id_u64(UINT64_MAX), 1.0f, 0, 0},
		{mfs_id_u64(UINT64_MAX), mfs_id_u64(0), 5.0f, 1, 1700000000123},
		{str_id("a", 1), str_id(s256, 256), 3.5f, 1, INT64_MIN},
		{str_id(utf8, strlen(utf8)), mfs_id_u64(127), 2.25f, 1, INT64_MAX},
		{mfs_id_u64(128), str_id("7", 1), 4.1f, 0, 0},
		{mfs_id_u64(65536), mfs_id_u64(4294967296u), 1.0000001f, 1, -1},
	};
	mfs_buf_t b = {0};
	for (int compact = 0; compact <= 1; compact++) {
		for (size_t k = 0; k < MFS_ARRAY_LEN(ev); k++) {
			for (int as_array = 0; as_array <= 1; as_array++) {
				b.len = 0;
				TEST_OK(mfs_event_encode(&b, &ev[k], 1, as_array, compact));
				EXPECT_ACCEPT(b.data, b.len, &opts15, 1);
				if (es.n == 1) {
					TEST_ASSERT_MSG(ev_eq(&es.ev[0], &ev[k]), "compact=%d event %zu", compact, k);
					if (es.ev[0].user.kind == MFS_ID_STR) /* borrowed, not copied */
						TEST_ASSERT(es.ev[0].user.str > b.data && es.ev[0].user.str < b.data + b.len);
				}
			}
		}
		/* the whole set as one array message */
		b.len = 0;
		TEST_OK(mfs_event_encode(&b, ev, MFS_ARRAY_LEN(ev), 0, compact));
		EXPECT_ACCEPT(b.data, b.len, &opts15, MFS_ARRAY_LEN(ev));
		for (size_t k = 0; k < es.n; k++)
			TEST_ASSERT_MSG(ev_eq(&es.ev[k], &ev[k]), "batch compact=%d event %zu", compact, k);
	}
	/* exact bytes of the two forms (docs/EVENT_FORMAT.md shows these) */
	mfs_event_t e = {mfs_id_u64(42), str_id("m7", 2), 4.5f, 1, 1700000000000};
	b.len = 0;
	TEST_OK(mfs_event_encode(&b, &e, 1, 0, 1));
	TEST_EQ_INT(b.len, 19);
	TEST_ASSERT(memcmp(b.data, "\x94\x2a\xa2m7\xca\x40\x90\x00\x00\xcf\x00\x00\x01\x8b\xcf\xe5\x68\x00", 19) == 0);
	b.len = 0;
	TEST_OK(mfs_event_encode(&b, &e, 1, 0, 0));
	TEST_EQ_INT(b.len, 27);
	TEST_ASSERT(memcmp(b.data, "\x84\xa1u\x2a\xa1i\xa2m7\xa1r\xca\x40\x90\x00\x00\xa1t", 18) == 0);
	/* encode appends, and n == 0 is the empty array */
	size_t was = b.len;
	TEST_OK(mfs_event_encode(&b, NULL, 0, 0, 0));
	TEST_EQ_INT(b.len, was + 1);
	TEST_EQ_INT((unsigned char)b.data[was], 0x90);
	mfs_buf_free(&b);
	TEST_ASSERT(b.data == NULL && b.len == 0 && b.cap == 0);
}

static void test_reject_not_msgpack(void)
{
	EXPECT_REJECT(LIT("\xc1"), &opts15, MFS_REJ_NOT_MSGPACK, -1);          /* never-used byte */
	EXPECT_REJECT(LIT("\x93\x01\x02"), &opts15, MFS_REJ_NOT_MSGPACK, -1);  /* truncated array */
	EXPECT_REJECT(LIT("\x83\xa1u\x01\xa1i\x02\xa1r\xc1"), &opts15, MFS_REJ_NOT_MSGPACK, -1);
	EXPECT_REJECT(LIT("\xa5" "abc"), &opts15, MFS_REJ_NOT_MSGPACK, -1);    /* short string */
	EXPECT_REJECT(LIT("\x93\x01\x02\xcb\x40"), &opts15, MFS_REJ_NOT_MSGPACK, -1);
	/* text is not MessagePack: '{' (0x7b) is one positive fixint then trailing bytes, so a
	 * JSON producer gets trailing_bytes; documented in EVENT_FORMAT.md */
	EXPECT_REJECT(LIT("{\"u\":1}"), &opts15, MFS_REJ_TRAILING, -1);
}

static void test_reject_wrong_type(void)
{
	EXPECT_REJECT(LIT("\x05"), &opts15, MFS_REJ_WRONG_TYPE, -1);     /* top-level int */
	EXPECT_REJECT(LIT("\xc0"), &opts15, MFS_REJ_WRONG_TYPE, -1);     /* top-level nil */
	EXPECT_REJECT(LIT("\xa3" "abc"), &opts15, MFS_REJ_WRONG_TYPE, -1); /* top-level str */
	EXPECT_REJECT(LIT("\x83\xa1u\xc0\xa1i\x01\xa1r\x03"), &opts15, MFS_REJ_WRONG_TYPE, 0); /* nil id */
	EXPECT_REJECT(LIT("\x93\xff\x01\x03"), &opts15, MFS_REJ_WRONG_TYPE, 0);   /* negative id */
	EXPECT_REJECT(LIT("\x93\xd0\xfe\x01\x03"), &opts15, MFS_REJ_WRONG_TYPE, 0); /* int8 -2 */
	EXPECT_REJECT(LIT("\x93\xc4\x01z\x01\x03"), &opts15, MFS_REJ_WRONG_TYPE, 0); /* bin id */
	EXPECT_REJECT(LIT("\x93\x01\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00\x03"), &opts15,
	              MFS_REJ_WRONG_TYPE, 0);                                      /* float id */
	EXPECT_REJECT(LIT("\x93\x01\x02\xa1" "3"), &opts15, MFS_REJ_WRONG_TYPE, 0); /* str rating */
	EXPECT_REJECT(LIT("\x93\x01\x02\xc3"), &opts15, MFS_REJ_WRONG_TYPE, 0);     /* bool rating */
	EXPECT_REJECT(LIT("\x94\x01\x02\x03\xca\x00\x00\x00\x00"), &opts15, MFS_REJ_WRONG_TYPE, 0); /* float t */
	EXPECT_REJECT(LIT("\x94\x01\x02\x03\xc0"), &opts15, MFS_REJ_WRONG_TYPE, 0); /* nil t */
	EXPECT_REJECT(LIT("\x94\x01\x02\x03\xcf\x80\x00\x00\x00\x00\x00\x00\x00"), &opts15,
	              MFS_REJ_WRONG_TYPE, 0);                                      /* t = 2^63 */
	EXPECT_REJECT(LIT("\x92\x93\x01\x02\x03\x07"), &opts15, MFS_REJ_WRONG_TYPE, 1); /* scalar in batch */
	EXPECT_REJECT(LIT("\x92\x93\x01\x02\x03\x83\xa1u\x01\xa1i\x02\xa1r\x90"), &opts15,
	              MFS_REJ_WRONG_TYPE, 1); /* array rating in event 1 */
}

static void test_reject_missing_field(void)
{
	EXPECT_REJECT(LIT("\x82\xa1u\x01\xa1i\x02"), &opts15, MFS_REJ_MISSING_FIELD, 0);   /* no r */
	EXPECT_REJECT(LIT("\x82\xa1r\x01\xa1i\x02"), &opts15, MFS_REJ_MISSING_FIELD, 0);   /* no u */
	EXPECT_REJECT(LIT("\x80"), &opts15, MFS_REJ_MISSING_FIELD, 0);                     /* {} */
	EXPECT_REJECT(LIT("\x92\x01\x02"), &opts15, MFS_REJ_MISSING_FIELD, 0);             /* [u, i] */
	EXPECT_REJECT(LIT("\x95\x01\x02\x03\x04\x05"), &opts15, MFS_REJ_MISSING_FIELD, 0); /* 5 long */
	EXPECT_REJECT(LIT("\x93\x93\x01\x02\x03\x90\x93\x01\x02\x03"), &opts15, MFS_REJ_MISSING_FIELD, 1);
	/* "U" is not "u": an unknown key, so u is missing */
	EXPECT_REJECT(LIT("\x83\xa1U\x01\xa1i\x02\xa1r\x03"), &opts15, MFS_REJ_MISSING_FIELD, 0);
}

static void test_reject_nan(void)
{
	EXPECT_REJECT(LIT("\x93\x01\x02\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00"), &opts15, MFS_REJ_NAN, 0);
	EXPECT_REJECT(LIT("\x93\x01\x02\xca\x7f\x80\x00\x00"), &opts15, MFS_REJ_NAN, 0);   /* +inf f32 */
	EXPECT_REJECT(LIT("\x93\x01\x02\xcb\xff\xf0\x00\x00\x00\x00\x00\x00"), &opts15, MFS_REJ_NAN, 0);
	EXPECT_REJECT(LIT("\x92\x93\x01\x02\x03\x83\xa1r\xca\xff\xc0\x00\x01\xa1u\x01\xa1i\x02"), &opts15,
	              MFS_REJ_NAN, 1); /* a NaN payload in float32, event 1, r before u */
}

static void test_reject_range(void)
{
	EXPECT_REJECT(LIT("\x93\x01\x02\x06"), &opts15, MFS_REJ_RANGE, 0);
	EXPECT_REJECT(LIT("\x93\x01\x02\x00"), &opts15, MFS_REJ_RANGE, 0);
	EXPECT_REJECT(LIT("\x93\x01\x02\xff"), &opts15, MFS_REJ_RANGE, 0); /* -1 */
	EXPECT_REJECT(LIT("\x93\x01\x02\xcb\x40\x14\x00\x00\x00\x00\x00\x01"), &opts15, MFS_REJ_RANGE, 0);
	/* the ends are included */
	EXPECT_ACCEPT(LIT("\x93\x01\x02\x05"), &opts15, 1);
	EXPECT_ACCEPT(LIT("\x93\x01\x02\x01"), &opts15, 1);
	/* without opts the only bound is float's range: 1e39 cannot become a float */
	EXPECT_REJECT(LIT("\x93\x01\x02\xcb\x48\x07\x82\x87\xf4\x9c\x4a\x1d"), NULL, MFS_REJ_RANGE, 0);
	EXPECT_ACCEPT(LIT("\x93\x01\x02\xcb\x47\xef\xff\xff\xe0\x00\x00\x00"), NULL, 1); /* FLT_MAX */
	TEST_ASSERT(es.n == 1 && es.ev[0].rating == FLT_MAX);
	EXPECT_ACCEPT(LIT("\x93\x01\x02\xd3\x80\x00\x00\x00\x00\x00\x00\x00"), NULL, 1); /* INT64_MIN */
}

static void test_reject_id_length(void)
{
	EXPECT_REJECT(LIT("\x93\xa0\x02\x03"), &opts15, MFS_REJ_ID_LEN, 0);           /* empty */
	EXPECT_REJECT(LIT("\x93\x01\xa1\xff\x03"), &opts15, MFS_REJ_ID_LEN, 0);       /* 0xff */
	EXPECT_REJECT(LIT("\x93\x01\xa2\xc0\x80\x03"), &opts15, MFS_REJ_ID_LEN, 0);   /* overlong NUL */
	EXPECT_REJECT(LIT("\x93\x01\xa3\xed\xa0\x80\x03"), &opts15, MFS_REJ_ID_LEN, 0); /* surrogate */
	EXPECT_REJECT(LIT("\x93\x01\xa2\xe6\x97\x03"), &opts15, MFS_REJ_ID_LEN, 0);   /* cut sequence */
	char m[300];
	size_t n = 0;
	m[n++] = (char)0x93;
	m[n++] = (char)0xda; /* str16 of 257 bytes */
	m[n++] = 0x01;
	m[n++] = 0x01;
	memset(m + n, 'a', 257);
	n += 257;
	m[n++] = 0x02;
	m[n++] = 0x03;
	EXPECT_REJECT(m, n, &opts15, MFS_REJ_ID_LEN, 0);
	m[3] = 0x00; /* 256 bytes: fine (then two bytes too many: trailing) */
	EXPECT_REJECT(m, n, &opts15, MFS_REJ_TRAILING, -1);
	EXPECT_ACCEPT(m, n - 1, &opts15, 1);
	TEST_ASSERT(es.n == 1 && es.ev[0].user.kind == MFS_ID_STR && es.ev[0].user.len == 256);
	/* a str32 header claiming 4 GiB is not an id that is too long, it is truncated bytes */
	EXPECT_REJECT(LIT("\x93\xdb\xff\xff\xff\xff" "ab"), &opts15, MFS_REJ_NOT_MSGPACK, -1);
}

static void test_reject_trailing(void)
{
	EXPECT_REJECT(LIT("\x93\x01\x02\x03\x00"), &opts15, MFS_REJ_TRAILING, -1);
	EXPECT_REJECT(LIT("\x93\x01\x02\x03\x93\x01\x02\x03"), &opts15, MFS_REJ_TRAILING, -1); /* two events */
	EXPECT_REJECT(LIT("\x90\x90"), &opts15, MFS_REJ_TRAILING, -1); /* outranks empty */
}

static void test_reject_empty(void)
{
	EXPECT_REJECT("", 0, &opts15, MFS_REJ_EMPTY, -1);
	EXPECT_REJECT(NULL, 0, &opts15, MFS_REJ_EMPTY, -1);
	EXPECT_REJECT(LIT("\x90"), &opts15, MFS_REJ_EMPTY, -1);
	EXPECT_REJECT(LIT("\xdc\x00\x00"), &opts15, MFS_REJ_EMPTY, -1);
	EXPECT_REJECT(LIT("\xdd\x00\x00\x00\x00"), &opts15, MFS_REJ_EMPTY, -1);
}

/* Message-level reasons outrank event-level ones; events are judged in order, fields in byte
 * order, missing fields after the whole map. */
static void test_precedence(void)
{
	/* bad event 0, then the message is cut: not_msgpack */
	EXPECT_REJECT(LIT("\x92\x93\xc0\x02\x03\x93\x01"), &opts15, MFS_REJ_NOT_MSGPACK, -1);
	/* bad event 0, then a trailing byte: trailing_bytes */
	EXPECT_REJECT(LIT("\x92\x93\xc0\x02\x03\x93\x01\x02\x03\x00"), &opts15, MFS_REJ_TRAILING, -1);
	/* two bad events: the first one wins */
	EXPECT_REJECT(LIT("\x93\x93\x01\x02\x03\x93\x01\x02\x09\x92\x01\x02"), &opts15, MFS_REJ_RANGE, 1);
	/* inside a map: byte order, whatever the key */
	EXPECT_REJECT(LIT("\x83\xa1r\x09\xa1u\xc0\xa1i\x02"), &opts15, MFS_REJ_RANGE, 0);
	EXPECT_REJECT(LIT("\x83\xa1u\xc0\xa1r\x09\xa1i\x02"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	/* a bad field outranks a missing one that only shows at the end of the map */
	EXPECT_REJECT(LIT("\x82\xa1r\x09\xa1u\x01"), &opts15, MFS_REJ_RANGE, 0);
	/* compact: the element count is read first */
	EXPECT_REJECT(LIT("\x92\xc0\x01"), &opts15, MFS_REJ_MISSING_FIELD, 0);
	/* an empty "i" before an array rating: byte order again */
	EXPECT_REJECT(LIT("\x92\x93\x01\x02\x03\x83\xa1u\x01\xa1i\xa0\xa1r\x90"), &opts15, MFS_REJ_ID_LEN, 1);
}

/* Every prefix of a valid message is rejected (not_msgpack, or empty for zero bytes). */
static void check_prefixes(const char *what, const void *buf, size_t len)
{
	EXPECT_ACCEPT(buf, len, &opts15, es.n ? es.n : 1);
	for (size_t cut = 0; cut < len; cut++) {
		int rc = decode_both(buf, cut, &opts15);
		int want = cut ? MFS_REJ_NOT_MSGPACK : MFS_REJ_EMPTY;
		TEST_ASSERT_MSG(rc == MFS_EDECODE && last_reason == want && last_index == -1,
		                "%s cut at %zu of %zu: rc=%d %s@%ld", what, cut, len, rc,
		                mfs_reject_name(last_reason), last_index);
		/* and a heap copy of exactly cut bytes, so ASan sees any read past the end */
		char *copy = malloc(cut ? cut : 1);
		memcpy(copy, buf, cut);
		rc = decode_both(copy, cut, &opts15);
		TEST_ASSERT(rc == MFS_EDECODE && last_reason == want);
		free(copy);
	}
}

static void test_truncation(void)
{
	mfs_event_t ev[3] = {
		{str_id("alice", 5), str_id("m\xc3\xa9tro", 6), 4.5f, 1, -1700000000123},
		{mfs_id_u64(UINT64_MAX), mfs_id_u64(70000), 1.0f, 0, 0},
		{mfs_id_u64(3), str_id("x", 1), 2.0f, 1, 5},
	};
	mfs_buf_t b = {0};
	for (int compact = 0; compact <= 1; compact++) {
		for (int as_array = 0; as_array <= 1; as_array++) {
			b.len = 0;
			TEST_OK(mfs_event_encode(&b, ev, as_array ? 3 : 1, 0, compact));
			es.n = 0;
			check_prefixes(compact ? "compact" : "map", b.data, b.len);
		}
	}
	/* hand-made: float64 rating, extra nested key, str8 and uint64/int64 headers */
	pk_reset();
	msgpack_pack_array(&pk, 2);
	msgpack_pack_map(&pk, 5);
	pk_key("x");
	msgpack_pack_map(&pk, 1);
	pk_key("deep");
	msgpack_pack_array(&pk, 2);
	msgpack_pack_bin(&pk, 3);
	msgpack_pack_bin_body(&pk, "abc", 3);
	msgpack_pack_ext(&pk, 4, 7);
	msgpack_pack_ext_body(&pk, "wxyz", 4);
	pk_key("u");
	pk_strv("a user id that needs a str8 header, being longer than 31 bytes");
	pk_key("i");
	msgpack_pack_fix_uint64(&pk, 12);
	pk_key("r");
	msgpack_pack_double(&pk, 3.25);
	pk_key("t");
	msgpack_pack_fix_int64(&pk, 99);
	msgpack_pack_array(&pk, 3);
	msgpack_pack_fix_uint32(&pk, 1);
	msgpack_pack_fix_uint16(&pk, 2);
	msgpack_pack_fix_int8(&pk, 3);
	es.n = 0;
	check_prefixes("packed", sb.data, sb.size);
	mfs_buf_free(&b);
}

/* Ratings and ids as msgpack-c's packer writes them, every numeric type. */
static void test_packer_types(void)
{
	const mfs_event_opts_t wide = {-1e6, 1e6, 0};
	struct {
		const char *what;
		int kind;
		double v;
	} rt[] = {
		{"fixint", 0, 3}, {"uint8", 1, 200}, {"uint16", 2, 60000}, {"uint32", 3, 70000},
		{"uint64", 4, 999999}, {"int8", 5, -100}, {"int16", 6, -30000}, {"int32", 7, -70000},
		{"int64", 8, -999999}, {"fix_int8 +", 9, 5}, {"float", 10, 2.5}, {"double", 11, -0.1},
		{"pack_int neg", 12, -7}, {"pack_int64 pos", 13, 123456}, {"fix_int64 +", 14, 4},
	};
	for (size_t k = 0; k < MFS_ARRAY_LEN(rt); k++) {
		pk_reset();
		msgpack_pack_array(&pk, 3);
		msgpack_pack_uint64(&pk, k);
		msgpack_pack_uint64(&pk, 1);
		double v = rt[k].v;
		switch (rt[k].kind) {
		case 0: msgpack_pack_uint8(&pk, 3); break; /* the packer picks positive fixint */
		case 1: msgpack_pack_fix_uint8(&pk, (uint8_t)v); break;
		case 2: msgpack_pack_fix_uint16(&pk, (uint16_t)v); break;
		case 3: msgpack_pack_fix_uint32(&pk, (uint32_t)v); break;
		case 4: msgpack_pack_fix_uint64(&pk, (uint64_t)v); break;
		case 5: msgpack_pack_fix_int8(&pk, (int8_t)v); break;
		case 6: msgpack_pack_fix_int16(&pk, (int16_t)v); break;
		case 7: msgpack_pack_fix_int32(&pk, (int32_t)v); break;
		case 8: msgpack_pack_fix_int64(&pk, (int64_t)v); break;
		case 9: msgpack_pack_fix_int8(&pk, (int8_t)v); break;
		case 10: msgpack_pack_float(&pk, (float)v); break;
		case 11: msgpack_pack_double(&pk, v); break;
		case 12: msgpack_pack_int(&pk, (int)v); break;
		case 13: msgpack_pack_int64(&pk, (int64_t)v); break;
		default: msgpack_pack_fix_int64(&pk, (int64_t)v); break;
		}
		EXPECT_ACCEPT(sb.data, sb.size, &wide, 1);
		if (es.n == 1)
			TEST_ASSERT_MSG(es.ev[0].rating == (float)v, "%s: %g", rt[k].what, (double)es.ev[0].rating);
		TEST_EQ_INT(es.n ? es.ev[0].user.num : 999, k);
	}
	/* ids in every unsigned width and as non-negative signed ints (value-based) */
	const uint64_t want = 5;
	for (int w = 0; w < 8; w++) {
		pk_reset();
		msgpack_pack_array(&pk, 3);
		switch (w) {
		case 0: msgpack_pack_fix_uint8(&pk, 5); break;
		case 1: msgpack_pack_fix_uint16(&pk, 5); break;
		case 2: msgpack_pack_fix_uint32(&pk, 5); break;
		case 3: msgpack_pack_fix_uint64(&pk, 5); break;
		case 4: msgpack_pack_fix_int8(&pk, 5); break;
		case 5: msgpack_pack_fix_int16(&pk, 5); break;
		case 6: msgpack_pack_fix_int32(&pk, 5); break;
		default: msgpack_pack_fix_int64(&pk, 5); break;
		}
		msgpack_pack_uint8(&pk, 9);
		msgpack_pack_uint8(&pk, 3);
		EXPECT_ACCEPT(sb.data, sb.size, &opts15, 1);
		TEST_ASSERT_MSG(es.n == 1 && es.ev[0].user.kind == MFS_ID_U64 && es.ev[0].user.num == want,
		                "width %d", w);
	}
	/* timestamps: every int width, negative, and a uint that fits int64 */
	int64_t ts[] = {0, -1, 127, -32, 1700000000123, INT64_MIN, INT64_MAX};
	for (size_t k = 0; k < MFS_ARRAY_LEN(ts); k++) {
		pk_reset();
		msgpack_pack_map(&pk, 4);
		pk_key("t");
		msgpack_pack_int64(&pk, ts[k]);
		pk_key("r");
		msgpack_pack_uint8(&pk, 3);
		pk_key("i");
		pk_strv("it");
		pk_key("u");
		msgpack_pack_uint8(&pk, 1);
		EXPECT_ACCEPT(sb.data, sb.size, &opts15, 1);
		TEST_ASSERT(es.n == 1 && es.ev[0].has_ts && es.ev[0].ts_ms == ts[k]);
	}
}

static void test_unknown_keys(void)
{
	/* extra fields of any type, even nested and with non-string keys, are skipped */
	pk_reset();
	msgpack_pack_map(&pk, 8);
	pk_key("src");
	pk_strv("web");
	pk_key("u");
	msgpack_pack_uint8(&pk, 1);
	msgpack_pack_uint8(&pk, 17); /* an int key */
	msgpack_pack_nil(&pk);
	msgpack_pack_array(&pk, 1); /* an array key */
	msgpack_pack_map(&pk, 1);
	pk_key("i"); /* not the top-level "i" */
	msgpack_pack_nil(&pk);
	msgpack_pack_map(&pk, 1);
	pk_key("r");
	msgpack_pack_true(&pk);
	pk_key("i");
	msgpack_pack_uint8(&pk, 2);
	pk_key("ctx");
	msgpack_pack_map(&pk, 2);
	pk_key("a");
	msgpack_pack_array(&pk, 3);
	msgpack_pack_double(&pk, 1.5);
	msgpack_pack_bin(&pk, 2);
	msgpack_pack_bin_body(&pk, "\x00\x01", 2);
	msgpack_pack_ext(&pk, 1, -1);
	msgpack_pack_ext_body(&pk, "\x00", 1);
	pk_key("b");
	msgpack_pack_false(&pk);
	pk_key("uu");
	msgpack_pack_uint8(&pk, 9);
	pk_key("r");
	msgpack_pack_float(&pk, 4.0f);
	EXPECT_ACCEPT(sb.data, sb.size, &opts15, 1);
	TEST_ASSERT(es.n == 1 && es.ev[0].user.num == 1 && es.ev[0].item.num == 2 && es.ev[0].rating == 4.0f &&
	            !es.ev[0].has_ts);
	/* "u" written as str8 is still "u" (packers use fixstr, but both are the string "u");
	 * ids as str8, non-ASCII fixstr, and ids ending the message take the general path */
	EXPECT_ACCEPT(LIT("\x83\xd9\x01u\x01\xda\x00\x01i\x02\xdb\x00\x00\x00\x01r\x03"), &opts15, 1);
	EXPECT_ACCEPT(LIT("\x93\xd9\x01" "a\xa2\xc3\xa9\x03"), &opts15, 1);
	TEST_ASSERT(es.n == 1 && es.ev[0].user.len == 1 && es.ev[0].item.len == 2);
	EXPECT_ACCEPT(LIT("\x83\xa1r\x03\xa1i\xa2\xc3\xa9\xa1u\xa2\xc3\xa9"), &opts15, 1);
	EXPECT_REJECT(LIT("\x93\xa2\xc3\x28\xa2\xc3\xa9\x03\x00\x00\x00\x00\x00\x00\x00"), &opts15,
	              MFS_REJ_TRAILING, -1);
	EXPECT_REJECT(LIT("\x93\xa2\xc3\x28\xa2\xc3\xa9\x03"), &opts15, MFS_REJ_ID_LEN, 0);
	/* a bin "u" key is unknown, not "u" */
	EXPECT_REJECT(LIT("\x83\xc4\x01u\x01\xa1i\x02\xa1r\x03"), &opts15, MFS_REJ_MISSING_FIELD, 0);
	/* an unknown value nested 200 deep: accepted (msgpack-c stops at 32, event.c does not recurse) */
	char deep[300];
	size_t n = 0;
	memcpy(deep, "\x84\xa1u\x01\xa1i\x02\xa1r\x03\xa1x", 11);
	n = 11;
	for (int k = 0; k < 200; k++)
		deep[n++] = (char)0x91;
	deep[n++] = (char)0xc0;
	EXPECT_ACCEPT(deep, n, &opts15, 1);
	EXPECT_REJECT(deep, n - 1, &opts15, MFS_REJ_NOT_MSGPACK, -1);
	/* an unknown key whose value is cut short */
	EXPECT_REJECT(LIT("\x84\xa1u\x01\xa1i\x02\xa1r\x03\xa1x\xd9\x05" "ab"), &opts15, MFS_REJ_NOT_MSGPACK, -1);
}

static void test_duplicate_keys(void)
{
	EXPECT_REJECT(LIT("\x84\xa1u\x01\xa1i\x02\xa1r\x03\xa1u\x01"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	TEST_ASSERT(strstr(last_detail, "duplicate") != NULL);
	EXPECT_REJECT(LIT("\x84\xa1t\x01\xa1t\x02\xa1u\x01\xa1i\x02"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	EXPECT_REJECT(LIT("\x92\x93\x01\x02\x03\x84\xa1r\x01\xa1u\x01\xa1i\x02\xa1r\x03"), &opts15,
	              MFS_REJ_WRONG_TYPE, 1);
	/* repeated unknown keys are not checked */
	EXPECT_ACCEPT(LIT("\x85\xa1x\x01\xa1x\x02\xa1u\x01\xa1i\x02\xa1r\x03"), &opts15, 1);
}

static void test_batches(void)
{
	/* a batch may mix map and compact events */
	EXPECT_ACCEPT(LIT("\x93\x93\x01\x02\x03\x83\xa1u\xa1" "a\xa1i\x02\xa1r\x04\x94\x05\x06\x05\xd0\x80"), &opts15, 3);
	TEST_ASSERT(es.n == 3 && es.ev[1].user.kind == MFS_ID_STR && es.ev[2].has_ts && es.ev[2].ts_ms == -128);
	/* [[u, i, r]]: a batch of one compact event; [u, i, r]: one compact event */
	EXPECT_ACCEPT(LIT("\x91\x93\x01\x02\x03"), &opts15, 1);
	EXPECT_ACCEPT(LIT("\x93\xa1" "a\xa1" "b\x03"), &opts15, 1);
	/* the batch rule looks at the first element only: [u, [..], r] is a compact event */
	EXPECT_REJECT(LIT("\x93\x01\x90\x03"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	/* the output is reused: a rejected message leaves n = 0, a good one refills it */
	EXPECT_REJECT(LIT("\x93\x01\x02\x09"), &opts15, MFS_REJ_RANGE, 0);
	TEST_EQ_INT(es.n, 0);
}

/* Deletions: {"op": "delete", "u": id} or {"op": "delete", "i": id}, validated like ratings and
 * written back by the packer. */
static void test_delete_events(void)
{
	EXPECT_ACCEPT(LIT("\x82\xa2op\xa6" "delete\xa1u\x07"), &opts15, 1);
	TEST_ASSERT(es.ev[0].op == MFS_OP_DEL_USER && es.ev[0].user.num == 7 && es.ev[0].item.kind == 0);
	EXPECT_ACCEPT(LIT("\x83\xa1i\xa3" "abc\xa2op\xa6" "delete\xa1t\x05"), &opts15, 1);
	TEST_ASSERT(es.ev[0].op == MFS_OP_DEL_ITEM && es.ev[0].item.len == 3 && es.ev[0].has_ts && es.ev[0].ts_ms == 5);
	/* a batch mixing ratings and a deletion */
	EXPECT_ACCEPT(LIT("\x92\x93\x01\x02\x03\x82\xa2op\xa6" "delete\xa1u\x01"), &opts15, 2);
	TEST_ASSERT(es.ev[0].op == MFS_OP_RATE && es.ev[1].op == MFS_OP_DEL_USER);
	EXPECT_REJECT(LIT("\x82\xa2op\xa6" "update\xa1u\x07"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	EXPECT_REJECT(LIT("\x82\xa2op\x01\xa1u\x07"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	EXPECT_REJECT(LIT("\x83\xa2op\xa6" "delete\xa1u\x07\xa1i\x08"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	EXPECT_REJECT(LIT("\x83\xa2op\xa6" "delete\xa1u\x07\xa1r\x03"), &opts15, MFS_REJ_WRONG_TYPE, 0);
	EXPECT_REJECT(LIT("\x81\xa2op\xa6" "delete"), &opts15, MFS_REJ_MISSING_FIELD, 0);
	EXPECT_REJECT(LIT("\x82\xa2op\xa6" "delete\xa1u\xa0"), &opts15, MFS_REJ_ID_LEN, 0);
	/* the packer's form decodes to the same deletion */
	mfs_event_t d[2] = {{.op = MFS_OP_DEL_USER, .user = {MFS_ID_STR, 5, 0, "alice"}},
	                    {.op = MFS_OP_DEL_ITEM, .item = mfs_id_u64(9), .has_ts = 1, .ts_ms = 1234}};
	mfs_buf_t b = {0};
	TEST_OK(mfs_event_encode(&b, d, 2, 1, 1)); /* compact asked: a deletion has only the map form */
	EXPECT_ACCEPT(b.data, b.len, &opts15, 2);
	TEST_ASSERT(ev_eq(&es.ev[0], &d[0]) && ev_eq(&es.ev[1], &d[1]));
	mfs_buf_free(&b);
}

static void test_max_events(void)
{
	mfs_event_opts_t o = {1.0, 5.0, 1000};
	mfs_event_t *ev = calloc(100000, sizeof *ev);
	for (size_t k = 0; k < 100000; k++) {
		ev[k].user = mfs_id_u64(k);
		ev[k].item = mfs_id_u64(k * 7);
		ev[k].rating = (float)(1 + k % 5);
	}
	mfs_buf_t b = {0};
	TEST_OK(mfs_event_encode(&b, ev, 1000, 1, 1));
	EXPECT_ACCEPT(b.data, b.len, &o, 1000);
	b.len = 0;
	TEST_OK(mfs_event_encode(&b, ev, 1001, 1, 1));
	EXPECT_REJECT(b.data, b.len, &o, MFS_REJ_WRONG_TYPE, -1);
	TEST_ASSERT(strstr(last_detail, "max_events") != NULL);
	b.len = 0;
	TEST_OK(mfs_event_encode(&b, ev, 100000, 1, 0)); /* array32 header, 0 = no limit */
	o.max_events = 0;
	EXPECT_ACCEPT(b.data, b.len, &o, 100000);
	TEST_ASSERT(es.n == 100000 && es.ev[99999].user.num == 99999 && es.ev[99999].item.num == 699993);
	/* one event decoded as a single event is within any max_events */
	o.max_events = 1;
	EXPECT_ACCEPT(LIT("\x93\x01\x02\x03"), &o, 1);
	/* header counts that lie never decide memory: 4 G events promised, none there */
	mfs_events_t small = {0};
	int reason;
	long index;
	TEST_ASSERT(mfs_event_decode(LIT("\xdd\xff\xff\xff\xff\x93\x01\x02\x03"), &opts15, &small, &reason,
	                             &index, NULL, 0) == MFS_EDECODE);
	TEST_ASSERT(reason == MFS_REJ_NOT_MSGPACK && index == -1 && small.cap <= 16);
	TEST_ASSERT(mfs_event_decode(LIT("\xdd\xff\xff\xff\xff\x91"), &opts15, &small, &reason, &index,
	                             NULL, 0) == MFS_EDECODE);
	TEST_ASSERT(reason == MFS_REJ_NOT_MSGPACK && small.cap <= 16);
	o.max_events = 10; /* too many AND truncated: the message-level not_msgpack wins */
	TEST_ASSERT(mfs_event_decode(LIT("\xdd\xff\xff\xff\xff\x90"), &o, &small, &reason, &index, NULL, 0) ==
	            MFS_EDECODE);
	TEST_ASSERT(reason == MFS_REJ_NOT_MSGPACK);
	mfs_events_free(&small);
	/* an unknown key holding a map16 that claims 65535 pairs in 3 bytes */
	EXPECT_REJECT(LIT("\x84\xa1x\xde\xff\xff\xa1u\x01\xa1i\x02\xa1r\x03"), &opts15, MFS_REJ_NOT_MSGPACK, -1);
	/* NULL out, or bytes without a pointer, are caller bugs */
	TEST_EQ_INT(mfs_event_decode(LIT("\x90"), &opts15, NULL, NULL, NULL, NULL, 0), MFS_EINVAL);
	TEST_EQ_INT(mfs_event_decode(NULL, 3, &opts15, &small, NULL, NULL, NULL, 0), MFS_EINVAL);
	mfs_buf_free(&b);
	free(ev);
}

/* A seeded mutation loop over valid messages: event.c and the reference must agree on every
 * mutant (the fuzzer does this at scale; this keeps a cheap version in ctest). */
static void test_mutations(void)
{
	mfs_event_t ev[4] = {
		{str_id("u1", 2), mfs_id_u64(300), 4.5f, 1, 1700000000000},
		{mfs_id_u64(0), str_id("\xe6\x97\xa5", 3), 1.0f, 0, 0},
		{mfs_id_u64(UINT64_MAX), mfs_id_u64(1), 5.0f, 1, -5},
		{str_id("x", 1), str_id("y", 1), 3.0f, 0, 0},
	};
	mfs_buf_t b = {0};
	mfs_rng_t g;
	mfs_rng_seed(&g, 12345);
	long accepted = 0, rejected = 0;
	long before = ref_compared;
	static char m[4096];
	for (int it = 0; it < 20000; it++) {
		b.len = 0;
		size_t n = 1 + mfs_rng_below(&g, 4);
		TEST_OK(mfs_event_encode(&b, ev, n, (int)mfs_rng_below(&g, 2), (int)mfs_rng_below(&g, 2)));
		size_t len = b.len;
		memcpy(m, b.data, len);
		int muts = 1 + (int)mfs_rng_below(&g, 3);
		for (int k = 0; k < muts && len; k++) {
			size_t at = mfs_rng_below(&g, len);
			switch (mfs_rng_below(&g, 4)) {
			case 0: m[at] = (char)mfs_rng_below(&g, 256); break;       /* replace */
			case 1: m[at] ^= (char)(1u << mfs_rng_below(&g, 8)); break; /* flip a bit */
			case 2: len = at; break;                                      /* cut */
			default:                                                      /* insert */
				memmove(m + at + 1, m + at, len - at);
				m[at] = (char)mfs_rng_below(&g, 256);
				len++;
			}
		}
		if (decode_both(m, len, &opts15) == 0)
			accepted++;
		else
			rejected++;
	}
	fprintf(stderr, "  mutants: %ld accepted, %ld rejected, %ld compared with msgpack-c\n", accepted,
	        rejected, ref_compared - before);
	TEST_ASSERT(accepted > 100 && rejected > 1000);
	mfs_buf_free(&b);
}

int main(void)
{
	msgpack_sbuffer_init(&sb);
	msgpack_unpacked_init(&ref_u);
	TEST_RUN(test_reject_names);
	TEST_RUN(test_round_trip);
	TEST_RUN(test_reject_not_msgpack);
	TEST_RUN(test_reject_wrong_type);
	TEST_RUN(test_reject_missing_field);
	TEST_RUN(test_reject_nan);
	TEST_RUN(test_reject_range);
	TEST_RUN(test_reject_id_length);
	TEST_RUN(test_reject_trailing);
	TEST_RUN(test_reject_empty);
	TEST_RUN(test_precedence);
	TEST_RUN(test_truncation);
	TEST_RUN(test_packer_types);
	TEST_RUN(test_unknown_keys);
	TEST_RUN(test_duplicate_keys);
	TEST_RUN(test_batches);
	TEST_RUN(test_delete_events);
	TEST_RUN(test_max_events);
	TEST_RUN(test_mutations);
	fprintf(stderr, "  %ld verdicts compared with the msgpack-c reference, %ld beyond its limits\n",
	        ref_compared, ref_unsure);
	msgpack_unpacked_destroy(&ref_u);
	msgpack_sbuffer_destroy(&sb);
	mfs_events_free(&es);
	mfs_events_free(&ref_es);
	return TEST_REPORT();
}
