"""ShardingPlan: where every table's rows live on W ranks. Plain data, validated, JSON round-trip.

    kind              ranks        rank r holds
    DATA_PARALLEL     all W        the whole table (a replica; every replica applies the same update)
    TABLE_WISE        (r,)         the whole table
    ROW_WISE          (r0, r1..)   rows [bounds[i], bounds[i+1]) of a static table; for a dynamic
                                   table the keys with hash(key) % k == i (capacity ceil(R / k))
    COLUMN_WISE       (r0, r1..)   columns [i*D/k, (i+1)*D/k) of every row

ROW_WISE over a subset of the ranks is table-wise-row-wise (a table spread over one node's ranks).
A COLUMN_WISE table with RowWiseAdagrad keeps one accumulator per row *per column shard* (each shard
averages g^2 over its own columns), as FBGEMM and TorchRec do; every other optimizer is exact.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hugerec.embedding.optimizers import Adam, Optimizer, optimizer_from_dict, optimizer_to_dict, state_width
from hugerec.embedding.table_config import Missing, TableConfig

# Per-row bookkeeping of a dynamic table beside the row itself (int64 key, slot index, step/count).
DYNAMIC_ROW_OVERHEAD_BYTES = 24


class ShardingKind(enum.Enum):
    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"


@dataclass(frozen=True)
class TablePlacement:
    """One table's kind and the ranks holding its shards (shard i lives on ranks[i])."""

    kind: ShardingKind
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.kind, str):
            object.__setattr__(self, "kind", ShardingKind(self.kind))
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        if not self.ranks:
            raise ValueError(f"TablePlacement: {self.kind.value} needs at least one rank, got none")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"TablePlacement: ranks must be distinct, got {list(self.ranks)}")
        if self.kind is ShardingKind.TABLE_WISE and len(self.ranks) != 1:
            raise ValueError(f"TablePlacement: table_wise takes exactly one rank, got {list(self.ranks)}")

    @staticmethod
    def data_parallel(world_size: int) -> TablePlacement:
        return TablePlacement(ShardingKind.DATA_PARALLEL, tuple(range(world_size)))

    @staticmethod
    def table_wise(rank: int) -> TablePlacement:
        return TablePlacement(ShardingKind.TABLE_WISE, (rank,))

    @staticmethod
    def row_wise(ranks: Sequence[int]) -> TablePlacement:
        return TablePlacement(ShardingKind.ROW_WISE, tuple(ranks))

    @staticmethod
    def column_wise(ranks: Sequence[int]) -> TablePlacement:
        return TablePlacement(ShardingKind.COLUMN_WISE, tuple(ranks))

    @property
    def num_shards(self) -> int:
        return 1 if self.kind is ShardingKind.DATA_PARALLEL else len(self.ranks)


@dataclass(frozen=True)
class Shard:
    """What one rank stores of one table: rows [row_start, row_start + num_rows), columns
    [col_start, col_start + dim). For a dynamic row-wise table num_rows is the shard's capacity."""

    table: str
    rank: int
    index: int  # position among the table's shards
    row_start: int
    num_rows: int
    col_start: int
    dim: int


def row_bounds(num_rows: int, num_shards: int) -> list[int]:
    """Balanced row ranges: shard i holds [bounds[i], bounds[i+1]); sizes differ by at most one."""
    return [i * num_rows // num_shards for i in range(num_shards + 1)]


def table_shards(table: TableConfig, placement: TablePlacement) -> list[Shard]:
    """The shards of one table, in shard order."""
    match placement.kind:
        case ShardingKind.DATA_PARALLEL | ShardingKind.TABLE_WISE:
            return [Shard(table.name, r, 0, 0, table.num_rows, 0, table.dim) for r in placement.ranks]
        case ShardingKind.ROW_WISE:
            k = len(placement.ranks)
            if table.dynamic is not None:
                cap = math.ceil(table.num_rows / k)
                return [Shard(table.name, r, i, 0, cap, 0, table.dim) for i, r in enumerate(placement.ranks)]
            b = row_bounds(table.num_rows, k)
            return [Shard(table.name, r, i, b[i], b[i + 1] - b[i], 0, table.dim) for i, r in enumerate(placement.ranks)]
        case ShardingKind.COLUMN_WISE:
            d = table.dim // len(placement.ranks)
            return [Shard(table.name, r, i, 0, table.num_rows, i * d, d) for i, r in enumerate(placement.ranks)]


def shard_bytes(table: TableConfig, shard: Shard, optimizer: Optimizer | None) -> int:
    """Memory of one shard: rows in their storage dtype + fp32 optimizer state (+ dynamic bookkeeping).

    `optimizer` is the collection's default, used when the table names none; with neither, the
    largest state (Adam's 2 * D per row) is assumed so that the estimate never undershoots.
    """
    opt = table.optimizer or optimizer or Adam()
    per_row = shard.dim * table.dtype.itemsize + 4 * state_width(opt, shard.dim)
    if table.dynamic is not None:
        per_row += DYNAMIC_ROW_OVERHEAD_BYTES
    return shard.num_rows * per_row


def format_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


@dataclass(frozen=True)
class ShardingPlan:
    """Placements of `tables` on `world_size` ranks, checked when built.

    tables          the TableConfigs of the collection being sharded (their order is kept)
    placements      table name -> TablePlacement
    optimizer       the collection's default optimizer (for state memory of tables without one)
    memory_per_rank bytes one rank may hold; None skips the memory check
    notes           the planner's reasons, one line each (empty for hand-written plans)
    """

    tables: tuple[TableConfig, ...]
    placements: Mapping[str, TablePlacement]
    world_size: int
    optimizer: Optimizer | None = None
    memory_per_rank: int | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "placements", MappingProxyType(dict(self.placements)))
        object.__setattr__(self, "notes", tuple(self.notes))
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"ShardingPlan: world_size must be a positive int, got {self.world_size!r}")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"ShardingPlan: duplicate table names {sorted({n for n in names if names.count(n) > 1})}")
        missing = [n for n in names if n not in self.placements]
        extra = sorted(set(self.placements) - set(names))
        if missing or extra:
            raise ValueError(
                f"ShardingPlan: tables without a placement {missing}, placements of unknown tables {extra}"
            )
        for t in self.tables:
            self._check_placement(t, self.placements[t.name])
        if self.memory_per_rank is not None:
            used = self.bytes_per_rank()
            over = {r: b for r, b in enumerate(used) if b > self.memory_per_rank}
            if over:
                detail = ", ".join(f"rank {r}: {format_bytes(b)}" for r, b in over.items())
                raise ValueError(
                    f"ShardingPlan: exceeds memory_per_rank={format_bytes(self.memory_per_rank)} on {detail}\n{self}"
                )

    def _check_placement(self, t: TableConfig, p: TablePlacement) -> None:
        bad = [r for r in p.ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(
                f"ShardingPlan: table {t.name!r} placed on rank(s) {bad}, but world_size={self.world_size} "
                f"has ranks 0..{self.world_size - 1}"
            )
        match p.kind:
            case ShardingKind.DATA_PARALLEL:
                if t.dynamic is not None:
                    raise ValueError(
                        f"ShardingPlan: dynamic table {t.name!r} cannot be data-parallel (each replica would admit "
                        f"and evict different keys); use row_wise (sharded by key hash) or table_wise"
                    )
                if sorted(p.ranks) != list(range(self.world_size)):
                    raise ValueError(
                        f"ShardingPlan: data-parallel table {t.name!r} must be replicated on all {self.world_size} "
                        f"ranks, got {list(p.ranks)}"
                    )
            case ShardingKind.TABLE_WISE:
                pass
            case ShardingKind.ROW_WISE:
                if t.dynamic is not None and t.dynamic.missing is Missing.UNKNOWN_ROW and len(p.ranks) > 1:
                    raise ValueError(
                        f"ShardingPlan: row-wise dynamic table {t.name!r} has missing=unknown_row: every shard would "
                        f"train its own unknown row; use table_wise or column_wise, or missing=zeros"
                    )
                if t.dynamic is None and t.num_rows < len(p.ranks):
                    raise ValueError(
                        f"ShardingPlan: table {t.name!r} has {t.num_rows} rows, too few for {len(p.ranks)} row shards"
                    )
            case ShardingKind.COLUMN_WISE:
                if t.dim % len(p.ranks):
                    raise ValueError(
                        f"ShardingPlan: column-wise split of table {t.name!r} into {len(p.ranks)} shards does not "
                        f"divide its dim {t.dim}; use a number of ranks dividing {t.dim}"
                    )

    # -- queries --------------------------------------------------------------------------------
    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"ShardingPlan: unknown table {name!r}; have {[t.name for t in self.tables]}")

    def shards(self, name: str) -> list[Shard]:
        return table_shards(self.table(name), self.placements[name])

    def shards_on(self, rank: int) -> list[Shard]:
        """Every shard held by `rank`, in table order."""
        return [s for t in self.tables for s in self.shards(t.name) if s.rank == rank]

    def bytes_per_rank(self) -> list[int]:
        out = [0] * self.world_size
        for t in self.tables:
            for s in self.shards(t.name):
                out[s.rank] += shard_bytes(t, s, self.optimizer)
        return out

    # -- JSON -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "tables": [t.to_dict() for t in self.tables],
            "placements": {n: {"kind": p.kind.value, "ranks": list(p.ranks)} for n, p in self.placements.items()},
            "optimizer": None if self.optimizer is None else optimizer_to_dict(self.optimizer),
            "memory_per_rank": self.memory_per_rank,
            "notes": list(self.notes),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> ShardingPlan:
        unknown = set(d) - {"world_size", "tables", "placements", "optimizer", "memory_per_rank", "notes"}
        if unknown:
            raise ValueError(f"ShardingPlan.from_dict: unknown keys {sorted(unknown)}")
        opt = d.get("optimizer")
        return ShardingPlan(
            tables=tuple(TableConfig.from_dict(t) for t in d["tables"]),
            placements={
                n: TablePlacement(ShardingKind(p["kind"]), tuple(p["ranks"])) for n, p in d["placements"].items()
            },
            world_size=d["world_size"],
            optimizer=None if opt is None else optimizer_from_dict(opt),
            memory_per_rank=d.get("memory_per_rank"),
            notes=tuple(d.get("notes", ())),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_json(s: str) -> ShardingPlan:
        return ShardingPlan.from_dict(json.loads(s))

    # -- printing -------------------------------------------------------------------------------
    def __str__(self) -> str:
        rows = [("table", "kind", "ranks", "bytes per rank")]
        for t in self.tables:
            p = self.placements[t.name]
            per = ", ".join(f"{s.rank}: {format_bytes(shard_bytes(t, s, self.optimizer))}" for s in self.shards(t.name))
            rows.append((t.name, p.kind.value, ",".join(map(str, p.ranks)), per))
        total = ", ".join(f"{r}: {format_bytes(b)}" for r, b in enumerate(self.bytes_per_rank()))
        rows.append(("(total)", "", "", total))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        if self.memory_per_rank is not None:
            lines.append(f"memory per rank: {format_bytes(self.memory_per_rank)}")
        lines.extend(self.notes)
        return "\n".join(lines)
