/* admit.c - see admit.h. */
#include "model_store/admit.h"

#include <errno.h>
#include <stdlib.h>

#include "common/rng.h"

int mfs_admit_init(mfs_admit_t *a, size_t width)
{
	size_t w = 64;
	while (w < width)
		w <<= 1;
	*a = (mfs_admit_t){0};
	if (!(a->c = calloc(MFS_ADMIT_ROWS, w)))
		return ENOMEM;
	a->mask = w - 1;
	return 0;
}

void mfs_admit_free(mfs_admit_t *a)
{
	free(a->c);
	*a = (mfs_admit_t){0};
}

unsigned mfs_admit_see(mfs_admit_t *a, uint64_t h)
{
	size_t at[MFS_ADMIT_ROWS];
	unsigned min = 255;
	for (int r = 0; r < MFS_ADMIT_ROWS; r++) { /* independent positions from one 64-bit hash */
		at[r] = (size_t)r * (a->mask + 1) + (size_t)(mfs_mix64(h, 0x9E3779B97F4A7C15ull * (uint64_t)(r + 1)) & a->mask);
		if (a->c[at[r]] < min)
			min = a->c[at[r]];
	}
	if (min == 255)
		return 255;
	/* conservative update: raise only the counters at the minimum */
	for (int r = 0; r < MFS_ADMIT_ROWS; r++)
		if (a->c[at[r]] == min)
			a->c[at[r]]++;
	return min + 1;
}
