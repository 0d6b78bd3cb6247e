/* init.cu - new rows' initial values drawn on the device (mfs_engine_take_new_rows): the
 * formula of mfs_model_init_row (model_store/model.c) - the row's seed (mfs_row_seed), float
 * Box-Muller pairs (mfs_rng_normal2f) times init_scale / sqrt(k) - and a zero bias, so a stream
 * of new ids costs the host no Box-Muller, no fresh host pages and no upload. The uniform draws
 * are the host's bit for bit; logf, sqrtf, cosf and sinf are CUDA's, a few ulp from glibc's
 * (test_cuda_persistent test_device_init compares).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/rng.h"
#include "gpu/cuda/cuda_int.h"
#include "gpu/cuda/step.cuh"

/* One thread per row (a row is k / 2 draws in sequence from its own generator). */
template <typename T>
__global__ void init_rows_kernel(T *F, float *b, size_t a, size_t n, int k, uint64_t seed, int ent, float sd)
{
	const size_t step = (size_t)gridDim.x * blockDim.x;
	for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += step) {
		const size_t row = a + j;
		mfs_rng_t r;
		mfs_rng_seed(&r, mfs_row_seed(seed, ent, (uint32_t)row, 0));
		T *out = F + row * (size_t)k;
		for (int x = 0; x < k; x += 2) {
			float z0, z1;
			mfs_rng_normal2f(&r, &z0, &z1);
			stor<T>::st(out + x, sd * z0);
			if (x + 1 < k)
				stor<T>::st(out + x + 1, sd * z1);
		}
		b[row] = 0.0f;
	}
}

int init_rows_launch(struct cuda_impl *c, const mfs_model_t *m, int ent, size_t a, size_t n, cudaStream_t s)
{
	if (!n)
		return 0;
	const float sd = (float)(m->init_scale / sqrt((double)m->k));
	const unsigned threads = 128;
	const size_t want = (n + threads - 1) / threads, full = (size_t)c->sms * 16;
	const unsigned blocks = (unsigned)(want < full ? want : full);
	void *F = ent ? c->Q : c->P;
	float *b = ent ? c->bi : c->bu;
	if (c->fp16)
		init_rows_kernel<__half><<<blocks, threads, 0, s>>>((__half *)F, b, a, n, m->k, m->seed, ent, sd);
	else
		init_rows_kernel<float><<<blocks, threads, 0, s>>>((float *)F, b, a, n, m->k, m->seed, ent, sd);
	MFS_CUDA_TRY(cudaGetLastError());
	return 0;
}

/* The kernel init_rows_launch launches, for pk_open's load of the kernels beside the ring. */
const void *init_rows_fn(int fp16)
{
	return fp16 ? (const void *)init_rows_kernel<__half> : (const void *)init_rows_kernel<float>;
}
