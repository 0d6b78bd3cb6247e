/* grow.h - capacity doubling for growable arrays: the one helper. (Tables with more to do on
 * growth keep their own: model_store's aligned factor tables that initialize new rows, the
 * idmap's incremental rehash, a retained window capped at its size, device allocations.) */
#ifndef MFS_GROW_H
#define MFS_GROW_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/** Make *p hold at least `need` elements of `elem` bytes, doubling from *cap (from `first`
 *  when empty). On ENOMEM (also when the size would overflow) *p and *cap are unchanged.
 *  @return 0 or ENOMEM. */
static inline int mfs_grow_from(void **p, size_t *cap, size_t need, size_t elem, size_t first)
{
	if (need <= *cap)
		return 0;
	if (elem == 0 || need > SIZE_MAX / 2 / elem)
		return ENOMEM;
	size_t nc = *cap ? *cap : first ? first : 1;
	while (nc < need)
		nc *= 2;
	void *np = realloc(*p, nc * elem);
	if (!np)
		return ENOMEM;
	*p = np;
	*cap = nc;
	return 0;
}

/** mfs_grow_from with a first capacity of 64. */
static inline int mfs_grow(void **p, size_t *cap, size_t need, size_t elem)
{
	return mfs_grow_from(p, cap, need, elem, 64);
}

#endif
