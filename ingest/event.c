/* event.c - the event on the wire: decode + validate a Kafka message value, and encode one.
 *
 * The contract is ingest/event.h and docs/EVENT_FORMAT.md (producer-facing, with examples).
 *
 * DESIGN
 * Decoding is a single zero-copy pass of a small hand-written MessagePack reader over the
 * message buffer: string ids are borrowed views into it, nothing is allocated except the
 * caller's reusable mfs_events_t, and each event is validated as soon as it is read. We do
 * not use msgpack-c's msgpack_unpack_next for two reasons, measured and found, not assumed
 * (bench/bench_event.c has both decoders side by side; x86-64 VM, gcc -O2, one core):
 *   - speed: on 1000-event compact messages (u64 ids, float32 rating, ms timestamp; 24 B
 *     per event) the hand-written walk decodes 8.1e7 events/s (12 ns, 2.0 GB/s), msgpack-c's
 *     msgpack_unpack_next into a reused msgpack_unpacked plus the same checks over its object
 *     tree 2.0e7 (49 ns): 4x. Map form 6.4e7 vs 1.1e7 (6x); string ids 5.5e7 vs 1.5e7.
 *     (bench/bench_event, one core of a shared 2-vCPU AMD EPYC VM, gcc -O2.) So the 10 M
 *     events/s end-to-end target costs about 12% of one core here instead of 50%.
 *   - safety: msgpack-c allocates an array's or map's element table from the count in its
 *     header before reading any element, so the 5-byte message dd ff ff ff ff makes it ask
 *     for 128 GiB (strace: one mmap of 137440002048 bytes; it fails here, NOMEM; on a big
 *     host with overcommit it may not), and nested headers ask again. Kafka values are
 *     untrusted; here every count is checked against the bytes left (each element needs at
 *     least one byte) and the output is reserved for at most len/4 events (the smallest
 *     valid event, [0,0,0], is 4 bytes).
 * msgpack-c stays the encoder (mfs_event_encode, with a packer callback into mfs_buf_t) and
 * the oracle: tests/unit/test_event.c and tests/fuzz/fuzz_event.c compare every decision of
 * this reader with a reference decoder built on msgpack_unpack_next (tests/fuzz/event_ref.h).
 *
 * Order of judgement. A message is accepted or rejected as a whole (event.h). Problems of
 * the message as such (index -1) win over problems of one event, in this order:
 * not_msgpack, trailing_bytes, empty, then the top-level type and max_events; after those,
 * the first bad event in message order, and inside an event the first bad field in byte
 * order, with missing fields judged after the whole map. The happy path reads everything once;
 * only when an event-level problem is found is the whole message re-walked (skip only) to see
 * whether a message-level one outranks it, so the precedence costs nothing for good traffic.
 * Values of unknown map keys are skipped with an explicit pending-object counter, never by
 * recursion, so nesting depth cannot exhaust the stack.
 *
 * Thread-safety: none needed; every call works on its arguments only.
 */
#include "ingest/event.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>
#include <xxhash.h>

#include "common/check.h"
#include "common/err.h"
#include "common/grow.h"

#define NOINLINE __attribute__((noinline))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define MFS_LIKELY(x) __builtin_expect(!!(x), 1)
#define MFS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- reject names --------------------------------------------------------------------- */

static const char *const reject_names[MFS_REJ__COUNT] = {
	[MFS_REJ_NOT_MSGPACK] = "not_msgpack",     [MFS_REJ_WRONG_TYPE] = "wrong_type",
	[MFS_REJ_MISSING_FIELD] = "missing_field", [MFS_REJ_NAN] = "nan",
	[MFS_REJ_RANGE] = "rating_range",          [MFS_REJ_ID_LEN] = "id_length",
	[MFS_REJ_TRAILING] = "trailing_bytes",     [MFS_REJ_EMPTY] = "empty",
};

const char *mfs_reject_name(int reason)
{
	if (reason < 0 || reason >= MFS_REJ__COUNT)
		return "unknown";
	return reject_names[reason];
}

/* ---- the MessagePack reader ----------------------------------------------------------- */

/* What one header says. Scalars are complete; for str/bin/ext `s`/`n` is the payload (already
 * bounds-checked and stepped over); for array/map `n` is the element/pair count and the
 * elements follow. */
enum mp_kind {
	MP_NIL,
	MP_BOOL,
	MP_UINT,  /* any integer >= 0, whatever its encoding (int8..64 included, as msgpack-c) */
	MP_NINT,  /* an integer < 0 */
	MP_F32,
	MP_F64,
	MP_STR,
	MP_BIN,
	MP_EXT,
	MP_ARRAY,
	MP_MAP,
};

typedef struct mp_val {
	int kind;
	uint32_t n;
	union {
		uint64_t u;
		int64_t i;
		double f;
	} v;
	const char *s;
} mp_val_t;

static inline uint16_t ld16(const uint8_t *p)
{
	return (uint16_t)((unsigned)p[0] << 8 | p[1]);
}

static inline uint32_t ld32(const uint8_t *p)
{
	uint32_t x;
	memcpy(&x, p, 4);
	return __builtin_bswap32(x);
}

static inline uint64_t ld64(const uint8_t *p)
{
	uint64_t x;
	memcpy(&x, p, 8);
	return __builtin_bswap64(x);
}

/* Read one header (and a str/bin/ext payload) at *pp. @return 0, or -1 when the bytes end
 * early or the byte is 0xc1 (never used); *pp is left unchanged on failure. */
static inline int mp_read(const uint8_t **pp, const uint8_t *end, mp_val_t *v)
{
	const uint8_t *p = *pp;
	size_t left = (size_t)(end - p), need; /* need: header bytes after the type byte */
	if (left == 0)
		return -1;
	unsigned c = *p++;
	left--;
	if (c <= 0x7f) {
		v->kind = MP_UINT;
		v->v.u = c;
		*pp = p;
		return 0;
	}
	if (c >= 0xe0) {
		v->kind = MP_NINT;
		v->v.i = (int8_t)c;
		*pp = p;
		return 0;
	}
	if (c <= 0x8f) {
		v->kind = MP_MAP;
		v->n = c & 0x0f;
		*pp = p;
		return 0;
	}
	if (c <= 0x9f) {
		v->kind = MP_ARRAY;
		v->n = c & 0x0f;
		*pp = p;
		return 0;
	}
	if (c <= 0xbf) {
		v->kind = MP_STR;
		v->n = c & 0x1f;
		need = 0;
		goto payload;
	}
	switch (c) {
	case 0xc0:
		v->kind = MP_NIL;
		*pp = p;
		return 0;
	case 0xc2:
	case 0xc3:
		v->kind = MP_BOOL;
		v->v.u = c & 1;
		*pp = p;
		return 0;
	case 0xc4: case 0xc5: case 0xc6: /* bin 8/16/32 */
	case 0xd9: case 0xda: case 0xdb: /* str 8/16/32 */
		v->kind = c >= 0xd9 ? MP_STR : MP_BIN;
		need = (size_t)1 << (c >= 0xd9 ? c - 0xd9 : c - 0xc4);
		if (left < need)
			return -1;
		v->n = need == 1 ? p[0] : need == 2 ? ld16(p) : ld32(p);
		goto payload;
	case 0xc7: case 0xc8: case 0xc9: /* ext 8/16/32: length, type byte, data */
		need = (size_t)1 << (c - 0xc7);
		if (left < need + 1)
			return -1;
		v->kind = MP_EXT;
		v->n = need == 1 ? p[0] : need == 2 ? ld16(p) : ld32(p);
		need++;
		goto payload;
	case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext 1..16 */
		v->kind = MP_EXT;
		v->n = 1u << (c - 0xd4);
		need = 1;
		if (left < need)
			return -1;
		goto payload;
	case 0xca:
		if (left < 4)
			return -1;
		{
			uint32_t b = ld32(p);
			float f;
			memcpy(&f, &b, 4);
			v->kind = MP_F32;
			v->v.f = f;
		}
		*pp = p + 4;
		return 0;
	case 0xcb:
		if (left < 8)
			return -1;
		{
			uint64_t b = ld64(p);
			memcpy(&v->v.f, &b, 8);
			v->kind = MP_F64;
		}
		*pp = p + 8;
		return 0;
	case 0xcc: case 0xcd: case 0xce: case 0xcf: /* uint 8/16/32/64 */
		need = (size_t)1 << (c - 0xcc);
		if (left < need)
			return -1;
		v->kind = MP_UINT;
		v->v.u = need == 1 ? p[0] : need == 2 ? ld16(p) : need == 4 ? ld32(p) : ld64(p);
		*pp = p + need;
		return 0;
	case 0xd0: case 0xd1: case 0xd2: case 0xd3: { /* int 8/16/32/64 */
		need = (size_t)1 << (c - 0xd0);
		if (left < need)
			return -1;
		int64_t x = need == 1 ? (int8_t)p[0]
		          : need == 2 ? (int16_t)ld16(p)
		          : need == 4 ? (int32_t)ld32(p)
		                      : (int64_t)ld64(p);
		/* value-based like msgpack-c: a non-negative int8..64 is an unsigned integer */
		if (x >= 0) {
			v->kind = MP_UINT;
			v->v.u = (uint64_t)x;
		} else {
			v->kind = MP_NINT;
			v->v.i = x;
		}
		*pp = p + need;
		return 0;
	}
	case 0xdc: case 0xdd: /* array 16/32 */
	case 0xde: case 0xdf: /* map 16/32 */
		need = c & 1 ? 4 : 2;
		if (left < need)
			return -1;
		v->kind = c <= 0xdd ? MP_ARRAY : MP_MAP;
		v->n = need == 2 ? ld16(p) : ld32(p);
		*pp = p + need;
		return 0;
	default: /* 0xc1: never used */
		return -1;
	}
payload:
	if (left - need < v->n)
		return -1;
	v->s = (const char *)p + need;
	*pp = p + need + v->n;
	return 0;
}

/* Step over n objects (with everything nested in them). @return 0, or -1 if the bytes are
 * not n well-formed objects; *pp is then where the failing object starts. Iterative: the
 * pending count replaces the recursion stack. An object needs at least one byte, so a count
 * beyond the bytes left is rejected at once, which also bounds the loop by len. */
static int mp_skip(const uint8_t **pp, const uint8_t *end, uint64_t n)
{
	const uint8_t *p = *pp;
	mp_val_t v;
	while (n) {
		if (n > (uint64_t)(end - p))
			break;
		const uint8_t *at = p;
		if (mp_read(&p, end, &v)) {
			p = at;
			break;
		}
		n--;
		if (v.kind == MP_ARRAY)
			n += v.n;
		else if (v.kind == MP_MAP)
			n += 2 * (uint64_t)v.n;
	}
	*pp = p;
	return n ? -1 : 0;
}

/* ---- decode --------------------------------------------------------------------------- */

#define EV_MIN_BYTES 4 /* [0,0,0]: the smallest valid event; bounds the reservation */

typedef struct dec {
	const uint8_t *base, *p, *end;
	double rmin, rmax;
	int reason;
	long index;
	char *detail;
	size_t detail_size;
} dec_t;

static const char *kind_name(int kind)
{
	static const char *const n[] = {"nil", "bool", "uint", "negative int", "float32", "float64",
	                                "str", "bin", "ext", "array", "map"};
	return kind >= 0 && kind < (int)MFS_ARRAY_LEN(n) ? n[kind] : "?";
}

/* Records the first rejection (and its one-line detail). @return MFS_EDECODE. */
static int dec_fail(dec_t *d, int reason, long index, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int dec_fail(dec_t *d, int reason, long index, const char *fmt, ...)
{
	d->reason = reason;
	d->index = index;
	if (d->detail && d->detail_size) {
		size_t off = 0;
		if (index >= 0) {
			int k = snprintf(d->detail, d->detail_size, "event %ld: ", index);
			off = k > 0 && (size_t)k < d->detail_size ? (size_t)k : 0;
		}
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(d->detail + off, d->detail_size - off, fmt, ap);
		va_end(ap);
	}
	return MFS_EDECODE;
}

static int dec_truncated(dec_t *d, const uint8_t *at)
{
	return dec_fail(d, MFS_REJ_NOT_MSGPACK, -1,
	                "not MessagePack: invalid or truncated object at byte %zu of %zu",
	                (size_t)(at - d->base), (size_t)(d->end - d->base));
}

static NOINLINE int dec_id_slow(dec_t *d, long idx, char f, mfs_id_t *id)
{
	mp_val_t v;
	const uint8_t *at = d->p;
	if (mp_read(&d->p, d->end, &v))
		return dec_truncated(d, at);
	if (v.kind == MP_UINT) {
		*id = mfs_id_u64(v.v.u);
		return 0;
	}
	if (v.kind != MP_STR)
		return dec_fail(d, MFS_REJ_WRONG_TYPE, idx, "\"%c\": %s where an id (uint or str) is expected",
		                f, kind_name(v.kind));
	if (v.n == 0 || v.n > MFS_ID_MAX_LEN)
		return dec_fail(d, MFS_REJ_ID_LEN, idx, "\"%c\": string id of %u bytes (1..%d allowed)", f,
		                (unsigned)v.n, MFS_ID_MAX_LEN);
	id->kind = MFS_ID_STR;
	id->len = (uint16_t)v.n;
	id->num = 0;
	id->str = v.s;
	if (mfs_id_check(id))
		return dec_fail(d, MFS_REJ_ID_LEN, idx, "\"%c\": string id is not valid UTF-8", f);
	return 0;
}

static NOINLINE int dec_rating_slow(dec_t *d, long idx, float *r)
{
	mp_val_t v;
	const uint8_t *at = d->p;
	double x;
	if (mp_read(&d->p, d->end, &v))
		return dec_truncated(d, at);
	switch (v.kind) {
	case MP_UINT:
		x = (double)v.v.u;
		break;
	case MP_NINT:
		x = (double)v.v.i;
		break;
	case MP_F32:
	case MP_F64:
		x = v.v.f;
		break;
	default:
		return dec_fail(d, MFS_REJ_WRONG_TYPE, idx, "\"r\": %s where a number is expected",
		                kind_name(v.kind));
	}
	if (!isfinite(x))
		return dec_fail(d, MFS_REJ_NAN, idx, "\"r\": %g is not finite", x);
	/* the range is judged on the double, before it is narrowed to float */
	if (!(x >= d->rmin && x <= d->rmax))
		return dec_fail(d, MFS_REJ_RANGE, idx, "\"r\": %.17g outside [%.17g, %.17g]", x, d->rmin,
		                d->rmax);
	*r = (float)x;
	return 0;
}

static NOINLINE int dec_ts_slow(dec_t *d, long idx, mfs_event_t *e)
{
	mp_val_t v;
	const uint8_t *at = d->p;
	if (mp_read(&d->p, d->end, &v))
		return dec_truncated(d, at);
	if (v.kind == MP_NINT) {
		e->ts_ms = v.v.i;
	} else if (v.kind == MP_UINT && v.v.u <= INT64_MAX) {
		e->ts_ms = (int64_t)v.v.u;
	} else {
		return dec_fail(d, MFS_REJ_WRONG_TYPE, idx, "\"t\": %s where an int64 is expected",
		                v.kind == MP_UINT ? "uint above 2^63-1" : kind_name(v.kind));
	}
	e->has_ts = 1;
	return 0;
}

/* Fast paths for the encodings producers actually send (msgpack packers pick the shortest
 * form): they read straight from the buffer when at least 9 bytes are left, so one bounds
 * check covers every case, and hand anything else - other encodings, the last bytes of the
 * message, anything invalid - to the general *_slow versions above. The first cut of this file
 * used only those (mp_read per field, not inlined): 24 ns/event on 1000-event compact
 * messages; with these, see the DESIGN numbers. */
static ALWAYS_INLINE int dec_id(dec_t *d, long idx, char f, mfs_id_t *id)
{
	const uint8_t *p = d->p;
	if (MFS_LIKELY(d->end - p >= 9)) {
		unsigned c = p[0];
		if (c <= 0x7f) {
			*id = mfs_id_u64(c);
			d->p = p + 1;
			return 0;
		}
		if (c >= 0xcc && c <= 0xcf) {
			unsigned w = 1u << (c - 0xcc);
			*id = mfs_id_u64(w == 1 ? p[1] : w == 2 ? ld16(p + 1) : w == 4 ? ld32(p + 1) : ld64(p + 1));
			d->p = p + 1 + w;
			return 0;
		}
		if (c >= 0xa1 && c <= 0xbf) { /* fixstr of 1..31 bytes: ASCII is the common case */
			unsigned n = c & 0x1f;
			if ((size_t)(d->end - p) > n) {
				id->kind = MFS_ID_STR;
				id->len = (uint16_t)n;
				id->num = 0;
				id->str = (const char *)p + 1;
				uint8_t any = 0;
				for (unsigned k = 1; k <= n; k++)
					any |= p[k];
				if (any < 0x80 || mfs_id_check(id) == 0) {
					d->p = p + 1 + n;
					return 0;
				}
			}
		}
	}
	return dec_id_slow(d, idx, f, id);
}

static ALWAYS_INLINE int dec_rating(dec_t *d, long idx, float *r)
{
	const uint8_t *p = d->p;
	double x;
	size_t w;
	if (MFS_UNLIKELY(d->end - p < 9))
		return dec_rating_slow(d, idx, r);
	if (p[0] == 0xca) {
		uint32_t b = ld32(p + 1);
		float f;
		memcpy(&f, &b, 4);
		x = f;
		w = 5;
	} else if (p[0] <= 0x7f) {
		x = p[0];
		w = 1;
	} else if (p[0] == 0xcb) {
		uint64_t b = ld64(p + 1);
		memcpy(&x, &b, 8);
		w = 9;
	} else {
		return dec_rating_slow(d, idx, r);
	}
	/* one comparison pair accepts; NaN and +-inf fail it (the bounds are finite) and go the
	 * slow way, which says which reason applies */
	if (MFS_UNLIKELY(!(x >= d->rmin && x <= d->rmax)))
		return dec_rating_slow(d, idx, r);
	*r = (float)x;
	d->p = p + w;
	return 0;
}

static ALWAYS_INLINE int dec_ts(dec_t *d, long idx, mfs_event_t *e)
{
	const uint8_t *p = d->p;
	if (MFS_LIKELY(d->end - p >= 9)) {
		unsigned c = p[0];
		if ((c == 0xcf || c == 0xd3) && p[1] < 0x80) { /* 64-bit, fits int64 either way */
			e->ts_ms = (int64_t)ld64(p + 1);
			e->has_ts = 1;
			d->p = p + 9;
			return 0;
		}
		if (c <= 0x7f) {
			e->ts_ms = c;
			e->has_ts = 1;
			d->p = p + 1;
			return 0;
		}
	}
	return dec_ts_slow(d, idx, e);
}

/* A map event of n pairs whose header has been read. Unknown keys are skipped (producers
 * may add fields); a known key given twice is wrong_type (which value would we trust?). */
/* The value of "op" (read after its key): the string "delete" is the only operation besides a
 * rating (which has no "op"). */
static int dec_op(dec_t *d, long idx, mfs_event_t *e)
{
	const uint8_t *at = d->p;
	mp_val_t v = {0}; /* mp_read sets s only for strings; zeroed so -O3 sees no uninitialized read */
	if (mp_read(&d->p, d->end, &v))
		return dec_truncated(d, at);
	if (v.kind != MP_STR || v.n != 6 || memcmp(v.s, "delete", 6) != 0)
		return dec_fail(d, MFS_REJ_WRONG_TYPE, idx, "\"op\" must be the string \"delete\"");
	e->op = MFS_OP_DEL_USER; /* which one: by the id given (dec_map_event) */
	return 0;
}

#define KEY_OP 256 /* the key "op" (one-byte keys are their character) */

static int dec_map_event(dec_t *d, long idx, uint32_t n, mfs_event_t *e)
{
	unsigned seen = 0;
	int rc;
	e->has_ts = 0;
	e->ts_ms = 0;
	e->op = MFS_OP_RATE;
	for (uint32_t k = 0; k < n; k++) {
		const uint8_t *at = d->p;
		mp_val_t key = {0};
		int f;
		if (MFS_LIKELY(d->end - at >= 2 && at[0] == 0xa1)) { /* fixstr of 1 byte: how packers write keys */
			f = at[1];
			key.kind = MP_STR;
			d->p = at + 2;
		} else {
			if (mp_read(&d->p, d->end, &key))
				return dec_truncated(d, at);
			/* "u" as str8/16/32 is unusual but the same string */
			f = key.kind == MP_STR && key.n == 1 ? (unsigned char)key.s[0] : 0;
			if (key.kind == MP_STR && key.n == 2 && memcmp(key.s, "op", 2) == 0)
				f = KEY_OP;
		}
		unsigned bit = f == 'u' ? 1 : f == 'i' ? 2 : f == 'r' ? 4 : f == 't' ? 8 : f == KEY_OP ? 16 : 0;
		if (!bit) {
			/* the key's own elements (a container key is legal MessagePack) + the value */
			uint64_t more = 1 + (key.kind == MP_ARRAY ? key.n
			                     : key.kind == MP_MAP ? 2 * (uint64_t)key.n : 0);
			if (mp_skip(&d->p, d->end, more))
				return dec_truncated(d, d->p);
			continue;
		}
		if (seen & bit)
			return dec_fail(d, MFS_REJ_WRONG_TYPE, idx, "duplicate key \"%s\"", f == KEY_OP ? "op" : (char[2]){(char)f, 0});
		seen |= bit;
		switch (f) {
		case 'u':
			rc = dec_id(d, idx, 'u', &e->user);
			break;
		case 'i':
			rc = dec_id(d, idx, 'i', &e->item);
			break;
		case 'r':
			rc = dec_rating(d, idx, &e->rating);
			break;
		case KEY_OP:
			rc = dec_op(d, idx, e);
			break;
		default:
			rc = dec_ts(d, idx, e);
			break;
		}
		if (rc)
			return rc;
	}
	if (seen & 16) { /* a deletion: one id, user or item, and no rating */
		if ((seen & 3) == 3 || (seen & 4))
			return dec_fail(d, MFS_REJ_WRONG_TYPE, idx, "a delete event names one id (\"u\" or \"i\") and no rating");
		if (!(seen & 3))
			return dec_fail(d, MFS_REJ_MISSING_FIELD, idx, "missing field \"u\" or \"i\" (delete)");
		e->op = seen & 1 ? MFS_OP_DEL_USER : MFS_OP_DEL_ITEM;
		if (seen & 1)
			e->item = (mfs_id_t){0};
		else
			e->user = (mfs_id_t){0};
		e->rating = 0;
		return 0;
	}
	if ((seen & 7) != 7)
		return dec_fail(d, MFS_REJ_MISSING_FIELD, idx, "missing field \"%s\"",
		                !(seen & 1) ? "u" : !(seen & 2) ? "i" : "r");
	return 0;
}

/* A compact event [u, i, r] or [u, i, r, t] whose header (n elements) has been read. */
static int dec_compact_event(dec_t *d, long idx, uint32_t n, mfs_event_t *e)
{
	int rc;
	if (n != 3 && n != 4)
		return dec_fail(d, MFS_REJ_MISSING_FIELD, idx,
		                "compact event of %u elements ([u, i, r] or [u, i, r, t] expected)", (unsigned)n);
	if ((rc = dec_id(d, idx, 'u', &e->user)) || (rc = dec_id(d, idx, 'i', &e->item)) ||
	    (rc = dec_rating(d, idx, &e->rating)))
		return rc;
	e->op = MFS_OP_RATE;
	e->has_ts = 0;
	e->ts_ms = 0;
	return n == 4 ? dec_ts(d, idx, e) : 0;
}

static int events_reserve(mfs_events_t *es, size_t need)
{
	/* from 16: a message is a few events, and a header's count never decides memory */
	return mfs_grow_from((void **)&es->ev, &es->cap, need, sizeof *es->ev, 16);
}

void mfs_events_free(mfs_events_t *es)
{
	if (!es)
		return;
	free(es->ev);
	memset(es, 0, sizeof *es);
}

/* The walk; on MFS_EDECODE, d->reason/index say why (before the precedence check). */
static int dec_message(dec_t *d, size_t max_events, mfs_events_t *out)
{
	mp_val_t top;
	int rc;
	if (d->p == d->end)
		return dec_fail(d, MFS_REJ_EMPTY, -1, "empty message");
	if (mp_read(&d->p, d->end, &top))
		return dec_truncated(d, d->base);
	if (top.kind == MP_MAP) {
		if ((rc = events_reserve(out, 1)))
			return rc;
		if ((rc = dec_map_event(d, 0, top.n, &out->ev[0])))
			return rc;
		out->n = 1;
	} else if (top.kind == MP_ARRAY) {
		if (top.n == 0)
			return dec_fail(d, MFS_REJ_EMPTY, -1, "empty array");
		if (d->p == d->end)
			return dec_truncated(d, d->p);
		unsigned c = *d->p;
		int batch = (c >= 0x80 && c <= 0x9f) || (c >= 0xdc && c <= 0xdf); /* a container first */
		if (!batch) {
			if ((rc = events_reserve(out, 1)))
				return rc;
			if ((rc = dec_compact_event(d, 0, top.n, &out->ev[0])))
				return rc;
			out->n = 1;
		} else {
			if (max_events && top.n > max_events)
				return dec_fail(d, MFS_REJ_WRONG_TYPE, -1,
				                "array of %u events (max_events is %zu)", (unsigned)top.n, max_events);
			/* never trust a header count with memory: reserve what the bytes can hold */
			size_t left = (size_t)(d->end - d->p), cap = left / EV_MIN_BYTES + 1;
			if ((rc = events_reserve(out, top.n < cap ? top.n : cap)))
				return rc;
			for (uint32_t k = 0; k < top.n; k++) {
				const uint8_t *at = d->p;
				mp_val_t ev;
				if (out->n == out->cap && (rc = events_reserve(out, out->n + 1)))
					return rc;
				if (mp_read(&d->p, d->end, &ev))
					return dec_truncated(d, at);
				if (ev.kind == MP_MAP)
					rc = dec_map_event(d, (long)k, ev.n, &out->ev[k]);
				else if (ev.kind == MP_ARRAY)
					rc = dec_compact_event(d, (long)k, ev.n, &out->ev[k]);
				else
					rc = dec_fail(d, MFS_REJ_WRONG_TYPE, (long)k,
					              "%s where an event (map or array) is expected", kind_name(ev.kind));
				if (rc)
					return rc;
				out->n = (size_t)k + 1;
			}
		}
	} else {
		return dec_fail(d, MFS_REJ_WRONG_TYPE, -1,
		                "top-level %s (an event map, a compact event array or an array of events expected)",
		                kind_name(top.kind));
	}
	if (d->p != d->end)
		return dec_fail(d, MFS_REJ_TRAILING, -1, "%zu trailing byte(s) after the top-level object at byte %zu",
		                (size_t)(d->end - d->p), (size_t)(d->p - d->base));
	return 0;
}

int mfs_event_decode(const void *buf, size_t len, const mfs_event_opts_t *opts, mfs_events_t *out,
                     int *reason, long *index, char *detail, size_t detail_size)
{
	dec_t d;
	int rc;
	if (!out || (!buf && len))
		return MFS_EINVAL;
	out->n = 0;
	d.base = d.p = buf;
	d.end = d.base + len;
	/* a finite double beyond FLT_MAX cannot be narrowed to float: the range caps at it */
	d.rmin = opts && opts->rating_min > -FLT_MAX ? opts->rating_min : -FLT_MAX;
	d.rmax = opts && opts->rating_max < FLT_MAX ? opts->rating_max : FLT_MAX;
	d.reason = -1;
	d.index = -1;
	d.detail = detail;
	d.detail_size = detail_size;
	if (detail && detail_size)
		detail[0] = '\0';
	rc = dec_message(&d, opts ? opts->max_events : 0, out);
	if (rc == MFS_EDECODE) {
		out->n = 0;
		/* a message-level problem outranks what the walk found first (see DESIGN) */
		const uint8_t *p = d.base;
		if (d.reason != MFS_REJ_NOT_MSGPACK && len) {
			if (mp_skip(&p, d.end, 1))
				dec_truncated(&d, p);
			else if (p != d.end && d.reason != MFS_REJ_TRAILING)
				dec_fail(&d, MFS_REJ_TRAILING, -1,
				         "%zu trailing byte(s) after the top-level object at byte %zu",
				         (size_t)(d.end - p), (size_t)(p - d.base));
		}
	} else if (rc) {
		out->n = 0;
	}
	if (reason)
		*reason = rc == MFS_EDECODE ? d.reason : -1;
	if (index)
		*index = rc == MFS_EDECODE ? d.index : -1;
	return rc;
}

/* ---- encode --------------------------------------------------------------------------- */

void mfs_buf_free(mfs_buf_t *b)
{
	if (!b)
		return;
	free(b->data);
	memset(b, 0, sizeof *b);
}

/* msgpack_packer_write: append to the mfs_buf_t; -1 (ENOMEM) stops the packer. */
static int buf_write(void *data, const char *src, size_t n)
{
	mfs_buf_t *b = data;
	if (n > SIZE_MAX / 2 - b->len || mfs_grow((void **)&b->data, &b->cap, b->len + n, 1))
		return -1;
	memcpy(b->data + b->len, src, n);
	b->len += n;
	return 0;
}

static int pack_id(msgpack_packer *pk, const mfs_id_t *id)
{
	if (id->kind == MFS_ID_STR)
		return msgpack_pack_str(pk, id->len) || msgpack_pack_str_body(pk, id->str, id->len);
	return msgpack_pack_uint64(pk, id->num); /* the packer picks the shortest form */
}

static int pack_key(msgpack_packer *pk, const char *k)
{
	const size_t n = strlen(k);
	return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, k, n);
}

static int pack_event(msgpack_packer *pk, const mfs_event_t *e, int compact)
{
	if (e->op != MFS_OP_RATE) { /* {"op": "delete", "u"|"i": id, "t"?}: no compact form */
		const int user = e->op == MFS_OP_DEL_USER;
		if (msgpack_pack_map(pk, e->has_ts ? 3 : 2) || pack_key(pk, "op") || msgpack_pack_str(pk, 6) ||
		    msgpack_pack_str_body(pk, "delete", 6) || pack_key(pk, user ? "u" : "i") ||
		    pack_id(pk, user ? &e->user : &e->item) || (e->has_ts && pack_key(pk, "t")))
			return -1;
		return e->has_ts ? msgpack_pack_int64(pk, e->ts_ms) : 0;
	}
	size_t n = e->has_ts ? 4 : 3;
	if (compact) {
		if (msgpack_pack_array(pk, n) || pack_id(pk, &e->user) || pack_id(pk, &e->item) ||
		    msgpack_pack_float(pk, e->rating))
			return -1;
	} else {
		if (msgpack_pack_map(pk, n) || pack_key(pk, "u") || pack_id(pk, &e->user) ||
		    pack_key(pk, "i") || pack_id(pk, &e->item) || pack_key(pk, "r") ||
		    msgpack_pack_float(pk, e->rating))
			return -1;
		if (e->has_ts && pack_key(pk, "t"))
			return -1;
	}
	return e->has_ts ? msgpack_pack_int64(pk, e->ts_ms) : 0;
}

int mfs_event_encode(mfs_buf_t *b, const mfs_event_t *ev, size_t n, int as_array, int compact)
{
	msgpack_packer pk;
	size_t start = b->len;
	msgpack_packer_init(&pk, b, buf_write);
	/* n == 0 has no single-event form: it is written as the empty array */
	if ((as_array || n != 1) && msgpack_pack_array(&pk, n))
		goto fail;
	for (size_t k = 0; k < n; k++)
		if (pack_event(&pk, &ev[k], compact))
			goto fail;
	return 0;
fail:
	b->len = start; /* all or nothing: no half event is left behind */
	return ENOMEM;
}

/* ---- fingerprints ------------------------------------------------------------------- */

static uint64_t id_hash(const mfs_id_t *id, uint64_t seed)
{
	if (id->kind == MFS_ID_U64)
		return XXH3_64bits_withSeed(&id->num, sizeof id->num, seed ^ MFS_ID_U64);
	return XXH3_64bits_withSeed(id->str, id->len, seed ^ MFS_ID_STR);
}

uint64_t mfs_event_digest(const mfs_event_t *ev)
{
	uint32_t rb;
	memcpy(&rb, &ev->rating, sizeof rb);
	uint64_t h[3] = {id_hash(&ev->user, 0x75), id_hash(&ev->item, 0x69), rb};
	return XXH3_64bits(h, sizeof h);
}

double mfs_event_holdout_u(const mfs_event_t *ev)
{
	uint64_t h[2] = {id_hash(&ev->user, 0x48), id_hash(&ev->item, 0x4f)};
	return (double)(XXH3_64bits(h, sizeof h) >> 11) * 0x1.0p-53;
}
