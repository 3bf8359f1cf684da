"""Batches to a CUDA device without blocking: pinned host memory, a copy stream, an event per batch.

    copy = DeviceCopy(torch.device("cuda"))
    on_gpu = copy(batch)   # returns at once; the copy runs on copy.stream

`Batch.to(cuda, non_blocking=True)` from ordinary (pageable) host memory is a synchronous copy through a
driver staging buffer, on the stream that computes. Here each tensor is first put in page-locked memory
(torch's caching host allocator), then copied on a stream of its own, so the transfer of batch i + 1
overlaps step i. The stream that called (the one the step runs on) is made to wait for the copy's event
before it uses the batch, and the batch's device memory is marked as used by that stream, so the caching
allocator never hands it out while the step may still read it. Anything that is not CUDA gets plain
`Batch.to`.
"""

from __future__ import annotations

import torch

from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


def _pinned(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory()


def pin_batch(batch: Batch) -> Batch:
    """The batch in page-locked host memory (tensors already pinned, or not on the CPU, kept as they are)."""
    s = batch.sparse
    sparse = SparseFeatures(
        s.keys, _pinned(s.values), _pinned(s.lengths), None if s.weights is None else _pinned(s.weights)
    )
    return Batch(_pinned(batch.dense), sparse, _pinned(batch.labels))


def batch_tensors(batch: Batch) -> list[torch.Tensor]:
    s = batch.sparse
    return [batch.dense, batch.labels, s.values, s.lengths, *([] if s.weights is None else [s.weights])]


class DeviceCopy:
    """Callable: Batch -> the same batch on `device`, copied asynchronously (module docstring)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __call__(self, batch: Batch) -> Batch:
        if self.stream is None:
            return batch.to(self.device)
        pinned = pin_batch(batch)
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            moved = pinned.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        consumer.wait_event(done)
        for t in batch_tensors(moved):
            t.record_stream(consumer)
        return moved
