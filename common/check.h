/* check.h - invariants (assert) and defensive branches (MFS_NEVER, after SQLite).
 *
 * assert() is on in debug and sanitize builds. MFS_NEVER(x) marks a condition that "cannot
 * happen" but that release builds must still handle: in debug builds it asserts, in release
 * builds it evaluates to x so the caller's fallback branch runs (serve/consumer.c: a
 * rejection reason the decoder does not name).
 */
#ifndef MFS_CHECK_H
#define MFS_CHECK_H

#include <assert.h>

#ifdef NDEBUG
#define MFS_NEVER(x) (x)
#else
#define MFS_NEVER(x) ((x) ? (assert(0 && #x), 1) : 0)
#endif

#define MFS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
