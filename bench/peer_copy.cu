/* peer_copy.cu - benchmarks only: GPU-to-GPU copy bandwidth between every pair of devices of the
 * host (NVLink or PCIe, with peer access where the pair allows it), one direction and both at
 * once; the ceiling of what a model sharded over GPUs can exchange (docs/SCALE_OUT.md). */
#include <cuda_runtime.h>

#include "bench/bench_cuda.h"
#include "gpu/cuda/cuda_try.h"

extern "C" int bench_cuda_peer_gbps(int src, int dst, size_t bytes, int reps, int both, int *peer, double *gbps)
{
	void *a[2] = {NULL, NULL}, *b[2] = {NULL, NULL};
	cudaStream_t s[2] = {NULL, NULL};
	cudaEvent_t t0 = NULL, t1 = NULL, done = NULL;
	const int dev[2] = {src, dst};
	int can = 0;
	MFS_CUDA_TRY(cudaDeviceCanAccessPeer(&can, src, dst));
	*peer = can;
	for (int x = 0; x < 2; x++) {
		MFS_CUDA_TRY(cudaSetDevice(dev[x]));
		if (can) {
			cudaError_t e = cudaDeviceEnablePeerAccess(dev[1 - x], 0);
			if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
				MFS_CUDA_TRY(e);
			(void)cudaGetLastError();
		}
		MFS_CUDA_TRY(cudaMalloc(&a[x], bytes));
		MFS_CUDA_TRY(cudaMalloc(&b[x], bytes));
		MFS_CUDA_TRY(cudaMemset(a[x], 1, bytes));
		MFS_CUDA_TRY(cudaStreamCreate(&s[x]));
	}
	MFS_CUDA_TRY(cudaSetDevice(dst)); /* an event is recorded on a stream of its own device */
	MFS_CUDA_TRY(cudaEventCreate(&done));
	MFS_CUDA_TRY(cudaSetDevice(src));
	MFS_CUDA_TRY(cudaEventCreate(&t0));
	MFS_CUDA_TRY(cudaEventCreate(&t1));
	float best_ms = 1e30f;
	for (int r = 0; r <= reps; r++) { /* r = 0: warm-up */
		for (int x = 0; x < 2; x++) {
			MFS_CUDA_TRY(cudaSetDevice(dev[x]));
			MFS_CUDA_TRY(cudaDeviceSynchronize());
		}
		MFS_CUDA_TRY(cudaSetDevice(src));
		MFS_CUDA_TRY(cudaEventRecord(t0, s[0]));
		MFS_CUDA_TRY(cudaMemcpyPeerAsync(b[1], dst, a[0], src, bytes, s[0]));
		if (both) { /* the other way on the other device's stream, started after t0 */
			MFS_CUDA_TRY(cudaStreamWaitEvent(s[1], t0, 0));
			MFS_CUDA_TRY(cudaMemcpyPeerAsync(b[0], src, a[1], dst, bytes, s[1]));
			MFS_CUDA_TRY(cudaEventRecord(done, s[1]));
			MFS_CUDA_TRY(cudaStreamWaitEvent(s[0], done, 0));
		}
		MFS_CUDA_TRY(cudaEventRecord(t1, s[0]));
		MFS_CUDA_TRY(cudaEventSynchronize(t1));
		float ms;
		MFS_CUDA_TRY(cudaEventElapsedTime(&ms, t0, t1));
		if (r && ms < best_ms)
			best_ms = ms;
	}
	*gbps = (both ? 2.0 : 1.0) * (double)bytes / (best_ms * 1e-3) / 1e9;
	for (int x = 0; x < 2; x++) {
		cudaSetDevice(dev[x]);
		cudaFree(a[x]);
		cudaFree(b[x]);
		cudaStreamDestroy(s[x]);
	}
	cudaEventDestroy(t0);
	cudaEventDestroy(t1);
	cudaEventDestroy(done);
	return 0;
}
