/* dev_copy.cu - benchmarks only: the memory-bandwidth ceiling, a large device-to-device copy
 * timed with events, counting bytes read plus bytes written (the roofline of docs/BENCHMARKS.md). */
#include <cuda_runtime.h>

#include "bench/bench_cuda.h"
#include "gpu/cuda/cuda_try.h"

extern "C" int bench_cuda_copy_gbps(int device, size_t bytes, int reps, double *gbps)
{
	void *a = NULL, *b = NULL;
	cudaEvent_t t0 = NULL, t1 = NULL;
	MFS_CUDA_TRY(cudaSetDevice(device));
	MFS_CUDA_TRY(cudaMalloc(&a, bytes));
	MFS_CUDA_TRY(cudaMalloc(&b, bytes));
	MFS_CUDA_TRY(cudaMemset(a, 1, bytes));
	MFS_CUDA_TRY(cudaEventCreate(&t0));
	MFS_CUDA_TRY(cudaEventCreate(&t1));
	MFS_CUDA_TRY(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); /* warm-up */
	float best_ms = 1e30f;
	for (int r = 0; r < reps; r++) {
		MFS_CUDA_TRY(cudaEventRecord(t0));
		MFS_CUDA_TRY(cudaMemcpy(r & 1 ? a : b, r & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice));
		MFS_CUDA_TRY(cudaEventRecord(t1));
		MFS_CUDA_TRY(cudaEventSynchronize(t1));
		float ms;
		MFS_CUDA_TRY(cudaEventElapsedTime(&ms, t0, t1));
		if (ms < best_ms)
			best_ms = ms;
	}
	*gbps = 2.0 * (double)bytes / (best_ms * 1e-3) / 1e9;
	cudaEventDestroy(t0);
	cudaEventDestroy(t1);
	cudaFree(a);
	cudaFree(b);
	return 0;
}
