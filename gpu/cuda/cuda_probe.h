/* cuda_probe.h - C view of the CUDA device probe. */
#ifndef MFS_CUDA_PROBE_H
#define MFS_CUDA_PROBE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
/** Number of CUDA devices if `device` exists and answers, else 0; name gets its description
 *  or the reason it is unavailable. */
int mfs_cuda_probe(int device, char *name, size_t name_size);
/** Device-to-device copy bandwidth (bytes read + written per second / 1e9), best of reps. */
int mfs_cuda_copy_gbps(int device, size_t bytes, int reps, double *gbps);
#ifdef __cplusplus
}
#endif
#endif
