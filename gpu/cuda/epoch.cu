/* epoch.cu - resident ratings (offline epochs): a rating set loaded once into device memory in
 * a shuffled order with its per-row Hogwild modes (row_modes), one epoch of SGD over it
 * (sgd_launch, sgd.cu) and its loss (loss_launch, loss.cu).
 *
 * DESIGN: loading, freeing and epochs stop the persistent kernel first (allocations and the
 * whole device); the set's order is fixed at load, and each epoch draws fresh sampling coins.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "gpu/cuda/cuda_int.h"
#include "gpu/cuda/step.cuh"

/* A set is uploaded in a seeded random order: files are often sorted by user or time, and
 * warps working on neighbouring ratings would then all hold the same row.
 * The shuffle is two passes with good locality (a plain Fisher-Yates over 100 M ratings is
 * ~6 cache misses per swap, tens of seconds): each rating draws one of SHUF_BUCKETS buckets
 * and is scattered there (4096 sequential write streams), then each bucket, small enough for
 * L2, gets a Fisher-Yates. The result is a uniform random permutation. */
#define SHUF_BUCKETS 4096
static int shuffled_copy(const mfs_batch_t *b, uint64_t seed, uint32_t *hu, uint32_t *hi, float *hr)
{
	const size_t n = b->n;
	uint16_t *bk = (uint16_t *)malloc((n ? n : 1) * sizeof *bk);
	size_t *start = (size_t *)calloc(SHUF_BUCKETS + 1, sizeof *start);
	if (!bk || !start) {
		free(bk);
		free(start);
		return ENOMEM;
	}
	mfs_rng_t r;
	mfs_rng_seed(&r, seed);
	for (size_t x = 0; x < n; x++) {
		bk[x] = (uint16_t)mfs_rng_below(&r, SHUF_BUCKETS);
		start[bk[x] + 1]++;
	}
	for (int j = 0; j < SHUF_BUCKETS; j++)
		start[j + 1] += start[j];
	for (size_t x = 0; x < n; x++) {
		size_t y = start[bk[x]]++;
		hu[y] = b->u[x], hi[y] = b->i[x], hr[y] = b->r[x];
	}
	/* start[j] is now the end of bucket j, i.e. the beginning of bucket j + 1 */
	for (int j = 0; j < SHUF_BUCKETS; j++) {
		size_t lo = j ? start[j - 1] : 0, hi_ = start[j];
		for (size_t x = hi_ - lo; x > 1; x--) {
			size_t a = lo + x - 1, c = lo + (size_t)mfs_rng_below(&r, x);
			uint32_t tu = hu[a], ti = hi[a];
			float tr = hr[a];
			hu[a] = hu[c], hi[a] = hi[c], hr[a] = hr[c];
			hu[c] = tu, hi[c] = ti, hr[c] = tr;
		}
	}
	free(bk);
	free(start);
	return 0;
}

/* Per-row modes of a set for the Hogwild kernel (MODE_PLAIN, 1, or a sampling probability).
 * With H ratings held at once over N iid-ordered ratings, row r (n_r ratings) is held by about
 * c_r = H n_r / N warps at once, and a plain read-modify-write loses roughly that fraction of
 * the row's updates.
 *  - c_r <= plain_c (PLAIN_C = 0.1): plain stores. Two holders at once are rare (uniform
 *    1M x 1M, 100M ratings: c ~ 0.013 for every row) and a lost update now and then is the
 *    Hogwild! bargain; a RED costs L2 atomic throughput a plain store does not. Lost updates
 *    act like a lower learning rate on the row, which is why the bound is well below one
 *    holder: at c ~ 0.5 plain stores already cost accuracy.
 *  - plain_c < c_r <= hot: atomic deltas, so concurrent holders all land theirs.
 *  - c_r > hot (hot_c(): HOT_C, lower at high rates): the c_r deltas computed from one stale
 *    row sum to a step c_r times the intended one, which diverges under heavy skew, so the row
 *    takes each delta whole with probability hot / c_r: an averaged step, c_r / hot times
 *    fewer atomics on the rows that bound throughput under skew. Only hot rows are sampled:
 *    scaling every shared row damps the moderately shared ones too much.
 * The measurements behind each bound: docs/BENCHMARKS.md, "Engine history".
 * A side whose rated rows all share one mode gets no array (*dev = NULL, *def = the mode):
 * uniform sets pay no extra load. Rows with no ratings in the set never matter. */
static int row_modes(const mfs_batch_t *b, uint32_t rows, const uint32_t *col, double inflight, double plain_c,
                     double hot, float **dev, float *def)
{
	*dev = NULL;
	*def = MODE_PLAIN;
	if (!rows || !b->n)
		return 0;
	uint32_t *cnt = (uint32_t *)calloc(rows, sizeof *cnt);
	float *md = (float *)malloc((size_t)rows * sizeof *md);
	if (!cnt || !md) {
		free(cnt);
		free(md);
		return ENOMEM;
	}
	for (size_t x = 0; x < b->n; x++)
		if (col[x] < rows)
			cnt[col[x]]++;
	size_t nhot = 0, atomic = 0, plain = 0;
	float first = -1.f;
	int mixed = 0;
	for (uint32_t r = 0; r < rows; r++) {
		double c = inflight * (double)cnt[r] / (double)b->n;
		md[r] = c > hot ? (float)(hot / c) : c > plain_c ? 1.0f : MODE_PLAIN;
		if (!cnt[r])
			continue;
		nhot += c > hot;
		atomic += c > plain_c && c <= hot;
		plain += c <= plain_c;
		if (first < 0)
			first = md[r];
		mixed |= md[r] != first;
	}
	free(cnt);
	mfs_debug("cuda", "msg=\"row modes\" rows=%u plain=%zu atomic=%zu hot=%zu inflight=%.0f hot_c=%.1f", rows, plain,
	          atomic, nhot, inflight, hot);
	if (!mixed) {
		*def = first < 0 ? MODE_PLAIN : first;
		free(md);
		return 0;
	}
	cudaError_t err = cudaMalloc(dev, (size_t)rows * sizeof *md);
	if (err == cudaSuccess)
		err = cudaMemcpy(*dev, md, (size_t)rows * sizeof *md, cudaMemcpyHostToDevice);
	free(md);
	if (err != cudaSuccess) {
		cudaFree(*dev);
		*dev = NULL;
		MFS_CUDA_TRY(err);
	}
	return 0;
}

/* Rows of [0, rows) that col names at least once. */
static size_t distinct_rows(const uint32_t *col, size_t n, uint32_t rows)
{
	uint8_t *seen = (uint8_t *)calloc(((size_t)rows + 7) / 8 + 1, 1);
	if (!seen)
		return rows;
	size_t d = 0;
	for (size_t x = 0; x < n; x++)
		if (col[x] < rows && !(seen[col[x] >> 3] & (1u << (col[x] & 7)))) {
			seen[col[x] >> 3] |= (uint8_t)(1u << (col[x] & 7));
			d++;
		}
	free(seen);
	return d;
}

/* The share of ratings whose row is hot (c > hot, row_modes) with `inflight` held at once. */
static double hot_share(const uint32_t *col, size_t n, uint32_t rows, double inflight, double hot)
{
	uint32_t *cnt = (uint32_t *)calloc((size_t)rows + 1, sizeof *cnt);
	if (!cnt || !n) {
		free(cnt);
		return 0;
	}
	for (size_t x = 0; x < n; x++)
		if (col[x] < rows)
			cnt[col[x]]++;
	size_t on_hot = 0;
	for (uint32_t r = 0; r < rows; r++)
		if (inflight * (double)cnt[r] / (double)n > hot)
			on_hot += cnt[r];
	free(cnt);
	return (double)on_hot / (double)n;
}

/* User runs (runs.cu) or iid order for a set? Runs unless engine.cuda.user_runs is -1, or it
 * is left to the engine and more than RUNS_HOT_MAX of the ratings fall on hot items. Measured
 * on the H100 (fp16 k=128, 1M x 1M x 99M, 20 epochs; docs/BENCHMARKS.md): at item Zipf 0.8 (3 %
 * of ratings on hot items) runs are 2.3x faster at the same RMSE, at Zipf 1.2 (57 %) 1.17x
 * faster but 4.5 % worse after 20 epochs (0.5562 vs 0.5322): slower to the same RMSE. */
#define RUNS_HOT_MAX 0.25
static int use_runs(mfs_engine_t *e, const mfs_batch_t *b)
{
	const struct cuda_impl *c = impl_of(e);
	if (e->conf.deterministic || !c->run_max)
		return 0;
	if (c->run_max != RUN_MAX_AUTO)
		return 1;
	/* a group per run, at least a run per user with ratings */
	const double held = runs_inflight(e, distinct_rows(b->u, b->n, e->model->n_users));
	const double hot = hot_share(b->i, b->n, e->model->n_items, held, hot_c(e));
	mfs_info("cuda", "msg=\"resident set order\" ratings=%zu order=%s hot_item_share=%.3f", b->n,
	         hot > RUNS_HOT_MAX ? "iid" : "user_runs", hot);
	return hot <= RUNS_HOT_MAX;
}

int cuda_resident_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **out)
{
	int prc = pk_stop(impl_of(e)); /* sets allocate and take the whole device */
	if (prc)
		return prc;
	struct dev_set *d = (struct dev_set *)calloc(1, sizeof *d);
	if (!d)
		return ENOMEM;
	mfs_batch_t sh = {NULL, NULL, NULL, b->n};
	uint32_t *hu = (uint32_t *)malloc((b->n ? b->n : 1) * sizeof *hu);
	uint32_t *hi = (uint32_t *)malloc((b->n ? b->n : 1) * sizeof *hi);
	float *hr = (float *)malloc((b->n ? b->n : 1) * sizeof *hr);
	struct cuda_impl *c = impl_of(e);
	const int runs = use_runs(e, b);
	int rc = (hu && hi && hr) ? shuffled_copy(b, e->conf.seed ^ 0xC0DA5E7ull, hu, hi, hr) : ENOMEM;
	struct user_run *hruns = NULL;
	if (!rc && runs) /* grouped by user into runs (runs.cu); hu/hi/hr take the new order */
		rc = runs_regroup(e, &hu, &hi, &hr, b->n, &hruns, &d->nruns);
	if (!rc) {
		sh.u = hu, sh.i = hi, sh.r = hr;
		rc = alloc_set(d, b->n);
	}
	if (!rc)
		rc = upload(c, d, &sh);
	if (!rc && runs)
		rc = runs_upload(d, hruns);
	free(hruns);
	free(hu);
	free(hi);
	free(hr);
	d->du = d->di = 1.f;
	if (!rc && runs) {
		/* a group holds one rating at a time; users are the groups' own (runs.cu) */
		d->du = MODE_PLAIN;
		rc = row_modes(b, e->model->n_items, b->i, runs_inflight(e, d->nruns), c->plain_c, hot_c(e), &d->si, &d->di);
	} else if (!rc && !e->conf.deterministic) {
		/* ratings in flight as sgd_launch will run them (full grid, or fewer for small sets) */
		const double inflight = hog_inflight(e, b->n);
		rc = row_modes(b, e->model->n_users, b->u, inflight, c->plain_c, hot_c(e), &d->su, &d->du);
		if (!rc)
			rc = row_modes(b, e->model->n_items, b->i, inflight, c->plain_c, hot_c(e), &d->si, &d->di);
	}
	if (rc) {
		free_set(d);
		free(d);
		return rc;
	}
	*out = (mfs_resident_t *)d;
	return 0;
}

void cuda_resident_free(mfs_engine_t *e, mfs_resident_t *s)
{
	pk_stop(impl_of(e));
	(void)e;
	struct dev_set *d = (struct dev_set *)s;
	if (!d)
		return;
	free_set(d);
	free(d);
}

int cuda_sgd_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch)
{
	int rc = pk_stop(impl_of(e));
	if (rc)
		return rc;
	/* the order is the set's (shuffled once at load); the epoch draws fresh sampling coins */
	return sgd_launch(e, (struct dev_set *)s, mfs_coin_salt(epoch), 1.0f, 1);
}

int cuda_loss_resident(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *out)
{
	return loss_launch(e, (struct dev_set *)s, out);
}
