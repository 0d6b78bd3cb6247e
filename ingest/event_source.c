/* event_source.c - event streams for the producer: a ratings file in timestamp order, or the
 * planted synthetic model of `mfstream gen`.
 *
 * DESIGN: a file is read whole (mfs_rfile_read) into 32-byte records plus one arena for
 * string ids (records hold offsets, so the arena may grow while reading), then ordered by
 * a bottom-up merge sort on the timestamp: merge sort is stable, so ties keep file order,
 * and it is O(n log n) in the worst case; a file already in order skips it. Tens of
 * millions of ratings fit (about 64 bytes each at the peak, while sorting).
 *
 * The synthetic stream is ingest/synth.c, the generator behind `mfstream gen`: for the same
 * gen.* keys it yields exactly the ratings gen writes, in the same order.
 */
#include "ingest/event_source.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/grow.h"
#include "ingest/synth.h"

#define SECONDS_BELOW 100000000000LL /* |ts| < 1e11 in a text file: seconds (year < 5138) */

/* One rating of a file. An id with len 0 is the u64 in u/i; otherwise u/i is the offset of
 * len bytes in the arena. */
typedef struct fs_rec {
	int64_t ts;
	uint64_t u, i;
	float r;
	uint16_t ulen, ilen;
} fs_rec_t;

enum { SRC_FILE = 1, SRC_SYNTH = 2 };

struct mfs_evsrc {
	int es_kind;
	uint64_t es_n, es_pos; /* events in all, events returned */
	/* file */
	fs_rec_t *es_rec;
	char *es_arena;
	size_t es_arena_len, es_arena_cap, es_rec_cap;
	int es_sorted;
	/* synthetic */
	mfs_synth_t *es_syn;
};

/* ---- file ------------------------------------------------------------------------------ */

static int arena_put(mfs_evsrc_t *s, const char *p, size_t len, uint64_t *off)
{
	if (mfs_grow((void **)&s->es_arena, &s->es_arena_cap, s->es_arena_len + len, 1))
		return ENOMEM;
	memcpy(s->es_arena + s->es_arena_len, p, len);
	*off = s->es_arena_len;
	s->es_arena_len += len;
	return 0;
}

static int put_id(mfs_evsrc_t *s, const mfs_id_t *id, uint64_t *v, uint16_t *len)
{
	if (id->kind == MFS_ID_U64) {
		*v = id->num;
		*len = 0;
		return 0;
	}
	*len = id->len; /* 1..256: the reader rejects empty and longer ids */
	return arena_put(s, id->str, id->len, v);
}

static int file_cb(void *ctx, const mfs_id_t *user, const mfs_id_t *item, float rating, int64_t ts, uint64_t line)
{
	(void)line;
	mfs_evsrc_t *s = ctx;
	if (mfs_grow((void **)&s->es_rec, &s->es_rec_cap, s->es_n + 1, sizeof *s->es_rec))
		return ENOMEM;
	fs_rec_t *r = &s->es_rec[s->es_n];
	r->ts = ts;
	r->r = rating;
	int rc;
	if ((rc = put_id(s, user, &r->u, &r->ulen)) || (rc = put_id(s, item, &r->i, &r->ilen)))
		return rc;
	s->es_n++;
	return 0;
}

/* Stable bottom-up merge sort of a[0..n) by ts, using tmp[0..n). */
static void sort_by_ts(fs_rec_t *a, fs_rec_t *tmp, size_t n)
{
	fs_rec_t *src = a, *dst = tmp;
	for (size_t w = 1; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
			size_t i = lo, j = mid, k = lo;
			while (i < mid && j < hi) /* <= keeps the left (earlier) one first: stable */
				dst[k++] = src[j].ts < src[i].ts ? src[j++] : src[i++];
			while (i < mid)
				dst[k++] = src[i++];
			while (j < hi)
				dst[k++] = src[j++];
		}
		fs_rec_t *t = src;
		src = dst;
		dst = t;
	}
	if (src != a)
		memcpy(a, src, n * sizeof *a);
}

int mfs_evsrc_open_file(const char *path, const mfs_rfile_opts_t *opts, mfs_evsrc_t **out,
                        mfs_rfile_stats_t *st, char *errstr, size_t errstr_size)
{
	*out = NULL;
	mfs_rfile_stats_t st_local;
	if (!st)
		st = &st_local;
	mfs_evsrc_t *s = calloc(1, sizeof *s);
	if (!s)
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	s->es_kind = SRC_FILE;
	int rc = mfs_rfile_read(path, opts, file_cb, s, st, errstr, errstr_size);
	if (rc) {
		if (rc == ENOMEM)
			mfs_errf(errstr, errstr_size, ENOMEM, "%s: out of memory after %llu ratings", path,
			         (unsigned long long)s->es_n);
		goto fail;
	}
	if (s->es_n == 0) {
		rc = mfs_errf(errstr, errstr_size, MFS_EEMPTY, "%s: no valid rating", path);
		goto fail;
	}
	int64_t maxabs = 0;
	int ordered = 1;
	for (uint64_t k = 0; k < s->es_n; k++) {
		int64_t t = s->es_rec[k].ts;
		maxabs = llabs(t) > maxabs ? llabs(t) : maxabs;
		if (k && t < s->es_rec[k - 1].ts)
			ordered = 0;
	}
	if (st->format != MFS_RFMT_BIN && maxabs < SECONDS_BELOW)
		for (uint64_t k = 0; k < s->es_n; k++)
			s->es_rec[k].ts *= 1000;
	if (!ordered) {
		fs_rec_t *tmp = malloc(s->es_n * sizeof *tmp);
		if (!tmp) {
			rc = mfs_errf(errstr, errstr_size, ENOMEM, "%s: out of memory sorting %llu ratings", path,
			              (unsigned long long)s->es_n);
			goto fail;
		}
		sort_by_ts(s->es_rec, tmp, s->es_n);
		free(tmp);
		s->es_sorted = 1;
	}
	*out = s;
	return 0;
fail:
	mfs_evsrc_close(s);
	return rc;
}

static inline mfs_id_t rec_id(const mfs_evsrc_t *s, uint64_t v, uint16_t len)
{
	if (!len)
		return mfs_id_u64(v);
	mfs_id_t id = {MFS_ID_STR, len, 0, s->es_arena + v};
	return id;
}

/* ---- synthetic ------------------------------------------------------------------------- */

int mfs_evsrc_open_synth(const mfs_conf_t *c, mfs_evsrc_t **out, char *errstr, size_t errstr_size)
{
	*out = NULL;
	mfs_evsrc_t *s = calloc(1, sizeof *s);
	if (!s)
		return mfs_errf(errstr, errstr_size, ENOMEM, "out of memory");
	s->es_kind = SRC_SYNTH;
	int rc = mfs_synth_open(c, &s->es_syn, errstr, errstr_size);
	if (rc) {
		free(s);
		return rc;
	}
	s->es_n = mfs_synth_count(s->es_syn);
	*out = s;
	return 0;
}

/* ---- common ---------------------------------------------------------------------------- */

int mfs_evsrc_next(mfs_evsrc_t *s, mfs_event_t *ev)
{
	if (s->es_pos >= s->es_n)
		return 0;
	ev->op = MFS_OP_RATE;
	if (s->es_kind == SRC_FILE) {
		const fs_rec_t *r = &s->es_rec[s->es_pos++];
		ev->user = rec_id(s, r->u, r->ulen);
		ev->item = rec_id(s, r->i, r->ilen);
		ev->rating = r->r;
		ev->has_ts = r->ts != 0;
		ev->ts_ms = r->ts;
		return 1;
	}
	uint64_t u, i;
	if (!mfs_synth_next(s->es_syn, &u, &i, &ev->rating, &ev->ts_ms))
		return 0;
	s->es_pos++;
	ev->user = mfs_id_u64(u + 1);
	ev->item = mfs_id_u64(i + 1);
	ev->has_ts = 1;
	return 1;
}

uint64_t mfs_evsrc_count(const mfs_evsrc_t *s) { return s->es_n; }

int mfs_evsrc_was_sorted(const mfs_evsrc_t *s) { return s->es_sorted; }

void mfs_evsrc_close(mfs_evsrc_t *s)
{
	if (!s)
		return;
	free(s->es_rec);
	free(s->es_arena);
	mfs_synth_close(s->es_syn);
	free(s);
}
