/* ratings_file.c - read offline rating files (tsv, dat, csv, bin; plain, gzip, zstd); the writer
 * is ratings_writer.c.
 *
 * DESIGN
 * Reading is a three-stage pipe with no per-line allocation:
 *   raw bytes (read(2) on a file or stdin)
 *     -> decoder chosen by the first raw bytes (1f 8b: zlib inflate, multi-member;
 *        28 b5 2f fd: ZSTD_decompressStream, multi-frame; otherwise pass-through)
 *     -> a 1 MiB line buffer; each line is split in place, its ids are borrowed views into
 *        the buffer (mfs_id_parse never copies), and the callback sees them before the buffer
 *        moves on.
 * The decoder works on our own input buffer rather than gzopen/gzread because the magic must
 * be peeked on stdin too, where nothing can be re-opened or rewound; inflate with
 * inflateReset between members behaves as gzread does on concatenated .gz files.
 * Numbers: ratings take a Clinger fast path (<= 15 significant digits, no exponent: one
 * exact division, correctly rounded) and fall back to strtod; timestamps are parsed by hand.
 * Bad lines are counted, logged (the first max_reported individually, then a summary with
 * counts by reason) and skipped, or stop the read with MFS_EPARSE when fail_on_error is set.
 */
#include "ingest/ratings_file.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "common/err.h"
#include "common/log.h"
#include "ingest/ratings_file_int.h"

#define RF_MOD "ingest"
#define RF_IN_SIZE (256u << 10)  /* raw (compressed) input buffer */

/* Reasons a line is rejected; the summary log line counts each. */
enum {
	RF_BAD_FIELDS = 0,
	RF_BAD_USER,
	RF_BAD_ITEM,
	RF_BAD_RATING,
	RF_BAD_TS,
	RF_BAD_LONG,
	RF_BAD_TRUNC,
	RF_BAD_N
};
static const char *const rf_bad_key[RF_BAD_N] = {"fields", "user_id", "item_id", "rating",
                                                  "timestamp", "too_long", "truncated"};

const char *mfs_rfmt_name(int format)
{
	switch (format) {
	case MFS_RFMT_AUTO: return "auto";
	case MFS_RFMT_TSV: return "tsv";
	case MFS_RFMT_DAT: return "dat";
	case MFS_RFMT_CSV: return "csv";
	case MFS_RFMT_BIN: return "bin";
	default: return "unknown";
	}
}

/* ---- source: raw bytes and decoders ------------------------------------------------- */

typedef struct rf_src {
	int fd, own_fd;
	int kind;               /* RF_RAW, RF_GZIP, RF_ZSTD */
	unsigned char *in;      /* raw input buffer */
	size_t in_pos, in_len;  /* unconsumed raw bytes are in[in_pos .. in_len) */
	int in_eof;
	z_stream zs;
	int zs_init, z_member_done;
	ZSTD_DCtx *zd;
	size_t zd_last;         /* last ZSTD_decompressStream hint: 0 = at a frame boundary */
} rf_src_t;

/* Make at least `want` raw bytes available (fewer only at EOF). */
static int src_fill(rf_src_t *s, size_t want)
{
	if (s->in_len - s->in_pos >= want || s->in_eof)
		return 0;
	if (s->in_pos > 0) {
		memmove(s->in, s->in + s->in_pos, s->in_len - s->in_pos);
		s->in_len -= s->in_pos;
		s->in_pos = 0;
	}
	while (s->in_len < want && s->in_len < RF_IN_SIZE) {
		ssize_t n = read(s->fd, s->in + s->in_len, RF_IN_SIZE - s->in_len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		if (n == 0) {
			s->in_eof = 1;
			break;
		}
		s->in_len += (size_t)n;
	}
	return 0;
}

static int src_read_gzip(rf_src_t *s, unsigned char *out, size_t cap, size_t *got, char *errstr,
                         size_t errstr_size)
{
	size_t pos = 0;
	int rc;
	while (pos < cap) {
		if (s->z_member_done) {
			/* another member follows only if the next bytes are a gzip header */
			if ((rc = src_fill(s, 2)))
				return rc;
			size_t avail = s->in_len - s->in_pos;
			if (avail == 0)
				break; /* clean end */
			if (avail < 2 || s->in[s->in_pos] != 0x1f || s->in[s->in_pos + 1] != 0x8b)
				return mfs_errf(errstr, errstr_size, MFS_ECOMPRESS, "trailing garbage after gzip data");
			if (inflateReset(&s->zs) != Z_OK)
				return mfs_errf(errstr, errstr_size, MFS_ECOMPRESS, "inflateReset failed");
			s->z_member_done = 0;
		}
		if (s->in_pos == s->in_len && (rc = src_fill(s, 1)))
			return rc;
		s->zs.next_in = s->in + s->in_pos;
		s->zs.avail_in = (uInt)(s->in_len - s->in_pos);
		s->zs.next_out = out + pos;
		s->zs.avail_out = (uInt)(cap - pos);
		int zr = inflate(&s->zs, Z_NO_FLUSH);
		s->in_pos = s->in_len - s->zs.avail_in;
		size_t produced = (cap - pos) - s->zs.avail_out;
		pos += produced;
		if (zr == Z_STREAM_END) {
			s->z_member_done = 1;
		} else if (zr == Z_OK || zr == Z_BUF_ERROR) {
			if (s->in_pos == s->in_len && s->in_eof && produced == 0)
				return mfs_errf(errstr, errstr_size, MFS_ECOMPRESS, "truncated gzip data");
		} else {
			return mfs_errf(errstr, errstr_size, MFS_ECOMPRESS, "corrupt gzip data (%s)",
			                s->zs.msg ? s->zs.msg : "inflate failed");
		}
	}
	*got = pos;
	return 0;
}

static int src_read_zstd(rf_src_t *s, unsigned char *out, size_t cap, size_t *got, char *errstr,
                         size_t errstr_size)
{
	ZSTD_outBuffer ob = {out, cap, 0};
	int rc;
	while (ob.pos < ob.size) {
		if (s->in_pos == s->in_len && (rc = src_fill(s, 1)))
			return rc;
		int at_end = s->in_pos == s->in_len && s->in_eof;
		if (at_end && s->zd_last == 0)
			break; /* clean end at a frame boundary */
		size_t before = ob.pos;
		ZSTD_inBuffer ib = {s->in, s->in_len, s->in_pos};
		size_t r = ZSTD_decompressStream(s->zd, &ob, &ib);
		s->in_pos = ib.pos;
		if (ZSTD_isError(r))
			return mfs_errf(errstr, errstr_size, MFS_ECOMPRESS, "corrupt zstd data (%s)",
			                ZSTD_getErrorName(r));
		s->zd_last = r;
		if (at_end && ob.pos == before && r != 0)
			return mfs_errf(errstr, errstr_size, MFS_ECOMPRESS, "truncated zstd data");
	}
	*got = ob.pos;
	return 0;
}

/* Read up to cap decoded bytes; *got == 0 means end of data. */
static int src_read(rf_src_t *s, unsigned char *out, size_t cap, size_t *got, char *errstr,
                    size_t errstr_size)
{
	*got = 0;
	if (s->kind == RF_GZIP)
		return src_read_gzip(s, out, cap, got, errstr, errstr_size);
	if (s->kind == RF_ZSTD)
		return src_read_zstd(s, out, cap, got, errstr, errstr_size);
	if (s->in_pos < s->in_len) { /* the peeked bytes first */
		size_t n = s->in_len - s->in_pos;
		if (n > cap)
			n = cap;
		memcpy(out, s->in + s->in_pos, n);
		s->in_pos += n;
		*got = n;
		return 0;
	}
	if (s->in_eof)
		return 0;
	for (;;) {
		ssize_t n = read(s->fd, out, cap);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		if (n == 0)
			s->in_eof = 1;
		*got = (size_t)n;
		return 0;
	}
}

static void src_close(rf_src_t *s)
{
	if (s->zs_init)
		inflateEnd(&s->zs);
	ZSTD_freeDCtx(s->zd);
	if (s->own_fd && s->fd >= 0)
		close(s->fd);
	free(s->in);
}

static int src_open(rf_src_t *s, const char *path, char *errstr, size_t errstr_size)
{
	memset(s, 0, sizeof *s);
	s->fd = -1;
	if (strcmp(path, "-") == 0) {
		s->fd = STDIN_FILENO;
	} else {
		s->fd = open(path, O_RDONLY | O_CLOEXEC);
		if (s->fd < 0)
			return mfs_errf(errstr, errstr_size, errno, "cannot open %s: %s", path, strerror(errno));
		s->own_fd = 1;
	}
	s->in = malloc(RF_IN_SIZE);
	if (!s->in)
		return ENOMEM;
	int rc = src_fill(s, 4);
	if (rc)
		return mfs_errf(errstr, errstr_size, rc, "cannot read %s: %s", path, strerror(rc));
	const unsigned char *p = s->in;
	size_t n = s->in_len;
	if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) {
		s->kind = RF_GZIP;
		if (inflateInit2(&s->zs, 16 + MAX_WBITS) != Z_OK)
			return ENOMEM;
		s->zs_init = 1;
	} else if (n >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd) {
		s->kind = RF_ZSTD;
		s->zd = ZSTD_createDCtx();
		if (!s->zd)
			return ENOMEM;
		s->zd_last = 1; /* a frame has started */
	}
	return 0;
}

/* ---- the reader --------------------------------------------------------------------- */

typedef struct rf_reader {
	const char *path;
	const mfs_rfile_opts_t *opts;
	mfs_rfile_stats_t *st;
	mfs_rating_cb cb;
	void *ctx;
	rf_src_t src;
	unsigned char *buf; /* RF_BUF_SIZE + 1 (room for a sentinel) */
	size_t pos, end;
	int eof;
	int fmt;
	int header_checked;
	uint64_t bad[RF_BAD_N];
	char *errstr;
	size_t errstr_size;
} rf_reader_t;

/* Count, report and (fail mode) stop on a bad line. @return 0 to go on, or MFS_EPARSE. */
static int rf_bad(rf_reader_t *r, uint64_t line, int why, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int rf_bad(rf_reader_t *r, uint64_t line, int why, const char *fmt, ...)
{
	mfs_rfile_stats_t *st = r->st;
	char reason[192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof reason, fmt, ap);
	va_end(ap);
	st->rejected++;
	r->bad[why]++;
	const char *unit = r->fmt == MFS_RFMT_BIN ? "record" : "line";
	if (st->rejected == 1) {
		st->first_bad_line = line;
		snprintf(st->first_error, sizeof st->first_error, "%s %llu: %s", unit, (unsigned long long)line,
		         reason);
	}
	if (r->opts->fail_on_error)
		return mfs_errf(r->errstr, r->errstr_size, MFS_EPARSE, "%s: %s %llu: %s", r->path, unit,
		                (unsigned long long)line, reason);
	if (st->rejected <= (uint64_t)(r->opts->max_reported > 0 ? r->opts->max_reported : 0)) {
		char qf[512], qr[256];
		mfs_warn(RF_MOD, "msg=\"bad input %s skipped\" file=%s %s=%llu reason=%s", unit,
		         mfs_log_quote(qf, sizeof qf, r->path), unit, (unsigned long long)line,
		         mfs_log_quote(qr, sizeof qr, reason));
	}
	return 0;
}

static inline const char *rf_trim(const char *s, const char **e)
{
	while (s < *e && (*s == ' ' || *s == '\t'))
		s++;
	while (*e > s && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
		(*e)--;
	return s;
}

/* A number in [s, e) (surrounding blanks allowed). @return 0, or -1 if it is not a number. */
static int rf_parse_double(const char *s, const char *e, double *out)
{
	s = rf_trim(s, &e);
	if (s == e)
		return -1;
	/* fast path: [+-]digits[.digits], at most 15 significant digits */
	const char *p = s;
	int neg = 0;
	if (*p == '-' || *p == '+')
		neg = *p++ == '-';
	uint64_t mant = 0;
	int digits = 0, frac = 0, seen_dot = 0, any = 0;
	for (; p < e; p++) {
		unsigned d = (unsigned)(unsigned char)*p - '0';
		if (d <= 9) {
			any = 1;
			if (mant == 0 && d == 0) {
				if (seen_dot)
					frac++;
				continue; /* leading zeros are not significant */
			}
			if (++digits > 15)
				break;
			mant = mant * 10 + d;
			frac += seen_dot;
		} else if (*p == '.' && !seen_dot) {
			seen_dot = 1;
		} else {
			break;
		}
	}
	if (p == e && any && frac <= 15) {
		double v = (double)mant / rf_pow10[frac];
		*out = neg ? -v : v;
		return 0;
	}
	/* slow path: exponents, long mantissas, inf/nan; strtod needs a terminated copy */
	char tmp[128];
	size_t len = (size_t)(e - s);
	if (len >= sizeof tmp)
		return -1;
	memcpy(tmp, s, len);
	tmp[len] = 0;
	char *end;
	errno = 0;
	double v = strtod(tmp, &end);
	if (end != tmp + len || end == tmp)
		return -1;
	*out = v;
	return 0;
}

/* A signed 64-bit integer in [s, e) (surrounding blanks allowed). @return 0 or -1. */
static int rf_parse_i64(const char *s, const char *e, int64_t *out)
{
	s = rf_trim(s, &e);
	if (s == e)
		return -1;
	int neg = 0;
	if (*s == '-' || *s == '+')
		neg = *s++ == '-';
	if (s == e)
		return -1;
	uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	for (; s < e; s++) {
		unsigned d = (unsigned)(unsigned char)*s - '0';
		if (d > 9 || v > (lim - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = neg ? (int64_t)(0 - v) : (int64_t)v;
	return 0;
}

static int rf_check_id(rf_reader_t *r, uint64_t line, int why, const char *what, const char *s, size_t len,
                       mfs_id_t *id)
{
	int rc = mfs_id_parse(s, len, id);
	if (rc == 0)
		rc = mfs_id_check(id);
	if (rc == 0)
		return 0;
	if (len == 0)
		return rf_bad(r, line, why, "empty %s id", what) ? MFS_EPARSE : 1;
	if (rc == MFS_EIDLEN)
		return rf_bad(r, line, why, "%s id longer than %d bytes (%zu)", what, MFS_ID_MAX_LEN, len)
			? MFS_EPARSE : 1;
	return rf_bad(r, line, why, "%s id is not valid UTF-8", what) ? MFS_EPARSE : 1;
}

/* Split [s, e) into at most max fields at sep (':' means "::"). @return field count, or
 * max + 1 when there are more. */
static int rf_split(const char *s, const char *e, int fmt, const char **fs, const char **fe, int max)
{
	int n = 0;
	char sep = fmt == MFS_RFMT_TSV ? '\t' : fmt == MFS_RFMT_CSV ? ',' : ':';
	for (;;) {
		const char *p = s, *hit;
		for (;;) {
			hit = memchr(p, sep, (size_t)(e - p));
			if (!hit || sep != ':' || (hit + 1 < e && hit[1] == ':'))
				break;
			p = hit + 1; /* a single ':' belongs to the field */
		}
		if (n == max)
			return max + 1;
		fs[n] = s;
		fe[n] = hit ? hit : e;
		n++;
		if (!hit)
			return n;
		s = hit + (sep == ':' ? 2 : 1);
	}
}

/* Is this (first) CSV line a header? Yes when its rating field is not a number at all. */
static int rf_is_header(const char *s, const char *e)
{
	const char *fs[5], *fe[5];
	double v;
	int n = rf_split(s, e, MFS_RFMT_CSV, fs, fe, 4);
	return n >= 3 && rf_parse_double(fs[2], fe[2], &v) != 0;
}

/* One text line [s, e) without its '\n'. @return 0, MFS_EPARSE or the callback's value. */
static int rf_line(rf_reader_t *r, const char *s, const char *e)
{
	mfs_rfile_stats_t *st = r->st;
	uint64_t line = ++st->lines;
	if (e > s && e[-1] == '\r')
		e--;
	if (e == s)
		return 0; /* blank lines are ignored */
	if (!r->header_checked) {
		r->header_checked = 1;
		if (r->fmt == MFS_RFMT_CSV && rf_is_header(s, e))
			return 0;
	}
	const char *fs[5], *fe[5];
	int n = rf_split(s, e, r->fmt, fs, fe, 4);
	if (n < 3 || n > 4) {
		if (n > 4)
			return rf_bad(r, line, RF_BAD_FIELDS, "wrong field count (more than 4, expected 3 or 4)");
		return rf_bad(r, line, RF_BAD_FIELDS, "wrong field count (%d, expected 3 or 4)", n);
	}
	mfs_id_t user, item;
	int rc = rf_check_id(r, line, RF_BAD_USER, "user", fs[0], (size_t)(fe[0] - fs[0]), &user);
	if (rc)
		return rc < 0 ? rc : 0;
	rc = rf_check_id(r, line, RF_BAD_ITEM, "item", fs[1], (size_t)(fe[1] - fs[1]), &item);
	if (rc)
		return rc < 0 ? rc : 0;
	double v;
	if (rf_parse_double(fs[2], fe[2], &v))
		return rf_bad(r, line, RF_BAD_RATING, "rating is not a number");
	if (!isfinite(v))
		return rf_bad(r, line, RF_BAD_RATING, "rating is NaN or infinite");
	if (v < r->opts->rating_min || v > r->opts->rating_max)
		return rf_bad(r, line, RF_BAD_RATING, "rating %g outside [%g, %g]", v, r->opts->rating_min,
		              r->opts->rating_max);
	int64_t ts = 0;
	if (n == 4) {
		const char *ts_s = fs[3], *ts_e = fe[3];
		ts_s = rf_trim(ts_s, &ts_e);
		if (ts_s < ts_e && rf_parse_i64(ts_s, ts_e, &ts))
			return rf_bad(r, line, RF_BAD_TS, "timestamp is not a 64-bit integer");
	}
	st->accepted++;
	return r->cb ? r->cb(r->ctx, &user, &item, (float)v, ts, line) : 0;
}

/* Refill the buffer after compacting; sets r->eof when the source is exhausted. */
static int rf_refill(rf_reader_t *r)
{
	if (r->pos > 0) {
		memmove(r->buf, r->buf + r->pos, r->end - r->pos);
		r->end -= r->pos;
		r->pos = 0;
	}
	while (r->end < RF_BUF_SIZE && !r->eof) {
		size_t got;
		int rc = src_read(&r->src, r->buf + r->end, RF_BUF_SIZE - r->end, &got, r->errstr, r->errstr_size);
		if (rc) {
			if (rc > 0)
				mfs_errf(r->errstr, r->errstr_size, rc, "cannot read %s: %s", r->path, strerror(rc));
			else if (r->errstr && r->errstr_size) {
				char tmp[256];
				snprintf(tmp, sizeof tmp, "%s", r->errstr);
				mfs_errf(r->errstr, r->errstr_size, rc, "%s: %s", r->path, tmp);
			}
			return rc;
		}
		if (got == 0)
			r->eof = 1;
		r->end += got;
		if (got && memchr(r->buf + r->end - got, '\n', got))
			break; /* a whole line is there: parse before reading more */
	}
	return 0;
}

static int rf_read_text(rf_reader_t *r)
{
	int rc, skipping = 0;
	uint64_t skip_line = 0;
	for (;;) {
		unsigned char *nl = memchr(r->buf + r->pos, '\n', r->end - r->pos);
		if (nl) {
			if (skipping) { /* the tail of an over-long line */
				skipping = 0;
				r->pos = (size_t)(nl - r->buf) + 1;
				if ((rc = rf_bad(r, skip_line, RF_BAD_LONG, "line longer than %u bytes", RF_BUF_SIZE)))
					return rc;
				continue;
			}
			rc = rf_line(r, (const char *)r->buf + r->pos, (const char *)nl);
			r->pos = (size_t)(nl - r->buf) + 1;
			if (rc)
				return rc;
			continue;
		}
		if (r->eof) {
			if (skipping)
				return rf_bad(r, skip_line, RF_BAD_LONG, "line longer than %u bytes", RF_BUF_SIZE);
			if (r->pos < r->end) { /* last line without '\n' */
				rc = rf_line(r, (const char *)r->buf + r->pos, (const char *)r->buf + r->end);
				r->pos = r->end;
				return rc;
			}
			return 0;
		}
		if (r->pos == 0 && r->end == RF_BUF_SIZE) {
			/* no newline in a full buffer: drop it and skip to the next newline */
			if (!skipping)
				skip_line = ++r->st->lines;
			skipping = 1;
			r->pos = r->end;
		}
		if ((rc = rf_refill(r)))
			return rc;
	}
}

static inline uint64_t rf_le64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int k = 7; k >= 0; k--)
		v = (v << 8) | p[k];
	return v;
}

static int rf_read_bin(rf_reader_t *r)
{
	int rc;
	r->pos += RF_BIN_MAGIC_LEN;
	for (;;) {
		while (r->end - r->pos >= RF_BIN_REC) {
			const unsigned char *p = r->buf + r->pos;
			r->pos += RF_BIN_REC;
			uint64_t rec = ++r->st->lines;
			mfs_id_t user = mfs_id_u64(rf_le64(p)), item = mfs_id_u64(rf_le64(p + 8));
			uint32_t fb = (uint32_t)(rf_le64(p + 16) & 0xffffffffu);
			float v;
			memcpy(&v, &fb, sizeof v);
			int64_t ts = (int64_t)rf_le64(p + 20);
			if (!isfinite(v)) {
				if ((rc = rf_bad(r, rec, RF_BAD_RATING, "rating is NaN or infinite")))
					return rc;
				continue;
			}
			if (v < r->opts->rating_min || v > r->opts->rating_max) {
				if ((rc = rf_bad(r, rec, RF_BAD_RATING, "rating %g outside [%g, %g]", (double)v,
				                 r->opts->rating_min, r->opts->rating_max)))
					return rc;
				continue;
			}
			r->st->accepted++;
			if (r->cb && (rc = r->cb(r->ctx, &user, &item, v, ts, rec)))
				return rc;
		}
		if (r->eof) {
			size_t left = r->end - r->pos;
			r->pos = r->end;
			if (left)
				return rf_bad(r, ++r->st->lines, RF_BAD_TRUNC, "truncated record (%zu of %d bytes)", left,
				              RF_BIN_REC);
			return 0;
		}
		if ((rc = rf_refill(r)))
			return rc;
	}
}

static int rf_have_first(const rf_reader_t *r)
{
	const unsigned char *b = r->buf;
	size_t i = 0, n = r->end;
	if (n >= RF_BIN_MAGIC_LEN && memcmp(b, RF_BIN_MAGIC, RF_BIN_MAGIC_LEN) == 0)
		return 1;
	while (i < n && (b[i] == '\n' || b[i] == '\r'))
		i++;
	return i < n && memchr(b + i, '\n', n - i) != NULL;
}

/* Format from the first bytes of decoded data (buffer already filled). */
static int rf_detect(rf_reader_t *r, int want)
{
	const unsigned char *b = r->buf;
	size_t n = r->end;
	int is_bin = n >= RF_BIN_MAGIC_LEN && memcmp(b, RF_BIN_MAGIC, RF_BIN_MAGIC_LEN) == 0;
	if (want == MFS_RFMT_BIN || (want == MFS_RFMT_AUTO && is_bin)) {
		if (!is_bin)
			return mfs_errf(r->errstr, r->errstr_size, MFS_EFORMAT, "%s: no %s magic: not a binary ratings file",
			                r->path, RF_BIN_MAGIC);
		return MFS_RFMT_BIN;
	}
	if (want != MFS_RFMT_AUTO)
		return want;
	/* the first non-blank line decides */
	size_t i = 0;
	while (i < n && (b[i] == '\n' || b[i] == '\r'))
		i++;
	const unsigned char *s = b + i, *nl = memchr(s, '\n', n - i);
	size_t len = nl ? (size_t)(nl - s) : n - i;
	if (len == 0)
		return MFS_RFMT_AUTO; /* no data at all */
	for (size_t k = 0; k + 1 < len; k++)
		if (s[k] == ':' && s[k + 1] == ':')
			return MFS_RFMT_DAT;
	if (memchr(s, '\t', len))
		return MFS_RFMT_TSV;
	if (memchr(s, ',', len))
		return MFS_RFMT_CSV;
	return mfs_errf(r->errstr, r->errstr_size, MFS_EFORMAT,
	                "%s: cannot detect the format from the first line (no '::', tab or ',')", r->path);
}

static void rf_summary(rf_reader_t *r)
{
	mfs_rfile_stats_t *st = r->st;
	if (st->rejected == 0 || r->opts->fail_on_error)
		return;
	char qf[512], counts[256];
	size_t off = 0;
	counts[0] = 0;
	for (int k = 0; k < RF_BAD_N; k++)
		if (r->bad[k] && off < sizeof counts)
			off += (size_t)snprintf(counts + off, sizeof counts - off, " %s=%llu", rf_bad_key[k],
			                        (unsigned long long)r->bad[k]);
	mfs_warn(RF_MOD, "msg=\"bad input lines skipped\" file=%s format=%s rejected=%llu accepted=%llu "
	         "first_bad=%llu%s", mfs_log_quote(qf, sizeof qf, r->path), mfs_rfmt_name(r->fmt),
	         (unsigned long long)st->rejected, (unsigned long long)st->accepted,
	         (unsigned long long)st->first_bad_line, counts);
}

int mfs_rfile_read(const char *path, const mfs_rfile_opts_t *opts, mfs_rating_cb cb, void *ctx,
                   mfs_rfile_stats_t *stats, char *errstr, size_t errstr_size)
{
	mfs_rfile_stats_t local;
	mfs_rfile_opts_t defaults = {MFS_RFMT_AUTO, 0, -DBL_MAX, DBL_MAX, 10};
	if (!stats)
		stats = &local;
	memset(stats, 0, sizeof *stats);
	if (!path)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "no input path");
	if (!opts)
		opts = &defaults;
	if (opts->format < MFS_RFMT_AUTO || opts->format > MFS_RFMT_BIN)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "unknown input format %d", opts->format);

	rf_reader_t r;
	memset(&r, 0, sizeof r);
	r.path = path;
	r.opts = opts;
	r.st = stats;
	r.cb = cb;
	r.ctx = ctx;
	r.errstr = errstr;
	r.errstr_size = errstr_size;
	int rc = src_open(&r.src, path, errstr, errstr_size);
	if (rc)
		goto out;
	r.buf = malloc(RF_BUF_SIZE + 1);
	if (!r.buf) {
		rc = ENOMEM;
		goto out;
	}
	/* enough decoded bytes to see the magic or the whole first non-blank line */
	do {
		if ((rc = rf_refill(&r)))
			goto out;
	} while (!r.eof && r.end < RF_BUF_SIZE && !rf_have_first(&r));
	int fmt = rf_detect(&r, opts->format);
	if (fmt < 0) {
		rc = fmt;
		goto out;
	}
	r.fmt = stats->format = fmt;
	if (fmt == MFS_RFMT_AUTO)
		goto out; /* empty input: nothing accepted */
	rc = fmt == MFS_RFMT_BIN ? rf_read_bin(&r) : rf_read_text(&r);
	rf_summary(&r);
out:
	src_close(&r.src);
	free(r.buf);
	return rc;
}
