/* thread.h - name the calling thread (seen in top -H, /proc/PID/task/TID/comm, perf and
 * bench/stream.sh's per-thread CPU profile). Linux only; a no-op elsewhere. */
#ifndef MFS_COMMON_THREAD_H
#define MFS_COMMON_THREAD_H

#ifdef __linux__
#include <sys/prctl.h>
#endif

/* name: at most 15 bytes are kept */
static inline void mfs_thread_name(const char *name)
{
#ifdef __linux__
	prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
#else
	(void)name;
#endif
}

#endif
