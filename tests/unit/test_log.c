/* test_log.c - log lines: logfmt stays one line per record; JSON mode turns the logfmt pairs
 * of unchanged call sites into one strict JSON object per line (checked by a small strict
 * parser here and by Python's json module when /usr/bin/python3 exists); rate limiting prints
 * one line per interval and accounts for every suppressed call. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "common/log.h"
#include "config/config.h"
#include "testhelp.h"

/* ---- a strict parser for flat JSON objects -------------------------------------------- */
typedef struct jfield {
	char key[256];
	char type; /* 's' string, 'n' number, 'b' true/false, 'z' null */
	char val[8192];
} jfield_t;

typedef struct jobj {
	jfield_t f[256];
	int n;
	int dup; /* a key appeared twice */
} jobj_t;

static const char *ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
		p++;
	return p;
}

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static size_t put_utf8(char *o, unsigned cp)
{
	if (cp < 0x80)
		return o[0] = (char)cp, 1;
	if (cp < 0x800)
		return o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
	if (cp < 0x10000)
		return o[0] = (char)(0xE0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
		       o[2] = (char)(0x80 | (cp & 0x3F)), 3;
	return o[0] = (char)(0xF0 | (cp >> 18)), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
	       o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F)), 4;
}

/* Length of a valid UTF-8 sequence at s, 0 if invalid. */
static size_t utf8_ok(const unsigned char *s)
{
	if (s[0] < 0x80)
		return 1;
	unsigned cp;
	size_t n;
	if ((s[0] & 0xE0) == 0xC0)
		cp = s[0] & 0x1F, n = 2;
	else if ((s[0] & 0xF0) == 0xE0)
		cp = s[0] & 0x0F, n = 3;
	else if ((s[0] & 0xF8) == 0xF0)
		cp = s[0] & 0x07, n = 4;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3F);
	}
	static const unsigned min[] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return n;
}

static const char *jstring(const char *p, char *out, size_t size)
{
	if (*p++ != '"')
		return NULL;
	size_t o = 0;
	while (*p != '"') {
		unsigned char c = (unsigned char)*p;
		char tmp[4];
		size_t n;
		if (c < 0x20)
			return NULL; /* raw control characters are not allowed */
		if (c == '\\') {
			p++;
			switch (*p) {
			case '"': tmp[0] = '"', n = 1; break;
			case '\\': tmp[0] = '\\', n = 1; break;
			case '/': tmp[0] = '/', n = 1; break;
			case 'b': tmp[0] = '\b', n = 1; break;
			case 'f': tmp[0] = '\f', n = 1; break;
			case 'n': tmp[0] = '\n', n = 1; break;
			case 'r': tmp[0] = '\r', n = 1; break;
			case 't': tmp[0] = '\t', n = 1; break;
			case 'u': {
				unsigned cp = 0;
				for (int i = 1; i <= 4; i++) {
					int h = hexval(p[i]);
					if (h < 0)
						return NULL;
					cp = cp * 16 + (unsigned)h;
				}
				if (cp >= 0xD800 && cp <= 0xDFFF)
					return NULL; /* our writer never needs surrogates */
				p += 4;
				n = put_utf8(tmp, cp);
				break;
			}
			default: return NULL;
			}
			p++;
		} else {
			n = utf8_ok((const unsigned char *)p);
			if (!n)
				return NULL;
			memcpy(tmp, p, n);
			p += n;
		}
		if (o + n >= size)
			return NULL;
		memcpy(out + o, tmp, n);
		o += n;
	}
	out[o] = '\0';
	return p + 1;
}

static const char *jnumber(const char *p, char *out, size_t size)
{
	const char *s = p;
	if (*p == '-')
		p++;
	if (*p == '0')
		p++;
	else if (*p >= '1' && *p <= '9')
		while (*p >= '0' && *p <= '9')
			p++;
	else
		return NULL;
	if (*p == '.') {
		p++;
		if (!(*p >= '0' && *p <= '9'))
			return NULL;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			p++;
		if (!(*p >= '0' && *p <= '9'))
			return NULL;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	if ((size_t)(p - s) >= size)
		return NULL;
	memcpy(out, s, (size_t)(p - s));
	out[p - s] = '\0';
	return p;
}

/* 0 if line is exactly one flat JSON object (and whitespace). */
static int json_parse(const char *line, jobj_t *o)
{
	memset(o, 0, sizeof *o);
	const char *p = ws(line);
	if (*p++ != '{')
		return -1;
	p = ws(p);
	if (*p == '}')
		return *ws(p + 1) ? -1 : 0;
	for (;;) {
		if (o->n == 256)
			return -1;
		jfield_t *f = &o->f[o->n];
		if (!(p = jstring(ws(p), f->key, sizeof f->key)))
			return -1;
		p = ws(p);
		if (*p++ != ':')
			return -1;
		p = ws(p);
		if (*p == '"') {
			f->type = 's';
			p = jstring(p, f->val, sizeof f->val);
		} else if (strncmp(p, "true", 4) == 0 || strncmp(p, "false", 5) == 0) {
			f->type = 'b';
			snprintf(f->val, sizeof f->val, "%s", *p == 't' ? "true" : "false");
			p += *p == 't' ? 4 : 5;
		} else if (strncmp(p, "null", 4) == 0) {
			f->type = 'z';
			p += 4;
		} else {
			f->type = 'n';
			p = jnumber(p, f->val, sizeof f->val);
		}
		if (!p)
			return -1;
		for (int i = 0; i < o->n; i++)
			if (strcmp(o->f[i].key, f->key) == 0)
				o->dup = 1;
		o->n++;
		p = ws(p);
		if (*p == ',') {
			p++;
			continue;
		}
		if (*p++ != '}')
			return -1;
		return *ws(p) ? -1 : 0;
	}
}

static const jfield_t *jget(const jobj_t *o, const char *key)
{
	for (int i = 0; i < o->n; i++)
		if (strcmp(o->f[i].key, key) == 0)
			return &o->f[i];
	return NULL;
}

#define TEST_JSTR(o, k, want)                                                             \
	do {                                                                              \
		const jfield_t *f_ = jget(o, k);                                          \
		TEST_ASSERT_MSG(f_ && f_->type == 's' && strcmp(f_->val, want) == 0, "%s: %s%s%s (want \"%s\")", k, \
		                f_ ? "\"" : "", f_ ? f_->val : "missing", f_ ? "\"" : "", want); \
	} while (0)
#define TEST_JNUM(o, k, want)                                                             \
	do {                                                                              \
		const jfield_t *f_ = jget(o, k);                                          \
		TEST_ASSERT_MSG(f_ && f_->type == 'n' && strcmp(f_->val, want) == 0, "%s: %s (want number %s)", k, \
		                f_ ? f_->val : "missing", want);                          \
	} while (0)

/* ---- capture ---------------------------------------------------------------------------- */
static char cap_path[256];
static int cap_fd = -1, saved_fd;

static void capture_begin(int format)
{
	snprintf(cap_path, sizeof cap_path, "%s/log.txt", test_tmpdir());
	cap_fd = open(cap_path, O_CREAT | O_TRUNC | O_WRONLY | O_APPEND, 0600);
	TEST_ASSERT(cap_fd >= 0);
	saved_fd = mfs_log_set_fd(cap_fd);
	mfs_log_set_format(format);
	mfs_log_set_level(MFS_LOG_DEBUG);
}

/* Stop capturing; the captured text (malloc'd). */
static char *capture_end(void)
{
	mfs_log_set_fd(saved_fd);
	mfs_log_set_format(MFS_LOG_LOGFMT);
	mfs_log_set_level(MFS_LOG_INFO);
	close(cap_fd);
	FILE *f = fopen(cap_path, "rb");
	if (!f)
		return strdup("");
	static char buf[1 << 20];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strdup(buf);
}

/* Split text into lines (in place); every line must end in '\n'. Returns the count. */
static int lines_of(char *text, char **lines, int max)
{
	int n = 0;
	char *p = text;
	while (*p && n < max) {
		char *nl = strchr(p, '\n');
		TEST_ASSERT_MSG(nl, "unterminated line: %s", p);
		if (!nl)
			break;
		*nl = '\0';
		lines[n++] = p;
		p = nl + 1;
	}
	return n;
}

static void test_json_lines(void)
{
	char q[256];
	capture_begin(MFS_LOG_JSON);
	/* 0: a line as serve/consumer.c writes it */
	mfs_warn("serve", "msg=rejected reason=%s topic=%s partition=%d offset=%lld event=%ld detail=\"%s\" suppressed=%d",
	         "nan", "ratings", 3, 12345LL, -1L, "rating is NaN", 0);
	/* 1: a value quoted by mfs_log_quote: escapes decode back exactly */
	mfs_info("test", "msg=\"quoted\" v=%s after=1", mfs_log_quote(q, sizeof q, "a \"b\" \\ c\nd"));
	/* 2: raw quotes inside a quoted value (call sites pass %s unescaped) */
	mfs_error("test", "msg=\"x\" err=\"bad \"u\" key\" n=1 path=\"\"");
	/* 3: what is a number and what is not */
	mfs_info("test", "msg=num a=-0.5e-3 b=0 c=nan d=007 e=1. f=- g= h=1e5x i=+1 j=12345678901234567890 k=true");
	/* 4: reserved and repeated keys are renamed, never repeated */
	mfs_info("test", "msg=dup level=5 ts=x mod=y a=1 a=2 a=3 _a=4");
	/* 5: words that are not pairs become msg */
	mfs_info("test", "hello world key=1");
	/* 6: ... or _text when there is a msg */
	mfs_info("test", "msg=m stray \"quoted words\" key=2");
	/* 7: control characters and invalid UTF-8 in values; valid UTF-8 kept */
	mfs_info("test", "msg=bytes raw=%s ok=\"%s\"", "a\x01" "b\xff" "c\xc3", "π€😀");
	/* 8: a value with a newline in it stays on one line */
	mfs_info("test", "msg=\"two\nlines\" x=1");
	/* 9: too long for a line: cut, still valid, marked */
	char big[2100];
	memset(big, '"', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	mfs_info("test", "msg=big v=\"%s\" tail=1", big);
	/* 10: many short fields whose escapes grow 6x: cut, every field but the last whole */
	char many[2040];
	size_t o = 0;
	for (int i = 0; o + 20 < sizeof many; i++)
		o += (size_t)snprintf(many + o, sizeof many - o, "k%d=\x01\x01\x01\x01 ", i);
	mfs_info("test", "msg=many %s", many);
	/* 11: an empty line */
	mfs_info("test", "%s", "");
	/* filtered by level: nothing */
	mfs_log_set_level(MFS_LOG_ERROR);
	mfs_info("test", "msg=\"not printed\"");
	char *text = capture_end();
	char *lines[32];
	int n = lines_of(text, lines, 32);
	TEST_EQ_INT(n, 12);
	jobj_t *j = malloc(sizeof *j);
	for (int i = 0; i < n; i++) {
		int rc = json_parse(lines[i], j);
		TEST_ASSERT_MSG(rc == 0, "line %d is not strict JSON: %s", i, lines[i]);
		TEST_ASSERT_MSG(!j->dup, "line %d repeats a key: %s", i, lines[i]);
		TEST_ASSERT_MSG(strlen(lines[i]) < 4096, "line %d: %zu bytes", i, strlen(lines[i]));
		if (rc)
			continue;
		const jfield_t *ts = jget(j, "ts");
		TEST_ASSERT(ts && ts->type == 's' && strlen(ts->val) == 24 && ts->val[10] == 'T' && ts->val[23] == 'Z');
		switch (i) {
		case 0:
			TEST_JSTR(j, "level", "warn");
			TEST_JSTR(j, "mod", "serve");
			TEST_JSTR(j, "msg", "rejected");
			TEST_JSTR(j, "reason", "nan");
			TEST_JNUM(j, "partition", "3");
			TEST_JNUM(j, "offset", "12345");
			TEST_JNUM(j, "event", "-1");
			TEST_JSTR(j, "detail", "rating is NaN");
			TEST_JNUM(j, "suppressed", "0");
			TEST_EQ_INT(j->n, 11);
			break;
		case 1:
			TEST_JSTR(j, "v", "a \"b\" \\ c\nd");
			TEST_JNUM(j, "after", "1");
			break;
		case 2:
			TEST_JSTR(j, "level", "error");
			TEST_JSTR(j, "err", "bad \"u\" key");
			TEST_JNUM(j, "n", "1");
			TEST_JSTR(j, "path", "");
			break;
		case 3:
			TEST_JNUM(j, "a", "-0.5e-3");
			TEST_JNUM(j, "b", "0");
			TEST_JSTR(j, "c", "nan");
			TEST_JSTR(j, "d", "007");
			TEST_JSTR(j, "e", "1.");
			TEST_JSTR(j, "f", "-");
			TEST_JSTR(j, "g", "");
			TEST_JSTR(j, "h", "1e5x");
			TEST_JSTR(j, "i", "+1");
			TEST_JNUM(j, "j", "12345678901234567890");
			TEST_JSTR(j, "k", "true");
			break;
		case 4:
			TEST_JSTR(j, "level", "info");
			TEST_JSTR(j, "mod", "test");
			TEST_JNUM(j, "_level", "5");
			TEST_JSTR(j, "_ts", "x");
			TEST_JSTR(j, "_mod", "y");
			TEST_JNUM(j, "a", "1");
			TEST_JNUM(j, "_a", "2");
			TEST_JNUM(j, "__a", "3");
			TEST_JNUM(j, "___a", "4");
			break;
		case 5:
			TEST_JSTR(j, "msg", "hello world");
			TEST_JNUM(j, "key", "1");
			break;
		case 6:
			TEST_JSTR(j, "msg", "m");
			TEST_JSTR(j, "_text", "stray quoted words");
			TEST_JNUM(j, "key", "2");
			break;
		case 7:
			TEST_JSTR(j, "raw", "a\x01" "b\xef\xbf\xbd" "c\xef\xbf\xbd");
			TEST_JSTR(j, "ok", "π€😀");
			break;
		case 8:
			TEST_JSTR(j, "msg", "two\nlines");
			TEST_JNUM(j, "x", "1");
			break;
		case 9: {
			const jfield_t *t = jget(j, "truncated"), *v = jget(j, "v");
			TEST_ASSERT(t && t->type == 'b' && strcmp(t->val, "true") == 0);
			TEST_ASSERT(v && v->type == 's' && strlen(v->val) > 1000 && strspn(v->val, "\"") == strlen(v->val));
			TEST_ASSERT(!jget(j, "tail"));
			break;
		}
		case 10: {
			const jfield_t *t = jget(j, "truncated");
			TEST_ASSERT(t && t->type == 'b');
			int ks = 0;
			for (int f = 0; f < j->n; f++) {
				if (j->f[f].key[0] != 'k')
					continue;
				char want[8];
				snprintf(want, sizeof want, "k%d", ks++);
				TEST_STR_EQ(j->f[f].key, want); /* in order, none skipped */
				/* whole, or (the last one only) cut at a character */
				int last = f + 1 < j->n && j->f[f + 1].key[0] != 'k';
				TEST_ASSERT_MSG(strcmp(j->f[f].val, "\x01\x01\x01\x01") == 0 ||
				                    (last && strspn(j->f[f].val, "\x01") == strlen(j->f[f].val)),
				                "%s", j->f[f].key);
			}
			TEST_ASSERT(ks > 50);
			break;
		}
		case 11: TEST_EQ_INT(j->n, 3); break;
		}
	}
	free(j);
	free(text);

	/* Python's json module agrees (strict about control characters and UTF-8) */
	if (access("/usr/bin/python3", X_OK) == 0) {
		char cmd[512];
		snprintf(cmd, sizeof cmd,
		         "/usr/bin/python3 -c 'import json,sys\n"
		         "n=0\n"
		         "for l in open(sys.argv[1],encoding=\"utf-8\",errors=\"strict\"):\n"
		         "  d=json.loads(l); assert isinstance(d,dict) and d[\"level\"] and d[\"ts\"]; n+=1\n"
		         "assert n==12, n' %s",
		         cap_path);
		TEST_EQ_INT(system(cmd), 0);
	}
}

static void test_logfmt_lines(void)
{
	capture_begin(MFS_LOG_LOGFMT);
	mfs_info("serve", "msg=started engine=%s batch=%d", "cpu", 4096);
	mfs_warn("serve", "msg=\"two\nlines\r\" x=1");
	mfs_debug("d", "msg=dbg");
	char *text = capture_end();
	char *lines[8];
	int n = lines_of(text, lines, 8);
	TEST_EQ_INT(n, 3);
	if (n == 3) {
		TEST_ASSERT(strncmp(lines[0], "ts=", 3) == 0);
		TEST_ASSERT_MSG(strstr(lines[0], "Z level=info mod=serve msg=started engine=cpu batch=4096") &&
		                    lines[0][strlen(lines[0]) - 1] == '6',
		                "%s", lines[0]);
		TEST_ASSERT_MSG(strstr(lines[1], " level=warn mod=serve msg=\"two\\nlines\\r\" x=1"), "%s", lines[1]);
		TEST_ASSERT(strstr(lines[2], " level=debug mod=d msg=dbg"));
	}
	free(text);
}

static void sleep_ms(int ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

static uint64_t suppressed_of(const char *line)
{
	const char *s = strstr(line, "suppressed=");
	return s ? strtoull(s + 11, NULL, 10) : 0;
}

static void test_ratelimited(void)
{
	mfs_log_rl_t rl = MFS_LOG_RL_INIT;
	capture_begin(MFS_LOG_LOGFMT);
	for (int i = 0; i < 10; i++)
		mfs_log_ratelimited(&rl, 300, MFS_LOG_WARN, "t", "msg=burst i=%d", i);
	mfs_log_set_level(MFS_LOG_ERROR);
	for (int i = 0; i < 5; i++) /* below the level: neither printed nor counted */
		mfs_log_ratelimited(&rl, 300, MFS_LOG_WARN, "t", "msg=filtered");
	mfs_log_set_level(MFS_LOG_DEBUG);
	sleep_ms(400);
	mfs_log_ratelimited(&rl, 300, MFS_LOG_WARN, "t", "msg=later");
	mfs_log_ratelimited(&rl, 300, MFS_LOG_WARN, "t", "msg=dropped");
	for (int i = 0; i < 7; i++) /* one call site, one hidden state */
		mfs_log_every(60000, MFS_LOG_INFO, "t", "msg=every i=%d", i);
	mfs_log_ratelimited(&rl, 0, MFS_LOG_WARN, "t", "msg=\"no interval\""); /* always prints, reports 1 */
	char *text = capture_end();
	char *lines[16];
	int n = lines_of(text, lines, 16);
	TEST_EQ_INT(n, 4);
	if (n == 4) {
		TEST_ASSERT_MSG(strstr(lines[0], "msg=burst i=0") && !strstr(lines[0], "suppressed"), "%s", lines[0]);
		TEST_ASSERT_MSG(strstr(lines[1], "msg=later suppressed=9"), "%s", lines[1]);
		TEST_ASSERT_MSG(strstr(lines[2], "msg=every i=0") && !strstr(lines[2], "suppressed"), "%s", lines[2]);
		TEST_ASSERT_MSG(strstr(lines[3], "msg=\"no interval\" suppressed=1"), "%s", lines[3]);
	}
	free(text);

	/* JSON: suppressed is a number field */
	mfs_log_rl_t rj = MFS_LOG_RL_INIT;
	capture_begin(MFS_LOG_JSON);
	for (int i = 0; i < 3; i++)
		mfs_log_ratelimited(&rj, 100000, MFS_LOG_ERROR, "t", "msg=\"json burst\"");
	mfs_log_ratelimited(&rj, 0, MFS_LOG_ERROR, "t", "msg=\"json flush\"");
	text = capture_end();
	n = lines_of(text, lines, 16);
	TEST_EQ_INT(n, 2);
	jobj_t *j = malloc(sizeof *j);
	if (n == 2 && json_parse(lines[1], j) == 0) {
		TEST_JSTR(j, "msg", "json flush");
		TEST_JNUM(j, "suppressed", "2");
	} else {
		TEST_ASSERT_MSG(0, "bad JSON: %s", n == 2 ? lines[1] : "");
	}
	free(j);
	free(text);
}

/* Threads share one state: every call is either printed or reported in some suppressed=N. */
#define RL_THREADS 4
#define RL_CALLS 20000
static mfs_log_rl_t shared_rl;

static void *rl_worker(void *arg)
{
	(void)arg;
	for (int i = 0; i < RL_CALLS; i++)
		mfs_log_ratelimited(&shared_rl, 2, MFS_LOG_WARN, "t", "msg=hot i=%d", i);
	return NULL;
}

static void test_ratelimited_threads(void)
{
	capture_begin(MFS_LOG_LOGFMT);
	pthread_t th[RL_THREADS];
	for (int i = 0; i < RL_THREADS; i++)
		TEST_OK(pthread_create(&th[i], NULL, rl_worker, NULL));
	for (int i = 0; i < RL_THREADS; i++)
		pthread_join(th[i], NULL);
	mfs_log_ratelimited(&shared_rl, 0, MFS_LOG_WARN, "t", "msg=final");
	char *text = capture_end();
	static char *lines[RL_THREADS * RL_CALLS + 1];
	int n = lines_of(text, lines, RL_THREADS * RL_CALLS + 1);
	uint64_t accounted = 0;
	for (int i = 0; i < n; i++)
		accounted += 1 + suppressed_of(lines[i]);
	TEST_ASSERT(n >= 2 && n < RL_THREADS * RL_CALLS / 2); /* limited, but more than once */
	TEST_EQ_INT(accounted, (uint64_t)RL_THREADS * RL_CALLS + 1);
	free(text);
}

static void test_config_enums_match(void)
{
	TEST_EQ_INT(mfs_conf_enum_index("log.format", "logfmt"), MFS_LOG_LOGFMT);
	TEST_EQ_INT(mfs_conf_enum_index("log.format", "json"), MFS_LOG_JSON);
	TEST_EQ_INT(mfs_conf_enum_index("log.level", "debug"), MFS_LOG_DEBUG);
	TEST_EQ_INT(mfs_conf_enum_index("log.level", "error"), MFS_LOG_ERROR);
	mfs_conf_t c;
	TEST_OK(mfs_conf_init(&c));
	TEST_EQ_INT(c.log_format, MFS_LOG_LOGFMT);
	char **env = (char *[]){"MFSTREAM_LOG_FORMAT=json", NULL};
	char err[256];
	TEST_OK(mfs_conf_load_env(&c, env, err, sizeof err));
	TEST_EQ_INT(c.log_format, MFS_LOG_JSON);
	TEST_STR_EQ(c.metrics_listen, "127.0.0.1:9464");
	TEST_EQ_INT(c.metrics_healthz_stale_ms, 30000);
	mfs_conf_free(&c);
}

int main(void)
{
	TEST_RUN(test_json_lines);
	TEST_RUN(test_logfmt_lines);
	TEST_RUN(test_ratelimited);
	TEST_RUN(test_ratelimited_threads);
	TEST_RUN(test_config_enums_match);
	return TEST_REPORT();
}
