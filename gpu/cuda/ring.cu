/* ring.cu - streaming batches through a device ring that one persistent kernel consumes
 * (engine.persistent): the kernel (sgd_persistent_kernel: a scheduler that finds the next chunk,
 * then the batch kernel's hog_step), and the host side: open, launch with a residency check,
 * submit and publish slots, poll, quiesce, stop.
 *
 * DESIGN: one engine thread publishes (pk_submit, pk_slot + pk_publish); the kernel consumes
 * on its own stream (pk.run); copies go on pk.copy, whose order puts a slot's data in device
 * memory before its sequence number. The host reads the tables, grows them or allocates only
 * after pk_quiesce (every published slot consumed) or pk_stop (the kernel returned).
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/timeutil.h"
#include "gpu/cuda/cuda_int.h"
#include "gpu/cuda/step.cuh"

/* ---- the persistent kernel and its device ring (streaming batches) -------------------------
 * The host publishes batches into S slots of device memory (pk_submit); one kernel launched
 * once (SMs x occupancy, less room for the loss and gather kernels) claims and applies them.
 *
 * Work is cut in chunks of PK_CHUNK ratings numbered across the whole stream. Slot q (the
 * q-th batch, in slot q % S) covers chunks [first, first + nchunks). A warp takes the next
 * chunk number t from one global ticket counter (never reset while the kernel runs), walks
 * its own slot cursor forward to the slot holding t (waiting if it is not published yet) and
 * applies the chunk with the same hog_step as the batch kernel. Why a ticket and not a claim
 * counter per slot: a late warp could otherwise claim from a slot already reused.
 *
 * Publish (host, copy stream, in order): the slot's ratings (and per-rating hot-row modes),
 * seq[s] = 0 (rewrite mark), its header, then seq[s] = q + 1 (a seqlock: a warp re-reads seq
 * after the header and retries if it moved). Stream order puts the data in device memory before seq;
 * the kernel reads seq with a volatile load, fences, then reads header and ratings through
 * L2 (__ldcg: L1 is not coherent and the slot is rewritten; the header into the warp's
 * shared-memory copy, see pk_cap). seq[s] > q + 1 means slot q
 * was consumed and reused, so chunk t lies beyond it; seq[s] < q + 1: not published yet.
 *
 * Completion: after its chunk a warp fences and counts it in done[s]; the warp that counts
 * the last chunk resets done[s], waits until the slots before it are consumed (consumed ==
 * q), and sets consumed = q + 1 in device memory and in mapped host memory (system fence).
 * The host reuses a slot, its staging buffer and the model (snapshots, growth) only after
 * `consumed` passed it: that is the quiesce handshake. Stop: the host sets *stop when
 * everything is consumed; warps waiting for a slot see it and return. */
#define PK_CHUNK 256 /* ratings per ticket */

struct pk_dev {
	const pk_hdr *hdr;
	const unsigned long long *seq;
	unsigned int *done;
	unsigned long long *ticket, *consumed;
	unsigned long long *consumed_host; /* mapped pinned host memory */
	unsigned int *resident;             /* blocks started (device) */
	unsigned long long *resident_host;  /* = gridDim.x once all have (mapped pinned) */
	const unsigned int *stop;
	uint32_t S, cap;
};

/* The register cap of the persistent kernel: the resident blocks per SM the batch kernel gets
 * for the same row shape (V 16-byte vectors per lane). Uncapped, the slot bookkeeping costs
 * the kernel registers, hence blocks per SM, and the ring falls behind one launch over the
 * same ratings; at the cap a few bytes spill at some k, which cost less than the occupancy
 * they buy (measured at fp16 k=128; other shapes follow the same rule). Registers, spills and
 * the variants measured: docs/BENCHMARKS.md, "Engine history" and the ring's section. */
template <typename T, int K> struct pk_cap {
	static constexpr int V = hog_shape<T, K>::V;
	static constexpr int value = V == 1 ? (sizeof(T) == 2 ? 6 : 5) : V <= 3 ? 4 : V <= 5 ? 3 : 2;
};

/* sgd_persistent_kernel: the Hogwild! update of sgd_hogwild_kernel (hog_step, the same math,
 * row modes and coins) applied to the ratings the host publishes into the ring, chunk by chunk.
 * Launch (pk_launch): once, on its own stream, pk.grid blocks of 8 warps (SMs x (occupancy less
 * the loss kernel's room), or SMs x occupancy with the whole GPU) at most pk_cap blocks per SM;
 * it returns when told to stop. A group of L lanes takes one rating, as in the batch kernel.
 * Bytes per update: those of the batch kernel (16k + 28 in fp32, 8k + 28 in fp16), plus 8
 * (per-rating modes) where a batch has hot rows, plus the slot header (88 B) and the ticket,
 * sequence and done counters once per chunk of PK_CHUNK ratings. */
template <typename T, int K>
__global__ void __launch_bounds__(32 * WARPS_PER_BLOCK, (pk_cap<T, K>::value))
	sgd_persistent_kernel(pk_dev a, T *P, T *Q, float *bu, float *bi, const mfs_hparams_t *hp,
	                      unsigned long long *skipped, unsigned long long q0)
{
	using S = hog_shape<T, K>;
	constexpr int L = S::L, G = S::G;
	const int lane = threadIdx.x & 31, sub = lane % L, grp = lane / L;
	/* the warp's slot header, in shared memory: the chunk loop reads it from there (volatile,
	 * so no register copies), which keeps ~20 registers of pointers out of the loop */
	__shared__ pk_hdr sh[WARPS_PER_BLOCK];
	volatile pk_hdr *my = sh + (threadIdx.x >> 5);
	static_assert(sizeof(pk_hdr) % 4 == 0 && sizeof(pk_hdr) / 4 <= 32, "a header is one word per lane");
	if (threadIdx.x == 0) { /* residency (pk_launch): the last block to start tells the host */
		const unsigned int started = atomicAdd(a.resident, 1u) + 1u;
		if (started == gridDim.x) {
			*(volatile unsigned long long *)a.resident_host = started;
			__threadfence_system();
		}
	}
	unsigned long long q = q0; /* this warp's slot cursor */
	for (;;) {
		unsigned long long t = 0;
		if (lane == 0)
			t = atomicAdd(a.ticket, 1ull);
		t = __shfl_sync(0xffffffffu, t, 0);
		/* find the slot holding chunk t */
		uint32_t s, nchunks, n;
		unsigned long long first;
		for (;;) {
			s = (uint32_t)(q % a.S);
			const volatile unsigned long long *vs = a.seq + s;
			const unsigned long long v = *vs;
			if (v == q + 1) {
				__threadfence();
				/* every lane has read the header this warp held before (else a lane running
				 * ahead overwrites it under a slower one: a write-after-read race) */
				__syncwarp();
				if (lane < (int)(sizeof(pk_hdr) / 4))
					((volatile uint32_t *)my)[lane] = __ldcg((const unsigned int *)(a.hdr + s) + lane);
				__syncwarp();
				first = my->first;
				nchunks = my->nchunks;
				n = my->n;
				__threadfence();
				if (*vs != v)
					continue; /* reused while we read it (a warp stalled a whole ring cycle) */
				if (t < first + nchunks)
					break;
				q++;
			} else if (v > q + 1) {
				q++; /* consumed and reused: t lies beyond it */
			} else {
				if (*(volatile const unsigned int *)a.stop)
					return;
				__nanosleep(256);
			}
		}
		hog_coef co;
		co.load(hp, my->lr_scale); /* per chunk: a new learning rate applies from the next chunk on */
		const size_t beg = (size_t)(t - first) * PK_CHUNK;
		const size_t end = beg + PK_CHUNK < n ? beg + PK_CHUNK : n;
		for (size_t x0 = beg; x0 < end; x0 += G) {
			const size_t x = x0 + grp;
			const bool in = x < end;
			uint32_t u = MFS_ROW_NONE, i = MFS_ROW_NONE;
			float r = 0.f, cu = 1.f, ci = 1.f;
			if (in) {
				u = __ldcg(my->u + x), i = __ldcg(my->i + x), r = __ldcg(my->r + x);
				if (u != MFS_ROW_NONE && i != MFS_ROW_NONE) {
					const float *ru = my->mr_u, *rw = my->md_u, *ri = my->mr_i, *rj = my->md_i;
					cu = ru ? __ldcg(ru + x) : rw ? __ldg(rw + u) : my->du;
					ci = ri ? __ldcg(ri + x) : rj ? __ldg(rj + i) : my->di;
				}
			}
			const bool live = in && u != MFS_ROW_NONE && i != MFS_ROW_NONE;
			hog_step<T, K>(live, u, i, r, (size_t)first * PK_CHUNK + x, my->salt, cu, ci, sub, P, Q, bu, bi, my->mu,
			               co, skipped);
		}
		__syncwarp();
		if (lane == 0) {
			__threadfence(); /* this chunk's updates before its count */
			const unsigned int d = atomicAdd(a.done + s, 1u) + 1u;
			if (d == nchunks) { /* the last chunk of slot q */
				a.done[s] = 0;
				while (*(volatile unsigned long long *)a.consumed != q)
					__nanosleep(64);
				__threadfence();
				*(volatile unsigned long long *)a.consumed = q + 1;
				__threadfence_system();
				*(volatile unsigned long long *)a.consumed_host = q + 1;
				__threadfence_system();
			}
		}
		__syncwarp();
	}
}

/* ---- the persistent kernel: host side ------------------------------------------------------ */
#define PK_SLOTS 8
#define PK_SLOT_RATINGS (1u << 18) /* 256 Ki ratings (3 MiB, 5 with row modes) per slot */

template <typename T>
using pk_fn = void (*)(pk_dev, T *, T *, float *, float *, const mfs_hparams_t *, unsigned long long *,
                       unsigned long long);

template <typename T> static pk_fn<T> pk_kernel(int k)
{
	switch (k) {
#define PK_CASE(K)                                                                                               \
	case K:                                                                                                      \
		return sgd_persistent_kernel<T, K>;
		PK_CASE(32) PK_CASE(64) PK_CASE(96) PK_CASE(128) PK_CASE(160) PK_CASE(192) PK_CASE(224) PK_CASE(256)
#undef PK_CASE
	}
	return NULL;
}

uint64_t pk_consumed(const struct cuda_impl *c)
{
	return __atomic_load_n(c->pk.h_consumed, __ATOMIC_ACQUIRE);
}

/* The kernel must still be running: it returns only when told to stop. */
static int pk_alive(struct cuda_impl *c)
{
	cudaError_t err = cudaStreamQuery(c->pk.run);
	if (err == cudaErrorNotReady)
		return 0;
	if (err == cudaSuccess) {
		mfs_error("cuda", "msg=\"persistent kernel exited without being stopped\"");
		c->pk.running = 0;
		return MFS_EGPU;
	}
	MFS_CUDA_TRY(err);
	return 0;
}

/* Poll a word of mapped host memory the kernel writes until it reaches want, checking every
 * few thousand polls that the kernel is alive. limit_s > 0: give up after that long and set
 * *late. A wait without a limit that lasts PK_STALL_S says so once (a kernel that stopped
 * consuming is otherwise a silent hang). */
#define PK_STALL_S 10.0
static int pk_poll(struct cuda_impl *c, const unsigned long long *word, uint64_t want, double limit_s, int *late)
{
	const double t0 = mfs_now_s();
	int said = 0;
	for (unsigned spins = 0; __atomic_load_n(word, __ATOMIC_ACQUIRE) < want; spins++) {
		if ((spins & 4095) == 4095) {
			int rc = pk_alive(c);
			if (rc)
				return rc;
			const double waited = mfs_now_s() - t0;
			if (limit_s > 0 && waited > limit_s) {
				*late = 1;
				return 0;
			}
			if (limit_s <= 0 && !said && waited > PK_STALL_S) {
				said = 1;
				mfs_warn("cuda", "msg=\"persistent kernel made no progress\" waited_s=%.0f want=%llu at=%llu "
				                 "published=%llu resident=%llu blocks=%d beside=%d",
				         waited, (unsigned long long)want, __atomic_load_n(word, __ATOMIC_ACQUIRE),
				         (unsigned long long)c->pk.published,
				         __atomic_load_n(&c->pk.h_consumed[1], __ATOMIC_ACQUIRE), c->pk.grid, c->pk.beside);
			}
		}
		if (spins > 64) {
			struct timespec ts = {0, 2000};
			nanosleep(&ts, NULL);
		}
	}
	return 0;
}

/* Wait until the kernel consumed slots [0, upto). */
static int pk_wait(struct cuda_impl *c, uint64_t upto)
{
	return pk_poll(c, c->pk.h_consumed, upto, 0, NULL);
}

int pk_quiesce(struct cuda_impl *c)
{
	return c->pk.running ? pk_wait(c, c->pk.published) : 0;
}

/* Loss and gather kernels fit beside the persistent kernel only if its whole grid is
 * resident: the grid is sized from the occupancy of the plain kernel on every SM. Under
 * compute-sanitizer (instrumented code is larger) or MPS (a client gets part of the SMs) some
 * blocks wait for others that never retire, and a loss kernel queued behind them would wait
 * forever. So after each launch that relies on it, wait (PK_RESIDENT_MS at most) for every
 * block to have started; if they do not, loss and gather calls stop the kernel from then on. */
#define PK_RESIDENT_MS 2000
static int pk_check_resident(struct cuda_impl *c)
{
	struct pk_host *h = &c->pk;
	int late = 0;
	int rc = pk_poll(c, &h->h_consumed[1], (uint64_t)h->grid, PK_RESIDENT_MS / 1e3, &late);
	if (!rc && late) {
		mfs_warn("cuda", "msg=\"persistent kernel not wholly resident: loss and gather kernels stop it from now on\" "
		                 "blocks=%d waited_ms=%d",
		         h->grid, PK_RESIDENT_MS);
		h->beside = 0;
	}
	return rc;
}

static int pk_launch(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	/* every chunk below next_chunk was applied: the tickets restart there */
	*h->h_ticket = h->next_chunk;
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_ticket, h->h_ticket, sizeof *h->h_ticket, cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_stop, &h->h_flag[0], sizeof(unsigned int), cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_resident, 0, sizeof *h->d_resident, h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->copy));
	__atomic_store_n(&h->h_consumed[1], 0ull, __ATOMIC_RELEASE);
	pk_dev a;
	a.hdr = h->d_hdr;
	a.seq = h->d_seq;
	a.done = h->d_done;
	a.ticket = h->d_ticket;
	a.consumed = h->d_consumed;
	a.consumed_host = h->hd_consumed;
	a.resident = h->d_resident;
	a.resident_host = h->hd_consumed + 1;
	a.stop = h->d_stop;
	a.S = h->S;
	a.cap = h->cap;
	const int k = e->model->k;
	if (c->fp16)
		pk_kernel<__half>(k)<<<h->grid, 32 * WARPS_PER_BLOCK, 0, h->run>>>(
			a, (__half *)c->P, (__half *)c->Q, c->bu, c->bi, c->d_hp, c->d_skipped, h->published);
	else
		pk_kernel<float>(k)<<<h->grid, 32 * WARPS_PER_BLOCK, 0, h->run>>>(
			a, (float *)c->P, (float *)c->Q, c->bu, c->bi, c->d_hp, c->d_skipped, h->published);
	MFS_CUDA_LAUNCHED();
	h->running = 1;
	return h->beside ? pk_check_resident(c) : 0;
}

/* Quiesce, then tell the kernel to return and wait for it. Growth of the tables, sets and any
 * allocation happen only while it is stopped (cudaFree synchronizes the device). */
int pk_stop(struct cuda_impl *c)
{
	struct pk_host *h = &c->pk;
	if (!h->running)
		return 0;
	int rc = pk_quiesce(c);
	h->running = 0; /* whatever happens next, it is not to be waited on again */
	if (rc)
		return rc;
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_stop, &h->h_flag[1], sizeof(unsigned int), cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->run));
	return 0;
}

void pk_free(struct cuda_impl *c)
{
	struct pk_host *h = &c->pk;
	if (h->running)
		pk_stop(c);
	void *dev[] = {h->d_hdr, h->d_seq, h->d_u, h->d_i, h->d_r, h->d_su, h->d_si, h->d_done, h->d_stop, h->d_ticket,
	               h->d_consumed, h->d_resident};
	for (size_t j = 0; j < sizeof dev / sizeof dev[0]; j++)
		cudaFree(dev[j]);
	void *host[] = {h->h_hdr, h->h_seq, h->h_u, h->h_i, h->h_r, h->h_su, h->h_si, h->h_flag, h->h_ticket, h->h_consumed};
	for (size_t j = 0; j < sizeof host / sizeof host[0]; j++)
		cudaFreeHost(host[j]);
	if (h->run)
		cudaStreamDestroy(h->run);
	if (h->copy)
		cudaStreamDestroy(h->copy);
	if (h->up_ev)
		cudaEventDestroy(h->up_ev);
	memset(h, 0, sizeof *h);
}

/* Load the code of every kernel that may be launched beside the running persistent kernel
 * (loss, new rows drawn, snapshot gather, rows reset) before it first runs. CUDA loads a
 * kernel at its first use by default (lazy loading, CUDA 12.2 and later), and that load may
 * wait for the device to be idle, which it never is while the persistent kernel runs: serve
 * hung in the first launch of init_rows_kernel, on the first batch with a new user after a
 * restart from a snapshot (docs/ENGINE.md, "Residency"; tests/gpu/test_cuda_first_launch.c).
 * Asking for a kernel's attributes loads it. */
static int pk_load_beside(const struct cuda_impl *c, int k)
{
	const void *fn[] = {loss_fn(c->fp16, k), init_rows_fn(c->fp16), gather_rows_fn(c->fp16),
	                    scatter_rows_fn(c->fp16), merge_fn(c->fp16, k, 0), merge_fn(c->fp16, k, 1),
	                    merge_fn(c->fp16, k, 2), merge_fn(c->fp16, k, 3), merge_fn(c->fp16, k, 4),
	                    merge_fn(c->fp16, k, 5), merge_fn(c->fp16, k, 6),
	                    merge_fn(c->fp16, k, 7)};
	for (size_t j = 0; j < sizeof fn / sizeof fn[0]; j++) {
		cudaFuncAttributes a;
		MFS_CUDA_TRY(cudaFuncGetAttributes(&a, fn[j]));
	}
	return 0;
}

/* Allocate the ring and size the grid: SMs x (occupancy - the blocks a loss kernel needs), so
 * the loss and gather kernels of full passes, prequential scoring and snapshots run beside it;
 * without conf.frequent_loss (nobody scores every batch) SMs x occupancy, and those calls stop it. */
int pk_open(mfs_engine_t *e)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	const int k = e->model->k;
	h->S = PK_SLOTS;
	h->cap = PK_SLOT_RATINGS;
	const size_t n = (size_t)h->S * h->cap;
	MFS_CUDA_TRY(cudaStreamCreateWithFlags(&h->run, cudaStreamNonBlocking));
	MFS_CUDA_TRY(cudaStreamCreateWithFlags(&h->copy, cudaStreamNonBlocking));
	MFS_CUDA_TRY(cudaEventCreateWithFlags(&h->up_ev, cudaEventDisableTiming));
	MFS_CUDA_TRY(cudaMalloc(&h->d_hdr, h->S * sizeof *h->d_hdr));
	MFS_CUDA_TRY(cudaMalloc(&h->d_seq, h->S * sizeof *h->d_seq));
	MFS_CUDA_TRY(cudaMalloc(&h->d_done, h->S * sizeof *h->d_done));
	MFS_CUDA_TRY(cudaMalloc(&h->d_u, n * sizeof *h->d_u));
	MFS_CUDA_TRY(cudaMalloc(&h->d_i, n * sizeof *h->d_i));
	MFS_CUDA_TRY(cudaMalloc(&h->d_r, n * sizeof *h->d_r));
	MFS_CUDA_TRY(cudaMalloc(&h->d_su, n * sizeof *h->d_su));
	MFS_CUDA_TRY(cudaMalloc(&h->d_si, n * sizeof *h->d_si));
	MFS_CUDA_TRY(cudaMalloc(&h->d_stop, sizeof *h->d_stop));
	MFS_CUDA_TRY(cudaMalloc(&h->d_ticket, sizeof *h->d_ticket));
	MFS_CUDA_TRY(cudaMalloc(&h->d_consumed, sizeof *h->d_consumed));
	MFS_CUDA_TRY(cudaMalloc(&h->d_resident, sizeof *h->d_resident));
	/* on the copy stream and waited for: a legacy-stream memset is not ordered before a
	 * non-blocking stream's kernel, and reused device memory holds an old engine's bytes */
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_seq, 0, h->S * sizeof *h->d_seq, h->copy));
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_done, 0, h->S * sizeof *h->d_done, h->copy));
	MFS_CUDA_TRY(cudaMemsetAsync(h->d_consumed, 0, sizeof *h->d_consumed, h->copy));
	MFS_CUDA_TRY(cudaStreamSynchronize(h->copy));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_hdr, h->S * sizeof *h->h_hdr, cudaHostAllocDefault));
	/* h_seq[s]: slot s's sequence number; h_seq[S + s] = 0: the "being rewritten" mark */
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_seq, 2 * h->S * sizeof *h->h_seq, cudaHostAllocDefault));
	memset(h->h_seq, 0, 2 * h->S * sizeof *h->h_seq);
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_u, n * sizeof *h->h_u, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_i, n * sizeof *h->h_i, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_r, n * sizeof *h->h_r, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_su, n * sizeof *h->h_su, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_si, n * sizeof *h->h_si, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_flag, 2 * sizeof *h->h_flag, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_ticket, sizeof *h->h_ticket, cudaHostAllocDefault));
	MFS_CUDA_TRY(cudaHostAlloc(&h->h_consumed, 2 * sizeof *h->h_consumed, cudaHostAllocMapped));
	MFS_CUDA_TRY(cudaHostGetDevicePointer((void **)&h->hd_consumed, h->h_consumed, 0));
	h->h_flag[0] = 0;
	h->h_flag[1] = 1;
	h->h_consumed[0] = h->h_consumed[1] = 0;
	/* grid: leave room for one loss block per SM (register-bound kernels of 256 threads) */
	const void *pf = c->fp16 ? (const void *)pk_kernel<__half>(k) : (const void *)pk_kernel<float>(k);
	const void *lf = loss_fn(c->fp16, k);
	int bps = 0;
	cudaFuncAttributes fp, fl;
	MFS_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, pf, 32 * WARPS_PER_BLOCK, 0));
	MFS_CUDA_TRY(cudaFuncGetAttributes(&fp, pf));
	MFS_CUDA_TRY(cudaFuncGetAttributes(&fl, lf));
	int reserve = fp.numRegs > 0 ? (fl.numRegs + fp.numRegs - 1) / fp.numRegs : 1;
	if (reserve < 1)
		reserve = 1;
	const int pb = e->conf.cuda_pk_blocks_per_sm; /* experiments */
	int use = pb > 0 ? pb : e->conf.frequent_loss ? bps - reserve : bps;
	/* shared memory is far from a limit for both kernels (the persistent kernel's slot headers,
	 * one per warp; the loss kernel's block reduction); registers (and threads, far from
	 * the limit) decide */
	h->beside = use + reserve <= bps;
	if (e->conf.cuda_pk_stop_for_loss) /* experiments: stop the kernel for every loss */
		h->beside = 0;
	/* under compute-sanitizer a query of the stream of a loss kernel queued beside the running
	 * persistent kernel never returned while that kernel ran (beside_wait cannot time out a
	 * call that never returns), so the tool would hang serve: stop the kernel for loss and
	 * gather calls instead (docs/ENGINE.md, Residency) */
	if (h->beside && getenv("NV_SANITIZER_INJECTION_PORT_BASE")) {
		h->beside = 0;
		mfs_info("cuda", "msg=\"compute-sanitizer attached: loss and gather kernels stop the persistent kernel\"");
	}
	const int pco = e->conf.cuda_pk_carveout; /* experiments: shared memory carveout, percent (-1: 0 %) */
	if (pco)
		MFS_CUDA_TRY(cudaFuncSetAttribute(pf, cudaFuncAttributePreferredSharedMemoryCarveout, pco < 0 ? 0 : pco));
	if (use < 1)
		use = 1;
	h->grid = c->sms * use;
	if (e->conf.cuda_pk_oversubscribe) /* test hook: more blocks than fit, still beside */
		h->grid = 2 * c->sms * bps;
	int rc = pk_load_beside(c, k);
	if (rc)
		return rc;
	h->on = 1;
	mfs_info("cuda", "msg=\"persistent kernel\" k=%d fp16=%d blocks=%d blocks_per_sm=%d of=%d regs=%d loss_regs=%d "
	                 "loss_beside=%d slots=%u slot_ratings=%u batch_kernel_blocks_per_sm=%d",
	         k, c->fp16, h->grid, use, bps, fp.numRegs, fl.numRegs, h->beside, h->S, h->cap, c->hog_bps);
	return 0;
}

/* The next slot, once the kernel has consumed the batch that used it before (the ring is
 * full otherwise: that wait is the push back the learner's ring, and then the consumer's
 * partition pause, feel). Launches the kernel if it is not running. */
int pk_slot(mfs_engine_t *e, uint32_t *slot)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	int rc;
	if (!h->running && (rc = pk_launch(e)))
		return rc;
	if (h->published - pk_consumed(c) >= h->S) {
		h->waits++;
		if ((rc = pk_wait(c, h->published - h->S + 1)))
			return rc;
	}
	*slot = (uint32_t)(h->published % h->S);
	return 0;
}

/* Publish slot s of n ratings described by hd (pointers and modes set by the caller), to be
 * applied at the learning rate times lr_scale: its header, then its sequence number, on the
 * copy stream after whatever the caller queued. */
int pk_publish(mfs_engine_t *e, uint32_t s, size_t n, float lr_scale)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	struct pk_hdr *hd = &h->h_hdr[s];
	hd->first = h->next_chunk;
	hd->nchunks = (uint32_t)((n + PK_CHUNK - 1) / PK_CHUNK);
	hd->n = (uint32_t)n;
	hd->mu = (float)e->model->mu;
	hd->salt = mfs_coin_salt(++c->launches);
	hd->lr_scale = lr_scale;
	h->h_seq[s] = h->published + 1;
	/* seqlock: mark the slot before its header changes. A warp scanning past the slot's old
	 * batch reads seq, the header, then seq again; without the mark it could take a half new
	 * header for the old batch (and, finishing it, wait forever for an old `consumed`) */
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_seq + s, h->h_seq + h->S + s, sizeof *h->d_seq, cudaMemcpyHostToDevice, h->copy));
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_hdr + s, hd, sizeof *hd, cudaMemcpyHostToDevice, h->copy));
	/* seq last: the kernel trusts a slot once seq says so */
	MFS_CUDA_TRY(cudaMemcpyAsync(h->d_seq + s, h->h_seq + s, sizeof *h->d_seq, cudaMemcpyHostToDevice, h->copy));
	h->published++;
	h->next_chunk += hd->nchunks;
	return 0;
}

/* Publish batch b into the ring, split at slot size: copied to pinned staging, per-rating
 * row modes computed, queued on the copy stream. Returns without waiting for the kernel. */
int pk_submit(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale, int repeat)
{
	struct cuda_impl *c = impl_of(e);
	struct pk_host *h = &c->pk;
	int rc;
	for (size_t off = 0; off < b->n;) {
		const size_t n = b->n - off < h->cap ? b->n - off : h->cap;
		uint32_t s;
		const double t0 = mfs_now_s();
		if ((rc = pk_slot(e, &s)))
			return rc;
		const double t1 = mfs_now_s();
		const size_t base = (size_t)s * h->cap;
		memcpy(h->h_u + base, b->u + off, n * sizeof *h->h_u);
		memcpy(h->h_i + base, b->i + off, n * sizeof *h->h_i);
		memcpy(h->h_r + base, b->r + off, n * sizeof *h->h_r);
		const double t2 = mfs_now_s();
		const mfs_batch_t piece = {b->u + off, b->i + off, b->r + off, n};
		const double inflight = (double)h->grid * WARPS_PER_BLOCK * c->hog_g;
		int hot = 0;
		if ((rc = scales_into(e, &piece, inflight < (double)n ? inflight : (double)n, h->h_su + base, h->h_si + base,
		                      &hot)))
			return rc;
		const double t3 = mfs_now_s();
		MFS_CUDA_TRY(cudaMemcpyAsync(h->d_u + base, h->h_u + base, n * sizeof *h->d_u, cudaMemcpyHostToDevice, h->copy));
		MFS_CUDA_TRY(cudaMemcpyAsync(h->d_i + base, h->h_i + base, n * sizeof *h->d_i, cudaMemcpyHostToDevice, h->copy));
		MFS_CUDA_TRY(cudaMemcpyAsync(h->d_r + base, h->h_r + base, n * sizeof *h->d_r, cudaMemcpyHostToDevice, h->copy));
		if (hot) {
			MFS_CUDA_TRY(cudaMemcpyAsync(h->d_su + base, h->h_su + base, n * sizeof(float), cudaMemcpyHostToDevice,
			                             h->copy));
			MFS_CUDA_TRY(cudaMemcpyAsync(h->d_si + base, h->h_si + base, n * sizeof(float), cudaMemcpyHostToDevice,
			                             h->copy));
		}
		struct pk_hdr *hd = &h->h_hdr[s];
		hd->u = h->d_u + base;
		hd->i = h->d_i + base;
		hd->r = h->d_r + base;
		hd->mr_u = hot ? h->d_su + base : NULL;
		hd->mr_i = hot ? h->d_si + base : NULL;
		hd->md_u = hd->md_i = NULL;
		hd->du = hd->di = 1.f;
		if ((rc = pk_publish(e, s, n, lr_scale)))
			return rc;
		h->wait_s += t1 - t0;
		h->stage_s += t2 - t1;
		h->scales_s += t3 - t2;
		h->queue_s += mfs_now_s() - t3;
		off += n;
	}
	if (!repeat) /* applied once consumed: snapshots quiesce first */
		e->model->events_applied += b->n;
	return 0;
}
