/* err.c - strings for every mfstream return code. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const mfs_err_str[] = {
	[MFS_EINVAL - MFS_E_FIRST] = "invalid argument",
	[MFS_ECONFIG - MFS_E_FIRST] = "configuration error",
	[MFS_EPARSE - MFS_E_FIRST] = "malformed input record",
	[MFS_EFORMAT - MFS_E_FIRST] = "unknown or unsupported format",
	[MFS_EVERSION - MFS_E_FIRST] = "unsupported format version",
	[MFS_ECOMPRESS - MFS_E_FIRST] = "corrupt compressed data",
	[MFS_EIDLEN - MFS_E_FIRST] = "id empty or longer than 256 bytes",
	[MFS_ENAN - MFS_E_FIRST] = "value is NaN or infinite",
	[MFS_EEMPTY - MFS_E_FIRST] = "no data",
	[MFS_ENOTFOUND - MFS_E_FIRST] = "not found",
	[MFS_EFULL - MFS_E_FIRST] = "capacity exhausted",
	[MFS_ELMDB - MFS_E_FIRST] = "LMDB error",
	[MFS_EGPU - MFS_E_FIRST] = "CUDA error",
	[MFS_ENODEV - MFS_E_FIRST] = "engine or device not available",
	[MFS_EKAFKA - MFS_E_FIRST] = "Kafka error",
	[MFS_EDECODE - MFS_E_FIRST] = "event could not be decoded",
	[MFS_EFATAL - MFS_E_FIRST] = "handle unusable after a fatal error",
};

const char *mfs_strerror(int err)
{
	if (err == 0)
		return "success";
	if (err > 0) {
		const char *s = strerror(err);
		return s ? s : "unknown system error";
	}
	if (err >= MFS_E_FIRST && err <= MFS_E_LAST) {
		const char *s = mfs_err_str[err - MFS_E_FIRST];
		if (s)
			return s;
	}
	return "unknown error code";
}

int mfs_errf(char *errstr, size_t errstr_size, int err, const char *fmt, ...)
{
	if (errstr && errstr_size) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(errstr, errstr_size, fmt, ap);
		va_end(ap);
	}
	return err;
}
