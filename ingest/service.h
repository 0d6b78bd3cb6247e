/* service.h - the streaming loop of `mfstream serve` (docs/STREAMING.md).
 *
 * Kafka (consumer group) -> mfs_event_decode (whole-message accept/reject) -> model_store
 * (ids -> rows, running mean) -> batches of serve.batch_size -> engine SGD; every
 * serve.snapshot_ms and at shutdown/revocation: at a batch boundary, publish the rows touched
 * since the last snapshot + meta + the next offset of every partition in ONE LMDB txn, then
 * commit those offsets to Kafka. On start the snapshot in snapshot.dir is loaded and each
 * assigned partition resumes at the offset stored in it: exactly once relative to the
 * published state.
 */
#ifndef MFS_SERVICE_H
#define MFS_SERVICE_H

#include <signal.h>
#include <stddef.h>

#include "config/config.h"

typedef struct mfs_service_opts {
	const char *brokers;   /* bootstrap.servers override (NULL: kafka.bootstrap.servers) */
	char *const *topics;   /* topics to consume */
	size_t n_topics;
	int embedded;          /* the broker is librdkafka's mock cluster (--embedded-broker) */
} mfs_service_opts_t;

/** Run until *stop becomes non-zero (a signal handler sets it), then apply what was polled,
 *  publish the final snapshot, commit and close. @return 0, or an error code (errstr says why). */
int mfs_service_run(const mfs_conf_t *c, const mfs_service_opts_t *o, volatile sig_atomic_t *stop, char *errstr,
                    size_t errstr_size);

#endif
