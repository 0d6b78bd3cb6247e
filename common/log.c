/* log.c - logfmt or JSON lines on stderr, one write(2) per line so threads never interleave.
 *
 * DESIGN: call sites pass logfmt text (msg="..." key=value ...). In logfmt mode that text is
 * written after the ts/level/mod prefix with control characters escaped, so a value that
 * holds a newline cannot forge a second line. In JSON mode the text is parsed back into
 * pairs (parse_pair) and written as one flat JSON object through a bounded writer (jw_*)
 * that always leaves room to close the object: a line that does not fit is cut at a field
 * or character boundary, gets "truncated":true, and is still valid JSON in valid UTF-8
 * (invalid input bytes become U+FFFD). Level, format and fd are atomics (no lock anywhere):
 * they are read once per line. A line is at most LINE_MAX bytes, below PIPE_BUF for the
 * logfmt case, so lines written to a pipe stay whole.
 */
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BODY_MAX 2048 /* the caller's formatted text */
#define LINE_MAX_ 4096 /* one output line; JSON escaping may grow the body */

static _Atomic int g_level = MFS_LOG_INFO;
static _Atomic int g_format = MFS_LOG_LOGFMT;
static _Atomic int g_fd = STDERR_FILENO;
static const char *const level_name[] = {"debug", "info", "warn", "error"};

void mfs_log_set_level(int level) { atomic_store_explicit(&g_level, level, memory_order_relaxed); }
int mfs_log_get_level(void) { return atomic_load_explicit(&g_level, memory_order_relaxed); }
void mfs_log_set_format(int format)
{
	atomic_store_explicit(&g_format, format == MFS_LOG_JSON ? MFS_LOG_JSON : MFS_LOG_LOGFMT, memory_order_relaxed);
}
int mfs_log_get_format(void) { return atomic_load_explicit(&g_format, memory_order_relaxed); }
int mfs_log_set_fd(int fd) { return atomic_exchange_explicit(&g_fd, fd, memory_order_relaxed); }

int mfs_log_enabled(int level)
{
	return level >= atomic_load_explicit(&g_level, memory_order_relaxed) && level >= 0 && level < MFS_LOG_OFF;
}

/* ---- JSON writer: bounded, all-or-nothing raw pieces, strings cut at a character ------ */
/* Room always kept for `,"truncated":true}` + '\n'. */
#define JW_RESERVE 24

typedef struct jw {
	char *buf;
	size_t cap, len;
	int full; /* something did not fit */
} jw_t;

static int jw_raw(jw_t *w, const char *s, size_t n)
{
	if (w->full || w->len + n + JW_RESERVE > w->cap) {
		w->full = 1;
		return -1;
	}
	memcpy(w->buf + w->len, s, n);
	w->len += n;
	return 0;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 if it is not valid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	if (c < 0x80)
		return 1;
	size_t len;
	unsigned char lo = 0x80, hi = 0xBF;
	if (c >= 0xC2 && c <= 0xDF)
		len = 2;
	else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		if (c == 0xE0)
			lo = 0xA0;
		else if (c == 0xED)
			hi = 0x9F; /* no UTF-16 surrogates */
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		if (c == 0xF0)
			lo = 0x90;
		else if (c == 0xF4)
			hi = 0x8F;
	} else {
		return 0;
	}
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xBF)
			return 0;
	return len;
}

/* A JSON string of s[0..n). Cut at a character boundary when the line is full: the closing
 * quote always fits, because every character is only written with room for it. */
static int jw_str(jw_t *w, const char *s, size_t n)
{
	if (jw_raw(w, "\"", 1))
		return -1;
	const unsigned char *p = (const unsigned char *)s;
	char esc[8];
	for (size_t i = 0; i < n;) {
		const char *out = (const char *)p + i;
		size_t olen, adv;
		unsigned char c = p[i];
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			out = esc, olen = 2, adv = 1;
		} else if (c < 0x20 || c == 0x7F) {
			if (c == '\n')
				memcpy(esc, "\\n", olen = 2);
			else if (c == '\t')
				memcpy(esc, "\\t", olen = 2);
			else if (c == '\r')
				memcpy(esc, "\\r", olen = 2);
			else
				olen = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
			out = esc, adv = 1;
		} else if (c < 0x80) {
			olen = adv = 1;
		} else if ((adv = utf8_len(p + i, n - i)) != 0) {
			olen = adv;
		} else {
			memcpy(esc, "\\ufffd", olen = 6);
			out = esc, adv = 1;
		}
		/* +1: the closing quote */
		if (w->len + olen + 1 + JW_RESERVE > w->cap) {
			w->full = 1;
			break;
		}
		memcpy(w->buf + w->len, out, olen);
		w->len += olen;
		i += adv;
	}
	w->buf[w->len++] = '"'; /* room kept above (or by jw_raw's reserve) */
	return 0;
}

/* ---- logfmt text -> pairs ------------------------------------------------------------ */
static int is_key_char(char c) { return c && c != ' ' && c != '=' && c != '"'; }

/* Does a closing quote at q end the value? Yes at the end of the text, or when a space and
 * then the end or another key= follows. This reads raw %s values that hold quotes themselves
 * (err="bad "x" here" n=1) the way a human would. */
static int quote_closes(const char *q)
{
	const char *p = q + 1;
	if (!*p)
		return 1;
	if (*p != ' ')
		return 0;
	while (*p == ' ')
		p++;
	if (!*p)
		return 1;
	const char *k = p;
	while (is_key_char(*p))
		p++;
	return p > k && *p == '=';
}

/* The closing quote of the value that starts after the opening quote at p: the first one
 * that quote_closes() accepts, else the first one followed by a space, else none (NULL). */
static const char *find_close(const char *p)
{
	const char *weak = NULL;
	for (; *p; p++) {
		if (*p == '\\' && p[1]) {
			p++;
			continue;
		}
		if (*p == '"') {
			if (quote_closes(p))
				return p;
			if (!weak && p[1] == ' ')
				weak = p;
		}
	}
	return weak;
}

/* Decode the quoted value starting after the opening quote at *pp into out (unescaping \" \\
 * \n \t \r) and advance *pp past the closing quote. With no closing quote the rest is taken. */
static size_t parse_quoted(const char **pp, char *out, size_t size)
{
	const char *p = *pp, *end = find_close(p);
	size_t o = 0;
	if (!end)
		end = p + strlen(p);
	while (p < end) {
		char c = *p;
		if (c == '\\' && p + 1 < end) {
			char d = p[1];
			char r = d == 'n' ? '\n' : d == 't' ? '\t' : d == 'r' ? '\r' : (d == '"' || d == '\\') ? d : 0;
			if (r) {
				if (o + 1 < size)
					out[o++] = r;
				p += 2;
				continue;
			}
		}
		if (o + 1 < size)
			out[o++] = c;
		p++;
	}
	out[o] = '\0';
	*pp = *end ? end + 1 : end;
	return o;
}

/* Strict JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int is_json_number(const char *s, size_t n)
{
	size_t i = 0;
	if (i < n && s[i] == '-')
		i++;
	if (i >= n)
		return 0;
	if (s[i] == '0')
		i++;
	else if (s[i] >= '1' && s[i] <= '9')
		while (i < n && s[i] >= '0' && s[i] <= '9')
			i++;
	else
		return 0;
	if (i < n && s[i] == '.') {
		size_t d = ++i;
		while (i < n && s[i] >= '0' && s[i] <= '9')
			i++;
		if (i == d)
			return 0;
	}
	if (i < n && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (i < n && (s[i] == '+' || s[i] == '-'))
			i++;
		size_t d = i;
		while (i < n && s[i] >= '0' && s[i] <= '9')
			i++;
		if (i == d)
			return 0;
	}
	return i == n;
}

#define MAX_KEYS 64

/* The names already in the object (copies: renamed keys exist nowhere else). */
typedef struct keyset {
	char arena[2048];
	size_t used;
	const char *k[MAX_KEYS];
	size_t n[MAX_KEYS];
	size_t count;
} keyset_t;

static int keyset_has(const keyset_t *ks, const char *k, size_t n)
{
	for (size_t i = 0; i < ks->count; i++)
		if (ks->n[i] == n && memcmp(ks->k[i], k, n) == 0)
			return 1;
	return 0;
}

static void keyset_add(keyset_t *ks, const char *k, size_t n)
{
	if (ks->count == MAX_KEYS || ks->used + n > sizeof ks->arena)
		return; /* past 64 keys repeats are no longer caught: no call site comes near */
	memcpy(ks->arena + ks->used, k, n);
	ks->k[ks->count] = ks->arena + ks->used;
	ks->n[ks->count++] = n;
	ks->used += n;
}

/* One field: the key (renamed "_key", "__key", ... when it clashes with ts/level/mod or an
 * earlier key: JSON objects must not repeat names) and a string or number value. A field
 * that does not fit is dropped whole, except that a long string value is cut. */
static void jw_field(jw_t *w, keyset_t *ks, const char *k, size_t kn, const char *v, size_t vn, int as_number)
{
	char key[160];
	size_t n = kn < 120 ? kn : 120;
	memcpy(key, k, n);
	while (keyset_has(ks, key, n) && n + 1 < sizeof key) {
		memmove(key + 1, key, n);
		key[0] = '_';
		n++;
	}
	size_t start = w->len;
	if (jw_raw(w, ",", 1))
		return;
	jw_str(w, key, n);
	if (w->full || jw_raw(w, ":", 1)) {
		w->len = start;
		return;
	}
	if (as_number) {
		if (jw_raw(w, v, vn)) {
			w->len = start;
			return;
		}
	} else if (jw_str(w, v, vn)) {
		w->len = start;
		return;
	}
	keyset_add(ks, key, n);
}

static size_t format_json(char *line, size_t cap, const char *ts, int level, const char *mod, const char *body)
{
	jw_t w = {line, cap, 0, 0};
	keyset_t ks;
	ks.used = ks.count = 0;
	keyset_add(&ks, "ts", 2);
	keyset_add(&ks, "level", 5);
	keyset_add(&ks, "mod", 3);
	jw_raw(&w, "{\"ts\":", 6);
	jw_str(&w, ts, strlen(ts));
	jw_raw(&w, ",\"level\":", 9);
	jw_str(&w, level_name[level], strlen(level_name[level]));
	jw_raw(&w, ",\"mod\":", 7);
	jw_str(&w, mod, strlen(mod));

	char val[BODY_MAX], text[BODY_MAX];
	size_t tn = 0;
	int have_msg = 0;
	const char *p = body;
	while (*p) {
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		const char *k = p;
		while (is_key_char(*p))
			p++;
		if (*p == '=' && p > k) {
			size_t kn = (size_t)(p - k);
			p++;
			if (*p == '"') {
				p++;
				size_t vn = parse_quoted(&p, val, sizeof val);
				jw_field(&w, &ks, k, kn, val, vn, 0);
			} else {
				const char *v = p;
				while (*p && *p != ' ')
					p++;
				size_t vn = (size_t)(p - v);
				jw_field(&w, &ks, k, kn, v, vn, is_json_number(v, vn));
			}
			if (kn == 3 && memcmp(k, "msg", 3) == 0)
				have_msg = 1;
			continue;
		}
		/* a word that is no key=value pair: collect it */
		const char *wd = k;
		if (*p == '"' && p == k) {
			p++;
			char tmp[BODY_MAX];
			size_t n = parse_quoted(&p, tmp, sizeof tmp);
			if (tn && tn + 1 < sizeof text)
				text[tn++] = ' ';
			if (n > sizeof text - 1 - tn)
				n = sizeof text - 1 - tn;
			memcpy(text + tn, tmp, n);
			tn += n;
			continue;
		}
		while (*p && *p != ' ')
			p++;
		size_t n = (size_t)(p - wd);
		if (tn && tn + 1 < sizeof text)
			text[tn++] = ' ';
		if (n > sizeof text - 1 - tn)
			n = sizeof text - 1 - tn;
		memcpy(text + tn, wd, n);
		tn += n;
	}
	if (tn)
		jw_field(&w, &ks, have_msg ? "_text" : "msg", have_msg ? 5 : 3, text, tn, 0);
	/* JW_RESERVE guarantees both fit */
	if (w.full) {
		memcpy(line + w.len, ",\"truncated\":true", 17);
		w.len += 17;
	}
	line[w.len++] = '}';
	line[w.len++] = '\n';
	return w.len;
}

/* logfmt: prefix + body with control characters escaped (a line is one record). */
static size_t format_logfmt(char *line, size_t cap, const char *ts, int level, const char *mod, const char *body)
{
	int n = snprintf(line, cap, "ts=%s level=%s mod=%s ", ts, level_name[level], mod);
	size_t o = n < 0 ? 0 : (size_t)n;
	if (o > cap - 2)
		o = cap - 2;
	for (const unsigned char *s = (const unsigned char *)body; *s && o + 3 < cap; s++) {
		if (*s == '\n' || *s == '\r') {
			line[o++] = '\\';
			line[o++] = *s == '\n' ? 'n' : 'r';
		} else if (*s < 0x20 && *s != '\t') {
			line[o++] = '?';
		} else {
			line[o++] = (char)*s;
		}
	}
	line[o++] = '\n';
	return o;
}

static void log_emit(int level, const char *mod, uint64_t suppressed, const char *fmt, va_list ap)
{
	char body[BODY_MAX], line[LINE_MAX_], ts[96];
	struct timespec t;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &t);
	gmtime_r(&t.tv_sec, &tm);
	snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
	         tm.tm_hour, tm.tm_min, tm.tm_sec, t.tv_nsec / 1000000);
	/* leave room for " suppressed=N" */
	int m = vsnprintf(body, sizeof body - 32, fmt, ap);
	size_t bl = m < 0 ? 0 : (size_t)m;
	if (bl > sizeof body - 33)
		bl = sizeof body - 33;
	body[bl] = '\0';
	if (suppressed)
		snprintf(body + bl, sizeof body - bl, "%ssuppressed=%" PRIu64, bl ? " " : "", suppressed);
	if (!mod)
		mod = "-";
	size_t len = atomic_load_explicit(&g_format, memory_order_relaxed) == MFS_LOG_JSON
	                     ? format_json(line, sizeof line, ts, level, mod, body)
	                     : format_logfmt(line, BODY_MAX, ts, level, mod, body);
	int fd = atomic_load_explicit(&g_fd, memory_order_relaxed);
	ssize_t w;
	do
		w = write(fd, line, len);
	while (w < 0 && errno == EINTR);
}

void mfs_log(int level, const char *mod, const char *fmt, ...)
{
	if (!mfs_log_enabled(level))
		return;
	va_list ap;
	va_start(ap, fmt);
	log_emit(level, mod, 0, fmt, ap);
	va_end(ap);
}

static int64_t mono_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void mfs_log_ratelimited(mfs_log_rl_t *rl, int interval_ms, int level, const char *mod, const char *fmt, ...)
{
	if (!mfs_log_enabled(level))
		return;
	if (interval_ms > 0) {
		int64_t now = mono_ms();
		int64_t next = atomic_load_explicit(&rl->rl_next_ms, memory_order_relaxed);
		/* one thread wins the window; the others (and later calls in it) count themselves */
		if (now < next || !atomic_compare_exchange_strong_explicit(&rl->rl_next_ms, &next, now + interval_ms,
		                                                            memory_order_relaxed, memory_order_relaxed)) {
			atomic_fetch_add_explicit(&rl->rl_suppressed, 1, memory_order_relaxed);
			return;
		}
	}
	uint64_t suppressed = atomic_exchange_explicit(&rl->rl_suppressed, 0, memory_order_relaxed);
	va_list ap;
	va_start(ap, fmt);
	log_emit(level, mod, suppressed, fmt, ap);
	va_end(ap);
}

const char *mfs_log_quote(char *buf, size_t size, const char *s)
{
	size_t o = 0;
	if (size < 3) {
		if (size)
			buf[0] = '\0';
		return buf;
	}
	buf[o++] = '"';
	for (; *s && o + 3 < size; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)c;
		} else if (c == '\n') {
			buf[o++] = '\\';
			buf[o++] = 'n';
		} else if (c < 0x20) {
			buf[o++] = '?';
		} else {
			buf[o++] = (char)c;
		}
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}
