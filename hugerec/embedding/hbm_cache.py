"""HBM cache over host memory: a table larger than the GPU's memory, its rows and optimizer state in
page-locked host memory, its hot rows in `slots` cache slots on the GPU.

The disk tier's design (`hugerec.embedding.disk`) one level up: host memory is the backing store, HBM
the cache, and the lookup and the fused backward run unchanged on the slots (the plan addresses slots
instead of rows, so a cached table trains like an all-in-HBM one). `prepare(rows)` maps a batch's rows to
slots before its lookup:

  1. the batch's distinct rows; those cached are hits and get this prepare's stamp;
  2. each miss takes the slot of smallest stamp (least recently used, by batch; slot index breaks ties)
     among slots not stamped by the last `pinned` prepares (the training pipeline prepares batch i + 1
     while step i updates batch i's slots), chosen all at once by a top-k;
  3. evicted slots that are dirty (updated since loaded) are written back to host memory, then the
     misses are read from it, both by the GPU over PCIe (`hugerec.ops.gpu.row_cache_kernels.copy_rows`).

One host round trip per prepare (the number of misses, which sizes the top-k). `prefetch(rows)` runs a
prepare on a side stream, so the next batch's misses load while the current step computes (the caller
makes its stream wait on `ready`). `flush` writes every dirty slot back.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

_NEVER = -(1 << 40)  # the stamp of a slot that never held a row: older than any prepare
_PINNED = 1 << 62  # the score of a slot that may not be taken (above any stamp * slots + slot)


def _kernels() -> ModuleType:
    return importlib.import_module("hugerec.ops.gpu.row_cache_kernels")


class HbmCache:
    """One table: weight [R, D_pad] and state [R, S] in host memory (pinned on CUDA), `slots` of them on `device`."""

    def __init__(
        self, weight: torch.Tensor, state: torch.Tensor, slots: int, device: torch.device | str, pinned: int = 2
    ) -> None:
        if weight.shape[0] != state.shape[0]:
            raise ValueError(f"HbmCache: weight has {weight.shape[0]} rows, state {state.shape[0]}")
        if not 1 <= slots <= weight.shape[0]:
            raise ValueError(f"HbmCache: slots must lie in [1, {weight.shape[0]}] (the table's rows), got {slots}")
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        self.host_weight = weight.pin_memory() if pin and not weight.is_pinned() else weight
        self.host_state = state.pin_memory() if pin and not state.is_pinned() else state
        self.num_rows = int(weight.shape[0])
        self.weight = torch.zeros(slots, weight.shape[1], dtype=weight.dtype, device=self.device)
        self.state = torch.zeros(slots, state.shape[1], dtype=state.dtype, device=self.device)
        self.pinned = pinned
        self.slot_of_row = torch.full((self.num_rows,), -1, dtype=torch.int64, device=self.device)
        self.row_of_slot = torch.full((slots,), -1, dtype=torch.int64, device=self.device)
        self.stamp = torch.full((slots,), _NEVER, dtype=torch.int64, device=self.device)
        self.dirty = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.clock = 0
        self.counts = {"hits": 0, "misses": 0, "rows_read": 0, "rows_written": 0}
        self.stream = torch.cuda.Stream(self.device) if pin else None
        self.ready: torch.cuda.Event | None = None

    @property
    def slots(self) -> int:
        return int(self.weight.shape[0])

    def prepare(self, rows: torch.Tensor, missing_ok: bool = False, update: bool = True) -> torch.Tensor:
        """rows [N] int64 on the device -> slots [N] (-1 stays -1 where missing_ok); `update` marks the batch's
        slots dirty (their rows will be written back when evicted)."""
        self.clock += 1
        low = -1 if missing_ok else 0
        bad = (rows < low) | (rows >= self.num_rows)
        wanted = torch.unique(rows[rows >= 0])
        slot = self.slot_of_row[wanted.clamp(max=self.num_rows - 1)]
        hit = slot >= 0
        miss_rows = wanted[~hit]
        numbers = torch.stack([bad.sum(), miss_rows.new_tensor(miss_rows.shape[0]), hit.sum()]).tolist()
        if numbers[0]:
            first = int(rows[bad][0])
            raise ValueError(f"HbmCache.prepare: row {first} is outside [{low}, {self.num_rows})")
        misses = int(numbers[1])
        self.stamp[slot[hit]] = self.clock
        self.counts["hits"] += int(numbers[2])
        self.counts["misses"] += misses
        if misses > self.slots:
            raise ValueError(f"HbmCache.prepare: {misses} rows to load but the cache has {self.slots} slots")
        if misses:
            fresh = self.stamp <= self.clock - self.pinned  # not stamped by the last `pinned` prepares
            # score = stamp (never used: 0) * slots + slot: least recently used first, the slot index breaking ties
            score = self.stamp.clamp(min=0) * self.slots + torch.arange(self.slots, device=self.device)
            score = torch.where(fresh, score, _PINNED)
            victims = torch.topk(score, misses, largest=False, sorted=True).indices
            if not bool(fresh[victims].all()):
                raise ValueError(
                    f"HbmCache.prepare: {misses} rows to load but only {int(fresh.sum())} of {self.slots} slots are "
                    f"free of the last {self.pinned} batches; raise the cache's slots"
                )
            old = self.row_of_slot[victims]
            back = (old >= 0) & self.dirty[victims]
            out_slots, out_rows = victims[back], old[back]
            _kernels().copy_rows(self.weight, out_slots, self.host_weight, out_rows)
            _kernels().copy_rows(self.state, out_slots, self.host_state, out_rows)
            self.counts["rows_written"] += int(out_rows.shape[0])
            self.slot_of_row[old[old >= 0]] = -1
            _kernels().copy_rows(self.host_weight, miss_rows, self.weight, victims)
            _kernels().copy_rows(self.host_state, miss_rows, self.state, victims)
            self.counts["rows_read"] += misses
            self.slot_of_row[miss_rows] = victims
            self.row_of_slot[victims] = miss_rows
            self.stamp[victims] = self.clock
            self.dirty[victims] = False
        if update:
            self.dirty[self.slot_of_row[wanted]] = True
        out = self.slot_of_row[rows.clamp(min=0)]
        return torch.where(rows < 0, rows, out)

    def prefetch(self, rows: torch.Tensor, missing_ok: bool = False, update: bool = True) -> torch.Tensor:
        """`prepare` on the cache's side stream (CUDA): returns the slots at once; the caller's stream must
        wait on `self.ready` before its lookup reads them."""
        if self.stream is None:
            return self.prepare(rows, missing_ok, update)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            slots = self.prepare(rows, missing_ok, update)
            self.ready = torch.cuda.Event()
            self.ready.record(self.stream)
        slots.record_stream(torch.cuda.current_stream(self.device))
        return slots

    def flush(self) -> None:
        """Writes every dirty slot back to host memory (they stay cached, now clean); returns once the rows are
        there (the GPU writes host memory asynchronously, so this waits for the device)."""
        dirty = torch.nonzero(self.dirty & (self.row_of_slot >= 0)).squeeze(1)
        _kernels().copy_rows(self.weight, dirty, self.host_weight, self.row_of_slot[dirty])
        _kernels().copy_rows(self.state, dirty, self.host_state, self.row_of_slot[dirty])
        self.counts["rows_written"] += int(dirty.shape[0])
        self.dirty[dirty] = False
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def stats(self) -> dict[str, float]:
        """hits and misses (distinct rows per prepare), rows read from and written to host memory, hit rate."""
        seen = self.counts["hits"] + self.counts["misses"]
        return {
            **{k: float(v) for k, v in self.counts.items()},
            "hit_rate": self.counts["hits"] / seen if seen else 0.0,
        }
