/* shard.h - the rules of a model sharded over S devices (issue 21): which shard owns a user
 * row, which item block an item row is in, which block a shard works in a rotation step, and
 * what the two item-exchange schemes move. Plain arithmetic on rows, shared by the CPU
 * reference of the sharded algorithm (gpu/cpu/shard_ref.h) and, when it exists, a multi-GPU
 * engine, so that both route and schedule the same way. docs/SCALE_OUT.md gives the design.
 *
 * Users: shard = row % S, local row = row / S. Rows are handed out in arrival order
 * (model_store), so the modulus deals them round-robin: every shard holds the same number of
 * rows to within one and grows at the same rate (per-device growth budgets stay even), a
 * row freed by eviction and given to a new id stays on its device, and both directions are
 * one division with no table. A hash of the external id would need a table from row to local
 * row on every device and would rebalance nothing that arrival order has not already mixed:
 * the id's own structure (sequential numbers, strings with common prefixes) never reaches
 * the row number. Hosts split users by the external id instead (Kafka's key partitioner):
 * that is a different level, docs/SCALE_OUT.md.
 *
 * Items, in the block-rotation scheme: block = row % S, the same rule (train renumbers item
 * rows at random, and a stream's rows are in arrival order).
 */
#ifndef MFS_SHARD_H
#define MFS_SHARD_H

#include <math.h>
#include <stdint.h>

/** Most shards the reference (and the design) takes: a host's GPUs. */
#define MFS_SHARD_MAX 64
/** Most shards a merge on the devices takes (gpu/cuda/merge.cu keeps a shard's factors per
 *  row in registers): a host's GPUs. */
#define MFS_SHARD_DEVICE_MAX 8

enum mfs_shard_scheme {
	/* items replicated on every shard; each shard's item changes since the last exchange are
	 * summed into every replica every `exchange_every` batches (NCCL all-reduce of deltas) */
	MFS_SHARD_ALLREDUCE = 0,
	/* items cut into S blocks that rotate: in sub-epoch t shard s works rating block
	 * (s, (s + t) % S) and then hands item block (s + t) % S to shard s - 1 (CuMF_SGD) */
	MFS_SHARD_ROTATE = 1,
	/* hosts (docs/SCALE_OUT.md, "between hosts"): items replicated, no barrier. Every
	 * `exchange_every` batches each shard publishes, for every item row its own ratings moved
	 * since its last publish, its cumulative contribution (the sum of its own moves, and the
	 * ratings behind them); the others receive it `lag` batches later and merge the difference
	 * from what they had applied into their current value (combine SUM: added; BLEND: as that
	 * many ratings pulling towards the sender's target, mixed with the receiver's own recent
	 * ratings of the row by count: gpu/cpu/shard_ref.c says how) */
	MFS_SHARD_HOSTS = 2,
};

/** How an all-reduce combines the replicas of an item row that several shards changed since
 *  the last exchange (a row one shard alone changed takes that shard's value either way). */
enum mfs_shard_combine {
	MFS_SHARD_SUM = 0,  /* q0 + the sum of the shards' deltas: each shard's change counts in full
	                       (synchronous data-parallel SGD; overshoots a hot row that every shard
	                       moved to its target: docs/BENCHMARKS.md, "Sharding, CPU reference") */
	MFS_SHARD_MEAN = 1, /* the mean of the changed replicas (model averaging: a hot row lands
	                       between the shards' targets; a row two shards each moved once gets
	                       half of each move) */
	MFS_SHARD_BLEND = 2, /* what serial SGD would have done, under a model of the steps: each of
	                       shard s's n_s ratings of the row takes a fraction g of the row's
	                       distance to a common target t, so q_s - q0 = (1 - a_s)(t - q0) with
	                       a_s = (1 - g)^n_s, and all N ratings one after another would give
	                       (1 - prod a_s)(t - q0). Each shard's estimate of t - q0, weighted by
	                       its n_s:
	                           q = q0 + (1 - prod a_s) / N  sum_s n_s (q_s - q0) / (1 - a_s)
	                       g = lr (1 + lambda_bi) for the bias; lr (rho + lambda_q) for the
	                       factors, rho = E[(p.p')^2] / E[|p|^2] over the round's users
	                       (mfs_shard_blend_gq). Few small steps give the sum of the deltas; many
	                       give the count-weighted mean of the replicas. A model, checked by
	                       measurement (bench_shard, bench_gpu_sgd), not a theorem: the targets
	                       differ. */
};

/** The shard that owns user row `row`. */
static inline uint32_t mfs_shard_of_user(uint32_t row, uint32_t shards) { return row % shards; }

/** The row of user row `row` inside its shard's tables. */
static inline uint32_t mfs_shard_local_row(uint32_t row, uint32_t shards) { return row / shards; }

/** The item block of item row `row` (rotation). */
static inline uint32_t mfs_shard_item_block(uint32_t row, uint32_t shards) { return row % shards; }

/** Rotation: the item block shard s works in sub-epoch t (0 <= t < S). For a fixed t this is
 *  a permutation of the shards, so no two shards hold the same item block at once; over the
 *  S sub-epochs of an epoch every shard works every block once. */
static inline uint32_t mfs_shard_rotation_block(uint32_t s, uint32_t t, uint32_t shards)
{
	return (s + t) % shards;
}

/** Rows of a table of n rows that block (or shard) b of S holds under the modulus rule. */
static inline uint32_t mfs_shard_rows_in(uint32_t n, uint32_t b, uint32_t shards)
{
	return n / shards + (b < n % shards ? 1u : 0u);
}

/** Bytes a ring all-reduce of a table of `rows` rows of `row_bytes` sends, all S shards
 *  together: each sends 2 (S - 1) / S of the table (reduce-scatter, then all-gather). */
static inline uint64_t mfs_shard_allreduce_bytes(uint64_t rows, uint64_t row_bytes, uint32_t shards)
{
	return 2u * (uint64_t)(shards - 1) * rows * row_bytes;
}

/* BLEND's pieces (enum mfs_shard_combine), with l = log(1 - g), g a step's fraction:
 * a participant's weight n / (1 - (1 - g)^n), and the scale (1 - (1 - g)^N) / N of the weighted
 * sum of all N ratings' moves: q = q0 + scale * sum_s weight_s (q_s - q0). */
#define MFS_SHARD_BLEND_MAX_STEP 0.999 /* g is capped here: log1p(-1) would be -inf */
static inline double mfs_shard_blend_log(double g)
{
	return log1p(-fmin(g, MFS_SHARD_BLEND_MAX_STEP));
}
static inline double mfs_shard_blend_weight(double n, double l) { return n / -expm1(n * l); }

/* BLEND's g for the factors. A rating moves q along its user's p and covers lr (p.u)^2 of the
 * distance to its target along a unit direction u: per direction, lr times the eigenvalues of the
 * users' second moment M = E[p p^T]. The move a rating makes falls on M's directions in
 * proportion to their eigenvalues, so the step it sees is lr (tr M^2 / tr M + lambda_q):
 * rho = tr M^2 / tr M = E[(p.p')^2] / E[|p|^2] for independent p, p'. Learned user factors are
 * far from isotropic (planted rank 8, k = 128: a few eigenvalues 20-30x tr M / k); the isotropic
 * |p|^2 / k (rho for M = |p|^2 / k I) made g 4-6x too small, the hot rows' shards each moved most
 * of the way while BLEND added their moves like SUM, and at 4 shards rows overshot by up to 3x:
 * 4 H200s, Zipf 1.2, k 128, 32 pieces, the whole model non-finite in 2 of 3 runs
 * (docs/SCALE_OUT.md). p2 = sum |p|^2, pp = sum (p.p')^2 over the same number of users: each
 * shard's sample paired with itself shifted by half its length, cyclically, so that a user's run
 * of ratings (a stream's batch) does not pair a user with itself (mfs_norm2_pairs_ref): one user
 * alone gives rho = |p|^2, where every move is along its p. */
static inline double mfs_shard_blend_gq(double lr, double lambda_q, double p2, double pp)
{
	return lr * ((p2 > 0 ? pp / p2 : 0) + lambda_q);
}

/* BLEND's factor step after an epoch run as one piece (one merge an epoch, offline): g x
 * mfs_shard_blend_epoch_g(S), unless engine.merge_epoch_g says otherwise.
 *
 * Why smaller: a smaller g moves a merged row further, towards the sum of the shards' moves.
 * With one merge an epoch every shard's users train a whole epoch against their own replica,
 * and the merged rows (the count-weighted mean where the shards went most of the way) lag what
 * one device would have reached; moving them further makes up part of the lag. A measured
 * correction, not a derivation: per-direction rates from M's eigenvalues (the model above
 * without its one g) gained a tenth to a quarter of what g / 4 gains (CPU shards, Zipf 0.8,
 * S = 4: +6.20 % -> +5.58-5.92 %, against +3.95 %).
 *
 * How far: along a direction every shard converged in, S equal shards each at a = (1 - g)^n of
 * the way left, BLEND with g x f instead of g carries the row F = (1 - a^(fS)) (1 - a) / (1 - a^f)
 * of the way to the target (f = 1: 1 - a^S, never past it). F > 2 is a growing oscillation from
 * merge to merge. The worst F over a: f = 1/4 gives 1.41 (S = 2), 1.93 (S = 4), 2.47 (S = 8);
 * f = 1/2 gives 1.60 (S = 8), 1.75 (S = 16) and 1.91 (S = 64, MFS_SHARD_MAX). So 1/4 up to four
 * shards, 1/2 above.
 *
 * Measured on one H200 holding the shards (1M x 1M x 100M, k 128 fp16, 20 epochs; four shards
 * on one device matched four devices' +1.45 % within 0.05 points), test RMSE against one GPU's:
 * four shards at Zipf 0.8 +1.46-1.48 % at g, +0.96-0.97 % at g / 2, +0.80 % at 0.35 g,
 * +0.67-0.68 % at g / 4; two shards +0.70 % -> +0.37-0.39 % at g / 4; four at Zipf 1.0 +1.81 %
 * -> +1.58 %, at Zipf 1.2 (one piece forced) +6.47 % -> +6.15 %; uniform unchanged; eight at
 * Zipf 0.8 +2.03 % at g, +1.25 % at g / 2, and g / 4 made the rows non-finite at epoch 15 (F
 * 2.47). MovieLens on CPU shards (S = 4) better for every seed, by 0.05-0.11 %. Where an epoch
 * runs in pieces the hot rows are merged after every piece and the extra move compounds: four
 * shards at Zipf 1.2 in 16 pieces, g / 4 non-finite by epoch 8 (docs/BENCHMARKS.md, "BLEND's
 * step after a whole epoch"). So pieces and streams keep g. */
static inline double mfs_shard_blend_epoch_g(uint32_t shards) { return shards <= 4 ? 0.25 : 0.5; }

/** The rate BLEND's factor step is computed with (mfs_shard_blend_gq's lr): lr, or lr x epoch_g
 *  (> 0) for a merge that closes an epoch run as one piece. One function, so that the host's
 *  merge and the devices' give their kernels the same double. */
static inline double mfs_shard_blend_lr(double lr, double epoch_g)
{
	return epoch_g > 0 ? lr * epoch_g : lr;
}
static inline double mfs_shard_blend_scale(double N, double l) { return -expm1(N * l) / N; }

/** The hosts' merge (MFS_SHARD_HOSTS with BLEND) of one value: the receiver holds cur, n_own of
 *  its ratings of the row the sender had not seen; the sender's contribution grew by d over n
 *  ratings (n > 0) and its value is v. With a = (1 - g)^n its target is t = v + d a / (1 - a);
 *  mixed with the receiver's by count, m = (n_own cur + n t) / (n_own + n), both sets of steps
 *  give m + (cur - m) (1 - g)^(n_own + n). l = log(1 - g) (mfs_shard_blend_log); l = 0 (steps
 *  that do not pull) adds d. gpu/cpu/shard_ref.c ("Hosts") says why. */
static inline double mfs_shard_hosts_merge(double cur, double d, double v, double n, double n_own, double l)
{
	if (l == 0)
		return cur + d;
	const double a = exp(n * l), t = v + a / -expm1(n * l) * d;
	const double w = n_own / (n_own + n), m = w * cur + (1 - w) * t;
	return m + (cur - m) * exp((n_own + n) * l);
}

#endif
