"""The training pipeline: batch i + 1 is prepared in a worker thread while step i computes.

    main thread      step i-1 | step i           | step i+1
    worker thread    prep i   | prep i+1         | prep i+2
                      (next(loader): decode; the family's `prepare`: to the device (a ranking Batch
                       through pinned memory on a copy stream under CUDA), negatives drawn,
                       the lookups' SparseFeatures built; then per embedding collection `stage`: the dynamic
                       tables' hash remap and the disk tier's loading of the rows into cache slots;
                       a sharded collection first sends the pooled ids to their owners, on a process
                       group of its own, and stages the ids it receives in its local shards)

At most one batch is prepared ahead: the disk tier pins the slots of the last two prepares, so
step i's rows are never evicted by batch i+1's prefetch. Before a step after which the trainer
evaluates or checkpoints (`hold`), the next batch is prepared only once that is done: a checkpoint
must not contain batch i+1's inserts, and evaluation's lookups must not move its pinned rows.
The Numba kernels of the remap and the cache release the GIL, and so does the loader's decode.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from hugerec.distributed.sharded import ShardedEmbeddingCollection
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.sparse.batch import Batch
from hugerec.sparse.device_copy import DeviceCopy
from hugerec.training.family import Prepared

Stageable = EmbeddingCollection | ShardedEmbeddingCollection


def stageable(model: nn.Module) -> list[Stageable]:
    """The model's collections that `stage` batches: sharded ones, and the unsharded ones outside them
    (a sharded collection's local shards see the ids it receives, and it stages them itself)."""
    inner = {id(m) for c in model.modules() if isinstance(c, ShardedEmbeddingCollection) for m in c.modules()}
    inner -= {id(c) for c in model.modules() if isinstance(c, ShardedEmbeddingCollection)}
    return [
        m
        for m in model.modules()
        if isinstance(m, EmbeddingCollection | ShardedEmbeddingCollection) and id(m) not in inner
    ]


class Pipeline:
    """Iterates `data` with each batch prepared: moved to `device` and staged in the model's embedding collections.

    prepare  a family's step preparation (`hugerec.training.family.TrainerFamily.prepare`, bound to the model):
             the pipeline then yields its `Prepared` steps and stages their SparseFeatures, each in the
             collections that know all its features. Without it, batches are `Batch`es: moved, their
             `sparse` staged, and yielded as batches.
    hold     called before a batch is handed out: True when the step on it ends at an evaluation or a
             checkpoint, so the batch after it is prepared only once the caller asks for it.
    """

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        hold: Callable[[], bool] = lambda: False,
        prepare: Callable[[Any], Prepared] | None = None,
    ) -> None:
        self.collections = stageable(model)
        self.device = device
        self.hold = hold
        self.prepare = prepare
        self.prepare_s = 0.0  # worker time spent preparing batches (decode + stage)
        self.waited_s = 0.0  # main-thread time spent waiting for them: the part not hidden behind a step
        self._pending: list[Future[Prepared | None]] = []
        self._known = [frozenset((*c.feature_names, *c.sequence_feature_names)) for c in self.collections]
        self._copy = DeviceCopy(device)  # CUDA: pinned memory and a copy stream, overlapping the step

    def __call__(self, data: Iterable[Any]) -> Iterator[Any]:
        batches = iter(data)
        with ThreadPoolExecutor(1, thread_name_prefix="hugerec-pipeline") as pool:
            ahead = pool.submit(self._prepare, batches)
            try:
                for prepared in self._run(pool, ahead, batches):
                    yield prepared if self.prepare is not None else prepared.inputs
            finally:  # the caller stopped early: a batch prepared for nothing must not be looked up
                ahead_done = [f for f in self._pending if not f.cancel()]
                for f in ahead_done:
                    f.exception()
                for c in self.collections:
                    c.unstage()

    def _run(
        self, pool: ThreadPoolExecutor, ahead: Future[Prepared | None], batches: Iterator[Any]
    ) -> Iterator[Prepared]:
        self._pending = [ahead]
        while True:
            started = time.perf_counter()
            prepared = ahead.result()
            self.waited_s += time.perf_counter() - started
            if prepared is None:
                return
            hold = self.hold()
            if not hold:
                ahead = pool.submit(self._prepare, batches)
                self._pending = [ahead]
            yield prepared
            if hold:
                ahead = pool.submit(self._prepare, batches)
                self._pending = [ahead]

    def _prepare(self, batches: Iterator[Any]) -> Prepared | None:
        started = time.perf_counter()
        batch = next(batches, None)
        prepared = None
        if batch is not None:
            prepared = self.prepare(batch) if self.prepare is not None else prepare_batch(batch, self._copy)
            for sparse in prepared.sparse:
                keys = set(sparse.keys)
                for c, known in zip(self.collections, self._known, strict=True):
                    if c.needs_staging and keys <= known:
                        c.stage(sparse, update=True)
        self.prepare_s += time.perf_counter() - started
        return prepared

    def stats(self) -> dict[str, float]:
        """prepare_s and waited_s so far, and hidden: the share of the preparation hidden behind steps."""
        hidden = 1.0 - self.waited_s / self.prepare_s if self.prepare_s > 0 else 0.0
        return {"prepare_s": self.prepare_s, "waited_s": self.waited_s, "hidden": max(0.0, hidden)}


def prepare_batch(batch: Batch, copy: DeviceCopy) -> Prepared:
    """A ranking `Batch` as a step: copied to the device (on CUDA asynchronously, through pinned memory
    on a copy stream: `hugerec.sparse.device_copy`), its `sparse` to be staged."""
    batch = copy(batch)
    return Prepared(batch, (batch.sparse,), batch.batch_size)


class TieredStats:
    """Per log window, per step: the disk tier's cache hit rate and rows read / written, and the
    pipeline's preparation time and the share of it hidden behind the steps (only what the run has)."""

    def __init__(self, model: nn.Module, pipeline: Pipeline | None) -> None:
        self.collections = [m for m in model.modules() if isinstance(m, EmbeddingCollection)]
        self.disk = any(c.has_disk_tables for c in self.collections)
        self.pipeline = pipeline
        self.last = self._totals()

    def _totals(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for c in self.collections:
            for k, v in c.disk_stats().items():
                total[k] = total.get(k, 0.0) + v
        if self.pipeline is not None:
            total.update({f"pipeline_{k}": v for k, v in self.pipeline.stats().items() if k != "hidden"})
        return total

    def window(self, steps: int) -> dict[str, float]:
        """The record fields for the `steps` steps since the last call."""
        now = self._totals()
        d = {k: now[k] - self.last.get(k, 0.0) for k in now}
        self.last = now
        out: dict[str, float] = {}
        per = 1.0 / max(steps, 1)
        if self.disk:
            looked = d["hits"] + d["misses"]
            out["cache_hit_rate"] = d["hits"] / looked if looked else 0.0
            out["disk_rows_read"] = d["rows_read"] * per
            out["disk_rows_written"] = d["rows_written"] * per
        if self.pipeline is not None and d.get("pipeline_prepare_s", 0.0) > 0:
            out["prefetch_ms"] = 1000 * d["pipeline_prepare_s"] * per
            out["prefetch_hidden"] = max(0.0, 1.0 - d["pipeline_waited_s"] / d["pipeline_prepare_s"])
        return out
