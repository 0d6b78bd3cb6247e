/* synth.h - the planted synthetic rating stream (gen, produce --synthetic, benchmarks).
 * The model and its guarantees are described in synth.c and docs/INPUT_FORMATS.md. */
#ifndef MFS_SYNTH_H
#define MFS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

struct mfs_conf;
typedef struct mfs_synth mfs_synth_t;

/** Build the planted model from the gen.* keys. @return 0, ENOMEM, MFS_ECONFIG (min > max). */
int mfs_synth_open(const struct mfs_conf *c, mfs_synth_t **out, char *errstr, size_t errstr_size);
/** The next rating: 0-based user and item indices (their ids are index + 1; user indices start
 *  at gen.user_offset), the rating and a strictly increasing ms timestamp. @return 1, or 0
 *  after gen.ratings ratings. */
int mfs_synth_next(mfs_synth_t *s, uint64_t *user, uint64_t *item, float *rating, int64_t *ts_ms);
uint64_t mfs_synth_count(const mfs_synth_t *s);
/** User indices lie in [base, base + span): gen.user_offset, and gen.users plus the users that
 *  join over gen.ratings ratings (gen.user_arrival). */
uint64_t mfs_synth_user_base(const mfs_synth_t *s);
uint64_t mfs_synth_user_span(const mfs_synth_t *s);
void mfs_synth_close(mfs_synth_t *s);

#endif
