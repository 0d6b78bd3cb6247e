/* cmd_produce.c - `mfstream produce`: replay a ratings file (in timestamp order) or a synthetic
 * stream into a Kafka topic as batched MessagePack messages (docs/PRODUCER.md).
 *
 *   mfstream produce --brokers B --topic T --input FILE [--batch N] [--rate N] [--compact]
 *   mfstream produce --embedded-broker --topic T --synthetic [--gen.ratings N ...]
 *   mfstream produce --brokers B --topic T --delete-user ID | --delete-item ID
 *
 * --brokers, --topic, --synthetic, --rate, --batch, --partitions, --compact and
 * --embedded-broker are not configuration keys: they are taken out of argv before the rest
 * goes to the configuration chain, which gives --input (train.input), input.format,
 * rating.min/max, the gen.* keys of the synthetic stream and every kafka.* key (SASL, TLS,
 * compression, ...) verbatim to librdkafka.
 *
 * DESIGN: the producing loop is mfs_produce_run (ingest/producer.c), the same call the
 * integration test makes; this file only parses, opens the source, the optional embedded
 * broker and the producer, and reports. SIGINT/SIGTERM stop the loop at the next progress
 * check (every 1024 events); what was already handed to librdkafka is still flushed and
 * counted. The summary line goes to stdout, logs to stderr. Exit: 0 every event delivered,
 * 1 a delivery failed or the run was interrupted, 2 usage or configuration.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "ingest/event_source.h"
#include "ingest/kafka_util.h"
#include "ingest/producer.h"

#define PRODUCE_EMBEDDED_BROKERS 3
#define PRODUCE_EMBEDDED_PARTITIONS 4
#define PRODUCE_BATCH_DEFAULT 100
#define PRODUCE_PROGRESS_S 10.0

static const char produce_usage[] =
	"usage: mfstream produce --topic T (--input FILE | --synthetic | --delete-user ID | --delete-item ID)\n"
	"                        (--brokers B | --embedded-broker)\n"
	"                        [--batch N] [--rate EVENTS_PER_S] [--partitions P] [--compact]\n"
	"                        [--gen.KEY V ...] [--kafka.KEY V ...] [--config FILE]\n"
	"Replays FILE (tsv/dat/csv/bin, plain/gz/zst) in timestamp order, or the synthetic stream of\n"
	"`mfstream gen` (gen.* keys), as MessagePack messages of N events (default %d) keyed by user.\n"
	"--rate 0 (default) is as fast as possible. --partitions P: the embedded broker creates the\n"
	"topic with P (default %d); against a real cluster P, if given, must match the topic.\n"
	"compression.codec=lz4 and enable.idempotence=true unless kafka.* keys say otherwise.\n"
	"--delete-user ID / --delete-item ID sends one delete event ({\"op\": \"delete\", ...}, keyed as\n"
	"the id's ratings are): the model forgets the id (docs/EVENT_FORMAT.md).\n";

static const mfs_conf_alias_t produce_aliases[] = {
	{"--n", "gen.ratings"}, {"--users", "gen.users"}, {"--items", "gen.items"},
	{"--zipf", "gen.zipf"}, {"--seed", "gen.seed"},   {NULL, NULL},
};

static volatile sig_atomic_t produce_stop;

static void on_signal(int sig)
{
	(void)sig;
	produce_stop = 1;
}



/* A whole number in [lo, hi], or a finite double >= 0 when lo < 0 (for --rate). */
static int parse_num(const char *flag, const char *s, double lo, double hi, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi) || (lo >= 1 && v != (double)(int64_t)v)) {
		fprintf(stderr, "mfstream produce: %s \"%s\": want %s in [%g, %g]\n", flag, s,
		        lo >= 1 ? "a whole number" : "a number", lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

typedef struct progress {
	double t_next;
	uint64_t total;
} progress_t;

static int on_progress(void *ctx, const mfs_producer_stats_t *st)
{
	progress_t *pg = ctx;
	if (produce_stop)
		return 1;
	double now = mfs_now_s();
	if (now >= pg->t_next) {
		pg->t_next = now + PRODUCE_PROGRESS_S;
		mfs_info("produce", "msg=progress sent=%" PRIu64 " of=%" PRIu64 " delivered=%" PRIu64 " events_per_s=%.0f",
		         st->events_sent, pg->total, st->events, st->seconds > 0 ? (double)st->events_sent / st->seconds : 0.0);
	}
	return 0;
}

int mfs_cmd_produce(int argc, char **argv)
{
	for (int k = 1; k < argc; k++)
		if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0) {
			printf(produce_usage, PRODUCE_BATCH_DEFAULT, PRODUCE_EMBEDDED_PARTITIONS);
			return 0;
		}
	int ac = argc - 1;
	char **av = argv + 1;
	const char *brokers = NULL, *topic = NULL, *s_rate = NULL, *s_batch = NULL, *s_parts = NULL;
	const char *del_user = NULL, *del_item = NULL;
	if (mfs_cmd_take_flag(&ac, av, "--brokers", &brokers) < 0 || mfs_cmd_take_flag(&ac, av, "--topic", &topic) < 0 ||
	    mfs_cmd_take_flag(&ac, av, "--rate", &s_rate) < 0 || mfs_cmd_take_flag(&ac, av, "--batch", &s_batch) < 0 ||
	    mfs_cmd_take_flag(&ac, av, "--partitions", &s_parts) < 0 ||
	    mfs_cmd_take_flag(&ac, av, "--delete-user", &del_user) < 0 ||
	    mfs_cmd_take_flag(&ac, av, "--delete-item", &del_item) < 0) {
		fprintf(stderr, "mfstream produce: a flag is missing its value\n");
		fprintf(stderr, produce_usage, PRODUCE_BATCH_DEFAULT, PRODUCE_EMBEDDED_PARTITIONS);
		return 2;
	}
	int synthetic = mfs_cmd_take_bool(&ac, av, "--synthetic");
	int compact = mfs_cmd_take_bool(&ac, av, "--compact");
	int embedded = mfs_cmd_take_bool(&ac, av, "--embedded-broker");
	double rate = 0, batch = PRODUCE_BATCH_DEFAULT, parts = 0;
	if ((s_rate && parse_num("--rate", s_rate, 0, 1e12, &rate)) ||
	    (s_batch && parse_num("--batch", s_batch, 1, MFS_PRODUCER_BATCH_MAX, &batch)) ||
	    (s_parts && parse_num("--partitions", s_parts, 1, 100000, &parts)))
		return 2;

	mfs_conf_t c;
	char *pos[1];
	int n_pos = 0;
	if (mfs_cmd_conf("produce", ac, av, produce_aliases, &c, pos, 1, &n_pos))
		return 2;
	int ret = 2, rc;
	char err[1024] = "";
	mfs_evsrc_t *src = NULL;
	mfs_mock_broker_t *mb = NULL;
	mfs_producer_t *p = NULL;
	const char *usage_err = NULL;
	if (n_pos)
		usage_err = "unexpected argument";
	else if (!topic || !*topic)
		usage_err = "--topic T is required";
	else if (synthetic + (*c.train_input != '\0') + (del_user != NULL) + (del_item != NULL) != 1)
		usage_err = "give exactly one of --input FILE, --synthetic, --delete-user ID and --delete-item ID";
	else if ((usage_err = mfs_kafka_broker_choice_error(&c, brokers, embedded)))
		;
	else if (c.rating_min >= c.rating_max)
		usage_err = "rating.min must be below rating.max";
	if (usage_err) {
		fprintf(stderr, "mfstream produce: %s%s%s\n", usage_err, n_pos ? ": " : "", n_pos ? pos[0] : "");
		fprintf(stderr, produce_usage, PRODUCE_BATCH_DEFAULT, PRODUCE_EMBEDDED_PARTITIONS);
		goto out;
	}

	/* kafka.* keys first (cheap), then the source: a bad key or file fails before a long
	 * load or any connection */
	rd_kafka_conf_t *kc = NULL;
	if ((rc = mfs_kafka_conf_new(&c, &kc, err, sizeof err))) {
		fprintf(stderr, "mfstream produce: %s\n", err);
		goto out;
	}
	rd_kafka_conf_destroy(kc);
	mfs_event_t del = {0};
	if (del_user || del_item) { /* one delete event, its id in the text form of ids (store.h) */
		const char *t = del_user ? del_user : del_item;
		mfs_id_t *id = del_user ? &del.user : &del.item;
		del.op = del_user ? MFS_OP_DEL_USER : MFS_OP_DEL_ITEM;
		if (mfs_id_parse(t, strlen(t), id) || mfs_id_check(id)) {
			fprintf(stderr, "mfstream produce: %s \"%s\": not an id (a u64, or 1..256 bytes of UTF-8)\n",
			        del_user ? "--delete-user" : "--delete-item", t);
			goto out;
		}
		rc = 0;
	} else if (synthetic) {
		rc = mfs_evsrc_open_synth(&c, &src, err, sizeof err);
	} else {
		mfs_rfile_opts_t fo = {.format = c.input_format, .fail_on_error = c.input_on_error == 1,
		                       .rating_min = c.rating_min, .rating_max = c.rating_max, .max_reported = 10};
		mfs_rfile_stats_t fst;
		double t0 = mfs_now_s();
		rc = mfs_evsrc_open_file(c.train_input, &fo, &src, &fst, err, sizeof err);
		if (!rc)
			mfs_info("produce", "msg=\"file loaded\" file=%s format=%s ratings=%" PRIu64 " rejected=%" PRIu64
			         " sorted=%s seconds=%.2f", c.train_input, mfs_rfmt_name(fst.format), mfs_evsrc_count(src),
			         fst.rejected, mfs_evsrc_was_sorted(src) ? "yes" : "already_in_order", mfs_now_s() - t0);
	}
	if (rc) {
		fprintf(stderr, "mfstream produce: %s\n", *err ? err : mfs_strerror(rc));
		ret = rc == MFS_ECONFIG ? 2 : 1;
		goto out;
	}
	ret = 1;
	if (embedded) {
		int np = parts > 0 ? (int)parts : PRODUCE_EMBEDDED_PARTITIONS;
		if ((rc = mfs_mock_broker_open(PRODUCE_EMBEDDED_BROKERS, &mb, err, sizeof err)) ||
		    (rc = mfs_mock_broker_create_topic(mb, topic, np, err, sizeof err))) {
			fprintf(stderr, "mfstream produce: %s\n", err);
			goto out;
		}
		brokers = mfs_mock_broker_bootstraps(mb);
		printf("mfstream produce: embedded broker bootstrap=%s topic=%s partitions=%d\n", brokers, topic, np);
		fflush(stdout);
	}
	mfs_producer_opts_t po = {.brokers = brokers, .topic = topic, .partitions = (int)parts,
	                          .batch = (size_t)batch, .compact = compact, .rate = rate};
	if ((rc = mfs_producer_open(&c, &po, &p, err, sizeof err))) {
		fprintf(stderr, "mfstream produce: %s\n", err);
		ret = rc == MFS_ECONFIG || rc == MFS_EINVAL ? 2 : 1;
		goto out;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	progress_t pg = {mfs_now_s() + PRODUCE_PROGRESS_S, src ? mfs_evsrc_count(src) : 1};
	err[0] = '\0';
	if (src)
		rc = mfs_produce_run(p, src, 1024, on_progress, &pg, err, sizeof err);
	else if (!(rc = mfs_producer_send(p, &del)))
		rc = mfs_producer_flush(p, err, sizeof err);

	mfs_producer_stats_t st;
	mfs_producer_get_stats(p, &st);
	printf("mfstream produce: events=%" PRIu64 " messages=%" PRIu64 " bytes=%" PRIu64
	       " seconds=%.3f events_per_s=%.0f topic=%s partitions=%d batch=%zu form=%s bootstrap=%s\n",
	       st.events, st.messages, st.bytes, st.seconds, st.seconds > 0 ? (double)st.events / st.seconds : 0.0, topic,
	       mfs_producer_partitions(p), po.batch, compact ? "compact" : "map",
	       brokers ? brokers : "(kafka.bootstrap.servers)");
	fflush(stdout);
	if (rc == 1 && produce_stop) {
		fprintf(stderr, "mfstream produce: interrupted after %" PRIu64 " of %" PRIu64 " events%s%s\n", st.events,
		        pg.total, *err ? "; " : "", err);
	} else if (rc) {
		fprintf(stderr, "mfstream produce: %s\n", *err ? err : mfs_strerror(rc));
	} else {
		ret = 0;
	}
out:
	mfs_producer_close(p);
	mfs_mock_broker_close(mb);
	mfs_evsrc_close(src);
	mfs_conf_free(&c);
	return ret;
}
