/* test_reader_topk_python.c - top-K with exclude lists: the Python reader (mfsnap.py, numpy
 * candidates + exact rescoring), libmfsnap (int8 scan + exact rescoring) and the two CLIs
 * (`mfstream query --top K --exclude ...`, `mfsnap.py --top K --exclude ...`) give the same
 * items in the same order with the same float32 scores; and a Python process that keeps
 * its Snapshot open follows a new snapshot (its item cache is keyed by seq).
 *
 * The fixture has u64 and string ids, more items than K = 1000, and rows that are reversed
 * copies of their neighbour: for user 7, whose factors are all equal, such a pair has the
 * same exact score (a tie, broken by the key) but float32 dot products that differ by
 * rounding - an answer built on the approximate scores alone gets those cuts wrong.
 * Skips (77) when /usr/bin/python3 lacks lmdb or numpy.
 */
#include <stdint.h>
#include <sys/wait.h>

#include "common/err.h"
#include "common/log.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"

#define PY "/usr/bin/python3"
#define K 16
#define N_ITEMS 3000
#define N_USERS 8

static char pydir[1024], script[1100], errbuf[1024];
static char dir[512];

static uint64_t rng = 0x853c49e6748fea9bull;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static float rand_unit(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static int publish(const mfs_model_t *m, const uint32_t *item_rows, size_t n_item_rows)
{
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.01;
	in.last_loss = NAN;
	in.rating_min = 1.0;
	in.rating_max = 5.0;
	if (item_rows) {
		in.item_rows = item_rows;
		in.n_item_rows = n_item_rows;
		in.user_rows = item_rows;
		in.n_user_rows = 0;
	}
	mfs_snap_writer_t *w;
	int rc = mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf);
	if (rc == 0) {
		rc = mfs_snap_publish(w, m, &in, NULL, errbuf, sizeof errbuf);
		mfs_snap_writer_close(w);
	}
	if (rc)
		fprintf(stderr, "publish: %s\n", errbuf);
	return rc;
}

static mfs_model_t *fixture(void)
{
	mfs_model_conf_t c = {K, 0.1, 5};
	mfs_model_t *m;
	if (mfs_model_init(&c, &m))
		return NULL;
	m->mu = 3.25;
	uint32_t row;
	char buf[32];
	for (uint64_t u = 0; u < N_USERS; u++) {
		mfs_id_t id = mfs_id_u64(u);
		mfs_model_user_row(m, &id, &row);
	}
	for (uint32_t i = 0; i < N_ITEMS; i++) {
		mfs_id_t id = mfs_id_u64(3 * (uint64_t)i);
		if (i % 7 == 0) {
			snprintf(buf, sizeof buf, "it,%u", i); /* a comma: not nameable in --exclude */
			if (i % 14 == 0)
				snprintf(buf, sizeof buf, "it-%u", i);
			id = (mfs_id_t){MFS_ID_STR, (uint16_t)strlen(buf), 0, buf};
		}
		mfs_model_item_row(m, &id, &row);
	}
	for (size_t j = 0; j < (size_t)N_USERS * K; j++)
		m->P[j] = rand_unit();
	for (uint32_t r = 0; r < N_USERS; r++)
		m->bu[r] = rand_unit() * 0.5f;
	for (int j = 0; j < K; j++)
		m->P[7 * K + j] = 0.375f;
	for (uint32_t i = 0; i < N_ITEMS; i++) {
		/* every 5th row is the one before it reversed (see above) */
		if (i % 5 == 4) {
			for (int j = 0; j < K; j++)
				m->Q[(size_t)i * K + j] = m->Q[(size_t)(i - 1) * K + (K - 1 - j)];
			m->bi[i] = m->bi[i - 1];
			continue;
		}
		for (int j = 0; j < K; j++)
			m->Q[(size_t)i * K + j] = rand_unit();
		m->bi[i] = rand_unit() * 0.5f;
	}
	if (publish(m, NULL, 0)) {
		mfs_model_free(m);
		return NULL;
	}
	return m;
}

/* ---- queries ----------------------------------------------------------------------------- */
struct query {
	char user[32];
	size_t k;
	char exclude[2048]; /* comma-separated ids (text form); "" = none */
};

#define N_QUERIES 40
static struct query queries[N_QUERIES];

static void id_text(const mfs_snap_hit_t *h, char *buf, size_t size)
{
	if (h->kind == MFS_SNAP_ID_U64)
		snprintf(buf, size, "%llu", (unsigned long long)h->num);
	else
		snprintf(buf, size, "%s%s", mfs_snap_str_needs_prefix(h->str, h->len) ? "str:" : "", h->str);
}

/* K in {1, 10, 100, 1000, > n}, with no excludes, random ones (with repeats and unknown ids),
 * and the user's own best five. */
static void make_queries(mfs_snap_t *s)
{
	static const size_t ks[] = {1, 10, 100, 1000, N_ITEMS + 5};
	for (int q = 0; q < N_QUERIES; q++) {
		struct query *Q = &queries[q];
		snprintf(Q->user, sizeof Q->user, "%d", q % N_USERS);
		Q->k = ks[q % 5];
		Q->exclude[0] = '\0';
		int mode = (q / 5) % 3;
		if (mode == 1) {
			for (int x = 0; x < 60; x++) {
				uint64_t v = rnd() % (3 * N_ITEMS + 10); /* not multiples of 3: unknown */
				snprintf(Q->exclude + strlen(Q->exclude), sizeof Q->exclude - strlen(Q->exclude), "%s%llu",
				         x ? "," : "", (unsigned long long)v);
			}
			strcat(Q->exclude, ",it-14,it-14,str:nobody");
		} else if (mode == 2) {
			mfs_snap_id_t uid;
			mfs_snap_hit_t hits[8];
			size_t n = 0;
			mfs_snap_id_parse(Q->user, &uid);
			if (mfs_snap_topk(s, &uid, 8, hits, &n) == 0)
				for (size_t h = 0, w = 0; h < n && w < 5; h++) {
					char t[300];
					id_text(&hits[h], t, sizeof t);
					if (strchr(t, ','))
						continue;
					snprintf(Q->exclude + strlen(Q->exclude), sizeof Q->exclude - strlen(Q->exclude), "%s%s",
					         w++ ? "," : "", t);
				}
		}
	}
}

/* libmfsnap's answer to query q as "id score-hex" lines (in out, NUL-separated lines). */
static size_t c_answer(mfs_snap_t *s, const struct query *Q, char (*lines)[320], size_t cap)
{
	mfs_snap_id_t uid, ex[128];
	char buf[sizeof Q->exclude];
	size_t nx = 0;
	mfs_snap_id_parse(Q->user, &uid);
	snprintf(buf, sizeof buf, "%s", Q->exclude);
	for (char *tok = strtok(buf, ","); tok && nx < 128; tok = strtok(NULL, ","))
		if (mfs_snap_id_parse(tok, &ex[nx]) == 0)
			nx++;
	/* ex[] points into buf: the ids must be used before buf goes */
	mfs_snap_hit_t *hits = calloc(Q->k, sizeof *hits);
	size_t n = 0;
	mfs_snap_topk_opts_t o = {ex, nx, 0};
	int rc = mfs_snap_topk_ex(s, &uid, Q->k, &o, hits, &n, NULL);
	TEST_OK(rc);
	size_t w = 0;
	for (size_t h = 0; h < n && w < cap; h++, w++) {
		char t[300];
		id_text(&hits[h], t, sizeof t);
		snprintf(lines[w], sizeof lines[w], "%s %a", t, (double)hits[h].score);
	}
	free(hits);
	return w;
}

/* Python's answers: one "id float.hex" line per hit, "--" after each query. The script
 * reads the queries from qfile; with wait_seq it answers, prints "== <seq>", waits until
 * the snapshot's seq reaches wait_seq, and answers again. */
static FILE *py_start(const char *qfile, int wait_seq)
{
	char cmd[4096];
	snprintf(cmd, sizeof cmd,
	         PY " -c 'import sys, time; sys.path.insert(0, \"%s\"); import mfsnap\n"
	            "s = mfsnap.Snapshot(sys.argv[1]); W = int(sys.argv[3])\n"
	            "qs = [l.rstrip(\"\\n\").split(\"\\t\") for l in open(sys.argv[2], encoding=\"utf-8\")]\n"
	            "def answer():\n"
	            "    for u, k, ex in qs:\n"
	            "        for i, sc in s.topk(u, int(k), [x for x in ex.split(\",\") if x]):\n"
	            "            print(mfsnap.format_id(i), float.hex(sc))\n"
	            "        print(\"--\")\n"
	            "answer(); print(\"==\", s.staleness()[0], flush=True)\n"
	            "if W:\n"
	            "    t0 = time.time()\n"
	            "    while s.staleness()[0] < W and time.time() - t0 < %.0f: time.sleep(0.01)\n"
	            "    answer(); print(\"==\", s.staleness()[0], flush=True)' '%s' '%s' %d",
	         pydir, test_seconds(60), dir, qfile, wait_seq);
	return popen(cmd, "r");
}

/* Read one round of Python answers and compare with libmfsnap's. @return mismatches. */
static long compare_round(FILE *p, mfs_snap_t *s, uint64_t *py_seq)
{
	static char want[N_ITEMS + 8][320];
	char line[512];
	long bad = 0;
	for (int q = 0; q < N_QUERIES; q++) {
		size_t nw = c_answer(s, &queries[q], want, N_ITEMS + 8), got = 0;
		while (fgets(line, sizeof line, p)) {
			line[strcspn(line, "\n")] = '\0';
			if (strcmp(line, "--") == 0)
				break;
			/* "id hex": the id may hold spaces, the score is the last field */
			char *sp = strrchr(line, ' ');
			if (!sp) {
				bad++;
				continue;
			}
			*sp = '\0';
			float f = (float)strtod(sp + 1, NULL);
			char mine[320];
			snprintf(mine, sizeof mine, "%s %a", line, (double)f);
			if (got >= nw || strcmp(mine, want[got]) != 0) {
				if (bad < 5)
					fprintf(stderr, "  query %d (user %s, K %zu, exclude \"%.40s\"): rank %zu: python \"%s\", C \"%s\"\n",
					        q, queries[q].user, queries[q].k, queries[q].exclude, got, mine, got < nw ? want[got] : "-");
				bad++;
			}
			got++;
		}
		if (got != nw) {
			fprintf(stderr, "  query %d: python %zu hits, C %zu\n", q, got, nw);
			bad++;
		}
	}
	*py_seq = 0;
	if (fgets(line, sizeof line, p) && strncmp(line, "== ", 3) == 0)
		*py_seq = strtoull(line + 3, NULL, 10);
	return bad;
}

static void write_queries(const char *qfile)
{
	FILE *f = fopen(qfile, "w");
	for (int q = 0; f && q < N_QUERIES; q++)
		fprintf(f, "%s\t%zu\t%s\n", queries[q].user, queries[q].k, queries[q].exclude);
	if (f)
		fclose(f);
}

/* ---- tests ------------------------------------------------------------------------------------ */
static void test_python_matches_c_and_follows(void)
{
	mfs_model_t *m = fixture();
	TEST_ASSERT(m != NULL);
	if (!m)
		return;
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	make_queries(s);
	char qfile[600];
	snprintf(qfile, sizeof qfile, "%s/queries.tsv", dir);
	write_queries(qfile);
	FILE *p = py_start(qfile, 2);
	TEST_ASSERT(p != NULL);
	if (!p)
		return;
	uint64_t py_seq = 0;
	TEST_EQ_INT(compare_round(p, s, &py_seq), 0);
	TEST_EQ_INT(py_seq, 1);

	/* snapshot 2 rewrites 100 items (one jumps to the top for everyone); Python, still
	 * running with its cache of snapshot 1, must notice and answer from snapshot 2 */
	uint32_t rows[100];
	for (uint32_t t = 0; t < 100; t++) {
		rows[t] = (uint32_t)(rnd() % N_ITEMS);
		for (int j = 0; j < K; j++)
			m->Q[(size_t)rows[t] * K + j] = rand_unit();
	}
	m->bi[rows[0]] = 100.0f;
	fflush(NULL);
	pid_t pid = fork(); /* this process has a reader open: publish from another one */
	if (pid == 0)
		_exit(publish(m, rows, 100) ? 1 : 0);
	int st = 0;
	TEST_ASSERT(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	mfs_snap_hit_t top;
	size_t n = 0;
	mfs_snap_id_t u0 = {MFS_SNAP_ID_U64, 0, NULL, 0};
	TEST_OK(mfs_snap_topk(s, &u0, 1, &top, &n));
	mfs_id_t moved = mfs_idmap_key(m->items, rows[0]);
	int same_id = moved.kind == MFS_ID_U64 ? top.kind == MFS_SNAP_ID_U64 && top.num == moved.num
	                                       : top.kind == MFS_SNAP_ID_STR && top.len == moved.len &&
	                                             memcmp(top.str, moved.str, moved.len) == 0;
	TEST_ASSERT_MSG(n == 1 && top.score > 50.0f && same_id, "C sees snapshot 2");
	TEST_EQ_INT(compare_round(p, s, &py_seq), 0);
	TEST_EQ_INT(py_seq, 2);
	TEST_EQ_INT(pclose(p), 0);
	mfs_snap_close(s);
	mfs_model_free(m);
}

/* `mfstream query --top K --exclude` and `mfsnap.py --top K --exclude` print the same lines. */
static void test_clis_agree(void)
{
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	long bad = 0;
	for (int q = 0; q < N_QUERIES; q += 3) {
		char cmd[8192], a[1 << 16], b[1 << 16];
		const struct query *Q = &queries[q];
		size_t k = Q->k > 1000 ? 1000 : Q->k; /* the C CLI's limit */
		char exarg[sizeof Q->exclude + 16] = "";
		if (Q->exclude[0])
			snprintf(exarg, sizeof exarg, "--exclude '%s'", Q->exclude);
		snprintf(cmd, sizeof cmd, "'%s' query --snapshot '%s' --user %s --top %zu %s", test_bin(), dir, Q->user, k,
		         exarg);
		FILE *f = popen(cmd, "r");
		size_t na = f ? fread(a, 1, sizeof a - 1, f) : 0;
		a[na] = '\0';
		int sa = f ? pclose(f) : -1;
		snprintf(cmd, sizeof cmd, PY " '%s' '%s' --user %s --top %zu %s", script, dir, Q->user, k, exarg);
		f = popen(cmd, "r");
		size_t nb = f ? fread(b, 1, sizeof b - 1, f) : 0;
		b[nb] = '\0';
		int sb = f ? pclose(f) : -1;
		/* and the library's own count */
		static char want[N_ITEMS + 8][320];
		struct query Qk = *Q;
		Qk.k = k;
		size_t nw = c_answer(s, &Qk, want, N_ITEMS + 8), lines = 0;
		for (const char *c = a; *c; c++)
			lines += *c == '\n';
		if (sa != 0 || sb != 0 || strcmp(a, b) != 0 || lines != nw) {
			fprintf(stderr, "  query %d: exit %d / %d, %zu lines (want %zu), outputs %s\n", q, sa, sb, lines, nw,
			        strcmp(a, b) ? "differ" : "agree");
			bad++;
		}
	}
	TEST_EQ_INT(bad, 0);
	mfs_snap_close(s);
}

/* --exclude: usage errors exit 2; empty list items are skipped. */
static void test_cli_exclude_usage(void)
{
	char cmd[4096], a[4096], b[4096];
	snprintf(cmd, sizeof cmd, "'%s' query --snapshot '%s' --user 0 --exclude 3 2>/dev/null", test_bin(), dir);
	TEST_EQ_INT(WEXITSTATUS(system(cmd)), 2); /* no --top */
	char big[300];
	memset(big, 'x', 257);
	big[257] = '\0';
	snprintf(cmd, sizeof cmd, "'%s' query --snapshot '%s' --user 0 --top 3 --exclude 3,%s 2>/dev/null", test_bin(),
	         dir, big);
	TEST_EQ_INT(WEXITSTATUS(system(cmd)), 2); /* an id of 257 bytes */
	snprintf(cmd, sizeof cmd, "'%s' query --snapshot '%s' --user 0 --top 5 --exclude ,,", test_bin(), dir);
	FILE *f = popen(cmd, "r");
	size_t na = f ? fread(a, 1, sizeof a - 1, f) : 0;
	a[na] = '\0';
	TEST_ASSERT(f && pclose(f) == 0);
	snprintf(cmd, sizeof cmd, "'%s' query --snapshot '%s' --user 0 --top 5", test_bin(), dir);
	f = popen(cmd, "r");
	size_t nb = f ? fread(b, 1, sizeof b - 1, f) : 0;
	b[nb] = '\0';
	TEST_ASSERT(f && pclose(f) == 0);
	TEST_ASSERT_MSG(na > 0 && strcmp(a, b) == 0, "\"%s\" vs \"%s\"", a, b);
	/* excluding the best item shifts the list by one (an id without a comma, so that
	 * --exclude can name it: true of this fixture, and checked) */
	char first[300] = "";
	sscanf(b, "%299s", first);
	TEST_ASSERT(first[0] && !strchr(first, ','));
	snprintf(cmd, sizeof cmd, "'%s' query --snapshot '%s' --user 0 --top 4 --exclude '%s'", test_bin(), dir, first);
	f = popen(cmd, "r");
	na = f ? fread(a, 1, sizeof a - 1, f) : 0;
	a[na] = '\0';
	TEST_ASSERT(f && pclose(f) == 0);
	const char *rest = strchr(b, '\n');
	TEST_ASSERT_MSG(rest && strcmp(a, rest + 1) == 0, "\"%s\" vs the tail of \"%s\"", a, b);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	if (system(PY " -c 'import lmdb, numpy' >/dev/null 2>&1") != 0)
		TEST_SKIP("%s", PY " has no lmdb or numpy (apt install python3-lmdb python3-numpy)");
	const char *src = getenv("MFS_SRC_DIR");
	snprintf(pydir, sizeof pydir, "%s/snapshots/reader/python", src && *src ? src : ".");
	snprintf(script, sizeof script, "%s/mfsnap.py", pydir);
	if (access(script, R_OK) != 0)
		TEST_SKIP("%s not found", script);
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s (set MFS_BIN)", test_bin());
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	TEST_RUN(test_python_matches_c_and_follows);
	TEST_RUN(test_clis_agree);
	TEST_RUN(test_cli_exclude_usage);
	char cmd[700];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return TEST_REPORT();
}
