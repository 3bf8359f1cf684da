"""What the sequential models share: their config, the item table lookup and a pre-LN transformer block.

Sequences come in as [B, L] dense item ids, left-padded with 0 (the most recent item in column L - 1).
The item table is one `EmbeddingCollection` table (Pooling.NONE) with two features looked up in ONE
call per step: `item_seq` (the input sequence) and `item_cand` (the items to score: targets and
negatives). The output layer is tied to it: the score of item j for a hidden state h is h . e_j, so
no [B, L, items] tensor exists unless the caller asks for the full catalogue.

Rows: 0 = padding, 1..I = items, I + 1 = the [MASK] token of the masked model. A dynamic table
(`DynamicConfig`) takes raw item keys instead; PAD and MASK are then keys like any other.
"""

from __future__ import annotations

import enum
import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam, Optimizer
from hugerec.embedding.table_config import DynamicConfig, Normal, Pooling, TableConfig
from hugerec.models.objectives import SEQUENCE_LOSSES, Negatives, check_objective
from hugerec.sparse.features import SparseFeatures

PAD = 0
SEQ_FEATURE = "item_seq"
CAND_FEATURE = "item_cand"


class Objective(enum.Enum):
    NEXT = "next"  # causal: position t predicts the item at t + 1 (SASRec, GRU4Rec)
    MASKED = "masked"  # bidirectional: masked positions predict their own item (BERT4Rec / MLM)


@dataclass(frozen=True)
class SequenceConfig:
    """num_items  I: dense item ids 1..I (0 = padding; row I + 1 = [MASK])
    max_len      L: the model sees the last L items of a history (longer ones are truncated)
    dim          D: item, position and hidden width
    num_layers   transformer blocks (or GRU layers)
    num_heads    attention heads (dim % num_heads == 0)
    dropout      on embeddings, attention and feed-forward outputs
    dynamic      None: dense rows; a DynamicConfig: the item table is a hash table over raw keys
    """

    num_items: int
    max_len: int = 50
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 1
    dropout: float = 0.2
    dynamic: DynamicConfig | None = None

    def __post_init__(self) -> None:
        for name in ("num_items", "max_len", "dim", "num_layers", "num_heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"SequenceConfig: {name} must be an int >= 1, got {v!r}")
        if self.dim % self.num_heads:
            raise ValueError(f"SequenceConfig: dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"SequenceConfig: dropout must be in [0, 1), got {self.dropout}")

    @property
    def mask_id(self) -> int:
        return self.num_items + 1


@dataclass(frozen=True)
class SequenceModelConfig:
    """What [model] says of a sequential model (SASRecConfig, MLMConfig, GRU4RecConfig): SequenceConfig's
    data-independent fields (the catalogue's size comes from the data: `sequence_config(num_items)`) and
    the training objective (`hugerec.models.objectives`: "full_softmax" over the catalogue for small ones,
    "sampled_softmax" for huge ones, "bce": one negative, classic SASRec). Histories longer than max_len
    keep their last max_len items."""

    max_len: int = 50  # L: the model sees the last L items of a history (longer ones are truncated)
    dim: int = 64  # D: item, position and hidden width
    num_layers: int = 2  # transformer blocks (or GRU layers)
    num_heads: int = 1  # attention heads (dim % num_heads == 0)
    dropout: float = 0.2  # on embeddings, attention and feed-forward outputs
    loss: str = "full_softmax"  # "full_softmax", "sampled_softmax" or "bce"
    negatives: str = Negatives.MIXED.value  # sampled_softmax's negatives, a Negatives value: "mixed", "in_batch", "uniform", "popularity"
    num_negatives: int = 1024  # negatives sampled per batch (besides the in-batch ones for "mixed")
    alpha: float = 0.0  # popularity negatives are drawn ~ count^alpha (0: uniform)
    logq: bool = True  # subtract log of each candidate's sampling probability from its logit (logQ correction)

    def __post_init__(self) -> None:
        self.sequence_config(1)  # SequenceConfig's checks of the shared fields, now
        check_objective(self, type(self).__name__, SEQUENCE_LOSSES)

    def sequence_config(self, num_items: int, dynamic: DynamicConfig | None = None) -> SequenceConfig:
        """The built model's config over a catalogue of `num_items` items."""
        return SequenceConfig(num_items, self.max_len, self.dim, self.num_layers, self.num_heads, self.dropout, dynamic)


@dataclass(frozen=True)
class SASRecConfig(SequenceModelConfig):
    """model.type = "sasrec": causal self-attention, each position predicts the next item."""


@dataclass(frozen=True)
class GRU4RecConfig(SequenceModelConfig):
    """model.type = "gru4rec": a GRU over the sequence (num_heads is not used)."""


@dataclass(frozen=True)
class MLMConfig(SequenceModelConfig):
    """model.type = "mlm": the masked transformer (BERT4Rec); mask_prob: the fraction of items it hides."""

    mask_prob: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.mask_prob, bool) or not isinstance(self.mask_prob, int | float) or not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob!r}")


def item_table(cfg: SequenceConfig) -> TableConfig:
    """The item table: I + 2 rows (padding, items, [MASK]), looked up by the sequence and candidate features."""
    return TableConfig(
        "item",
        num_rows=cfg.num_items + 2,
        dim=cfg.dim,
        features=(SEQ_FEATURE, CAND_FEATURE),
        pooling=Pooling.NONE,
        init=Normal(std=1.0 / math.sqrt(cfg.dim)),
        dynamic=cfg.dynamic,
    )


class ItemLookup(nn.Module):
    """Sequence and candidate rows of the item table in one lookup (one sparse optimizer step per backward).

    `features(seq, candidates)` builds the lookup's SparseFeatures ahead of the step (the training
    pipeline's worker thread stages them: dynamic-table remap, disk-tier prefetch); the next forward of
    those very tensors then looks up those very features, so the model's signature stays (seq, candidates).
    A model that looks up other tensors than its inputs (HSTU: the items of seq without the padding, and
    more candidates behind them) names the inputs they come from as `key`, in `features` and in the forward.
    """

    def __init__(self, cfg: SequenceConfig, optimizer: Optimizer) -> None:
        super().__init__()
        self.items = EmbeddingCollection([item_table(cfg)], optimizer=optimizer)
        self.dim = cfg.dim
        self._prepared: list[tuple[tuple[object, ...], SparseFeatures]] = []
        self._lock = threading.Lock()  # `features` runs in the pipeline's thread, forward in the main one

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()  # copies and pickles carry no lock and no prepared step
        state["_prepared"], state["_lock"] = [], None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        super().__setstate__(state)
        self._lock = threading.Lock()

    def features(self, seq: torch.Tensor, candidates: torch.Tensor | None = None, key: tuple[object, ...] | None = None) -> SparseFeatures:
        """The lookup of seq [B, L] and candidates [M], kept for the forward of these same tensors (or of the
        same `key`: the objects the forward names, compared by identity)."""
        feats = _lookup_features(seq, candidates)
        with self._lock:
            self._prepared.append(((seq, candidates) if key is None else key, feats))
            del self._prepared[:-2]  # the step in use and the next one
        return feats

    def forward(
        self, seq: torch.Tensor, candidates: torch.Tensor | None = None, key: tuple[object, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """seq [B, L], candidates [M] -> ([B, L, D] sequence rows, [M, D] candidate rows); the features
        `features` prepared for these tensors (or this `key`) when there are, so a staged lookup is used."""
        b, length = seq.shape
        wanted = (seq, candidates) if key is None else key
        feats = None
        with self._lock:
            for i, (k, f) in enumerate(self._prepared):
                if len(k) == len(wanted) and all(x is y for x, y in zip(k, wanted, strict=True)):
                    feats = f
                    del self._prepared[i]
                    break
        if feats is None:
            feats = _lookup_features(seq, candidates)
        out = self.items.sequences(feats)
        return out[SEQ_FEATURE].values.view(b, length, self.dim), out[CAND_FEATURE].values  # [B*L, D] -> [B, L, D]

    def candidates(self, ids: torch.Tensor) -> torch.Tensor:
        """[M] ids -> [M, D] rows (the tied output layer's weights for these items)."""
        return self(ids.new_zeros(1, 0), ids)[1]


def _lookup_features(seq: torch.Tensor, candidates: torch.Tensor | None) -> SparseFeatures:
    """seq [B, L] and candidates [M] as one SparseFeatures: item_seq's B bags of L ids, item_cand's bags
    all empty but the first, which holds every candidate."""
    b, length = seq.shape
    cand = candidates if candidates is not None else seq.new_empty(0)
    lengths = torch.zeros(2 * b, dtype=torch.int64, device=seq.device)
    lengths[:b] = length
    if b:
        lengths[b] = cand.numel()  # all candidates ride on example 0 of the candidate feature
    return SparseFeatures((SEQ_FEATURE, CAND_FEATURE), torch.cat([seq.reshape(-1), cand]), lengths)


def padding_mask(seq: torch.Tensor) -> torch.Tensor:
    """[B, L] True where the position holds an item."""
    return seq != PAD


def attention_mask(seq: torch.Tensor, causal: bool) -> torch.Tensor:
    """[B, 1, L, L] bool, True = may attend: key j is an item (and j <= i when causal).

    Every position may attend to itself, so a padding row is never fully masked (no NaN); what a padding
    position computes is never read.
    """
    length = seq.shape[1]
    keys = padding_mask(seq)[:, None, None, :]  # [B, 1, 1, L]
    allowed = keys.expand(-1, 1, length, -1)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
    return allowed | torch.eye(length, dtype=torch.bool)


class TransformerBlock(nn.Module):
    """Pre-LN self-attention (scaled_dot_product_attention) + GELU feed-forward, each with dropout and a residual."""

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, L, D], mask [B, 1, L, L] -> [B, L, D]"""
        b, length, d = x.shape
        h = self.num_heads
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, h, d // h).permute(2, 0, 3, 1, 4)  # 3 x [B, H, L, D/H]
        p = self.dropout if self.training else 0.0
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # [B, H, L, D/H]
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, length, d)))
        return x + self.drop(self.ff(self.norm2(x)))


class TransformerEncoder(nn.Module):
    """Item rows + learned positions -> blocks -> final LayerNorm. Shared by SASRec (causal) and the masked model."""

    def __init__(self, cfg: SequenceConfig, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.positions = nn.Embedding(cfg.max_len, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(cfg.dim, cfg.num_heads, cfg.dropout) for _ in range(cfg.num_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.scale = math.sqrt(cfg.dim)

    def forward(self, seq: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """seq [B, L] ids, rows [B, L, D] their item rows -> [B, L, D] hidden states."""
        length = seq.shape[1]
        keep = padding_mask(seq)[..., None].to(rows.dtype)  # [B, L, 1]
        # positions count back from the most recent item: a history's last item always has position max_len - 1
        pos = self.positions.weight[self.positions.num_embeddings - length :]  # [L, D]
        x = self.drop((rows * self.scale + pos[None]) * keep)
        mask = attention_mask(seq, self.causal)
        for block in self.blocks:
            x = block(x, mask) * keep
        return self.norm(x)


def last_position(hidden: torch.Tensor) -> torch.Tensor:
    """[B, L, D] -> [B, D]: the state after the most recent item (sequences are left-padded)."""
    return hidden[:, -1]


DEFAULT_OPTIMIZER = Adam(lr=1e-3)
