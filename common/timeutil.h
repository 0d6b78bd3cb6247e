/* timeutil.h - monotonic and wall clocks, and a sleep. */
#ifndef MFS_TIMEUTIL_H
#define MFS_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

static inline double mfs_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int64_t mfs_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/** Sleep ms milliseconds (test hooks: a slow engine, a slow disk). */
static inline void mfs_sleep_ms(int64_t ms)
{
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

#endif
