/* ratings_file.h - offline input: rating files in MovieLens, CSV and binary formats.
 *
 * Formats (docs/INPUT_FORMATS.md):
 *   tsv  MovieLens u.data:      user \t item \t rating \t timestamp
 *   dat  MovieLens ratings.dat: user::item::rating::timestamp
 *   csv  header line then       userId,movieId,rating,timestamp   (timestamp optional)
 *   bin  compact binary:        "MFSRAT01" magic, then fixed 28-byte little-endian records
 *                               {u64 user, u64 item, f32 rating, i64 timestamp_ms}
 * Each may be plain, gzip or zstd compressed (detected from the magic bytes). Ids follow
 * the text form of store.h (canonical decimal -> u64, otherwise string). CRLF is accepted.
 *
 * A bad line (wrong field count, rating not a finite number or outside [rating_min,
 * rating_max], id too long) is counted and reported with its line number; with
 * on_error=fail the read stops with MFS_EPARSE at the first one.
 */
#ifndef MFS_RATINGS_FILE_H
#define MFS_RATINGS_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "model_store/store.h"

enum mfs_rfmt { MFS_RFMT_AUTO = 0, MFS_RFMT_TSV, MFS_RFMT_DAT, MFS_RFMT_CSV, MFS_RFMT_BIN };

typedef struct mfs_rfile_opts {
	int format;          /* enum mfs_rfmt */
	int fail_on_error;   /* 1: stop at the first bad line */
	double rating_min, rating_max;
	int max_reported;    /* bad lines logged individually (then only counted) */
} mfs_rfile_opts_t;

typedef struct mfs_rfile_stats {
	uint64_t lines;      /* lines (or binary records) read, header included */
	uint64_t accepted;
	uint64_t rejected;   /* bad lines */
	uint64_t first_bad_line;
	int format;          /* the format actually used */
	char first_error[256];
} mfs_rfile_stats_t;

/** Called once per accepted rating; ids are valid only during the call. Return non-zero to
 *  stop reading (that value is returned by mfs_rfile_read). ts is passed through in the
 *  file's unit (MovieLens text: seconds; bin/gen: ms); 0 when the line has none. For bin,
 *  line = record number. */
typedef int (*mfs_rating_cb)(void *ctx, const mfs_id_t *user, const mfs_id_t *item, float rating,
                             int64_t ts, uint64_t line);

/** Read path (plain, .gz or .zst; "-" is stdin) and call cb for each accepted rating.
 *  @return 0, errno, MFS_EFORMAT, MFS_ECOMPRESS, MFS_EPARSE (fail_on_error), or cb's value. */
int mfs_rfile_read(const char *path, const mfs_rfile_opts_t *opts, mfs_rating_cb cb, void *ctx,
                   mfs_rfile_stats_t *stats, char *errstr, size_t errstr_size);

/* ---- writing (gen, tests, conversion) ----------------------------------------------- */
typedef struct mfs_rfile_writer mfs_rfile_writer_t;
/** Open path for writing in format (TSV, CSV, DAT or BIN; AUTO = by extension (.bin .csv .dat, else TSV)).
 *  A ".gz" or ".zst" suffix compresses. "-" writes to stdout. */
int mfs_rfile_writer_open(const char *path, int format, mfs_rfile_writer_t **out, char *errstr,
                          size_t errstr_size);
int mfs_rfile_write(mfs_rfile_writer_t *w, const mfs_id_t *user, const mfs_id_t *item, float rating,
                    int64_t ts);
int mfs_rfile_writer_close(mfs_rfile_writer_t *w);

/** Name of a format ("tsv", ...). */
const char *mfs_rfmt_name(int format);

#endif
