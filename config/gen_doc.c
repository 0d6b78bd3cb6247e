/* gen_doc.c - print docs/CONFIGURATION.md from the configuration table. */
#include <stdio.h>

#include "config/config.h"

int main(void)
{
	mfs_conf_gen_doc(stdout);
	return ferror(stdout) ? 1 : 0;
}
