/* bench_event.c - wire-event decode throughput: events/s and MB/s, event.c vs msgpack-c.
 *
 *   bench_event [--secs 0.5] [--no-ts] [--csv FILE]
 *
 * For every cell of {1, 100, 1000 events per message} x {map, compact} x {u64, string ids}
 * it encodes a pool of ~8 MiB of messages (so the bytes come from memory, not L1, as Kafka
 * payloads do), then decodes the pool round-robin for --secs seconds with
 *   - mfs_event_decode (ingest/event.c, the hand-written zero-copy reader), and
 *   - the msgpack-c reference (tests/fuzz/event_ref.h: msgpack_unpack_next into a reused
 *     msgpack_unpacked, then the same validation over the object tree),
 * and prints events/s, MB/s and ns/event for both, plus the speed-up. Events look like
 * production ones: user ids uniform in [0, 10 M) ("user_%u" for string ids), item ids
 * Zipf-ish in [0, 1 M) ("item_%u"), ratings in half stars as float32, and a millisecond
 * timestamp unless --no-ts. One thread; the decode calls are the whole loop.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "common/err.h"
#include "common/rng.h"
#include "common/timeutil.h"
#include "ingest/event.h"
#include "tests/fuzz/event_ref.h"

#define POOL_BYTES (8u << 20)

typedef struct pool {
	mfs_buf_t buf;
	size_t *off, *len; /* message k is buf.data[off[k] .. off[k] + len[k]) */
	size_t n;
	size_t events;     /* in the whole pool */
} pool_t;

static char *strpool; /* backing store of the string ids while encoding */

static void pool_build(pool_t *p, size_t per_msg, int compact, int str_ids, int with_ts, uint64_t seed)
{
	mfs_rng_t g;
	mfs_rng_seed(&g, seed);
	memset(p, 0, sizeof *p);
	size_t cap_msgs = 1024;
	p->off = malloc(cap_msgs * sizeof *p->off);
	p->len = malloc(cap_msgs * sizeof *p->len);
	mfs_event_t *ev = calloc(per_msg, sizeof *ev);
	free(strpool);
	strpool = malloc(per_msg * 2 * 32);
	if (!p->off || !p->len || !ev || !strpool) {
		fprintf(stderr, "bench_event: out of memory\n");
		exit(1);
	}
	int64_t ts = 1700000000000;
	while (p->buf.len < POOL_BYTES || p->n < 64) {
		for (size_t k = 0; k < per_msg; k++) {
			uint64_t u = mfs_rng_below(&g, 10000000);
			/* a crude Zipf: the square of a uniform favours small item numbers */
			uint64_t r = mfs_rng_below(&g, 1000), i = r * r;
			if (str_ids) {
				char *su = strpool + k * 64, *si = su + 32;
				int lu = snprintf(su, 32, "user_%llu", (unsigned long long)u);
				int li = snprintf(si, 32, "item_%llu", (unsigned long long)i);
				ev[k].user = (mfs_id_t){MFS_ID_STR, (uint16_t)lu, 0, su};
				ev[k].item = (mfs_id_t){MFS_ID_STR, (uint16_t)li, 0, si};
			} else {
				ev[k].user = mfs_id_u64(u);
				ev[k].item = mfs_id_u64(i);
			}
			ev[k].rating = 0.5f * (float)(2 + mfs_rng_below(&g, 9));
			ev[k].has_ts = with_ts;
			ev[k].ts_ms = ts += (int64_t)mfs_rng_below(&g, 3);
		}
		if (p->n == cap_msgs) {
			cap_msgs *= 2;
			p->off = realloc(p->off, cap_msgs * sizeof *p->off);
			p->len = realloc(p->len, cap_msgs * sizeof *p->len);
			if (!p->off || !p->len)
				exit(1);
		}
		size_t at = p->buf.len;
		if (mfs_event_encode(&p->buf, ev, per_msg, 0, compact)) {
			fprintf(stderr, "bench_event: encode failed\n");
			exit(1);
		}
		p->off[p->n] = at;
		p->len[p->n] = p->buf.len - at;
		p->n++;
		p->events += per_msg;
	}
	free(ev);
}

static void pool_free(pool_t *p)
{
	mfs_buf_free(&p->buf);
	free(p->off);
	free(p->len);
}

typedef struct result {
	double ev_s, mb_s, ns_ev;
} result_t;

/* Decode the pool round-robin for `secs`; which = 0 event.c, 1 msgpack-c reference. */
static result_t run(const pool_t *p, const mfs_event_opts_t *o, int which, double secs)
{
	mfs_events_t es = {0};
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	size_t events = 0, bytes = 0, k = 0;
	unsigned long long check = 0;
	double t0 = mfs_now_s(), t = t0;
	while (t - t0 < secs) {
		for (int rep = 0; rep < 64; rep++) {
			const char *m = p->buf.data + p->off[k];
			int rc, reason;
			long index;
			if (which == 0)
				rc = mfs_event_decode(m, p->len[k], o, &es, &reason, &index, NULL, 0);
			else
				rc = ref_event_decode(&u, m, p->len[k], o, &es, &reason, &index);
			if (rc) {
				fprintf(stderr, "bench_event: message %zu rejected (%s)\n", k, mfs_reject_name(reason));
				exit(1);
			}
			check += es.ev[es.n - 1].user.len + es.ev[0].item.num; /* keep the work observable */
			events += es.n;
			bytes += p->len[k];
			if (++k == p->n)
				k = 0;
		}
		t = mfs_now_s();
	}
	double dt = t - t0;
	msgpack_unpacked_destroy(&u);
	mfs_events_free(&es);
	if (check == 42) /* never; stops the compiler from dropping the loop */
		fputc(' ', stderr);
	return (result_t){events / dt, bytes / dt / 1e6, dt * 1e9 / (double)events};
}

int main(int argc, char **argv)
{
	double secs = 0.5;
	int with_ts = 1;
	const char *csv = NULL;
	for (int a = 1; a < argc; a++) {
		if (!strcmp(argv[a], "--secs") && a + 1 < argc)
			secs = atof(argv[++a]);
		else if (!strcmp(argv[a], "--no-ts"))
			with_ts = 0;
		else if (!strcmp(argv[a], "--csv") && a + 1 < argc)
			csv = argv[++a];
		else {
			fprintf(stderr, "usage: bench_event [--secs S] [--no-ts] [--csv FILE]\n");
			return 2;
		}
	}
	FILE *out = csv ? fopen(csv, "w") : NULL;
	if (csv && !out) {
		perror(csv);
		return 1;
	}
	if (out)
		fprintf(out, "events_per_msg,form,ids,bytes_per_event,eventc_events_s,eventc_mb_s,"
		             "msgpackc_events_s,msgpackc_mb_s\n");
	const mfs_event_opts_t o = {0.5, 5.0, 0};
	static const size_t per[] = {1, 100, 1000};
	printf("wire-event decode, one thread, %s timestamps, %.2f s per cell\n", with_ts ? "with" : "without",
	       secs);
	printf("%6s %-8s %-4s %7s | %12s %8s %7s | %12s %8s %7s | %6s\n", "ev/msg", "form", "ids", "B/event",
	       "event.c ev/s", "MB/s", "ns/ev", "msgpack-c", "MB/s", "ns/ev", "x");
	for (size_t pi = 0; pi < sizeof per / sizeof per[0]; pi++) {
		for (int compact = 1; compact >= 0; compact--) {
			for (int str_ids = 0; str_ids <= 1; str_ids++) {
				pool_t p;
				pool_build(&p, per[pi], compact, str_ids, with_ts, 7 + pi);
				result_t a = run(&p, &o, 0, secs), b = run(&p, &o, 1, secs);
				double bpe = (double)p.buf.len / (double)p.events;
				printf("%6zu %-8s %-4s %7.1f | %12.3e %8.0f %7.1f | %12.3e %8.0f %7.1f | %6.2f\n", per[pi],
				       compact ? "compact" : "map", str_ids ? "str" : "u64", bpe, a.ev_s, a.mb_s, a.ns_ev,
				       b.ev_s, b.mb_s, b.ns_ev, a.ev_s / b.ev_s);
				fflush(stdout);
				if (out)
					fprintf(out, "%zu,%s,%s,%.1f,%.4e,%.1f,%.4e,%.1f\n", per[pi],
					        compact ? "compact" : "map", str_ids ? "str" : "u64", bpe, a.ev_s, a.mb_s,
					        b.ev_s, b.mb_s);
				pool_free(&p);
			}
		}
	}
	if (out)
		fclose(out);
	free(strpool);
	return 0;
}
