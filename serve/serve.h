/* serve.h - `mfstream serve`: the streaming service (docs/STREAMING.md).
 *
 * Kafka (consumer group) -> mfs_event_decode (whole-message accept/reject) -> batches of
 * serve.batch_size -> model_store (ids -> rows, running mean) -> engine SGD; every
 * serve.snapshot_ms and at shutdown/revocation: at a batch boundary, publish the rows touched
 * since the last snapshot + meta + the next offset of every partition in ONE LMDB txn, then
 * commit those offsets to Kafka. On start the snapshot in snapshot.dir is loaded and each
 * assigned partition resumes at the offset stored in it: exactly once relative to the
 * published state.
 */
#ifndef MFS_SERVE_H
#define MFS_SERVE_H

#include <signal.h>
#include <stddef.h>

#include "config/config.h"

typedef struct mfs_serve_opts {
	const char *brokers;   /* bootstrap.servers override (NULL: kafka.bootstrap.servers) */
	char *const *topics;   /* topics to consume */
	size_t n_topics;
	int embedded;          /* the broker is librdkafka's mock cluster (--embedded-broker) */
	volatile sig_atomic_t *ignored; /* a signal handler puts here a signal it ignored (logged) */
} mfs_serve_opts_t;

/** "SIGTERM" and so on, for log lines ("signal N" for others; a static buffer for those). */
const char *mfs_signal_name(int sig);

/** Run until *stop becomes non-zero (a signal handler sets it to the signal's number), then apply what was polled,
 *  publish the final snapshot, commit and close. @return 0, or an error code (errstr says why). */
int mfs_serve_run(const mfs_conf_t *c, const mfs_serve_opts_t *o, volatile sig_atomic_t *stop, char *errstr,
                  size_t errstr_size);

#endif
