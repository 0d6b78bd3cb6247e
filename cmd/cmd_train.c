/* cmd_train.c - placeholder until the module lands (replaced in this session). */
#include <stdio.h>

#include "cmd/cmd.h"

int mfs_cmd_train(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "mfstream train: not built yet\n");
	return 1;
}
