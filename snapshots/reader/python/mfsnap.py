#!/usr/bin/python3
"""mfsnap.py - read mfstream model snapshots (format v1) from Python.

Only python3-lmdb and numpy (Debian packages), no compiled extension: this file is the
proof that docs/SNAPSHOT_FORMAT.md is enough to read a snapshot in another language.

    from mfsnap import Snapshot
    snap = Snapshot("/var/lib/mfstream/snap")
    snap.meta()                  # {'format_version': 1, 'k': 64, 'seq': 12, ..., 'offset/ratings/0': 991}
    bias, vec = snap.user(42)    # u64 id; snap.user("alice") / snap.user("str:42") for strings
    snap.predict(42, "item-7")   # clipped; unknown ids fall back to mu + the known biases
    snap.topk(42, 10)            # [(item_id, score), ...] best first, none the user rated
    snap.topk(42, 10, exclude=[7, "item-3"])   # nor those
    snap.topk(42, 10, include_seen=True)       # the items the user rated may come back too
    snap.rated(42)               # the items the snapshot lists as rated by 42, newest last
    snap.staleness()             # (seq, age_ms) of the current snapshot

Ids: an int is a u64 id. A str is the id's text form, parsed like the C tools do: a
canonical decimal ("0", "42"; no sign, no leading zero, < 2**64) is a u64 id, "str:" forces
a string ("str:42"), anything else is a string id. Ids come back as int or str.

DESIGN: every call runs in one short read transaction, so the meta (mu, rating range) and
the rows it uses belong to one snapshot. When the writer has grown the map past ours, LMDB
raises MapResizedError at begin: we adopt the new size (set_mapsize(0); no transaction of
ours is live then) and begin again. Scores are computed as the C reader does - in float64,
((mu + b_u) + b_i) + sum_j p_j q_j accumulated in j order, then rounded to float32 - so the
two agree bit for bit. One Snapshot per directory per process: LMDB does not allow the same
environment to be opened twice in one process.

Top-K keeps every item of one snapshot in numpy arrays, keyed by the snapshot's seq: the
first topk() after a publish re-reads all items (a full scan; snapshots rewrite only touched
rows and say not which). A query then takes one float32 matrix-vector product (BLAS, any
summation order) and, from its proven error bound (|error| <= gamma_k sum_j |p_j q_ij|),
the items that can still be in the top k (np.partition over the lower bounds); only those
are rescored exactly, in j order. So the answer is exactly libmfsnap's (same items, order
and float32 scores), whatever the data.

CLI:
    mfsnap.py DIR                              the meta record as JSON
    mfsnap.py DIR --user ID | --item ID        {"user": ..., "bias": ..., "factors": [...]}
    mfsnap.py DIR --user ID --item ID          the prediction (one number)
    mfsnap.py DIR --user ID --top K            K lines "item score", best first, leaving out
                                               the items the user rated (user_rated)
              [--exclude ID,ID,...]            ... nor those items
              [--include-seen]                 ... listing the rated items too
    mfsnap.py DIR --dump                       every row: "users|items <id> <float32 bits in hex>..."
An error is one line on stderr, "mfsnap: ...", naming the directory, id or flag: exit 1, or
2 for bad arguments (as `mfstream query`).
"""

import argparse
import bisect
import json
import math
import os
import re
import signal
import struct
import sys
import time

try:
    import lmdb
    import numpy as np
except ImportError as e:
    if __name__ != "__main__":
        raise
    # the CLI: one line that says what to install, not a traceback
    sys.exit("mfsnap: %s: this reader needs python3-lmdb and python3-numpy "
             "(apt-get install python3-lmdb python3-numpy)" % e)

FORMAT_VERSION = 1
MAX_READERS = 1024          # same as the writer and libmfsnap (the lock file's table size)
ID_MAX = 256
TAG_U64 = 0x01
TAG_STR = 0x02
U64_MAX = (1 << 64) - 1

# meta key -> struct format (little-endian); offsets keys are "<q"
META_TYPES = {
    "format_version": "<I", "k": "<I", "dtype": None, "mu": "<d",
    "n_users": "<Q", "n_items": "<Q", "seq": "<Q", "wall_time_ms": "<q",
    "events_applied": "<Q", "learning_rate": "<d", "last_loss": "<d",
    "rating_min": "<d", "rating_max": "<d",
}
# optional v1 keys written by `mfstream serve` (absent from offline snapshots)
OPTIONAL_TYPES = {"mu_count": "<Q", "mu_sum": "<d", "prequential_rmse": "<d", "prequential_n": "<Q",
                  "prequential_window_rmse": "<d", "prequential_window_n": "<Q",
                  "prequential_cumulative_rmse": "<d", "prequential_cumulative_n": "<Q",
                  "events_held_out": "<Q", "events_digest": "<Q", "events_replayed": "<Q", "events_dropped": "<Q",
                  "holdout_rmse": "<d", "window_rmse": "<d"}
OFFSET_PREFIX = "offset/"
REJECTED_PREFIX = "rejected/"  # "rejected/<reason>" -> u64

_CANONICAL = re.compile(rb"0|[1-9][0-9]{0,19}")


class SnapshotError(Exception):
    """The directory is not a readable format-v1 snapshot."""


class SnapshotNotFound(SnapshotError, LookupError):
    """No snapshot has been published in the directory yet."""


class SnapshotVersionError(SnapshotError):
    """The snapshot has another format version."""


class SnapshotTruncatedError(SnapshotError):
    """data.mdb is shorter than its LMDB header says (a cut-off copy): mapping it would fault."""


# LMDB's meta page (liblmdb mdb.c: MDB_page header, then MDB_meta) in native byte order, with
# pgno_t and mdb_size_t of the word size W: page header mp_pgno (W), mp_pad, mp_flags, mp_lower,
# mp_upper (u16); meta mm_magic, mm_version (u32), mm_address, mm_mapsize (W), two MDB_db of
# 8 + 5 W bytes (the first's md_pad is the page size), mm_last_pg, mm_txnid (W). The same
# offsets as libmfsnap's snap_check_size.
_W = struct.calcsize("N")
_WORD = "=Q" if _W == 8 else "=I"
_PAGEHDR = _W + 8
_META_BYTES = _PAGEHDR + 24 + 14 * _W


def _check_size(path):
    """Raise SnapshotTruncatedError if path/data.mdb is shorter than its newest meta page's
    last page. Reading the metas before the size keeps this free of false alarms while a
    writer runs (LMDB writes a commit's pages before its meta and never shrinks the file).
    Anything that is not a readable LMDB header is left to lmdb.open to report."""
    name = os.path.join(path, "data.mdb")
    try:
        f = open(name, "rb")
    except OSError:
        return
    with f:
        best = None
        off = 0
        for i in range(2):
            f.seek(off)
            page = f.read(_META_BYTES)
            if len(page) != _META_BYTES:
                if i == 0:
                    if not page:
                        raise SnapshotNotFound("no snapshot in %s yet (data.mdb is empty)" % path)
                    return
                break           # the second meta is cut off: judge by the first
            flags, = struct.unpack_from("=H", page, _W + 2)
            magic, version = struct.unpack_from("=II", page, _PAGEHDR)
            psize, = struct.unpack_from("=I", page, _PAGEHDR + 8 + 2 * _W)
            last_pg, = struct.unpack_from(_WORD, page, _PAGEHDR + 24 + 12 * _W)
            txnid, = struct.unpack_from(_WORD, page, _PAGEHDR + 24 + 13 * _W)
            if not flags & 0x08 or magic != 0xBEEFC0DE or version != 1:
                return
            if best is None or txnid > best[0]:
                best = (txnid, last_pg, psize)
            if i == 0:
                off = psize     # the second meta sits one (first meta's) page in
        _, last_pg, psize = best
        if not 512 <= psize <= 65536 or psize & (psize - 1):
            return
        size = os.fstat(f.fileno()).st_size
    need = (last_pg + 1) * psize
    if size < need:
        raise SnapshotTruncatedError("snapshot %s is truncated: %d bytes, the header says %d (%d pages of %d bytes)"
                                     % (name, size, need, last_pg + 1, psize))


# ---- ids -----------------------------------------------------------------------------------
def parse_id(ident):
    """Id -> int (u64) or str (string id), by the text rules above."""
    if isinstance(ident, bool):
        raise TypeError("an id is an int or a str")
    if isinstance(ident, (int, np.integer)):
        v = int(ident)
        if not 0 <= v <= U64_MAX:
            raise ValueError("u64 id out of range: %d" % v)
        return v
    if isinstance(ident, str):
        raw = ident.encode("utf-8", "surrogateescape")
    elif isinstance(ident, (bytes, bytearray)):
        raw = bytes(ident)
    else:
        raise TypeError("an id is an int or a str, not %s" % type(ident).__name__)
    if _CANONICAL.fullmatch(raw) and int(raw) <= U64_MAX:
        return int(raw)
    if raw.startswith(b"str:"):
        raw = raw[4:]
    if not 1 <= len(raw) <= ID_MAX:
        raise ValueError("id empty or longer than %d bytes" % ID_MAX)
    return raw.decode("utf-8", "surrogateescape")


def encode_key(ident):
    """The LMDB key of an id: 0x01 + 8-byte big-endian u64, or 0x02 + UTF-8 bytes."""
    v = parse_id(ident)
    if isinstance(v, int):
        return bytes([TAG_U64]) + v.to_bytes(8, "big")
    return bytes([TAG_STR]) + v.encode("utf-8", "surrogateescape")


def decode_key(key):
    """LMDB key -> int or str."""
    key = bytes(key)
    if len(key) == 9 and key[0] == TAG_U64:
        return int.from_bytes(key[1:], "big")
    if 2 <= len(key) <= 1 + ID_MAX and key[0] == TAG_STR:
        return key[1:].decode("utf-8", "surrogateescape")
    raise SnapshotError("malformed row key %r" % key)


def format_id(v):
    """The text form of an id (the inverse of parse_id): strings that would read back as a
    number, or that start with "str:", get the "str:" prefix."""
    if isinstance(v, int):
        return str(v)
    raw = v.encode("utf-8", "surrogateescape")
    if (_CANONICAL.fullmatch(raw) and int(raw) <= U64_MAX) or raw.startswith(b"str:"):
        return "str:" + v
    return v


# ---- the reader ------------------------------------------------------------------------------
class Snapshot:
    """A read-only view of the snapshot directory `path` (always the latest snapshot)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            if os.path.exists(self.path):
                raise SnapshotError("%s is not a directory (a snapshot is a directory)" % self.path)
            raise SnapshotNotFound("no snapshot in %s yet (no such directory)" % self.path)
        if not os.path.exists(os.path.join(self.path, "data.mdb")):
            raise SnapshotNotFound("no snapshot in %s yet (no data.mdb)" % self.path)
        # before mapping: a truncated file must be an error, not a SIGBUS on first touch
        _check_size(self.path)
        # lock=True: the writer must see our reader slots (never read without them)
        try:
            self._env = lmdb.open(self.path, readonly=True, lock=True, max_dbs=4,
                                  max_readers=MAX_READERS, subdir=True, create=False)
        except lmdb.Error as e:
            raise SnapshotError("LMDB: %s" % e) from None   # py-lmdb names the path
        try:
            # open_db without a txn: py-lmdb then commits the txn it opens the DBI in (a
            # read-only txn we commit ourselves is only reset, which would close the DBI)
            for attempt in range(16):
                try:
                    dbs = [self._env.open_db(n, create=False) for n in (b"meta", b"users", b"items")]
                    break
                except lmdb.MapResizedError:
                    self._env.set_mapsize(0)
            else:
                raise SnapshotError("%s: the map keeps growing under us" % self.path)
        except lmdb.NotFoundError:
            self._env.close()
            raise SnapshotNotFound("no snapshot in %s yet (no meta database)" % self.path) from None
        self._meta_db, self._users, self._items = dbs
        self._rated_db = None       # user_rated: optional (an older writer's snapshots lack it)
        self._rated_tried = None    # the seq of the last try to open it
        self._cache = None          # _ItemCache of the last snapshot top-K saw
        try:
            with self._txn() as txn:
                self._read_meta(txn)
        except Exception:
            self._env.close()
            raise

    def close(self):
        self._env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- transactions --
    def _begin(self):
        for _ in range(16):
            try:
                return self._env.begin(buffers=False)
            except lmdb.MapResizedError:
                # the writer grew the map past ours; no txn of ours is live: adopt its size
                self._env.set_mapsize(0)
        raise SnapshotError("%s: the map keeps growing under us" % self.path)

    class _Txn:
        def __init__(self, snap):
            self.txn = snap._begin()

        def __enter__(self):
            return self.txn

        def __exit__(self, *exc):
            self.txn.abort()

    def _txn(self):
        return Snapshot._Txn(self)

    # -- meta --
    def _read_meta(self, txn):
        raw = {bytes(k).decode("ascii", "replace"): bytes(v) for k, v in txn.cursor(db=self._meta_db)}
        if "seq" not in raw:
            raise SnapshotNotFound("no snapshot in %s yet (nothing published)" % self.path)
        meta = {}
        for key, val in raw.items():
            if key.startswith(OFFSET_PREFIX):
                fmt = "<q"
            elif key.startswith(REJECTED_PREFIX):
                fmt = "<Q"
            elif key in META_TYPES:
                fmt = META_TYPES[key]
            elif key in OPTIONAL_TYPES:
                fmt = OPTIONAL_TYPES[key]
            else:
                meta[key] = val.hex()        # a key from a newer writer
                continue
            if fmt is None:
                meta[key] = val.decode("ascii")
            elif len(val) != struct.calcsize(fmt):
                raise SnapshotError("meta %s: %d bytes" % (key, len(val)))
            else:
                meta[key] = struct.unpack(fmt, val)[0]
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise SnapshotVersionError("%s holds snapshot format version %s; this reader reads %d"
                                       % (self.path, version, FORMAT_VERSION))
        if meta.get("dtype") != "f32":
            raise SnapshotError("%s: dtype %r is not f32" % (self.path, meta.get("dtype")))
        for key in META_TYPES:
            if key not in meta:
                raise SnapshotError("%s: meta record has no %s" % (self.path, key))
        return meta

    def meta(self):
        """Every meta record as a dict (offsets as "offset/<topic>/<partition>": int)."""
        with self._txn() as txn:
            return self._read_meta(txn)

    # -- rows --
    @staticmethod
    def _decode_row(val, k):
        if len(val) != 4 * (1 + k):
            raise SnapshotError("row value of %d bytes, expected %d" % (len(val), 4 * (1 + k)))
        row = np.frombuffer(val, dtype="<f4")
        return float(row[0]), row[1:].astype(np.float32)

    def _row(self, txn, db, ident, k):
        val = txn.get(encode_key(ident), db=db)
        return None if val is None else self._decode_row(val, k)

    def user(self, ident):
        """(bias, factors) of a user; KeyError if unknown."""
        return self._entity(self._users, "user", ident)

    def item(self, ident):
        """(bias, factors) of an item; KeyError if unknown."""
        return self._entity(self._items, "item", ident)

    def _entity(self, db, what, ident):
        with self._txn() as txn:
            meta = self._read_meta(txn)
            row = self._row(txn, db, ident, meta["k"])
        if row is None:
            raise KeyError("%s %s is not in the snapshot" % (what, format_id(parse_id(ident))))
        return row

    # -- scoring --
    @staticmethod
    def _clip(r, meta):
        lo, hi = meta["rating_min"], meta["rating_max"]
        if lo <= hi:
            r = min(max(r, lo), hi)
        return r

    def predict(self, user, item, known=None):
        """Predicted rating mu + b_u + b_i + p.q, clipped to [rating_min, rating_max]. An
        unknown id falls back to mu + the known biases (no factor term). If `known` is a list,
        [user_known, item_known] is appended to it."""
        with self._txn() as txn:
            meta = self._read_meta(txn)
            ru = self._row(txn, self._users, user, meta["k"])
            ri = self._row(txn, self._items, item, meta["k"])
        r = meta["mu"]
        if ru is not None:
            r += ru[0]
        if ri is not None:
            r += ri[0]
        if ru is not None and ri is not None:
            acc = 0.0
            for a, b in zip(ru[1].tolist(), ri[1].tolist()):
                acc += a * b            # exact products, summed in j order like the C reader
            r += acc
        if known is not None:
            known.extend([ru is not None, ri is not None])
        return float(np.float32(self._clip(r, meta)))

    def _item_cache(self, txn, meta):
        """The _ItemCache of this txn's snapshot: reused while seq is unchanged, else rebuilt
        from every item row (a full scan)."""
        if self._cache is not None and self._cache.seq == meta["seq"]:
            return self._cache
        self._cache = None              # free the old arrays before building the new ones
        self._cache = _ItemCache(txn, self._items, meta)
        return self._cache

    def staleness(self):
        """(seq, age_ms) of the current snapshot: age from this host's clock (may be < 0 if the
        clock stepped back)."""
        with self._txn() as txn:
            meta = self._read_meta(txn)
        return meta["seq"], int(time.time() * 1000) - meta["wall_time_ms"]

    def _rated(self, seq):
        """The user_rated DBI, or None while the environment has none. Opened without a txn
        (py-lmdb commits the one it opens it in), so only between our txns; tried again once
        per new snapshot until it exists."""
        if self._rated_db is None and self._rated_tried != seq:
            self._rated_tried = seq
            for _ in range(16):
                try:
                    self._rated_db = self._env.open_db(b"user_rated", create=False)
                    break
                except lmdb.NotFoundError:
                    break
                except lmdb.MapResizedError:
                    self._env.set_mapsize(0)
        return self._rated_db

    def _rated_keys(self, txn, db, user):
        """The encoded item keys of user's user_rated record (oldest first), [] if none."""
        if db is None:
            return []
        try:
            raw = txn.get(encode_key(user), db=db)
        except lmdb.Error:              # a DBI newer than this txn (like libmfsnap's EINVAL)
            return []
        if raw is None:
            return []
        raw = bytes(raw)
        if len(raw) < 4:
            raise SnapshotError("malformed user_rated record of %d bytes" % len(raw))
        n, pos, keys = struct.unpack_from("<I", raw)[0], 4, []
        for _ in range(n):
            if len(raw) - pos < 2:
                raise SnapshotError("malformed user_rated record")
            ln = struct.unpack_from("<H", raw, pos)[0]
            if ln < 2 or ln > ID_MAX + 1 or len(raw) - pos - 2 < ln:
                raise SnapshotError("malformed user_rated record")
            keys.append(raw[pos + 2:pos + 2 + ln])
            pos += 2 + ln
        if pos != len(raw):
            raise SnapshotError("malformed user_rated record (trailing bytes)")
        return keys

    def rated(self, user):
        """The items the snapshot lists as rated by user (snapshot.seen_items), oldest first:
        [] when it has no list for the user, or no user_rated database."""
        with self._txn() as txn:
            seq = self._read_meta(txn)["seq"]
        db = self._rated(seq)
        with self._txn() as txn:
            return [decode_key(key) for key in self._rated_keys(txn, db, user)]

    def topk(self, user, k, exclude=(), include_seen=False):
        """The k best items for user by unclipped score, best first: [(item_id, score)].
        Ties go to the smaller key. Items in `exclude` (ids; unknown ones are ignored) and,
        unless include_seen, the items the snapshot lists as rated by the user (rated()) are
        never returned. KeyError if the user is unknown."""
        if k < 0:
            raise ValueError("k < 0")
        ex_keys = [encode_key(x) for x in exclude]
        db = self._rated_db
        if not include_seen and db is None:   # not open (yet): try once per new snapshot
            with self._txn() as txn:
                db = self._rated(self._read_meta(txn)["seq"])
        with self._txn() as txn:
            meta = self._read_meta(txn)
            ru = self._row(txn, self._users, user, meta["k"])
            if ru is None:
                raise KeyError("user %s is not in the snapshot" % format_id(parse_id(user)))
            if not include_seen:        # the same txn as the row: one snapshot
                ex_keys += self._rated_keys(txn, db, user)
            cache = self._item_cache(txn, meta)
        n = len(cache.keys)
        if k == 0 or n == 0:
            return []
        excluded = {i for i in (cache.index(key) for key in ex_keys) if i is not None}
        kk = min(n, k + len(excluded))
        base = meta["mu"] + ru[0]
        cand = cache.candidates(ru[1], base, kk)
        # exact scores of the candidates: float64, summed in j order, as the C reader does
        p = ru[1].astype(np.float64)
        qc = cache.q if len(cand) == n else cache.q[cand]
        acc = np.zeros(len(cand), dtype=np.float64)
        for j in range(meta["k"]):
            acc += qc[:, j].astype(np.float64) * p[j]
        scores = ((base + cache.bias[cand]) + acc).astype(np.float32)
        order = np.lexsort((cand, -scores))   # by score, then index (= key order)
        out = []
        for o in order:
            i = int(cand[o])
            if i in excluded:
                continue
            out.append((cache.ids[i], float(scores[o])))
            if len(out) == k:
                break
        return out

    def rows(self, which):
        """Iterate (id, bias, factors) over "users" or "items" in key order (one txn)."""
        db = {"users": self._users, "items": self._items}[which]
        with self._txn() as txn:
            k = self._read_meta(txn)["k"]
            out = [(decode_key(key), *self._decode_row(bytes(val), k)) for key, val in txn.cursor(db=db)]
        return out


class _ItemCache:
    """Every item row of one snapshot (seq): keys and ids in key order, biases (float64) and
    factors (float32, n x k, contiguous), and each row's max |q_ij| for the error bound."""

    def __init__(self, txn, db, meta):
        k = meta["k"]
        rb = 4 * (1 + k)
        keys, vals = [], []
        for key, val in txn.cursor(db=db):
            if len(val) != rb:
                raise SnapshotError("item row of %d bytes, expected %d" % (len(val), rb))
            keys.append(bytes(key))
            vals.append(val)
        m = np.frombuffer(b"".join(vals), dtype="<f4").reshape(len(vals), 1 + k)
        self.seq = meta["seq"]
        self.keys = keys                 # sorted: LMDB's byte order is Python's bytes order
        self.ids = [decode_key(key) for key in keys]
        self.bias = m[:, 0].astype(np.float64)
        self.q = np.ascontiguousarray(m[:, 1:], dtype=np.float32)
        self.rowmax = np.abs(self.q).max(axis=1).astype(np.float64) if len(keys) else np.zeros(0)

    def index(self, key):
        """Position of an encoded key, or None."""
        i = bisect.bisect_left(self.keys, key)
        return i if i < len(self.keys) and self.keys[i] == key else None

    def candidates(self, p, base, kk):
        """Indices of the items that can be among the kk best (all of them if unsure).
        The float32 product's error is at most gamma_k * sum_j |p_j q_ij| <= gamma_k *
        ||p||_1 * rowmax_i (any summation order, FMA or not); the bounds use 2 (k + 2) 2^-24
        for gamma_k plus 2^-20 of the magnitudes (float32 rounding of the final score)."""
        n, k = self.q.shape
        if kk >= n:
            return np.arange(n)
        with np.errstate(over="ignore", invalid="ignore"):
            dot = (self.q @ p.astype(np.float32)).astype(np.float64)
            eps = (2.0 * (k + 2) * 2.0 ** -24) * float(np.abs(p.astype(np.float64)).sum()) * self.rowmax
            mid = (base + self.bias) + dot
            slack = (abs(base) + np.abs(self.bias) + np.abs(dot) + eps) * 2.0 ** -20 + 2.0 ** -120
            lo = mid - eps - slack
            up = mid + eps + slack
        if not (np.isfinite(lo).all() and np.isfinite(up).all()):
            return np.arange(n)
        thr = np.partition(lo, n - kk)[n - kk]          # the kk-th largest lower bound
        return np.flatnonzero(up >= thr)


# ---- CLI ---------------------------------------------------------------------------------------
def _json_meta(meta):
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in meta.items()}


def _bits(x):
    return "%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


class _CliError(Exception):
    """A user error of the CLI: one line on stderr and exit status `code`."""

    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code


class _ArgParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, as `mfstream query`'s are (--help has the rest)."""

    def error(self, message):
        raise _CliError("%s (mfsnap.py --help for usage)" % message, 2)


def main(argv=None):
    """The CLI. Every user error - bad arguments, a missing or foreign directory, an unknown id,
    LMDB refusing the files, output that cannot be written - is one line on stderr naming the
    thing, and a non-zero exit (1, or 2 for usage); a traceback is a bug. The library itself
    raises (SnapshotError, KeyError, ValueError, lmdb.Error)."""
    try:
        rc = _main(argv)
        sys.stdout.flush()   # a full disk must fail here, not in the interpreter's exit
        return rc
    except _CliError as e:
        msg, rc = str(e), e.code
    except SnapshotError as e:
        msg, rc = str(e), 1
    except lmdb.Error as e:
        msg, rc = "LMDB: %s" % e, 1
    except OSError as e:
        if e.filename is None:   # the one unnamed file here is standard output
            msg = "writing the output: %s" % (e.strerror or e)
            # what is still buffered cannot be written either: let the exit flush go nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        else:
            msg = "%s: %s" % (e.filename, e.strerror or e)
        rc = 1
    print("mfsnap: %s" % msg, file=sys.stderr)
    return rc


def _cli_id(flag, text):
    """Check an id given on the command line before any work; the error names the flag."""
    try:
        parse_id(text)
    except ValueError as e:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise _CliError('%s "%s": %s' % (flag, shown, e), 2) from None
    return text


def _main(argv):
    ap = _ArgParser(prog="mfsnap.py", description="Read an mfstream snapshot.")
    ap.add_argument("dir")
    ap.add_argument("--user")
    ap.add_argument("--item")
    ap.add_argument("--top", type=int)
    ap.add_argument("--exclude", help="with --top: comma-separated item ids never to list")
    ap.add_argument("--include-seen", action="store_true",
                    help="with --top: list the items the user rated too (left out by default)")
    ap.add_argument("--dump", action="store_true", help="every row, float32 bits in hex")
    a = ap.parse_args(argv)
    if a.top is not None and (a.user is None or a.item is not None or a.top < 1):
        ap.error("--top K (K >= 1) needs --user and no --item")
    if a.exclude is not None and a.top is None:
        ap.error("--exclude needs --top")
    if a.include_seen and a.top is None:
        ap.error("--include-seen needs --top")
    for flag, text in (("--user", a.user), ("--item", a.item)):
        if text is not None:
            _cli_id(flag, text)
    exclude = [_cli_id("--exclude", x) for x in a.exclude.split(",") if x] if a.exclude else []
    try:
        snap = Snapshot(a.dir)
    except SnapshotError as e:
        print("mfsnap: %s" % e, file=sys.stderr)
        return 1
    try:
        if a.dump:
            for which in ("users", "items"):
                for ident, bias, vec in snap.rows(which):
                    print(which, format_id(ident), _bits(bias), *(_bits(x) for x in vec.tolist()))
        elif a.user is not None and a.top is not None:
            for ident, score in snap.topk(a.user, a.top, exclude, include_seen=a.include_seen):
                print("%s %.9g" % (format_id(ident), score))
        elif a.user is not None and a.item is not None:
            known = []
            r = snap.predict(a.user, a.item, known)
            for what, ok, ident in (("user", known[0], a.user), ("item", known[1], a.item)):
                if not ok:
                    print("mfsnap: %s %s is not in the snapshot; fallback used" % (what, ident),
                          file=sys.stderr)
            print("%.9g" % r)
        elif a.user is not None or a.item is not None:
            what, ident = ("user", a.user) if a.user is not None else ("item", a.item)
            bias, vec = snap.user(ident) if what == "user" else snap.item(ident)
            print(json.dumps({what: format_id(parse_id(ident)), "bias": bias, "factors": vec.tolist()}))
        else:
            print(json.dumps(_json_meta(snap.meta()), indent=2))
    except KeyError as e:
        print("mfsnap: %s" % e.args[0], file=sys.stderr)
        return 1
    except ValueError as e:
        print("mfsnap: %s" % e, file=sys.stderr)
        return 2
    finally:
        snap.close()
    return 0


if __name__ == "__main__":
    # as a C tool does: `mfsnap.py DIR --dump | head` and ^C end the process quietly
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(main())
