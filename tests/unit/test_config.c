/* test_config.c - the config table: defaults, precedence (file < env < flags), every error path. */
#include <stdio.h>

#include "common/err.h"
#include "config/config.h"
#include "testhelp.h"

static char errstr[1024];

static void test_defaults_and_set(void)
{
	mfs_conf_t c;
	TEST_OK(mfs_conf_init(&c));
	TEST_EQ_INT(c.model_k, 128);
	TEST_EQ_INT(c.train_epochs, 20);
	TEST_EQ_INT(c.engine_kind, 0);
	TEST_OK(mfs_conf_set(&c, "engine.kind", "cpu", errstr, sizeof errstr));
	TEST_EQ_INT(c.engine_kind, 1);
	TEST_OK(mfs_conf_set(&c, "sgd.lr", "0.25", errstr, sizeof errstr));
	TEST_NEAR(c.sgd_lr, 0.25, 0);
	TEST_OK(mfs_conf_set(&c, "engine.deterministic", "yes", errstr, sizeof errstr));
	TEST_EQ_INT(c.engine_deterministic, 1);
	TEST_OK(mfs_conf_set(&c, "snapshot.dir", "/tmp/x", errstr, sizeof errstr));
	TEST_STR_EQ(c.snapshot_dir, "/tmp/x");
	char buf[64];
	TEST_OK(mfs_conf_get(&c, "sgd.lr", buf, sizeof buf));
	TEST_STR_EQ(buf, "0.25");
	TEST_OK(mfs_conf_get(&c, "engine.kind", buf, sizeof buf));
	TEST_STR_EQ(buf, "cpu");
	TEST_EQ_INT(mfs_conf_enum_index("lr.schedule", "bold"), 2);
	TEST_STR_EQ(mfs_conf_enum_name("lr.schedule", 1), "decay");
	mfs_conf_free(&c);
}

static void test_errors_name_key_and_range(void)
{
	mfs_conf_t c;
	TEST_OK(mfs_conf_init(&c));
	TEST_EQ_INT(mfs_conf_set(&c, "model.kk", "1", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "unknown config key \"model.kk\""));
	TEST_EQ_INT(mfs_conf_set(&c, "model.k", "0", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "model.k") && strstr(errstr, "1..1024"));
	TEST_EQ_INT(mfs_conf_set(&c, "model.k", "12x", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "not an integer"));
	TEST_EQ_INT(mfs_conf_set(&c, "model.k", "99999999999999999999999", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_EQ_INT(mfs_conf_set(&c, "sgd.lr", "nan", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "sgd.lr") && strstr(errstr, "finite"));
	TEST_EQ_INT(mfs_conf_set(&c, "sgd.lr", "11", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "out of range") && strstr(errstr, "1e-09..10"));
	TEST_EQ_INT(mfs_conf_set(&c, "sgd.lr", "", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_EQ_INT(mfs_conf_set(&c, "engine.kind", "tpu", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "auto|cpu|cuda"));
	TEST_EQ_INT(mfs_conf_set(&c, "engine.deterministic", "maybe", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_EQ_INT(mfs_conf_set(&c, "kafka.", "x", errstr, sizeof errstr), MFS_ECONFIG);
	/* the failed sets changed nothing */
	TEST_EQ_INT(c.model_k, 128);
	TEST_NEAR(c.sgd_lr, 0.1, 0);
	/* train's start and the stream's own rates (docs/ENGINE.md; docs/STREAMING.md) */
	TEST_NEAR(c.lr_beta, 0.3, 0);
	TEST_NEAR(c.model_init_scale, 0.02, 0);
	TEST_NEAR(c.serve_lr, 0.03, 0);
	TEST_NEAR(c.serve_replay_beta, 0.05, 0);
	TEST_NEAR(c.serve_init_scale, 0.1, 0);
	mfs_conf_free(&c);
}

static void test_kafka_passthrough(void)
{
	mfs_conf_t c;
	TEST_OK(mfs_conf_init(&c));
	TEST_OK(mfs_conf_set(&c, "kafka.bootstrap.servers", "a:9092", errstr, sizeof errstr));
	TEST_OK(mfs_conf_set(&c, "kafka.sasl.mechanism", "PLAIN", errstr, sizeof errstr));
	TEST_OK(mfs_conf_set(&c, "kafka.bootstrap.servers", "b:9092", errstr, sizeof errstr));
	TEST_EQ_INT(c.kafka_n, 2);
	TEST_STR_EQ(c.kafka_key[0], "bootstrap.servers");
	TEST_STR_EQ(c.kafka_val[0], "b:9092");
	mfs_conf_free(&c);
}

/* defaults < file < environment < flags, with aliases and booleans without a value */
static void test_precedence(void)
{
	const char *dir = test_tmpdir();
	char path[512];
	snprintf(path, sizeof path, "%s/m.conf", dir);
	const char *ini = "; comment\nlog.level = warn\n[sgd]\nlr = 0.03\nlambda_p = 0.2\n[model]\nk = 64\n"
	                  "[kafka]\nbootstrap.servers = file:1\n";
	TEST_OK(test_write_file(path, ini, strlen(ini)));
	char envc[600];
	snprintf(envc, sizeof envc, "MFSTREAM_CONFIG=%s", path);
	char *envp[] = {envc, "MFSTREAM_SGD_LR=0.04", "MFSTREAM_SGD_LAMBDA_P=0.3", "MFSTREAM_KAFKA_CLIENT_ID=env",
	                "HOME=/root", NULL};
	char *argv[] = {"--lr", "0.05", "--engine.deterministic", "--model.seed=5", "pos1", NULL};
	mfs_conf_alias_t aliases[] = {{"--lr", "sgd.lr"}, {NULL, NULL}};
	mfs_conf_t c;
	char *pos[4];
	int npos;
	TEST_OK(mfs_conf_init(&c));
	int rc = mfs_conf_load_all(&c, 5, argv, envp, aliases, pos, 4, &npos, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s", errstr);
	TEST_NEAR(c.sgd_lr, 0.05, 0);         /* flag beats env beats file */
	TEST_NEAR(c.sgd_lambda_p, 0.3, 0);    /* env beats file */
	TEST_EQ_INT(c.model_k, 64);           /* file beats default */
	TEST_EQ_INT(c.log_level, 2);          /* top-level full key in the file */
	TEST_EQ_INT(c.engine_deterministic, 1);
	TEST_EQ_INT(c.model_seed, 5);
	TEST_EQ_INT(npos, 1);
	TEST_STR_EQ(pos[0], "pos1");
	TEST_EQ_INT(c.kafka_n, 2);
	TEST_STR_EQ(c.kafka_key[1], "client.id");
	mfs_conf_free(&c);

	/* --config on the command line overrides MFSTREAM_CONFIG */
	char path2[512];
	snprintf(path2, sizeof path2, "%s/other.conf", dir);
	TEST_OK(test_write_file(path2, "[train]\nepochs = 3\n", 19));
	char *argv2[] = {"--config", path2, NULL};
	TEST_OK(mfs_conf_init(&c));
	TEST_OK(mfs_conf_load_all(&c, 2, argv2, envp, NULL, pos, 4, &npos, errstr, sizeof errstr));
	TEST_EQ_INT(c.train_epochs, 3);
	TEST_EQ_INT(c.model_k, 128);
	mfs_conf_free(&c);
}

static void test_load_errors(void)
{
	const char *dir = test_tmpdir();
	char path[512];
	mfs_conf_t c;
	char *pos[2];
	int npos;
	/* unknown key in a file: names the file, the key and the line */
	snprintf(path, sizeof path, "%s/bad.conf", dir);
	TEST_OK(test_write_file(path, "[sgd]\nlr = 0.1\nbogus = 1\n", 25));
	TEST_OK(mfs_conf_init(&c));
	TEST_EQ_INT(mfs_conf_load_file(&c, path, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT_MSG(strstr(errstr, "sgd.bogus") && strstr(errstr, "line 3") && strstr(errstr, "bad.conf"), "%s", errstr);
	/* out of range in a file */
	TEST_OK(test_write_file(path, "[train]\nepochs = 0\n", 19));
	TEST_EQ_INT(mfs_conf_load_file(&c, path, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT_MSG(strstr(errstr, "train.epochs") && strstr(errstr, "1..100000"), "%s", errstr);
	/* syntax error */
	TEST_OK(test_write_file(path, "[sgd\nlr\n", 8));
	TEST_EQ_INT(mfs_conf_load_file(&c, path, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT_MSG(strstr(errstr, "syntax") || strstr(errstr, "line"), "%s", errstr);
	/* missing file */
	TEST_EQ_INT(mfs_conf_load_file(&c, "/nonexistent/x.conf", errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "/nonexistent/x.conf"));
	/* unknown and bad environment variables */
	char *env1[] = {"MFSTREAM_NOT_A_KEY=1", NULL};
	TEST_EQ_INT(mfs_conf_load_env(&c, env1, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "MFSTREAM_NOT_A_KEY"));
	char *env2[] = {"MFSTREAM_MODEL_K=5000", NULL};
	TEST_EQ_INT(mfs_conf_load_env(&c, env2, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "MFSTREAM_MODEL_K") && strstr(errstr, "1..1024"));
	/* flags: unknown, missing value, too many positionals */
	char *a1[] = {"--nope", "1", NULL};
	TEST_EQ_INT(mfs_conf_load_all(&c, 2, a1, NULL, NULL, pos, 2, &npos, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "--nope"));
	char *a2[] = {"--sgd.lr", NULL};
	TEST_EQ_INT(mfs_conf_load_all(&c, 1, a2, NULL, NULL, pos, 2, &npos, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "needs a value"));
	char *a3[] = {"x", "y", "z", NULL};
	TEST_EQ_INT(mfs_conf_load_all(&c, 3, a3, NULL, NULL, pos, 2, &npos, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT(strstr(errstr, "\"z\""));
	char *a4[] = {"--config", NULL};
	TEST_EQ_INT(mfs_conf_load_all(&c, 1, a4, NULL, NULL, pos, 2, &npos, errstr, sizeof errstr), MFS_ECONFIG);
	mfs_conf_free(&c);
}

/* the dump is a loadable file that reproduces the configuration */
static void test_dump_roundtrip(void)
{
	mfs_conf_t a, b;
	TEST_OK(mfs_conf_init(&a));
	TEST_OK(mfs_conf_set(&a, "sgd.lr", "0.0123", errstr, sizeof errstr));
	TEST_OK(mfs_conf_set(&a, "lr.schedule", "bold", errstr, sizeof errstr));
	TEST_OK(mfs_conf_set(&a, "train.input", "x.tsv", errstr, sizeof errstr));
	const char *dir = test_tmpdir();
	char path[512];
	snprintf(path, sizeof path, "%s/dump.conf", dir);
	FILE *f = fopen(path, "w");
	mfs_conf_dump(&a, f);
	fclose(f);
	TEST_OK(mfs_conf_init(&b));
	int rc = mfs_conf_load_file(&b, path, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s", errstr);
	TEST_NEAR(b.sgd_lr, 0.0123, 0);
	TEST_EQ_INT(b.lr_schedule, 2);
	TEST_STR_EQ(b.train_input, "x.tsv");
	mfs_conf_free(&a);
	mfs_conf_free(&b);
}

/* The shipped config/mfstream.conf.example loads as it is, and with every ";key = value" line
 * uncommented (each default it shows is a value the key takes). Its comment lines run past
 * libinih's 200 bytes. */
static void test_example_loads(void)
{
	const char *src = getenv("MFS_SRC_DIR");
	char path[1024], on[1024];
	snprintf(path, sizeof path, "%s/config/mfstream.conf.example", src && *src ? src : ".");
	static char text[1 << 17], out[1 << 17];
	TEST_ASSERT_MSG(test_slurp(path, text, sizeof text) == 0, "cannot read %s", path);
	size_t longest = 0, o = 0;
	for (const char *l = text; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != '\0')) {
		size_t len = strcspn(l, "\n");
		longest = len > longest ? len : longest;
		if (*l == ';') /* uncomment */
			l++, len--;
		TEST_ASSERT(o + len + 1 < sizeof out);
		memcpy(out + o, l, len);
		o += len;
		out[o++] = '\n';
	}
	TEST_ASSERT_MSG(longest > 200, "the example's longest line is %zu bytes: this test no longer covers long lines",
	                longest);
	mfs_conf_t c;
	TEST_OK(mfs_conf_init(&c));
	int rc = mfs_conf_load_file(&c, path, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s", errstr);
	snprintf(on, sizeof on, "%s/uncommented.conf", test_tmpdir());
	TEST_OK(test_write_file(on, out, o));
	rc = mfs_conf_load_file(&c, on, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s (the example with every key uncommented)", errstr);
	TEST_EQ_INT(c.model_k, 128);
	char buf[256];
	TEST_OK(mfs_conf_get(&c, "kafka.bootstrap.servers", buf, sizeof buf));
	TEST_STR_EQ(buf, "localhost:9092");
	mfs_conf_free(&c);
}

/* Lines of any length: a comment of 1000 bytes (and one of 100 KB), a value of 5000 bytes with
 * an inline comment after it, a line exactly at the limit; a key = value line past the limit
 * (64 KiB) is an error naming the file and its line, and the line numbers of later errors are
 * right. */
static void test_long_lines(void)
{
	const size_t max = 64 * 1024;
	char *big = malloc(2 * max + 4096);
	TEST_ASSERT(big != NULL);
	if (!big)
		return;
	const char *dir = test_tmpdir();
	char path[512];
	snprintf(path, sizeof path, "%s/long.conf", dir);
	mfs_conf_t c;
	TEST_OK(mfs_conf_init(&c));

	size_t o = 0;
	o += (size_t)sprintf(big + o, "# ");
	memset(big + o, 'c', 1000), o += 1000;
	o += (size_t)sprintf(big + o, "\n[snapshot]\n  ; ");
	memset(big + o, 'd', 100000), o += 100000;
	o += (size_t)sprintf(big + o, "\ndir = /tmp/");
	memset(big + o, 'v', 5000), o += 5000;
	o += (size_t)sprintf(big + o, "   ; an inline comment\n[sgd]\nlr = 0.05\n");
	TEST_OK(test_write_file(path, big, o));
	int rc = mfs_conf_load_file(&c, path, errstr, sizeof errstr);
	TEST_ASSERT_MSG(rc == 0, "%s", errstr);
	TEST_ASSERT_MSG(strlen(c.snapshot_dir) == 5 + 5000 && strncmp(c.snapshot_dir, "/tmp/", 5) == 0 &&
	                strspn(c.snapshot_dir + 5, "v") == 5000, "snapshot.dir of %zu bytes", strlen(c.snapshot_dir));
	TEST_NEAR(c.sgd_lr, 0.05, 0);
	/* the dump keeps the long value whole, and loads back */
	char dump[512];
	snprintf(dump, sizeof dump, "%s/dump.conf", dir);
	FILE *f = fopen(dump, "w");
	TEST_ASSERT(f != NULL);
	if (f) {
		mfs_conf_dump(&c, f);
		fclose(f);
		mfs_conf_t d;
		TEST_OK(mfs_conf_init(&d));
		rc = mfs_conf_load_file(&d, dump, errstr, sizeof errstr);
		TEST_ASSERT_MSG(rc == 0, "%s", errstr);
		TEST_STR_EQ(d.snapshot_dir, c.snapshot_dir);
		mfs_conf_free(&d);
	}

	/* a later error still names its own line (a long comment once shifted it by one) */
	o = 0;
	o += (size_t)sprintf(big + o, "[sgd]\n#");
	memset(big + o, 'x', 1000), o += 1000;
	o += (size_t)sprintf(big + o, "\nlr = 0.1\nbogus = 1\n");
	TEST_OK(test_write_file(path, big, o));
	TEST_EQ_INT(mfs_conf_load_file(&c, path, errstr, sizeof errstr), MFS_ECONFIG);
	TEST_ASSERT_MSG(strstr(errstr, "sgd.bogus") && strstr(errstr, "(line 4)"), "%s", errstr);

	/* at the limit (max bytes with its newline) it loads; one byte more is an error on line 3 */
	for (int over = 0; over <= 1; over++) {
		o = 0;
		o += (size_t)sprintf(big + o, "[snapshot]\n# x\ndir = ");
		size_t n = max - strlen("dir = ") - 1 + (size_t)over;
		memset(big + o, 'w', n), o += n;
		big[o++] = '\n';
		o += (size_t)sprintf(big + o, "[sgd]\nlr = 0.07\n");
		TEST_OK(test_write_file(path, big, o));
		rc = mfs_conf_load_file(&c, path, errstr, sizeof errstr);
		if (!over) {
			TEST_ASSERT_MSG(rc == 0, "%s", errstr);
			TEST_EQ_INT(strlen(c.snapshot_dir), n);
			TEST_NEAR(c.sgd_lr, 0.07, 0);
		} else {
			TEST_EQ_INT(rc, MFS_ECONFIG);
			TEST_ASSERT_MSG(strstr(errstr, "long.conf:3:") && strstr(errstr, "65536"), "%s", errstr);
		}
	}
	mfs_conf_free(&c);
	free(big);
}

int main(void)
{
	TEST_RUN(test_defaults_and_set);
	TEST_RUN(test_errors_name_key_and_range);
	TEST_RUN(test_kafka_passthrough);
	TEST_RUN(test_precedence);
	TEST_RUN(test_load_errors);
	TEST_RUN(test_dump_roundtrip);
	TEST_RUN(test_example_loads);
	TEST_RUN(test_long_lines);
	return TEST_REPORT();
}
