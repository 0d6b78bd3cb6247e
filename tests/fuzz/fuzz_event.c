/* fuzz_event.c - libFuzzer target for the wire-event decoder (ingest/event.c).
 *
 *   tests/fuzz/build.sh 600        # build with clang-14 and fuzz for 600 s on one core
 *
 * For every input:
 *   1. mfs_event_decode must return 0 or MFS_EDECODE (never crash, hang or read past the end;
 *      ASan/UBSan watch that), with a valid reason name, and n == 0 on rejection;
 *   2. where msgpack-c can judge the bytes (event_ref.h), its reference decoder must reach the
 *      same verdict: accept with the same events, or reject with the same reason and index;
 *   3. accepted messages are re-encoded in all four shapes (map/compact x single/array where
 *      allowed) with mfs_event_encode and decoded again: same events, bit for bit.
 * Any disagreement aborts, so libFuzzer saves the input as a crash.
 *
 * The rating range is [-1e6, 1e6] rather than a 1..5 scale so that most mutated numbers get
 * through range checking and exercise the later stages; max_events is 64 so that a small seed
 * (corpus_event/rej_too_many_events) can exceed it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "common/err.h"
#include "ingest/event.h"
#include "tests/fuzz/event_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const mfs_event_opts_t opts = {-1e6, 1e6, 64}; /* small max_events: a seed can exceed it */

#define FUZZ_CHECK(cond, ...)                                                                   \
	do {                                                                                        \
		if (!(cond)) {                                                                          \
			fprintf(stderr, "fuzz_event: check failed: %s: ", #cond);                          \
			fprintf(stderr, __VA_ARGS__);                                                       \
			fputc('\n', stderr);                                                                \
			abort();                                                                            \
		}                                                                                       \
	} while (0)

static int id_same(const mfs_id_t *a, const mfs_id_t *b)
{
	if (a->kind != b->kind)
		return 0;
	if (a->kind == MFS_ID_U64)
		return a->num == b->num;
	return a->len == b->len && memcmp(a->str, b->str, a->len) == 0;
}

static int ev_same(const mfs_event_t *a, const mfs_event_t *b)
{
	return id_same(&a->user, &b->user) && id_same(&a->item, &b->item) &&
	       memcmp(&a->rating, &b->rating, sizeof a->rating) == 0 && a->has_ts == b->has_ts &&
	       (!a->has_ts || a->ts_ms == b->ts_ms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static mfs_events_t es, again, ref;
	static msgpack_unpacked u;
	static mfs_buf_t b;
	static int init;
	char detail[160];
	int reason = -2;
	long index = -2;
	if (!init) {
		msgpack_unpacked_init(&u);
		init = 1;
	}

	/* 1: never crash; a verdict that makes sense */
	int rc = mfs_event_decode(data, size, &opts, &es, &reason, &index, detail, sizeof detail);
	FUZZ_CHECK(rc == 0 || rc == MFS_EDECODE, "rc=%d", rc);
	if (rc) {
		FUZZ_CHECK(es.n == 0 && reason >= 0 && reason < MFS_REJ__COUNT && index >= -1 && detail[0],
		           "n=%zu reason=%d index=%ld", es.n, reason, index);
		FUZZ_CHECK(index == -1 || (reason != MFS_REJ_NOT_MSGPACK && reason != MFS_REJ_TRAILING &&
		                           reason != MFS_REJ_EMPTY),
		           "message-level reason %s with index %ld", mfs_reject_name(reason), index);
	} else {
		FUZZ_CHECK(es.n >= 1 && es.n <= opts.max_events, "n=%zu", es.n);
	}

	/* 2: the msgpack-c reference agrees */
	if (ref_event_safe(data, size)) {
		int rr = -1;
		long ri = -1;
		int v = ref_event_decode(&u, data, size, &opts, &ref, &rr, &ri);
		if (v != REF_UNSURE) {
			FUZZ_CHECK((v == REF_ACCEPT) == (rc == 0), "event.c %s@%ld (%s), ref %s %s@%ld",
			           rc ? mfs_reject_name(reason) : "accept", index, rc ? detail : "",
			           v == REF_ACCEPT ? "accepts" : "rejects", mfs_reject_name(rr), ri);
			if (rc)
				FUZZ_CHECK(rr == reason && ri == index, "event.c %s@%ld (%s), ref %s@%ld",
				           mfs_reject_name(reason), index, detail, mfs_reject_name(rr), ri);
			else {
				FUZZ_CHECK(ref.n == es.n, "%zu vs %zu events", es.n, ref.n);
				for (size_t k = 0; k < es.n; k++)
					FUZZ_CHECK(ev_same(&es.ev[k], &ref.ev[k]), "event %zu differs from ref", k);
			}
		}
		/* msgpack-c's zone keeps the largest chunk it grew to; start each input fresh */
		msgpack_unpacked_destroy(&u);
		msgpack_unpacked_init(&u);
	}

	/* 3: re-encode and decode again, in every shape */
	if (rc == 0) {
		for (int shape = 0; shape < 4; shape++) {
			int compact = shape & 1, as_array = shape >> 1;
			b.len = 0;
			FUZZ_CHECK(mfs_event_encode(&b, es.ev, es.n, as_array, compact) == 0, "encode");
			rc = mfs_event_decode(b.data, b.len, &opts, &again, &reason, &index, detail, sizeof detail);
			FUZZ_CHECK(rc == 0, "re-decode (shape %d): %s@%ld: %s", shape, mfs_reject_name(reason), index,
			           detail);
			FUZZ_CHECK(again.n == es.n, "%zu vs %zu events", again.n, es.n);
			for (size_t k = 0; k < es.n; k++)
				FUZZ_CHECK(ev_same(&es.ev[k], &again.ev[k]), "shape %d event %zu changed", shape, k);
		}
	}
	return 0;
}
