/* offsets.h - positions in Kafka partitions: the one offset type and the one table of them.
 *
 * mfs_offset_t is what a batch advances, what a snapshot stores ("offset/<topic>/<partition>")
 * and what a restart resumes at: the NEXT offset to consume in (topic, partition). Whoever
 * holds one says who owns its topic string.
 *
 * mfs_parts_t is a small table of partitions keyed by (topic, partition), each with its offset
 * and the marks its owner keeps: the consumer (assigned, at the end), the learner (the last
 * offset committed to Kafka). The table owns its topic strings; they live until
 * mfs_parts_free, so others may borrow them (batches point at the consumer's). Entries are
 * found by a linear scan: a service holds tens of partitions, not thousands.
 */
#ifndef MFS_OFFSETS_H
#define MFS_OFFSETS_H

#include <stddef.h>
#include <stdint.h>

typedef struct mfs_offset {
	const char *topic;
	int32_t partition;
	int64_t next; /* the next offset to consume; -1: none known */
} mfs_offset_t;

typedef struct mfs_part {
	mfs_offset_t off;  /* off.topic is the table's */
	int64_t committed; /* learner: the last offset committed to Kafka (-1: none) */
	int assigned;      /* consumer: the group gave us this partition */
	int at_end;        /* consumer: partition EOF was reported at off.next, nothing came after */
} mfs_part_t;

typedef struct mfs_parts {
	mfs_part_t *p;
	size_t n, cap;
} mfs_parts_t;

/** The entry of (topic, partition), or NULL. */
mfs_part_t *mfs_parts_find(const mfs_parts_t *t, const char *topic, int32_t partition);
/** The entry of (topic, partition), added (next = committed = -1, no marks) if new.
 *  Pointers to entries are valid until the next add. @return NULL on ENOMEM. */
mfs_part_t *mfs_parts_get(mfs_parts_t *t, const char *topic, int32_t partition);
void mfs_parts_free(mfs_parts_t *t);

#endif
