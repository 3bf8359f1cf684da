"""ShardedEmbeddingCollection: an EmbeddingCollection whose tables live on W ranks as a ShardingPlan says.

Same interface as the collection it replaces (`forward` -> PooledEmbeddings, `sequences`, the
feature properties), and the same training semantics: every table's rows get one fused-optimizer
step per backward, with the gradient of the whole global batch (all ranks' examples) averaged over
the ranks as DistributedDataParallel averages the dense gradients: W ranks, each with the mean loss
of its B examples, take the step one process takes on the W * B examples with their mean loss.

One pooled lookup on rank r (B_r examples), sharded tables:
    1. counts all_to_all       [B_r, ids for d, has weights] to every d
    2. ids all_to_all          per d: the lengths and ids of the routes d serves (`routing`)
    3. d looks up its shards   on sum_s B_s examples: rank 0's, then rank 1's, ...; row-wise MEAN
                               tables pool by SUM on the shards, which add each bag's count of ids
                               with a row; r divides the summed vectors by the summed counts
    4. vectors all_to_all      rows of s back to s, [B_s, C_d] flattened   (autograd: gradients go
                               back the same way in backward, and d's fused optimizer applies them)
    5. r assembles             table-wise: d's block; column-wise: concatenated; row-wise: summed
Dynamic tables: keys travel raw; a row-wise table's shard i holds the keys with hash(key) % k == i
in a hash table of capacity ceil(R / k) (eviction and admission act per shard). A new key starts from
its row's initial values, and rows are handed out per shard: a row-wise dynamic table follows one
process exactly when its init does not depend on the row (Zeros), table- and column-wise ones always.
Data-parallel tables: see `hugerec.distributed.replicated`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from hugerec.distributed.comm import CommStats, Pending, all_to_all, all_to_all_autograd
from hugerec.distributed.replicated import ReplicatedTables
from hugerec.distributed.routing import Bucketed, Route, Routing, bucketize, key_shard, receive, regroup
from hugerec.distributed.sharding_plan import Shard, ShardingKind, ShardingPlan
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.hash_table import HashTableContents
from hugerec.embedding.interface import EmbeddingModule
from hugerec.embedding.optimizers import Optimizer
from hugerec.embedding.table_config import Pooling, TableConfig, Uniform
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor
from hugerec.sparse.pooled import PooledEmbeddings


def shard_config(t: TableConfig, s: Shard, kind: ShardingKind, optimizer: Optimizer) -> TableConfig:
    """The TableConfig of one shard: its rows and columns, the global table's initial range, and SUM in
    place of MEAN for row-wise shards (they see parts of bags; the requesting rank divides)."""
    init = t.init
    if isinstance(init, Uniform):
        init = Uniform(*t.init_bounds)  # the default bound depends on num_rows: keep the global table's
    pooling = Pooling.SUM if kind is ShardingKind.ROW_WISE and t.pooling is Pooling.MEAN else t.pooling
    return dataclasses.replace(
        t, num_rows=s.num_rows, dim=s.dim, init=init, pooling=pooling, optimizer=t.optimizer or optimizer
    )


def shard_state(
    state: Mapping[str, torch.Tensor], t: TableConfig, s: Shard, kind: ShardingKind
) -> dict[str, torch.Tensor]:
    """One static table's per-table state (weight [R, D], optimizer state [R, D] / [R], step) cut to shard s."""
    out = {}
    rows = slice(s.row_start, s.row_start + s.num_rows)
    for name, v in state.items():
        if v.dim() == 0:
            out[name] = v.clone()
        elif v.dim() == 2 and kind is ShardingKind.COLUMN_WISE and v.shape[1] == t.dim:
            out[name] = v[rows, s.col_start : s.col_start + s.dim].clone()
        else:
            out[name] = v[rows].clone()
    return out


def table_state(collection: EmbeddingCollection, table: str) -> dict[str, torch.Tensor]:
    """{"weight": [R, D], <state name>: [R, D] or [R], "step": scalar (Adam)} of one table (views; a
    dynamic table's hash-table entries are left out)."""
    prefix = f"tables.{table}."
    return {
        k[len(prefix) :]: v
        for k, v in collection.state_dict(keep_vars=True).items()
        if k.startswith(prefix) and not k.startswith(prefix + "hash_table.")
    }


def _load_table(collection: EmbeddingCollection, table: str, fields: Mapping[str, torch.Tensor]) -> None:
    """Load some per-table fields of one table (the collection's other tables are left as they are)."""
    result = collection.load_state_dict({f"tables.{table}.{k}": v for k, v in fields.items()}, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"table {table!r}: unknown fields {result.unexpected_keys}")


def cut_columns(
    weights: torch.Tensor, state: Mapping[str, torch.Tensor], t: TableConfig, s: Shard, kind: ShardingKind
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Rows read from the whole table -> the columns of shard s (column-wise), else unchanged."""
    if kind is not ShardingKind.COLUMN_WISE:
        return weights, dict(state)
    cols = slice(s.col_start, s.col_start + s.dim)
    return weights[:, cols], {k: v[:, cols] if v.dim() == 2 and v.shape[1] == t.dim else v for k, v in state.items()}


@dataclass(frozen=True)
class Placed:
    """A table (or one shard of it) held by this rank, and the local collection that holds it."""

    table: TableConfig  # the global table, its optimizer resolved
    shard: Shard
    kind: ShardingKind
    local: EmbeddingCollection
    num_shards: int = 1


@dataclass
class _IdExchange:
    """An ids all_to_all in flight (started by `forward` or ahead of it by `prefetch`)."""

    features: SparseFeatures
    bucketed: Bucketed
    batch_sizes: list[int]  # examples of every source rank
    values_from: list[int]  # ids every source rank sends here
    ids: Pending
    weights: Pending | None


def _same_ids(a: SparseFeatures, b: SparseFeatures, keys: list[str]) -> bool:
    """Whether two batches carry the same ids (and weights) for `keys`."""
    if a is b:
        return True
    if a.batch_size != b.batch_size or (a.weights is None) != (b.weights is None):
        return False
    for k in keys:
        x, y = a[k], b[k]
        if not (torch.equal(x.lengths, y.lengths) and torch.equal(x.values, y.values)):
            return False
        if x.weights is not None and y.weights is not None and not torch.equal(x.weights, y.weights):
            return False
    return True


class ShardedEmbeddingCollection(nn.Module):
    """`collection`'s tables placed on the ranks of `group` by `plan` (this rank's shards copied from it)."""

    def __init__(self, collection: EmbeddingCollection, plan: ShardingPlan, group: ProcessGroup | None = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError(
                "ShardedEmbeddingCollection: torch.distributed is not initialised (see hugerec.distributed.launch)"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if plan.world_size != self.world_size:
            raise ValueError(
                f"ShardedEmbeddingCollection: plan is for {plan.world_size} ranks, the group has {self.world_size}"
            )
        if tuple(plan.tables) != tuple(collection.tables):
            raise ValueError(
                "ShardedEmbeddingCollection: the plan's tables differ from the collection's: plan "
                f"{[t.name for t in plan.tables]}, collection {[t.name for t in collection.tables]}"
            )
        # the plan again with the collection's own optimizer: memory per rank is checked with its state
        self.plan = dataclasses.replace(plan, optimizer=collection.optimizer)
        self.source_tables = collection.tables
        self.default_optimizer = collection.optimizer
        self._feature_names = collection.feature_names
        self._feature_dims = collection.feature_dims
        self._sequence_names = collection.sequence_feature_names
        self._output_dim = collection.output_dim
        self._table_of = {f: t for t in collection.tables for f in t.features}
        self.stats = CommStats()
        self.pooled_routing = Routing(self.plan)
        self.sequence_routing = Routing(self.plan, sequence=True)
        self._pending: list[_IdExchange] = []  # prefetched pooled id exchanges, oldest first
        device = collection.device
        local: list[tuple[TableConfig, Shard, ShardingKind]] = []
        dp: list[TableConfig] = []
        for t in self.plan.tables:
            p = self.plan.placements[t.name]
            if p.kind is ShardingKind.DATA_PARALLEL:
                dp.append(dataclasses.replace(t, optimizer=t.optimizer or collection.optimizer))
                continue
            for s in self.plan.shards(t.name):
                if s.rank == self.rank:
                    local.append((dataclasses.replace(t, optimizer=t.optimizer or collection.optimizer), s, p.kind))
        self.shards = (
            EmbeddingCollection(
                [shard_config(t, s, k, collection.optimizer) for t, s, k in local], collection.optimizer, device
            )
            if local
            else None
        )
        self.replicas = ReplicatedTables(dp, collection.optimizer, device, group, self.stats) if dp else None
        self.placed: list[Placed] = []  # every table or shard this rank holds (checkpoints walk these)
        if self.shards is not None:
            self.placed += [Placed(t, s, k, self.shards, len(self.plan.placements[t.name].ranks)) for t, s, k in local]
        if self.replicas is not None:
            whole = [Shard(t.name, self.rank, 0, 0, t.num_rows, 0, t.dim) for t in dp]
            self.placed += [
                Placed(t, s, ShardingKind.DATA_PARALLEL, self.replicas.collection)
                for t, s in zip(dp, whole, strict=True)
            ]
        self._copy_from(collection, local, dp)

    # -- construction ----------------------------------------------------------------------------
    def _copy_from(
        self,
        collection: EmbeddingCollection,
        local: list[tuple[TableConfig, Shard, ShardingKind]],
        dp: list[TableConfig],
    ) -> None:
        """Take this rank's rows, optimizer state and steps (and keys) from the unsharded collection."""
        for t, s, kind in local:
            assert self.shards is not None
            if t.dynamic is None:
                cut = shard_state(table_state(collection, t.name), t, s, kind)
                _load_table(self.shards, t.name, cut)
            else:
                self._copy_dynamic(collection, t, s, kind)
        for t in dp:
            assert self.replicas is not None
            whole = {k: v.clone() for k, v in table_state(collection, t.name).items()}
            _load_table(self.replicas.collection, t.name, whole)

    def _copy_dynamic(self, collection: EmbeddingCollection, t: TableConfig, s: Shard, kind: ShardingKind) -> None:
        """A dynamic table whole (table- and column-wise: the same rows, free ones included), or the keys of
        row shard s (hash(key) % k == s.index) with their rows, scores, the admission sketch and the step."""
        assert self.shards is not None
        source, target = collection.hash_tables[t.name], self.shards.hash_tables[t.name]
        k = len(self.plan.placements[t.name].ranks)
        if kind is not ShardingKind.ROW_WISE or k == 1:
            target.load_state_dict(source.state_dict())
            everything = torch.arange(t.num_rows)
            weights, opt_state = collection.read_rows(t.name, everything)
            self.shards.write_rows(t.name, everything, *cut_columns(weights, opt_state, t, s, kind))
        else:
            held = source.export()
            mine = key_shard(held.keys, k) == s.index
            n = int(mine.sum())
            if n > target.key_capacity:
                raise ValueError(
                    f"ShardedEmbeddingCollection: dynamic table {t.name!r} holds {n} keys for shard {s.index}, "
                    f"more than its capacity {target.key_capacity}"
                )
            rows = torch.arange(n, dtype=torch.int64)
            # the admission counts so far, as the whole table saw them, and the whole table's clock
            contents = HashTableContents(held.keys[mine], rows, held.last_step[mine], held.count[mine])
            target.load(contents, sketch=source.state_dict()["sketch"])
            target.advance_to(max(source.step, 0))
            weights, opt_state = collection.read_rows(t.name, held.rows[mine])
            self.shards.write_rows(t.name, rows, weights, opt_state)
        step = table_state(collection, t.name).get("step")
        if step is not None:
            _load_table(self.shards, t.name, {"step": step.clone()})

    # -- the collection's description ----------------------------------------------------------
    @property
    def tables(self) -> tuple[TableConfig, ...]:
        return self.source_tables

    @property
    def optimizer(self) -> Optimizer:
        return self.default_optimizer

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self._feature_names

    @property
    def feature_dims(self) -> tuple[int, ...]:
        return self._feature_dims

    @property
    def sequence_feature_names(self) -> tuple[str, ...]:
        return self._sequence_names

    @property
    def output_dim(self) -> int:
        return self._output_dim

    # -- lookups ---------------------------------------------------------------------------------
    def prefetch(self, features: SparseFeatures) -> None:
        """Start sending the ids of a batch a later `forward` will get, so that the exchange overlaps what
        runs until then (see `hugerec.distributed.shard.prefetching`). Every rank must prefetch alike;
        `forward` uses the oldest prefetched exchange if it is of the same ids and drops it otherwise."""
        if self.pooled_routing.features:
            self._pending.append(self._send_ids(features, self.pooled_routing))

    def forward(self, features: SparseFeatures) -> PooledEmbeddings:
        """Pooled embeddings [B, output_dim] of this rank's B examples, columns as in the unsharded collection."""
        self._check_features(features)
        parts: dict[str, torch.Tensor] = {}
        if self.pooled_routing.features:
            parts.update(self._sharded_pooled(features))
        dp = [f for f in self._feature_names if f not in parts]
        if dp:
            assert self.replicas is not None
            parts.update(self.replicas.lookup(features, dp, sequence=False))
        if not self._feature_names:
            values = torch.zeros(features.batch_size, 0, device=features.values.device)
        else:
            values = torch.cat([parts[f] for f in self._feature_names], dim=1)  # [B, output_dim]
        return PooledEmbeddings(self._feature_names, self._feature_dims, values)

    def sequences(self, features: SparseFeatures) -> dict[str, JaggedTensor]:
        """Per Pooling.NONE feature: JaggedTensor(values [N_f, D] fp32, lengths, weights) for this rank's examples."""
        self._check_features(features)
        out: dict[str, torch.Tensor] = {}
        if self.sequence_routing.features:
            out.update(self._sharded_sequences(features))
        dp = [f for f in self._sequence_names if f not in out]
        if dp:
            assert self.replicas is not None
            out.update(self.replicas.lookup(features, dp, sequence=True))
        result = {}
        for f in self._sequence_names:
            j = features[f]
            result[f] = JaggedTensor(out[f], j.lengths, j.weights)
        return result

    def _check_features(self, features: SparseFeatures) -> None:
        unknown = [k for k in features.keys if k not in self._table_of]
        if unknown:
            raise ValueError(
                f"ShardedEmbeddingCollection: unknown features {unknown}; tables have {list(self._table_of)}"
            )

    # -- the id exchange -------------------------------------------------------------------------
    def _send_ids(self, features: SparseFeatures, routing: Routing) -> _IdExchange:
        bk = bucketize(features, routing)
        w = self.world_size
        has_weights = int(features.weights is not None)
        counts = torch.tensor([[features.batch_size, n, has_weights] for n in bk.send_values], dtype=torch.int64)
        got = (
            all_to_all(counts.to(features.values.device), [1] * w, [1] * w, self.group, self.stats, "counts")
            .wait()
            .cpu()
        )  # [W, 3]: what every source sends here
        flags = got[:, 2].tolist()
        if len(set(flags)) > 1:
            raise ValueError(
                f"ShardedEmbeddingCollection: batches with per-id weights on ranks "
                f"{[r for r, f in enumerate(flags) if f]} but not on the others; all ranks must agree"
            )
        batch_sizes, values_from = got[:, 0].tolist(), got[:, 1].tolist()
        e = len(routing.serve[self.rank])
        recv = [e * b + n for b, n in zip(batch_sizes, values_from, strict=True)]
        ids = all_to_all(bk.ids, bk.send, recv, self.group, self.stats, "ids", async_op=True)
        weights = None
        if bk.weights is not None:
            weights = all_to_all(
                bk.weights, bk.send_values, values_from, self.group, self.stats, "weights", async_op=True
            )
        return _IdExchange(features, bk, batch_sizes, values_from, ids, weights)

    def _take_prefetched(self, features: SparseFeatures) -> _IdExchange | None:
        """The oldest prefetched exchange if it carries these ids; older or other ones are finished and dropped."""
        while self._pending:
            ex = self._pending.pop(0)
            if _same_ids(ex.features, features, self.pooled_routing.features):
                return ex
            ex.ids.wait()
            if ex.weights is not None:
                ex.weights.wait()
        return None

    def _exchange_ids(self, features: SparseFeatures, routing: Routing) -> tuple[_IdExchange, SparseFeatures]:
        """This rank's share of every rank's ids: a SparseFeatures over sum(batch_sizes) examples."""
        ex = self._take_prefetched(features) if routing is self.pooled_routing else None
        if ex is None:
            ex = self._send_ids(features, routing)
        weights = None if ex.weights is None else ex.weights.wait()
        received, _ = receive(ex.ids.wait(), weights, ex.batch_sizes, ex.values_from, routing.serve[self.rank])
        return ex, received

    def _joins_backward(self, t: torch.Tensor) -> torch.Tensor:
        """A rank that serves nothing still has to take part in the backward all_to_all of the others."""
        if self.training and torch.is_grad_enabled() and not t.requires_grad:
            return t.detach().requires_grad_()
        return t

    def _average_gradients(self, t: torch.Tensor) -> None:
        """Scale the gradients sent to the owners by 1/W: summed over the ranks they average, as
        DistributedDataParallel averages the dense ones (rank losses = means over their examples ->
        the same step as one process on the global batch with the mean loss)."""
        if t.requires_grad and self.world_size > 1:
            t.register_hook(lambda g: g / self.world_size)

    # -- sharded pooled lookup -------------------------------------------------------------------
    def _mean_row_wise(self, r: Route) -> bool:
        return r.kind is ShardingKind.ROW_WISE and r.table.pooling is Pooling.MEAN

    def _rows_per_bag(self, received: SparseFeatures, r: Route) -> torch.Tensor:
        """[sum B_s, 1]: how many ids of each received bag have a row here (what MEAN divides by)."""
        j = received[r.feature]
        if r.table.dynamic is None:
            return j.lengths.to(torch.float32).unsqueeze(1)
        assert self.shards is not None
        device = j.values.device
        has_row = (self.shards.hash_tables[r.table.name].find(j.values) >= 0).to(device, torch.float32)
        bags = torch.repeat_interleave(torch.arange(j.batch_size, device=device), j.lengths.to(torch.int64))
        return torch.zeros(j.batch_size, device=device).index_add_(0, bags, has_row).unsqueeze(1)

    def _block_width(self, rank: int) -> int:
        """Columns of the block `rank` sends back per example: its pooled routes, then one count per
        row-wise MEAN route (how many of the bag's ids had a row there)."""
        routes = self.pooled_routing.serve[rank]
        return sum(r.shard.dim for r in routes) + sum(self._mean_row_wise(r) for r in routes)

    def _sharded_pooled(self, features: SparseFeatures) -> dict[str, torch.Tensor]:
        routing = self.pooled_routing
        ex, received = self._exchange_ids(features, routing)
        mine = routing.serve[self.rank]
        total = sum(ex.batch_sizes)
        if mine:
            assert self.shards is not None
            local = self.shards(received).values  # [sum B_s, C] in route order (the shard collection's order)
            counts = [self._rows_per_bag(received, r) for r in mine if self._mean_row_wise(r)]
            block = torch.cat([local, *counts], dim=1) if counts else local  # [sum B_s, C + means]
        else:
            block = torch.zeros(total, 0, device=features.values.device)
        block = self._joins_backward(block)
        widths = [self._block_width(d) for d in range(self.world_size)]
        b = features.batch_size
        back = all_to_all_autograd(
            block.reshape(-1),
            [bs * widths[self.rank] for bs in ex.batch_sizes],
            [b * wd for wd in widths],
            self.group,
            self.stats,
            "pooled",
        )
        self._average_gradients(back)
        blocks = [x.view(b, wd) for x, wd in zip(back.split([b * wd for wd in widths]), widths, strict=True)]
        return self._assemble_pooled(blocks)

    def _assemble_pooled(self, blocks: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Blocks [B, C_d] from every rank -> each sharded pooled feature's [B, D]."""
        pieces: dict[tuple[str, int], torch.Tensor] = {}
        counts: dict[tuple[str, int], torch.Tensor] = {}
        for d, routes in enumerate(self.pooled_routing.serve):
            col = 0
            for r in routes:
                pieces[r.feature, r.shard.index] = blocks[d][:, col : col + r.shard.dim]
                col += r.shard.dim
            for r in routes:
                if self._mean_row_wise(r):
                    counts[r.feature, r.shard.index] = blocks[d][:, col].detach()
                    col += 1
        out = {}
        for f, routes in self.pooled_routing.by_feature.items():
            got = [pieces[f, r.shard.index] for r in routes]
            match routes[0].kind:
                case ShardingKind.TABLE_WISE:
                    out[f] = got[0]
                case ShardingKind.COLUMN_WISE:
                    out[f] = torch.cat(got, dim=1)
                case ShardingKind.ROW_WISE:
                    summed = torch.stack(got).sum(dim=0)  # partial sums of the bag over the shards
                    if self._mean_row_wise(routes[0]):
                        n = torch.stack([counts[f, r.shard.index] for r in routes]).sum(dim=0)
                        summed = summed / n.clamp(min=1).unsqueeze(1)
                    out[f] = summed
                case ShardingKind.DATA_PARALLEL:
                    raise AssertionError("data-parallel tables have no routes")
        return out

    # -- sharded sequence lookup -----------------------------------------------------------------
    def _sharded_sequences(self, features: SparseFeatures) -> dict[str, torch.Tensor]:
        routing = self.sequence_routing
        ex, received = self._exchange_ids(features, routing)
        mine = routing.serve[self.rank]
        w = self.world_size
        device = features.values.device
        # ids per (source, route): which rows of each route's output belong to which source
        sizes = torch.zeros(w, len(mine), dtype=torch.int64)
        chunks = []
        if mine:
            assert self.shards is not None
            seqs = self.shards.sequences(received)
            for e, r in enumerate(mine):
                lengths = received[r.feature].lengths.to(torch.int64).split(ex.batch_sizes)
                sizes[:, e] = torch.stack([x.sum() for x in lengths]).cpu()
                chunks.append(seqs[r.feature].values.reshape(-1))  # [n_e * D_e], sources in order
        dims = torch.tensor([r.shard.dim for r in mine], dtype=torch.int64)
        flat = torch.cat(chunks) if chunks else torch.zeros(0, device=device)
        send = regroup(flat, (sizes * dims).t()) if mine else flat  # route-major -> source-major
        send = self._joins_backward(send)
        send_splits = (sizes * dims).sum(dim=1).tolist()
        # what comes back: from rank d, for each of d's routes, this rank's ids of it times D
        bk = ex.bucketed
        recv_sizes = [
            [n * r.shard.dim for n, r in zip(bk.route_ids[d], routes, strict=True)]
            for d, routes in enumerate(routing.serve)
        ]
        back = all_to_all_autograd(send, send_splits, [sum(x) for x in recv_sizes], self.group, self.stats, "sequence")
        self._average_gradients(back)
        pieces: dict[tuple[str, int], torch.Tensor] = {}
        start = 0
        for d, routes in enumerate(routing.serve):
            for r, n in zip(routes, recv_sizes[d], strict=True):
                pieces[r.feature, r.shard.index] = back[start : start + n].view(-1, r.shard.dim)
                start += n
        out = {}
        for f, routes in routing.by_feature.items():
            got = [pieces[f, r.shard.index] for r in routes]
            match routes[0].kind:
                case ShardingKind.TABLE_WISE:
                    out[f] = got[0]
                case ShardingKind.COLUMN_WISE:
                    out[f] = torch.cat(got, dim=1)
                case ShardingKind.ROW_WISE:
                    # vectors come back grouped by shard; bk.order[f] is the permutation that grouped them
                    grouped = torch.cat(got) if len(got) > 1 else got[0]
                    inverse = torch.empty_like(bk.order[f]) if f in bk.order else None
                    if inverse is None:
                        out[f] = grouped
                    else:
                        inverse[bk.order[f]] = torch.arange(inverse.numel(), device=inverse.device)
                        out[f] = grouped[inverse]
                case ShardingKind.DATA_PARALLEL:
                    raise AssertionError("data-parallel tables have no routes")
        return out


# mypy proves here that the sharded collection is a drop-in for the interface models annotate
_SHARDED_IS_EMBEDDING_MODULE: type[EmbeddingModule] = ShardedEmbeddingCollection
