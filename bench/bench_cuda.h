/* bench_cuda.h - the benchmarks' CUDA helpers (bench/dev_copy.cu, bench/ring_feed.cu), built
 * into the bench targets only where the CUDA engine is (MFS_HAVE_CUDA). */
#ifndef MFS_BENCH_CUDA_H
#define MFS_BENCH_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/engine.h"

#ifdef __cplusplus
extern "C" {
#endif
/** Device-to-device copy bandwidth (bytes read + written per second / 1e9), best of reps.
 *  @return 0, MFS_EGPU. */
int bench_cuda_copy_gbps(int device, size_t bytes, int reps, double *gbps);
/** Copy bandwidth from device src to device dst (GB/s of bytes moved; both: the two directions at
 *  once, counted together), best of reps; *peer: 1 when peer access is on for the pair.
 *  @return 0, MFS_EGPU. */
int bench_cuda_peer_gbps(int src, int dst, size_t bytes, int reps, int both, int *peer, double *gbps);
/** One epoch of resident ratings s through the CUDA engine's persistent-kernel ring in pieces
 *  of `batch` ratings, applied when it returns (a CUDA engine without the ring: one launch
 *  over the set). The same call on another engine is its mfs_engine_sgd_epoch.
 *  @return 0, MFS_EINVAL (NULL engine or set, batch 0, not a CUDA engine), MFS_EGPU. */
int bench_cuda_ring_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch, size_t batch);
#ifdef __cplusplus
}
#endif
#endif
