/* mfs_snap.c - placeholder (the reader lands in this session). */
#include "snapshots/reader/mfs_snap.h"
#include "common/err.h"
const char *mfs_snap_strerror(int err) { return mfs_strerror(err); }
