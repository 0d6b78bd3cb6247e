/* shard_ref.h - the CPU reference of the sharded algorithm (issue 21 item 4): S shards in one
 * process, each owning the user rows mfs_shard_of_user gives it and running the reference SGD
 * update (sgd_ref.c) on its users' ratings, with the item factors exchanged between shards by
 * one of the two schemes of gpu/shard.h. It is what a multi-GPU engine is to be checked
 * against, and what bench/bench_shard.c measures the schemes with.
 *
 *   mfs_shard_ref_init(&conf, model, &r, err, sizeof err);
 *   mfs_shard_ref_set_hparams(r, &hp);
 *   mfs_shard_ref_load(r, &train);                 once: the ratings an epoch visits, in order
 *   mfs_shard_ref_epoch(r);                        one pass (ends with an exchange: allreduce)
 *   mfs_shard_ref_sgd(r, &batch);                  allreduce, hosts: one streaming batch
 *   mfs_shard_ref_exchange(r);                     allreduce: exchange what is pending now;
 *                                                  hosts: publish now, deliver everything
 *   mfs_shard_ref_loss(r, &test, &loss);           each shard scores its users; the sum
 *   mfs_shard_ref_free(r);
 *
 * The model: user rows (P, bu) stay in the model's arrays and each shard writes only its own
 * rows, which the partition makes disjoint: numerically that is each device holding its
 * users. Item rows: allreduce keeps one replica per shard and the model's Q and bi as the
 * values at the last exchange (what every replica agreed on, what a snapshot writes);
 * rotation keeps them in the model's arrays, each block written only by the shard holding it;
 * hosts keep a replica per shard that never waits for the others (the model's item rows show
 * shard 0's after an epoch).
 * mu and the hyperparameters are the same on every shard: the loss is summed over shards and
 * one learning-rate controller turns it into the rate every shard uses.
 *
 * Exact properties (tests/unit/test_shard_ref.c):
 *   - S = 1, either scheme, any batch and exchange period: the CPU engine's deterministic
 *     result bit for bit (the same ratings in the same order through mfs_sgd_batch_ref).
 *   - allreduce: after an exchange every replica equals the model's item rows bit for bit;
 *     an item row changed by one shard only since the last exchange takes that shard's value
 *     exactly, so with exchange every batch and batches whose ratings fall on one shard each,
 *     the result is the serial engine's on the same batches, bit for bit.
 *   - allreduce, a row changed by several shards: MFS_SHARD_SUM, q = q_c + sum over the others
 *     (q_s - q0), c the lowest such shard, q0 the value at the last exchange, added in shard
 *     order; MFS_SHARD_MEAN, q = (sum of their q_s in shard order) / their number;
 *     MFS_SHARD_BLEND, gpu/shard.h's estimate of the serial result (in double); the merge
 *     that closes an epoch in which no other merge ran takes BLEND's epoch step
 *     (mfs_shard_blend_lr), as the engine's epochs run in one piece do.
 *   - rotation: a rating is applied only by the shard that holds its item block then (counted
 *     in owner_violations, always 0); every rating once per epoch.
 *   - threads never change a result: shards write disjoint rows between exchanges.
 *   - hosts: S = 1 is the serial engine bit for bit (nothing is sent); a row one shard alone
 *     changed reaches every other shard `lag` batches after the publish that carries it, as
 *     that shard's value then (to rounding), SUM or BLEND. The model's item rows show shard
 *     0's replica after an epoch or an exchange (each host's snapshot writes its own).
 * The reference does not grow: rows must be below the model's row counts at init.
 */
#ifndef MFS_SHARD_REF_H
#define MFS_SHARD_REF_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/engine.h"
#include "gpu/shard.h"
#include "model_store/store.h"

typedef struct mfs_shard_ref mfs_shard_ref_t;

/** Called at every rotation sub-epoch with the block each shard works (block_of_shard[s]). */
typedef void (*mfs_shard_trace_fn)(void *arg, uint64_t sub_epoch, const uint32_t *block_of_shard,
                                   uint32_t shards);

typedef struct mfs_shard_conf {
	uint32_t shards;         /* S, 1 .. MFS_SHARD_MAX */
	int scheme;              /* enum mfs_shard_scheme */
	size_t batch;            /* allreduce epochs: ratings per batch (the streaming batch) */
	uint32_t exchange_every; /* allreduce: batches between exchanges; hosts: between publishes; >= 1 */
	uint32_t lag;            /* hosts: batches from a publish to its delivery (0: the same batch) */
	int combine;             /* allreduce: enum mfs_shard_combine; hosts: SUM or BLEND */
	uint32_t hot_ratings;    /* allreduce: after every batch, also merge the rows one shard gave this
	                            many ratings or more in that batch (0: off) */
	int threads;             /* shards run on this many threads (<= 1: one after another) */
	mfs_shard_trace_fn trace; /* optional (rotation) */
	void *trace_arg;
} mfs_shard_conf_t;

/** What crossed (or would cross) between devices, and how even the shards' work was. */
typedef struct mfs_shard_stats {
	uint64_t exchanges;        /* allreduce: exchanges; rotation: hand-overs of the blocks; hosts:
	                              batches with a publish */
	uint64_t rows_exchanged;   /* allreduce: item rows changed by some shard, summed over exchanges;
	                              hosts: rows published, all shards */
	uint64_t bytes_dense;      /* allreduce: a ring all-reduce of the whole item table (bias + k
	                              factors, fp32), all shards together */
	uint64_t bytes_sparse;     /* allreduce: an all-gather of each shard's touched rows (row number
	                              + values) to every other shard; rotation: the item blocks handed on;
	                              hosts: the published rows (id, count, k + 1 doubles of contribution,
	                              k + 1 floats of value, S - 1 counts merged) as every other shard
	                              receives them */
	uint64_t rounds;           /* batches (allreduce) or sub-epochs (rotation) */
	uint64_t ratings;          /* ratings worked, all shards */
	uint64_t ratings_max_sum;  /* per round, the busiest shard's ratings, summed: with a barrier
	                              per round, S x this / ratings is the time lost to imbalance */
	uint64_t owner_violations; /* rotation: ratings applied by a shard not holding their block */
} mfs_shard_stats_t;

/** A reference on model m (kept, not owned; its row counts are fixed from now on).
 *  @return 0, MFS_EINVAL (S, scheme, batch or exchange_every out of range), ENOMEM. */
int mfs_shard_ref_init(const mfs_shard_conf_t *conf, mfs_model_t *m, mfs_shard_ref_t **out, char *errstr,
                       size_t errstr_size);
void mfs_shard_ref_free(mfs_shard_ref_t *r);
/** As mfs_engine_set_hparams. @return 0 or MFS_EINVAL. */
int mfs_shard_ref_set_hparams(mfs_shard_ref_t *r, const mfs_hparams_t *hp);
/** Take the ratings epochs visit (copied), in the order they visit them.
 *  @return 0, MFS_EINVAL (a row out of range), MFS_ENAN, ENOMEM. */
int mfs_shard_ref_load(mfs_shard_ref_t *r, const mfs_batch_t *b);
/** One epoch over the loaded ratings: allreduce, batches of conf.batch in order, exchanging
 *  every exchange_every batches and at the end; rotation, S sub-epochs.
 *  @return 0, MFS_EINVAL (nothing loaded), ENOMEM, or a thread's error. */
int mfs_shard_ref_epoch(mfs_shard_ref_t *r);
/** Allreduce and hosts: one batch, each rating on its user's shard in order; exchanges (or
 *  publishes) when exchange_every batches have gone by since the last, and (hosts) delivers
 *  what was published lag batches ago.
 *  @return 0, MFS_EINVAL (rotation, or a row out of range), MFS_ENAN, ENOMEM. */
int mfs_shard_ref_sgd(mfs_shard_ref_t *r, const mfs_batch_t *b);
/** Allreduce: exchange now what changed since the last exchange; hosts: every shard publishes
 *  now and everything published is delivered (no-op for rotation). */
int mfs_shard_ref_exchange(mfs_shard_ref_t *r);
/** RMSE/MAE of b: each shard scores its users' ratings against its own item table (a rating
 *  of an unknown user, MFS_ROW_NONE, on shard 0) in chunks of MFS_LOSS_CHUNK; the shards'
 *  sums are added in shard order. @return 0, MFS_EINVAL, ENOMEM. */
int mfs_shard_ref_loss(mfs_shard_ref_t *r, const mfs_batch_t *b, mfs_loss_t *out);
/** Shard s's item table: its replica (allreduce) or the model's (rotation); k floats a row. */
const float *mfs_shard_ref_items(const mfs_shard_ref_t *r, uint32_t s, const float **bias);
void mfs_shard_ref_stats(const mfs_shard_ref_t *r, mfs_shard_stats_t *out);

#endif
