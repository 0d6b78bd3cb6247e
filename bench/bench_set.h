/* bench_set.h - `--set KEY=VALUE` for the benchmarks: the engine's hidden experiment keys of the
 * configuration table (engine.cuda.*, engine.cpu.*: docs/ENGINE.md), taken as mfstream takes
 * them, for benchmarks that build their engine configuration by hand. */
#ifndef MFS_BENCH_SET_H
#define MFS_BENCH_SET_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "serve/stage_conf.h"

static mfs_conf_t bench_conf;
static int bench_conf_ready;

/* Apply one KEY=VALUE; a bad one ends the program with the table's message. */
static void bench_set(const char *kv)
{
	char key[128], err[512];
	const char *eq = strchr(kv, '=');
	if (!bench_conf_ready && mfs_conf_init(&bench_conf) == 0)
		bench_conf_ready = 1;
	if (!bench_conf_ready || !eq || (size_t)(eq - kv) >= sizeof key) {
		fprintf(stderr, "--set %s: want KEY=VALUE\n", kv);
		exit(2);
	}
	memcpy(key, kv, (size_t)(eq - kv));
	key[eq - kv] = '\0';
	if (mfs_conf_set(&bench_conf, key, eq + 1, err, sizeof err)) {
		fprintf(stderr, "--set %s: %s\n", kv, err);
		exit(2);
	}
}

/* The experiment fields of ec from what --set gave (untouched without any --set). */
static void bench_experiments(mfs_engine_conf_t *ec)
{
	if (!bench_conf_ready)
		return;
	mfs_engine_conf_t x;
	(void)mfs_engine_conf_from(&bench_conf, &x, NULL, 0);
	ec->cuda_rows_per_warp = x.cuda_rows_per_warp;
	ec->cuda_plain_c = x.cuda_plain_c;
	ec->cuda_user_runs = x.cuda_user_runs;
	ec->cuda_pk_blocks_per_sm = x.cuda_pk_blocks_per_sm;
	ec->cuda_pk_stop_for_loss = x.cuda_pk_stop_for_loss;
	ec->cuda_pk_carveout = x.cuda_pk_carveout;
	ec->cuda_pk_oversubscribe = x.cuda_pk_oversubscribe;
	ec->cpu_grid_users = x.cpu_grid_users;
	ec->cpu_grid_items = x.cpu_grid_items;
	ec->merge_batches = x.merge_batches;
	ec->merge_hot = x.merge_hot;
	ec->merge_pieces = x.merge_pieces;
}

#endif
