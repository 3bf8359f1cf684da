"""The disk tier: a table's rows and optimizer state in a file on local disk, hot rows in a RAM cache.

    <path>                     the live file: a 4 KiB JSON header, then R records of W + S bytes
                               (record r = row r's weight bytes, padded to D_pad, then its fp32 state)
    <path>.snapshots/<n>       checkpoint snapshots (clones of the live file, see `snapshot`)
    <path>.snapshots/pins.json what still names a snapshot: {holder path: n} (see `pin`)

The cache is C slots of the table group's weight and state buffers: a batch's rows are mapped to
slots before the lookup (`prepare`), so the lookup and the fused backward run on the cached rows
with the kernels of in-memory tables. Memory is known up front: C * (W + S) bytes for the slots,
4 bytes per row for the row -> slot map, 24 bytes per slot for the LRU list, stamps and flags.

Why a memory-mapped file and not RocksDB (rocksdict): rows are fixed-size records addressed by a
dense row number, so the file offset is the index; the cache kernels copy records straight from
and to the mapping with no Python per row. `benchmarks/tiered.py` (its `record store` case) compares random
record reads from the mapping with rocksdict's batched `get` (figures in benchmarks/README.md), and
RocksDB's compaction would compete for the same cores.

Crash safety: the header's `clean` flag is cleared (and fsync'ed) before the first write into the
records after an open or a flush, and set again by `flush` after the records are msync'ed. A file
whose flag is clear may hold a torn record: it is never used silently; lookups raise until a
checkpoint restores it. An unclean file of which no snapshot exists (a run killed before its first
checkpoint: nothing of it was committed) is created afresh when the table is built, with a logged line
saying so; the fresh rows are drawn as at the first creation, so a restarted run with the same seed
trains as the killed one would have. A snapshot is written under a temporary name and renamed when
complete, so a torn one never counts. Checkpoints clone the live file (`FICLONE`, a reflink: copy-on-write and
instant on btrfs/XFS; elsewhere `copy_file_range`, an in-kernel copy that never passes through
this process's memory). A hard link would not do: the live file is written in place afterwards.

A checkpoint or a model file names its snapshot by number, so a snapshot lives as long as something
names it: `snapshot` deletes the old ones beyond the KEEP_SNAPSHOTS newest, except those pinned by a
holder (a checkpoint directory, a model file) that still exists. Without pins the best checkpoint, an
older checkpoint kept by keep_checkpoints > 3 or a model file written earlier would lose its rows to
the rotation once three newer snapshots were taken.
"""

from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hugerec.ops import row_cache

log = logging.getLogger(__name__)

HEADER_BYTES = 4096
MAGIC = "hugerec-disk-tier-1"
PINNED = 2  # batches whose slots no prepare may take: the one being trained and the one prepared next
KEEP_SNAPSHOTS = 3  # newest snapshots kept per table, beside the pinned ones (see `pin`)
PINS = "pins.json"  # in snapshot_dir: {absolute holder path: snapshot number}
_FICLONE = 0x40049409
_INIT_CHUNK = 1 << 16  # rows initialised per write when a file is created
# Touched pages of a shared mapping count in the process's RSS, and a table larger than memory would
# fill it with them. A tier whose file is larger than UNMAP_ABOVE unmaps its pages (madvise DONTNEED)
# once MAPPED_BYTES of them may be mapped: 26 such tables leave at most 26 x 4 MiB mapped between
# batches (plus one batch's pages). A smaller file stays mapped (its RSS share is at most its size):
# re-mapping pages after each batch cost 40% of the step in benchmarks/tiered.py's default sizes.
MAPPED_BYTES = 4 << 20
UNMAP_ABOVE = 256 << 20
# What one record access may map: the kernel maps up to 64 KiB of cached pages around a faulting page
# (fault-around) beside the record's own pages.
_MAPPED_PER_ACCESS = 64 << 10

# (weights [n, dim] storage dtype, state [n, S] fp32) of rows start .. start + n - 1 at creation
Fill = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


class DiskTier:
    """One table's file and its hot-row cache (slots = views of the table group's buffers)."""

    def __init__(
        self,
        path: str | Path,
        layout: dict[str, Any],
        weight_cache: torch.Tensor,
        state_cache: torch.Tensor,
        fill: Fill,
    ) -> None:
        """layout: the header fields a file must match (table, num_rows, dim, dtype, optimizer, row_bytes,
        state_bytes). weight_cache [C, D_pad], state_cache [C, S]: the slots, contiguous CPU views."""
        self.path = Path(path)
        self.layout = dict(layout)
        self.table = str(layout["table"])
        self.num_rows = int(layout["num_rows"])
        self.row_bytes, self.state_bytes = int(layout["row_bytes"]), int(layout["state_bytes"])
        self.record_bytes = self.row_bytes + self.state_bytes
        slots = weight_cache.shape[0]
        self.wcache = weight_cache.view(torch.uint8).numpy().reshape(slots, self.row_bytes)
        self.scache = state_cache.view(torch.uint8).numpy().reshape(slots, self.state_bytes)
        self.slots = slots
        self.lock = threading.Lock()
        self.counters = np.zeros(4, dtype=np.int64)
        self.prepare_seconds = 0.0
        self.needs_restore: str | None = None  # why the live file may not be used
        self._snapshot: int | None = None  # the newest snapshot, and whether rows changed since
        self._changed = True
        self._restored: int | None = None  # the snapshot the live file was last restored from
        if not self.path.exists():
            self._create(fill)
        self._open()
        if self.needs_restore is not None and not self._snapshots():
            log.warning(
                "table %r: %r was not closed cleanly and no checkpoint snapshot of it exists (a run killed "
                "before its first checkpoint: nothing of it was committed); creating it afresh",
                self.table,
                str(self.path),
            )
            del self.file
            self._map.close()
            self.path.unlink()  # killed before the new file is in place: the next build creates it
            self._create(fill)
            self._open()
        self._reset_cache()

    # -- the file ----------------------------------------------------------------------------------
    def _header(self, clean: bool) -> bytes:
        text = json.dumps({"magic": MAGIC, **self.layout, "clean": clean}).encode()
        assert len(text) < HEADER_BYTES, "header fields fit in 4 KiB"
        return text.ljust(HEADER_BYTES, b" ")

    def _create(self, fill: Fill) -> None:
        size = HEADER_BYTES + self.num_rows * self.record_bytes
        parent = self.path.parent
        if not parent.is_dir():
            raise ValueError(f"table {self.table!r}: path {str(self.path)!r}: directory {str(parent)!r} does not exist")
        free = shutil.disk_usage(parent).free
        if free < size:
            raise ValueError(
                f"table {self.table!r}: path {str(self.path)!r} needs {size:,} bytes on disk "
                f"({self.num_rows:,} rows x {self.record_bytes} bytes), the disk has {free:,} free"
            )
        tmp = parent / f".{self.path.name}.creating.{os.getpid()}"  # ranks of one machine may create it at once
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                raise ValueError(
                    f"table {self.table!r}: path {str(self.path)!r}: cannot reserve {size:,} bytes: {e.strerror}"
                ) from None
            os.pwrite(fd, self._header(True), 0)
            self._write_records(fd, fill)  # pwrite, not a mapping: the new file's pages never count in RSS
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        _fsync_dir(parent)

    def _write_records(self, fd: int, fill: Fill) -> None:
        """Every record from `fill`, written through `fd` in chunks of _INIT_CHUNK rows."""
        for start in range(0, self.num_rows, _INIT_CHUNK):
            n = min(_INIT_CHUNK, self.num_rows - start)
            os.pwrite(fd, self._records(*fill(start, n)).data, HEADER_BYTES + start * self.record_bytes)

    def _records(self, weights: torch.Tensor, state: torch.Tensor) -> np.ndarray:
        """[n, W + S] uint8 records of weights [n, dim] and state [n, S] fp32."""
        n, dim = weights.shape
        out = np.zeros((n, self.record_bytes), dtype=np.uint8)
        itemsize = weights.element_size()
        padded = torch.zeros(n, self.row_bytes // itemsize, dtype=weights.dtype)
        padded[:, :dim] = weights
        out[:, : self.row_bytes] = padded.view(torch.uint8).numpy().reshape(n, self.row_bytes)
        out[:, self.row_bytes :] = state.contiguous().view(torch.uint8).numpy().reshape(n, self.state_bytes)
        return out

    def _open(self) -> None:
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            raw = f.read(HEADER_BYTES)
        try:
            header = json.loads(raw.decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError(f"table {self.table!r}: {str(self.path)!r} is not a hugerec disk-tier file") from None
        if not isinstance(header, dict) or header.get("magic") != MAGIC:
            raise ValueError(f"table {self.table!r}: {str(self.path)!r} is not a hugerec disk-tier file")
        for key, want in self.layout.items():
            if header.get(key) != want:
                raise ValueError(
                    f"table {self.table!r}: {str(self.path)!r} holds another layout: {key} = {header.get(key)!r}, "
                    f"this table has {want!r}"
                )
        expected = HEADER_BYTES + self.num_rows * self.record_bytes
        if size != expected:
            raise ValueError(
                f"table {self.table!r}: {str(self.path)!r} is {size:,} bytes, its layout needs {expected:,}"
            )
        self.needs_restore = None
        if header.get("clean") is not True:
            self.needs_restore = (
                f"table {self.table!r}: {str(self.path)!r} was not closed cleanly (a crash during a write-back?); "
                "load a checkpoint (it restores the file from its snapshot) or delete the file to start afresh"
            )
        with open(self.path, "r+b") as f:  # the mapping keeps its own reference to the file
            self._map = mmap.mmap(f.fileno(), size - HEADER_BYTES, offset=HEADER_BYTES)
        self._map.madvise(mmap.MADV_RANDOM)  # rows are read at random: no read-ahead around each record
        self.file = np.frombuffer(self._map, dtype=np.uint8).reshape(self.num_rows, self.record_bytes)
        self._touched = 0  # bytes of file pages possibly mapped since the last `_unmap_pages`
        self.file_clean = header.get("clean") is True

    def _set_clean(self, clean: bool) -> None:
        with open(self.path, "r+b") as f:
            f.write(self._header(clean))
            f.flush()
            os.fsync(f.fileno())
        self.file_clean = clean

    def _writable(self) -> None:
        """Before the first write into the records since the last flush: mark the file unclean."""
        if self.needs_restore is not None:
            raise ValueError(self.needs_restore)
        if self.file_clean:
            self._set_clean(False)

    def flush(self) -> None:
        """Writes the dirty cached rows back, msyncs the file and marks it clean. The rows of the last
        PINNED - 1 prepares stay dirty: their update may still be coming (the pipeline's next batch)."""
        with self.lock:
            if self.needs_restore is not None:
                return
            keep = int(self.state[row_cache.CLOCK]) - PINNED + 2
            self.counters[row_cache.WRITES] += row_cache.flush(
                self.row_of_slot, self.stamp, self.dirty, keep, self.file, self.wcache, self.scache
            )
            self._map.flush()
            self._unmap_pages()
            self._maybe_dirty = bool(self.dirty.any())
            if not self.file_clean:
                self._set_clean(True)

    # -- the cache ---------------------------------------------------------------------------------
    def _reset_cache(self) -> None:
        c = self.slots
        self.slot_of_row = np.full(self.num_rows, -1, dtype=np.int32)
        self.row_of_slot = np.full(c, -1, dtype=np.int64)
        self.prev = np.arange(-1, c - 1, dtype=np.int32)
        self.nxt = np.arange(1, c + 1, dtype=np.int32)
        self.nxt[-1] = -1
        self.stamp = np.full(c, -(1 << 40), dtype=np.int64)  # older than any prepare
        self.dirty = np.zeros(c, dtype=np.uint8)
        self.state = np.array([0, c - 1, 0], dtype=np.int64)  # HEAD, TAIL, CLOCK
        self._maybe_dirty = False

    def prepare(self, ids: np.ndarray, missing_ok: bool, update: bool) -> np.ndarray:
        """Cache slots [n] int64 of rows `ids` [n] int64 (-1 kept when missing_ok), loading missed rows.

        Raises ValueError with the index of the first id outside [0, R) as `.args[1]`, or when the
        cache cannot hold the rows of the batches in flight."""
        if self.needs_restore is not None:
            raise ValueError(self.needs_restore)
        out = np.empty(len(ids), dtype=np.int64)
        started = time.perf_counter()
        with self.lock:
            if update or self._maybe_dirty:  # evictions write dirty rows back
                self._writable()
            self._maybe_dirty |= update
            self._changed |= update
            moved = int(self.counters[row_cache.READS] + self.counters[row_cache.WRITES])
            code = row_cache.prepare(
                ids, missing_ok, update, PINNED, self.slot_of_row, self.row_of_slot, self.prev, self.nxt,
                self.stamp, self.dirty, self.state, self.file, self.wcache, self.scache, out, self.counters,
            )  # fmt: skip
            self._account(int(self.counters[row_cache.READS] + self.counters[row_cache.WRITES]) - moved)
        self.prepare_seconds += time.perf_counter() - started
        if code == row_cache.BAD_ID:
            raise ValueError(
                f"table {self.table!r}: id {int(ids[out[0]])} is outside [0, {self.num_rows})", int(out[0])
            )
        if code == row_cache.CACHE_FULL:
            raise ValueError(
                f"table {self.table!r}: cache of {self.slots} rows is too small for the rows of the last {PINNED} "
                f"batches (this one alone touches {len(np.unique(ids))}); raise cache_rows"
            )
        return out

    def _account(self, records: int) -> None:
        """After `records` records were read or written through the mapping: unmap its pages when the
        pages they may have touched pass MAPPED_BYTES (a file no larger than UNMAP_ABOVE is left mapped)."""
        if self._map.size() <= UNMAP_ABOVE:
            return
        self._touched += records * (self.record_bytes + _MAPPED_PER_ACCESS)
        if self._touched > MAPPED_BYTES:
            self._unmap_pages()

    def _unmap_pages(self) -> None:
        """Drops the mapping's pages from this process (MADV_DONTNEED): on a shared file mapping the data,
        dirty or not, stays in the kernel's page cache (written back by it or by msync); a later access
        maps the page again. The process's RSS then holds the cache slots, not the file."""
        self._map.madvise(mmap.MADV_DONTNEED)
        self._touched = 0

    # -- whole-record access (read_rows / write_rows / reset_rows) ----------------------------------
    def read(self, rows: np.ndarray) -> np.ndarray:
        """[n, W + S] uint8 records of rows [n] (cached rows from their slots)."""
        if self.needs_restore is not None:
            raise ValueError(self.needs_restore)
        out = np.empty((len(rows), self.record_bytes), dtype=np.uint8)
        with self.lock:
            row_cache.gather(rows, self.slot_of_row, self.file, self.wcache, self.scache, out)
            self._account(len(rows))
        return out

    def write(self, rows: np.ndarray, records: np.ndarray) -> None:
        with self.lock:
            self._writable()
            self._maybe_dirty = self._changed = True
            row_cache.scatter(rows, records, self.slot_of_row, self.dirty, self.file, self.wcache, self.scache)
            self._account(len(rows))

    def fill_all(self, fill: Fill) -> None:
        """Re-initialises every row (reset_rows(None)): the cache is dropped, the file rewritten."""
        with self.lock:
            self._writable()
            self._reset_cache()
            self._changed = True
            self._unmap_pages()
            fd = os.open(self.path, os.O_RDWR)
            try:
                self._write_records(fd, fill)
            finally:
                os.close(fd)

    # -- checkpoints -------------------------------------------------------------------------------
    @property
    def snapshot_dir(self) -> Path:
        return self.path.parent / f"{self.path.name}.snapshots"

    def snapshot(self) -> int:
        """Flushes, then clones the live file to snapshot_dir/<n> (n returned); keeps the KEEP_SNAPSHOTS newest."""
        self.flush()
        if self.needs_restore is not None:
            raise ValueError(self.needs_restore)
        if self._snapshot is not None and not self._changed and (self.snapshot_dir / str(self._snapshot)).is_file():
            return self._snapshot  # nothing written since: one snapshot however often state_dict() is called
        d = self.snapshot_dir
        d.mkdir(exist_ok=True)
        taken = self._snapshots()
        n = taken[-1] + 1 if taken else 1
        partial = d / f".{n}.partial"  # renamed to <n> once complete: a torn snapshot never counts as one
        with self.lock:
            try:
                _clone(self.path, partial)
                os.replace(partial, d / str(n))
                _fsync_dir(d)
            except OSError as e:  # a full disk: no partial snapshot is left, the live file is untouched
                partial.unlink(missing_ok=True)
                raise OSError(
                    e.errno, f"table {self.table!r}: cannot write the checkpoint's snapshot {str(d / str(n))!r} "
                    f"({self.path.stat().st_size:,} bytes): {e.strerror}"
                ) from None
        pinned = set(self._pins().values())
        for old in taken[: max(0, len(taken) + 1 - KEEP_SNAPSHOTS)]:
            if old not in pinned:
                (d / str(old)).unlink(missing_ok=True)
        self._snapshot, self._changed, self._restored = n, False, None
        return n

    def pin(self, n: int, holder: str | Path) -> None:
        """Keeps snapshot n while `holder` exists: a checkpoint directory or a model file whose state names n
        (pinning a holder again moves its pin). The pins file is replaced atomically; holders that are gone
        are dropped from it here."""
        if not (self.snapshot_dir / str(n)).is_file():
            raise ValueError(f"table {self.table!r}: cannot pin snapshot {n}: {str(self.snapshot_dir / str(n))!r} does not exist")
        pins = self._pins()
        pins[str(Path(holder).resolve())] = int(n)
        tmp = self.snapshot_dir / f".{PINS}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(pins, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.snapshot_dir / PINS)
        _fsync_dir(self.snapshot_dir)

    def _pins(self) -> dict[str, int]:
        """{holder: snapshot} of the holders that still exist."""
        path = self.snapshot_dir / PINS
        if not path.is_file():
            return {}
        try:
            pins = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"table {self.table!r}: {str(path)!r} is not a pins file: {e}") from None
        if not isinstance(pins, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in pins.values()):
            raise ValueError(f"table {self.table!r}: {str(path)!r} is not a pins file: not an object of snapshot numbers")
        return {k: v for k, v in pins.items() if Path(k).exists()}

    def _snapshots(self) -> list[int]:
        """The numbers of the complete snapshots in snapshot_dir, oldest first."""
        d = self.snapshot_dir
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []

    def restore(self, n: int) -> None:
        """Makes the live file a clone of snapshot n and empties the cache (a checkpoint's rows)."""
        source = self.snapshot_dir / str(n)
        if self._restored == n and not self._changed and self.needs_restore is None:
            return  # restored from n and untouched since (a checkpoint load restores before reading the model)
        if not source.is_file():
            raise ValueError(f"table {self.table!r}: the checkpoint's snapshot {str(source)!r} does not exist")
        with self.lock:
            del self.file
            self._map.close()
            tmp = self.path.parent / f".{self.path.name}.restoring"
            _clone(source, tmp)
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
            self._reset_cache()
            self._open()
            self._snapshot, self._changed = n, False
        if self.needs_restore is not None:
            raise ValueError(f"table {self.table!r}: snapshot {str(source)!r} is not clean")
        self._restored = n

    def stats(self) -> dict[str, float]:
        c = self.counters
        return {
            "hits": float(c[row_cache.HITS]),
            "misses": float(c[row_cache.MISSES]),
            "rows_read": float(c[row_cache.READS]),
            "rows_written": float(c[row_cache.WRITES]),
            "prepare_s": self.prepare_seconds,
        }


def _clone(source: Path, target: Path) -> None:
    """target = a copy of source that never passes through this process: a reflink where the file
    system has them, else copy_file_range (in the kernel); fsync'ed."""
    with open(source, "rb") as src, open(target, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
        except OSError:
            size = os.fstat(src.fileno()).st_size
            done = 0
            while done < size:
                n = os.copy_file_range(src.fileno(), dst.fileno(), size - done, done, done)
                if n == 0:
                    raise OSError(f"copy_file_range stopped at {done} of {size} bytes copying {source}") from None
                done += n
        dst.flush()
        os.fsync(dst.fileno())


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
