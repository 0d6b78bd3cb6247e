/* bench_rows.c - ids to rows (serve/rows.c) on a stream of arriving users: ns per event and
 * events/s of mfs_rows_resolve for each variant and thread count.
 *
 *   bench_rows [--k 128] [--users 1000000] [--arrival 0.1] [--items 200000] [--events 20000000]
 *              [--batch 65536] [--threads 1,2,4,8] [--variants sides,serial,steps] [--rated N] [--engine-draws]
 *              [--csv FILE] [--trace FILE] [--prepare 0|1]
 *
 * The stream is the one of `gen --gen.user_arrival A` (ingest/synth.c): before event n,
 * users + floor(A n) users have joined and the event's user is one of the `users` most recent
 * (uniform here), so A of the events bring a new user; items are uniform. Each variant starts
 * from an empty model (k factors, so new rows cost what they cost in serve) and resolves the
 * stream in batches of --batch events, clearing the touched marks every 16 batches as a
 * snapshot does. Only mfs_rows_resolve is timed (building a batch is not).
 * Variants: `sides`: each side of a batch in event order on its own thread (the path before
 * the three steps; threads beyond 2 idle); `serial`: lookups on every thread, then the ids not
 * found in event order, one thread per side, then the new rows' values on every thread (the
 * three steps before the map's shards); `steps`: the same with the ids not found placed by the
 * map's shards on every thread and numbered on one (rows.h).
 * Also printed: new user rows, minor page faults per new row (the host tables grow into fresh
 * pages), and for `serial` and `steps` the seconds of each of the three steps. --rated N also times what
 * the learner does next with the rows: the seen-items tracker (snapshot.seen_items N,
 * snapshots/snap_rated.h) fed every event (`sides`: one thread, as before; `steps`: a shard per
 * thread on the pool), cleared every 16 batches (CSV: seen_items, its seconds and ns/event; 0
 * without --rated). --engine-draws leaves new rows' values to the
 * engine (model_store/store.h engine_init_from), as serve on the CUDA engine does: no step 3. One process; variants and thread counts run one after another.
 * --trace FILE: a row every 2 M events (variant, threads, events so far, user rows, ns/event over
 * those 2 M): where the id map's tables double (every shard at about once, each time the ids pass
 * a power of two: 16.8 M, 33.6 M users) and drain, the cost shows as a run of slower rows.
 * --prepare 1 (the default, as serve): the id maps' next tables are mapped and touched ahead on
 * helper threads (mfs_model_prepare_ahead); 0: at the doubling, on the writer's path.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/rng.h"
#include "common/timeutil.h"
#include "serve/rows.h"
#include "snapshots/snap_rated.h"

static long minflt(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt;
}

int main(int argc, char **argv)
{
	int k = 128;
	uint64_t users = 1000000, items = 200000, events = 20000000, batch = 65536;
	double arrival = 0.1;
	int rated_max = 0, engine_draws = 0, prepare = 1;
	const char *threads_s = "1,2,4,8", *variants_s = "sides,serial,steps", *csv_path = NULL, *trace_path = NULL;
	for (int a = 1; a < argc; a++) {
		const char *v = a + 1 < argc ? argv[a + 1] : "";
		if (!strcmp(argv[a], "--k"))
			k = atoi(v), a++;
		else if (!strcmp(argv[a], "--users"))
			users = strtoull(v, NULL, 10), a++;
		else if (!strcmp(argv[a], "--items"))
			items = strtoull(v, NULL, 10), a++;
		else if (!strcmp(argv[a], "--events"))
			events = strtoull(v, NULL, 10), a++;
		else if (!strcmp(argv[a], "--batch"))
			batch = strtoull(v, NULL, 10), a++;
		else if (!strcmp(argv[a], "--arrival"))
			arrival = atof(v), a++;
		else if (!strcmp(argv[a], "--threads"))
			threads_s = v, a++;
		else if (!strcmp(argv[a], "--variants"))
			variants_s = v, a++;
		else if (!strcmp(argv[a], "--engine-draws"))
			engine_draws = 1;
		else if (!strcmp(argv[a], "--rated"))
			rated_max = atoi(v), a++;
		else if (!strcmp(argv[a], "--csv"))
			csv_path = v, a++;
		else if (!strcmp(argv[a], "--trace"))
			trace_path = v, a++;
		else if (!strcmp(argv[a], "--prepare"))
			prepare = atoi(v), a++;
		else {
			fprintf(stderr, "usage: see the header of bench/bench_rows.c\n");
			return 2;
		}
	}
	if (k < 1 || !users || !items || !batch || !events) {
		fprintf(stderr, "bench_rows: --k, --users, --items, --batch and --events must be positive\n");
		return 2;
	}
	FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
	if (csv_path && !csv) {
		perror(csv_path);
		return 1;
	}
	FILE *trace = trace_path ? fopen(trace_path, "w") : NULL;
	if (trace_path && !trace) {
		perror(trace_path);
		return 1;
	}
	if (trace)
		fprintf(trace, "variant,threads,prepare,events,users,ns_per_event\n");
	if (csv)
		fprintf(csv, "variant,threads,k,events,arrival,seconds,ns_per_event,events_per_s,new_users,minflt_per_new_row,"
		             "lookup_s,add_s,values_s,seen_items,seen_items_s,seen_items_ns_per_event\n");
	printf("ids -> rows: %" PRIu64 " events, %" PRIu64 " active users, %.3g new users per event, %" PRIu64
	       " items, k=%d, batches of %" PRIu64 "\n",
	       events, users, arrival, items, k, batch);
	printf("%-7s %7s %9s %11s %12s %10s %14s %29s\n", "variant", "threads", "seconds", "ns/event", "M events/s",
	       "new users", "faults/new row", "steps lookup/add/values (s)");
	mfs_ebatch_t b = {0};
	b.ev = calloc(batch, sizeof *b.ev);
	if (!b.ev) {
		fprintf(stderr, "bench_rows: out of memory\n");
		return 1;
	}
	char vbuf[64];
	snprintf(vbuf, sizeof vbuf, "%s", variants_s);
	for (char *vs = strtok(vbuf, ","); vs; vs = strtok(NULL, ",")) {
		const int sides = !strcmp(vs, "sides"), serial = !strcmp(vs, "serial");
		if (!sides && !serial && strcmp(vs, "steps")) {
			fprintf(stderr, "bench_rows: unknown variant %s (sides, serial, steps)\n", vs);
			return 2;
		}
		for (const char *ts = threads_s; *ts;) {
			const int threads = atoi(ts);
			ts += strcspn(ts, ",");
			ts += *ts == ',';
			if (threads < 1 || (sides && threads != 2 && threads != 1))
				continue; /* sides uses one or two threads */
			mfs_model_conf_t mc = {k, 0.1, 7};
			mfs_model_t *m;
			mfs_rows_t r;
			if (mfs_model_init(&mc, &m) || mfs_rows_init(&r, m, threads) || mfs_rows_start(&r) ||
			    (prepare && mfs_model_prepare_ahead(m))) {
				fprintf(stderr, "bench_rows: out of memory\n");
				return 1;
			}
			r.sides_only = sides;
			r.one_by_one = serial;
			if (engine_draws) /* what serve on the CUDA engine does: new rows' values drawn on the device */
				m->engine_init_from[0] = m->engine_init_from[1] = 0;
			mfs_snap_rated_t *rated = NULL;
			if (rated_max > 0 &&
			    mfs_snap_rated_init_shards((uint32_t)rated_max, sides ? 1 : (uint32_t)threads, &rated)) {
				fprintf(stderr, "bench_rows: out of memory\n");
				return 1;
			}
			double rated_s = 0;
			mfs_rng_t g;
			mfs_rng_seed(&g, 12345);
			double secs = 0, trace_s = 0;
			uint64_t trace_ev = 0;
			long f0 = minflt();
			for (uint64_t pos = 0, nb = 0; pos < events; nb++) {
				b.n = events - pos < batch ? (size_t)(events - pos) : (size_t)batch;
				for (size_t j = 0; j < b.n; j++, pos++) {
					const uint64_t joined = users + (uint64_t)(arrival * (double)pos);
					b.ev[j].user = mfs_id_u64(joined - mfs_rng_below(&g, users));
					b.ev[j].item = mfs_id_u64(1 + mfs_rng_below(&g, items));
				}
				const double t0 = mfs_now_s();
				if (mfs_rows_resolve(&r, &b)) {
					fprintf(stderr, "bench_rows: resolve failed\n");
					return 1;
				}
				const double t1 = mfs_now_s();
				secs += t1 - t0;
				trace_s += t1 - t0;
				trace_ev += b.n;
				if (trace && (trace_ev >= 2000000 || pos == events)) {
					fprintf(trace, "%s,%d,%d,%" PRIu64 ",%u,%.2f\n", vs, threads, prepare, pos, m->n_users,
					        trace_s * 1e9 / (double)trace_ev);
					trace_s = 0, trace_ev = 0;
				}
				if (rated && mfs_snap_rated_add_many(rated, m, r.u, r.i, b.n, r.par)) {
					fprintf(stderr, "bench_rows: out of memory\n");
					return 1;
				}
				rated_s += mfs_now_s() - t1;
				if (nb % 16 == 15) {
					mfs_snap_rated_clear(rated);
					mfs_touched_clear(&r.tu);
					mfs_touched_clear(&r.ti);
				}
			}
			const double fpr = (double)(minflt() - f0) / (double)(m->n_users ? m->n_users : 1);
			const double ns = secs * 1e9 / (double)events;
			printf("%-7s %7d %9.3f %11.1f %12.2f %10u %14.3f %11.3f %8.3f %8.3f\n", vs, threads, secs, ns,
			       (double)events / secs / 1e6, m->n_users, fpr, r.step_s[0], r.step_s[1], r.step_s[2]);
			if (csv)
				fprintf(csv, "%s,%d,%d,%" PRIu64 ",%g,%.4f,%.2f,%.0f,%u,%.4f,%.4f,%.4f,%.4f,%d,%.4f,%.2f\n", vs, threads, k,
				        events, arrival, secs, ns, (double)events / secs, m->n_users, fpr, r.step_s[0], r.step_s[1],
				        r.step_s[2], rated ? rated_max : 0, rated_s, rated ? rated_s * 1e9 / (double)events : 0.0);
			if (rated)
				printf("%-7s %7d seen items (snapshot.seen_items %d, %s): %.3f s, %.1f ns/event\n", vs, threads, rated_max,
				       sides ? "one thread, as before" : "a shard per thread", rated_s, rated_s * 1e9 / (double)events);
			if (prepare) {
				uint64_t pp, pu, pi;
				mfs_idmap_prepare_counts(m->users, &pp, &pu, &pi);
				printf("%-7s %7d user map: %" PRIu64 " tables prepared ahead, %" PRIu64 " rehashes took one, %" PRIu64
				       " mapped their own\n", vs, threads, pp, pu, pi);
			}
			mfs_snap_rated_free(rated);
			mfs_rows_free(&r);
			mfs_model_free(m);
		}
	}
	free(b.ev);
	if (csv)
		fclose(csv);
	if (trace)
		fclose(trace);
	return 0;
}
