/* capture.cu - model rows back to the host: the whole tables (cuda_sync) and a snapshot's rows
 * gathered on the device beside the running persistent kernel (gather_rows_kernel,
 * cuda_capture), copied and converted to fp32 on the writer thread (cuda_capture_wait).
 *
 * DESIGN: one capture outstanding at a time (engine.c waits for it before the next and at
 * close). cuda_capture runs on the engine thread and returns once the gather has run;
 * cuda_capture_wait may run on another thread and touches only the cap_* fields and the pinned
 * buffers its event guards.
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "gpu/cuda/cuda_int.h"

/* gather_rows_kernel: out row j = F row rows[j] (k elements), bout[j] = b[rows[j]].
 * Launch (gather_launch): min(ceil(n / 8), 4096) blocks of 8 warps on the engine's stream,
 * grid-stride, one warp per row, lanes stride the row. Reads through L2: a persistent kernel
 * may have written it. Bytes per row: 4 (index) + k sizeof(T) read and written + 8 (bias). */
template <typename T>
__global__ void gather_rows_kernel(const T *F, const float *b, const uint32_t *__restrict__ rows, size_t n, int k,
                                   T *out, float *bout)
{
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t warps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const int lane = threadIdx.x & 31;
	for (size_t j = warp; j < n; j += warps) {
		const size_t r = __ldg(rows + j);
		for (int x = lane; x < k; x += 32)
			out[j * (size_t)k + x] = F[r * (size_t)k + x];
		if (lane == 0)
			bout[j] = __ldcg(b + r);
	}
}

/* ---- host side ----------------------------------------------------------------------- */

/* Device rows [0, n) -> host fp32. */
static int get_rows(struct cuda_impl *c, float *dst, const void *src, size_t n, int k)
{
	const size_t cnt = n * (size_t)k;
	if (!c->fp16) {
		MFS_CUDA_TRY(cudaMemcpy(dst, src, cnt * sizeof(float), cudaMemcpyDeviceToHost));
		return 0;
	}
	__half *h = (__half *)malloc((cnt ? cnt : 1) * sizeof *h);
	if (!h)
		return ENOMEM;
	cudaError_t err = cudaMemcpy(h, src, cnt * sizeof *h, cudaMemcpyDeviceToHost);
	if (err == cudaSuccess)
		for (size_t x = 0; x < cnt; x++)
			dst[x] = __half2float(h[x]);
	free(h);
	MFS_CUDA_TRY(err);
	return 0;
}

int cuda_sync(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	mfs_model_t *m = e->model;
	int rc;
	/* every submitted batch applied; the kernel idles meanwhile, or, where nothing runs beside
	 * it, stops: under compute-sanitizer this copy, made beside the running kernel after a
	 * capture had used the engine's stream, never returned (docs/ENGINE.md, Residency) */
	if ((rc = c->pk.beside ? pk_quiesce(c) : pk_stop(c)))
		return rc;
	if (c->pk.on) /* and rows uploaded after the last batch have landed */
		MFS_CUDA_TRY(cudaStreamSynchronize(c->pk.copy));
	if ((rc = get_rows(c, m->P, c->P, c->n_u, m->k)) || (rc = get_rows(c, m->Q, c->Q, c->n_i, m->k)))
		return rc;
	MFS_CUDA_TRY(cudaMemcpy(m->bu, c->bu, (size_t)c->n_u * sizeof(float), cudaMemcpyDeviceToHost));
	MFS_CUDA_TRY(cudaMemcpy(m->bi, c->bi, (size_t)c->n_i * sizeof(float), cudaMemcpyDeviceToHost));
	return 0;
}

/* Bytes of one pinned chunk of the copy back: large enough that a copy is mostly transfer,
 * small enough that it is allocated once (a snapshot of any size goes through the same two). */
#define CAP_CHUNK_BYTES (8u << 20)

/* Room for n gathered rows on the device (doubling), and at the first call the two pinned
 * chunks. Device allocations only while the persistent kernel is stopped (cudaFree synchronizes
 * the device), and never under an outstanding capture (its copy reads these buffers). The pinned
 * chunks have a fixed size: pinning as much host memory as the largest snapshot, and again at
 * every doubling, is what held the learner 0.3-0.6 s after a table doubled (docs/BENCHMARKS.md,
 * growth). */
static int gather_reserve(mfs_engine_t *e, size_t n)
{
	struct cuda_impl *c = impl_of(e);
	const int k = e->model->k;
	int rc;
	if (!c->g_st[0]) {
		const size_t row_bytes = (size_t)k * c->es + sizeof(float);
		c->g_st_rows = CAP_CHUNK_BYTES / row_bytes;
		for (int x = 0; x < 2; x++)
			MFS_CUDA_TRY(cudaHostAlloc(&c->g_st[x], c->g_st_rows * row_bytes, cudaHostAllocDefault));
	}
	if (n <= c->g_cap)
		return 0;
	if ((rc = pk_stop(c)))
		return rc;
	size_t nc = c->g_cap ? c->g_cap : 4096;
	while (nc < n)
		nc *= 2;
	cudaFree(c->g_rows);
	cudaFree(c->g_F);
	cudaFree(c->g_b);
	c->g_rows = NULL, c->g_F = NULL, c->g_b = NULL, c->g_cap = 0;
	MFS_CUDA_TRY(cudaMalloc(&c->g_rows, nc * sizeof *c->g_rows));
	MFS_CUDA_TRY(cudaMalloc(&c->g_F, nc * (size_t)k * c->es));
	MFS_CUDA_TRY(cudaMalloc(&c->g_b, nc * sizeof(float)));
	c->g_cap = nc;
	return 0;
}

/* Gather rows g_rows[at, at + n) of one table (F, b) into g_F/g_b[at, at + n) on the engine's
 * stream (rows already uploaded there). */
static int gather_launch(mfs_engine_t *e, const void *F, const float *b, size_t at, size_t n)
{
	struct cuda_impl *c = impl_of(e);
	const int k = e->model->k;
	if (!n)
		return 0;
	const size_t want = (n + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
	const unsigned blocks = (unsigned)(want < 4096 ? want : 4096);
	void *dF = (char *)c->g_F + at * (size_t)k * c->es;
	if (c->fp16)
		gather_rows_kernel<__half><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
			(const __half *)F, b, c->g_rows + at, n, k, (__half *)dF, c->g_b + at);
	else
		gather_rows_kernel<float><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
			(const float *)F, b, c->g_rows + at, n, k, (float *)dF, c->g_b + at);
	MFS_CUDA_LAUNCHED();
	return 0;
}

/* Rows [at, at + n) of the gathered copy, in pinned chunk st (factors, then biases), as fp32
 * into the capture's destinations: 1 + k floats per row, users' rows first, then items'. */
static void chunk_convert(const struct cuda_impl *c, const void *st, size_t at, size_t n, int k)
{
	const size_t w = 1 + (size_t)k;
	const float *hb = (const float *)((const char *)st + c->g_st_rows * (size_t)k * c->es);
	for (size_t x = 0; x < n; x++) {
		const size_t j = at + x;
		float *d = j < c->cap_nu ? c->cap_du + j * w : c->cap_di + (j - c->cap_nu) * w;
		d[0] = hb[x];
		if (c->fp16) {
			const __half *h = (const __half *)st + x * (size_t)k;
			for (int y = 0; y < k; y++)
				d[1 + y] = __half2float(h[y]);
		} else {
			memcpy(d + 1, (const float *)st + x * (size_t)k, (size_t)k * sizeof(float));
		}
	}
}

/* The gathered rows (g_F/g_b) back to the host through the two pinned chunks on stream s, one
 * chunk's copy in flight while the other is converted: the capture's rows, whatever their
 * number, with 2 x CAP_CHUNK_BYTES of pinned memory. */
static int copy_back(struct cuda_impl *c, cudaStream_t s, int k)
{
	const size_t n = c->cap_nu + c->cap_ni, per = c->g_st_rows;
	const size_t chunks = (n + per - 1) / per;
	const size_t rb = (size_t)k * c->es;
	for (size_t j = 0; j <= chunks; j++) {
		if (j < chunks) { /* chunk j into g_st[j & 1], whose last chunk was converted at j - 1 */
			const size_t at = j * per, cn = n - at < per ? n - at : per;
			char *st = (char *)c->g_st[j & 1];
			MFS_CUDA_TRY(cudaMemcpyAsync(st, (const char *)c->g_F + at * rb, cn * rb, cudaMemcpyDeviceToHost, s));
			MFS_CUDA_TRY(cudaMemcpyAsync(st + per * rb, c->g_b + at, cn * sizeof(float), cudaMemcpyDeviceToHost, s));
			MFS_CUDA_TRY(cudaEventRecord(c->g_st_ev[j & 1], s));
		}
		if (j > 0) { /* chunk j - 1 while chunk j copies */
			const size_t at = (j - 1) * per, cn = n - at < per ? n - at : per;
			MFS_CUDA_TRY(cudaEventSynchronize(c->g_st_ev[(j - 1) & 1]));
			chunk_convert(c, c->g_st[(j - 1) & 1], at, cn, k);
		}
	}
	return 0;
}

/* A snapshot's rows without the learner waiting for the copy: quiesce, gather both tables'
 * rows into g_F/g_b beside the running kernel (users first, then items) and return once the
 * gather has run (later batches change P and Q, not the gathered copy). cuda_capture_wait, on
 * the writer thread, copies them back and converts. */
int cuda_capture(mfs_engine_t *e, const uint32_t *ur, size_t nu, float *du, const uint32_t *ir, size_t ni,
                        float *di)
{
	struct cuda_impl *c = impl_of(e);
	const mfs_model_t *m = e->model;
	const int k = m->k;
	const size_t n = nu + ni;
	int rc;
	const double t0 = mfs_now_s();
	if ((rc = pk_quiesce(c)))
		return rc;
	const double t1 = mfs_now_s();
	int on_dev = 1;
	for (size_t j = 0; j < nu && on_dev; j++)
		on_dev = ur[j] < c->n_u;
	for (size_t j = 0; j < ni && on_dev; j++)
		on_dev = ir[j] < c->n_i;
	if (!on_dev) { /* rows grow has not given the device yet: the whole-table path, then copy */
		mfs_info("cuda", "msg=\"snapshot capture copies the whole tables\" rows=%zu", n);
		if ((rc = cuda_sync(e)))
			return rc;
		mfs_engine_copy_rows(m->bu, m->P, k, ur, nu, du);
		mfs_engine_copy_rows(m->bi, m->Q, k, ir, ni, di);
		return 0;
	}
	if (!n)
		return 0;
	if ((rc = gather_reserve(e, n)))
		return rc;
	const double t2 = mfs_now_s();
	if (!c->pk.beside && (rc = pk_stop(c)))
		return rc;
	if (nu)
		MFS_CUDA_TRY(cudaMemcpyAsync(c->g_rows, ur, nu * sizeof *ur, cudaMemcpyHostToDevice, c->stream));
	if (ni)
		MFS_CUDA_TRY(cudaMemcpyAsync(c->g_rows + nu, ir, ni * sizeof *ir, cudaMemcpyHostToDevice, c->stream));
	if ((rc = gather_launch(e, c->P, c->bu, 0, nu)) || (rc = gather_launch(e, c->Q, c->bi, nu, ni)))
		return rc;
	MFS_CUDA_TRY(cudaEventRecord(c->cap_gathered, c->stream));
	c->cap_du = du, c->cap_di = di, c->cap_nu = nu, c->cap_ni = ni;
	if (!c->pk.beside) {
		/* the kernel was stopped for the gather: copy back here too, before the next batch
		 * relaunches it, so the writer makes no CUDA wait beside the running kernel (where
		 * nothing may run beside it, under compute-sanitizer, such waits are what hung: see
		 * cuda_sync) */
		return copy_back(c, c->stream, k);
	}
	c->cap_pending = 1; /* from here on close and the next capture wait for the copy */
	rc = beside_wait(c, c->cap_gathered);
	const double t3 = mfs_now_s();
	if (t3 - t0 > 0.1) /* the learner waited: where (an operator sees it as snapshot age) */
		mfs_info("cuda", "msg=\"slow snapshot capture\" rows=%zu seconds=%.3f drain_s=%.3f reserve_s=%.3f gather_s=%.3f",
		         n, t3 - t0, t1 - t0, t2 - t1, t3 - t2);
	return rc;
}

int cuda_capture_wait(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	if (!c || !c->cap_pending)
		return 0;
	c->cap_pending = 0;
	MFS_CUDA_TRY(cudaSetDevice(c->dev)); /* the writer thread's first CUDA call */
	MFS_CUDA_TRY(cudaStreamWaitEvent(c->cap_stream, c->cap_gathered, 0));
	return copy_back(c, c->cap_stream, e->model->k);
}

/* ---- rows given to new ids (mfs_engine_reset_rows) ------------------------------------- */

/* scatter_rows_kernel: F row rows[j] = in row j (k elements), b[rows[j]] = bin[j]; the mirror
 * of gather_rows_kernel (same launch shape). Stores go to L2 (__stcg): the persistent kernel
 * reads rows there. Bytes per row: 4 (index) + k sizeof(T) read and written + 8 (bias). */
template <typename T>
__global__ void scatter_rows_kernel(T *F, float *b, const uint32_t *__restrict__ rows, size_t n, int k,
                                    const T *__restrict__ in, const float *__restrict__ bin)
{
	const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
	const size_t warps = (gridDim.x * (size_t)blockDim.x) >> 5;
	const int lane = threadIdx.x & 31;
	for (size_t j = warp; j < n; j += warps) {
		const size_t r = __ldg(rows + j);
		for (int x = lane; x < k; x += 32)
			F[r * (size_t)k + x] = in[j * (size_t)k + x];
		if (lane == 0)
			__stcg(b + r, __ldg(bin + j));
	}
}

void reset_free(struct cuda_impl *c)
{
	cudaFree(c->r_rows);
	cudaFree(c->r_F);
	cudaFree(c->r_b);
	free(c->r_hF);
	if (c->r_done)
		cudaEventDestroy(c->r_done);
	c->r_rows = NULL, c->r_F = c->r_hF = NULL, c->r_b = NULL, c->r_cap = 0, c->r_done = NULL;
}

static int reset_reserve(struct cuda_impl *c, size_t n, int k)
{
	int rc;
	if (n <= c->r_cap)
		return 0;
	if ((rc = pk_stop(c))) /* cudaFree synchronizes the device: not beside the running kernel */
		return rc;
	size_t nc = c->r_cap ? c->r_cap : 4096;
	while (nc < n)
		nc *= 2;
	cudaFree(c->r_rows);
	cudaFree(c->r_F);
	cudaFree(c->r_b);
	free(c->r_hF);
	c->r_rows = NULL, c->r_F = c->r_hF = NULL, c->r_b = NULL, c->r_cap = 0;
	if (!(c->r_hF = malloc(nc * (size_t)k * c->es + nc * sizeof(float))))
		return ENOMEM;
	MFS_CUDA_TRY(cudaMalloc(&c->r_rows, nc * sizeof *c->r_rows));
	MFS_CUDA_TRY(cudaMalloc(&c->r_F, nc * (size_t)k * c->es));
	MFS_CUDA_TRY(cudaMalloc(&c->r_b, nc * sizeof(float)));
	c->r_cap = nc;
	return 0;
}

/* Rows below the device's row count that the host gave to new ids: where a batch in the ring
 * may name a row's last id (in_flight), every published batch consumed first; then the host's
 * fresh values uploaded and scattered on the engine's stream, beside the running kernel where
 * it leaves room (else it is stopped and the next batch relaunches it). Without in_flight the
 * kernel goes on with the batches it holds meanwhile: none names these rows (eviction picks
 * rows whose batches were applied, model_store/life.h), and no batch naming them is published
 * before this returns. Rows the device does not have yet reach it with grow. Returns with the
 * rows written. */
int cuda_reset_rows(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, int in_flight)
{
	struct cuda_impl *c = impl_of(e);
	const mfs_model_t *m = e->model;
	const int k = m->k;
	const uint32_t have = ent ? c->n_i : c->n_u;
	const float *hb = ent ? m->bi : m->bu, *hF = ent ? m->Q : m->P;
	int rc;
	if ((in_flight && (rc = pk_quiesce(c))) || (rc = reset_reserve(c, n, k)))
		return rc;
	/* pack the rows the device has (values converted to its storage type), biases after them */
	size_t cnt = 0;
	char *vals = (char *)c->r_hF;
	float *bias = (float *)(vals + c->r_cap * (size_t)k * c->es);
	uint32_t *idx = (uint32_t *)malloc(n * sizeof *idx);
	if (!idx)
		return ENOMEM;
	for (size_t j = 0; j < n; j++) {
		const uint32_t r = rows[j];
		if (r >= have)
			continue;
		const float *src = hF + (size_t)r * (size_t)k;
		if (c->fp16) {
			__half *d = (__half *)vals + cnt * (size_t)k;
			for (int x = 0; x < k; x++)
				d[x] = __float2half_rn(src[x]);
		} else {
			memcpy((float *)vals + cnt * (size_t)k, src, (size_t)k * sizeof(float));
		}
		bias[cnt] = hb[r];
		idx[cnt++] = r;
	}
	if (!cnt) {
		free(idx);
		return 0;
	}
	if (!c->pk.beside && (rc = pk_stop(c))) {
		free(idx);
		return rc;
	}
	/* pageable sources: each copy is staged before the call returns, so idx may go after */
	cudaError_t err = cudaMemcpyAsync(c->r_rows, idx, cnt * sizeof *idx, cudaMemcpyHostToDevice, c->stream);
	if (err == cudaSuccess)
		err = cudaMemcpyAsync(c->r_F, vals, cnt * (size_t)k * c->es, cudaMemcpyHostToDevice, c->stream);
	if (err == cudaSuccess)
		err = cudaMemcpyAsync(c->r_b, bias, cnt * sizeof(float), cudaMemcpyHostToDevice, c->stream);
	free(idx);
	MFS_CUDA_TRY(err);
	const size_t want = (cnt + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
	const unsigned blocks = (unsigned)(want < 4096 ? want : 4096);
	void *F = ent ? c->Q : c->P;
	float *b = ent ? c->bi : c->bu;
	if (c->fp16)
		scatter_rows_kernel<__half><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
			(__half *)F, b, c->r_rows, cnt, k, (const __half *)c->r_F, c->r_b);
	else
		scatter_rows_kernel<float><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
			(float *)F, b, c->r_rows, cnt, k, (const float *)c->r_F, c->r_b);
	MFS_CUDA_LAUNCHED();
	if (ent && c->items_base) { /* fresh rows: the base of the next merge too (merge.cu) */
		if (c->fp16)
			scatter_rows_kernel<__half><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
				(__half *)c->Q0, c->b0, c->r_rows, cnt, k, (const __half *)c->r_F, c->r_b);
		else
			scatter_rows_kernel<float><<<blocks, 32 * WARPS_PER_BLOCK, 0, c->stream>>>(
				(float *)c->Q0, c->b0, c->r_rows, cnt, k, (const float *)c->r_F, c->r_b);
		MFS_CUDA_LAUNCHED();
	}
	MFS_CUDA_TRY(cudaEventRecord(c->r_done, c->stream));
	return beside_wait(c, c->r_done);
}

/* The kernels gather_launch and cuda_reset_rows launch, for pk_open's load of the kernels
 * beside the ring. */
const void *gather_rows_fn(int fp16)
{
	return fp16 ? (const void *)gather_rows_kernel<__half> : (const void *)gather_rows_kernel<float>;
}

const void *scatter_rows_fn(int fp16)
{
	return fp16 ? (const void *)scatter_rows_kernel<__half> : (const void *)scatter_rows_kernel<float>;
}
