/* ratings_writer.c - write offline rating files (ratings_file.h: tsv, dat, csv, bin; plain,
 * gzip, zstd): gen, tests, conversion.
 *
 * DESIGN: a 1 MiB text/record buffer flushed to stdio, gzwrite or ZSTD_compressStream2.
 * Ratings are written in the shortest fixed-point form (up to 9 decimals) that reads back to
 * the same float, so writer -> reader (ratings_file.c) round trips exactly.
 */
#include "ingest/ratings_file.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "common/err.h"
#include "ingest/ratings_file_int.h"

struct mfs_rfile_writer {
	int w_format;
	int w_comp;            /* RF_RAW, RF_GZIP, RF_ZSTD */
	FILE *w_f;             /* RF_RAW and RF_ZSTD */
	int w_own;             /* w_f is ours to close */
	gzFile w_gz;
	ZSTD_CCtx *w_zc;
	unsigned char *w_zbuf; /* compressed output */
	size_t w_zcap;
	char *w_buf;
	size_t w_len;
	int w_err;             /* sticky first error */
};

static int has_suffix(const char *s, size_t len, const char *suf)
{
	size_t n = strlen(suf);
	return len >= n && strncmp(s + len - n, suf, n) == 0;
}

static int wr_sink(mfs_rfile_writer_t *w, const void *p, size_t n)
{
	errno = 0;
	if (n && fwrite(p, 1, n, w->w_f) != n)
		return errno ? errno : EIO;
	return 0;
}

static int wr_zstd(mfs_rfile_writer_t *w, const void *p, size_t n, ZSTD_EndDirective mode)
{
	ZSTD_inBuffer ib = {p, n, 0};
	for (;;) {
		ZSTD_outBuffer ob = {w->w_zbuf, w->w_zcap, 0};
		size_t left = ZSTD_compressStream2(w->w_zc, &ob, &ib, mode);
		if (ZSTD_isError(left))
			return MFS_ECOMPRESS;
		int rc = wr_sink(w, w->w_zbuf, ob.pos);
		if (rc)
			return rc;
		if (mode == ZSTD_e_end ? left == 0 : ib.pos == ib.size)
			return 0;
	}
}

static int wr_flush(mfs_rfile_writer_t *w)
{
	if (w->w_err || w->w_len == 0)
		return w->w_err;
	int rc = 0;
	if (w->w_comp == RF_GZIP) {
		if (gzwrite(w->w_gz, w->w_buf, (unsigned)w->w_len) != (int)w->w_len) {
			int zerr;
			gzerror(w->w_gz, &zerr);
			rc = zerr == Z_ERRNO ? (errno ? errno : EIO) : MFS_ECOMPRESS;
		}
	} else if (w->w_comp == RF_ZSTD) {
		rc = wr_zstd(w, w->w_buf, w->w_len, ZSTD_e_continue);
	} else {
		rc = wr_sink(w, w->w_buf, w->w_len);
	}
	w->w_len = 0;
	w->w_err = rc;
	return rc;
}

int mfs_rfile_writer_open(const char *path, int format, mfs_rfile_writer_t **out, char *errstr,
                          size_t errstr_size)
{
	*out = NULL;
	if (!path)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "no output path");
	size_t len = strlen(path);
	int comp = RF_RAW;
	if (has_suffix(path, len, ".gz")) {
		comp = RF_GZIP;
		len -= 3;
	} else if (has_suffix(path, len, ".zst")) {
		comp = RF_ZSTD;
		len -= 4;
	}
	if (format == MFS_RFMT_AUTO)
		format = has_suffix(path, len, ".bin") ? MFS_RFMT_BIN
		         : has_suffix(path, len, ".csv") ? MFS_RFMT_CSV
		         : has_suffix(path, len, ".dat") ? MFS_RFMT_DAT
		                                         : MFS_RFMT_TSV;
	if (format < MFS_RFMT_TSV || format > MFS_RFMT_BIN)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "unknown output format %d", format);

	mfs_rfile_writer_t *w = calloc(1, sizeof *w);
	if (!w)
		return ENOMEM;
	w->w_format = format;
	w->w_comp = comp;
	int rc = 0;
	w->w_buf = malloc(RF_BUF_SIZE);
	if (!w->w_buf) {
		rc = ENOMEM;
		goto fail;
	}
	int is_stdout = strcmp(path, "-") == 0;
	if (comp == RF_GZIP) {
		w->w_gz = gzopen(path, "wb");
		if (!w->w_gz) {
			rc = errno ? errno : ENOMEM;
			mfs_errf(errstr, errstr_size, rc, "cannot create %s: %s", path, strerror(rc));
			goto fail;
		}
		gzbuffer(w->w_gz, 256u << 10);
	} else {
		w->w_f = is_stdout ? stdout : fopen(path, "wb");
		if (!w->w_f) {
			rc = errno;
			mfs_errf(errstr, errstr_size, rc, "cannot create %s: %s", path, strerror(rc));
			goto fail;
		}
		w->w_own = !is_stdout;
		if (comp == RF_ZSTD) {
			w->w_zc = ZSTD_createCCtx();
			w->w_zcap = ZSTD_CStreamOutSize();
			w->w_zbuf = malloc(w->w_zcap);
			if (!w->w_zc || !w->w_zbuf) {
				rc = ENOMEM;
				goto fail;
			}
			ZSTD_CCtx_setParameter(w->w_zc, ZSTD_c_compressionLevel, 3);
			ZSTD_CCtx_setParameter(w->w_zc, ZSTD_c_checksumFlag, 1);
		}
	}
	if (format == MFS_RFMT_CSV) {
		static const char hdr[] = "userId,movieId,rating,timestamp\n";
		memcpy(w->w_buf, hdr, sizeof hdr - 1);
		w->w_len = sizeof hdr - 1;
	} else if (format == MFS_RFMT_BIN) {
		memcpy(w->w_buf, RF_BIN_MAGIC, RF_BIN_MAGIC_LEN);
		w->w_len = RF_BIN_MAGIC_LEN;
	}
	*out = w;
	return 0;
fail:
	mfs_rfile_writer_close(w);
	return rc;
}

static char *wr_u64(char *p, uint64_t v)
{
	char tmp[20];
	int n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		*p++ = tmp[--n];
	return p;
}

static char *wr_i64(char *p, int64_t v)
{
	if (v < 0) {
		*p++ = '-';
		return wr_u64(p, 0 - (uint64_t)v);
	}
	return wr_u64(p, (uint64_t)v);
}

/* The shortest fixed-point text (0..9 decimals) that parses back to exactly v; the check
 * uses the same arithmetic as the reader's fast path. Large or odd values use %.9g. */
static char *wr_float(char *p, float v)
{
	double a = fabs((double)v);
	if (isfinite(v) && a < 1e6) {
		for (int d = 0; d <= 9; d++) {
			double m = nearbyint(a * rf_pow10[d]);
			if ((float)(m / rf_pow10[d]) == (float)a) {
				uint64_t im = (uint64_t)m;
				if (v < 0 && im)
					*p++ = '-';
				p = wr_u64(p, im / (uint64_t)rf_pow10[d]);
				if (d) {
					*p++ = '.';
					uint64_t fr = im % (uint64_t)rf_pow10[d];
					for (int k = d - 1; k >= 0; k--) {
						p[k] = (char)('0' + fr % 10);
						fr /= 10;
					}
					p += d;
				}
				return p;
			}
		}
	}
	return p + snprintf(p, 32, "%.9g", (double)v);
}

/* Text form of an id for a text format, refusing ids the format cannot carry. */
static int wr_id(mfs_rfile_writer_t *w, char **pp, const mfs_id_t *id)
{
	if (id->kind == MFS_ID_U64) {
		*pp = wr_u64(*pp, id->num);
		return 0;
	}
	if (mfs_id_check(id))
		return MFS_EINVAL;
	char tmp[MFS_ID_MAX_LEN + 8];
	mfs_id_format(id, tmp, sizeof tmp);
	size_t n = strlen(tmp);
	char sep = w->w_format == MFS_RFMT_TSV ? '\t' : w->w_format == MFS_RFMT_CSV ? ',' : 0;
	for (size_t k = 0; k < n; k++) {
		char c = tmp[k];
		/* a separator, a line break, or (dat) a ':' that would run into "::" */
		if (c == '\n' || c == '\r' || c == sep ||
		    (sep == 0 && c == ':' && (k == 0 || k == n - 1 || tmp[k + 1] == ':')))
			return MFS_EFORMAT; /* would not read back as the same id */
	}
	memcpy(*pp, tmp, n);
	*pp += n;
	return 0;
}

static void wr_le64(unsigned char *p, uint64_t v)
{
	for (int k = 0; k < 8; k++)
		p[k] = (unsigned char)(v >> (8 * k));
}

int mfs_rfile_write(mfs_rfile_writer_t *w, const mfs_id_t *user, const mfs_id_t *item, float rating,
                    int64_t ts)
{
	if (w->w_err)
		return w->w_err;
	/* the longest record: two quoted string ids, a rating, a timestamp */
	if (RF_BUF_SIZE - w->w_len < 2 * (MFS_ID_MAX_LEN + 8) + 64 && wr_flush(w))
		return w->w_err;
	char *p0 = w->w_buf + w->w_len, *p = p0;
	if (w->w_format == MFS_RFMT_BIN) {
		if (user->kind != MFS_ID_U64 || item->kind != MFS_ID_U64)
			return MFS_EFORMAT; /* string ids have no binary form */
		unsigned char *b = (unsigned char *)p;
		uint32_t fb;
		memcpy(&fb, &rating, sizeof fb);
		wr_le64(b, user->num);
		wr_le64(b + 8, item->num);
		for (int k = 0; k < 4; k++)
			b[16 + k] = (unsigned char)(fb >> (8 * k));
		wr_le64(b + 20, (uint64_t)ts);
		w->w_len += RF_BIN_REC;
		return 0;
	}
	const char *sep = w->w_format == MFS_RFMT_TSV ? "\t" : w->w_format == MFS_RFMT_CSV ? "," : "::";
	size_t sl = strlen(sep);
	int rc;
	if ((rc = wr_id(w, &p, user)))
		return rc;
	memcpy(p, sep, sl);
	p += sl;
	if ((rc = wr_id(w, &p, item)))
		return rc;
	memcpy(p, sep, sl);
	p += sl;
	p = wr_float(p, rating);
	memcpy(p, sep, sl);
	p += sl;
	p = wr_i64(p, ts);
	*p++ = '\n';
	w->w_len += (size_t)(p - p0);
	return 0;
}

int mfs_rfile_writer_close(mfs_rfile_writer_t *w)
{
	if (!w)
		return 0;
	int rc = w->w_buf ? wr_flush(w) : 0;
	if (w->w_zc) {
		if (!rc)
			rc = wr_zstd(w, NULL, 0, ZSTD_e_end);
		ZSTD_freeCCtx(w->w_zc);
	}
	if (w->w_gz) {
		int zr = gzclose(w->w_gz);
		if (!rc && zr != Z_OK)
			rc = zr == Z_ERRNO ? (errno ? errno : EIO) : MFS_ECOMPRESS;
	}
	if (w->w_f) {
		if (w->w_own) {
			if (fclose(w->w_f) && !rc)
				rc = errno ? errno : EIO;
		} else if (fflush(w->w_f) && !rc) {
			rc = errno ? errno : EIO;
		}
	}
	free(w->w_zbuf);
	free(w->w_buf);
	free(w);
	return rc;
}
