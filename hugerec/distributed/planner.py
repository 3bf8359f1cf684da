"""plan(): place tables on ranks with a cost model of memory, all_to_all volume and lookup work.

Cost of one training step on rank r (forward + backward), with B examples per rank and L_f
expected ids per example of feature f (uniform ids assumed when splitting rows):

    bytes sent   ids to the owners (8 B per bag length and per id, 4 B per weight), pooled
                 vectors back (B * D_shard * 4 per served feature, or one vector per id for
                 sequence features; row-wise MEAN features add one count per bag), the same volume again as gradients, 24 B of counts per peer
                 (once for the pooled lookup, once for the sequence lookup);
                 data-parallel tables send their touched rows' ids and gradients to every peer
                 (U * (8 + 4 D), U = expected distinct rows of the rank's batch)
    lookup work  bytes of rows read: ids served * (D_shard * 4 + 64 of index overhead)
    time         bytes sent / comm_bytes_per_s + lookup work / lookup_bytes_per_s

Greedy: tables in decreasing size; each takes the candidate placement (data-parallel, table-wise
on each rank, row-wise over all ranks, column-wise over the ranks dividing its dim) that fits in
memory and gives the lowest estimated time of the slowest rank (ties: the least total bytes).
`estimate_bytes_sent` mirrors the wire format of ShardedEmbeddingCollection byte for byte.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hugerec.distributed.sharding_plan import (
    ShardingKind,
    ShardingPlan,
    TablePlacement,
    format_bytes,
    shard_bytes,
    table_shards,
)
from hugerec.embedding.optimizers import Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import Pooling, TableConfig

# Wire format constants (see hugerec.distributed.sharded).
ID_BYTES = 8  # ids and bag lengths travel as int64
WEIGHT_BYTES = 4
VALUE_BYTES = 4  # pooled vectors and their gradients travel as fp32
COUNTS_BYTES = 3 * 8  # (batch size, ids, has weights) to every peer, once per step
DP_COUNTS_BYTES = 8  # distinct rows per data-parallel table, to every peer
# Work of one lookup beyond its row's bytes: a cache line of index and bookkeeping. It is what makes
# a column-wise split (every shard looks up every id) cost more than its narrower rows suggest.
LOOKUP_OVERHEAD_BYTES = 64


@dataclass(frozen=True)
class Constraint:
    """A user's pin: a kind, ranks, or both. ranks with kind None restricts every candidate to them."""

    kind: ShardingKind | None = None
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.kind, str):
            object.__setattr__(self, "kind", ShardingKind(self.kind))
        if self.ranks is not None:
            object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
            if not self.ranks:
                raise ValueError("Constraint: ranks, when given, must not be empty")


@dataclass(frozen=True)
class CostModel:
    """Throughputs turning bytes into seconds (defaults: loopback gloo, one CPU core gathering rows)."""

    comm_bytes_per_s: float = 1e9
    lookup_bytes_per_s: float = 4e9

    def __post_init__(self) -> None:
        if not (self.comm_bytes_per_s > 0 and self.lookup_bytes_per_s > 0):
            raise ValueError(f"CostModel: throughputs must be > 0, got {self}")


@dataclass(frozen=True)
class Workload:
    """What each rank feeds per step: `batch_size` examples with `ids_per_sample[feature]` expected ids
    each (a number applies to every feature; features not named get 1), with per-id weights or not."""

    batch_size: int = 512
    ids_per_sample: Mapping[str, float] | float = 1.0
    weighted: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"Workload: batch_size must be >= 1, got {self.batch_size}")
        per = self.ids_per_sample.values() if isinstance(self.ids_per_sample, Mapping) else [self.ids_per_sample]
        if any(not v >= 0 for v in per):
            raise ValueError(f"Workload: ids_per_sample must be >= 0, got {self.ids_per_sample}")

    def ids(self, feature: str) -> float:
        """Expected ids of `feature` per rank and step."""
        if isinstance(self.ids_per_sample, Mapping):
            return self.batch_size * float(self.ids_per_sample.get(feature, 1.0))
        return self.batch_size * float(self.ids_per_sample)


@dataclass(frozen=True)
class RankCost:
    """One rank's estimated share of a step."""

    bytes_sent: float
    lookup_bytes: float
    memory: int

    def seconds(self, cost: CostModel) -> float:
        return self.bytes_sent / cost.comm_bytes_per_s + self.lookup_bytes / cost.lookup_bytes_per_s


def expected_distinct(num_rows: int, draws: float) -> float:
    """Expected distinct rows among `draws` uniform draws from `num_rows`."""
    return num_rows * -math.expm1(-draws / num_rows)


def table_costs(
    t: TableConfig, p: TablePlacement, world_size: int, load: Workload, optimizer: Optimizer | None
) -> list[RankCost]:
    """Per-rank cost of one table in one step (the per-step counts exchange not included)."""
    sent = [0.0] * world_size
    work = [0.0] * world_size
    mem = [0] * world_size
    shards = table_shards(t, p)
    for s in shards:
        mem[s.rank] += shard_bytes(t, s, optimizer)
    row_bytes = t.dim * t.dtype.itemsize + LOOKUP_OVERHEAD_BYTES
    if p.kind is ShardingKind.DATA_PARALLEL:
        ids = sum(load.ids(f) for f in t.features)
        u = expected_distinct(t.num_rows, ids)
        for r in range(world_size):
            sent[r] += (world_size - 1) * (DP_COUNTS_BYTES + u * (ID_BYTES + VALUE_BYTES * t.dim))
            work[r] += (ids + world_size * u) * row_bytes
        return [RankCost(sent[r], work[r], mem[r]) for r in range(world_size)]
    for s in shards:
        # share of a rank's ids that this shard serves: rows split by range (uniform ids) or by key hash
        if p.kind is ShardingKind.ROW_WISE:
            frac = 1.0 / len(p.ranks) if t.dynamic is not None else s.num_rows / t.num_rows
        else:
            frac = 1.0
        for f in t.features:
            n = load.ids(f) * frac
            width = s.dim + (p.kind is ShardingKind.ROW_WISE and t.pooling is Pooling.MEAN)  # + the bag's row count
            out = (n if t.pooling is Pooling.NONE else load.batch_size) * width * VALUE_BYTES
            ids_bytes = (load.batch_size + n) * ID_BYTES + (n * WEIGHT_BYTES if load.weighted else 0.0)
            for r in range(world_size):
                if r != s.rank:
                    sent[r] += ids_bytes + out  # ids to the owner, later the gradients of its vectors
                    sent[s.rank] += out  # the vectors back to r
            work[s.rank] += world_size * n * (s.dim * t.dtype.itemsize + LOOKUP_OVERHEAD_BYTES)
    return [RankCost(sent[r], work[r], mem[r]) for r in range(world_size)]


def _add(a: Sequence[RankCost], b: Sequence[RankCost]) -> list[RankCost]:
    return [
        RankCost(x.bytes_sent + y.bytes_sent, x.lookup_bytes + y.lookup_bytes, x.memory + y.memory)
        for x, y in zip(a, b, strict=True)
    ]


def estimate_costs(plan: ShardingPlan, load: Workload) -> list[RankCost]:
    """Per-rank cost of one step of the whole plan, including the counts exchange."""
    w = plan.world_size
    total = [RankCost(0.0, 0.0, 0)] * w
    for t in plan.tables:
        total = _add(total, table_costs(t, plan.placements[t.name], w, load, plan.optimizer))
    # one counts exchange per lookup path (pooled, sequence) that has sharded tables
    sharded = {
        t.pooling is Pooling.NONE for t in plan.tables if plan.placements[t.name].kind is not ShardingKind.DATA_PARALLEL
    }
    return _add(total, [RankCost(len(sharded) * COUNTS_BYTES * (w - 1), 0.0, 0)] * w)


def estimate_bytes_sent(plan: ShardingPlan, load: Workload) -> list[float]:
    """Expected bytes each rank sends to other ranks in one step (forward + backward), embeddings only."""
    return [c.bytes_sent for c in estimate_costs(plan, load)]


def _candidates(t: TableConfig, world_size: int, pin: Constraint | None, order: list[int]) -> list[TablePlacement]:
    """Placements the planner may choose for `t`; `order` lists ranks from least to most loaded."""
    allowed = [r for r in order if pin is None or pin.ranks is None or r in pin.ranks]
    kind = None if pin is None else pin.kind
    if pin is not None and pin.kind is not None and pin.ranks is not None:
        return [TablePlacement(pin.kind, pin.ranks)]
    out: list[TablePlacement] = []
    if kind in (None, ShardingKind.DATA_PARALLEL) and t.dynamic is None and len(allowed) == world_size:
        out.append(TablePlacement.data_parallel(world_size))
    if kind in (None, ShardingKind.TABLE_WISE):
        out.extend(TablePlacement.table_wise(r) for r in allowed)
    enough_rows = t.dynamic is not None or t.num_rows >= len(allowed)
    if kind in (None, ShardingKind.ROW_WISE) and len(allowed) >= (1 if kind else 2) and enough_rows:
        out.append(TablePlacement.row_wise(sorted(allowed)))
    if kind in (None, ShardingKind.COLUMN_WISE):
        for k in range(1 if kind else 2, len(allowed) + 1):
            if t.dim % k == 0:
                out.append(TablePlacement.column_wise(sorted(allowed[:k])))
    return out


def plan(
    tables: Sequence[TableConfig],
    world_size: int,
    memory_per_rank: int | None = None,
    load: Workload | None = None,
    constraints: Mapping[str, Constraint] | None = None,
    optimizer: Optimizer | None = None,
    cost: CostModel | None = None,
) -> ShardingPlan:
    """Choose a placement for every table; the returned plan's `notes` say why.

    tables          the collection's TableConfigs
    world_size      W ranks
    memory_per_rank bytes one rank may use for its shards (weights + optimizer state); None: unbounded
    load            examples per rank per step and expected ids per example (default Workload())
    constraints     table name -> Constraint pinning its kind and/or ranks
    optimizer       the collection's default optimizer (state memory of tables without their own)
    cost            throughputs of the time model (default CostModel())

    Raises ValueError naming the table when a constraint is invalid or a table fits nowhere.
    """
    if world_size < 1:
        raise ValueError(f"plan: world_size must be >= 1, got {world_size}")
    load = load or Workload()
    cost = cost or CostModel()
    constraints = dict(constraints or {})
    names = {t.name for t in tables}
    unknown = sorted(set(constraints) - names)
    if unknown:
        raise ValueError(f"plan: constraints for unknown tables {unknown}; tables are {sorted(names)}")
    for name, c in constraints.items():
        bad = [r for r in c.ranks or () if not 0 <= r < world_size]
        if bad:
            raise ValueError(f"plan: constraint of table {name!r} names rank(s) {bad}, world_size={world_size}")
    per_rank = [RankCost(0.0, 0.0, 0)] * world_size
    chosen: dict[str, TablePlacement] = {}
    notes: list[str] = []

    def score(costs: Sequence[RankCost]) -> tuple[float, int, float]:
        """Slowest rank's time, then the fullest rank's memory, then the total time."""
        times = [c.seconds(cost) for c in costs]
        return max(times), max(c.memory for c in costs), sum(times)

    # Biggest tables first: they have the fewest places to go.
    for t in sorted(tables, key=lambda t: -shard_bytes(t, table_shards(t, TablePlacement.table_wise(0))[0], optimizer)):
        pin = constraints.get(t.name)
        order = sorted(range(world_size), key=lambda r: (per_rank[r].seconds(cost), per_rank[r].memory, r))
        cands = _candidates(t, world_size, pin, order)
        scored = []
        for cand in cands:
            after = _add(per_rank, table_costs(t, cand, world_size, load, optimizer))
            fits = memory_per_rank is None or all(c.memory <= memory_per_rank for c in after)
            scored.append((score(after), cand, after, fits))
        feasible = [s for s in scored if s[3]]
        if pin is None and isinstance(t.optimizer or optimizer, RowWiseAdagrad):
            # Column shards would each keep their own row-wise accumulator: only when nothing else fits.
            exact = [s for s in feasible if s[1].kind is not ShardingKind.COLUMN_WISE]
            feasible = exact or feasible
        feasible.sort(key=lambda s: s[0])
        if not feasible:
            raise ValueError(_no_fit_message(t, pin, scored, per_rank, memory_per_rank, optimizer))
        (best_time, _, _), best, after, _ = feasible[0]
        per_rank = after
        chosen[t.name] = best
        if pin is not None:
            why = f"pinned ({_describe_pin(pin)})"
        elif len(feasible) == 1:
            why = "the only placement that fits in memory"
        else:
            (second_time, _, _), second, _, _ = feasible[1]
            why = (
                f"slowest rank {best_time * 1e3:.3f} ms/step vs {second_time * 1e3:.3f} ms as "
                f"{second.kind.value} on {_ranks(second)}"
            )
        notes.append(f"{t.name}: {best.kind.value} on {_ranks(best)}: {why}")
    sent = [format_bytes(c.bytes_sent) for c in per_rank]
    notes.append(
        f"estimated per step at batch {load.batch_size}/rank: sent per rank [{', '.join(sent)}] (before the counts exchange)"
    )
    return ShardingPlan(
        tables=tuple(tables),
        placements={t.name: chosen[t.name] for t in tables},
        world_size=world_size,
        optimizer=optimizer,
        memory_per_rank=memory_per_rank,
        notes=tuple(notes),
    )


def _ranks(p: TablePlacement) -> str:
    return "ranks " + ",".join(map(str, p.ranks)) if len(p.ranks) > 1 else f"rank {p.ranks[0]}"


def _describe_pin(c: Constraint) -> str:
    parts = ([c.kind.value] if c.kind else []) + ([f"ranks {list(c.ranks)}"] if c.ranks else [])
    return ", ".join(parts)


def _no_fit_message(
    t: TableConfig,
    pin: Constraint | None,
    scored: list[tuple[tuple[float, int, float], TablePlacement, list[RankCost], bool]],
    per_rank: list[RankCost],
    memory_per_rank: int | None,
    optimizer: Optimizer | None,
) -> str:
    whole = shard_bytes(t, table_shards(t, TablePlacement.table_wise(0))[0], optimizer)
    used = ", ".join(f"{r}: {format_bytes(c.memory)}" for r, c in enumerate(per_rank))
    head = (
        f"plan: table {t.name!r} ({t.num_rows} rows x {t.dim}, {format_bytes(whole)} with optimizer state) fits nowhere"
    )
    if not scored:
        return f"{head}: no placement satisfies its constraint ({_describe_pin(pin) if pin else 'none'})"
    tried = "; ".join(
        f"{cand.kind.value} on {_ranks(cand)} needs up to {format_bytes(max(a.memory for a in after))}"
        for _, cand, after, _ in scored[:6]
    )
    limit = "unbounded" if memory_per_rank is None else format_bytes(memory_per_rank)
    return f"{head}: memory_per_rank={limit}, already used per rank [{used}]; tried {tried}"
