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
#ifdef __cplusplus
}
#endif
#endif
