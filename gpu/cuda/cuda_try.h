/* cuda_try.h - check every CUDA call and launch (house style: MFS_CUDA_TRY returns MFS_EGPU). */
#ifndef MFS_CUDA_TRY_H
#define MFS_CUDA_TRY_H

#include <cuda_runtime.h>

#include "common/err.h"
#include "common/log.h"

#define MFS_CUDA_TRY(x)                                                                              \
	do {                                                                                             \
		cudaError_t mfs_cuda_err_ = (x);                                                             \
		if (mfs_cuda_err_ != cudaSuccess) {                                                          \
			mfs_error("cuda", "msg=\"%s\" call=\"%s\" func=%s file=%s line=%d",                       \
			          cudaGetErrorString(mfs_cuda_err_), #x, __func__, __FILE__, __LINE__);           \
			return MFS_EGPU;                                                                         \
		}                                                                                            \
	} while (0)

/* after every launch: launch errors now, execution errors at the next sync */
#define MFS_CUDA_LAUNCHED() MFS_CUDA_TRY(cudaGetLastError())

#endif
