"""EmbeddingCollection: many tables, fused storage, fused lookups, sparse optimizer applied in backward.

    tables = [TableConfig("user", num_rows=1000, dim=16),
              TableConfig("item", num_rows=500, dim=16, features=("item", "last_item")),
              TableConfig("hist", num_rows=500, dim=8, pooling=Pooling.NONE)]
    emb = EmbeddingCollection(tables, optimizer=RowWiseAdagrad(lr=0.05))
    pooled = emb(features)           # PooledEmbeddings: keys (user, item, last_item), values [B, 48]
    seqs = emb.sequences(features)   # {"hist": JaggedTensor(values [N_hist, 8], lengths [B])}
    loss.backward()                  # updates the touched rows of user / item / hist in place

Only the pooled (SUM / MEAN) tables' features appear in `forward`, in collection order (tables in the
order given, then each table's features); NONE tables' features come out of `sequences`.
The rows are not Parameters: `torch.optim.Adam(model.parameters())` sees only the dense ones, and
each backward through a lookup is one step of the collection's sparse optimizer for the tables it
touched. Nothing is updated in eval mode or under `torch.no_grad()`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

from hugerec import ops
from hugerec.embedding.feature_remap import NEXT, FeatureRemap
from hugerec.embedding.fused import FusedTables
from hugerec.embedding.fused_lookup import GroupPlan, pooled_lookup, sequence_lookup
from hugerec.embedding.hash_table import HashTable
from hugerec.embedding.interface import EmbeddingModule
from hugerec.embedding.optimizers import Adam, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.ops.lookup_plan import COLUMN, WIDTH
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor
from hugerec.sparse.pooled import PooledEmbeddings

_PlanKey = tuple[tuple[str, ...], bool, frozenset[str]]


class EmbeddingCollection(nn.Module):
    """Tables with the same (dim, dtype, optimizer) share one buffer and one lookup kernel call per batch."""

    def __init__(
        self,
        tables: Sequence[TableConfig],
        optimizer: Optimizer = RowWiseAdagrad(),  # noqa: B008  # frozen dataclass: immutable default
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        tables = tuple(tables)
        if not tables:
            raise ValueError("EmbeddingCollection: needs at least one table")
        self._fused = FusedTables(tables, optimizer, device)
        self._optimizer = optimizer
        self._tables = tables
        self._table_of: dict[str, TableConfig] = {}
        for t in tables:
            for f in t.features:
                if f in self._table_of:
                    raise ValueError(
                        f"EmbeddingCollection: feature {f!r} is looked up in two tables, "
                        f"{self._table_of[f].name!r} and {t.name!r}"
                    )
                self._table_of[f] = t
        self._pooled = tuple(f for t in tables if t.pooling is not Pooling.NONE for f in t.features)
        self._sequence = tuple(f for t in tables if t.pooling is Pooling.NONE for f in t.features)
        self._columns: dict[str, int] = {}  # first output column of each pooled feature
        self._output_dim = 0
        for f in self._pooled:
            self._columns[f] = self._output_dim
            self._output_dim += self._table_of[f].dim
        self._plans: dict[_PlanKey, list[GroupPlan]] = {}
        # dynamic tables (TableConfig.dynamic): raw int64 keys -> rows through one HashTable each
        self._hash_tables = {t.name: HashTable(t.num_rows, t.dynamic, t.name) for t in tables if t.dynamic}
        self._dynamic_features = {t.name: t.features for t in tables if t.dynamic}
        self._zero_missing = frozenset(n for n, h in self._hash_tables.items() if h.unknown_row is None)
        # batches staged for the lookup, oldest first (the one in use and the next, under the pipeline)
        self._staged: list[tuple[SparseFeatures, dict[bool, tuple[torch.Tensor, torch.Tensor]]]] = []
        self._remaps = {  # pooled?: the remap of the (pooled or sequence) dynamic tables
            pooled: FeatureRemap(
                {
                    n: h
                    for n, h in self._hash_tables.items()
                    if (self._fused.configs[n].pooling is not Pooling.NONE) == pooled
                },
                self._dynamic_features,
            )
            for pooled in (True, False)
        }

    # -- description -----------------------------------------------------------------------------
    @property
    def tables(self) -> tuple[TableConfig, ...]:
        return self._tables

    @property
    def optimizer(self) -> Optimizer:
        """The collection-wide optimizer (a table's `optimizer` overrides it)."""
        return self._optimizer

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The pooled features, in the order of `forward`'s output columns."""
        return self._pooled

    @property
    def feature_dims(self) -> tuple[int, ...]:
        return tuple(self._table_of[f].dim for f in self._pooled)

    @property
    def sequence_feature_names(self) -> tuple[str, ...]:
        """The features of Pooling.NONE tables, in the order of `sequences`' output."""
        return self._sequence

    @property
    def output_dim(self) -> int:
        """sum D of the pooled features: `forward(...).values` is [B, output_dim]."""
        return self._output_dim

    @property
    def device(self) -> torch.device:
        return self._fused.device

    @property
    def steps(self) -> dict[str, int]:
        """Optimizer steps taken per table (backward passes that touched it)."""
        return dict(self._fused.steps)

    def extra_repr(self) -> str:
        lines = [f"optimizer={self._optimizer}"]
        for t in self._tables:
            opt = "" if t.optimizer is None else f", optimizer={t.optimizer}"
            lines.append(
                f"{t.name}: rows={t.num_rows}, dim={t.dim}, pooling={t.pooling.value}, dtype={t.dtype.value}, "
                f"features={list(t.features)}{opt}"
            )
        return "\n".join(lines)

    # -- lookups -----------------------------------------------------------------------------------
    def forward(self, features: SparseFeatures) -> PooledEmbeddings:
        """Pooled embeddings [B, output_dim] of the pooled tables' features (other known features are ignored)."""
        staged = self._take_staged(features, True)
        if staged is not None:
            return self._pooled_lookup(features, staged[0], self._zero_missing, staged[1], mapped=True)
        if not self._hash_tables:
            return self.pooled_from_rows(features, features.values)
        offsets = self._offsets(features)
        return self._pooled_lookup(features, self._dynamic_rows(features, True, offsets), self._zero_missing, offsets)

    def sequences(self, features: SparseFeatures) -> dict[str, JaggedTensor]:
        """Per NONE-pooled feature: JaggedTensor(values [N_f, D] fp32, the feature's lengths and weights)."""
        staged = self._take_staged(features, False)
        if staged is not None:
            return self._sequence_lookup(features, staged[0], self._zero_missing, staged[1], mapped=True)
        if not self._hash_tables:
            return self.sequences_from_rows(features, features.values)
        offsets = self._offsets(features)
        rows = self._dynamic_rows(features, False, offsets)
        return self._sequence_lookup(features, rows, self._zero_missing, offsets)

    # -- the training pipeline's seam ------------------------------------------------------------------
    @property
    def needs_staging(self) -> bool:
        """Whether `stage` does work ahead of the lookup (dynamic or disk-tier tables)."""
        return bool(self._hash_tables or self._fused.tiers)

    def stage(self, features: SparseFeatures, update: bool) -> None:
        """Does the lookup's preparation of a batch now: the dynamic tables' remap (inserting keys when
        `update`) and the disk tier's loading of its rows into cache slots, pinned until the batch after
        the next is staged. The next `forward` / `sequences` of these features (the same value and length
        tensors) uses the result; the training pipeline calls this for batch i + 1 while step i computes (at most one
        batch beyond the one in use: the disk tier pins the rows of two)."""
        offsets = self._offsets(features)
        staged: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}
        for pooled, wanted in ((True, self._pooled), (False, self._sequence)):
            if not any(f in features.keys for f in wanted):
                continue
            rows = features.values
            if self._hash_tables:
                rows = self._dynamic_rows(features, pooled, offsets, update)
            values, offsets, _ = self._inputs(features, rows, wanted, "stage", offsets)
            staged[pooled] = (self._to_slots(features, values, offsets, wanted, self._zero_missing, update), offsets)
        self._staged.append((features, staged))
        del self._staged[:-2]  # parts a model never looked up (sequences it does not use) go with the batch

    def unstage(self) -> None:
        """Forgets staged batches that will not be looked up (their remap inserts stay)."""
        self._staged.clear()

    def _take_staged(self, features: SparseFeatures, pooled: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self._staged:
            return None
        for i, (staged, parts) in enumerate(self._staged):  # the same tensors (Batch.to the same device keeps them)
            if staged.values is features.values and staged.lengths is features.lengths:
                found = parts.pop(pooled, None)
                if not parts:
                    del self._staged[i]
                return found
        raise ValueError(
            "EmbeddingCollection: a batch was staged (the training pipeline) but another one is looked up; "
            "a model that looks up other features than batch.sparse needs TrainConfig(pipeline=False)"
        )

    @property
    def fused_tables(self) -> FusedTables:
        """The tables' fused storage and optimizer state (what a learning-rate schedule scales: `sparse_tables`)."""
        return self._fused

    @property
    def has_disk_tables(self) -> bool:
        return bool(self._fused.tiers)

    def disk_stats(self) -> dict[str, float]:
        """Totals since construction over the disk-tier tables: hits, misses (unique rows per batch),
        rows_read, rows_written (disk records) and prepare_s (seconds spent mapping rows to slots)."""
        total = {"hits": 0.0, "misses": 0.0, "rows_read": 0.0, "rows_written": 0.0, "prepare_s": 0.0}
        for tier in self._fused.tiers.values():
            for k, v in tier.stats().items():
                total[k] += v
        return total

    def pin_disk_snapshot(self, table: str, snapshot: int, holder: str | Path) -> None:
        """Keeps disk-tier `table`'s snapshot (the number a state dict of it named) while `holder`, the
        checkpoint directory or model file holding that state dict, exists (DiskTier.pin)."""
        if table not in self._fused.tiers:
            raise ValueError(f"EmbeddingCollection.pin_disk_snapshot: {table!r} is not a disk-tier table")
        self._fused.tiers[table].pin(snapshot, holder)

    def flush(self) -> None:
        """Writes the disk-tier tables' dirty cached rows back and marks their files clean."""
        for tier in self._fused.tiers.values():
            tier.flush()

    def _to_slots(
        self,
        features: SparseFeatures,
        rows: torch.Tensor,
        offsets: torch.Tensor,
        wanted: Sequence[str],
        missing_ok: Collection[str],
        update: bool,
    ) -> torch.Tensor:
        """rows [N] with the disk-tier tables' rows replaced by their cache slots (rows loaded as needed)."""
        tiers = self._fused.tiers
        if not tiers:
            return rows
        batch = features.batch_size
        index = {k: i for i, k in enumerate(features.keys)}
        bounds = offsets[::batch].numpy() if batch else np.zeros(len(features.keys) + 1, dtype=np.int64)
        out: np.ndarray | None = None
        rows_np = rows.numpy()
        for name, tier in tiers.items():
            feats = [index[f] for f in self._fused.configs[name].features if f in index and f in wanted]
            if not feats:
                continue
            spans = [(int(bounds[f]), int(bounds[f + 1])) for f in feats]
            ids = (
                rows_np[spans[0][0] : spans[0][1]]
                if len(spans) == 1
                else np.concatenate([rows_np[a:b] for a, b in spans])
            )
            try:
                slots = tier.prepare(np.ascontiguousarray(ids), name in missing_ok, update)
            except ValueError as e:
                if len(e.args) < 2:
                    raise
                raise ValueError(self._bad_id(features, feats, spans, int(e.args[1]), rows_np)) from None
            if out is None:
                out = rows_np.copy()
            done = 0
            for a, b in spans:
                out[a:b] = slots[done : done + b - a]
                done += b - a
        return rows if out is None else torch.from_numpy(out)

    def _bad_id(
        self, features: SparseFeatures, feats: list[int], spans: list[tuple[int, int]], i: int, rows: np.ndarray
    ) -> str:
        """The lookup's message for the i-th id of the concatenated spans."""
        for f, (a, b) in zip(feats, spans, strict=True):
            if i < b - a:
                name = features.keys[f]
                t = self._table_of[name]
                lengths = features.lengths[f * features.batch_size : (f + 1) * features.batch_size]
                example = int(np.searchsorted(np.cumsum(lengths.numpy()), i, side="right"))
                return (
                    f"feature {name!r} (table {t.name!r}, num_rows {t.num_rows}): id {int(rows[a + i])} of example "
                    f"{example} is outside [0, {t.num_rows})"
                )
            i -= b - a
        raise AssertionError("the bad id lies in the spans")

    # -- dynamic tables ------------------------------------------------------------------------------
    @property
    def hash_tables(self) -> Mapping[str, HashTable]:
        """The HashTable (raw key -> row) of each dynamic table."""
        return MappingProxyType(self._hash_tables)

    def _dynamic_rows(
        self, features: SparseFeatures, pooled: bool, offsets: torch.Tensor, update: bool | None = None
    ) -> torch.Tensor:
        """features.values with the raw keys of the (pooled or sequence) dynamic tables replaced by rows.

        Training (an update will follow) inserts keys, recycling rows by the table's eviction policy
        and re-initialising recycled rows; otherwise keys are only looked up. Training lookups of a
        table are its steps 1, 2, 3, ...: with one backward per forward, the number of the optimizer
        update that writes the rows (the steps delta export counts in). `offsets` are the batch's bag
        offsets (`_offsets`), whose every B-th entry bounds a feature's values.
        """
        batch = features.batch_size
        cpu_offsets = offsets.cpu().numpy()
        bounds = cpu_offsets[::batch] if batch else np.zeros(len(features.keys) + 1, dtype=np.int64)
        update = self._updates() if update is None else update
        rows, reset = self._remaps[pooled](features, NEXT if update else None, bounds)
        for name, recycled in reset.items():
            self._fused.reset_rows(name, recycled)
        return rows

    def pooled_from_rows(
        self, features: SparseFeatures, rows: torch.Tensor, missing_ok: Collection[str] = ()
    ) -> PooledEmbeddings:
        """`forward` with `rows` [N] int64 (table-local row ids, aligned with features.values) in place of the ids.

        The seam for hash tables and sharding, which map raw keys to rows first. For the tables named in
        `missing_ok`, row -1 means "no row": a zero vector that is not updated (and not counted by MEAN).
        """
        return self._pooled_lookup(features, rows, missing_ok, None)

    def _pooled_lookup(
        self,
        features: SparseFeatures,
        rows: torch.Tensor,
        missing_ok: Collection[str],
        offsets: torch.Tensor | None,
        mapped: bool = False,
    ) -> PooledEmbeddings:
        values, offsets, weights = self._inputs(features, rows, self._pooled, "forward", offsets)
        if not mapped:  # mapped: `stage` already put the disk-tier tables' cache slots in place of their rows
            values = self._to_slots(features, values, offsets, self._pooled, missing_ok, self._updates())
        plans = self._plan(features.keys, True, frozenset(missing_ok))
        out = pooled_lookup(
            self._fused, plans, values, offsets, weights, features.batch_size, self.output_dim, self._updates()
        )
        return PooledEmbeddings(self._pooled, self.feature_dims, out)

    def sequences_from_rows(
        self, features: SparseFeatures, rows: torch.Tensor, missing_ok: Collection[str] = ()
    ) -> dict[str, JaggedTensor]:
        """`sequences` with table-local `rows` in place of the ids (see `pooled_from_rows`)."""
        return self._sequence_lookup(features, rows, missing_ok, None)

    def _sequence_lookup(
        self,
        features: SparseFeatures,
        rows: torch.Tensor,
        missing_ok: Collection[str],
        offsets: torch.Tensor | None,
        mapped: bool = False,
    ) -> dict[str, JaggedTensor]:
        values, offsets, _ = self._inputs(features, rows, self._sequence, "sequences", offsets)
        if not mapped:
            values = self._to_slots(features, values, offsets, self._sequence, missing_ok, self._updates())
        batch = features.batch_size
        base = self._plan(features.keys, False, frozenset(missing_ok))
        index = {k: i for i, k in enumerate(features.keys)}
        starts = offsets[::batch].tolist() if batch else [0] * (len(features.keys) + 1)  # [F + 1] value ranges
        plans: list[GroupPlan] = []
        sizes: list[int] = []
        where: dict[str, tuple[int, int, int, int]] = {}
        for gp in base:
            plan = gp.plan.clone()
            size = 0
            for line, name in enumerate(gp.features):
                f = index[name]
                plan[line, COLUMN] = size
                where[name] = (len(plans), size, starts[f + 1] - starts[f], f)
                size += starts[f + 1] - starts[f]
            plans.append(GroupPlan(gp.group, plan, gp.features))
            sizes.append(size)
        outs = sequence_lookup(self._fused, plans, values, offsets, batch, sizes, self._updates())
        result = {}
        for name in self._sequence:
            group, start, count, f = where[name]
            w = None if features.weights is None else features.weights[starts[f] : starts[f + 1]]
            result[name] = JaggedTensor(
                outs[group][start : start + count], features.lengths[f * batch : (f + 1) * batch], w
            )
        return result

    def _updates(self) -> bool:
        return self.training and torch.is_grad_enabled()

    def _offsets(self, features: SparseFeatures) -> torch.Tensor:
        """The batch's bag offsets [F * B + 1] int64, in a recycled buffer."""
        offsets = self._fused.outputs.empty((features.lengths.numel() + 1,), torch.int64, features.lengths.device)
        ops.bag_offsets(features.lengths, offsets)
        return offsets

    def _inputs(
        self,
        features: SparseFeatures,
        rows: torch.Tensor,
        wanted: Sequence[str],
        where: str,
        offsets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        unknown = [k for k in features.keys if k not in self._table_of]
        if unknown:
            raise ValueError(
                f"EmbeddingCollection.{where}: unknown features {unknown}; tables have {list(self._table_of)}"
            )
        missing = [k for k in wanted if k not in features.keys]
        if missing:
            raise ValueError(f"EmbeddingCollection.{where}: missing features {missing} (got {list(features.keys)})")
        if rows.shape != features.values.shape or rows.dtype != torch.int64:
            raise ValueError(
                f"EmbeddingCollection.{where}: rows must be int64 shaped like the values {tuple(features.values.shape)}, "
                f"got {rows.dtype} {tuple(rows.shape)}"
            )
        if rows.device != self.device:
            raise ValueError(f"EmbeddingCollection.{where}: features on {rows.device}, tables on {self.device}")
        weights = features.weights
        if weights is not None:
            if not weights.is_floating_point():
                raise ValueError(f"EmbeddingCollection.{where}: weights must be floating point, got {weights.dtype}")
            weights = weights.to(torch.float32).contiguous()
        if offsets is None or offsets.device != rows.device:
            offsets = self._fused.outputs.empty((features.lengths.numel() + 1,), torch.int64, rows.device)
            ops.bag_offsets(features.lengths, offsets)
        return rows.contiguous(), offsets, weights

    def _plan(self, keys: tuple[str, ...], pooled: bool, missing_ok: frozenset[str]) -> list[GroupPlan]:
        """Per table group, the plan lines of the wanted features in `keys` (cached per key order)."""
        cache_key = (keys, pooled, missing_ok)
        if cache_key not in self._plans:
            unknown = sorted(missing_ok - {t.name for t in self._tables})
            if unknown:
                raise ValueError(f"EmbeddingCollection: missing_ok names unknown tables {unknown}")
            index = {k: i for i, k in enumerate(keys)}
            lines: dict[int, list[list[int]]] = {}
            names: dict[int, list[str]] = {}
            for f in self._pooled if pooled else self._sequence:
                t = self._table_of[f]
                slot = self._fused.slots[t.name]
                lines.setdefault(slot.group, []).append(
                    [
                        index[f],
                        slot.index,
                        slot.row_offset,
                        self._fused.resident[t.name],  # a disk-tier table's ids are cache slots here
                        self._columns.get(f, 0),
                        int(t.pooling is Pooling.MEAN),
                        int(t.name in missing_ok),
                    ]
                )
                names.setdefault(slot.group, []).append(f)
            self._plans[cache_key] = [
                GroupPlan(g, torch.tensor(lines[g], dtype=torch.int64).view(-1, WIDTH), tuple(names[g])) for g in lines
            ]
        return self._plans[cache_key]

    # -- per-table access (serving, delta export, hash tables, sharding) ---------------------------
    def table_weight(self, table: str) -> torch.Tensor:
        """[num_rows, dim] view of a table's rows in its storage dtype (writes go to the table)."""
        return self._fused.table_weight(table)

    def table_state(self, table: str) -> dict[str, torch.Tensor]:
        """Views of a table's optimizer state: name -> [num_rows, dim] or [num_rows] fp32."""
        return self._fused.table_state(table)

    def read_rows(self, table: str, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Copies of table rows [n]: (weights [n, dim] storage dtype, {state name: [n, ...] fp32})."""
        return self._fused.read_rows(table, rows)

    def write_rows(
        self, table: str, rows: torch.Tensor, weights: torch.Tensor, state: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Overwrites table rows [n] with weights [n, dim] (and the optimizer state if given, else kept)."""
        self._fused.write_rows(table, rows, weights, state)

    def adam_step(self, table: str) -> int | None:
        """The number of Adam steps table `table` took (None when its optimizer is not Adam)."""
        return self._fused.steps[table] if table in self._adam_tables() else None

    def reset_optimizer_state(self, tables: Sequence[str] | None = None) -> None:
        """The sparse optimizer state of `tables` (None: all) back to its initial values, the weights kept: rows
        trained for long have large Adagrad sums and take tiny steps; after a concept drift the loop resets
        them so the rows relearn at the optimizer's full rate (continuous/loop.py). In-memory tables only."""
        names = [t.name for t in self._tables]
        for name in names if tables is None else tables:
            if name not in names:
                raise ValueError(f"EmbeddingCollection.reset_optimizer_state: no table {name!r}; tables are {names}")
            self._fused.reset_state(name)

    def reset_rows(self, table: str, rows: torch.Tensor | None = None) -> None:
        """Re-initialises table rows [n] (None: all) with the table's initializer and fresh optimizer state."""
        self._fused.reset_rows(table, rows)

    # -- state dict: per table, independent of the fused layout -------------------------------------
    def _table_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        out = {}
        for t in self._tables:
            if t.name in self._fused.tiers:  # its rows stay on disk: the state dict names a snapshot
                continue
            out[f"{prefix}tables.{t.name}.weight"] = self._fused.table_weight(t.name)
            for name, view in self._fused.table_state(t.name).items():
                out[f"{prefix}tables.{t.name}.{name}"] = view
        return out

    def _adam_tables(self) -> list[str]:
        return [t.name for t in self._tables if isinstance(self._fused.optimizers[t.name], Adam)]

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        destination.update(self._table_tensors(prefix))
        for name, tier in self._fused.tiers.items():  # a clone of the file, not a copy through RAM
            destination[f"{prefix}tables.{name}.disk_snapshot"] = torch.tensor(tier.snapshot(), dtype=torch.int64)
        for name, h in self._hash_tables.items():
            destination.update({f"{prefix}tables.{name}.hash_table.{k}": v for k, v in h.state_dict().items()})
        for name in self._adam_tables():
            destination[f"{prefix}tables.{name}.step"] = torch.tensor(self._fused.steps[name], dtype=torch.int64)

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        targets = self._table_tensors(prefix)
        steps = {f"{prefix}tables.{name}.step": name for name in self._adam_tables()}
        for key, target in targets.items():
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            if tuple(value.shape) != tuple(target.shape):
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} from checkpoint, "
                    f"the shape in current model is {tuple(target.shape)}."
                )
                continue
            with torch.no_grad():
                target.copy_(value)
        for key, name in steps.items():
            if key in state_dict:
                self._fused.steps[name] = int(state_dict[key])
            else:
                missing_keys.append(key)
        snapshots = {f"{prefix}tables.{name}.disk_snapshot": name for name in self._fused.tiers}
        for key, name in snapshots.items():
            if key not in state_dict:
                missing_keys.append(key)
                continue
            try:
                self._fused.tiers[name].restore(int(state_dict[key]))
            except ValueError as e:
                error_msgs.append(str(e))
        self._staged.clear()
        known = set(targets) | set(steps) | set(snapshots)
        known |= self._load_hash_tables(state_dict, prefix, missing_keys, error_msgs)
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in known)

    def _load_hash_tables(
        self, state_dict: Mapping[str, Any], prefix: str, missing_keys: list[str], error_msgs: list[str]
    ) -> set[str]:
        """Restores each dynamic table's key -> row mapping; returns the state-dict keys it consumed."""
        known = set()
        for name, h in self._hash_tables.items():
            keys = {k: f"{prefix}tables.{name}.hash_table.{k}" for k in HashTable.STATE_KEYS}
            known |= set(keys.values())
            absent = [full for full in keys.values() if full not in state_dict]
            if absent:
                missing_keys.extend(absent)
                continue
            try:
                h.load_state_dict({k: state_dict[full] for k, full in keys.items()})
            except ValueError as e:
                error_msgs.append(str(e))
        return known

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> EmbeddingCollection:
        """Device moves (`.to`, `.cuda`, `.cpu`) move the fused buffers; dtype casts leave the storage dtype.
        On CUDA with Triton installed the dynamic tables' hash tables move to the device too (their remap
        then runs there); elsewhere they stay on the host."""
        super()._apply(fn, recurse)
        self._fused.apply(fn)
        device = self._fused.device
        on_device = device.type == "cuda" and ops.HAS_TRITON
        for h in self._hash_tables.values():
            h.move(device if on_device else None)
        return self


# mypy proves here that the collection satisfies the interface models annotate (as the sharded one does)
_COLLECTION_IS_EMBEDDING_MODULE: type[EmbeddingModule] = EmbeddingCollection
