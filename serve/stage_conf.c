/* stage_conf.c - see stage_conf.h. */
#include "serve/stage_conf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* engine.devices: "" (one engine, engine.device), "all", or ordinals "0,1,3" (a device may repeat:
 * tests run two shards on one GPU). */
static int devices_from(const char *s, mfs_engine_conf_t *out, char *errstr, size_t es)
{
	out->shards = 0;
	if (!s || !*s)
		return 0;
	if (!strcmp(s, "all")) {
		out->shards = MFS_SHARDS_ALL;
		return 0;
	}
	const char *p = s;
	uint32_t n = 0;
	while (*p) {
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (end == p || errno || v < 0 || v > 1023 || (*end && *end != ','))
			return mfs_errf(errstr, es, MFS_ECONFIG,
			                "config key \"engine.devices\": \"%s\" is not a list of device ordinals like 0,1 or \"all\"", s);
		if (n == MFS_SHARD_MAX)
			return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"engine.devices\": more than %d devices", MFS_SHARD_MAX);
		out->devices[n++] = (int)v;
		p = *end ? end + 1 : end;
	}
	out->shards = n;
	if (n == 1) /* one device: the plain engine on it */
		out->device = out->devices[0], out->shards = 0;
	return 0;
}

int mfs_engine_conf_from(const mfs_conf_t *c, mfs_engine_conf_t *out, char *errstr, size_t errstr_size)
{
	*out = (mfs_engine_conf_t){0};
	out->kind = c->engine_kind;
	out->threads = (int)c->engine_threads;
	out->deterministic = c->engine_deterministic;
	out->device = (int)c->engine_device;
	out->persistent = c->engine_persistent;
	/* a loss kernel per batch needs room beside the persistent kernel; without one the kernel
	 * takes the whole GPU and the full pass (every serve.fullpass_ms) and snapshot gathers stop
	 * and relaunch it (tens of microseconds each) */
	out->frequent_loss = c->serve_prequential;
	out->seed = (uint64_t)c->model_seed;
	out->dtype = c->model_dtype;
	out->cuda_rows_per_warp = (int)c->engine_cuda_rows_per_warp;
	out->cuda_plain_c = c->engine_cuda_plain_c;
	out->cuda_user_runs = (int)c->engine_cuda_user_runs;
	out->cuda_pk_blocks_per_sm = (int)c->engine_cuda_pk_blocks_per_sm;
	out->cuda_pk_stop_for_loss = c->engine_cuda_pk_stop_for_loss;
	out->cuda_pk_carveout = (int)c->engine_cuda_pk_carveout;
	out->cuda_pk_oversubscribe = c->engine_cuda_pk_oversubscribe;
	out->cpu_grid_users = (uint32_t)c->engine_cpu_grid_users;
	out->cpu_grid_items = (uint32_t)c->engine_cpu_grid_items;
	out->merge_batches = (uint32_t)c->engine_merge_batches;
	out->merge_hot = (uint32_t)c->engine_merge_hot;
	out->merge_hot_stream = c->engine_merge_hot_stream;
	out->merge_pieces = (uint32_t)c->engine_merge_pieces;
	out->merge_epoch_g = c->engine_merge_epoch_g;
	return devices_from(c->engine_devices, out, errstr, errstr_size);
}

void mfs_hparams_from(const mfs_conf_t *c, double lr, mfs_hparams_t *out)
{
	out->lr = (float)lr;
	out->lambda_p = (float)c->sgd_lambda_p;
	out->lambda_q = (float)c->sgd_lambda_q;
	out->lambda_bu = (float)c->sgd_lambda_bu;
	out->lambda_bi = (float)c->sgd_lambda_bi;
	out->clip_min = (float)c->rating_min;
	out->clip_max = (float)c->rating_max;
}

void mfs_lr_conf_from(const mfs_conf_t *c, int schedule, mfs_lr_conf_t *out)
{
	out->schedule = schedule;
	out->lr0 = c->sgd_lr;
	out->beta = c->lr_beta;
	out->up = c->lr_up;
	out->down = c->lr_down;
	out->min = c->lr_min;
	out->max = c->lr_max;
	out->patience = (int)c->lr_patience;
	out->plateau_gain = c->lr_plateau_gain;
	out->plateau_tol = c->lr_plateau_tol;
	out->plateau_cap = c->lr_plateau_cap;
}

void mfs_model_conf_from(const mfs_conf_t *c, mfs_model_conf_t *out)
{
	out->k = (int)c->model_k;
	out->init_scale = c->model_init_scale;
	out->seed = (uint64_t)c->model_seed;
}

void mfs_lr_conf_stream(const mfs_conf_t *c, mfs_lr_conf_t *out)
{
	mfs_lr_conf_from(c, c->serve_lr_schedule, out);
	out->lr0 = c->serve_lr;
	out->plateau_gain = 1;
}

void mfs_model_conf_stream(const mfs_conf_t *c, mfs_model_conf_t *out)
{
	mfs_model_conf_from(c, out);
	out->init_scale = c->serve_init_scale;
}
