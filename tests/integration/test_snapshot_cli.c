/* test_snapshot_cli.c - `mfstream query`, `predict` and `inspect` against a known snapshot.
 *
 * The C writer publishes a small k = 2 model whose predictions are exact in float; the CLI's
 * output is compared with libmfsnap's answers and with hand-computed values, and the usage
 * and runtime errors are checked for their exit codes (2 usage, 1 runtime).
 */
#include <stdarg.h>
#include <stdint.h>
#include <sys/wait.h>

#include "common/err.h"
#include "common/log.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"

static char dir[512], outf[600], errf[600];
static char out[1 << 16], err[1 << 16];

/* Run "mfstream ARGS" through sh; stdout/stderr land in out/err. @return the exit status. */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char args[2048], cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s'", test_bin(), args, outf, errf);
	int st = system(cmd);
	test_slurp(outf, out, sizeof out);
	test_slurp(errf, err, sizeof err);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void set_row(mfs_model_t *m, int ent, const char *text, float bias, float f0, float f1)
{
	mfs_id_t id;
	uint32_t row;
	mfs_id_parse(text, strlen(text), &id);
	if (ent)
		mfs_model_item_row(m, &id, &row);
	else
		mfs_model_user_row(m, &id, &row);
	(ent ? m->bi : m->bu)[row] = bias;
	float *F = (ent ? m->Q : m->P) + (size_t)row * 2;
	F[0] = f0;
	F[1] = f1;
}

static int fixture(void)
{
	mfs_model_conf_t c = {2, 0.1, 1};
	mfs_model_t *m;
	char e[512];
	if (mfs_model_init(&c, &m))
		return -1;
	m->mu = 3.0;
	m->events_applied = 77;
	set_row(m, 0, "u1", 0.5f, 1.0f, 2.0f);
	set_row(m, 0, "42", 0.0f, 0.5f, 0.5f);
	set_row(m, 0, "str:7", 0.25f, 0.0f, 0.0f); /* the string "7", not u64 7 */
	set_row(m, 1, "i1", -0.25f, 0.5f, 0.25f);
	set_row(m, 1, "hi", 0.0f, 10.0f, 10.0f);
	set_row(m, 1, "lo", 0.0f, -10.0f, -10.0f);
	set_row(m, 1, "7", 0.125f, 1.0f, 0.0f);
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.02;
	in.last_loss = NAN;
	in.rating_min = 1.0;
	in.rating_max = 5.0;
	mfs_offset_t offs[] = {{"ratings", 0, 150}, {"ratings", 1, 7}};
	in.offsets = offs;
	in.n_offsets = 2;
	mfs_snap_writer_t *w;
	int rc = mfs_snap_writer_open(dir, 1 << 20, &w, e, sizeof e);
	if (rc == 0) {
		rc = mfs_snap_publish(w, m, &in, NULL, e, sizeof e);
		mfs_snap_writer_close(w);
	}
	if (rc)
		fprintf(stderr, "fixture: %s\n", e);
	mfs_model_free(m);
	return rc;
}

static void test_inspect(void)
{
	TEST_EQ_INT(run("inspect --snapshot '%s'", dir), 0);
	TEST_ASSERT_MSG(strncmp(out, "format_version = 1\nk = 2\ndtype = f32\nmu = 3\n", 44) == 0, "%s", out);
	const char *want[] = {"n_users = 3\n", "n_items = 4\n", "seq = 1\n", "events_applied = 77\n",
	                      "learning_rate = 0.02\n", "last_loss = nan\n", "rating_min = 1\n",
	                      "rating_max = 5\noffset/ratings/0 = 150\noffset/ratings/1 = 7\n"};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		TEST_ASSERT_MSG(strstr(out, want[i]) != NULL, "missing \"%s\" in:\n%s", want[i], out);
	TEST_ASSERT(strstr(out, "wall_time_ms = ") != NULL);

	TEST_EQ_INT(run("inspect --snapshot '%s' --json", dir), 0);
	TEST_ASSERT_MSG(strstr(out, "\"last_loss\": null") && strstr(out, "\"offset/ratings/0\": 150") &&
	                    strstr(out, "\"dtype\": \"f32\"") && out[0] == '{',
	                "%s", out);
	/* valid JSON, if a Python is around to say so */
	if (system("/usr/bin/python3 -c 'import json' >/dev/null 2>&1") == 0) {
		char cmd[1200];
		snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c 'import json, sys; json.load(open(sys.argv[1]))' '%s'", outf);
		TEST_EQ_INT(system(cmd), 0);
	}
	/* the directory from the environment (config chain) */
	char cmd[1400];
	snprintf(cmd, sizeof cmd, "MFSTREAM_SNAPSHOT_DIR='%s' '%s' inspect >/dev/null 2>&1", dir, test_bin());
	TEST_EQ_INT(system(cmd), 0);
}

static void test_query(void)
{
	TEST_EQ_INT(run("query --snapshot '%s' --user u1", dir), 0);
	TEST_STR_EQ(out, "user = u1\nbias = 0.5\nfactors = 1 2\n");
	TEST_EQ_INT(run("query --snapshot '%s' --item=7 --json", dir), 0);
	TEST_STR_EQ(out, "{\"item\": \"7\", \"bias\": 0.125, \"factors\": [1, 0]}\n");
	TEST_EQ_INT(run("query --snapshot '%s' --user str:7", dir), 0);
	TEST_STR_EQ(out, "user = str:7\nbias = 0.25\nfactors = 0 0\n");
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --item i1", dir), 0);
	TEST_STR_EQ(out, "4.25\n"); /* 3 + .5 - .25 + (.5 + .5) */
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --item hi", dir), 0);
	TEST_STR_EQ(out, "5\n"); /* clipped */
	TEST_EQ_INT(run("query --snapshot '%s' --user nobody --item i1", dir), 0);
	TEST_STR_EQ(out, "2.75\n"); /* mu + b_i */
	TEST_ASSERT_MSG(strstr(err, "nobody") && strstr(err, "fallback"), "stderr: %s", err);
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --item i1 --json", dir), 0);
	TEST_STR_EQ(out, "{\"user\": \"u1\", \"item\": \"i1\", \"prediction\": 4.25, \"known_user\": true, "
	                 "\"known_item\": true}\n");
	/* top-K: unclipped scores, best first; K beyond the item count gives them all */
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --top 10", dir), 0);
	TEST_STR_EQ(out, "hi 33.5\n7 4.625\ni1 4.25\nlo -26.5\n");
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --top 1 --json", dir), 0);
	TEST_STR_EQ(out, "[{\"item\": \"hi\", \"score\": 33.5}]\n");
	/* errors: runtime 1, usage 2 */
	TEST_EQ_INT(run("query --snapshot '%s' --user nobody", dir), 1);
	TEST_ASSERT(strstr(err, "not in the snapshot") != NULL);
	TEST_EQ_INT(run("query --snapshot '%s' --user nobody --top 3", dir), 1);
	TEST_EQ_INT(run("query --user u1"), 2);
	TEST_EQ_INT(run("query --snapshot '%s'", dir), 2);
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --top 0", dir), 2);
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --top 1001", dir), 2);
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 --top 3 --item i1", dir), 2);
	TEST_EQ_INT(run("query --snapshot '%s' --user", dir), 2);
	TEST_EQ_INT(run("query --snapshot '%s' --user u1 stray", dir), 2);
	TEST_EQ_INT(run("query --snapshot '%s/none' --user u1", dir), 1);
	TEST_ASSERT(strstr(err, "no snapshot") != NULL);
}

static void test_predict(void)
{
	char pairs[700];
	snprintf(pairs, sizeof pairs, "%s/pairs.txt", dir);
	const char *good = "u1 i1\nu1,i1\nu1\ti1\r\nnobody i1\nu1 nothing\n  42 ,\t7 \nx y\n";
	TEST_OK(test_write_file(pairs, good, strlen(good)));
	TEST_EQ_INT(run("predict --snapshot '%s' --pairs '%s'", dir, pairs), 0);
	/* 42 . 7: 3 + 0 + .125 + .5 = 3.625; "x y": mu */
	TEST_STR_EQ(out, "4.25\n4.25\n4.25\n2.75\n3.5\n3.625\n3\n");
	TEST_ASSERT_MSG(strstr(err, "7 pairs, 2 with an unknown user, 2 with an unknown item") != NULL, "stderr: %s", err);

	char cmd[2000];
	snprintf(cmd, sizeof cmd, "printf 'u1 i1\\n' | '%s' predict --snapshot '%s' --pairs - 2>/dev/null", test_bin(), dir);
	FILE *p = popen(cmd, "r");
	char line[64] = "";
	TEST_ASSERT(p && fgets(line, sizeof line, p));
	TEST_ASSERT(p && pclose(p) == 0);
	TEST_STR_EQ(line, "4.25\n");

	const char *bad = "u1 i1\nu1 i1\nonlyone\nu1 i1\n";
	TEST_OK(test_write_file(pairs, bad, strlen(bad)));
	TEST_EQ_INT(run("predict --snapshot '%s' --pairs '%s'", dir, pairs), 1);
	TEST_ASSERT_MSG(strstr(err, "pairs.txt:3:") != NULL, "stderr: %s", err);
	const char *three = "u1 i1 5\n";
	TEST_OK(test_write_file(pairs, three, strlen(three)));
	TEST_EQ_INT(run("predict --snapshot '%s' --pairs '%s'", dir, pairs), 1);
	TEST_ASSERT_MSG(strstr(err, ":1:") != NULL, "stderr: %s", err);
	TEST_EQ_INT(run("predict --snapshot '%s' --pairs '%s/missing'", dir, dir), 1);
	TEST_EQ_INT(run("predict --snapshot '%s'", dir), 2);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s (set MFS_BIN)", test_bin());
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	snprintf(outf, sizeof outf, "%s.out", dir);
	snprintf(errf, sizeof errf, "%s.err", dir);
	if (fixture() != 0)
		return 1;
	TEST_RUN(test_inspect);
	TEST_RUN(test_query);
	TEST_RUN(test_predict);
	char cmd[2000];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, outf, errf);
	if (system(cmd) != 0)
		fprintf(stderr, "cleanup failed\n");
	return TEST_REPORT();
}
