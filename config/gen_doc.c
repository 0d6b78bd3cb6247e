/* gen_doc.c - print docs/CONFIGURATION.md (or, with --example, mfstream.conf.example)
 * from the configuration table. */
#include <stdio.h>
#include <string.h>

#include "config/config.h"

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--example") == 0)
		mfs_conf_gen_example(stdout);
	else
		mfs_conf_gen_doc(stdout);
	return ferror(stdout) ? 1 : 0;
}
