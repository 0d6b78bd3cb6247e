/* log.h - structured log lines (logfmt) on stderr.
 *
 *   ts=2026-11-21T10:00:00.123Z level=info mod=train msg="epoch done" epoch=3 rmse=0.91
 *
 * The format string after `mod` carries the rest of the line: write msg="..." first, then
 * key=value pairs. mfs_log_quote() helps with values that may hold spaces or quotes.
 */
#ifndef MFS_LOG_H
#define MFS_LOG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mfs_log_level { MFS_LOG_DEBUG = 0, MFS_LOG_INFO, MFS_LOG_WARN, MFS_LOG_ERROR, MFS_LOG_OFF };

void mfs_log_set_level(int level);
int mfs_log_get_level(void);
void mfs_log(int level, const char *mod, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/** Quote s for a logfmt value into buf (always NUL-terminated); returns buf. */
const char *mfs_log_quote(char *buf, size_t size, const char *s);

#define mfs_debug(mod, ...) mfs_log(MFS_LOG_DEBUG, mod, __VA_ARGS__)
#define mfs_info(mod, ...) mfs_log(MFS_LOG_INFO, mod, __VA_ARGS__)
#define mfs_warn(mod, ...) mfs_log(MFS_LOG_WARN, mod, __VA_ARGS__)
#define mfs_error(mod, ...) mfs_log(MFS_LOG_ERROR, mod, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
