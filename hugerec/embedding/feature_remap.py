"""FeatureRemap: raw keys -> rows for every dynamic table of a batch, one kernel for the tables side by side.

The collection calls it once per batch (training: `find_or_insert` at each table's step; eval: `find`)
through each `HashTable`'s public numpy paths and `kernel_view()`, or, for tables moved to a device
(`HashTable.move`, the collection on CUDA), through their tensor paths: the keys never leave the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from hugerec.embedding.hash_table import HashTable
from hugerec.ops import hash_table_arrays as ops
from hugerec.sparse.features import SparseFeatures

NEXT: Literal["next"] = "next"  # `FeatureRemap` steps: every table at its next step (its last step + 1)
Steps = Mapping[str, int] | Literal["next"] | None


@dataclass
class _Layout:
    """Where a batch with one key order puts each dynamic table's keys (see `FeatureRemap`)."""

    single: tuple[str, ...]  # tables looked up by exactly one feature of the batch
    single_feature: np.ndarray  # int64 [len(single)]: that feature's index in the batch
    shared: tuple[tuple[str, tuple[int, ...]], ...]  # tables looked up by several features: their indices
    plain: tuple[int, ...]  # features of no dynamic table (their ids pass through)
    pack: ops.TablePack | None = None  # the single tables' arrays for the side-by-side kernels


class FeatureRemap:
    """Raw keys -> rows for the features of dynamic tables, batch after batch.

    Called with a batch, it returns rows [N] int64 aligned with features.values and {table: reset
    rows [E]} of the tables that recycled rows (their weights and optimizer state must be
    re-initialised before use). The keys of all features of one table (those present in the batch)
    go through its HashTable in one call: with find_or_insert at the given steps (`NEXT`: each
    table's next step; or a mapping table -> step), or with find when steps is None (eval). The ids
    of other features are copied unchanged.

    A table looked up by one feature maps that feature's span of the values in place, side by side
    with the other such tables in one parallel kernel (on batches of at least _PARALLEL_MIN_KEYS
    keys); a table shared by several features gets their keys concatenated, one table at a time, as
    does a table the kernel hands back (its first eviction needs a heap, or the keys do not fit: the
    one-table call then raises). What does not change between batches is kept: per key order, which
    span belongs to which table, and the tables' arrays as the kernel takes them, so a step spends
    no Python per table.
    """

    def __init__(self, tables: Mapping[str, HashTable], table_features: Mapping[str, Sequence[str]]) -> None:
        self._tables = dict(tables)
        self._features = {name: tuple(table_features[name]) for name in self._tables}
        self._layouts: dict[tuple[str, ...], _Layout] = {}
        self._reset = np.empty(0, dtype=np.int64)  # the kernel's reset rows, reused across batches

    def _layout(self, keys: tuple[str, ...]) -> _Layout:
        found = self._layouts.get(keys)
        if found is None:
            index = {k: i for i, k in enumerate(keys)}
            present = {name: tuple(index[f] for f in fs if f in index) for name, fs in self._features.items()}
            single = tuple(name for name, fs in present.items() if len(fs) == 1)
            covered = {f for fs in present.values() for f in fs}
            found = _Layout(
                single=single,
                single_feature=np.asarray([present[name][0] for name in single], dtype=np.int64),
                shared=tuple((name, fs) for name, fs in present.items() if len(fs) > 1),
                plain=tuple(i for i in range(len(keys)) if i not in covered),
            )
            self._layouts[keys] = found
        return found

    def __call__(
        self, features: SparseFeatures, steps: Steps = NEXT, bounds: np.ndarray | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(rows [N], reset rows per table) of a batch; `bounds` [F + 1] int64, where the caller has them,
        are the features' value ranges in features.values (else they are summed from the lengths)."""
        values = features.values
        if any(t.device is not None for t in self._tables.values()):
            return self._on_device(features, steps, bounds)
        if bounds is None:
            num_features, batch = len(features.keys), features.batch_size
            counts = features.lengths.cpu().numpy().reshape(num_features, batch).sum(axis=1, dtype=np.int64)
            bounds = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)])
        layout = self._layout(features.keys)
        keys_np = np.ascontiguousarray(values.detach().cpu().numpy())  # int64 (SparseFeatures checks it)
        n = keys_np.shape[0]
        # the keys of a table shared by several features are copied together after the batch's keys
        shared_spans = [[(int(bounds[f]), int(bounds[f + 1])) for f in fs] for _, fs in layout.shared]
        keys_all = keys_np
        if layout.shared:
            keys_all = np.concatenate([keys_np, *(keys_np[a:b] for spans in shared_spans for a, b in spans)])
        rows_all = np.empty_like(keys_all)
        reset: dict[str, torch.Tensor] = {}
        left = list(range(len(layout.single)))
        if len(layout.single) > 1 and n >= _PARALLEL_MIN_KEYS:
            left = self._side_by_side(layout, keys_all, rows_all, bounds, steps, reset)
        for i in left:  # one table at a time: small batches, and tables the kernel handed back
            f = int(layout.single_feature[i])
            self._one_table(layout.single[i], keys_all, rows_all, int(bounds[f]), int(bounds[f + 1]), steps, reset)
        end = n
        for (name, _), spans in zip(layout.shared, shared_spans, strict=True):
            size = sum(b - a for a, b in spans)
            self._one_table(name, keys_all, rows_all, end, end + size, steps, reset)
            for a, b in spans:
                rows_all[a:b] = rows_all[end : end + b - a]
                end += b - a
        rows_np = rows_all[:n]
        for f in layout.plain:
            a, b = int(bounds[f]), int(bounds[f + 1])
            rows_np[a:b] = keys_np[a:b]
        return torch.from_numpy(rows_np).to(values.device), reset

    def _on_device(
        self, features: SparseFeatures, steps: Steps, bounds: np.ndarray | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The remap of tables on a device: each table's keys (its features' spans, concatenated when it has
        several) through its tensor path, on the device of the values; other features' ids pass through."""
        values = features.values
        if bounds is None:
            num_features, batch = len(features.keys), features.batch_size
            counts = features.lengths.cpu().numpy().reshape(num_features, batch).sum(axis=1, dtype=np.int64)
            bounds = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)])
        layout = self._layout(features.keys)
        rows = values.clone()
        reset: dict[str, torch.Tensor] = {}
        spans_of = [(name, (int(f),)) for name, f in zip(layout.single, layout.single_feature.tolist(), strict=True)]
        for name, fs in [*spans_of, *layout.shared]:
            table = self._tables[name]
            spans = [(int(bounds[f]), int(bounds[f + 1])) for f in fs]
            keys = values[spans[0][0] : spans[0][1]] if len(spans) == 1 else torch.cat([values[a:b] for a, b in spans])
            if steps is None:
                mapped = table.find_tensor(keys.contiguous())
            else:
                step = max(table.step, 0) + 1 if isinstance(steps, str) else steps[name]
                if step < table.step:  # the host path's message
                    table.find_or_insert(keys[:0], step)
                mapped, recycled = table.find_or_insert_tensor(keys.contiguous(), step)
                if recycled.numel():
                    reset[name] = recycled
            done = 0
            for a, b in spans:
                rows[a:b] = mapped[done : done + b - a]
                done += b - a
        return rows, reset

    def _one_table(
        self,
        name: str,
        keys: np.ndarray,
        rows: np.ndarray,
        a: int,
        b: int,
        steps: Steps,
        reset: dict[str, torch.Tensor],
    ) -> None:
        table = self._tables[name]
        if steps is None:
            table.find_numpy(keys[a:b], rows[a:b])
            return
        step = max(table.step, 0) + 1 if isinstance(steps, str) else steps[name]
        _, recycled = table.find_or_insert_numpy(keys[a:b], step, out=rows[a:b])
        if recycled.size:
            reset[name] = torch.from_numpy(recycled)

    def _side_by_side(
        self,
        layout: _Layout,
        keys: np.ndarray,
        rows: np.ndarray,
        bounds: np.ndarray,
        steps: Steps,
        reset: dict[str, torch.Tensor],
    ) -> list[int]:
        """The single-feature tables of `layout` in one parallel kernel; returns the indices (into
        layout.single) of the tables left to the one-table path."""
        tables = [self._tables[name] for name in layout.single]
        views = [t.kernel_view() for t in tables]
        arrays = [v.arrays for v in views]
        if layout.pack is None or not layout.pack.current(arrays):
            layout.pack = ops.TablePack(
                arrays,
                [v.eviction for v in views],
                [v.min_count for v in views],
                [v.ttl for v in views],
                [v.unknown_row for v in views],
            )
        starts = bounds[layout.single_feature]
        ends = bounds[layout.single_feature + 1]
        if steps is None:
            ops.lookup_tables(layout.pack, keys, starts, ends, rows)
            return []
        if isinstance(steps, str):
            step = np.full(len(tables), -1, dtype=np.int64)
        else:
            step = np.asarray([steps[name] for name in layout.single], dtype=np.int64)
            if any(s < t.step for s, t in zip(step.tolist(), tables, strict=True)):
                return list(range(len(tables)))  # a step goes back: the one-table path raises
        if self._reset.shape[0] < keys.shape[0]:
            self._reset = np.empty(keys.shape[0], dtype=np.int64)
        status = ops.find_or_insert_tables(layout.pack, keys, starts, ends, rows, step, self._reset)
        for i in np.flatnonzero(status[:, 1] > 0).tolist():
            if status[i, 0] == ops.OK:
                a = int(starts[i])
                reset[layout.single[i]] = torch.from_numpy(self._reset[a : a + int(status[i, 1])].copy())
        return np.flatnonzero(status[:, 0] != ops.OK).tolist()


def remap_features(
    features: SparseFeatures,
    tables: Mapping[str, HashTable],
    table_features: Mapping[str, Sequence[str]],
    steps: Mapping[str, int] | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`FeatureRemap` of one batch: rows [N] int64 aligned with features.values and {table: reset rows}."""
    return FeatureRemap(tables, table_features)(features, steps)


_PARALLEL_MIN_KEYS = 16_384  # below this many keys per batch a parallel region costs more than it saves
