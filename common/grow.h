/* grow.h - capacity doubling for growable arrays (the one helper; see also model_store's
 * growth of factor tables, which adds alignment and row initialization). */
#ifndef MFS_GROW_H
#define MFS_GROW_H

#include <errno.h>
#include <stdlib.h>

/** Make *p hold at least `need` elements of `elem` bytes, doubling from 64. On ENOMEM *p and
 *  *cap are unchanged. @return 0 or ENOMEM. */
static inline int mfs_grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap : 64;
	while (nc < need)
		nc *= 2;
	void *np = realloc(*p, nc * elem);
	if (!np)
		return ENOMEM;
	*p = np;
	*cap = nc;
	return 0;
}

#endif
