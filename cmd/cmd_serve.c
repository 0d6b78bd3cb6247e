/* cmd_serve.c - `mfstream serve`: the streaming service (docs/STREAMING.md).
 *
 *   mfstream serve --brokers B --topic T --snapshot DIR [--engine cpu] [--serve.KEY V] [--kafka.KEY V]
 *   mfstream serve --embedded-broker --topic T --snapshot DIR [--partitions P]
 *
 * --brokers, --topic (repeatable; adds to serve.topics), --partitions and --embedded-broker
 * are taken out of argv before the configuration chain (as in cmd_produce.c). SIGINT, SIGTERM
 * and SIGQUIT stop the loop: what was polled is applied, a final snapshot is published and its
 * offsets committed. SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored (nothing reloads);
 * SIGPIPE is ignored; a crash logs its signal. Exit: 0 clean stop, 1 failure at run time, 2
 * usage or configuration.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "common/log.h"
#include "ingest/kafka_util.h"
#include "serve/serve.h"

#define SERVE_EMBEDDED_BROKERS 1
#define SERVE_EMBEDDED_PARTITIONS 4
#define SERVE_MAX_TOPICS 64

static const char serve_usage[] =
	"usage: mfstream serve --snapshot DIR (--topic T ... | --serve.topics T1,T2)\n"
	"                      (--brokers B | --kafka.bootstrap.servers B | --embedded-broker [--partitions P])\n"
	"                      [--engine auto|cpu|cuda] [--serve.batch_size N] [--serve.snapshot_ms MS]\n"
	"                      [--serve.dead_letter_topic T] [--kafka.KEY V ...] [--config FILE]\n"
	"Consumes rating events, updates the model with SGD, publishes snapshots (touched rows and\n"
	"the Kafka offsets they cover in one LMDB txn); on restart resumes from the snapshot.\n";

static volatile sig_atomic_t serve_stop, serve_ignored;

static void on_signal(int sig)
{
	serve_stop = sig;
}

static void on_ignored(int sig)
{
	serve_ignored = sig;
}

/* A crash still says so in the log: a fixed line (write(2) is all a handler may use), then the
 * default action (a core, where enabled), so no signal ends the service without a word. */
static void on_fatal_signal(int sig)
{
	static const char pre[] = "level=error mod=serve msg=\"fatal signal: exiting\" signal=";
	const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
	                 : sig == SIGILL ? "SIGILL" : "SIGABRT";
	ssize_t w = write(2, pre, sizeof pre - 1);
	w = write(2, name, strlen(name));
	w = write(2, "\n", 1);
	(void)w;
	signal(sig, SIG_DFL);
	raise(sig);
}



int mfs_cmd_serve(int argc, char **argv)
{
	for (int k = 1; k < argc; k++)
		if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0) {
			fputs(serve_usage, stdout);
			return 0;
		}
	int ac = argc - 1;
	char **av = argv + 1;
	const char *brokers_v[1] = {NULL}, *parts_v[1] = {NULL}, *topic_v[SERVE_MAX_TOPICS];
	int nb = mfs_cmd_take_all(&ac, av, "--brokers", brokers_v, 1), np = mfs_cmd_take_all(&ac, av, "--partitions", parts_v, 1);
	int nt = mfs_cmd_take_all(&ac, av, "--topic", topic_v, SERVE_MAX_TOPICS);
	if (nb < 0 || np < 0 || nt < 0) {
		fprintf(stderr, "mfstream serve: a flag is missing its value\n%s", serve_usage);
		return 2;
	}
	int embedded = mfs_cmd_take_bool(&ac, av, "--embedded-broker");
	mfs_conf_t c;
	char *pos[1];
	int n_pos = 0;
	/* serve's --lr is the stream's rate (serve.lr); train's --lr is sgd.lr */
	static const mfs_conf_alias_t serve_aliases[] = {{"--lr", "serve.lr"}, {NULL, NULL}};
	if (mfs_cmd_conf("serve", ac, av, serve_aliases, &c, pos, 1, &n_pos))
		return 2;
	int ret = 2, rc;
	char err[1024] = "";
	char *topics[SERVE_MAX_TOPICS];
	size_t n_topics = 0;
	char *tlist = NULL;
	mfs_mock_broker_t *mb = NULL;
	const char *brokers = brokers_v[0];
	for (int j = 0; j < nt; j++)
		topics[n_topics++] = (char *)(uintptr_t)topic_v[j];
	if (*c.serve_topics && !(tlist = strdup(c.serve_topics))) {
		fprintf(stderr, "mfstream serve: out of memory\n");
		goto out;
	}
	for (char *sp = NULL, *t = tlist ? strtok_r(tlist, ",", &sp) : NULL; t; t = strtok_r(NULL, ",", &sp)) {
		while (*t == ' ')
			t++;
		if (*t && n_topics < SERVE_MAX_TOPICS)
			topics[n_topics++] = t;
	}
	long partitions = SERVE_EMBEDDED_PARTITIONS;
	if (parts_v[0]) {
		char *end;
		errno = 0;
		partitions = strtol(parts_v[0], &end, 10);
		if (errno || *end || partitions < 1 || partitions > 10000) {
			fprintf(stderr, "mfstream serve: --partitions \"%s\": want a whole number in [1, 10000]\n", parts_v[0]);
			goto out;
		}
	}
	const char *usage_err = NULL;
	if (n_pos)
		usage_err = "unexpected argument";
	else if (n_topics == 0)
		usage_err = "--topic T (or serve.topics) is required";
	else if (!*c.snapshot_dir)
		usage_err = "--snapshot DIR (snapshot.dir) is required";
	else if ((usage_err = mfs_kafka_broker_choice_error(&c, brokers, embedded)))
		;
	else if (c.rating_min >= c.rating_max)
		usage_err = "rating.min must be below rating.max";
	if (usage_err) {
		fprintf(stderr, "mfstream serve: %s%s%s\n%s", usage_err, n_pos ? ": " : "", n_pos ? pos[0] : "", serve_usage);
		goto out;
	}
	ret = 1;
	if (embedded) {
		if ((rc = mfs_mock_broker_open(SERVE_EMBEDDED_BROKERS, &mb, err, sizeof err))) {
			fprintf(stderr, "mfstream serve: %s\n", err);
			goto out;
		}
		for (size_t j = 0; j < n_topics; j++)
			if ((rc = mfs_mock_broker_create_topic(mb, topics[j], (int)partitions, err, sizeof err))) {
				fprintf(stderr, "mfstream serve: %s\n", err);
				goto out;
			}
		brokers = mfs_mock_broker_bootstraps(mb);
		printf("mfstream serve: embedded broker bootstrap=%s partitions=%ld\n", brokers, partitions);
		fflush(stdout);
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGQUIT, &sa, NULL);
	/* SIGHUP (no reload: every key is read at start), SIGUSR1/2: logged, nothing else */
	sa.sa_handler = on_ignored;
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	sa.sa_handler = SIG_IGN; /* a peer gone mid-write is an error return, not the end */
	sigaction(SIGPIPE, &sa, NULL);
	sa.sa_handler = on_fatal_signal;
	sa.sa_flags = SA_RESETHAND;
	for (size_t j = 0; j < 5; j++)
		sigaction((int[]){SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}[j], &sa, NULL);
	mfs_serve_opts_t so = {brokers, topics, n_topics, embedded, &serve_ignored};
	rc = mfs_serve_run(&c, &so, &serve_stop, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream serve: %s\n", *err ? err : mfs_strerror(rc));
		ret = rc == MFS_ECONFIG ? 2 : 1;
		goto out;
	}
	ret = 0;
out:
	mfs_mock_broker_close(mb);
	free(tlist);
	mfs_conf_free(&c);
	return ret;
}
