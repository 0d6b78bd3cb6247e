/* bench_snapshot.c - what a streaming snapshot costs: publish R touched rows (k factors, fp32)
 * of a model with T rows per table in ONE LMDB write txn, as `mfstream serve` does. Prints a
 * table and appends CSV.
 *
 *   bench_snapshot [--rows 10000,100000,1000000] [--table 2000000] [--k 128] [--reps 5]
 *                  [--sync full,meta,none] [--path direct,staged,arrivals] [--dir DIR] [--csv FILE]
 *
 * Touched rows are spread over the table (a stride, like a real stream's); half users, half
 * items. The first publish of a fresh environment writes every row (the base), then each rep
 * rewrites R rows of an existing snapshot - the steady state. Median of reps; rows/s = R / s.
 * Each sync mode (snapshot.sync) gets its own environment under DIR, all from one model.
 * stage_s: staging the rows (mfs_snap_stage_fill: ids and values copied), what `serve`'s
 * learner spends per snapshot with the CPU engine (the ids, then the engine's copy of the
 * values); with the CUDA engine the learner stages only the ids and the writer thread
 * converts the values (mfs_engine_capture). The rest runs on the writer thread.
 * --path: direct publishes from the model (mfs_snap_publish, as `train` does, rows in key
 * order); staged publishes the stage (mfs_snap_publish_stage, as `serve`'s writer thread does),
 * the touched rows named in a shuffled order as a stream names them (by first touch), so the
 * writer sorts them and reads their values out of order. median_s is the publish alone.
 * arrivals: each rep stages R new users, as a stream of arriving users names them: ids that
 * continue ARRIVAL_RANGES interleaved ranges (as that many producers' users, each range past
 * the last: only the highest range appends at the end of the users DB), in arrival order, and
 * publishes them (with R / 10 existing items) as `serve`'s writer does.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "model_store/store.h"
#include "snapshots/snap_writer.h"

#define ARRIVAL_RANGES 5
#define ARRIVAL_BASE 20000000000ull /* above every id of the base model */
#define ARRIVAL_STEP 1000000000000ull

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	const char *rows_s = "10000,100000,1000000", *sync_s = "full,none", *path_s = "direct", *dir = NULL, *csv = NULL;
	long table = 2000000, k = 128, reps = 5;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--rows"))
			rows_s = argv[i + 1];
		else if (!strcmp(argv[i], "--table"))
			table = atol(argv[i + 1]);
		else if (!strcmp(argv[i], "--k"))
			k = atol(argv[i + 1]);
		else if (!strcmp(argv[i], "--reps"))
			reps = atol(argv[i + 1]);
		else if (!strcmp(argv[i], "--dir"))
			dir = argv[i + 1];
		else if (!strcmp(argv[i], "--csv"))
			csv = argv[i + 1];
		else if (!strcmp(argv[i], "--sync"))
			sync_s = argv[i + 1];
		else if (!strcmp(argv[i], "--path"))
			path_s = argv[i + 1];
	}
	if (!dir) {
		fprintf(stderr, "usage: bench_snapshot --dir DIR [--rows LIST] [--table T] [--k K] [--reps N] [--sync LIST]\n"
		                "                      [--path direct,staged,arrivals] [--csv F]\n");
		return 2;
	}
	mfs_log_set_level(MFS_LOG_WARN);
	char e[512];
	mfs_model_t *m = NULL;
	mfs_model_conf_t mc = {(int)k, 0.1, 1};
	if (mfs_model_init(&mc, &m))
		return 1;
	double t0 = mfs_now_s();
	for (long r = 0; r < table; r++) {
		uint32_t row;
		mfs_id_t id = mfs_id_u64((uint64_t)r * 7919u + 1);
		if (mfs_model_user_row(m, &id, &row) || mfs_model_item_row(m, &id, &row))
			return 1;
	}
	fprintf(stderr, "model: %ld users + %ld items, k=%ld, built in %.1f s\n", table, table, k, mfs_now_s() - t0);
	FILE *f = csv ? fopen(csv, "a") : NULL;
	if (f && ftell(f) == 0)
		fprintf(f, "sync,rows,k,table_rows,median_s,min_s,rows_per_s,mb_per_s,base_s,stage_median_s,path,prepare_s,"
		           "reserve_s,rows_s,rated_s,commit_s\n");
	static const char *const modes[] = {"full", "meta", "none"};
	mkdir(dir, 0755); /* each mode's environment is a subdirectory */
	char *sync_save = strdup(sync_s), *sp = NULL;
	for (char *stok = strtok_r(sync_save, ",", &sp); stok; stok = strtok_r(NULL, ",", &sp)) {
		int mode = -1;
		for (int j = 0; j < 3; j++)
			if (!strcmp(stok, modes[j]))
				mode = j;
		if (mode < 0) {
			fprintf(stderr, "bench_snapshot: unknown sync mode %s (full|meta|none)\n", stok);
			return 2;
		}
		char sub[4096];
		snprintf(sub, sizeof sub, "%s/%s", dir, stok);
		mfs_snap_writer_t *w = NULL;
		if (mfs_snap_writer_open_sync(sub, (size_t)4 << 30, (mfs_snap_sync_t)mode, &w, e, sizeof e)) {
			fprintf(stderr, "%s\n", e);
			return 1;
		}
		mfs_snap_info_t base = {.learning_rate = 0.01, .last_loss = 0, .rating_min = 0.5, .rating_max = 5};
		t0 = mfs_now_s();
		if (mfs_snap_publish(w, m, &base, NULL, e, sizeof e)) {
			fprintf(stderr, "%s\n", e);
			return 1;
		}
		double base_s = mfs_now_s() - t0;
		printf("\nsnapshot.sync=%s: base snapshot (every row, %ld rows): %.2f s (%.2f M rows/s)\n", stok, 2 * table,
		       base_s, 2.0 * (double)table / base_s / 1e6);
		printf("%6s %7s %10s %6s %10s %10s %12s %10s %10s\n", "sync", "path", "rows", "k", "median_s", "min_s",
		       "M_rows/s", "MB/s", "stage_s");
		mfs_snap_stage_t *stg = mfs_snap_stage_new();
		char *psave = strdup(path_s), *pp = NULL;
		for (char *ptok = strtok_r(psave, ",", &pp); ptok; ptok = strtok_r(NULL, ",", &pp)) {
			const int arrivals = !strcmp(ptok, "arrivals"), staged = arrivals || !strcmp(ptok, "staged");
			if (!staged && strcmp(ptok, "direct")) {
				fprintf(stderr, "bench_snapshot: unknown path %s (direct|staged|arrivals)\n", ptok);
				return 2;
			}
			uint64_t arrived = 0; /* arrivals so far, over every range */
			char *save = strdup(rows_s), *rp = NULL;
			for (char *tok = strtok_r(save, ",", &rp); tok; tok = strtok_r(NULL, ",", &rp)) {
				long R = atol(tok);
				size_t nu = (size_t)(arrivals ? R : R / 2), ni = (size_t)(arrivals ? R / 10 : R - R / 2);
				uint32_t *ur = malloc(nu * sizeof *ur), *ir = malloc(ni * sizeof *ir);
				double *ts = malloc((size_t)reps * sizeof *ts), *tg = malloc((size_t)reps * sizeof *tg);
				double ph0[MFS_SNAP_PH__COUNT], ph1[MFS_SNAP_PH__COUNT]; /* the writer's phases, over the reps */
				mfs_snap_writer_phases(w, ph0);
				for (long rep = 0; rep < reps; rep++) {
					/* a different spread of rows each rep; factors perturbed so every value changes */
					for (size_t j = 0; j < nu; j++)
						ur[j] = (uint32_t)((j * (size_t)table / nu + (size_t)rep) % (size_t)table);
					for (size_t j = 0; j < ni; j++)
						ir[j] = (uint32_t)((j * (size_t)table / ni + (size_t)rep * 3) % (size_t)table);
					for (size_t j = 0; arrivals && j < nu; j++, arrived++) { /* range j % RANGES, its next id */
						mfs_id_t id = mfs_id_u64(ARRIVAL_BASE + (arrived % ARRIVAL_RANGES) * ARRIVAL_STEP +
						                         arrived / ARRIVAL_RANGES);
						if (mfs_model_user_row(m, &id, &ur[j]))
							return 1;
					}
					for (size_t j = 0; j < nu; j++)
						m->P[(size_t)ur[j] * (size_t)k] += 1e-3f;
					if (staged && !arrivals) { /* named by first touch, not by key */
						uint64_t x = 0x9E3779B97F4A7C15ull + (uint64_t)rep;
						for (size_t j = nu; j > 1; j--) {
							x = x * 6364136223846793005ull + 1442695040888963407ull;
							size_t o = (size_t)((x >> 33) % j);
							uint32_t t = ur[j - 1];
							ur[j - 1] = ur[o], ur[o] = t;
						}
						for (size_t j = ni; j > 1; j--) {
							x = x * 6364136223846793005ull + 1442695040888963407ull;
							size_t o = (size_t)((x >> 33) % j);
							uint32_t t = ir[j - 1];
							ir[j - 1] = ir[o], ir[o] = t;
						}
					}
					mfs_snap_info_t in = base;
					in.user_rows = ur;
					in.n_user_rows = nu;
					in.item_rows = ir;
					in.n_item_rows = ni;
					t0 = mfs_now_s();
					if (mfs_snap_stage_fill(stg, m, &in, e, sizeof e)) {
						fprintf(stderr, "%s\n", e);
						return 1;
					}
					tg[rep] = mfs_now_s() - t0;
					t0 = mfs_now_s();
					if (staged ? mfs_snap_publish_stage(w, stg, &in, NULL, e, sizeof e)
					           : mfs_snap_publish(w, m, &in, NULL, e, sizeof e)) {
						fprintf(stderr, "%s\n", e);
						return 1;
					}
					ts[rep] = mfs_now_s() - t0;
				}
				mfs_snap_writer_phases(w, ph1);
				for (int x = 0; x < MFS_SNAP_PH__COUNT; x++)
					ph1[x] = (ph1[x] - ph0[x]) / (double)reps;
				qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
				qsort(tg, (size_t)reps, sizeof *tg, cmp_d);
				double med = ts[reps / 2], mb = (double)R * (double)(k + 1) * 4.0 / 1e6;
				printf("%6s %7s %10ld %6ld %10.4f %10.4f %12.2f %10.0f %10.4f   (mean s: prepare %.3f reserve %.3f "
				       "rows %.3f rated %.3f commit %.3f)\n",
				       stok, ptok, R, k, med, ts[0], (double)R / med / 1e6, mb / med, tg[reps / 2], ph1[0], ph1[1],
				       ph1[2], ph1[3], ph1[4]);
				if (f)
					fprintf(f, "%s,%ld,%ld,%ld,%.5f,%.5f,%.0f,%.1f,%.3f,%.5f,%s,%.5f,%.5f,%.5f,%.5f,%.5f\n", stok, R, k,
					        2 * table, med, ts[0], (double)R / med, mb / med, base_s, tg[reps / 2], ptok, ph1[0],
					        ph1[1], ph1[2], ph1[3], ph1[4]);
				free(ur);
				free(ir);
				free(ts);
				free(tg);
			}
			free(save);
		}
		free(psave);
		mfs_snap_stage_free(stg);
		mfs_snap_writer_close(w);
	}
	free(sync_save);
	if (f)
		fclose(f);
	mfs_model_free(m);
	return 0;
}
