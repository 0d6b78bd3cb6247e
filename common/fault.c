/* fault.c - see fault.h. */
#include "common/fault.h"

#include <errno.h>
#include <lmdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define FAULT_MAX 8

static struct {
	char point[32];
	int err;
	unsigned long at;           /* the pass that fails first (1-based) */
	atomic_ulong passes;
} faults[FAULT_MAX];
static atomic_int n_faults;

static const struct {
	const char *name;
	int err;
} fault_errors[] = {{"ENOSPC", ENOSPC}, {"EIO", EIO}, {"ENOMEM", ENOMEM}, {"MDB_MAP_FULL", MDB_MAP_FULL},
                    {"MDB_PANIC", MDB_PANIC}};

int mfs_fault_arm(const char *spec, char *errstr, size_t es)
{
	atomic_store(&n_faults, 0);
	if (!spec || !*spec)
		return 0;
	char buf[256];
	if (strlen(spec) >= sizeof buf)
		return mfs_errf(errstr, es, MFS_ECONFIG, "test.fault: longer than %zu characters", sizeof buf - 1);
	snprintf(buf, sizeof buf, "%s", spec);
	int n = 0;
	for (char *sp = NULL, *t = strtok_r(buf, ",", &sp); t; t = strtok_r(NULL, ",", &sp)) {
		char *eq = strchr(t, '='), *at = eq ? strchr(eq, '@') : NULL;
		if (!eq || eq == t || (size_t)(eq - t) >= sizeof faults[0].point || n == FAULT_MAX)
			return mfs_errf(errstr, es, MFS_ECONFIG, "test.fault: \"%s\": want POINT=ERROR[@N] (at most %d)", t,
			                FAULT_MAX);
		*eq = 0;
		if (at)
			*at++ = 0;
		int err = 0;
		for (size_t j = 0; j < sizeof fault_errors / sizeof fault_errors[0]; j++)
			if (!strcmp(eq + 1, fault_errors[j].name))
				err = fault_errors[j].err;
		char *end = NULL;
		unsigned long pass = at ? strtoul(at, &end, 10) : 1;
		if (!err || (at && (!*at || *end || pass < 1)))
			return mfs_errf(errstr, es, MFS_ECONFIG,
			                "test.fault: \"%s=%s%s%s\": ERROR is ENOSPC, EIO, ENOMEM, MDB_MAP_FULL or MDB_PANIC, "
			                "N a pass from 1",
			                t, eq + 1, at ? "@" : "", at ? at : "");
		snprintf(faults[n].point, sizeof faults[n].point, "%s", t);
		faults[n].err = err;
		faults[n].at = pass;
		atomic_store(&faults[n].passes, 0);
		n++;
	}
	atomic_store(&n_faults, n);
	return 0;
}

int mfs_fault(const char *point)
{
	const int n = atomic_load_explicit(&n_faults, memory_order_relaxed);
	for (int j = 0; j < n; j++)
		if (!strcmp(faults[j].point, point))
			return atomic_fetch_add(&faults[j].passes, 1) + 1 >= faults[j].at ? faults[j].err : 0;
	return 0;
}
