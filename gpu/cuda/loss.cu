/* loss.cu - RMSE and MAE of a batch or of resident ratings: the deterministic loss kernel
 * (loss_kernel), its launcher (loss_launch) and the wait for a kernel queued beside the running
 * persistent kernel (beside_wait, also the capture's).
 *
 * DESIGN: fixed chunks of LOSS_CHUNK ratings per block, double partials added in a fixed
 * order, so a pass over the same ratings and model gives the same bits every time. Loss and
 * gather kernels run on the engine's stream beside the persistent kernel when there is room
 * (pk_open sizes its grid for that); otherwise they stop it first (pk_stop).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/timeutil.h"
#include "gpu/cuda/cuda_int.h"
#include "gpu/cuda/step.cuh"

#define LOSS_CHUNK 512 /* ratings per loss block: fixed, so the reduction order is fixed */

/* loss_kernel: for each rating (u, i, r)
 *   pred = clip(mu + bu[u] + bi[i] + p.q, clip_min, clip_max)   (the reference's predict:
 *   the same float additions in the same order, the dot product in mfs_dot_lanes' order;
 *   an MFS_ROW_NONE side contributes nothing)
 *   e = r - pred (double);  sse += e^2,  sae += |e|
 * Launch (loss_launch): block b of 8 warps scores ratings [b*CHUNK, (b+1)*CHUNK), one warp per
 * rating (warp w takes ratings w, w + 8, ...); the block adds its warps in warp order:
 * part[2b] = sse, part[2b+1] = sae. The host adds blocks in order. Fixed chunking makes the
 * result bit-reproducible for a given set (not bit-equal to the CPU's sums, which add in
 * index order). Bytes per rating: 12 (rating) + p and q read (2 k sizeof(T)) + 8 (biases):
 * 8k + 20 in fp32, 4k + 20 in fp16; 16 per block written. */
template <typename T, int V>
__global__ void loss_kernel(const uint32_t *__restrict__ us, const uint32_t *__restrict__ is,
                            const float *__restrict__ rs, size_t n, const T *__restrict__ P,
                            const T *__restrict__ Q, const float *__restrict__ bu,
                            const float *__restrict__ bi, float mu, const mfs_hparams_t *hp, double *part)
{
	const int k = V * 32;
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	__shared__ double s_sse[WARPS_PER_BLOCK], s_sae[WARPS_PER_BLOCK];
	const size_t begin = (size_t)blockIdx.x * LOSS_CHUNK;
	const size_t end = begin + LOSS_CHUNK < n ? begin + LOSS_CHUNK : n;
	const float lo = hp->clip_min, hi = hp->clip_max;
	double sse = 0, sae = 0;
	for (size_t x = begin + w; x < end; x += WARPS_PER_BLOCK) {
		const uint32_t u = us[x], i = is[x];
		/* the reference's predict (loss_ref.c): the same additions in the same order */
		float pred = mu;
		if (u != MFS_ROW_NONE)
			pred = __fadd_rn(pred, bu[u]);
		if (i != MFS_ROW_NONE)
			pred = __fadd_rn(pred, bi[i]);
		if (u != MFS_ROW_NONE && i != MFS_ROW_NONE) {
			float dot = 0.f;
#pragma unroll
			for (int j = 0; j < V; j++)
				dot = fmaf(stor<T>::ld(P + (size_t)u * k + lane + 32 * j),
				           stor<T>::ld(Q + (size_t)i * k + lane + 32 * j), dot);
			pred = __fadd_rn(pred, dot_fold32(dot));
		}
		/* compares, not fminf/fmaxf: a NaN prediction must stay NaN and show in the loss */
		if (pred < lo)
			pred = lo;
		if (pred > hi)
			pred = hi;
		const double e = (double)rs[x] - (double)pred;
		sse += e * e;
		sae += fabs(e);
	}
	if (lane == 0) {
		s_sse[w] = sse;
		s_sae[w] = sae;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		double a = 0, b = 0;
		for (int j = 0; j < WARPS_PER_BLOCK; j++) {
			a += s_sse[j];
			b += s_sae[j];
		}
		part[2 * blockIdx.x] = a;
		part[2 * blockIdx.x + 1] = b;
	}
}

/* ---- host side ----------------------------------------------------------------------- */

template <typename T>
static void loss_launch_t(struct cuda_impl *c, const struct dev_set *s, unsigned blocks, float mu, int k)
{
	const T *P = (const T *)c->P, *Q = (const T *)c->Q;
#define LOSS_CASE(V)                                                                                             \
	case V:                                                                                                      \
		loss_kernel<T, V><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(s->u, s->i, s->r, s->n, P, Q, c->bu,  \
		                                                                  c->bi, mu, c->d_hp, c->d_part);      \
		break;
	switch (k / 32) {
		LOSS_CASE(1) LOSS_CASE(2) LOSS_CASE(3) LOSS_CASE(4) LOSS_CASE(5) LOSS_CASE(6) LOSS_CASE(7) LOSS_CASE(8)
	}
#undef LOSS_CASE
}

template <typename T> static const void *loss_fn_t(int k)
{
	switch (k / 32) {
#define LOSS_FN(V)                                                                                               \
	case V:                                                                                                      \
		return (const void *)loss_kernel<T, V>;
		LOSS_FN(1) LOSS_FN(2) LOSS_FN(3) LOSS_FN(4) LOSS_FN(5) LOSS_FN(6) LOSS_FN(7) LOSS_FN(8)
#undef LOSS_FN
	}
	return NULL;
}

/* The loss kernel for k and the storage type (pk_open sizes the persistent grid around it). */
const void *loss_fn(int fp16, int k)
{
	return fp16 ? loss_fn_t<__half>(k) : loss_fn_t<float>(k);
}

/* Wait for the engine's stream, whose loss or gather kernel may run beside the persistent
 * kernel. If it has not finished after PK_BESIDE_MS, it most likely waits for an SM the
 * persistent kernel holds (a tool or an MPS share changed what fits, and the residency check
 * could not see it): stop the persistent kernel, which frees them, and stop it for loss and
 * gather calls from then on. */
#define PK_BESIDE_MS 2000
int beside_wait(struct cuda_impl *c, cudaEvent_t ev)
{
	if (c->pk.running && c->pk.beside) {
		const double t0 = mfs_now_s();
		cudaError_t q;
		for (unsigned spins = 0; (q = ev ? cudaEventQuery(ev) : cudaStreamQuery(c->stream)) == cudaErrorNotReady;
		     spins++) {
			if (spins < 64) /* a loss pass takes tens of microseconds: spin first, as a sync would */
				continue;
			if (mfs_now_s() - t0 > PK_BESIDE_MS / 1e3) {
				mfs_warn("cuda", "msg=\"a kernel beside the persistent kernel did not finish: loss and gather "
				                 "kernels stop it from now on\" waited_ms=%d blocks=%d",
				         PK_BESIDE_MS, c->pk.grid);
				c->pk.beside = 0;
				int rc = pk_stop(c);
				if (rc)
					return rc;
				break;
			}
			struct timespec ts = {0, 2000};
			nanosleep(&ts, NULL);
		}
		if (q != cudaSuccess && q != cudaErrorNotReady)
			MFS_CUDA_TRY(q);
	}
	if (ev)
		MFS_CUDA_TRY(cudaEventSynchronize(ev));
	else
		MFS_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return 0;
}

/* Wait for the engine's stream (see beside_wait). */
static int beside_sync(struct cuda_impl *c) { return beside_wait(c, NULL); }

int loss_launch(mfs_engine_t *e, const struct dev_set *s, mfs_loss_t *out)
{
	struct cuda_impl *c = impl_of(e);
	memset(out, 0, sizeof *out);
	if (!s->n)
		return 0;
	size_t blocks = (s->n + LOSS_CHUNK - 1) / LOSS_CHUNK;
	int rc;
	if ((blocks > c->part_cap || !c->pk.beside) && (rc = pk_stop(c)))
		return rc;
	if (blocks > c->part_cap) {
		cudaFree(c->d_part);
		c->d_part = NULL;
		c->part_cap = 0;
		MFS_CUDA_TRY(cudaMalloc(&c->d_part, blocks * 2 * sizeof(double)));
		c->part_cap = blocks;
	}
	const float mu = (float)e->model->mu;
	if (c->fp16)
		loss_launch_t<__half>(c, s, (unsigned)blocks, mu, e->model->k);
	else
		loss_launch_t<float>(c, s, (unsigned)blocks, mu, e->model->k);
	MFS_CUDA_LAUNCHED();
	double *h = (double *)malloc(blocks * 2 * sizeof(double));
	if (!h)
		return ENOMEM;
	cudaError_t err = cudaMemcpyAsync(h, c->d_part, blocks * 2 * sizeof(double), cudaMemcpyDeviceToHost, c->stream);
	if (err != cudaSuccess) {
		free(h);
		MFS_CUDA_TRY(err);
	}
	if ((rc = beside_sync(c))) {
		free(h);
		return rc;
	}
	for (size_t b = 0; b < blocks; b++) {
		out->sse += h[2 * b];
		out->sae += h[2 * b + 1];
	}
	free(h);
	out->n = s->n;
	out->rmse = sqrt(out->sse / (double)s->n);
	out->mae = out->sae / (double)s->n;
	return 0;
}

int cuda_loss(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *out)
{
	struct cuda_impl *c = impl_of(e);
	const double t0 = mfs_now_s();
	int rc = stage_batch(e, b);
	const double t1 = mfs_now_s();
	if (!rc)
		rc = loss_launch(e, &c->batch, out);
	c->loss_calls++;
	c->loss_upload_s += t1 - t0;
	c->loss_run_s += mfs_now_s() - t1;
	return rc;
}
