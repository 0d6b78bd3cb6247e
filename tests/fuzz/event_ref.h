/* event_ref.h - a reference implementation of the event contract on msgpack-c's unpacker.
 *
 * The oracle for ingest/event.c's hand-written reader: tests/unit/test_event.c and
 * tests/fuzz/fuzz_event.c run both on the same bytes and require the same verdict (accept,
 * or the same reason and index), and the same events. bench/bench_event.c times it as the
 * "msgpack-c" column. It is written straight from docs/EVENT_FORMAT.md over msgpack_object
 * trees, sharing no code with event.c except mfs_id_check.
 *
 * Header-only (static functions) because it is test and benchmark code, not part of a stage.
 *
 * DESIGN: msgpack_unpack_next parses the whole top-level object first, so message-level
 * problems (not_msgpack, trailing_bytes) naturally come before event-level ones, which is the
 * precedence event.c promises. msgpack-c refuses nesting deeper than 32 and allocates element
 * tables from header counts before reading them (a 5-byte message can ask for 128 GiB), so
 * ref_event_safe() screens out inputs whose big array/map headers (0xdc..0xdf) claim more
 * elements than there are bytes, and ref_event_decode() answers REF_UNSURE where msgpack-c
 * says NOMEM; callers compare only the cases the oracle can judge.
 */
#ifndef MFS_TEST_EVENT_REF_H
#define MFS_TEST_EVENT_REF_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "ingest/event.h"

enum { REF_ACCEPT = 0, REF_REJECT = 1, REF_UNSURE = 2 };

/* Whether msgpack-c can be given these bytes without a header-driven huge allocation: looks at
 * every byte position (no parsing, so it may refuse harmless inputs, never the reverse). */
static inline int ref_event_safe(const void *buf, size_t len)
{
	const uint8_t *b = (const uint8_t *)buf;
	for (size_t i = 0; i < len; i++) {
		uint64_t n;
		if ((b[i] == 0xdc || b[i] == 0xde) && len - i > 2)
			n = (uint64_t)b[i + 1] << 8 | b[i + 2];
		else if ((b[i] == 0xdd || b[i] == 0xdf) && len - i > 4)
			n = (uint64_t)b[i + 1] << 24 | (uint64_t)b[i + 2] << 16 | (uint64_t)b[i + 3] << 8 | b[i + 4];
		else
			continue;
		if (n > len - i)
			return 0;
	}
	return 1;
}

typedef struct ref_ctx {
	double rmin, rmax;
	int reason;
	long index;
} ref_ctx_t;

static inline int ref_reject(ref_ctx_t *c, int reason, long index)
{
	c->reason = reason;
	c->index = index;
	return REF_REJECT;
}

static inline int ref_id(ref_ctx_t *c, const msgpack_object *o, long idx, mfs_id_t *id)
{
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		*id = mfs_id_u64(o->via.u64);
		return REF_ACCEPT;
	}
	if (o->type != MSGPACK_OBJECT_STR)
		return ref_reject(c, MFS_REJ_WRONG_TYPE, idx);
	if (o->via.str.size < 1 || o->via.str.size > MFS_ID_MAX_LEN)
		return ref_reject(c, MFS_REJ_ID_LEN, idx);
	id->kind = MFS_ID_STR;
	id->len = (uint16_t)o->via.str.size;
	id->num = 0;
	id->str = o->via.str.ptr;
	return mfs_id_check(id) ? ref_reject(c, MFS_REJ_ID_LEN, idx) : REF_ACCEPT;
}

static inline int ref_rating(ref_ctx_t *c, const msgpack_object *o, long idx, float *r)
{
	double x;
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		x = (double)o->via.u64;
	else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		x = (double)o->via.i64;
	else if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
		x = o->via.f64;
	else
		return ref_reject(c, MFS_REJ_WRONG_TYPE, idx);
	if (isnan(x) || isinf(x))
		return ref_reject(c, MFS_REJ_NAN, idx);
	if (x < c->rmin || x > c->rmax)
		return ref_reject(c, MFS_REJ_RANGE, idx);
	*r = (float)x;
	return REF_ACCEPT;
}

static inline int ref_ts(ref_ctx_t *c, const msgpack_object *o, long idx, mfs_event_t *e)
{
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		e->ts_ms = o->via.i64;
	else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= (uint64_t)INT64_MAX)
		e->ts_ms = (int64_t)o->via.u64;
	else
		return ref_reject(c, MFS_REJ_WRONG_TYPE, idx);
	e->has_ts = 1;
	return REF_ACCEPT;
}

static inline int ref_event(ref_ctx_t *c, const msgpack_object *o, long idx, mfs_event_t *e)
{
	int rc;
	memset(e, 0, sizeof *e);
	if (o->type == MSGPACK_OBJECT_ARRAY) {
		const msgpack_object *a = o->via.array.ptr;
		uint32_t n = o->via.array.size;
		if (n != 3 && n != 4)
			return ref_reject(c, MFS_REJ_MISSING_FIELD, idx);
		if ((rc = ref_id(c, &a[0], idx, &e->user)) || (rc = ref_id(c, &a[1], idx, &e->item)) ||
		    (rc = ref_rating(c, &a[2], idx, &e->rating)))
			return rc;
		return n == 4 ? ref_ts(c, &a[3], idx, e) : REF_ACCEPT;
	}
	if (o->type != MSGPACK_OBJECT_MAP)
		return ref_reject(c, MFS_REJ_WRONG_TYPE, idx);
	int seen_u = 0, seen_i = 0, seen_r = 0, seen_t = 0, seen_op = 0;
	for (uint32_t k = 0; k < o->via.map.size; k++) {
		const msgpack_object *key = &o->via.map.ptr[k].key, *val = &o->via.map.ptr[k].val;
		if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == 2 && memcmp(key->via.str.ptr, "op", 2) == 0) {
			if (seen_op)
				return ref_reject(c, MFS_REJ_WRONG_TYPE, idx); /* duplicate key */
			seen_op = 1;
			if (val->type != MSGPACK_OBJECT_STR || val->via.str.size != 6 || memcmp(val->via.str.ptr, "delete", 6))
				return ref_reject(c, MFS_REJ_WRONG_TYPE, idx);
			continue;
		}
		if (key->type != MSGPACK_OBJECT_STR || key->via.str.size != 1)
			continue; /* unknown key: ignored */
		int *seen;
		switch (key->via.str.ptr[0]) {
		case 'u': seen = &seen_u; break;
		case 'i': seen = &seen_i; break;
		case 'r': seen = &seen_r; break;
		case 't': seen = &seen_t; break;
		default: continue;
		}
		if (*seen)
			return ref_reject(c, MFS_REJ_WRONG_TYPE, idx); /* duplicate key */
		*seen = 1;
		switch (key->via.str.ptr[0]) {
		case 'u': rc = ref_id(c, val, idx, &e->user); break;
		case 'i': rc = ref_id(c, val, idx, &e->item); break;
		case 'r': rc = ref_rating(c, val, idx, &e->rating); break;
		default: rc = ref_ts(c, val, idx, e); break;
		}
		if (rc)
			return rc;
	}
	if (seen_op) { /* a deletion: one id, no rating */
		if ((seen_u && seen_i) || seen_r)
			return ref_reject(c, MFS_REJ_WRONG_TYPE, idx);
		if (!seen_u && !seen_i)
			return ref_reject(c, MFS_REJ_MISSING_FIELD, idx);
		e->op = seen_u ? MFS_OP_DEL_USER : MFS_OP_DEL_ITEM;
		return REF_ACCEPT;
	}
	if (!seen_u || !seen_i || !seen_r)
		return ref_reject(c, MFS_REJ_MISSING_FIELD, idx);
	return REF_ACCEPT;
}

/** Judge one message like mfs_event_decode. @return REF_ACCEPT (out filled), REF_REJECT
 *  (*reason, *index), or REF_UNSURE (msgpack-c ran out of its limits). Call only when
 *  ref_event_safe(buf, len). u is a caller-owned msgpack_unpacked (initialized) so the
 *  benchmark can reuse its zone; string ids in out point into buf. */
static inline int ref_event_decode(msgpack_unpacked *u, const void *buf, size_t len,
                                   const mfs_event_opts_t *opts, mfs_events_t *out, int *reason,
                                   long *index)
{
	ref_ctx_t c;
	size_t off = 0, n = 0;
	int rc;
	c.rmin = opts && opts->rating_min > -FLT_MAX ? opts->rating_min : -FLT_MAX;
	c.rmax = opts && opts->rating_max < FLT_MAX ? opts->rating_max : FLT_MAX;
	c.reason = -1;
	c.index = -1;
	out->n = 0;
	if (len == 0) {
		rc = ref_reject(&c, MFS_REJ_EMPTY, -1);
		goto done;
	}
	switch (msgpack_unpack_next(u, (const char *)buf, len, &off)) {
	case MSGPACK_UNPACK_SUCCESS:
		break;
	case MSGPACK_UNPACK_NOMEM_ERROR:
		rc = REF_UNSURE;
		goto done;
	default: /* CONTINUE (truncated), PARSE_ERROR */
		rc = ref_reject(&c, MFS_REJ_NOT_MSGPACK, -1);
		goto done;
	}
	if (off != len) {
		rc = ref_reject(&c, MFS_REJ_TRAILING, -1);
		goto done;
	}
	const msgpack_object *top = &u->data;
	const msgpack_object *evs = top;
	if (top->type == MSGPACK_OBJECT_ARRAY) {
		if (top->via.array.size == 0) {
			rc = ref_reject(&c, MFS_REJ_EMPTY, -1);
			goto done;
		}
		int t0 = top->via.array.ptr[0].type;
		if (t0 == MSGPACK_OBJECT_ARRAY || t0 == MSGPACK_OBJECT_MAP) {
			n = top->via.array.size;
			evs = top->via.array.ptr;
			if (opts && opts->max_events && n > opts->max_events) {
				rc = ref_reject(&c, MFS_REJ_WRONG_TYPE, -1);
				goto done;
			}
		} else {
			n = 1;
		}
	} else if (top->type == MSGPACK_OBJECT_MAP) {
		n = 1;
	} else {
		rc = ref_reject(&c, MFS_REJ_WRONG_TYPE, -1);
		goto done;
	}
	if (out->cap < n) {
		mfs_event_t *ev = (mfs_event_t *)realloc(out->ev, n * sizeof *ev);
		if (!ev)
			abort();
		out->ev = ev;
		out->cap = n;
	}
	for (size_t k = 0; k < n; k++)
		if ((rc = ref_event(&c, &evs[k], (long)k, &out->ev[k])))
			goto done;
	out->n = n;
	rc = REF_ACCEPT;
done:
	if (reason)
		*reason = c.reason;
	if (index)
		*index = c.index;
	return rc;
}

#endif
