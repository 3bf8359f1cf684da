"""HashTable: the vocabulary of a dynamic embedding table, raw int64 keys -> rows 0..capacity-1.

Collisionless (two distinct keys never share a row), fixed capacity, policies given as data
(`DynamicConfig`): eviction LRU / LFU / TTL / NONE, admission after `min_count` sightings (count-min
sketch, bounded memory), and what a key without a row maps to (`Missing`).

    table = HashTable(1000, DynamicConfig(eviction=Eviction.LRU, min_count=2))
    ins = table.find_or_insert(torch.tensor([7, -3, 7]), step=0)   # training
    ins.rows        # [N] rows, -1 (or the unknown row) for keys not (yet) admitted
    ins.reset_rows  # rows that held another key before: re-initialise weights and optimizer state
    table.find(torch.tensor([7, 8]))                                # eval / serving: no insertion

Rows: with Missing.UNKNOWN_ROW the last row (capacity - 1) is the table's shared unknown row and
keys get rows 0..capacity-2; with Missing.ZEROS keys get every row and a missing key maps to -1.
Row ids are handed out 0, 1, 2, ... until the table is full, then recycled by the eviction policy.

Every row remembers the last step it was touched (`find_or_insert`) and how often; `changed_since`
lists the keys touched after a step (delta export, `hugerec.embedding.delta`).

Where it lives: on the host (Numba kernels over NumPy arrays, the default), or on a device after
`move(device)` (Triton kernels over tensors, `hugerec.ops.hash_table_tensors`): then keys and rows stay
on that device and a training step never copies ids to the host. Both give the same rows, reset
rows, counters and state dict; `move` converts the whole state either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing
from hugerec.ops import hash_table_arrays as ops
from hugerec.ops import hash_table_tensors as device_ops
from hugerec.ops.cpu import hash_table_kernels as layout


def _eviction_code(eviction: Eviction) -> int:
    match eviction:
        case Eviction.NONE:
            return ops.EVICT_NONE
        case Eviction.LRU:
            return ops.EVICT_LRU
        case Eviction.LFU:
            return ops.EVICT_LFU
        case Eviction.TTL:
            return ops.EVICT_TTL


def as_keys(keys: torch.Tensor | np.ndarray, where: str) -> np.ndarray:
    """Validate raw keys: a 1-D integer tensor or array -> contiguous int64 numpy array [N] (CPU).

    uint64 keys (e.g. string hashes) are reinterpreted bit for bit as int64, a bijection.
    """
    arr = keys.detach().cpu().numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(f"{where}: keys must be 1-D [N], got shape {arr.shape}")
    if arr.dtype == np.uint64:
        return np.ascontiguousarray(arr).view(np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        if arr.size == 0:
            return np.empty(0, dtype=np.int64)
        raise ValueError(f"{where}: keys must be integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_step(step: int, where: str) -> int:
    if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
        raise ValueError(f"{where}: step must be an int >= 0, got {step!r}")
    return int(step)


@dataclass(frozen=True)
class Insertion:
    """Result of `HashTable.find_or_insert`."""

    rows: torch.Tensor  # [N] int64: row per key; -1 (ZEROS) or the unknown row for keys not admitted
    reset_rows: torch.Tensor  # [E] int64: rows given a new key that held another key before


@dataclass(frozen=True)
class HashTableStats:
    size: int  # keys held
    capacity: int  # rows available to keys
    load_factor: float  # size / capacity
    inserts: int  # keys that got a row
    evictions: int  # keys that lost their row to a new key (LRU / LFU / TTL when full)
    expired: int  # keys dropped by TTL
    refused: int  # admissions refused (distinct keys per call that stayed below min_count)
    removed: int  # keys dropped by `remove`

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class HashTableContents:
    """The held keys, ordered by row: keys [K], rows [K], last_step [K], count [K] (int64 tensors)."""

    keys: torch.Tensor
    rows: torch.Tensor
    last_step: torch.Tensor
    count: torch.Tensor


@dataclass(frozen=True)
class KernelView:
    """What the multi-table kernels (`hugerec.ops.hash_table_arrays.TablePack`) take from one table: its
    arrays (replaced on load, so a holder compares them by identity before reusing a pack) and its
    policy as the kernels' integer codes."""

    arrays: ops.HashTableArrays
    eviction: int
    min_count: int
    ttl: int  # -1: no expiry
    unknown_row: int  # -1: none


class HashTable:
    """Raw int64 keys -> rows of one dynamic table (see module docstring)."""

    STATE_KEYS = ("keys", "rows", "last_step", "count", "row_state", "free", "sketch", "meta")

    def __init__(self, capacity: int, policy: DynamicConfig | None = None, name: str = "hash table") -> None:
        self.policy = DynamicConfig() if policy is None else policy
        self.name = name
        reserved = 1 if self.policy.missing is Missing.UNKNOWN_ROW else 0
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1 + reserved:
            need = "an int >= 2 (one row is the shared unknown row)" if reserved else "an int >= 1"
            raise ValueError(f"HashTable {name!r}: capacity must be {need}, got {capacity!r}")
        if self.policy.min_count > ops.SKETCH_MAX:
            raise ValueError(
                f"HashTable {name!r}: min_count {self.policy.min_count} exceeds the sketch's counter limit "
                f"{ops.SKETCH_MAX}"
            )
        self.capacity = capacity
        self.unknown_row: int | None = capacity - 1 if reserved else None
        self._eviction = _eviction_code(self.policy.eviction)
        self._ttl = self.policy.ttl_steps if self.policy.eviction is Eviction.TTL else -1  # -1: no expiry
        self._arrays = self._allocate()
        self._tensors: device_ops.HashTableTensors | None = None  # the state while on a device (`move`)

    # -- where the table lives ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device | None:
        """The device holding the table (`move`), or None: the host's NumPy arrays."""
        return None if self._tensors is None else self._tensors.device

    def move(self, device: torch.device | str | None) -> HashTable:
        """Moves the whole state (mapping, scores, free rows, sketch, counters) to `device`'s tensors, or with
        None back to the host's arrays; returns self. A CUDA device runs the Triton kernels; the CPU device
        runs them only under Triton's interpreter (tests)."""
        if device is None:
            if self._tensors is not None:
                self._arrays = self._tensors.to_arrays(self._eviction)
                self._tensors = None
            return self
        target = torch.device(device)
        if self._tensors is not None and self._tensors.device == target:
            return self
        self._tensors = device_ops.HashTableTensors.from_arrays(self._host(), target)
        return self

    @property
    def tensors(self) -> device_ops.HashTableTensors | None:
        """The device state (`move`), or None on the host: what the device kernels take (benchmarks, tests)."""
        return self._tensors

    def _host(self) -> ops.HashTableArrays:
        """The state as the host's arrays (a copy while the table is on a device)."""
        return self._arrays if self._tensors is None else self._tensors.to_arrays(self._eviction)

    def _on_host(self, method: str) -> None:
        if self._tensors is not None:
            raise ValueError(f"{self._where(method)}: the table is on {self._tensors.device}; use the tensor methods")

    def _meta(self) -> np.ndarray:
        return self._arrays.meta if self._tensors is None else self._tensors.meta

    def _allocate(self) -> ops.HashTableArrays:
        admission = self.policy.min_count > 1
        return ops.HashTableArrays.allocate(
            self.key_capacity,
            self._eviction,
            self.policy.sketch_depth if admission else 0,
            self.policy.sketch_width if admission else 0,
        )

    @property
    def key_capacity(self) -> int:
        """Rows available to keys (capacity, less the unknown row if there is one)."""
        return self.capacity - (self.unknown_row is not None)

    @property
    def step(self) -> int:
        """Last step given to find_or_insert (-1 before the first)."""
        return int(self._meta()[layout.STEP])

    def __len__(self) -> int:
        return int(self._meta()[layout.SIZE])

    def __repr__(self) -> str:
        return f"HashTable({self.name!r}, {len(self)}/{self.key_capacity} keys, {self.policy})"

    def _where(self, method: str) -> str:
        return f"HashTable {self.name!r}.{method}"

    def _fill_missing(self, rows: np.ndarray) -> np.ndarray:
        """rows with -1 (no row) replaced by the unknown row where the table has one (in place)."""
        if self.unknown_row is not None:
            np.putmask(rows, rows < 0, self.unknown_row)
        return rows

    def _out(self, out: torch.Tensor | None, n: int, where: str) -> np.ndarray | None:
        if out is None:
            return None
        if out.shape != (n,) or out.dtype != torch.int64 or out.device.type != "cpu" or not out.is_contiguous():
            raise ValueError(
                f"{where}: out must be a contiguous CPU int64 tensor of shape ({n},), got {out.dtype} "
                f"{tuple(out.shape)} on {out.device}"
            )
        return out.numpy()

    # -- lookups -------------------------------------------------------------------------------------
    def find_or_insert(
        self, keys: torch.Tensor | np.ndarray, step: int, admit_all: bool = False, out: torch.Tensor | None = None
    ) -> Insertion:
        """Training lookup at `step` (steps never decrease): keys [N] -> rows [N], inserting admitted keys.

        admit_all skips admission (used when importing rows that were admitted elsewhere); `out`, a
        contiguous CPU int64 tensor [N], receives the rows. Raises ValueError, leaving the table
        unchanged, when the keys do not fit (see hugerec.ops.hash_table_arrays).
        """
        where = self._where("find_or_insert")
        if self._tensors is not None:
            step = _check_step(step, where)
            rows_t, reset_t = self.find_or_insert_tensor(self._device_keys(keys, where), step, admit_all)
            if out is not None:
                out.copy_(rows_t)
            return Insertion(rows_t, reset_t)
        k = as_keys(keys, where)
        step = _check_step(step, where)
        dest = self._out(out, k.shape[0], where)
        rows, reset = self.find_or_insert_numpy(k, step, admit_all, dest)
        return Insertion(torch.from_numpy(rows), torch.from_numpy(reset))

    def find_or_insert_numpy(
        self, keys: np.ndarray, step: int, admit_all: bool = False, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`find_or_insert` without argument checks, for callers that already hold contiguous int64 keys
        [N] and an int step >= 0 (the per-batch remap): numpy (rows, reset rows). Host tables only."""
        self._on_host("find_or_insert_numpy")
        if self._ttl >= 0 and step >= self.step:
            ops.expire(self._arrays, step, self._ttl)
        rows, reset = ops.find_or_insert(
            self._arrays,
            keys,
            step,
            self._eviction,
            self.policy.min_count,
            admit_all,
            where=self._where("find_or_insert"),
            out=out,
        )
        self._fill_missing(rows)
        return rows, reset

    def _device_keys(self, keys: torch.Tensor | np.ndarray, where: str) -> torch.Tensor:
        """Keys as a contiguous int64 tensor on the table's device (checked as `as_keys` checks)."""
        assert self._tensors is not None
        if isinstance(keys, torch.Tensor) and keys.dim() == 1 and keys.dtype == torch.int64:
            return keys.to(self._tensors.device).contiguous()
        return torch.from_numpy(as_keys(keys, where)).to(self._tensors.device)

    def find_or_insert_tensor(
        self, keys: torch.Tensor, step: int, admit_all: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`find_or_insert` of a table on a device, without argument checks: keys [N] int64 on its device ->
        (rows [N], reset rows [E]) there."""
        t = self._tensors
        assert t is not None, "find_or_insert_tensor: the table is on the host; move it to a device first"
        if self._ttl >= 0 and step >= self.step:
            device_ops.expire(t, step, self._ttl)
        rows, reset = device_ops.find_or_insert(
            t, keys, step, self._eviction, self.policy.min_count, admit_all, where=self._where("find_or_insert")
        )
        if self.unknown_row is not None:
            rows.masked_fill_(rows < 0, self.unknown_row)
        return rows, reset

    def find_tensor(self, keys: torch.Tensor) -> torch.Tensor:
        """`find` of a table on a device: keys [N] int64 on its device -> rows [N] there."""
        assert self._tensors is not None, "find_tensor: the table is on the host; move it to a device first"
        rows = device_ops.lookup(self._tensors, keys)
        if self.unknown_row is not None:
            rows.masked_fill_(rows < 0, self.unknown_row)
        return rows

    def find(self, keys: torch.Tensor | np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
        """Eval / serving lookup: keys [N] -> rows [N] (into `out` if given); missing keys get -1 or the
        unknown row. Changes nothing: concurrent `find`s are safe, a concurrent writer is not."""
        where = self._where("find")
        if self._tensors is not None:
            rows = self.find_tensor(self._device_keys(keys, where))
            if out is not None:
                out.copy_(rows)
            return rows
        k = as_keys(keys, where)
        return torch.from_numpy(self.find_numpy(k, self._out(out, k.shape[0], where)))

    def find_numpy(self, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """`find` without argument checks, for contiguous int64 keys [N]: numpy rows (into `out` if given)."""
        self._on_host("find_numpy")
        return self._fill_missing(ops.lookup(self._arrays, keys, out))

    def advance_to(self, step: int) -> None:
        """Move the table's clock forward to `step` without touching a key (TTL rows past their time
        expire, as at a training step); nothing happens when the table is at `step` or later."""
        step = _check_step(step, self._where("advance_to"))
        if step > self.step:
            if self._tensors is not None:
                self.find_or_insert_tensor(torch.empty(0, dtype=torch.int64, device=self._tensors.device), step)
            else:
                self.find_or_insert_numpy(np.empty(0, dtype=np.int64), step)

    def kernel_view(self) -> KernelView:
        """The arrays and policy codes the multi-table kernels take (see `KernelView`); host tables only."""
        if self._tensors is not None:
            raise ValueError(f"{self._where('kernel_view')}: the table is on {self._tensors.device}")
        unknown = -1 if self.unknown_row is None else self.unknown_row
        return KernelView(self._arrays, self._eviction, self.policy.min_count, self._ttl, unknown)

    def remove(self, keys: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Drop keys; returns the row each one held (-1 where absent). Freed rows are re-initialised on reuse."""
        if self._tensors is not None:
            return device_ops.remove(self._tensors, self._device_keys(keys, self._where("remove")))
        return torch.from_numpy(ops.remove(self._arrays, as_keys(keys, self._where("remove"))))

    # -- contents --------------------------------------------------------------------------------------
    def export(self) -> HashTableContents:
        """Every held key with its row and scores, ordered by row (CPU tensors)."""
        return self.changed_since(-(2**62))

    def changed_since(self, step: int) -> HashTableContents:
        """The held keys touched at a step > `step` (pass -1 for all), ordered by row (CPU tensors)."""
        if self._tensors is not None:  # selected on the device: only the changed keys cross to the host
            t = self._tensors
            held = torch.nonzero((t.row_state == layout.USED) & (t.last > step)).squeeze(1)
            return HashTableContents(t.key[held].cpu(), held.cpu(), t.last[held].cpu(), t.count[held].cpu())
        a = self._arrays
        rows = np.flatnonzero((a.row_state == layout.USED) & (a.info[:, layout.LAST] > step)).astype(np.int64)
        return HashTableContents(
            torch.from_numpy(a.info[rows, layout.KEY].copy()),
            torch.from_numpy(rows),
            torch.from_numpy(a.info[rows, layout.LAST].copy()),
            torch.from_numpy(a.info[rows, layout.COUNT].copy()),
        )

    def stats(self) -> HashTableStats:
        meta = self._meta()
        size = len(self)
        return HashTableStats(
            size=size,
            capacity=self.key_capacity,
            load_factor=size / self.key_capacity,
            inserts=int(meta[layout.INSERTS]),
            evictions=int(meta[layout.EVICTIONS]),
            expired=int(meta[layout.EXPIRED]),
            refused=int(meta[layout.REFUSED]),
            removed=int(meta[layout.REMOVED]),
        )

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue exactly: mapping, scores, row history, free-row order, sketch, counters."""
        a = self._host()
        contents = self.export()
        meta = a.meta.copy()
        meta[layout.HEAP_SIZE] = 0  # the host kernels' eviction-heap fill: rebuilt on load, so not state
        return {
            "keys": contents.keys,
            "rows": contents.rows,
            "last_step": contents.last_step,
            "count": contents.count,
            "row_state": torch.from_numpy(a.row_state.copy()),
            "free": torch.from_numpy(a.free[: a.counter(layout.N_FREE)].copy()),
            # uint16 counters travel as int16 bit patterns (torch's uint16 support is thin)
            "sketch": torch.from_numpy(a.sketch.view(np.int16).copy()),
            "meta": torch.from_numpy(meta),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a `state_dict` taken from a table with the same capacity and policy."""
        where = self._where("load_state_dict")
        missing = set(self.STATE_KEYS) - set(state)
        if missing:
            raise ValueError(f"{where}: state lacks {sorted(missing)}")
        self._install(
            HashTableContents(state["keys"], state["rows"], state["last_step"], state["count"]),
            state["row_state"].cpu().numpy().astype(np.int8),
            as_keys(state["free"], where),
            state["sketch"].cpu().numpy().view(np.uint16),
            state["meta"].cpu().numpy(),
            where,
        )

    def load(self, contents: HashTableContents, sketch: torch.Tensor | None = None) -> None:
        """Replace the mapping by `contents` (e.g. another table's `export()`), keeping the counters and,
        unless `sketch` (another table's `state_dict()["sketch"]`, same policy) is given, the admission
        sketch.

        Rows not in `contents` become free and are handed out lowest first; those that held a key
        before are re-initialised when reused.
        """
        a = self._host()
        rows = as_keys(contents.rows, self._where("load"))
        row_state = np.where(a.row_state == layout.FRESH, layout.FRESH, layout.FREED).astype(np.int8)
        row_state[rows[(rows >= 0) & (rows < self.key_capacity)]] = layout.USED
        free = np.flatnonzero(row_state != layout.USED)[::-1].astype(np.int64)
        meta = a.meta.copy()
        last = as_keys(contents.last_step, self._where("load"))
        meta[layout.STEP] = max(self.step, int(last.max()) if last.size else -1)
        counts = a.sketch.copy() if sketch is None else sketch.detach().cpu().numpy().view(np.uint16).copy()
        self._install(contents, row_state, free, counts, meta, self._where("load"))

    def _install(
        self,
        contents: HashTableContents,
        row_state: np.ndarray,
        free: np.ndarray,
        sketch: np.ndarray,
        meta: np.ndarray,
        where: str,
    ) -> None:
        keys, rows = as_keys(contents.keys, where), as_keys(contents.rows, where)
        last_step, count = as_keys(contents.last_step, where), as_keys(contents.count, where)
        if not keys.shape == rows.shape == last_step.shape == count.shape:
            raise ValueError(
                f"{where}: keys, rows, last_step, count differ in length: {keys.shape[0]}, {rows.shape[0]}, "
                f"{last_step.shape[0]}, {count.shape[0]}"
            )
        if rows.size and (rows.min() < 0 or rows.max() >= self.key_capacity):
            raise ValueError(f"{where}: rows must lie in [0, {self.key_capacity}), got {rows.min()}..{rows.max()}")
        if np.unique(keys).size != keys.size:
            raise ValueError(f"{where}: duplicate keys")
        if np.unique(rows).size != rows.size:
            raise ValueError(f"{where}: duplicate rows")
        if row_state.shape != (self.key_capacity,):
            raise ValueError(f"{where}: state is for {row_state.shape[0]} key rows, this table has {self.key_capacity}")
        held = np.flatnonzero(row_state == layout.USED)
        if not np.array_equal(held, np.sort(rows)):
            raise ValueError(f"{where}: row_state does not mark exactly the rows that hold keys")
        if not np.array_equal(np.flatnonzero(row_state != layout.USED), np.sort(free)):
            raise ValueError(f"{where}: the free rows are not exactly the rows that hold no key")
        fresh = self._allocate()
        if sketch.shape != fresh.sketch.shape:
            raise ValueError(f"{where}: sketch shape {sketch.shape} != {fresh.sketch.shape} of this table's policy")
        fresh.row_state[:] = row_state
        fresh.info[rows, layout.KEY] = keys
        fresh.info[rows, layout.LAST] = last_step
        fresh.info[rows, layout.COUNT] = count
        fresh.free[: free.shape[0]] = free
        fresh.sketch[:] = sketch
        fresh.meta[:] = meta
        fresh.meta[layout.N_FREE] = free.shape[0]
        fresh.meta[layout.SIZE] = keys.shape[0]
        fresh.meta[layout.TOUCHED] = int((last_step == fresh.meta[layout.STEP]).sum())
        ops.insert_mapping(fresh, keys, rows)
        ops.rebuild_heap(fresh, self._eviction)
        self._arrays = fresh
        if self._tensors is not None:
            self._tensors = device_ops.HashTableTensors.from_arrays(fresh, self._tensors.device)
