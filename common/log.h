/* log.h - structured log lines on stderr: logfmt (default) or JSON lines.
 *
 *   ts=2026-11-21T10:00:00.123Z level=info mod=train msg="epoch done" epoch=3 rmse=0.91
 *   {"ts":"2026-11-21T10:00:00.123Z","level":"info","mod":"train","msg":"epoch done","epoch":3,"rmse":0.91}
 *
 * The format string after `mod` carries the rest of the line: write msg="..." first, then
 * key=value pairs. mfs_log_quote() helps with values that may hold spaces or quotes. Call
 * sites never change with the output format: in JSON mode (log.format = json) each line's
 * logfmt pairs are converted into JSON keys (quoted values become strings, unquoted values
 * that are JSON numbers become numbers, everything else a string; words that are not a
 * key=value pair go to "msg", or "_text" when the line has a msg already).
 *
 * Repeats from a hot path: mfs_log_ratelimited() / mfs_log_every() print at most one line per
 * interval per state (call site) and add suppressed=N (lines dropped since the last printed
 * one) to the next line they print.
 */
#ifndef MFS_LOG_H
#define MFS_LOG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The order matches config key log.level (debug|info|warn|error). */
enum mfs_log_level { MFS_LOG_DEBUG = 0, MFS_LOG_INFO, MFS_LOG_WARN, MFS_LOG_ERROR, MFS_LOG_OFF };
/* The order matches config key log.format (logfmt|json). */
enum mfs_log_format { MFS_LOG_LOGFMT = 0, MFS_LOG_JSON };

/* Level, format and output may change while other threads log (the commands set them once,
 * from log.level and log.format, before any thread starts). */
void mfs_log_set_level(int level);
int mfs_log_get_level(void);
/** @param[in] format MFS_LOG_LOGFMT or MFS_LOG_JSON (anything else: logfmt). */
void mfs_log_set_format(int format);
int mfs_log_get_format(void);
/** Write lines to fd instead of stderr (tests; a log file). @return the previous fd. */
int mfs_log_set_fd(int fd);
/** @return non-zero if a line of this level would be printed (skip costly argument work). */
int mfs_log_enabled(int level);

void mfs_log(int level, const char *mod, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/** Quote s for a logfmt value into buf (always NUL-terminated); returns buf. */
const char *mfs_log_quote(char *buf, size_t size, const char *s);

#define mfs_debug(mod, ...) mfs_log(MFS_LOG_DEBUG, mod, __VA_ARGS__)
#define mfs_info(mod, ...) mfs_log(MFS_LOG_INFO, mod, __VA_ARGS__)
#define mfs_warn(mod, ...) mfs_log(MFS_LOG_WARN, mod, __VA_ARGS__)
#define mfs_error(mod, ...) mfs_log(MFS_LOG_ERROR, mod, __VA_ARGS__)

#ifndef __cplusplus
/** State of one rate-limited call site; zero-initialised (static storage or MFS_LOG_RL_INIT).
 *  Lock-free: any number of threads may share one state. */
typedef struct mfs_log_rl {
	_Atomic int64_t rl_next_ms;     /* monotonic ms before which lines are suppressed */
	_Atomic uint64_t rl_suppressed; /* lines dropped since the last printed one */
} mfs_log_rl_t;
#define MFS_LOG_RL_INIT {0, 0}

/** Print at most one line per interval_ms for this state; a printed line that follows dropped
 *  ones ends with suppressed=N. Lines below the log level are neither printed nor counted.
 *  @param[in,out] rl the call site's state
 *  @param[in] interval_ms minimum spacing of printed lines (<= 0: print every line) */
void mfs_log_ratelimited(mfs_log_rl_t *rl, int interval_ms, int level, const char *mod, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/** mfs_log_ratelimited with a hidden static state per call site:
 *    mfs_log_every(1000, MFS_LOG_WARN, "serve", "msg=rejected reason=%s", name); */
#define mfs_log_every(interval_ms, level, mod, ...)                                           \
	do {                                                                                  \
		static mfs_log_rl_t mfs_log_rl_site_;                                         \
		mfs_log_ratelimited(&mfs_log_rl_site_, (interval_ms), (level), (mod), __VA_ARGS__); \
	} while (0)
#endif

#ifdef __cplusplus
}
#endif
#endif
