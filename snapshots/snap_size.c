/* snap_size.c - see snap_size.h. */
#include "snapshots/snap_size.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

/* LMDB's meta page (liblmdb mdb.c: MDB_page header, then MDB_meta), in native byte order with
 * pgno_t and mdb_size_t of the word size W = sizeof(size_t): the page header is mp_pgno (W),
 * mp_pad, mp_flags, mp_lower, mp_upper (u16 each); the meta is mm_magic, mm_version (u32),
 * mm_address, mm_mapsize (W), two MDB_db of 8 + 5 W bytes (the first's md_pad is the page size),
 * mm_last_pg, mm_txnid (W). lmdb.h does not publish this layout; its file format is frozen at
 * MDB_DATA_VERSION 1 (0.9.x). */
#define SNAP_LMDB_MAGIC 0xBEEFC0DEu
#define SNAP_LMDB_VERSION 1u
#define SNAP_LMDB_P_META 0x08u
#define SNAP_W sizeof(size_t)
#define SNAP_PAGEHDR (SNAP_W + 8)
#define SNAP_OFF_FLAGS (SNAP_W + 2)
#define SNAP_OFF_MAGIC SNAP_PAGEHDR
#define SNAP_OFF_VERSION (SNAP_PAGEHDR + 4)
#define SNAP_OFF_PSIZE (SNAP_PAGEHDR + 8 + 2 * SNAP_W)
#define SNAP_OFF_LAST_PG (SNAP_PAGEHDR + 24 + 12 * SNAP_W)
#define SNAP_OFF_TXNID (SNAP_PAGEHDR + 24 + 13 * SNAP_W)
#define SNAP_META_BYTES (SNAP_PAGEHDR + 24 + 14 * SNAP_W)

static uint64_t snap_word(const unsigned char *p)
{
	size_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

/* Refuse dir/data.mdb if it is shorter than its newest meta page says (see DESIGN). Returns 0
 * when the file is long enough and also when there is nothing to judge (no file, not an LMDB
 * file, another LMDB version): mdb_env_open then gives its own error, which is an error and not
 * a fault.
 * @return 0, MFS_EFORMAT with errstr "snapshot DIR/data.mdb is truncated: ...", or MFS_ENOTFOUND for
 *         an empty data.mdb */
int mfs_snap_check_size(const char *dir, char *errstr, size_t es)
{
	char path[4096];
	if (snprintf(path, sizeof path, "%s/data.mdb", dir) >= (int)sizeof path)
		return 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	unsigned char page[SNAP_META_BYTES];
	uint64_t last_pg = 0, txnid = 0;
	uint32_t psize = 0;
	off_t off = 0;
	int rc = 0;
	/* both metas, as LMDB reads them: the second sits one page (the first's page size) in, and
	 * the one with the larger txnid is the current snapshot */
	for (int i = 0; i < 2; i++) {
		ssize_t n = pread(fd, page, sizeof page, off);
		if (n != (ssize_t)sizeof page) {
			/* empty: a writer between creating the file and writing its metas (LMDB's own
			 * read-only open of an empty file fails with EBADF, which says nothing) */
			if (i == 0 && n == 0)
				rc = mfs_errf(errstr, es, MFS_ENOTFOUND, "no snapshot in %s yet (data.mdb is empty)", dir);
			if (i == 0)
				goto out; /* else not LMDB: mdb_env_open says so */
			break;        /* the second meta is cut off: judge by the first (needs 2 pages) */
		}
		uint16_t flags;
		uint32_t magic, version, ps;
		memcpy(&flags, page + SNAP_OFF_FLAGS, 2);
		memcpy(&magic, page + SNAP_OFF_MAGIC, 4);
		memcpy(&version, page + SNAP_OFF_VERSION, 4);
		memcpy(&ps, page + SNAP_OFF_PSIZE, 4);
		if (!(flags & SNAP_LMDB_P_META) || magic != SNAP_LMDB_MAGIC || version != SNAP_LMDB_VERSION)
			goto out;
		uint64_t t = snap_word(page + SNAP_OFF_TXNID);
		if (i == 0 || t > txnid) {
			txnid = t;
			last_pg = snap_word(page + SNAP_OFF_LAST_PG);
			psize = ps;
		}
		if (i == 0)
			off = ps;
	}
	/* a page size LMDB would not write means a damaged header: leave it to LMDB */
	if (psize < 512 || psize > 65536 || (psize & (psize - 1)))
		goto out;
	/* fstat after the metas: the file only grows, and the pages a meta names are written first */
	struct stat st;
	if (fstat(fd, &st) != 0)
		goto out;
	uint64_t need = last_pg < UINT64_MAX / psize ? (last_pg + 1) * psize : UINT64_MAX;
	if ((uint64_t)st.st_size < need)
		rc = mfs_errf(errstr, es, MFS_EFORMAT,
		              "snapshot %s is truncated: %lld bytes, the header says %" PRIu64 " (%" PRIu64
		              " pages of %" PRIu32 " bytes)",
		              path, (long long)st.st_size, need, last_pg + 1, psize);
out:
	close(fd);
	return rc;
}

