/* cuda_probe.cu - does a CUDA device answer? Used by mfs_engine_open(AUTO) and GPU tests.
 * Every CUDA call is checked; "no device" and "no driver" both mean "not available". */
#include <cuda_runtime.h>
#include <stdio.h>

#include "gpu/cuda/cuda_probe.h"

extern "C" int mfs_cuda_probe(int device, char *name, size_t name_size)
{
	int n = 0;
	cudaError_t err = cudaGetDeviceCount(&n);
	if (err != cudaSuccess) {
		(void)cudaGetLastError(); /* clear the sticky-less error so later calls start clean */
		if (name && name_size)
			snprintf(name, name_size, "%s", cudaGetErrorString(err));
		return 0;
	}
	if (device < 0 || device >= n) {
		if (name && name_size)
			snprintf(name, name_size, "device %d not present (%d found)", device, n);
		return 0;
	}
	cudaDeviceProp prop;
	err = cudaGetDeviceProperties(&prop, device);
	if (err != cudaSuccess) {
		if (name && name_size)
			snprintf(name, name_size, "%s", cudaGetErrorString(err));
		return 0;
	}
	if (name && name_size)
		snprintf(name, name_size, "%s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major, prop.minor,
		         prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024));
	return n;
}
