"""Two-tower retrieval model on EmbeddingCollections: user tower and item tower meet in one inner product.

    model = TwoTower(TwoTowerConfig(dim=64), num_users=U, num_items=I, optimizer=hr.Adam(lr=1e-3))
    u = model.user_vectors(users, history)    # [B] ids, JaggedTensor of recent item ids -> [B, D]
    v = model.item_vectors(items)             # [N] ids -> [N, D]
    u, v = model(model.user_features(users, history), model.item_features(items))   # a training step
    score = (u * v).sum(-1) / config.temperature

User tower: concat[user-id embedding, mean of the last `max_history` items, mean of the last r items
for each window r in `recent` (the last item alone, the last five: what item-kNN scores from),
pooled user-feature embeddings] -> MLP -> D. Item tower: concat[item-id embedding, pooled
item-feature embeddings, each item vector feature (a frozen pretrained vector per item id: its own
LayerNorm, then a Linear to embedding_dim; `hugerec.models.vector_features`)] -> MLP -> D (no MLP when the
item id alone already has width D).
With COSINE similarity both outputs are L2-normalised, so an inner-product index serves either kind.

Each tower owns one EmbeddingCollection (its tables are looked up once per batch, so each table takes
exactly one sparse-optimizer step per training step: positives and sampled negatives go through
`item_vectors` in one call). History items use their own table, not the item tower's, for the same
reason. Side features are static per user/item (e.g. genres): given as JaggedTensors over all ids
and stored as buffers, so any id (a sampled negative, the whole catalogue for the index) can be embedded.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam, Optimizer
from hugerec.embedding.table_config import DynamicConfig, Normal, Pooling, TableConfig
from hugerec.models.mlp import MLP
from hugerec.models.objectives import RETRIEVAL_LOSSES, Negatives, check_objective
from hugerec.models.vector_features import VectorArch, VectorFeature, vector_features
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor, lengths_to_offsets


class Similarity(enum.Enum):
    DOT = "dot"
    COSINE = "cosine"


@dataclass(frozen=True)
class TwoTowerConfig:
    """dim               D, the width of both towers' outputs (and of the index)
    embedding_dim       width of every embedding table
    user_layers         hidden widths of the user tower's MLP (a final Linear to `dim` is added)
    item_layers         hidden widths of the item tower's MLP (likewise; none and no item features: no MLP)
    use_user_id         embed the user id (off: the user is their history and features only, no cold ids)
    max_history         items pooled into the long-history feature
    recent              window sizes: one pooled feature per window over the last n items (() for none)
    init_std            embedding rows start as N(0, init_std^2)
    similarity          DOT or COSINE
    temperature         logits are similarity / temperature (in the losses)
    user_features       (name, cardinality) of static user side features
    item_features       (name, cardinality) of static item side features
    vectors             item vector features (VectorFeature keyed by feature "item_id", or their dicts),
                        each LayerNorm'ed and projected to embedding_dim in the item tower
    loss, negatives, num_negatives, alpha, logq   the training objective (`hugerec.models.objectives`):
                        "sampled_softmax" (in-batch and/or sampled negatives, log-Q corrected) or "bpr"
    mask_history        sampled softmax: a row's history items are not its negatives
    """

    dim: int = 64
    embedding_dim: int = 64
    user_layers: tuple[int, ...] = (256,)
    item_layers: tuple[int, ...] = ()
    use_user_id: bool = True
    max_history: int = 50
    recent: tuple[int, ...] = (1, 5)
    similarity: Similarity = Similarity.DOT
    temperature: float = 1.0
    init_std: float = 0.05
    user_features: tuple[tuple[str, int], ...] = field(default=())
    item_features: tuple[tuple[str, int], ...] = field(default=())
    vectors: tuple[VectorFeature, ...] = ()
    loss: str = "sampled_softmax"
    negatives: str = Negatives.MIXED.value  # a Negatives value
    num_negatives: int = 1024
    alpha: float = 0.0
    logq: bool = True
    mask_history: bool = False

    def __post_init__(self) -> None:
        check_objective(self, "TwoTowerConfig", RETRIEVAL_LOSSES)
        if self.mask_history and self.loss != "sampled_softmax":
            raise ValueError(f"mask_history = true applies to loss = 'sampled_softmax', got loss = {self.loss!r}")
        object.__setattr__(self, "vectors", vector_features(self.vectors, "TwoTowerConfig"))
        keyed = [v.feature for v in self.vectors if v.feature != "item_id"]
        if keyed:
            raise ValueError(f"TwoTowerConfig: vector features of the item tower are keyed by 'item_id', got {keyed}")
        if isinstance(self.recent, int):
            object.__setattr__(self, "recent", (self.recent,) if self.recent else ())
        for name in ("user_layers", "item_layers", "recent", "user_features", "item_features"):
            object.__setattr__(self, name, tuple(tuple(x) if isinstance(x, list) else x for x in getattr(self, name)))
        if isinstance(self.similarity, str):
            try:
                object.__setattr__(self, "similarity", Similarity(self.similarity))
            except ValueError:
                raise ValueError(
                    f"TwoTowerConfig: similarity must be one of {[s.value for s in Similarity]}, got {self.similarity!r}"
                ) from None
        for name in ("dim", "embedding_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"TwoTowerConfig: {name} must be >= 1, got {getattr(self, name)}")
        if any(w < 1 for w in (*self.user_layers, *self.item_layers)):
            raise ValueError(f"TwoTowerConfig: layer widths must be >= 1, got {self.user_layers}, {self.item_layers}")
        if self.max_history < 0 or any(not 1 <= r <= self.max_history for r in self.recent) or len(set(self.recent)) != len(self.recent):
            raise ValueError(
                f"TwoTowerConfig: need distinct windows 1 <= recent <= max_history, got recent={self.recent}, max_history={self.max_history}"
            )
        if not self.init_std > 0:
            raise ValueError(f"TwoTowerConfig: init_std must be > 0, got {self.init_std}")
        if not self.temperature > 0:
            raise ValueError(f"TwoTowerConfig: temperature must be > 0, got {self.temperature}")
        names = [n for n, _ in (*self.user_features, *self.item_features)]
        reserved = {"user_id", "item_id", "history", *(f"recent{r}" for r in self.recent)}
        if len(set(names)) != len(names) or reserved & set(names):
            raise ValueError(f"TwoTowerConfig: side feature names must be unique and not in {sorted(reserved)}, got {names}")
        if any(c < 1 for _, c in (*self.user_features, *self.item_features)):
            raise ValueError(f"TwoTowerConfig: side feature cardinalities must be >= 1, got {self.user_features}, {self.item_features}")
        if not self.use_user_id and self.max_history == 0 and not self.user_features:
            raise ValueError("TwoTowerConfig: the user tower has no input (use_user_id off, max_history 0, no user features)")


class SideFeatures(nn.Module):
    """Static id-list features of every row (user or item): CSR buffers, gathered for a batch of ids."""

    def __init__(self, features: Mapping[str, JaggedTensor], names: tuple[str, ...], num_rows: int, where: str) -> None:
        super().__init__()
        if set(features) != set(names):
            raise ValueError(f"{where}: side features given {sorted(features)}, config declares {sorted(names)}")
        self.names = names
        for n in names:
            jt = features[n]
            if jt.lengths.numel() != num_rows:
                raise ValueError(f"{where}: side feature {n!r} has {jt.lengths.numel()} rows, expected {num_rows}")
            self.register_buffer(f"{n}_offsets", lengths_to_offsets(jt.lengths.to(torch.int64)))
            self.register_buffer(f"{n}_values", jt.values.to(torch.int64))

    def gather(self, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """[B] row ids -> per feature (values [N], lengths [B])."""
        out = []
        for n in self.names:
            offsets, values = getattr(self, f"{n}_offsets"), getattr(self, f"{n}_values")
            out.append(_select_rows(offsets, values, ids))
        return out


def _select_rows(offsets: torch.Tensor, values: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR rows `rows` [B] -> (values [N], lengths [B]) in that order."""
    starts, lengths = offsets[rows], offsets[rows + 1] - offsets[rows]
    out_offsets = lengths_to_offsets(lengths)
    pos = torch.repeat_interleave(starts - out_offsets[:-1], lengths) + torch.arange(int(out_offsets[-1]))
    return values[pos], lengths


def sparse_features(parts: list[tuple[str, torch.Tensor, torch.Tensor]]) -> SparseFeatures:
    """[(name, values [N_f], lengths [B])] -> one feature-major SparseFeatures."""
    return SparseFeatures(
        tuple(n for n, _, _ in parts),
        torch.cat([v for _, v, _ in parts]),
        torch.cat([ln.to(torch.int32) for _, _, ln in parts]),
    )


def recent_tail(history: JaggedTensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The last n ids of each bag: (values [N'], lengths [B])."""
    lengths = history.lengths.to(torch.int64)
    if not lengths.numel() or int(lengths.max()) <= n:  # every bag already fits: nothing to cut
        return history.values, lengths
    keep = lengths.clamp(max=n)
    ends = lengths_to_offsets(lengths)[1:]
    out_offsets = lengths_to_offsets(keep)
    pos = torch.repeat_interleave(ends - keep - out_offsets[:-1], keep) + torch.arange(int(out_offsets[-1]))
    return history.values[pos], keep


class TwoTower(nn.Module):
    def __init__(
        self,
        config: TwoTowerConfig,
        num_users: int,
        num_items: int,
        optimizer: Optimizer = Adam(lr=1e-3),  # noqa: B008  # frozen dataclass: immutable default
        user_features: Mapping[str, JaggedTensor] | None = None,
        item_features: Mapping[str, JaggedTensor] | None = None,
        dynamic_users: DynamicConfig | None = None,
    ) -> None:
        """dynamic_users: the user-id table is a dynamic hash table (raw int64 user ids, num_users its capacity)."""
        super().__init__()
        if num_users < 1 or num_items < 1:
            raise ValueError(f"TwoTower: num_users and num_items must be >= 1, got {num_users}, {num_items}")
        if dynamic_users is not None and config.user_features:
            raise ValueError("TwoTower: user side features are indexed by dense user id; they cannot go with dynamic_users")
        self.config, self.num_users, self.num_items = config, num_users, num_items
        e, init = config.embedding_dim, Normal(0.0, config.init_std)
        user_tables = []
        if config.use_user_id:
            user_tables.append(TableConfig("user_id", num_users, e, init=init, dynamic=dynamic_users))
        if config.max_history:
            hist = ("history", *(f"recent{r}" for r in config.recent))
            user_tables.append(TableConfig("history", num_items, e, features=hist, pooling=Pooling.MEAN, init=init))
        user_tables += [TableConfig(n, c, e, pooling=Pooling.MEAN, init=init) for n, c in config.user_features]
        item_tables = [TableConfig("item_id", num_items, e, init=init)]
        item_tables += [TableConfig(n, c, e, pooling=Pooling.MEAN, init=init) for n, c in config.item_features]
        self.user_embedding = EmbeddingCollection(user_tables, optimizer)
        self.item_embedding = EmbeddingCollection(item_tables, optimizer)
        self.user_side = SideFeatures(user_features or {}, tuple(n for n, _ in config.user_features), num_users, "TwoTower users")
        self.item_side = SideFeatures(item_features or {}, tuple(n for n, _ in config.item_features), num_items, "TwoTower items")
        self.user_mlp = MLP(self.user_embedding.output_dim, (*config.user_layers, config.dim), final_activation=False)
        self.vector_arch = VectorArch(config.vectors, {"item_id": num_items}, e, optimizer) if config.vectors else None
        needs_item_mlp = config.item_layers or config.item_features or config.vectors or e != config.dim
        item_width = self.item_embedding.output_dim + e * len(config.vectors)
        self.item_mlp = (
            MLP(item_width, (*config.item_layers, config.dim), final_activation=False)
            if needs_item_mlp
            else None
        )

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def temperature(self) -> float:
        return self.config.temperature

    def user_features(self, users: torch.Tensor, history: JaggedTensor) -> SparseFeatures:
        """users [B] int64, history: item ids per user, oldest first (lengths [B]) -> the user tower's lookup."""
        if history.lengths.numel() != users.numel():
            raise ValueError(f"TwoTower: {users.numel()} users but {history.lengths.numel()} histories")
        cfg = self.config
        parts: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        ones = torch.ones_like(users)
        if cfg.use_user_id:
            parts.append(("user_id", users, ones))
        if cfg.max_history:
            parts.append(("history", *recent_tail(history, cfg.max_history)))
            parts += [(f"recent{r}", *recent_tail(history, r)) for r in cfg.recent]
        if self.user_side.names:
            parts += [(n, v, ln) for n, (v, ln) in zip(self.user_side.names, self.user_side.gather(users), strict=True)]
        return sparse_features(parts)

    def item_features(self, items: torch.Tensor) -> SparseFeatures:
        """items [N] int64 -> the item tower's lookup (feature "item_id" first, then the side features)."""
        parts = [("item_id", items, torch.ones_like(items))]
        parts += [(n, v, ln) for n, (v, ln) in zip(self.item_side.names, self.item_side.gather(items), strict=True)]
        return sparse_features(parts)

    def forward(self, users: SparseFeatures, items: SparseFeatures) -> tuple[torch.Tensor, torch.Tensor]:
        """One training step's vectors from prebuilt lookups (`user_features`, `item_features`): user
        vectors [B, D] and item vectors [N, D]. Both towers run in one forward, so that a sharded model
        (DistributedDataParallel) sees every dense parameter of the step."""
        return self.encode_users(users), self.encode_items(items)

    def encode_users(self, features: SparseFeatures) -> torch.Tensor:
        """The user tower on its lookup's features -> [B, D]."""
        pooled = self.user_embedding(features).values  # [B, sum E]
        return self._finish(self.user_mlp(pooled))

    def encode_items(self, features: SparseFeatures) -> torch.Tensor:
        """The item tower on its lookup's features -> [N, D]."""
        pooled = self.item_embedding(features).values  # [N, sum E]
        if self.vector_arch is not None:  # each vector: LayerNorm + Linear -> [N, E], beside the embeddings
            ids = features["item_id"].values
            rows = self.vector_arch.lookup(sparse_features([("item_id", ids, torch.ones_like(ids))]))
            pooled = torch.cat([pooled, *self.vector_arch(rows)], dim=1)
        return self._finish(pooled if self.item_mlp is None else self.item_mlp(pooled))

    def user_vectors(self, users: torch.Tensor, history: JaggedTensor) -> torch.Tensor:
        """users [B] int64, history: item ids per user, oldest first (lengths [B]) -> [B, D]."""
        return self.encode_users(self.user_features(users, history))

    def item_vectors(self, items: torch.Tensor) -> torch.Tensor:
        """items [N] int64 -> [N, D] (one lookup: call once per step with positives and negatives together)."""
        return self.encode_items(self.item_features(items))

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) if self.config.similarity is Similarity.COSINE else x
