/* ratings_file_int.h - what the rating-file reader (ratings_file.c) and writer
 * (ratings_writer.c) share: the binary format's layout, the compression kinds, the line buffer
 * size (the longest line accepted, and the writer's flush unit), exact powers of ten. */
#ifndef MFS_RATINGS_FILE_INT_H
#define MFS_RATINGS_FILE_INT_H

#define RF_BUF_SIZE (1u << 20)   /* decoded line buffer; also the longest line accepted */
#define RF_BIN_MAGIC "MFSRAT01"
#define RF_BIN_MAGIC_LEN 8
#define RF_BIN_REC 28

enum { RF_RAW = 0, RF_GZIP, RF_ZSTD };

static const double rf_pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7,
                                  1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};

#endif
