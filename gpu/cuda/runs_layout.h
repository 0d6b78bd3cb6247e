/* runs_layout.h - the runs layout of a resident set (runs.cu): host code with C linkage, so
 * that tests/gpu/test_runs_layout.c checks it without a device. */
#ifndef MFS_CUDA_RUNS_LAYOUT_H
#define MFS_CUDA_RUNS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A run: ratings [start, start + n) of user u; RUN_SPLIT in n: the user has other runs too,
 * which other groups may hold at the same time, so the run adds its delta to the user's row
 * instead of storing it (runs.cu). */
struct user_run {
	unsigned long long start;
	uint32_t u, n;
};
#define RUN_SPLIT 0x80000000u
#define RUN_LEN_MASK 0x7FFFFFFFu

/* The runs layout of n ratings (hu, hi, hr, in the order they should keep within a user) over
 * `rows` users into (ou, oi, or_): each user's ratings together in their given order, users in
 * row order, then the ratings with an unknown row (u >= rows or i = MFS_ROW_NONE); each
 * user's ratings cut into runs of at most run_max (1 .. 2^20) of near equal length. *runs
 * (malloc'd, shuffled with seed) and *nruns describe them. Returns 0 or ENOMEM. */
int mfs_runs_layout(const uint32_t *hu, const uint32_t *hi, const float *hr, size_t n, uint32_t rows,
                    uint32_t run_max, uint64_t seed, uint32_t *ou, uint32_t *oi, float *or_, struct user_run **runs,
                    size_t *nruns);

#ifdef __cplusplus
}
#endif

#endif
