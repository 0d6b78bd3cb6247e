/* check.h - invariants (assert) and defensive branches (MFS_ALWAYS/MFS_NEVER, after SQLite).
 *
 * assert() is on in debug and sanitize builds. MFS_ALWAYS(x)/MFS_NEVER(x) mark conditions
 * that "cannot happen" but that release builds must still handle: in debug builds they
 * assert, in release builds they evaluate to x so the caller's fallback branch runs.
 */
#ifndef MFS_CHECK_H
#define MFS_CHECK_H

#include <assert.h>

#ifdef NDEBUG
#define MFS_ALWAYS(x) (x)
#define MFS_NEVER(x) (x)
#else
#define MFS_ALWAYS(x) ((x) ? 1 : (assert(0 && #x), 0))
#define MFS_NEVER(x) ((x) ? (assert(0 && #x), 1) : 0)
#endif

#define MFS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
