/* ring_feed.cu - benchmarks only: one epoch of resident ratings through the CUDA engine's
 * streaming path, the persistent kernel's device ring, in pieces of `batch` ratings. Each
 * piece's slot descriptor points into the device-resident set and carries the set's per-row
 * modes, so the kernel does what one launch over the set (sgd_launch) would, fed from the
 * ring and with no host copies: bench_gpu_sgd --variants ring,ringfull measures the one
 * against the other on the same data. Calls the ring's own publish path (gpu/cuda/ring.cu).
 */
#include <cuda_runtime.h>

#include "bench/bench_cuda.h"
#include "gpu/cuda/cuda_int.h"
#include "gpu/cuda/step.cuh" /* mfs_coin_salt */

#ifndef MFS_HAVE_CUDA /* engine_int.h declares mfs_engine_cuda_i only then (bench/CMakeLists.txt) */
#error "bench/ring_feed.cu is built only with the CUDA engine (MFS_HAVE_CUDA)"
#endif

/* Applied when it returns (the ring is quiesced); without the ring (engine.persistent=0 or
 * deterministic) one launch over the set. Other engines are the caller's (bench_gpu_sgd.c:
 * mfs_engine_sgd_epoch). */
extern "C" int bench_cuda_ring_epoch(mfs_engine_t *e, mfs_resident_t *set, uint64_t epoch, size_t batch)
{
	if (!e || !set || !batch || e->iface != &mfs_engine_cuda_i)
		return MFS_EINVAL;
	struct cuda_impl *c = impl_of(e);
	const struct dev_set *d = (const struct dev_set *)set;
	int rc;
	if (!c->pk.on)
		return sgd_launch(e, d, mfs_coin_salt(epoch), 1.0f, 1);
	for (size_t off = 0; off < d->n; off += batch) {
		const size_t n = d->n - off < batch ? d->n - off : batch;
		uint32_t s;
		if ((rc = pk_slot(e, &s)))
			return rc;
		struct pk_hdr *hd = &c->pk.h_hdr[s];
		hd->u = d->u + off;
		hd->i = d->i + off;
		hd->r = d->r + off;
		hd->mr_u = hd->mr_i = NULL;
		hd->md_u = d->su;
		hd->md_i = d->si;
		hd->du = d->du;
		hd->di = d->di;
		if ((rc = pk_publish(e, s, n, 1.0f)))
			return rc;
	}
	if ((rc = pk_quiesce(c)))
		return rc;
	e->model->events_applied += d->n;
	return 0;
}
