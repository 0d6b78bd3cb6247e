/* config.c - parse, set, dump and document the configuration table (properties.def).
 *
 * DESIGN: the table is expanded once into `props[]` (key, type, bounds, default, offset of
 * the field in struct mfs_conf). Every way of setting a key (file, environment, flag) ends
 * in mfs_conf_set(), so validation and error messages exist in exactly one place.
 */
#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/check.h"
#include "common/err.h"

enum ptype { PT_INT, PT_DBL, PT_STR, PT_ENUM, PT_BOOL };

struct prop {
	const char *key;
	int type;
	int flags;
	size_t off;
	int64_t imin, imax, idef;
	double dmin, dmax, ddef;
	const char *sdef;    /* STR and ENUM default */
	const char *choices; /* ENUM */
	const char *doc;
};

#define OFF(f) offsetof(mfs_conf_t, f)
static const struct prop props[] = {
#define MFS_INT(f, k, d, lo, hi, fl, doc) {k, PT_INT, fl, OFF(f), lo, hi, d, 0, 0, 0, 0, 0, doc},
#define MFS_DBL(f, k, d, lo, hi, fl, doc) {k, PT_DBL, fl, OFF(f), 0, 0, 0, lo, hi, d, 0, 0, doc},
#define MFS_STR(f, k, d, fl, doc) {k, PT_STR, fl, OFF(f), 0, 0, 0, 0, 0, 0, d, 0, doc},
#define MFS_ENUM(f, k, d, ch, fl, doc) {k, PT_ENUM, fl, OFF(f), 0, 0, 0, 0, 0, 0, d, ch, doc},
#define MFS_BOOL(f, k, d, fl, doc) {k, PT_BOOL, fl, OFF(f), 0, 1, d, 0, 0, 0, 0, 0, doc},
#include "config/properties.def"
#undef MFS_INT
#undef MFS_DBL
#undef MFS_STR
#undef MFS_ENUM
#undef MFS_BOOL
};

static const struct prop *prop_find(const char *key)
{
	for (size_t i = 0; i < MFS_ARRAY_LEN(props); i++)
		if (strcmp(props[i].key, key) == 0)
			return &props[i];
	return NULL;
}

/* choice number `index` of "a|b|c" into buf; returns 0 if it exists */
static int choice_at(const char *choices, int index, char *buf, size_t size)
{
	const char *p = choices;
	for (int n = 0; p; n++) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		if (n == index) {
			if (len >= size)
				len = size - 1;
			memcpy(buf, p, len);
			buf[len] = '\0';
			return 0;
		}
		p = bar ? bar + 1 : NULL;
	}
	return -1;
}

static int choice_index(const char *choices, const char *name)
{
	char buf[64];
	for (int i = 0; choice_at(choices, i, buf, sizeof buf) == 0; i++)
		if (strcmp(buf, name) == 0)
			return i;
	return -1;
}

int mfs_conf_enum_index(const char *key, const char *choice)
{
	const struct prop *p = prop_find(key);
	return (p && p->type == PT_ENUM) ? choice_index(p->choices, choice) : -1;
}

const char *mfs_conf_enum_name(const char *key, int index)
{
	static _Thread_local char buf[64];
	const struct prop *p = prop_find(key);
	if (!p || p->type != PT_ENUM || choice_at(p->choices, index, buf, sizeof buf))
		return "?";
	return buf;
}

static char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

int mfs_conf_init(mfs_conf_t *c)
{
	memset(c, 0, sizeof *c);
	for (size_t i = 0; i < MFS_ARRAY_LEN(props); i++) {
		const struct prop *p = &props[i];
		char *f = (char *)c + p->off;
		switch (p->type) {
		case PT_INT: *(int64_t *)(void *)f = p->idef; break;
		case PT_DBL: *(double *)(void *)f = p->ddef; break;
		case PT_BOOL: *(int *)(void *)f = (int)p->idef; break;
		case PT_ENUM: *(int *)(void *)f = choice_index(p->choices, p->sdef); break;
		case PT_STR:
			if (!(*(char **)(void *)f = xstrdup(p->sdef))) {
				mfs_conf_free(c);
				return ENOMEM;
			}
			break;
		}
	}
	return 0;
}

void mfs_conf_free(mfs_conf_t *c)
{
	for (size_t i = 0; i < MFS_ARRAY_LEN(props); i++)
		if (props[i].type == PT_STR) {
			char **s = (char **)(void *)((char *)c + props[i].off);
			free(*s);
			*s = NULL;
		}
	for (int i = 0; i < c->kafka_n; i++) {
		free(c->kafka_key[i]);
		free(c->kafka_val[i]);
	}
	c->kafka_n = 0;
	free(c->config_path);
	c->config_path = NULL;
}

static int parse_bool(const char *v, int *out)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0)
			return *out = 1, 0;
		if (strcasecmp(v, no[i]) == 0)
			return *out = 0, 0;
	}
	return -1;
}

static int set_kafka(mfs_conf_t *c, const char *key, const char *value, char *errstr, size_t es)
{
	const char *k = key + 6; /* after "kafka." */
	if (!*k)
		return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"kafka.\" needs a librdkafka property name");
	for (int i = 0; i < c->kafka_n; i++)
		if (strcmp(c->kafka_key[i], k) == 0) {
			char *v = xstrdup(value);
			if (!v)
				return ENOMEM;
			free(c->kafka_val[i]);
			c->kafka_val[i] = v;
			return 0;
		}
	if (c->kafka_n == MFS_CONF_KAFKA_MAX)
		return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"%s\": more than %d kafka.* keys", key,
		                MFS_CONF_KAFKA_MAX);
	char *kk = xstrdup(k), *vv = xstrdup(value);
	if (!kk || !vv) {
		free(kk);
		free(vv);
		return ENOMEM;
	}
	c->kafka_key[c->kafka_n] = kk;
	c->kafka_val[c->kafka_n++] = vv;
	return 0;
}

int mfs_conf_set(mfs_conf_t *c, const char *key, const char *value, char *errstr, size_t es)
{
	if (strncmp(key, "kafka.", 6) == 0)
		return set_kafka(c, key, value, errstr, es);
	const struct prop *p = prop_find(key);
	if (!p)
		return mfs_errf(errstr, es, MFS_ECONFIG, "unknown config key \"%s\" (see docs/CONFIGURATION.md)", key);
	char *f = (char *)c + p->off;
	char *end;
	switch (p->type) {
	case PT_INT: {
		errno = 0;
		long long v = strtoll(value, &end, 10);
		if (errno || end == value || *end)
			return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"%s\": \"%s\" is not an integer (allowed %lld..%lld)",
			                key, value, (long long)p->imin, (long long)p->imax);
		if (v < p->imin || v > p->imax)
			return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"%s\": %lld is out of range (allowed %lld..%lld)",
			                key, v, (long long)p->imin, (long long)p->imax);
		*(int64_t *)(void *)f = v;
		return 0;
	}
	case PT_DBL: {
		errno = 0;
		double v = strtod(value, &end);
		if (errno || end == value || *end || !isfinite(v))
			return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"%s\": \"%s\" is not a finite number (allowed %g..%g)",
			                key, value, p->dmin, p->dmax);
		if (v < p->dmin || v > p->dmax)
			return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"%s\": %g is out of range (allowed %g..%g)", key, v,
			                p->dmin, p->dmax);
		*(double *)(void *)f = v;
		return 0;
	}
	case PT_BOOL: {
		int v;
		if (parse_bool(value, &v))
			return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"%s\": \"%s\" is not a boolean (allowed true|false|1|0|yes|no|on|off)",
			                key, value);
		*(int *)(void *)f = v;
		return 0;
	}
	case PT_ENUM: {
		int v = choice_index(p->choices, value);
		if (v < 0)
			return mfs_errf(errstr, es, MFS_ECONFIG, "config key \"%s\": \"%s\" is not allowed (allowed %s)", key, value,
			                p->choices);
		*(int *)(void *)f = v;
		return 0;
	}
	case PT_STR: {
		char *v = xstrdup(value);
		if (!v)
			return ENOMEM;
		char **s = (char **)(void *)f;
		free(*s);
		*s = v;
		return 0;
	}
	}
	return MFS_EINVAL;
}

int mfs_conf_get(const mfs_conf_t *c, const char *key, char *buf, size_t size)
{
	if (strncmp(key, "kafka.", 6) == 0) {
		for (int i = 0; i < c->kafka_n; i++)
			if (strcmp(c->kafka_key[i], key + 6) == 0)
				return snprintf(buf, size, "%s", c->kafka_val[i]), 0;
		return MFS_ECONFIG;
	}
	const struct prop *p = prop_find(key);
	if (!p)
		return MFS_ECONFIG;
	const char *f = (const char *)c + p->off;
	switch (p->type) {
	case PT_INT: snprintf(buf, size, "%lld", (long long)*(const int64_t *)(const void *)f); break;
	case PT_DBL: {
		/* shortest text that reads back to the same double */
		double v = *(const double *)(const void *)f;
		snprintf(buf, size, "%.15g", v);
		if (strtod(buf, NULL) != v)
			snprintf(buf, size, "%.17g", v);
		break;
	}
	case PT_BOOL: snprintf(buf, size, "%s", *(const int *)(const void *)f ? "true" : "false"); break;
	case PT_ENUM: choice_at(p->choices, *(const int *)(const void *)f, buf, size); break;
	case PT_STR: snprintf(buf, size, "%s", *(char *const *)(const void *)f); break;
	}
	return 0;
}

/* ---- config file ------------------------------------------------------------------- */
/* libinih reads each line into a buffer of INI_MAX_LINE (200) bytes and parses what does not
 * fit as a line of its own: a long comment was a syntax error blamed on the line after it, and
 * a long value was cut short without a word. So libinih gets its lines from conf_read_line,
 * which reads each whole line with getline: a blank or comment line of any length reaches
 * libinih as an empty line (line numbers stay right); a key = value line of up to
 * CONF_LINE_MAX bytes goes through whole, in pieces, into a heap buffer that libinih grows
 * (Debian's libinih makes INI_USE_STACK, INI_ALLOW_REALLOC and INI_MAX_LINE the variables
 * ini_use_stack, ini_allow_realloc and ini_max_line; conf_inih_setup sets them once); a longer
 * one is an error naming its file and line. */
#define CONF_LINE_MAX (64 * 1024)

struct ini_ctx {
	mfs_conf_t *c;
	const char *path;
	char *errstr;
	size_t es;
	int rc;
	FILE *f;
	char *line;      /* the current line, from getline */
	size_t line_cap;
	size_t len, off; /* its length, and how much of it libinih has taken */
	int lineno;
	size_t too_long; /* the length of line `lineno` when it is over CONF_LINE_MAX, else 0 */
	int read_errno;
};

static pthread_once_t conf_inih_once = PTHREAD_ONCE_INIT;

static void conf_inih_setup(void)
{
	ini_use_stack = false;
	ini_allow_realloc = true;
	ini_max_line = CONF_LINE_MAX + 3; /* the line, '\r', '\n' and '\0' (ini.h) */
}

/* libinih's fgets-style reader: the next piece of the current line (at most num - 1 bytes),
 * or the next line once it has taken the whole of this one. NULL at the end of the file, on a
 * read error and on a line over CONF_LINE_MAX (both noted in x for the caller). */
static char *conf_read_line(char *str, int num, void *stream)
{
	struct ini_ctx *x = stream;
	if (num < 2)
		return NULL;
	if (x->off == x->len) {
		errno = 0;
		ssize_t n = getline(&x->line, &x->line_cap, x->f);
		if (n < 0) {
			if (ferror(x->f))
				x->read_errno = errno ? errno : EIO;
			return NULL;
		}
		x->lineno++;
		x->len = strlen(x->line); /* a NUL byte ends the line, as it would for fgets */
		x->off = 0;
		const char *p = x->line;
		if (x->lineno == 1 && strncmp(p, "\xEF\xBB\xBF", 3) == 0) /* a UTF-8 BOM */
			p += 3;
		p += strspn(p, " \t\r\n\v\f");
		if (*p == '\0' || *p == ';' || *p == '#') { /* blank or a comment, of any length */
			x->off = x->len;
			str[0] = '\n';
			str[1] = '\0';
			return str;
		}
		if (x->len > CONF_LINE_MAX) {
			x->too_long = x->len;
			return NULL;
		}
	}
	size_t take = x->len - x->off;
	if (take > (size_t)num - 1)
		take = (size_t)num - 1;
	memcpy(str, x->line + x->off, take);
	str[take] = '\0';
	x->off += take;
	return str;
}

static int ini_cb(void *user, const char *section, const char *name, const char *value)
{
	struct ini_ctx *x = user;
	char key[256];
	if (section && *section)
		snprintf(key, sizeof key, "%s.%s", section, name);
	else
		snprintf(key, sizeof key, "%s", name);
	char err[512];
	int rc = mfs_conf_set(x->c, key, value ? value : "", err, sizeof err);
	if (rc) {
		x->rc = rc;
		mfs_errf(x->errstr, x->es, rc, "%s: %s", x->path, err);
		return 0; /* libinih: 0 = error; it reports the line number */
	}
	return 1;
}

int mfs_conf_load_file(mfs_conf_t *c, const char *path, char *errstr, size_t es)
{
	struct ini_ctx x = {.c = c, .path = path, .errstr = errstr, .es = es};
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) /* it would open and read as empty */
		return mfs_errf(errstr, es, MFS_ECONFIG, "config file %s is a directory", path);
	if (!(x.f = fopen(path, "r")))
		return mfs_errf(errstr, es, MFS_ECONFIG, "cannot open config file %s: %s", path, strerror(errno));
	pthread_once(&conf_inih_once, conf_inih_setup);
	int line = ini_parse_stream(conf_read_line, &x, ini_cb, &x);
	fclose(x.f);
	free(x.line);
	if (line == -2)
		return mfs_errf(errstr, es, ENOMEM, "out of memory reading %s", path);
	if (line > 0) { /* the first error: it comes before the line that stopped the reading */
		if (x.rc) {
			char tmp[512];
			snprintf(tmp, sizeof tmp, "%s", errstr ? errstr : "");
			return mfs_errf(errstr, es, x.rc, "%s (line %d)", tmp, line);
		}
		return mfs_errf(errstr, es, MFS_ECONFIG, "%s:%d: syntax error (expected [section] or key = value)", path,
		                line);
	}
	if (x.too_long)
		return mfs_errf(errstr, es, MFS_ECONFIG,
		                "%s:%d: line of %zu bytes: a [section] or key = value line may have at most %d "
		                "(a comment line any length)", path, x.lineno, x.too_long, CONF_LINE_MAX);
	if (x.read_errno)
		return mfs_errf(errstr, es, x.read_errno, "reading config file %s: %s", path, strerror(x.read_errno));
	free(c->config_path);
	c->config_path = xstrdup(path);
	return 0;
}

/* ---- environment -------------------------------------------------------------------- */
/* MFSTREAM_SGD_LAMBDA_P -> the key whose upper-cased, '.'->'_' form matches. Keys with '_'
 * in their last part (lambda_p) make a naive '_'->'.' mapping ambiguous, so we match against
 * the table instead. Anything under MFSTREAM_KAFKA_ maps '_' -> '.'. */
static int env_key(const char *var, char *key, size_t size)
{
	for (size_t i = 0; i < MFS_ARRAY_LEN(props); i++) {
		const char *k = props[i].key, *v = var;
		for (; *k && *v; k++, v++) {
			char want = (*k == '.') ? '_' : (char)toupper((unsigned char)*k);
			if (*v != want)
				break;
		}
		if (!*k && !*v) {
			snprintf(key, size, "%s", props[i].key);
			return 0;
		}
	}
	if (strncmp(var, "KAFKA_", 6) == 0 && var[6]) {
		size_t o = (size_t)snprintf(key, size, "kafka.");
		for (const char *v = var + 6; *v && o + 1 < size; v++)
			key[o++] = (*v == '_') ? '.' : (char)tolower((unsigned char)*v);
		key[o] = '\0';
		return 0;
	}
	return -1;
}

int mfs_conf_load_env(mfs_conf_t *c, char *const *envp, char *errstr, size_t es)
{
	for (; envp && *envp; envp++) {
		const char *e = *envp;
		if (strncmp(e, "MFSTREAM_", 9) != 0)
			continue;
		const char *eq = strchr(e, '=');
		if (!eq)
			continue;
		char var[256], key[256];
		size_t n = (size_t)(eq - e) - 9;
		if (n >= sizeof var)
			n = sizeof var - 1;
		memcpy(var, e + 9, n);
		var[n] = '\0';
		if (strcmp(var, "CONFIG") == 0)
			continue;
		if (env_key(var, key, sizeof key))
			return mfs_errf(errstr, es, MFS_ECONFIG, "unknown environment variable MFSTREAM_%s (no such config key)",
			                var);
		char err[512];
		int rc = mfs_conf_set(c, key, eq + 1, err, sizeof err);
		if (rc)
			return mfs_errf(errstr, es, rc, "environment MFSTREAM_%s: %s", var, err);
	}
	return 0;
}

/* ---- the whole chain ---------------------------------------------------------------- */
static const char *alias_key(const mfs_conf_alias_t *aliases, const char *flag)
{
	for (; aliases && aliases->flag; aliases++)
		if (strcmp(aliases->flag, flag) == 0)
			return aliases->key;
	return NULL;
}

int mfs_conf_load_all(mfs_conf_t *c, int argc, char **argv, char *const *envp, const mfs_conf_alias_t *aliases,
                      char **positional, int max_pos, int *n_pos, char *errstr, size_t es)
{
	int rc;
	const char *file = NULL;
	*n_pos = 0;
	for (const char *const *e = (const char *const *)envp; e && *e; e++)
		if (strncmp(*e, "MFSTREAM_CONFIG=", 16) == 0)
			file = *e + 16;
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--config") == 0) {
			if (i + 1 >= argc)
				return mfs_errf(errstr, es, MFS_ECONFIG, "--config needs a file name");
			file = argv[i + 1];
		} else if (strncmp(argv[i], "--config=", 9) == 0) {
			file = argv[i] + 9;
		}
	}
	if (file && *file && (rc = mfs_conf_load_file(c, file, errstr, es)))
		return rc;
	if ((rc = mfs_conf_load_env(c, envp, errstr, es)))
		return rc;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
			if (*n_pos >= max_pos)
				return mfs_errf(errstr, es, MFS_ECONFIG, "unexpected argument \"%s\"", a);
			positional[(*n_pos)++] = argv[i];
			continue;
		}
		char flag[256];
		const char *value = NULL;
		const char *eq = strchr(a, '=');
		size_t n = eq ? (size_t)(eq - a) : strlen(a);
		if (n >= sizeof flag)
			n = sizeof flag - 1;
		memcpy(flag, a, n);
		flag[n] = '\0';
		if (eq)
			value = eq + 1;
		if (strcmp(flag, "--config") == 0) {
			i += eq ? 0 : 1;
			continue;
		}
		const char *key = alias_key(aliases, flag);
		if (!key)
			key = flag + 2;
		const struct prop *p = prop_find(key);
		if (!value) {
			if (p && p->type == PT_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0))
				value = "true";
			else if (i + 1 < argc)
				value = argv[++i];
			else
				return mfs_errf(errstr, es, MFS_ECONFIG, "flag %s needs a value", flag);
		}
		char err[512];
		if ((rc = mfs_conf_set(c, key, value, err, sizeof err)))
			return mfs_errf(errstr, es, rc, "flag %s: %s", flag, err);
	}
	return 0;
}

/* ---- dump and doc ------------------------------------------------------------------- */
void mfs_conf_dump(const mfs_conf_t *c, FILE *f)
{
	char buf[1024];
	for (size_t i = 0; i < MFS_ARRAY_LEN(props); i++) {
		if (props[i].flags & MFS_P_HIDDEN)
			continue;
		if (props[i].type == PT_STR) { /* whole: a value may be longer than buf */
			fprintf(f, "%s = %s\n", props[i].key, *(char *const *)(const void *)((const char *)c + props[i].off));
			continue;
		}
		mfs_conf_get(c, props[i].key, buf, sizeof buf);
		fprintf(f, "%s = %s\n", props[i].key, buf);
	}
	for (int i = 0; i < c->kafka_n; i++)
		fprintf(f, "kafka.%s = %s\n", c->kafka_key[i], c->kafka_val[i]);
}

static void doc_range(const struct prop *p, char *buf, size_t size)
{
	switch (p->type) {
	case PT_INT:
		if (p->imax == INT64_MAX)
			snprintf(buf, size, "%lld..", (long long)p->imin);
		else
			snprintf(buf, size, "%lld..%lld", (long long)p->imin, (long long)p->imax);
		break;
	case PT_DBL: snprintf(buf, size, "%g..%g", p->dmin, p->dmax); break;
	case PT_BOOL: snprintf(buf, size, "true, false"); break;
	case PT_ENUM: {
		size_t o = 0;
		for (const char *s = p->choices; *s && o + 4 < size; s++) {
			if (*s == '|') {
				buf[o++] = ',';
				buf[o++] = ' ';
			} else {
				buf[o++] = *s;
			}
		}
		buf[o] = '\0';
		break;
	}
	case PT_STR: snprintf(buf, size, "text"); break;
	}
}

static const char *type_name(int t)
{
	static const char *const n[] = {"integer", "number", "string", "enum", "boolean"};
	return n[t];
}

void mfs_conf_gen_doc(FILE *f)
{
	fprintf(f, "# Configuration reference\n\n"
	           "<!-- Generated from config/properties.def by mfs_gen_doc; do not edit. CI fails when it is stale. -->\n\n"
	           "Every key can be set four ways; later ones win:\n\n"
	           "1. the built-in default (below);\n"
	           "2. a config file in INI form, given with `--config FILE` or `MFSTREAM_CONFIG=FILE`:\n"
	           "   `[sgd]` then `lr = 0.02` sets `sgd.lr` (a key before any section is a full name);\n"
	           "3. an environment variable: `MFSTREAM_` + the key upper-cased with `.` as `_`\n"
	           "   (`MFSTREAM_SGD_LR=0.02`, `MFSTREAM_ENGINE_KIND=cpu`);\n"
	           "4. a command-line flag `--key value` or `--key=value` (`--sgd.lr 0.02`); a boolean flag\n"
	           "   may omit its value (`--engine.deterministic`).\n\n"
	           "An unknown key, an unknown `MFSTREAM_*` variable, or a value outside its range is an error\n"
	           "that names the key and the allowed range. `kafka.*` keys (`[kafka]` section,\n"
	           "`MFSTREAM_KAFKA_BOOTSTRAP_SERVERS`, `--kafka.bootstrap.servers`) are passed verbatim to\n"
	           "librdkafka. `mfstream config` prints the effective configuration as a loadable file.\n\n"
	           "| key | type | default | allowed | reload | description |\n"
	           "|---|---|---|---|---|---|\n");
	mfs_conf_t c;
	if (mfs_conf_init(&c))
		return;
	char def[256], range[256];
	for (size_t i = 0; i < MFS_ARRAY_LEN(props); i++) {
		const struct prop *p = &props[i];
		if (p->flags & MFS_P_HIDDEN)
			continue;
		mfs_conf_get(&c, p->key, def, sizeof def);
		doc_range(p, range, sizeof range);
		fprintf(f, "| `%s` | %s | `%s` | %s | %s | %s |\n", p->key, type_name(p->type), def, range,
		        (p->flags & MFS_P_IMMUTABLE) ? "restart" : "-", p->doc);
	}
	mfs_conf_free(&c);
}

void mfs_conf_gen_example(FILE *f)
{
	fprintf(f, "# mfstream.conf.example - every configuration key with its default.\n"
	           "# Generated from config/properties.def (mfs_gen_doc --example); do not edit by hand.\n"
	           "# Use: mfstream <command> --config mfstream.conf  (or MFSTREAM_CONFIG=mfstream.conf).\n"
	           "# Precedence: defaults < this file < MFSTREAM_* environment < --key value flags.\n"
	           "# Uncomment a line to change it; [kafka] keys go verbatim to librdkafka.\n");
	mfs_conf_t c;
	if (mfs_conf_init(&c))
		return;
	char def[256], range[256], section[64] = "";
	for (size_t i = 0; i < MFS_ARRAY_LEN(props); i++) {
		const struct prop *p = &props[i];
		if (p->flags & MFS_P_HIDDEN)
			continue;
		const char *dot = strchr(p->key, '.');
		size_t sl = (size_t)(dot - p->key);
		if (strlen(section) != sl || strncmp(section, p->key, sl) != 0) {
			snprintf(section, sizeof section, "%.*s", (int)sl, p->key);
			fprintf(f, "\n[%s]\n", section);
		}
		mfs_conf_get(&c, p->key, def, sizeof def);
		doc_range(p, range, sizeof range);
		fprintf(f, "# %s (%s; %s)\n;%s = %s\n", p->doc, type_name(p->type), range, dot + 1, def);
	}
	fprintf(f, "\n[kafka]\n# Any librdkafka property, e.g.:\n;bootstrap.servers = localhost:9092\n"
	           ";security.protocol = SASL_SSL\n;sasl.mechanism = SCRAM-SHA-512\n");
	mfs_conf_free(&c);
}
