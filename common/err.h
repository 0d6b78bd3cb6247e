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
/* Our block sits below LMDB's (-30799..-30780) so the two never collide. */
#define MFS_E_FIRST (-31000)
enum mfs_err {
	MFS_EINVAL = MFS_E_FIRST, /* invalid argument */
	MFS_ECONFIG,              /* unknown configuration key or bad value */
	MFS_EPARSE,               /* malformed input record */
	MFS_EFORMAT,              /* unknown or unsupported file/data format */
	MFS_EVERSION,             /* snapshot or file format version not supported */
	MFS_ECOMPRESS,            /* corrupt compressed stream */
	MFS_EIDLEN,               /* id longer than 256 bytes or empty */
	MFS_ERANGE,               /* value outside its allowed range */
	MFS_ENAN,                 /* NaN or infinity where a finite number is required */
	MFS_EEMPTY,               /* no data where some is required */
	MFS_ENOTFOUND,            /* id or record not found */
	MFS_EFULL,                /* a fixed capacity is exhausted */
	MFS_ELMDB,                /* LMDB failure (details in errstr) */
	MFS_EGPU,                 /* CUDA failure (details in errstr / log) */
	MFS_ENODEV,               /* requested engine or device not available */
	MFS_EKAFKA,               /* Kafka client failure */
	MFS_EDECODE,              /* event could not be decoded */
	MFS_ESTATE,               /* call not valid in the handle's current state */
	MFS_EFATAL,               /* handle marked unusable after an earlier fatal error */
	MFS_E_LAST_PLUS_ONE
};
#define MFS_E_LAST (MFS_E_LAST_PLUS_ONE - 1)

/** @return a static, never-NULL description of any return code (0, errno, MFS_E*). */
const char *mfs_strerror(int err);

/** printf into errstr (if non-NULL) and return err, for one-line error exits. */
int mfs_errf(char *errstr, size_t errstr_size, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif
#endif
