/* cmd_flags.c - pre-scanning a subcommand's own flags (those that are not config keys, such as
 * --user or --topic) out of argv before the rest goes to mfs_cmd_conf. */
#include <string.h>

#include "cmd/cmd.h"

int mfs_cmd_take_flag(int *argc, char **argv, const char *name, const char **val)
{
	size_t n = strlen(name);
	int found = 0;
	for (int i = 0; i < *argc;) {
		int used = 0;
		if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') {
			*val = argv[i] + n + 1;
			used = 1;
		} else if (strcmp(argv[i], name) == 0) {
			if (i + 1 >= *argc)
				return -1;
			*val = argv[i + 1];
			used = 2;
		}
		if (!used) {
			i++;
			continue;
		}
		memmove(&argv[i], &argv[i + used], (size_t)(*argc - i - used) * sizeof *argv);
		*argc -= used;
		found = 1;
	}
	return found;
}

int mfs_cmd_take_all(int *argc, char **argv, const char *name, const char **vals, int max)
{
	size_t n = strlen(name);
	int found = 0;
	for (int i = 0; i < *argc;) {
		int used = 0;
		const char *v = NULL;
		if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') {
			v = argv[i] + n + 1;
			used = 1;
		} else if (strcmp(argv[i], name) == 0) {
			if (i + 1 >= *argc)
				return -1;
			v = argv[i + 1];
			used = 2;
		}
		if (!used) {
			i++;
			continue;
		}
		if (found < max)
			vals[found++] = v;
		memmove(&argv[i], &argv[i + used], (size_t)(*argc - i - used) * sizeof *argv);
		*argc -= used;
	}
	return found;
}

int mfs_cmd_take_bool(int *argc, char **argv, const char *name)
{
	int found = 0;
	for (int i = 0; i < *argc;) {
		if (strcmp(argv[i], name) != 0) {
			i++;
			continue;
		}
		memmove(&argv[i], &argv[i + 1], (size_t)(*argc - i - 1) * sizeof *argv);
		(*argc)--;
		found = 1;
	}
	return found;
}
