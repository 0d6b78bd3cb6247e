/* cmd_query.c - placeholder until the module lands (replaced in this session). */
#include <stdio.h>

#include "cmd/cmd.h"

int mfs_cmd_query(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "mfstream query: not built yet\n");
	return 1;
}
