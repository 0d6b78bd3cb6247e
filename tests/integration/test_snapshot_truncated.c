/* test_snapshot_truncated.c - a data.mdb cut short is a clear error in every reader, not a SIGBUS.
 *
 * LMDB maps data.mdb and follows the page numbers of its meta page; pages past the end of a
 * truncated file fault on first touch. The readers compare the file's size with the newest
 * meta page's last page before mapping (snap_check_size in mfs_snap.c, _check_size in
 * mfsnap.py). A real snapshot from the C writer is cut at several sizes (half of what LMDB
 * uses, one byte short of its last page, inside the second meta page) and opened by libmfsnap
 * (in a child, so a fault shows as a failed check), by `mfstream inspect`, `query` and
 * `predict`, and by mfsnap.py (its CLI: one line on stderr, exit 1, no traceback; its library:
 * SnapshotTruncatedError). The whole file must still open. Exits 77 after the C checks pass if
 * /usr/bin/python3 lacks lmdb or numpy.
 */
#include <lmdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/err.h"
#include "common/log.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"

#define PY "/usr/bin/python3"

static char dir[512], data[600], outf[600], errf[600], script[1024];
static char out[1 << 16], err[1 << 16];
static unsigned char *whole; /* the published data.mdb */
static size_t whole_len;
static size_t need, psize; /* LMDB's own view: bytes up to the last page in use, page size */

/* Run a shell command with stdout/stderr to out/err. @return the exit status, or -1 when the
 * shell did not exit (a command killed by a signal shows as 128 + signo through sh). */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char args[2048], cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof cmd, "%s >'%s' 2>'%s'", args, outf, errf);
	int st = system(cmd);
	test_slurp(outf, out, sizeof out);
	test_slurp(errf, err, sizeof err);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A k = 16 model of 3000 users and 500 items: data.mdb spans about 60 pages. */
static int fixture(void)
{
	mfs_model_conf_t c = {16, 0.1, 5};
	mfs_model_t *m;
	char e[512];
	if (mfs_model_init(&c, &m))
		return -1;
	uint32_t row;
	for (uint64_t i = 0; i < 3000; i++) {
		mfs_id_t id = mfs_id_u64(i);
		mfs_model_user_row(m, &id, &row);
		if (i < 500)
			mfs_model_item_row(m, &id, &row);
	}
	for (uint32_t r = 0; r < m->n_users; r++)
		for (int j = 0; j < 16; j++)
			m->P[(size_t)r * 16 + j] = 0.01f * (float)((r + j) % 7);
	for (uint32_t r = 0; r < m->n_items; r++)
		for (int j = 0; j < 16; j++)
			m->Q[(size_t)r * 16 + j] = 0.02f * (float)((r * 3 + j) % 5);
	m->mu = 3.5;
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.01;
	in.last_loss = NAN;
	in.rating_min = 1.0;
	in.rating_max = 5.0;
	mfs_snap_writer_t *w;
	int rc = mfs_snap_writer_open(dir, 1 << 22, &w, e, sizeof e);
	if (rc == 0) {
		rc = mfs_snap_publish(w, m, &in, NULL, e, sizeof e);
		mfs_snap_writer_close(w);
	}
	if (rc)
		fprintf(stderr, "fixture: %s\n", e);
	mfs_model_free(m);
	return rc;
}

static int load_whole(void)
{
	FILE *f = fopen(data, "rb");
	struct stat st;
	if (!f || fstat(fileno(f), &st) != 0 || !(whole = malloc((size_t)st.st_size))) {
		if (f)
			fclose(f);
		return -1;
	}
	whole_len = fread(whole, 1, (size_t)st.st_size, f);
	fclose(f);
	return whole_len == (size_t)st.st_size ? 0 : -1;
}

/* LMDB's last page and page size for the published file (the writer may reserve disk beyond the
 * last page, so the file's length is not the header's). */
static int lmdb_need(void)
{
	MDB_env *env;
	MDB_envinfo ei;
	MDB_stat st;
	int rc = mdb_env_create(&env);
	if (rc)
		return rc;
	if ((rc = mdb_env_set_maxdbs(env, 4)) == 0 && (rc = mdb_env_open(env, dir, MDB_RDONLY, 0644)) == 0 &&
	    (rc = mdb_env_info(env, &ei)) == 0 && (rc = mdb_env_stat(env, &st)) == 0) {
		psize = st.ms_psize;
		need = ((size_t)ei.me_last_pgno + 1) * psize;
	}
	mdb_env_close(env);
	return rc;
}

/* data.mdb as published, then truncate(2) to len. */
static void cut_to(size_t len)
{
	TEST_OK(test_write_file(data, (const char *)whole, whole_len));
	TEST_OK(truncate(data, (off_t)len));
}

/* The cut sizes: half, one byte short of the last page, and inside the second meta page. */
static const size_t *cuts(size_t *n)
{
	static size_t c[3];
	c[0] = need / 2;
	c[1] = need - 1;
	c[2] = psize + 100;
	*n = 3;
	return c;
}

/* The message names the file and its size, and LMDB's size where the newest meta is readable. */
static void check_message(const char *msg, size_t len, int whole_known)
{
	char want[700];
	snprintf(want, sizeof want, "snapshot %s is truncated: %zu bytes, the header says ", data, len);
	TEST_ASSERT_MSG(strstr(msg, want) != NULL, "want \"%s\" in: %s", want, msg);
	if (whole_known) {
		snprintf(want, sizeof want, "the header says %zu (%zu pages of %zu bytes)", need, need / psize, psize);
		TEST_ASSERT_MSG(strstr(msg, want) != NULL, "want \"%s\" in: %s", want, msg);
	}
}

static void test_whole_file_opens(void)
{
	TEST_OK(test_write_file(data, (const char *)whole, whole_len));
	TEST_ASSERT_MSG(need >= 16 * psize && need <= whole_len, "data.mdb is %zu bytes, LMDB uses %zu", whole_len, need);
	mfs_snap_t *s = NULL;
	char e[1024] = "";
	TEST_OK(mfs_snap_open(dir, &s, e, sizeof e));
	mfs_snap_close(s);
	TEST_EQ_INT(run("'%s' inspect --snapshot '%s'", test_bin(), dir), 0);
}

static void test_libmfsnap(void)
{
	size_t n;
	const size_t *c = cuts(&n);
	for (size_t i = 0; i < n; i++) {
		cut_to(c[i]);
		/* in a child: a SIGBUS must show as a failed check, not end the test */
		int fds[2];
		TEST_OK(pipe(fds));
		pid_t pid = fork();
		if (pid == 0) {
			mfs_snap_t *s = NULL;
			char e[1024] = "";
			int rc = mfs_snap_open(dir, &s, e, sizeof e);
			ssize_t w = write(fds[1], e, strlen(e));
			(void)w;
			_exit(rc == MFS_EFORMAT ? 0 : rc == 0 ? 2 : 3);
		}
		close(fds[1]);
		char msg[1024];
		ssize_t got = read(fds[0], msg, sizeof msg - 1);
		msg[got > 0 ? got : 0] = '\0';
		close(fds[0]);
		int st;
		TEST_ASSERT(waitpid(pid, &st, 0) == pid);
		TEST_ASSERT_MSG(!WIFSIGNALED(st), "cut at %zu: mfs_snap_open died of signal %d", c[i],
		                WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		TEST_ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "cut at %zu: not MFS_EFORMAT (%d): %s", c[i],
		                WIFEXITED(st) ? WEXITSTATUS(st) : -1, msg);
		check_message(msg, c[i], i < 2);
	}
}

static void test_cli(void)
{
	char pairs[700];
	snprintf(pairs, sizeof pairs, "%s.pairs", dir);
	TEST_OK(test_write_file(pairs, "1 2\n", 4));
	size_t n;
	const size_t *c = cuts(&n);
	for (size_t i = 0; i < n; i++) {
		cut_to(c[i]);
		/* exit 1 (a runtime error), not 128 + SIGBUS through the shell */
		TEST_EQ_INT(run("'%s' inspect --snapshot '%s'", test_bin(), dir), 1);
		check_message(err, c[i], i < 2);
		TEST_EQ_INT(run("'%s' query --snapshot '%s' --user 1 --top 3", test_bin(), dir), 1);
		check_message(err, c[i], i < 2);
		TEST_EQ_INT(run("'%s' predict --snapshot '%s' --pairs '%s'", test_bin(), dir, pairs), 1);
		check_message(err, c[i], i < 2);
		/* serve resumes from it through snap_load.c: the same refusal before it maps anything */
		TEST_EQ_INT(run("'%s' serve --embedded-broker --topic t --snapshot '%s' --metrics.listen ''", test_bin(), dir), 1);
		check_message(err, c[i], i < 2);
	}
	unlink(pairs);
}

static void test_python(void)
{
	size_t n;
	const size_t *c = cuts(&n);
	for (size_t i = 0; i < n; i++) {
		cut_to(c[i]);
		/* the CLI: one line on stderr, exit 1, no traceback */
		TEST_EQ_INT(run(PY " '%s' '%s' --user 1 --top 3", script, dir), 1);
		TEST_ASSERT_MSG(strstr(err, "Traceback") == NULL, "%s", err);
		char *nl = strchr(err, '\n');
		TEST_ASSERT_MSG(nl && nl[1] == '\0' && strncmp(err, "mfsnap: ", 8) == 0, "not one line: %s", err);
		check_message(err, c[i], i < 2);
		/* the library: its own exception type, a SnapshotError */
		TEST_EQ_INT(run(PY " -c 'import os, sys; sys.path.insert(0, os.path.dirname(sys.argv[1])); import mfsnap\n"
		                "try:\n    mfsnap.Snapshot(sys.argv[2])\n"
		                "except mfsnap.SnapshotTruncatedError as e:\n"
		                "    print(isinstance(e, mfsnap.SnapshotError), e)' '%s' '%s'",
		                script, dir),
		            0);
		TEST_ASSERT_MSG(strncmp(out, "True snapshot ", 14) == 0, "stdout: %s stderr: %s", out, err);
		check_message(out, c[i], i < 2);
	}
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s (set MFS_BIN)", test_bin());
	const char *src = getenv("MFS_SRC_DIR");
	snprintf(script, sizeof script, "%s/snapshots/reader/python/mfsnap.py", src && *src ? src : ".");
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	snprintf(data, sizeof data, "%s/data.mdb", dir);
	snprintf(outf, sizeof outf, "%s.out", dir);
	snprintf(errf, sizeof errf, "%s.err", dir);
	if (fixture() != 0 || load_whole() != 0 || lmdb_need() != 0)
		return 1;
	TEST_RUN(test_whole_file_opens);
	TEST_RUN(test_libmfsnap);
	TEST_RUN(test_cli);
	int python = system(PY " -c 'import lmdb, numpy' >/dev/null 2>&1") == 0;
	if (python)
		TEST_RUN(test_python);
	free(whole);
	char cmd[2000];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s'", dir, outf, errf);
	if (system(cmd) != 0)
		fprintf(stderr, "cleanup failed\n");
	int rc = TEST_REPORT();
	if (rc == 0 && !python)
		TEST_SKIP("the C reader and the CLI passed; %s has no lmdb or numpy, so mfsnap.py was not checked", PY);
	return rc;
}
