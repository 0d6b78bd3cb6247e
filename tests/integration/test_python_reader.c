/* test_python_reader.c - the Python reader (snapshots/reader/python/mfsnap.py) agrees with
 * libmfsnap bit for bit on a snapshot written by the C writer.
 *
 * Two fixtures: one with random float bit patterns (any exponent, -0, subnormals) for the
 * row round trip (`mfsnap.py --dump` prints float32 bits), one with moderate values for
 * predict and top-K, where both readers must produce the same float32 (they sum in the same
 * order, see mfsnap.py). Skips (77) when /usr/bin/python3 lacks lmdb or numpy.
 */
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "model_store/store.h"
#include "snapshots/reader/mfs_snap.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_writer.h"
#include "testhelp.h"

#define PY "/usr/bin/python3"
#define K 8

static char script[1024], pydir[1024];
static char errbuf[1024];

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static float rand_bits(void)
{
	for (;;) {
		uint32_t b = (uint32_t)rnd();
		float f;
		memcpy(&f, &b, 4);
		if (isfinite(f))
			return f;
	}
}

static float rand_unit(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static char long_id[257];
static const char *str_ids[] = {"alice", "007", "42", "str:x", "bob smith", "caf\xc3\xa9", long_id};

static mfs_model_t *fixture(const char *dir, int random_bits)
{
	mfs_model_conf_t c = {K, 0.1, 3};
	mfs_model_t *m;
	if (mfs_model_init(&c, &m))
		return NULL;
	const uint64_t nums[] = {0, 1, 7, 42, 1000, UINT64_MAX, (uint64_t)1 << 40};
	uint32_t row;
	for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
		mfs_id_t id = mfs_id_u64(nums[i]);
		mfs_model_user_row(m, &id, &row);
		mfs_model_item_row(m, &id, &row);
	}
	for (size_t i = 0; i < sizeof str_ids / sizeof str_ids[0]; i++) {
		mfs_id_t id = {MFS_ID_STR, (uint16_t)strlen(str_ids[i]), 0, str_ids[i]};
		mfs_model_user_row(m, &id, &row);
		mfs_model_item_row(m, &id, &row);
	}
	for (uint64_t i = 0; i < 40; i++) { /* more items for top-K */
		mfs_id_t id = mfs_id_u64(5000 + i);
		mfs_model_item_row(m, &id, &row);
	}
	for (uint32_t r = 0; r < m->n_users; r++) {
		m->bu[r] = random_bits ? rand_bits() : rand_unit() * 0.5f;
		for (int j = 0; j < K; j++)
			m->P[(size_t)r * K + j] = random_bits ? rand_bits() : rand_unit();
	}
	for (uint32_t r = 0; r < m->n_items; r++) {
		m->bi[r] = random_bits ? rand_bits() : rand_unit() * 0.5f;
		for (int j = 0; j < K; j++)
			m->Q[(size_t)r * K + j] = random_bits ? rand_bits() : rand_unit();
	}
	m->mu = 3.6071;
	m->events_applied = 987654321;
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.0125;
	in.last_loss = random_bits ? NAN : 0.8731;
	in.rating_min = 1.0;
	in.rating_max = 5.0;
	mfs_offset_t offs[] = {{"ratings", 0, 150}, {"ratings", 3, 9000000000LL}};
	in.offsets = offs;
	in.n_offsets = 2;
	mfs_snap_writer_t *w;
	if (mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf) ||
	    mfs_snap_publish(w, m, &in, NULL, errbuf, sizeof errbuf)) {
		fprintf(stderr, "fixture: %s\n", errbuf);
		mfs_model_free(m);
		return NULL;
	}
	mfs_snap_writer_close(w);
	return m;
}

/* Run a shell command, return its stdout lines (NULL-terminated, malloc'd) and exit status. */
static char **run_lines(const char *cmd, int *status, size_t *n_lines)
{
	FILE *p = popen(cmd, "r");
	char **lines = NULL;
	size_t n = 0, cap = 0;
	char *line = NULL;
	size_t lcap = 0;
	ssize_t len;
	if (!p) {
		*status = -1;
		return NULL;
	}
	while ((len = getline(&line, &lcap, p)) >= 0) {
		if (len > 0 && line[len - 1] == '\n')
			line[len - 1] = '\0';
		if (n + 2 > cap) {
			cap = cap ? 2 * cap : 64;
			lines = realloc(lines, cap * sizeof *lines);
		}
		lines[n++] = strdup(line);
		lines[n] = NULL;
	}
	free(line);
	int st = pclose(p);
	*status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	*n_lines = n;
	return lines;
}

static void free_lines(char **l)
{
	for (size_t i = 0; l && l[i]; i++)
		free(l[i]);
	free(l);
}

/* ---- rows, bit for bit ------------------------------------------------------------------- */
static void test_rows_bit_exact(void)
{
	char dir[512];
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	mfs_model_t *m = fixture(dir, 1);
	TEST_ASSERT(m != NULL);
	if (!m)
		return;
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	char cmd[2048];
	snprintf(cmd, sizeof cmd, PY " '%s' '%s' --dump", script, dir);
	int st;
	size_t n;
	char **lines = run_lines(cmd, &st, &n);
	TEST_EQ_INT(st, 0);
	TEST_EQ_INT(n, m->n_users + m->n_items);
	long bad = 0;
	for (size_t i = 0; lines && i < n; i++) {
		/* "<users|items> <id text, may hold spaces> <k+1 hex words>": parse from the right */
		char *l = lines[i];
		uint32_t bits[K + 1];
		char *end = l + strlen(l);
		int ok = 1;
		for (int t = K; t >= 0 && ok; t--) {
			char *sp = end - 9;
			ok = sp > l && *sp == ' ';
			if (ok) {
				bits[t] = (uint32_t)strtoul(sp + 1, NULL, 16);
				*sp = '\0';
				end = sp;
			}
		}
		char *sp = strchr(l, ' ');
		if (!ok || !sp) {
			bad++;
			continue;
		}
		*sp = '\0';
		mfs_snap_id_t id;
		float bias, vec[K];
		if (mfs_snap_id_parse(sp + 1, &id)) {
			bad++;
			continue;
		}
		int rc = strcmp(l, "users") == 0 ? mfs_snap_user(s, &id, &bias, vec) : mfs_snap_item(s, &id, &bias, vec);
		uint32_t want[K + 1];
		memcpy(want, &bias, 4);
		memcpy(want + 1, vec, sizeof vec);
		if (rc || memcmp(want, bits, sizeof want) != 0) {
			fprintf(stderr, "  row mismatch: %s %s (rc %d)\n", l, sp + 1, rc);
			bad++;
		}
	}
	TEST_EQ_INT(bad, 0);
	free_lines(lines);

	/* single lookups through the Python API and its id parsing: --user prints JSON, so ask
	 * for the float32 bits of one row with a -c snippet instead */
	const char *ids[] = {"0", "18446744073709551615", "007", "str:42", "str:str:x", "bob smith", long_id};
	for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
		snprintf(cmd, sizeof cmd,
		         PY " -c 'import sys, struct; sys.path.insert(0, \"%s\"); import mfsnap; "
		            "b, v = mfsnap.Snapshot(sys.argv[1]).user(sys.argv[2]); "
		            "print(\" \".join(\"%%08x\" %% struct.unpack(\"<I\", struct.pack(\"<f\", x))[0] "
		            "for x in [b] + v.tolist()))' '%s' '%s'",
		         pydir, dir, ids[i]);
		lines = run_lines(cmd, &st, &n);
		mfs_snap_id_t id;
		float bias, vec[K];
		uint32_t want[K + 1];
		char hex[16 * (K + 1)] = "";
		TEST_OK(mfs_snap_id_parse(ids[i], &id));
		TEST_OK(mfs_snap_user(s, &id, &bias, vec));
		memcpy(want, &bias, 4);
		memcpy(want + 1, vec, sizeof vec);
		for (int t = 0; t <= K; t++)
			snprintf(hex + strlen(hex), sizeof hex - strlen(hex), "%s%08x", t ? " " : "", want[t]);
		TEST_ASSERT_MSG(st == 0 && n == 1 && strcmp(lines[0], hex) == 0, "id %s: python %s, C %s",
		                ids[i], n ? lines[0] : "(nothing)", hex);
		free_lines(lines);
	}
	mfs_snap_close(s);
	mfs_model_free(m);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	TEST_OK(system(cmd));
}

/* ---- meta, predict, top-K ---------------------------------------------------------------------- */
static void test_meta_predict_topk(void)
{
	char dir[512], pairs[600], cmd[4096];
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	mfs_model_t *m = fixture(dir, 0);
	TEST_ASSERT(m != NULL);
	if (!m)
		return;
	mfs_snap_t *s = NULL;
	TEST_OK(mfs_snap_open(dir, &s, errbuf, sizeof errbuf));
	if (!s)
		return;
	mfs_snap_meta_t meta;
	TEST_OK(mfs_snap_get_meta(s, &meta));

	/* meta: "key=repr(value)" lines; repr round-trips doubles exactly */
	snprintf(cmd, sizeof cmd,
	         PY " -c 'import sys; sys.path.insert(0, \"%s\"); import mfsnap; "
	            "[print(\"%%s=%%r\" %% kv) for kv in sorted(mfsnap.Snapshot(sys.argv[1]).meta().items())]' '%s'",
	         pydir, dir);
	int st;
	size_t n;
	char **lines = run_lines(cmd, &st, &n);
	TEST_EQ_INT(st, 0);
	TEST_EQ_INT(n, 15); /* 13 fixed keys + 2 offsets */
	int seen = 0;
	for (size_t i = 0; lines && i < n; i++) {
		char *eq = strchr(lines[i], '=');
		if (!eq)
			continue;
		*eq = '\0';
		const char *k = lines[i], *v = eq + 1;
		double d = strtod(v, NULL);
		unsigned long long u = strtoull(v, NULL, 10);
#define META_IS(key, cond)                                                          \
	if (strcmp(k, key) == 0) {                                                      \
		TEST_ASSERT_MSG(cond, "%s: python %s", key, v);                             \
		seen++;                                                                     \
	}
		META_IS("format_version", u == meta.format_version)
		META_IS("k", u == meta.k)
		META_IS("dtype", strcmp(v, "'f32'") == 0)
		META_IS("mu", d == meta.mu)
		META_IS("n_users", u == meta.n_users)
		META_IS("n_items", u == meta.n_items)
		META_IS("seq", u == meta.seq)
		META_IS("wall_time_ms", (long long)u == meta.wall_time_ms)
		META_IS("events_applied", u == meta.events_applied)
		META_IS("learning_rate", d == meta.learning_rate)
		META_IS("last_loss", d == meta.last_loss)
		META_IS("rating_min", d == meta.rating_min)
		META_IS("rating_max", d == meta.rating_max)
		META_IS("offset/ratings/0", u == 150)
		META_IS("offset/ratings/3", u == 9000000000ULL)
#undef META_IS
	}
	TEST_EQ_INT(seen, 15);
	free_lines(lines);

	/* predict: every (user, item) pair plus unknown ids, through Snapshot.predict */
	const char *users[] = {"0", "7", "alice", "007", "str:42", "bob smith", "nobody", "99"};
	const char *items[] = {"1", "42", "5003", "caf\xc3\xa9", "str:x", "str:42", "nothing", "12"};
	snprintf(pairs, sizeof pairs, "%s/pairs.txt", dir);
	FILE *f = fopen(pairs, "w");
	for (size_t u = 0; u < 8; u++)
		for (size_t i = 0; i < 8; i++)
			fprintf(f, "%s\t%s\n", users[u], items[i]);
	fclose(f);
	snprintf(cmd, sizeof cmd,
	         PY " -c 'import sys; sys.path.insert(0, \"%s\"); import mfsnap; s = mfsnap.Snapshot(sys.argv[1])\n"
	            "for line in open(sys.argv[2], encoding=\"utf-8\"):\n"
	            "    u, i = line.rstrip(\"\\n\").split(\"\\t\"); kn = []\n"
	            "    r = s.predict(u, i, kn); print(float.hex(r), int(kn[0]) | 2 * int(kn[1]))' '%s' '%s'",
	         pydir, dir, pairs);
	lines = run_lines(cmd, &st, &n);
	TEST_EQ_INT(st, 0);
	TEST_EQ_INT(n, 64);
	long bad = 0, fallbacks = 0;
	for (size_t p = 0; lines && p < n && p < 64; p++) {
		mfs_snap_id_t uid, iid;
		float r;
		int known;
		mfs_snap_id_parse(users[p / 8], &uid);
		mfs_snap_id_parse(items[p % 8], &iid);
		TEST_OK(mfs_snap_predict(s, &uid, &iid, &r, &known));
		char *sp = strchr(lines[p], ' ');
		float pr = (float)strtod(lines[p], NULL);
		if (!sp || memcmp(&pr, &r, 4) != 0 || atoi(sp + 1) != known) {
			fprintf(stderr, "  predict %s %s: python %s, C %a known %d\n", users[p / 8], items[p % 8],
			        lines[p], (double)r, known);
			bad++;
		}
		fallbacks += known != 3;
	}
	TEST_EQ_INT(bad, 0);
	TEST_ASSERT(fallbacks > 0);
	free_lines(lines);

	/* top-K through the CLI: "item score" lines, score %.9g (round-trips float32) */
	const size_t ks[] = {1, 5, 100};
	for (size_t t = 0; t < 3; t++) {
		for (size_t u = 0; u < 6; u++) {
			snprintf(cmd, sizeof cmd, PY " '%s' '%s' --user '%s' --top %zu", script, dir, users[u], ks[t]);
			lines = run_lines(cmd, &st, &n);
			mfs_snap_id_t uid;
			mfs_snap_hit_t hits[100];
			size_t nh = 0;
			mfs_snap_id_parse(users[u], &uid);
			TEST_OK(mfs_snap_topk(s, &uid, ks[t], hits, &nh));
			TEST_ASSERT_MSG(st == 0 && n == nh, "user %s top %zu: %zu lines vs %zu hits", users[u], ks[t], n, nh);
			for (size_t h = 0; lines && h < n && h < nh; h++) {
				char want[300];
				if (hits[h].kind == MFS_SNAP_ID_U64)
					snprintf(want, sizeof want, "%llu %.9g", (unsigned long long)hits[h].num,
					         (double)hits[h].score);
				else
					snprintf(want, sizeof want, "%s%s %.9g",
					         mfs_snap_str_needs_prefix(hits[h].str, hits[h].len) ? "str:" : "", hits[h].str,
					         (double)hits[h].score);
				TEST_ASSERT_MSG(strcmp(lines[h], want) == 0, "user %s rank %zu: python \"%s\", C \"%s\"",
				                users[u], h, lines[h], want);
			}
			free_lines(lines);
		}
	}
	/* unknown user: exit 1 and a message */
	snprintf(cmd, sizeof cmd, PY " '%s' '%s' --user nobody --top 3 2>/dev/null", script, dir);
	lines = run_lines(cmd, &st, &n);
	TEST_EQ_INT(st, 1);
	free_lines(lines);
	mfs_snap_close(s);
	mfs_model_free(m);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	TEST_OK(system(cmd));
}

/* ---- the Python reader follows a growing map ------------------------------------------------- */
/* Snapshot s: every value is s (mu, biases, factors), users_for(s) users, items_for(s) items;
 * the rows outgrow the 1 MiB starting map. The Python process opens at s = 1 and reads until
 * it has seen the last snapshot, checking that each call sees one s. */
#define GROW_S 60
static uint32_t users_for(uint64_t s) { return (uint32_t)(50 + 200 * s); }
static uint32_t items_for(uint64_t s) { return (uint32_t)(100 + 300 * s); }

static int publish_uniform(mfs_snap_writer_t *w, mfs_model_t *m, uint64_t s)
{
	uint32_t row;
	while (m->n_users < users_for(s)) {
		mfs_id_t id = mfs_id_u64(m->n_users);
		if (mfs_model_user_row(m, &id, &row))
			return -1;
	}
	while (m->n_items < items_for(s)) {
		mfs_id_t id = mfs_id_u64(m->n_items);
		if (mfs_model_item_row(m, &id, &row))
			return -1;
	}
	for (size_t j = 0; j < (size_t)m->n_users * K; j++)
		m->P[j] = (float)s;
	for (size_t j = 0; j < (size_t)m->n_items * K; j++)
		m->Q[j] = (float)s;
	for (uint32_t r = 0; r < m->n_users; r++)
		m->bu[r] = (float)s;
	for (uint32_t r = 0; r < m->n_items; r++)
		m->bi[r] = (float)s;
	m->mu = (double)s;
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.01;
	in.last_loss = NAN;
	in.rating_min = -1e30;
	in.rating_max = 1e30;
	uint64_t seq = 0;
	int rc = mfs_snap_publish(w, m, &in, &seq, errbuf, sizeof errbuf);
	return rc ? rc : seq == s ? 0 : -1;
}

static void test_python_follows_growth(void)
{
	char dir[512], cmd[4096];
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	mfs_model_conf_t c = {K, 0.1, 3};
	mfs_model_t *m;
	mfs_snap_writer_t *w;
	TEST_OK(mfs_model_init(&c, &m));
	TEST_OK(mfs_snap_writer_open(dir, 1 << 20, &w, errbuf, sizeof errbuf));
	TEST_OK(publish_uniform(w, m, 1));
	snprintf(cmd, sizeof cmd,
	         PY " -c 'import sys, time; sys.path.insert(0, \"%s\"); import mfsnap\n"
	            "s = mfsnap.Snapshot(sys.argv[1]); S = int(sys.argv[2]); K = %d\n"
	            "print(\"ready\", flush=True)\n"
	            "reads = bad = 0; last = 0; seen = set(); t0 = time.time()\n"
	            "while last < S and time.time() - t0 < %.0f:\n"
	            "    m = s.meta(); q = m[\"seq\"]\n"
	            "    bad += m[\"mu\"] != q or m[\"n_items\"] != 100 + 300 * q or m[\"n_users\"] != 50 + 200 * q\n"
	            "    b, v = s.user(0); bad += any(x != b for x in v.tolist())\n"
	            "    top = s.topk(0, 10 ** 6); t = top[0][1]\n"
	            "    bad += any(x[1] != t for x in top)\n"
	            "    r = [x for x in range(1, S + 1) if 3 * x + K * x * x == t]\n"
	            "    bad += not r or len(top) != 100 + 300 * r[0] or r[0] < max(last, q, int(b))\n"
	            "    last = max(last, q, int(b), r[0] if r else 0); seen.add(q); reads += 1\n"
	            "print(\"done\", reads, last, bad, len(seen), flush=True)' '%s' %d",
	         pydir, K, test_seconds(60), dir, GROW_S);
	FILE *p = popen(cmd, "r");
	TEST_ASSERT(p != NULL);
	if (!p)
		return;
	char line[256] = "";
	TEST_ASSERT(fgets(line, sizeof line, p) && strncmp(line, "ready", 5) == 0);
	for (uint64_t s = 2; s <= GROW_S; s++) {
		TEST_OK(publish_uniform(w, m, s));
		struct timespec ts = {0, 3000000}; /* let the reader see many of them */
		nanosleep(&ts, NULL);
	}
	long reads = 0, bad = -1, distinct = 0;
	unsigned long long last = 0;
	TEST_ASSERT(fgets(line, sizeof line, p) != NULL);
	TEST_ASSERT_MSG(sscanf(line, "done %ld %llu %ld %ld", &reads, &last, &bad, &distinct) == 4, "python: %s", line);
	TEST_EQ_INT(pclose(p), 0);
	TEST_EQ_INT(bad, 0);
	TEST_EQ_INT(last, GROW_S);
	TEST_ASSERT_MSG(distinct >= 2, "python saw %ld snapshots in %ld reads", distinct, reads);
	char path[600];
	struct stat st;
	snprintf(path, sizeof path, "%s/data.mdb", dir);
	TEST_ASSERT(stat(path, &st) == 0 && st.st_size > (1 << 20));
	fprintf(stderr, "  python: %ld reads, %ld distinct snapshots, data.mdb %lld bytes\n", reads, distinct,
	        (long long)st.st_size);
	mfs_snap_writer_close(w);
	mfs_model_free(m);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	TEST_OK(system(cmd));
}

static void test_no_snapshot(void)
{
	char dir[512], cmd[2048];
	snprintf(dir, sizeof dir, "%s", test_tmpdir());
	snprintf(cmd, sizeof cmd, PY " '%s' '%s' 2>&1", script, dir);
	int st;
	size_t n;
	char **lines = run_lines(cmd, &st, &n);
	TEST_EQ_INT(st, 1);
	TEST_ASSERT(n >= 1 && strstr(lines[0], "no snapshot") != NULL);
	free_lines(lines);
	rmdir(dir);
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
	for (int i = 0; i < 256; i += 2) { /* 256 bytes of UTF-8 */
		long_id[i] = (char)0xC3;
		long_id[i + 1] = (char)0xA9;
	}
	TEST_RUN(test_rows_bit_exact);
	TEST_RUN(test_meta_predict_topk);
	TEST_RUN(test_python_follows_growth);
	TEST_RUN(test_no_snapshot);
	return TEST_REPORT();
}
