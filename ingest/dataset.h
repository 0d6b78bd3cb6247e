/* dataset.h - ratings loaded into memory as dense rows, and the train/test split.
 *
 * The loader maps ids through the model (model_store): training ratings add rows; test and
 * validation ratings only look rows up, and an id never seen in training gets MFS_ROW_NONE
 * (scored with the fallback mu + known biases). The splits are deterministic: rating number n
 * goes to the test set when mix64(seed, n) / 2^64 < test_fraction, else to the validation set
 * when mix64(seed + 1, n) / 2^64 < valid_fraction, else to training. mu is the mean of the
 * training ratings alone.
 */
#ifndef MFS_DATASET_H
#define MFS_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "ingest/ratings_file.h"
#include "model_store/store.h"

typedef struct mfs_ratings {
	uint32_t *u, *i;
	float *r;
	size_t n, cap;
	double sum; /* sum of ratings, for mu */
	int64_t *ts; /* event times in the file's unit (0: none), kept when keep_ts is set */
	int keep_ts;
} mfs_ratings_t;

void mfs_ratings_free(mfs_ratings_t *rs);
int mfs_ratings_push(mfs_ratings_t *rs, uint32_t u, uint32_t i, float r);
/** mfs_ratings_push with the event time, stored when rs->keep_ts. */
int mfs_ratings_push_ts(mfs_ratings_t *rs, uint32_t u, uint32_t i, float r, int64_t ts);
static inline mfs_batch_t mfs_ratings_batch(const mfs_ratings_t *rs)
{
	mfs_batch_t b = {rs->u, rs->i, rs->r, rs->n};
	return b;
}
/** Shuffle in place with a seeded Fisher-Yates. */
void mfs_ratings_shuffle(mfs_ratings_t *rs, uint64_t seed);
/** Renumber one side's rows after mfs_model_permute_rows(m, ent, perm): every user (ent 0) or
 *  item (ent 1) row r becomes perm[r]; MFS_ROW_NONE stays. */
void mfs_ratings_remap(mfs_ratings_t *rs, int ent, const uint32_t *perm);

typedef struct mfs_load_opts {
	mfs_rfile_opts_t file;
	double test_fraction;  /* used when there is no separate test file */
	double valid_fraction; /* of what is not test: the validation set (early stopping, model selection) */
	uint64_t split_seed;
	int keep_ts;           /* keep the training ratings' event times (train->ts): which are a user's latest */
} mfs_load_opts_t;

/** Load train_path (and test_path, if not NULL) into train/test (and valid). Training ids are
 *  added to the model; the model's mu is set to the training mean.
 *  train, test and valid are outputs: zeroed on entry, freed on failure; valid may be NULL
 *  when opts->valid_fraction is 0.
 *  @return as mfs_rfile_read, or MFS_EEMPTY when no training rating was accepted. */
int mfs_dataset_load(mfs_model_t *m, const char *train_path, const char *test_path,
                     const mfs_load_opts_t *opts, mfs_ratings_t *train, mfs_ratings_t *test, mfs_ratings_t *valid,
                     mfs_rfile_stats_t *train_stats, mfs_rfile_stats_t *test_stats, char *errstr,
                     size_t errstr_size);
/** Read a separate test file after training: rows are looked up in m (MFS_ROW_NONE for ids
 *  training never saw), nothing is added. out is zeroed on entry, freed on failure.
 *  @return as mfs_rfile_read. */
int mfs_dataset_load_test(const mfs_model_t *m, const char *path, const mfs_load_opts_t *opts, mfs_ratings_t *out,
                          mfs_rfile_stats_t *stats, char *errstr, size_t errstr_size);

#endif
