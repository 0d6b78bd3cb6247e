/* event.h - the event on the wire (docs/EVENT_FORMAT.md).
 *
 * A Kafka message value is MessagePack: one event, or an array of events. An event is a map
 * {"u": id, "i": id, "r": number, "t": int64 ms (optional)} or the compact array [u, i, r, t?].
 * An id is an unsigned 64-bit integer or a UTF-8 string of 1..256 bytes.
 *
 * A message is accepted or rejected as a whole: if any event in it is invalid the message is
 * rejected with the first event's reason (and the number of the event), counted by reason,
 * optionally copied raw to the dead-letter topic, and none of its events reaches the model.
 * That keeps "one message = one unit" for exactly-once accounting and dead-letter replay.
 */
#ifndef MFS_EVENT_H
#define MFS_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include "model_store/store.h"

/** What an event asks (docs/EVENT_FORMAT.md): a rating, or the deletion of a user or an item
 *  ({"op": "delete", "u": id} / {"op": "delete", "i": id}; the other id has kind 0). */
enum mfs_event_op { MFS_OP_RATE = 0, MFS_OP_DEL_USER = 1, MFS_OP_DEL_ITEM = 2 };

typedef struct mfs_event {
	mfs_id_t user, item; /* string ids point into the message buffer (valid while it lives) */
	float rating;
	int has_ts;
	int64_t ts_ms;
	int op;              /* enum mfs_event_op */
} mfs_event_t;

/** Why a message was rejected. Stable names (mfs_reject_name) are metric labels. */
enum mfs_reject {
	MFS_REJ_NOT_MSGPACK = 0, /* "not_msgpack": bytes are not MessagePack (or truncated) */
	MFS_REJ_WRONG_TYPE,      /* "wrong_type": not a map/array event, id or rating of the wrong type */
	MFS_REJ_MISSING_FIELD,   /* "missing_field": u, i or r absent (or compact array too short/long) */
	MFS_REJ_NAN,             /* "nan": rating NaN or infinite */
	MFS_REJ_RANGE,           /* "rating_range": rating outside [rating.min, rating.max] */
	MFS_REJ_ID_LEN,          /* "id_length": string id empty, longer than 256 bytes, or not UTF-8 */
	MFS_REJ_TRAILING,        /* "trailing_bytes": bytes after the top-level object */
	MFS_REJ_EMPTY,           /* "empty": empty message or empty array */
	MFS_REJ__COUNT
};

const char *mfs_reject_name(int reason);

typedef struct mfs_event_opts {
	double rating_min, rating_max;
	size_t max_events; /* events per message accepted at most (0 = no limit) */
} mfs_event_opts_t;

/** Decoded events of one message; reused across messages (grows, never shrinks). */
typedef struct mfs_events {
	mfs_event_t *ev;
	size_t n, cap;
} mfs_events_t;

void mfs_events_free(mfs_events_t *es);

/** Decode and validate one message value (ratings and deletions). On success out holds its events (n >= 1).
 *  @return 0, or MFS_EDECODE with *reason (enum mfs_reject), *index (0-based event number,
 *  or -1 for message-level problems) and a one-line detail; ENOMEM. */
int mfs_event_decode(const void *buf, size_t len, const mfs_event_opts_t *opts, mfs_events_t *out,
                     int *reason, long *index, char *detail, size_t detail_size);

/** A 64-bit fingerprint of an event's user, item and rating (not its timestamp). The service
 *  publishes the sum (mod 2^64) over every valid event it has taken in (meta events_digest), so
 *  a test can prove the multiset of applied events, not only their number. */
uint64_t mfs_event_digest(const mfs_event_t *ev);
/** The holdout draw of an event: a uniform value in [0, 1) from a hash of user and item. */
double mfs_event_holdout_u(const mfs_event_t *ev);

/** A growable byte buffer (producer and tests). */
typedef struct mfs_buf {
	char *data;
	size_t len, cap;
} mfs_buf_t;

void mfs_buf_free(mfs_buf_t *b);

/** Append the MessagePack encoding of n events: n == 1 and !as_array -> a single event,
 *  otherwise an array. compact: [u, i, r, t?] instead of the map form.
 *  @return 0 or ENOMEM. */
int mfs_event_encode(mfs_buf_t *b, const mfs_event_t *ev, size_t n, int as_array, int compact);

#endif
