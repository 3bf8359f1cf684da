"""FusedTables: the storage of many embedding tables, fused into one buffer per (dim, dtype, optimizer).

    tables  user [R=4, D=8], item [R=3, D=8], both fp32 + RowWiseAdagrad  -> one group:
      weight [7, D_pad=8]   rows 0..3 = user, rows 4..6 = item (row offsets 0 and 4)
      state  [7, S=1] fp32  the optimizer state of the same rows

Rows are padded to a multiple of 16 bytes (D_pad); the padding stays zero and never shows: every
per-table accessor returns [num_rows, dim]. Nothing here is an nn.Parameter: the rows are updated
in place by the fused backward (`hugerec.ops.sparse_backward`), never by a torch optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from hugerec.embedding.disk import DiskTier
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, Optimizer, RowWiseAdagrad, optimizer_name
from hugerec.embedding.table_config import Normal, Storage, TableConfig, Uniform, Zeros
from hugerec.ops import huge_pages
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import OutputPool, Workspace


def update_rule(opt: Optimizer) -> UpdateRule:
    """The kernels' form of an optimizer config."""
    match opt:
        case SGD():
            return UpdateRule(RuleKind.SGD, opt.lr, weight_decay=opt.weight_decay)
        case Adagrad():
            return UpdateRule(RuleKind.ADAGRAD, opt.lr, eps=opt.eps, weight_decay=opt.weight_decay)
        case RowWiseAdagrad():
            return UpdateRule(RuleKind.ROWWISE_ADAGRAD, opt.lr, eps=opt.eps, weight_decay=opt.weight_decay)
        case Adam():
            return UpdateRule(
                RuleKind.ADAM, opt.lr, eps=opt.eps, beta1=opt.beta1, beta2=opt.beta2, weight_decay=opt.weight_decay
            )
        case Ftrl():
            return UpdateRule(
                RuleKind.FTRL,
                opt.lr,
                weight_decay=opt.weight_decay,
                l1=opt.l1,
                l2=opt.l2,
                beta=opt.beta,
                lr_power=opt.lr_power,
            )
        case _:
            raise ValueError(f"unknown sparse optimizer {opt!r}; expected SGD, Adagrad, RowWiseAdagrad, Adam or Ftrl")


@dataclass(frozen=True)
class StateField:
    """One named optimizer-state tensor of a table: state columns [start, start + width); width 1 -> [R]."""

    name: str
    start: int
    width: int
    initial: float


def state_fields(opt: Optimizer, dim: int) -> tuple[StateField, ...]:
    match opt:
        case SGD():
            return ()
        case Adagrad():
            return (StateField("sum", 0, dim, opt.initial_accumulator_value),)
        case RowWiseAdagrad():
            return (StateField("sum", 0, 1, opt.initial_accumulator_value),)
        case Adam():
            return (StateField("exp_avg", 0, dim, 0.0), StateField("exp_avg_sq", dim, dim, 0.0))
        case Ftrl():
            return (StateField("z", 0, dim, 0.0), StateField("n", dim, dim, opt.initial_accumulator_value))


def padded_dim(dim: int, itemsize: int) -> int:
    """Row width rounded up to a multiple of 16 bytes."""
    per16 = 16 // itemsize
    return -(-dim // per16) * per16


@dataclass
class FusedGroup:
    """Tables sharing (dim, dtype, optimizer): one weight buffer [R, D_pad] and one state buffer [R, S]."""

    dim: int
    optimizer: Optimizer
    rule: UpdateRule
    tables: list[str]
    weight: torch.Tensor
    state: torch.Tensor
    workspace: Workspace = field(default_factory=Workspace)


@dataclass(frozen=True)
class TableSlot:
    """Where a table lives: group index, index inside the group, first row."""

    group: int
    index: int
    row_offset: int


class FusedTables:
    """Storage, initialisation and per-table access of a set of tables (not an nn.Module)."""

    def __init__(
        self, tables: Sequence[TableConfig], optimizer: Optimizer, device: torch.device | str | None = None
    ) -> None:
        self.configs: dict[str, TableConfig] = {}
        for t in tables:
            if not isinstance(t, TableConfig):
                raise ValueError(f"expected TableConfig, got {t!r}")
            if t.name in self.configs:
                raise ValueError(f"duplicate table name {t.name!r}")
            self.configs[t.name] = t
        update_rule(optimizer)  # validates the collection-wide optimizer even if every table overrides it
        self.optimizers = {t.name: t.optimizer or optimizer for t in tables}
        keys: dict[tuple[int, torch.dtype, Optimizer], list[TableConfig]] = {}
        for t in tables:
            keys.setdefault((t.dim, t.dtype.torch_dtype, self.optimizers[t.name]), []).append(t)
        self.groups: list[FusedGroup] = []
        self.slots: dict[str, TableSlot] = {}
        self.steps: dict[str, int] = {t.name: 0 for t in tables}
        self.lr_scale = 1.0  # multiplier on every table's lr for the next updates (`set_lr_scale`)
        self.outputs = OutputPool()  # lookup outputs, recycled across steps
        self.resident: dict[str, int] = {}  # rows a table holds in its group: num_rows, or its cache slots
        self.tiers: dict[str, DiskTier] = {}  # the disk tier of each storage = DISK table
        for (dim, dtype, opt), members in keys.items():
            rule = update_rule(opt)
            rows = 0
            d_pad = padded_dim(dim, torch.tensor([], dtype=dtype).element_size())
            record = d_pad * torch.tensor([], dtype=dtype).element_size() + 4 * rule.state_width(dim)
            for i, t in enumerate(members):
                self.slots[t.name] = TableSlot(len(self.groups), i, rows)
                self.resident[t.name] = _resident_rows(t, record, device)
                rows += self.resident[t.name]
            # rows and state on huge pages (large CPU tables: see hugerec.ops.huge_pages); reset_rows below fills them
            weight = huge_pages.empty((rows, d_pad), dtype, device)
            weight[:, dim:] = 0
            state = huge_pages.empty((rows, rule.state_width(dim)), torch.float32, device)
            self.groups.append(FusedGroup(dim, opt, rule, [t.name for t in members], weight, state))
        for name, t in self.configs.items():  # in table order: the random init is the in-memory tables'
            if t.storage is Storage.DISK:
                self.tiers[name] = self._disk_tier(t)
            else:
                self.reset_rows(name, None)

    def _disk_tier(self, t: TableConfig) -> DiskTier:
        """Opens (or creates and initialises) table t's file; its cache slots are its rows of the group."""
        s = self.slots[t.name]
        g = self.groups[s.group]
        slots = slice(s.row_offset, s.row_offset + self.resident[t.name])
        weight, state = g.weight[slots], g.state[slots]
        layout = {
            "table": t.name,
            "num_rows": t.num_rows,
            "dim": t.dim,
            "dtype": t.dtype.value,
            "optimizer": optimizer_name(self.optimizers[t.name]),
            "row_bytes": weight.shape[1] * weight.element_size(),
            "state_bytes": state.shape[1] * 4,
        }
        assert t.path is not None  # TableConfig checks
        return DiskTier(t.path, layout, weight, state, lambda start, n: self._fresh(t.name, n))

    def _fresh(self, table: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n freshly initialised rows (weights [n, dim], state [n, S] fp32), drawn as reset_rows draws them."""
        c = self.configs[table]
        weights = torch.empty(n, c.dim, dtype=c.dtype.torch_dtype)
        _init(c, weights)
        state = torch.empty(n, self.groups[self.slots[table].group].state.shape[1], dtype=torch.float32)
        for f in state_fields(self.optimizers[table], c.dim):
            state[:, f.start : f.start + f.width] = f.initial
        return weights, state

    # -- per-table views ------------------------------------------------------------------------
    def _config(self, table: str) -> TableConfig:
        try:
            return self.configs[table]
        except KeyError:
            raise ValueError(f"unknown table {table!r}; have {list(self.configs)}") from None

    def _in_memory(self, table: str, where: str) -> None:
        if table in self.tiers:
            raise ValueError(f"{where}({table!r}): the table lives on disk ({self.configs[table].path}); use read_rows")

    def table_weight(self, table: str) -> torch.Tensor:
        """[num_rows, dim] view of the table's rows (storage dtype; writes go to the table)."""
        self._in_memory(table, "table_weight")
        c, s = self._config(table), self.slots[table]
        return self.groups[s.group].weight[s.row_offset : s.row_offset + c.num_rows, : c.dim]

    def table_state(self, table: str) -> dict[str, torch.Tensor]:
        """Optimizer state views, fp32: name -> [num_rows, dim] (or [num_rows] for row-wise state)."""
        self._in_memory(table, "table_state")
        c, s = self._config(table), self.slots[table]
        state = self.groups[s.group].state[s.row_offset : s.row_offset + c.num_rows]
        out = {}
        for f in state_fields(self.optimizers[table], c.dim):
            out[f.name] = state[:, f.start] if f.width == 1 else state[:, f.start : f.start + f.width]
        return out

    def reset_state(self, table: str) -> None:
        """The table's optimizer state back to its initial values, the weights kept (as a freshly built optimizer
        would start on these rows); Adam's step count restarts too (its bias correction belongs to the moments)."""
        fields = state_fields(self.optimizers[table], self._config(table).dim)
        for f, view in zip(fields, self.table_state(table).values(), strict=True):
            view.fill_(f.initial)
        if isinstance(self.optimizers[table], Adam):
            self.steps[table] = 0

    # -- rows ----------------------------------------------------------------------------------
    def _rows(self, table: str, rows: torch.Tensor, where: str) -> torch.Tensor:
        c = self._config(table)
        if rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"{where}({table!r}): rows must be a 1-D integer tensor, got {rows.dtype} {tuple(rows.shape)}"
            )
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= c.num_rows):
            bad = rows[(rows < 0) | (rows >= c.num_rows)][0]
            raise ValueError(f"{where}({table!r}): row {int(bad)} outside [0, {c.num_rows})")
        return rows.to(device=self.groups[self.slots[table].group].weight.device, dtype=torch.int64)

    def read_rows(self, table: str, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Copies of rows [n] of a table: (weights [n, dim] in the storage dtype, {state name: [n, ...] fp32})."""
        rows = self._rows(table, rows, "read_rows")
        if table in self.tiers:
            return self._split(table, self.tiers[table].read(rows.numpy()))
        return self.table_weight(table)[rows], {k: v[rows] for k, v in self.table_state(table).items()}

    def _split(self, table: str, records: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Disk records [n, W + S] uint8 -> (weights [n, dim], {state name: [n, ...] fp32}), copies."""
        c, tier = self.configs[table], self.tiers[table]
        n = records.shape[0]
        raw = torch.from_numpy(np.ascontiguousarray(records[:, : tier.row_bytes]))
        weights = raw.view(c.dtype.torch_dtype).view(n, -1)[:, : c.dim].clone()
        state = torch.from_numpy(np.ascontiguousarray(records[:, tier.row_bytes :])).view(torch.float32).view(n, -1)
        out = {}
        for f in state_fields(self.optimizers[table], c.dim):
            out[f.name] = state[:, f.start].clone() if f.width == 1 else state[:, f.start : f.start + f.width].clone()
        return weights, out

    def write_rows(
        self, table: str, rows: torch.Tensor, weights: torch.Tensor, state: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Overwrites rows [n] with weights [n, dim] and, if given, every state tensor (else the state is kept)."""
        rows = self._rows(table, rows, "write_rows")
        if table in self.tiers:
            self._write_disk(table, rows, weights, state)
            return
        view = self.table_weight(table)
        if tuple(weights.shape) != (rows.numel(), view.shape[1]):
            raise ValueError(
                f"write_rows({table!r}): weights shape {tuple(weights.shape)} != ({rows.numel()}, {view.shape[1]})"
            )
        _scatter_rows(view, rows, weights.to(device=view.device, dtype=view.dtype).contiguous())
        if state is None:
            return
        views = self.table_state(table)
        if set(state) != set(views):
            raise ValueError(f"write_rows({table!r}): state keys {sorted(state)} != {sorted(views)}")
        for k, v in views.items():
            if tuple(state[k].shape) != (rows.numel(), *v.shape[1:]):
                raise ValueError(
                    f"write_rows({table!r}): state {k!r} shape {tuple(state[k].shape)} != "
                    f"({rows.numel()}, {', '.join(map(str, v.shape[1:]))})"
                )
            _scatter_rows(v, rows, state[k].to(device=v.device, dtype=v.dtype).contiguous())

    def _write_disk(
        self, table: str, rows: torch.Tensor, weights: torch.Tensor, state: Mapping[str, torch.Tensor] | None
    ) -> None:
        c, tier = self.configs[table], self.tiers[table]
        n = rows.numel()
        if tuple(weights.shape) != (n, c.dim):
            raise ValueError(f"write_rows({table!r}): weights shape {tuple(weights.shape)} != ({n}, {c.dim})")
        _, old_state = self._split(table, tier.read(rows.numpy()))
        new_state = old_state if state is None else dict(state)
        if set(new_state) != set(old_state):
            raise ValueError(f"write_rows({table!r}): state keys {sorted(new_state)} != {sorted(old_state)}")
        packed = torch.zeros(n, self.groups[self.slots[table].group].state.shape[1], dtype=torch.float32)
        for f in state_fields(self.optimizers[table], c.dim):
            v = new_state[f.name].to(torch.float32)
            if tuple(v.shape) != tuple(old_state[f.name].shape):
                raise ValueError(
                    f"write_rows({table!r}): state {f.name!r} shape {tuple(v.shape)} != {tuple(old_state[f.name].shape)}"
                )
            packed[:, f.start : f.start + f.width] = v.view(n, f.width)
        tier.write(rows.numpy(), tier._records(weights.to(c.dtype.torch_dtype), packed))

    def reset_rows(self, table: str, rows: torch.Tensor | None) -> None:
        """Re-initialises rows [n] (None: the whole table) with the table's initializer and fresh optimizer state."""
        c = self._config(table)
        if table in self.tiers:
            tier = self.tiers[table]
            if rows is None:
                tier.fill_all(lambda start, n: self._fresh(table, n))
            else:
                rows = self._rows(table, rows, "reset_rows")
                tier.write(rows.numpy(), tier._records(*self._fresh(table, rows.numel())))
            return
        view = self.table_weight(table)
        n = c.num_rows if rows is None else int(rows.numel())
        fresh = torch.empty(n, c.dim, dtype=view.dtype, device=view.device) if rows is not None else view
        _init(c, fresh)
        if rows is not None:
            rows = self._rows(table, rows, "reset_rows")
            _scatter_rows(view, rows, fresh)
        state = self.groups[self.slots[table].group].state
        s = self.slots[table]
        block = state[s.row_offset : s.row_offset + c.num_rows]
        for f in state_fields(self.optimizers[table], c.dim):
            if rows is None:
                block[:, f.start : f.start + f.width] = f.initial
            else:
                _fill_rows(block[:, f.start : f.start + f.width], rows, f.initial)

    # -- steps -----------------------------------------------------------------------------------
    def set_lr_scale(self, factor: float) -> None:
        """Multiplies every table's lr by `factor` in the updates from now on (a learning-rate schedule's
        factor for the step about to be taken; 1.0: the optimizers' own lr, exactly)."""
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not (math.isfinite(factor) and factor >= 0):
            raise ValueError(f"FusedTables: lr scale must be a finite number >= 0, got {factor!r}")
        self.lr_scale = float(factor)

    def advance(self, group: int, tables: Sequence[int]) -> torch.Tensor:
        """Counts one step for the group's `tables` (indices); -> lrs [T_g] float64, each table's lr for it
        (the rule's lr for that step times `lr_scale`)."""
        g = self.groups[group]
        lrs = torch.zeros(len(g.tables), dtype=torch.float64)
        for i in tables:
            name = g.tables[i]
            self.steps[name] += 1
            lrs[i] = g.rule.step_lr(self.steps[name]) * self.lr_scale
        return lrs

    # -- devices ---------------------------------------------------------------------------------
    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Applies a Module._apply function (a device move) to every buffer, keeping the dtypes."""
        for g in self.groups:
            if self.tiers and fn(g.weight[:0]).device.type != "cpu":
                raise ValueError(f"disk-tier tables {sorted(self.tiers)} stay on the CPU")
            g.weight = fn(g.weight).to(g.weight.dtype)
            g.state = fn(g.state).to(torch.float32)

    @property
    def device(self) -> torch.device:
        return self.groups[0].weight.device if self.groups else torch.device("cpu")


def sparse_tables(model: nn.Module) -> list[FusedTables]:
    """The fused tables of every hugerec embedding module inside `model` (EmbeddingCollection, the drop-in
    layers, the local shards of a ShardedEmbeddingCollection), each once, in module order: what a
    learning-rate schedule scales besides the dense optimizer."""
    found: dict[int, FusedTables] = {}
    for m in model.modules():  # by their public `fused_tables` (this module sits below the classes that have one)
        fused = getattr(m, "fused_tables", None)
        if isinstance(fused, FusedTables):
            found.setdefault(id(fused), fused)
    return list(found.values())


def _init(c: TableConfig, fresh: torch.Tensor) -> None:
    match c.init:
        case Uniform():
            fresh.uniform_(*c.init_bounds)
        case Normal():
            fresh.normal_(c.init.mean, c.init.std)
        case Zeros():
            fresh.zero_()


def _resident_rows(t: TableConfig, record_bytes: int, device: torch.device | str | None) -> int:
    """Rows table t holds in its group's buffers: num_rows, or the cache slots of a disk table."""
    if t.storage is Storage.MEMORY:
        return t.num_rows
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"table {t.name!r}: storage 'disk' needs the CPU, got device {device!r}")
    if t.cache_rows is not None:
        return t.cache_rows
    assert t.cache_bytes is not None  # TableConfig checks one of the two is set
    rows = t.cache_bytes // record_bytes
    if rows < 1:
        raise ValueError(f"table {t.name!r}: cache_bytes = {t.cache_bytes} holds no row of {record_bytes} bytes")
    if rows > t.num_rows:
        raise ValueError(
            f"table {t.name!r}: cache_bytes = {t.cache_bytes} is larger than the table "
            f"({t.num_rows} rows x {record_bytes} bytes = {t.num_rows * record_bytes})"
        )
    return rows


def _scatter_rows(view: torch.Tensor, rows: torch.Tensor, fresh: torch.Tensor) -> None:
    """view[rows] = fresh, rows [n] int64 in range. On the CPU through NumPy's fancy assignment (2-byte
    storage as its bit pattern): torch's advanced-index setitem into a strided view is about
    two orders of magnitude slower."""
    if view.device.type != "cpu":
        view[rows] = fresh
        return
    if view.element_size() == 2:  # bf16 / fp16: NumPy has no bf16; copy the bits
        view, fresh = view.view(torch.int16), fresh.view(torch.int16)
    view.numpy()[rows.numpy()] = fresh.numpy()


def _fill_rows(view: torch.Tensor, rows: torch.Tensor, value: float) -> None:
    """view[rows] = value (fp32 state columns); on the CPU through NumPy, much faster than torch's
    index_fill_ on a column block."""
    if view.device.type != "cpu":
        view[rows] = value
        return
    view.numpy()[rows.numpy()] = value
