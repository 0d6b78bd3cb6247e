/* err.h - the one error vocabulary of mfstream.
 *
 * Functions return int: 0 on success, a positive errno passed through from the OS, or one
 * of the negative MFS_E* codes below. mfs_strerror() has a string for every code (a unit
 * test walks MFS_E_FIRST..MFS_E_LAST). Calls that can fail for a reason worth a sentence
 * also take (char *errstr, size_t errstr_size) and write that sentence there.
 */
#ifndef MFS_ERR_H
#define MFS_ERR_H

#include <errno.h> /* positive codes are errno values (ENOMEM, ...) */
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MFS_OK 0
/* Our block sits below LMDB's (-30799..-30780) so the two never collide. The values are
 * macros, written out, and never change or get reused (libmfsnap.so.1 returns some of them):
 * the installed reader header (snapshots/reader/mfs_snap.h) defines the codes it returns with
 * the same text, so either header may come first. -30993 and -30983 are retired codes. */
#define MFS_E_FIRST (-31000)
#define MFS_EINVAL (-31000)    /* invalid argument */
#define MFS_ECONFIG (-30999)   /* unknown configuration key or bad value */
#define MFS_EPARSE (-30998)    /* malformed input record */
#define MFS_EFORMAT (-30997)   /* unknown or unsupported file/data format */
#define MFS_EVERSION (-30996)  /* snapshot or file format version not supported */
#define MFS_ECOMPRESS (-30995) /* corrupt compressed stream */
#define MFS_EIDLEN (-30994)    /* id longer than 256 bytes or empty */
#define MFS_ENAN (-30992)      /* NaN or infinity where a finite number is required */
#define MFS_EEMPTY (-30991)    /* no data where some is required */
#define MFS_ENOTFOUND (-30990) /* id or record not found */
#define MFS_EFULL (-30989)     /* a fixed capacity is exhausted */
#define MFS_ELMDB (-30988)     /* LMDB failure (details in errstr) */
#define MFS_EGPU (-30987)      /* CUDA failure (details in errstr / log) */
#define MFS_ENODEV (-30986)    /* requested engine or device not available */
#define MFS_EKAFKA (-30985)    /* Kafka client failure */
#define MFS_EDECODE (-30984)   /* event could not be decoded */
#define MFS_EFATAL (-30982)    /* handle marked unusable after an earlier fatal error */
#define MFS_E_LAST (-30982)
/** Is err a retired code (no string, never returned)? */
#define MFS_E_RETIRED(err) ((err) == -30993 || (err) == -30983)

/** @return a static, never-NULL description of any return code (0, errno, MFS_E*). */
const char *mfs_strerror(int err);

/** printf into errstr (if non-NULL) and return err, for one-line error exits. */
int mfs_errf(char *errstr, size_t errstr_size, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif
#endif
