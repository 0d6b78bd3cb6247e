/* engine_cuda.cu - the CUDA engine: device-resident factors, Hogwild! SGD with 16-byte row
 * accesses and per-row store modes, a persistent kernel fed from a device ring, a deterministic
 * loss. This file wires it: open, close, grow, hyperparameters, memory, drain, progress and the
 * vtable (gpu/engine_int.h, like the CPU engine). The other files are listed in cuda_int.h.
 *
 * DESIGN: the host model (model_store) stays the source of truth for ids and new rows; the
 * device holds P, Q, bu, bi with their own capacities. grow() uploads rows the host added
 * since the last call (their initial values come from model_store, so CPU and GPU start from
 * the same numbers); sync() copies every row back. Hyperparameters live in device memory and
 * every launch reads them there, so a running kernel can be retuned without a relaunch.
 * Calls other than streaming batches on the ring are synchronous: each returns with the work
 * done and errors checked.
 *
 * Factor storage is fp32 or fp16 (model.dtype); arithmetic is always fp32, biases fp32. The
 * kernels are templated on the storage type T, so the fp16 path is the same code with half the
 * bytes per update (step.cuh).
 *
 * Knobs for experiments (the hidden engine.cuda.* keys, read at open): plain_c (the plain-store
 * threshold; < 0 = atomic deltas for every row), rows_per_warp (caps the Hogwild grid), user_runs
 * (resident epochs' run length, -1 = iid order: runs.cu) and the persistent kernel's pk_* (ring.cu).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda/cuda_int.h"

/* grow one device table to `need` rows (copy under the synchronous stream) */
static int dev_grow(struct cuda_impl *c, void **F, float **b, uint32_t *cap, uint32_t need, int k)
{
	if (need <= *cap)
		return 0;
	uint64_t nc = *cap ? *cap : 1024;
	while (nc < need)
		nc *= 2;
	void *nf = NULL;
	float *nb = NULL;
	MFS_CUDA_TRY(cudaMalloc(&nf, nc * (size_t)k * c->es));
	if (cudaMalloc(&nb, nc * sizeof(float)) != cudaSuccess) {
		cudaFree(nf);
		MFS_CUDA_TRY(cudaGetLastError());
		return MFS_EGPU;
	}
	if (*cap) {
		MFS_CUDA_TRY(cudaMemcpyAsync(nf, *F, (size_t)*cap * k * c->es, cudaMemcpyDeviceToDevice, c->stream));
		MFS_CUDA_TRY(cudaMemcpyAsync(nb, *b, (size_t)*cap * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	}
	cudaFree(*F);
	cudaFree(*b);
	*F = nf;
	*b = nb;
	*cap = (uint32_t)nc;
	return 0;
}

/* The stream new rows are uploaded on: with the persistent kernel, its copy stream, so a row
 * lands before any batch published after it can name it (a legacy-stream copy would not be
 * ordered with the ring). Copies from pageable memory are staged before the call returns. */
static cudaStream_t upload_stream(const struct cuda_impl *c)
{
	return c->pk.on ? c->pk.copy : c->stream;
}

/* Host fp32 rows [a, a+n) -> device rows (converted to fp16 on the host when needed), queued
 * on upload_stream (the caller synchronizes it when the kernel is not persistent). */
static int put_rows(struct cuda_impl *c, void *dst, const float *src, size_t a, size_t n, int k)
{
	const size_t cnt = n * (size_t)k;
	char *d = (char *)dst + a * (size_t)k * c->es;
	if (!c->fp16) {
		MFS_CUDA_TRY(cudaMemcpyAsync(d, src + a * k, cnt * sizeof(float), cudaMemcpyHostToDevice, upload_stream(c)));
		return 0;
	}
	__half *h = (__half *)malloc(cnt * sizeof *h);
	if (!h)
		return ENOMEM;
	for (size_t x = 0; x < cnt; x++)
		h[x] = __float2half_rn(src[a * k + x]);
	cudaError_t err = cudaMemcpyAsync(d, h, cnt * sizeof *h, cudaMemcpyHostToDevice, upload_stream(c));
	free(h); /* pageable: already staged */
	MFS_CUDA_TRY(err);
	return 0;
}

static int cuda_grow(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	mfs_model_t *m = e->model;
	const int k = m->k;
	int rc;
	if ((m->n_users > c->cap_u || m->n_items > c->cap_i) && (rc = pk_stop(c)))
		return rc; /* new tables: the kernel restarts on them at the next batch */
	/* rows drawn on the device are a kernel on the ring's copy stream, ahead of the next
	 * slot's publish: where the persistent kernel leaves no room beside it, that kernel would
	 * wait for an SM the persistent kernel never gives back, and the kernel for that slot */
	const int draw = (m->n_users > c->n_u && m->engine_init_from[0] < m->n_users) ||
	                 (m->n_items > c->n_i && m->engine_init_from[1] < m->n_items);
	if (draw && !c->pk.beside && (rc = pk_stop(c)))
		return rc;
	if ((rc = dev_grow(c, &c->P, &c->bu, &c->cap_u, m->n_users, k)) ||
	    (rc = dev_grow(c, &c->Q, &c->bi, &c->cap_i, m->n_items, k)) || (rc = cuda_base_grow(c, k)))
		return rc;
	/* rows the host added: uploaded (initialized by model_store), or drawn here at and above
	 * engine_init_from (mfs_engine_take_new_rows) */
	for (int ent = 0; ent < 2; ent++) {
		uint32_t *have = ent ? &c->n_i : &c->n_u;
		const uint32_t want = ent ? m->n_items : m->n_users, from = m->engine_init_from[ent];
		if (want <= *have)
			continue;
		const size_t a = *have, up = (from > a ? (from < want ? from : want) : a) - a;
		if (up) {
			if ((rc = put_rows(c, ent ? c->Q : c->P, ent ? m->Q : m->P, a, up, k)))
				return rc;
			MFS_CUDA_TRY(cudaMemcpyAsync((ent ? c->bi : c->bu) + a, (ent ? m->bi : m->bu) + a, up * sizeof(float),
			                             cudaMemcpyHostToDevice, upload_stream(c)));
		}
		if ((rc = init_rows_launch(c, m, ent, a + up, want - a - up, upload_stream(c))))
			return rc;
		if (ent && c->items_base) { /* new items: the base of the next merge is their start */
			MFS_CUDA_TRY(cudaMemcpyAsync((char *)c->Q0 + a * (size_t)k * c->es, (const char *)c->Q + a * (size_t)k * c->es,
			                             (want - a) * (size_t)k * c->es, cudaMemcpyDeviceToDevice, upload_stream(c)));
			MFS_CUDA_TRY(cudaMemcpyAsync(c->b0 + a, c->bi + a, (want - a) * sizeof(float), cudaMemcpyDeviceToDevice,
			                             upload_stream(c)));
		}
		*have = want;
	}
	if (!c->pk.on) {
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	} else { /* loss and gather kernels (c->stream) must see the new rows too */
		MFS_CUDA_TRY(cudaEventRecord(c->pk.up_ev, c->pk.copy));
		MFS_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->pk.up_ev, 0));
	}
	return 0;
}

static int cuda_take_new_rows(mfs_engine_t *e)
{
	int rc = cuda_grow(e); /* every row the host has so far is the host's */
	if (rc)
		return rc;
	e->model->engine_init_from[0] = e->model->n_users;
	e->model->engine_init_from[1] = e->model->n_items;
	return 0;
}

static void cuda_close(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	if (!c)
		return;
	if (c->pk.published)
		mfs_info("cuda", "msg=\"ring submits\" slots=%llu full=%llu wait_s=%.3f stage_s=%.3f scales_s=%.3f queue_s=%.3f",
		         (unsigned long long)c->pk.published, (unsigned long long)c->pk.waits, c->pk.wait_s, c->pk.stage_s,
		         c->pk.scales_s, c->pk.queue_s);
	if (c->loss_calls)
		mfs_info("cuda", "msg=\"loss calls\" calls=%llu upload_s=%.3f run_s=%.3f", (unsigned long long)c->loss_calls,
		         c->loss_upload_s, c->loss_run_s);
	pk_free(c);
	cuda_merge_free(c);
	cudaFree(c->g_rows);
	cudaFree(c->g_F);
	cudaFree(c->g_b);
	for (int x = 0; x < 2; x++) {
		cudaFreeHost(c->g_st[x]);
		if (c->g_st_ev[x])
			cudaEventDestroy(c->g_st_ev[x]);
	}
	if (c->cap_gathered)
		cudaEventDestroy(c->cap_gathered);
	if (c->cap_stream)
		cudaStreamDestroy(c->cap_stream);
	reset_free(c);
	cudaFree(c->P);
	cudaFree(c->Q);
	cudaFree(c->bu);
	cudaFree(c->bi);
	cudaFree(c->d_hp);
	cudaFree(c->d_skipped);
	cudaFree(c->batch.u);
	cudaFree(c->batch.i);
	cudaFree(c->batch.r);
	cudaFree(c->d_part);
	mfs_keycount_free(&c->cnt_u);
	mfs_keycount_free(&c->cnt_i);
	free(c->h_ru);
	free(c->h_ri);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	free(c);
	e->impl = NULL;
}

static int cuda_can_implement(const mfs_model_t *m, char *why, size_t ws)
{
	if (m->k % 32 || m->k < 32 || m->k > 256) {
		mfs_errf(why, ws, MFS_EINVAL, "the CUDA engine needs model.k to be a multiple of 32 in 32..256 (got %d)", m->k);
		return 0;
	}
	return 1;
}

static int cuda_open(mfs_engine_t *e, char *errstr, size_t es)
{
	if (!cuda_can_implement(e->model, errstr, es))
		return MFS_EINVAL;
	struct cuda_impl *c = (struct cuda_impl *)calloc(1, sizeof *c);
	if (!c)
		return ENOMEM;
	e->impl = c;
	c->dev = e->conf.device;
	c->items_base = e->conf.items_base;
	c->fp16 = e->conf.dtype == MFS_DTYPE_FP16;
	c->es = c->fp16 ? sizeof(__half) : sizeof(float);
	/* experiments (bench_gpu_sgd --variants; hidden engine.cuda.* keys) */
	c->rows_per_warp = e->conf.cuda_rows_per_warp > 0 ? (size_t)e->conf.cuda_rows_per_warp : 0;
	c->plain_c = e->conf.cuda_plain_c > 0 ? e->conf.cuda_plain_c : e->conf.cuda_plain_c < 0 ? 0.0 : PLAIN_C;
	c->run_max = e->conf.cuda_user_runs > 0 ? (uint32_t)e->conf.cuda_user_runs
	             : e->conf.cuda_user_runs < 0 ? 0u : RUN_MAX_AUTO;
	cudaError_t err = cudaSetDevice(c->dev);
	if (err == cudaSuccess)
		err = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, c->dev);
	if (err == cudaSuccess)
		err = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (err == cudaSuccess)
		err = cudaMalloc(&c->d_hp, sizeof(mfs_hparams_t));
	if (err == cudaSuccess)
		err = cudaMalloc(&c->d_skipped, sizeof(unsigned long long));
	if (err == cudaSuccess)
		err = cudaMemset(c->d_skipped, 0, sizeof(unsigned long long));
	if (err == cudaSuccess)
		err = cudaEventCreateWithFlags(&c->cap_gathered, cudaEventDisableTiming);
	for (int x = 0; x < 2 && err == cudaSuccess; x++)
		err = cudaEventCreateWithFlags(&c->g_st_ev[x], cudaEventDisableTiming);
	if (err == cudaSuccess)
		err = cudaStreamCreateWithFlags(&c->cap_stream, cudaStreamNonBlocking);
	if (err == cudaSuccess)
		err = cudaEventCreateWithFlags(&c->r_done, cudaEventDisableTiming);
	if (err != cudaSuccess) {
		mfs_errf(errstr, es, MFS_EGPU, "CUDA device %d: %s", c->dev, cudaGetErrorString(err));
		cuda_close(e);
		return MFS_EGPU;
	}
	int rc = hog_setup(c, e->model->k);
	if (!rc)
		rc = runs_setup(c, e->model->k);
	if (!rc && c->items_base)
		rc = cuda_base_open(c);
	if (rc) {
		mfs_errf(errstr, es, rc, "CUDA device %d: cannot size the Hogwild kernel", c->dev);
		cuda_close(e);
		return rc;
	}
	rc = cuda_grow(e);
	if (rc) {
		mfs_errf(errstr, es, rc, "CUDA device %d: cannot allocate the model", c->dev);
		cuda_close(e);
		return rc;
	}
	if (e->conf.persistent && !e->conf.deterministic && (rc = pk_open(e))) {
		mfs_errf(errstr, es, rc, "CUDA device %d: cannot set up the persistent kernel's ring", c->dev);
		cuda_close(e);
	}
	return rc;
}

static int cuda_set_hparams(mfs_engine_t *e, const mfs_hparams_t *hp)
{
	struct cuda_impl *c = impl_of(e);
	MFS_CUDA_TRY(cudaMemcpyAsync(c->d_hp, hp, sizeof *hp, cudaMemcpyHostToDevice, c->stream));
	MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return 0;
}

static int cuda_memory(mfs_engine_t *e, uint64_t *used, uint64_t *total)
{
	(void)e;
	size_t fr = 0, tot = 0;
	MFS_CUDA_TRY(cudaMemGetInfo(&fr, &tot));
	*used = (uint64_t)(tot - fr);
	*total = (uint64_t)tot;
	return 0;
}

static int cuda_drain(mfs_engine_t *e)
{
	return pk_quiesce(impl_of(e));
}

/* Ring: slots published / consumed (every batch published before the ticket is applied once
 * consumed reaches it). Launch per batch: calls, applied on return. */
static void cuda_progress(mfs_engine_t *e, uint64_t *ticket, uint64_t *applied)
{
	struct cuda_impl *c = impl_of(e);
	if (c->pk.on) {
		*ticket = c->pk.published;
		*applied = pk_consumed(c);
	} else {
		*ticket = *applied = e->sgd_calls;
	}
}

/* Every entry point selects the engine's device first: a process may hold several engines, one
 * per device (gpu/sharded.c), called from one thread or, for epochs, a thread each, and
 * capture_wait runs on the snapshot writer's thread. */
#define ON_DEV(e) MFS_CUDA_TRY(cudaSetDevice(impl_of(e)->dev))
static void d_close(mfs_engine_t *e)
{
	if (impl_of(e))
		(void)cudaSetDevice(impl_of(e)->dev);
	cuda_close(e);
}
static int d_set_hparams(mfs_engine_t *e, const mfs_hparams_t *hp) { ON_DEV(e); return cuda_set_hparams(e, hp); }
static int d_grow(mfs_engine_t *e) { ON_DEV(e); return cuda_grow(e); }
static int d_sgd(mfs_engine_t *e, const mfs_batch_t *b, float s, int r) { ON_DEV(e); return cuda_sgd(e, b, s, r); }
static int d_loss(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *o) { ON_DEV(e); return cuda_loss(e, b, o); }
static int d_resident_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **o)
{
	ON_DEV(e);
	return cuda_resident_load(e, b, o);
}
static void d_resident_free(mfs_engine_t *e, mfs_resident_t *s)
{
	(void)cudaSetDevice(impl_of(e)->dev);
	cuda_resident_free(e, s);
}
static int d_sgd_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t ep) { ON_DEV(e); return cuda_sgd_epoch(e, s, ep); }
static int d_loss_resident(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *o)
{
	ON_DEV(e);
	return cuda_loss_resident(e, s, o);
}
static int d_sync(mfs_engine_t *e) { ON_DEV(e); return cuda_sync(e); }
static int d_memory(mfs_engine_t *e, uint64_t *u, uint64_t *t) { ON_DEV(e); return cuda_memory(e, u, t); }
static int d_drain(mfs_engine_t *e) { ON_DEV(e); return cuda_drain(e); }
static int d_capture(mfs_engine_t *e, const uint32_t *ur, size_t nu, float *du, const uint32_t *ir, size_t ni,
                     float *di)
{
	ON_DEV(e);
	return cuda_capture(e, ur, nu, du, ir, ni, di);
}
static int d_capture_wait(mfs_engine_t *e) { ON_DEV(e); return cuda_capture_wait(e); }
static int d_reset_rows(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, int in_flight)
{
	ON_DEV(e);
	return cuda_reset_rows(e, ent, rows, n, in_flight);
}
static int d_take_new_rows(mfs_engine_t *e) { ON_DEV(e); return cuda_take_new_rows(e); }

extern "C" const struct mfs_engine_i mfs_engine_cuda_i = {
	"cuda",        cuda_can_implement, cuda_open,     d_close,       d_set_hparams, d_grow,   d_sgd,
	d_loss,        d_resident_load, d_resident_free, d_sgd_epoch,     d_loss_resident, d_sync,     d_memory,
	d_drain,       cuda_progress, d_capture,     d_capture_wait, d_reset_rows, d_take_new_rows, cuda_merge,
	cuda_merge_forget,
};
