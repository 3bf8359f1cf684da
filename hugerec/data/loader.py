"""Loader: Parquet shards -> Batch(dense [B, Dd] float32, sparse SparseFeatures, labels [B]) with a prefetch thread.

How an epoch is laid out (everything below is computed from file metadata, before reading a row):

    row groups of all files          g0 g1 g2 g3 g4 g5 g6 g7
    shuffled with (seed, epoch)      g5 g2 g7 g0 g3 g6 g1 g4
    rank r of W takes every W-th     rank 0: g5 g7 g3 g1      rank 1: g2 g0 g6 g4
    windows of >= shuffle_buffer     [g5 g7] [g3 g1]          (rows permuted inside a window
      rows, rows permuted inside       with (seed, epoch, rank, window))
    batch k = rows [k*B, (k+1)*B) of the rank's row sequence; a batch may span two windows

So the epoch is a pure function of (files, seed, epoch, rank, W, B): resuming at batch k starts
reading at the window holding row k*B, and N batches + resume == one uninterrupted run. With
W > 1 every rank yields the same number of batches (the smallest over ranks), so collective
ops stay in step; the few rows past that are left out of this epoch and counted in `rows_left_out`.

Each window is decoded once (Arrow, multithreaded) into NumPy arrays: dense [R, Dd] and labels
are then served as zero-copy slices; sparse values are gathered feature-major per batch (one copy).
Batches are read-only views of loader buffers: clone before writing into them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from numba import njit

from hugerec.data.schema import Column, Schema
from hugerec.data.shards import expand_paths
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


@dataclass(frozen=True)
class _RowGroup:
    file: int  # index into the loader's paths
    index: int  # row group index inside the file
    num_rows: int
    verified: bool  # Parquet statistics proved no nulls in labels/dense and ids in range


@dataclass(frozen=True)
class _Window:
    groups: tuple[_RowGroup, ...]
    index: int  # window number inside this rank's epoch (seeds its permutation)
    start: int  # first row of the window in the rank's row sequence

    @property
    def num_rows(self) -> int:
        return sum(g.num_rows for g in self.groups)


@dataclass(frozen=True)
class _Plan:
    """One rank's epoch."""

    windows: tuple[_Window, ...]
    num_rows: int  # rows served this epoch (after equalizing ranks)
    num_batches: int
    rows_left_out: int


@dataclass
class _Sparse:
    """One sparse feature of a decoded window (R rows)."""

    values: np.ndarray  # single-hot: [R] ids as stored (int32/int64; junk where invalid); multi-hot: [N] ids
    valid: np.ndarray | None = None  # single-hot with nulls: [R] bool
    offsets: np.ndarray | None = None  # multi-hot: [R + 1] int64 (already in window order)


@dataclass
class _Columns:
    """A decoded window: R rows as NumPy arrays; `order` [R] permutes rows (None = file order)."""

    labels: np.ndarray  # [R] or [R, T] float32
    dense: np.ndarray  # [R, Dd] float32
    sparse: list[_Sparse]
    order: np.ndarray | None


class Loader:
    """Iterable of `Batch`es over Parquet shards; see the module docstring for the epoch layout.

    paths           a glob, a directory, a file or a list of them
    schema          label, dense and sparse columns to read (sparse: int ids, or lists of ids if multi_hot)
    batch_size      B
    shuffle         shuffle row-group order and rows inside a window of `shuffle_buffer` rows
    seed            with the epoch, fixes the order (same seed -> same batches)
    drop_last       drop a last batch smaller than B
    rank/world_size this process reads every world_size-th row group of the shuffled order
    prefetch        batches kept ready by the background thread
    shuffle_buffer  rows permuted together; memory is bounded by about 3 decoded windows of this many rows
                    (one being served, one queued, one being decoded), whatever the dataset size. Larger
                    mixes more but gathers from more memory: on the 2-core dev box a shuffled epoch cost
                    1.9 / 2.2 / 2.7 CPU-s per 2M criteo-like rows at 65k / 131k / 262k rows (1.5 unshuffled)
    """

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        schema: Schema,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 4,
        shuffle_buffer: int = 1 << 17,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"Loader: batch_size must be > 0, got {batch_size}")
        if world_size <= 0 or not 0 <= rank < world_size:
            raise ValueError(f"Loader: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if prefetch < 1:
            raise ValueError(f"Loader: prefetch must be >= 1, got {prefetch}")
        if shuffle_buffer < 1:
            raise ValueError(f"Loader: shuffle_buffer must be >= 1, got {shuffle_buffer}")
        self.paths = expand_paths(paths)
        self.schema = schema
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.prefetch = prefetch
        self.shuffle_buffer = shuffle_buffer
        self._columns = [c.name for c in (*schema.labels, *schema.dense, *schema.sparse)]
        self._sparse_names = schema.sparse_names
        self._metadata = [pq.read_metadata(p) for p in self.paths]
        for path, md in zip(self.paths, self._metadata, strict=True):
            _check_file_schema(path, md.schema.to_arrow_schema(), schema)
        self._groups = [
            _RowGroup(f, i, md.row_group(i).num_rows, _verify_statistics(self.paths[f], md, i, schema))
            for f, md in enumerate(self._metadata)
            for i in range(md.num_row_groups)
            if md.row_group(i).num_rows > 0
        ]
        if len(self._groups) < world_size:
            raise ValueError(
                f"Loader: {len(self._groups)} non-empty row groups in {len(self.paths)} files cannot be split over "
                f"{world_size} ranks; write smaller row groups (ShardWriter row_group_rows) or more files"
            )
        self._epoch = 0
        self._position = 0  # batches of the current epoch already yielded
        self._plan_cache: tuple[int, _Plan] | None = None

    # -- epoch layout -------------------------------------------------------------------------
    def _plan(self, epoch: int) -> _Plan:
        if self._plan_cache is not None and self._plan_cache[0] == epoch:
            return self._plan_cache[1]
        order = np.arange(len(self._groups))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self._groups))
        per_rank = [[self._groups[i] for i in order[r :: self.world_size]] for r in range(self.world_size)]
        rows = [sum(g.num_rows for g in groups) for groups in per_rank]
        b = self.batch_size
        batches = min(n // b if self.drop_last else -(-n // b) for n in rows)
        served = min(rows[self.rank], batches * b)
        windows: list[_Window] = []
        current: list[_RowGroup] = []
        start = pending = 0  # first row of `current`; rows in `current`
        for g in per_rank[self.rank]:
            if start + pending >= served:
                break
            current.append(g)
            pending += g.num_rows
            if not self.shuffle or pending >= self.shuffle_buffer:
                windows.append(_Window(tuple(current), len(windows), start))
                start, pending, current = start + pending, 0, []
        if current:
            windows.append(_Window(tuple(current), len(windows), start))
        plan = _Plan(tuple(windows), served, batches, rows[self.rank] - served)
        self._plan_cache = (epoch, plan)
        return plan

    def __len__(self) -> int:
        """Batches in the current epoch (the same on every rank)."""
        return self._plan(self._epoch).num_batches

    @property
    def num_rows(self) -> int:
        """Rows this rank serves in the current epoch."""
        return self._plan(self._epoch).num_rows

    @property
    def rows_left_out(self) -> int:
        """Rows of this rank not served this epoch (drop_last and equalizing ranks); 0 for one rank without drop_last."""
        return self._plan(self._epoch).rows_left_out

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch `epoch` from its first batch (reshuffles when shuffle=True)."""
        if epoch < 0:
            raise ValueError(f"Loader.set_epoch: epoch must be >= 0, got {epoch}")
        self._epoch, self._position = epoch, 0

    # -- resume --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position after the batches yielded so far: load it into an identical loader to continue."""
        return {
            "epoch": self._epoch,
            "batch": self._position,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "shuffle_buffer": self.shuffle_buffer,
            "row_groups": [g.num_rows for g in self._groups],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        for key in ("seed", "batch_size", "shuffle", "drop_last", "rank", "world_size", "shuffle_buffer", "row_groups"):
            if key not in state:
                raise ValueError(f"Loader.load_state_dict: state has no {key!r}")
            if state[key] != mine[key]:
                what = "the dataset's row groups" if key == "row_groups" else f"{key}={mine[key]!r}"
                raise ValueError(
                    f"Loader.load_state_dict: state was saved with a different {key} than this loader's {what}"
                    + ("" if key == "row_groups" else f" (state has {state[key]!r})")
                )
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch <= self._plan(epoch).num_batches:
            raise ValueError(f"Loader.load_state_dict: position epoch={epoch} batch={batch} is out of range")
        self._epoch, self._position = epoch, batch

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        """Yields the rest of the current epoch, then moves to the next epoch."""
        plan = self._plan(self._epoch)
        if self._position >= plan.num_batches:
            self._epoch, self._position = self._epoch + 1, 0
            plan = self._plan(self._epoch)
        out: queue.Queue[Batch | BaseException | None] = queue.Queue(self.prefetch)
        stop = threading.Event()
        worker = threading.Thread(
            target=self._produce,
            args=(plan, self._epoch, self._position, out, stop),
            daemon=True,
            name="hugerec-loader",
        )
        worker.start()
        try:
            while True:
                item = out.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                self._position += 1
                yield item
            self._epoch, self._position = self._epoch + 1, 0
        finally:
            stop.set()
            worker.join()

    def _produce(
        self,
        plan: _Plan,
        epoch: int,
        first_batch: int,
        out: queue.Queue[Batch | BaseException | None],
        stop: threading.Event,
    ) -> None:
        """Assembles batches from decoded windows; a second thread decodes the next window meanwhile."""
        windows: queue.Queue[_Columns | BaseException | None] = queue.Queue(1)
        todo = [w for w in plan.windows if w.start + w.num_rows > first_batch * self.batch_size]
        decoder = threading.Thread(target=self._decode_all, args=(todo, epoch, windows, stop), daemon=True)
        decoder.start()

        def decoded() -> Iterator[_Columns]:
            while not stop.is_set():
                try:
                    item = windows.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item

        try:
            for batch in self._batches(plan, todo, decoded(), first_batch):
                if not _put(out, batch, stop):
                    return
            _put(out, None, stop)
        except BaseException as e:  # handed to the consumer, which re-raises it
            _put(out, e, stop)
        finally:
            stop.set()
            decoder.join()

    def _decode_all(
        self, todo: list[_Window], epoch: int, out: queue.Queue[_Columns | BaseException | None], stop: threading.Event
    ) -> None:
        try:
            for window in todo:
                if not _put(out, self._decode(window, epoch), stop):
                    return
            _put(out, None, stop)
        except BaseException as e:
            _put(out, e, stop)

    def _batches(
        self, plan: _Plan, todo: list[_Window], decoded: Iterator[_Columns], first_batch: int
    ) -> Iterator[Batch]:
        b = self.batch_size
        row = first_batch * b  # next row of the rank's sequence to serve
        pieces: list[tuple[_Columns, int, int]] = []  # rows gathered for the next batch
        have = 0
        for window, cols in zip(todo, decoded, strict=False):  # `decoded` ends early if the consumer left
            pos = row - window.start
            limit = min(window.num_rows, plan.num_rows - window.start)
            while pos < limit:
                take = min(b - have, limit - pos)
                pieces.append((cols, pos, pos + take))
                have += take
                pos += take
                if have == b:
                    yield self._assemble(pieces)
                    pieces, have = [], 0
            row = window.start + pos
        if have:
            yield self._assemble(pieces)

    def _decode(self, window: _Window, epoch: int) -> _Columns:
        tables = []
        for g in window.groups:
            path = self.paths[g.file]
            table = pq.ParquetFile(path, metadata=self._metadata[g.file]).read_row_group(g.index, columns=self._columns)
            if not g.verified:
                _check_row_group(table, self.schema, path, g.index)
            tables.append(table)
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        order = None
        if self.shuffle:
            n, b = table.num_rows, self.batch_size
            order = np.random.default_rng([self.seed, epoch, self.rank, window.index]).permutation(n)
            # Each batch is the same random set of rows, but its rows are gathered in file order: the
            # reads then run forward through memory (~10x faster than random), and a batch's row
            # order does not matter to training. Batches start at rows where (start + pos) % b == 0.
            batch_of = (np.arange(n) + window.start % b) // b  # [n] batch (within the window) of each position
            order = np.sort((batch_of << 32) | order) & 0xFFFFFFFF
        return _to_columns(table, self.schema, order)

    def _assemble(self, pieces: list[tuple[_Columns, int, int]]) -> Batch:
        """Rows [start, end) of each piece (in its window order) -> one Batch.

        Unshuffled single-piece batches serve dense and labels as views; otherwise one gather/copy.
        """
        rows = [slice(s, e) if c.order is None else c.order[s:e] for c, s, e in pieces]
        if len(pieces) == 1:  # a view when unshuffled, a gather otherwise
            labels, dense = pieces[0][0].labels[rows[0]], pieces[0][0].dense[rows[0]]
        else:
            labels = np.concatenate([c.labels[r] for (c, _, _), r in zip(pieces, rows, strict=True)])
            dense = np.concatenate([c.dense[r] for (c, _, _), r in zip(pieces, rows, strict=True)])
        b = labels.shape[0]
        num_features = len(self._sparse_names)
        lengths = np.empty(num_features * b, np.int32)  # [F * B] feature-major
        capacity = sum(  # single-hot: at most one id per row; multi-hot: the rows' list lengths
            e - s if sp.offsets is None else int(sp.offsets[e] - sp.offsets[s])
            for cols, s, e in pieces
            for sp in cols.sparse
        )
        values = np.empty(capacity, np.int64)  # [N] feature-major, cast from the stored id dtype
        at = total = 0
        for f in range(num_features):
            for cols, s, e in pieces:
                sp, n = cols.sparse[f], e - s
                if sp.offsets is not None:
                    lo, hi = int(sp.offsets[s]), int(sp.offsets[e])
                    np.subtract(sp.offsets[s + 1 : e + 1], sp.offsets[s:e], out=lengths[at : at + n], casting="unsafe")
                    values[total : total + hi - lo] = sp.values[lo:hi]
                    total += hi - lo
                elif sp.valid is None and cols.order is None:
                    lengths[at : at + n] = 1
                    values[total : total + n] = sp.values[s:e]
                    total += n
                else:
                    valid = _NO_ROWS if sp.valid is None else sp.valid
                    order = _NO_ORDER if cols.order is None else cols.order
                    total += _gather_ids(
                        sp.values, valid, sp.valid is not None, order, cols.order is not None, s, e,
                        values[total:], lengths[at : at + n],
                    )  # fmt: skip
                at += n
        values = values[:total]
        sparse = _trusted_features(self._sparse_names, torch.from_numpy(values), torch.from_numpy(lengths))
        return Batch(torch.from_numpy(dense), sparse, torch.from_numpy(labels))


_NO_ROWS = np.zeros(0, np.bool_)
_NO_ORDER = np.zeros(0, np.int64)


@njit(cache=True, nogil=True)
def _gather_ids(
    ids: np.ndarray,
    valid: np.ndarray,
    has_valid: bool,
    order: np.ndarray,
    has_order: bool,
    start: int,
    end: int,
    out: np.ndarray,
    lengths: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Single-hot rows start..end-1 (through `order` when given) -> ids of valid rows into `out`, 0/1 into `lengths`.

    Returns the number of ids written. One pass instead of NumPy's gather + mask + compress + cast.
    """
    k = 0
    for i in range(end - start):
        j = order[start + i] if has_order else start + i
        # Branch-free: a missing id is written and then overwritten (out has room for every row);
        # missing values are frequent and random, so a branch here mispredicts often.
        keep = valid[j] if has_valid else True
        out[k] = ids[j]
        lengths[i] = keep
        k += keep
    return k


def _trusted_features(keys: tuple[str, ...], values: torch.Tensor, lengths: torch.Tensor) -> SparseFeatures:
    """SparseFeatures without re-running its checks: `_assemble` built values and lengths consistent.

    The checks reduce over all F * B lengths with torch; from a loader thread, torch's OpenMP team
    for those reductions stalls on a busy machine (measured 8-27 ms per 8192-row batch, more than
    the rest of the batch's work). The tests compare these batches against checked ones.
    """
    features = object.__new__(SparseFeatures)
    for name, value in (("keys", keys), ("values", values), ("lengths", lengths), ("weights", None)):
        object.__setattr__(features, name, value)
    return features


def _put(q: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Blocking put that gives up (False) once `stop` is set."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def load(
    paths: str | Path | Sequence[str | Path],
    schema: Schema,
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    rank: int = 0,
    world_size: int = 1,
    prefetch: int = 4,
    shuffle_buffer: int = 1 << 17,
) -> Loader:
    """`Loader(...)`: batches of `Batch` over Parquet shards (see `Loader`)."""
    return Loader(paths, schema, batch_size, shuffle, seed, drop_last, rank, world_size, prefetch, shuffle_buffer)


# -- validation and decoding -------------------------------------------------------------------
def _check_file_schema(path: Path, arrow: pa.Schema, schema: Schema) -> None:
    names = set(arrow.names)
    for col in schema.columns:
        if col.name not in names:
            raise ValueError(f"{path}: column {col.name!r} of the schema is not in the file (file has {sorted(names)})")
        t = arrow.field(col.name).type
        if col in schema.sparse:
            ok = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
            if not col.multi_hot:
                ok = pa.types.is_integer(t)
            if not ok:
                want = "a list of integer ids (multi_hot)" if col.multi_hot else "integer ids"
                raise ValueError(f"{path}: column {col.name!r} should hold {want}, found type {t}")
        elif not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise ValueError(f"{path}: {col.kind.value} column {col.name!r} must be numeric, found type {t}")


def _verify_statistics(path: Path, md: pq.FileMetaData, index: int, schema: Schema) -> bool:
    """Checks a row group from its Parquet statistics; False when they cannot tell (then it is checked when read).

    Raises for a label/dense null or an id out of range that the statistics already show.
    """
    rg = md.row_group(index)
    stats = {}
    for j in range(rg.num_columns):
        chunk = rg.column(j)
        stats[chunk.path_in_schema] = chunk.statistics
    where = f"{path}, row group {index}"
    complete = True
    for col in schema.columns:
        st = stats.get(col.name)  # None for list columns (their leaf is "name.list.element"), checked when read
        if st is None or not st.has_null_count:
            complete = False
            continue
        if col in schema.sparse:
            if not st.has_min_max:
                complete = complete and st.null_count == rg.num_rows
                continue
            if st.min < 0 or (col.cardinality is not None and st.max >= col.cardinality):
                bad = st.min if st.min < 0 else st.max
                raise ValueError(f"{where}: column {col.name!r} has id {bad} outside 0..{col.cardinality}-1")
        elif st.null_count:
            raise ValueError(
                f"{where}: {col.kind.value} column {col.name!r} has {st.null_count} missing values; "
                "fill them first (preprocess FillMissing)"
            )
    return complete


def _check_row_group(table: pa.Table, schema: Schema, path: Path, row_group: int) -> None:
    where = f"{path}, row group {row_group}"
    for col in (*schema.labels, *schema.dense):
        n = table[col.name].null_count
        if n:
            raise ValueError(
                f"{where}: {col.kind.value} column {col.name!r} has {n} missing values; "
                "fill them first (preprocess FillMissing)"
            )
    for col in schema.sparse:
        arr = table[col.name]
        ids = pc.list_flatten(arr) if col.multi_hot else arr
        if col.multi_hot and ids.null_count:
            raise ValueError(f"{where}: column {col.name!r} has {ids.null_count} missing ids inside its lists")
        _check_id_range(col, ids, where)


def _check_id_range(col: Column, ids: pa.ChunkedArray | pa.Array, where: str) -> None:
    if len(ids) == ids.null_count:
        return
    mm = pc.min_max(ids)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo < 0 or (col.cardinality is not None and hi >= col.cardinality):
        bad = lo if lo < 0 else hi
        raise ValueError(f"{where}: column {col.name!r} has id {bad} outside 0..{col.cardinality}-1")


def _single(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def _to_numpy(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Zero-copy for one chunk of a primitive type without nulls."""
    return np.asarray(_single(arr).to_numpy(zero_copy_only=False))


def _raw_ids(arr: pa.Array) -> np.ndarray:
    """The values buffer of an integer array, nulls included as whatever bytes they hold (zero-copy)."""
    dtype = np.dtype(arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + len(arr))[arr.offset :]


def _to_columns(table: pa.Table, schema: Schema, order: np.ndarray | None) -> _Columns:
    r = table.num_rows
    if len(schema.labels) == 1:  # a copy: Arrow buffers are read-only, and torch wants writable arrays
        labels = _to_numpy(table[schema.label_names[0]]).astype(np.float32)
    else:
        labels = np.empty((r, len(schema.labels)), np.float32)  # [R, T]
        for t, name in enumerate(schema.label_names):
            labels[:, t] = _to_numpy(table[name])
    dense = np.empty((r, len(schema.dense)), np.float32)  # [R, Dd]
    for j, name in enumerate(schema.dense_names):
        dense[:, j] = _to_numpy(table[name])
    sparse = []
    for col in schema.sparse:
        arr = _single(table[col.name])
        if col.multi_hot:
            if order is not None:  # lists are permuted here, once; flat columns are gathered per batch
                arr = arr.take(pa.array(order))
            lengths = _to_numpy(pc.fill_null(pc.list_value_length(arr), 0))
            offsets = np.zeros(r + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            sparse.append(_Sparse(_to_numpy(pc.list_flatten(arr)), offsets=offsets))
        elif arr.null_count:
            sparse.append(_Sparse(_raw_ids(arr), valid=_to_numpy(pc.is_valid(arr))))
        else:
            sparse.append(_Sparse(_raw_ids(arr)))
    return _Columns(labels, dense, sparse, order)
