/* event_source.h - streams of rating events for the producer (`mfstream produce`, tests):
 * a ratings file replayed in timestamp order, or the planted synthetic model of
 * `mfstream gen` (same gen.* keys, same ratings for the same seed).
 */
#ifndef MFS_EVENT_SOURCE_H
#define MFS_EVENT_SOURCE_H

#include <stdint.h>

#include "config/config.h"
#include "ingest/event.h"
#include "ingest/ratings_file.h"

typedef struct mfs_evsrc mfs_evsrc_t;

/** Read a whole ratings file (mfs_rfile_read: tsv/dat/csv/bin, plain/gz/zst) into memory and
 *  order it by timestamp. Stable: ties (and files without timestamps) keep file order; a
 *  file already in order is not sorted. Timestamps become milliseconds: bin files are in
 *  ms already; a text file whose largest |timestamp| is below 1e11 is taken as seconds
 *  (MovieLens) and multiplied by 1000, a larger one (files written by `gen`) as ms. A
 *  timestamp of 0 (none in the file) gives an event without "t".
 *  Memory: 32 bytes per rating plus string ids, twice that while sorting.
 *  @param[out] st  the reader's statistics (may be NULL)
 *  @return 0, ENOMEM, MFS_EEMPTY (no valid rating), or mfs_rfile_read's codes. */
int mfs_evsrc_open_file(const char *path, const mfs_rfile_opts_t *opts, mfs_evsrc_t **out,
                        mfs_rfile_stats_t *st, char *errstr, size_t errstr_size);

/** The synthetic stream of `mfstream gen` (cmd_gen.c describes the planted model): gen.ratings
 *  events, u64 user/item ids from 1, ts = 1_700_000_000_000 + n ms. Memory is bounded by
 *  users and items (alias tables and factors), never by the number of events.
 *  @return 0, ENOMEM, or MFS_ECONFIG (gen.min above gen.max). */
int mfs_evsrc_open_synth(const mfs_conf_t *c, mfs_evsrc_t **out, char *errstr, size_t errstr_size);

/** The next event. String ids point into the source and stay valid until it is closed.
 *  @return 1 (an event), 0 (end of stream). */
int mfs_evsrc_next(mfs_evsrc_t *s, mfs_event_t *ev);

/** Events in the whole stream (known up front for both kinds). */
uint64_t mfs_evsrc_count(const mfs_evsrc_t *s);

/** Was the file out of timestamp order (and so sorted)? 0 for synthetic streams. */
int mfs_evsrc_was_sorted(const mfs_evsrc_t *s);

void mfs_evsrc_close(mfs_evsrc_t *s);

#endif
