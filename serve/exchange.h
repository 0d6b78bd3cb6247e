/* exchange.h - item factors shared between hosts through a Kafka topic (exchange.topic; issue 21,
 * docs/SCALE_OUT.md "Between hosts").
 *
 * Several `serve` processes (hosts) split the rating partitions between them (one consumer
 * group; users keyed to partitions), so each holds its users and a replica of every item. Every
 * exchange.every_batches batches a host publishes, for every item row its own ratings moved
 * since its last publish, its cumulative contribution to the row (the sum of its own moves and
 * the ratings behind them) and its value; every host reads the whole topic and merges what the
 * others published into its replica, as the CPU reference of the scheme does
 * (gpu/cpu/shard_ref.c, MFS_SHARD_HOSTS with BLEND: the sender's ratings as virtual ratings
 * towards its target, mixed with the receiver's own recent ratings of the row by count).
 *
 *   mfs_exchange_open(c, brokers, m, &x, err, sizeof err);   after the model is loaded
 *   per batch, on the learner's thread:
 *     mfs_exchange_note(x, bt.u, bt.i, bt.n);                 the trained ratings' rows
 *     mfs_exchange_step(x, e, &hp, &touched_items, 1);        publish when due, merge arrivals
 *   mfs_exchange_close(x);                                    flushes what was published
 *
 * Message (key "<item id>@<host>", so a compacted topic keeps the latest per row and host):
 * MessagePack array [host (str), item id (uint or str), ratings (uint), contribution (bin:
 * k + 1 little-endian doubles, bias first), value (bin: k + 1 little-endian floats), merged
 * (map: host (str) -> the ratings of that host's contribution to the row the sender had
 * merged, uint)]. docs/SCALE_OUT.md has it too.
 *
 * Open reads the topic to its end first (a restart: exchange.c, DESIGN). Not yet: the topic's
 * offsets and the ledger in the snapshot (contributions published between a host's snapshot
 * and its restart are lost on it until the row's next publish), and rows freed by the id
 * lifecycle keep their ledger. docs/SCALE_OUT.md says what the simulated run measured.
 */
#ifndef MFS_EXCHANGE_H
#define MFS_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "gpu/engine.h"
#include "model_store/store.h"
#include "model_store/touched.h"

typedef struct mfs_exchange mfs_exchange_t;

typedef struct mfs_exchange_stats {
	uint64_t published_rows;  /* rows this host published */
	uint64_t received_rows;   /* rows of other hosts' messages taken in */
	uint64_t merged_rows;     /* rows merged into the replica (a message with new ratings) */
	uint64_t items_added;     /* items first heard of from another host (given a row then) */
	uint64_t bad_messages;    /* messages that are not the format above (logged, skipped) */
	uint64_t produce_errors;  /* messages librdkafka failed to deliver */
} mfs_exchange_stats_t;

/** Open the exchange on exchange.topic (which must exist) with model m (kept, loaded from the
 *  snapshot if there was one); returns once the reader has read the topic to where it ended
 *  at the call (the next mfs_exchange_step takes that in: call it before the first batch).
 *  @return 0, MFS_EINVAL (no topic, or it does not exist), MFS_EKAFKA, ENOMEM. */
int mfs_exchange_open(const mfs_conf_t *c, const char *brokers, mfs_model_t *m, mfs_exchange_t **out,
                      char *errstr, size_t errstr_size);
/** This host trained n ratings of rows u (users) and i (items). @return 0 or ENOMEM. */
int mfs_exchange_note(mfs_exchange_t *x, const uint32_t *u, const uint32_t *i, size_t n);
/** Between batches (batch = 1: after one; 0: while idle): publish when exchange.every_batches
 *  batches have gone by, then merge what arrived into the engine's item rows (marked in
 *  touched for the next snapshot). @return 0, ENOMEM, MFS_EKAFKA, MFS_EGPU, or the engine's error. */
int mfs_exchange_step(mfs_exchange_t *x, mfs_engine_t *e, const mfs_hparams_t *hp, mfs_touched_t *touched,
                      int batch);
void mfs_exchange_get_stats(mfs_exchange_t *x, mfs_exchange_stats_t *out);
/** Stop the reader, deliver what was published (up to 10 s), free. */
void mfs_exchange_close(mfs_exchange_t *x);

#endif
