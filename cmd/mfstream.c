/* mfstream.c - the one binary: dispatch to subcommands. */
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "common/log.h"
#include "mfs_version.h"

extern char **environ;

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *help;
} cmds[] = {
	{"train", mfs_cmd_train, "train a model from a ratings file and publish a snapshot"},
	{"gen", mfs_cmd_gen, "write synthetic ratings from a planted low-rank model"},
	{"query", mfs_cmd_query, "read a user's vector, a prediction or top-K items from a snapshot"},
	{"predict", mfs_cmd_predict, "score 'user item' pairs from a file against a snapshot"},
	{"inspect", mfs_cmd_inspect, "print a snapshot's meta record"},
	{"produce", mfs_cmd_produce, "replay a ratings file or a synthetic stream into a Kafka topic"},
	{"serve", mfs_cmd_serve, "the streaming service: consume Kafka, update the model, publish snapshots"},
	{"config", mfs_cmd_config, "print the effective configuration (or --doc: the reference)"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: mfstream <command> [--key value ...]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].help);
	fprintf(f, "\nAny configuration key works as --key value (docs/CONFIGURATION.md);\n"
	           "--config FILE reads an INI file, MFSTREAM_* variables override it.\n");
}

/* Short flags every subcommand understands (a subcommand's own aliases are tried first). */
static const mfs_conf_alias_t common_aliases[] = {
	{"--input", "train.input"},   {"--test", "train.test"},       {"--snapshot", "snapshot.dir"},
	{"--k", "model.k"},           {"--epochs", "train.epochs"},   {"--lr", "sgd.lr"},
	{"--engine", "engine.kind"},  {"--threads", "engine.threads"}, {"--format", "input.format"},
	{"--deterministic", "engine.deterministic"},                   {"--log-level", "log.level"},
	{NULL, NULL},
};

int mfs_cmd_conf(const char *cmd, int argc, char **argv, const mfs_conf_alias_t *aliases, mfs_conf_t *c,
                 char **positional, int max_pos, int *n_pos)
{
	char err[1024];
	mfs_conf_alias_t all[64];
	size_t n = 0;
	for (; aliases && aliases->flag && n < 32; aliases++)
		all[n++] = *aliases;
	for (size_t j = 0; common_aliases[j].flag; j++)
		all[n++] = common_aliases[j];
	all[n].flag = all[n].key = NULL;
	aliases = all;
	int rc = mfs_conf_init(c);
	if (rc) {
		fprintf(stderr, "mfstream %s: %s\n", cmd, mfs_strerror(rc));
		return 2;
	}
	rc = mfs_conf_load_all(c, argc, argv, environ, aliases, positional, max_pos, n_pos, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream %s: %s\n", cmd, err);
		mfs_conf_free(c);
		return 2;
	}
	mfs_log_set_level(c->log_level);
	mfs_log_set_format(c->log_format);
	return 0;
}

int mfs_cmd_config(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--doc") == 0) {
		mfs_conf_gen_doc(stdout);
		return 0;
	}
	if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		printf("usage: mfstream config [--config FILE] [--key value ...]   the effective configuration\n"
		       "       mfstream config --doc                              the reference of every key\n");
		return 0;
	}
	mfs_conf_t c;
	int n_pos;
	if (mfs_cmd_conf("config", argc - 1, argv + 1, NULL, &c, NULL, 0, &n_pos))
		return 2;
	mfs_conf_dump(&c, stdout);
	mfs_conf_free(&c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
		printf("mfstream %s\n", MFS_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		if (strcmp(argv[1], cmds[i].name) == 0)
			return cmds[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "mfstream: unknown command \"%s\"\n\n", argv[1]);
	usage(stderr);
	return 2;
}
