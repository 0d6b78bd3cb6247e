/* merge_ref.c - the merge of item replicas (gpu/shard.h, enum mfs_shard_combine) on the host:
 * the CPU reference of gpu/cuda/merge.cu's merge_kernel, used by the sharded reference
 * (shard_ref.c), by the sharded engine over CPU engines (gpu/sharded.c) and by the CUDA parity
 * test. One row at a time, shards in order, so every caller gets the same bits.
 */
#include <math.h>
#include <string.h>

#include "gpu/cpu/cpu_ref.h"
#include "gpu/shard.h"

/* 1 where out's bias or a factor is NaN or infinite */
static int row_bad(const float *out, size_t ks)
{
	for (size_t f = 0; f <= ks; f++)
		if (!isfinite(out[f]))
			return 1;
	return 0;
}

int mfs_merge_row_ref(int k, uint32_t S, int combine, const uint32_t *cnt, float b0, const float *q0,
                      const float *rep_b, const float *const *rep_q, double lb, double lq, float *out, double *tq)
{
	const size_t ks = (size_t)k;
	uint32_t c = 0;
	while (c < S && !cnt[c])
		c++;
	if (c == S) { /* no shard changed it: the value at the last merge */
		out[0] = b0;
		memcpy(out + 1, q0, ks * sizeof *out);
		return row_bad(out, ks);
	}
	/* SUM: q_c + sum over the others (q_s - q0), in float; MEAN: the changed replicas' sum over
	 * their number. Either way a row one shard alone changed takes that shard's value exactly. */
	const int mean = combine == MFS_SHARD_MEAN;
	out[0] = rep_b[c];
	memcpy(out + 1, rep_q[c], ks * sizeof *out);
	uint32_t count = 1;
	for (uint32_t s = c + 1; s < S; s++) {
		if (!cnt[s])
			continue;
		const float *qs = rep_q[s];
		count++;
		if (mean) {
			out[0] += rep_b[s];
			for (size_t f = 0; f < ks; f++)
				out[1 + f] += qs[f];
		} else {
			out[0] += rep_b[s] - b0;
			for (size_t f = 0; f < ks; f++)
				out[1 + f] += qs[f] - q0[f];
		}
	}
	if (count == 1)
		return row_bad(out, ks);
	if (mean) {
		for (size_t f = 0; f <= ks; f++)
			out[f] /= (float)count;
		return row_bad(out, ks);
	}
	if (combine != MFS_SHARD_BLEND)
		return row_bad(out, ks);
	/* BLEND: q = q0 + (1 - prod a_s) / N sum_s n_s (q_s - q0) / (1 - a_s), a_s = exp(n_s l), in
	 * double, shards in order */
	double prod_b = 1, prod_q = 1, N = 0, tb = 0;
	memset(tq, 0, ks * sizeof *tq);
	for (uint32_t s = c; s < S; s++) {
		const double n = (double)cnt[s];
		if (n == 0)
			continue;
		prod_b *= exp(n * lb);
		prod_q *= exp(n * lq);
		N += n;
		const double wb = mfs_shard_blend_weight(n, lb), wq = mfs_shard_blend_weight(n, lq);
		tb += wb * ((double)rep_b[s] - (double)b0);
		const float *qs = rep_q[s];
		for (size_t f = 0; f < ks; f++)
			tq[f] += wq * ((double)qs[f] - (double)q0[f]);
	}
	out[0] = (float)((double)b0 + (1 - prod_b) / N * tb);
	for (size_t f = 0; f < ks; f++)
		out[1 + f] = (float)((double)q0[f] + (1 - prod_q) / N * tq[f]);
	return row_bad(out, ks);
}

void mfs_norm2_pairs_ref(const float *P, int k, const uint32_t *rows, size_t n, double *p2, double *pp)
{
	const size_t ks = (size_t)k;
	double sum = 0, pair = 0;
	for (size_t j = 0; j < n; j++) {
		const float *p = P + (size_t)rows[j] * ks, *o = P + (size_t)rows[(j + n / 2) % n] * ks;
		double dot = 0;
		for (size_t f = 0; f < ks; f++) {
			sum += (double)p[f] * (double)p[f];
			dot += (double)p[f] * (double)o[f];
		}
		pair += dot * dot;
	}
	*p2 = sum;
	*pp = pair;
}

void mfs_merge_logs(const mfs_hparams_t *hp, double p2, double pp, double epoch_g, double *lb, double *lq)
{
	*lb = mfs_shard_blend_log((double)hp->lr * (1.0 + (double)hp->lambda_bi));
	*lq = mfs_shard_blend_log(
	        mfs_shard_blend_gq(mfs_shard_blend_lr((double)hp->lr, epoch_g), (double)hp->lambda_q, p2, pp));
}
