"""Which rank serves which ids: the routes of a plan and the id bucketing both sides of the all_to_all agree on.

A *route* is one feature of one table shard. Rank d serves the routes `serve[d]`, in the same order
on every rank (tables in plan order, then features, data-parallel tables excluded). Rank r sends
rank d, for its B_r examples, one int64 buffer

    [lengths of route 0 (B_r), lengths of route 1 (B_r), ..., ids of route 0, ids of route 1, ...]

(and per-id weights in a float buffer of the ids' length when the batch has them). Routes of
table-wise and column-wise tables carry every id of the feature; routes of row-wise tables carry
the ids in the shard's range, shifted to shard-local rows (static tables), or the keys with
hash(key) % k == shard index (dynamic tables, keys unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hugerec.distributed.sharding_plan import Shard, ShardingKind, ShardingPlan, row_bounds
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import lengths_to_offsets

# splitmix64's multiplier: spreads consecutive keys over the shards (int64 products wrap around)
_HASH_MULTIPLIER = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64


def key_shard(keys: torch.Tensor, num_shards: int) -> torch.Tensor:
    """[N] int64 raw keys -> [N] shard index in [0, num_shards) of a dynamic row-wise table."""
    mixed = keys * _HASH_MULTIPLIER
    mixed = mixed ^ (mixed >> 31)
    return torch.remainder(mixed, num_shards)


@dataclass(frozen=True)
class Route:
    """One feature of one shard: served by shard.rank for every rank."""

    feature: str
    table: TableConfig
    kind: ShardingKind
    shard: Shard
    num_shards: int

    @property
    def sequence(self) -> bool:
        return self.table.pooling is Pooling.NONE


class Routing:
    """The routes of `plan`'s pooled (or, with sequence=True, Pooling.NONE) tables, grouped by serving rank.

    Data-parallel tables have no routes: every rank looks them up itself.
    """

    def __init__(self, plan: ShardingPlan, sequence: bool = False) -> None:
        self.world_size = plan.world_size
        self.serve: list[list[Route]] = [[] for _ in range(plan.world_size)]
        self.by_feature: dict[str, list[Route]] = {}  # shards of the feature's table, in shard order
        for t in plan.tables:
            p = plan.placements[t.name]
            if p.kind is ShardingKind.DATA_PARALLEL or (t.pooling is Pooling.NONE) != sequence:
                continue
            shards = plan.shards(t.name)
            for f in t.features:
                routes = [Route(f, t, p.kind, s, len(shards)) for s in shards]
                self.by_feature[f] = routes
                for r in routes:
                    self.serve[r.shard.rank].append(r)

    @property
    def features(self) -> list[str]:
        return list(self.by_feature)


@dataclass(frozen=True)
class Bucketed:
    """One rank's batch cut into per-destination buffers (see the module docstring).

    ids [sum over d of send[d]] int64, weights [ids of all routes] fp32 or None,
    send[d] entries of `ids` for rank d, send_values[d] ids (and weights) among them,
    route_ids[d][e] ids of route e of rank d's routes,
    order[f] for row-wise sequence features: the permutation that sorted the feature's ids by shard
    (their vectors come back in that order and are put back with it).
    """

    ids: torch.Tensor
    weights: torch.Tensor | None
    send: list[int]
    send_values: list[int]
    route_ids: list[list[int]]
    order: dict[str, torch.Tensor]


def _check_ids(route: Route, ids: torch.Tensor) -> None:
    """Static tables: ids must be rows; a bad id raises here, before anything is sent."""
    t = route.table
    if t.dynamic is not None or ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= t.num_rows:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"feature {route.feature!r} of table {t.name!r}: id {bad} is outside the table's rows [0, {t.num_rows})"
        )


def bucketize(features: SparseFeatures, routing: Routing) -> Bucketed:
    """Cut `features` (B examples) into the per-destination buffers of `routing`."""
    b = features.batch_size
    missing = [f for f in routing.features if f not in features.keys]
    if missing:
        raise ValueError(f"sharded embedding lookup: batch lacks features {missing}; it has {list(features.keys)}")
    ranges = features.value_ranges()
    index = {k: i for i, k in enumerate(features.keys)}
    lengths_all = features.lengths.to(torch.int64)
    # per feature and shard: (lengths [B], ids [n], weights [n] | None)
    parts: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
    order: dict[str, torch.Tensor] = {}
    for f, routes in routing.by_feature.items():
        start, end = ranges[f]
        ids = features.values[start:end]
        w = None if features.weights is None else features.weights[start:end]
        lengths = lengths_all[index[f] * b : (index[f] + 1) * b]
        _check_ids(routes[0], ids)
        first = routes[0]
        if first.kind is not ShardingKind.ROW_WISE or first.num_shards == 1:
            for r in routes:
                parts[f, r.shard.index] = (lengths, ids, w)
            continue
        k = first.num_shards
        if first.table.dynamic is not None:
            shard = key_shard(ids, k)
            local = ids
        else:
            bounds = torch.tensor(row_bounds(first.table.num_rows, k), dtype=torch.int64, device=ids.device)
            shard = torch.bucketize(ids, bounds[1:], right=True)  # [n] shard of each id
            local = ids - bounds[shard]
        bag = torch.repeat_interleave(torch.arange(b, device=ids.device), lengths)  # [n] example of each id
        counts = torch.bincount(shard * b + bag, minlength=k * b).view(k, b)  # [k, B] ids per shard and bag
        perm = torch.sort(shard, stable=True).indices  # ids grouped by shard, bag order kept inside
        per_shard = counts.sum(dim=1).tolist()
        local_sorted = local[perm].split(per_shard)
        w_sorted = None if w is None else w[perm].split(per_shard)
        for r in routes:
            i = r.shard.index
            parts[f, i] = (counts[i], local_sorted[i], None if w_sorted is None else w_sorted[i])
        if first.sequence:
            order[f] = perm
    id_chunks: list[torch.Tensor] = []
    w_chunks: list[torch.Tensor] = []
    send, send_values, route_ids = [], [], []
    for routes in routing.serve:
        ps = [parts[r.feature, r.shard.index] for r in routes]
        chunk = [p[0] for p in ps] + [p[1] for p in ps]
        id_chunks.extend(chunk)
        if features.weights is not None:
            w_chunks.extend(p[2] for p in ps if p[2] is not None)
        route_ids.append([int(p[1].numel()) for p in ps])
        n = sum(route_ids[-1])
        send.append(len(ps) * b + n)
        send_values.append(n)
    device = features.values.device
    ids_out = torch.cat(id_chunks) if id_chunks else torch.zeros(0, dtype=torch.int64, device=device)
    weights = None
    if features.weights is not None:
        weights = torch.cat(w_chunks) if w_chunks else torch.zeros(0, dtype=torch.float32, device=device)
    return Bucketed(ids_out, weights, send, send_values, route_ids, order)


def regroup(values: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Segments laid out source-major -> route-major.

    values [sum(sizes), ...] holds segments (s, e) in the order s = 0.., e = 0.. with sizes [S, E];
    returns the same segments in the order e = 0.., s = 0.. (a gather, no Python loop over segments).
    """
    s, e = sizes.shape
    if s == 0 or e == 0 or values.shape[0] == 0:
        return values
    sizes = sizes.to(values.device)
    flat = sizes.reshape(-1)
    src_start = lengths_to_offsets(flat)[:-1].view(s, e)  # [S, E] where each segment starts in `values`
    sizes_t = sizes.t().reshape(-1)  # [E*S] route-major
    dst_start = lengths_to_offsets(sizes_t)[:-1]
    shift = torch.repeat_interleave(src_start.t().reshape(-1) - dst_start, sizes_t)  # [N]
    return values[torch.arange(values.shape[0], device=values.device) + shift]


def receive(
    ids: torch.Tensor,
    weights: torch.Tensor | None,
    batch_sizes: Sequence[int],
    values_from: Sequence[int],
    routes: Sequence[Route],
) -> tuple[SparseFeatures, torch.Tensor]:
    """The buffers rank d received (from ranks 0..W-1, in order) -> one SparseFeatures over all their examples.

    batch_sizes[s] examples and values_from[s] ids came from rank s. The result has the routes'
    features as keys and sum(batch_sizes) examples: rank 0's first, then rank 1's, ...
    Also returns id_sizes [S, E]: ids per source and route (to send sequence vectors back).
    """
    e = len(routes)
    keys = tuple(r.feature for r in routes)
    if e == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=ids.device)
        return SparseFeatures((), empty, empty.to(torch.int32)), torch.zeros(len(batch_sizes), 0, dtype=torch.int64)
    lengths_parts, value_parts = [], []
    start = 0
    for bs, n in zip(batch_sizes, values_from, strict=True):
        lengths_parts.append(ids[start : start + e * bs].view(e, bs))  # [E, B_s]
        value_parts.append(ids[start + e * bs : start + e * bs + n])
        start += e * bs + n
    lengths = torch.cat(lengths_parts, dim=1)  # [E, sum B]
    id_sizes = torch.stack([p.sum(dim=1) for p in lengths_parts])  # [S, E]
    values = regroup(torch.cat(value_parts), id_sizes)
    w = None if weights is None else regroup(weights, id_sizes)
    return SparseFeatures(keys, values, lengths.reshape(-1).to(torch.int32), w), id_sizes
