"""HSTU (Zhai et al., ICML 2024, "Actions Speak Louder than Words"): hierarchical sequential transduction units.

    model = HSTU(SequenceConfig(num_items=3706, max_len=50, dim=64, num_layers=2, num_heads=2))
    hidden, cand = model(seq, candidates)          # the SequenceModel protocol of SASRec (`fit` trains it)
    scores = model.candidate_scores(history, candidates)   # M-FALCON cached scoring: [B, C] ranking-head scores

One layer, on the jagged rows x [N, D] of the batch's sequences (padding never enters a product):

    u, v, q, k = split(silu(W1 LayerNorm(x)))                          # gating U, values, queries, keys
    a_ij      = silu(q_i . k_j + rab_ij) / max_len,   j <= i           # pointwise attention: no softmax
    x        <- x + W2 dropout(u * LayerNorm(sum_j a_ij v_j))

rab_ij = pos_l[i - j] + time_l[bucket(t_i - t_j)] is the layer's relative attention bias (relative position
and, when timestamps are given, log-scale time buckets: floor(ln(max(|dt|, 1)) / 0.301), capped at
`time_buckets`; the query's own time, never the target's). Scaling by 1 / max_len rather than by the
batch's longest sequence keeps a sequence's output independent of what else is in its batch. The
attention is `hugerec.ops.jagged_attention` (Numba forward and backward on the CPU). Item rows come
from the shared item table (`ItemLookup`: one lookup per step, the sparse optimizer in the backward)
with learned absolute positions counted back from the most recent item, as in SASRec. With
`temperature > 0` the outputs and the item rows are L2-normalised and the outputs divided by it (HSTU's
cosine similarity), so any loss of the sequential family (full or sampled softmax) trains it.

`layout=Layout.PADDED` runs the same parameters on [B, L, D] tensors with the padded plain-torch attention
(`hugerec.ops.reference.padded_causal_attention`): the baseline of the training benchmark, and a check
(tests) that the jagged path computes the same thing.

Cached candidate scoring (M-FALCON): a candidate is one more token after the history, in the next slot
(position max_len - 1, at time `now`); it attends to the history and to itself, never to the other
candidates, so the history's keys and values of every layer are computed once and each micro-batch
of candidates costs one token per candidate. Its final state goes through the ranking head
(`rank`, a linear layer) to a score; `candidate_ranking_loss` trains that head: the true next item
against sampled negatives, all scored against the same history. The one trainer adds it to the next-item
loss when `ranking_weight > 0` (`HSTUConfig.ranking_weight`, `SequentialFamily(ranking_weight=...)`), through
`forward_ranked`: one item lookup for both passes. The ranking pass encodes its history again: the trunk's
window holds max_len items at positions 0..max_len - 1, the ranking history the last max_len - 1 at
positions ending one slot earlier (where serving puts them, the candidate in the last slot), so the
trunk's keys and values are not the ranking pass's.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from hugerec.embedding.optimizers import Optimizer
from hugerec.models.sequence import (
    DEFAULT_OPTIMIZER,
    PAD,
    ItemLookup,
    Objective,
    SequenceConfig,
    SequenceModelConfig,
    last_position,
)
from hugerec.ops.jagged_attention import jagged_causal_attention, log_time_buckets, relative_bias
from hugerec.ops.reference import padded_causal_attention
from hugerec.sparse.features import SparseFeatures

_TIME_LOG_BASE = 0.301  # HSTU's bucket width in ln(seconds)
# negatives per window of the ranking head's cross entropy: 32 + 1 candidate tokens per window, fewer than the
# window's own items at ML-1M's max_len 50
DEFAULT_RANKING_NEGATIVES = 32


def check_ranking(weight: object, negatives: object, where: str) -> None:
    """ValueError naming the key for a ranking_weight that is not a finite number >= 0 or ranking_negatives not an int >= 1."""
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight < math.inf:
        raise ValueError(f"{where}: ranking_weight must be a finite number >= 0 (0: no ranking loss), got {weight!r}")
    if isinstance(negatives, bool) or not isinstance(negatives, int) or negatives < 1:
        raise ValueError(f"{where}: ranking_negatives must be an int >= 1, got {negatives!r}")


class Layout(enum.Enum):
    JAGGED = "jagged"  # the batch's item rows back to back, [N, D] (training and serving)
    PADDED = "padded"  # [B, L, D] with masks: the plain-PyTorch baseline


@dataclass(frozen=True)
class HSTUOptions:
    """attention_dim  per-head width of queries and keys (0: dim / num_heads); values are dim / num_heads wide
    time_buckets      log-scale time-difference buckets of the relative bias (used when timestamps are given)
    temperature       > 0: cosine similarity of outputs and item rows divided by it; 0: plain dot product
    """

    attention_dim: int = 0
    time_buckets: int = 64
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.attention_dim, bool) or not isinstance(self.attention_dim, int) or self.attention_dim < 0:
            raise ValueError(f"HSTUOptions: attention_dim must be an int >= 0, got {self.attention_dim!r}")
        if isinstance(self.time_buckets, bool) or not isinstance(self.time_buckets, int) or self.time_buckets < 1:
            raise ValueError(f"HSTUOptions: time_buckets must be an int >= 1, got {self.time_buckets!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < math.inf:
            raise ValueError(f"HSTUOptions: temperature must be a finite number >= 0, got {t!r}")


class _TableGather(torch.autograd.Function):
    """table[index] for a small 1-D table and many indices; the backward sums by bincount (one pass) rather
    than autograd's index_put with accumulation (160x slower here on a million pair indices)."""

    @staticmethod
    def forward(ctx: Any, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.size = table.shape[0]
        return table[index]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        flat = index.reshape(-1)
        summed = torch.bincount(flat, weights=grad.reshape(-1).to(torch.float64), minlength=ctx.size)
        return summed.to(grad.dtype), None


def table_gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table [T] at index [...] (int64 in 0..T-1) -> [...], differentiable in table."""
    if index.device.type != "cpu":
        return table[index]
    out: torch.Tensor = _TableGather.apply(table, index)
    return out


@dataclass(frozen=True)
class HSTUConfig(SequenceModelConfig):
    """model.type = "hstu": SequenceModelConfig's fields (num_heads: HSTU heads) plus HSTUOptions' (the same
    defaults: `build_model(HSTUConfig())` and `HSTU(cfg)` are the same model)."""

    attention_dim: int = HSTUOptions.attention_dim  # per-head width of queries and keys (0: dim / num_heads)
    time_buckets: int = HSTUOptions.time_buckets  # log-scale time-difference buckets of the relative attention bias
    temperature: float = HSTUOptions.temperature  # > 0: cosine of outputs and item rows / temperature; 0: dot product
    times: bool = False  # the events' timestamps feed the time buckets in training, validation and test (`hugerec train`)
    ranking_weight: float = 0.0  # > 0: training adds this x the ranking head's candidate cross entropy (0: the head stays untrained)
    ranking_negatives: int = DEFAULT_RANKING_NEGATIVES  # uniformly drawn negatives per window of that cross entropy

    def __post_init__(self) -> None:
        super().__post_init__()
        self.options()  # HSTUOptions' checks, now
        if not isinstance(self.times, bool):
            raise ValueError(f"HSTUConfig: times must be true or false, got {self.times!r}")
        check_ranking(self.ranking_weight, self.ranking_negatives, "HSTUConfig")

    @property
    def ranking_head_trained(self) -> bool:
        """Whether training fits the ranking head of cached candidate scoring (ranking_weight > 0)."""
        return self.ranking_weight > 0

    def options(self) -> HSTUOptions:
        return HSTUOptions(self.attention_dim, self.time_buckets, self.temperature)


@dataclass(frozen=True)
class RankingBatch:
    """The ranking head's training inputs of one step (`HSTU.forward_ranked`): windows [B, W] (left-padded,
    W <= max_len, >= 2 items each; the last item is the positive, the others the history), negatives
    [B, M] item ids, times [B, W] seconds of the windows' items (None without times)."""

    windows: torch.Tensor
    negatives: torch.Tensor
    times: torch.Tensor | None = None


def ranking_cross_entropy(logits: torch.Tensor, target: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of column 0 (the target [B, 1]) of logits [B, 1 + M] against the negatives [B, M];
    a negative equal to the target is no negative (masked)."""
    hit = negatives == target
    logits = torch.cat([logits[:, :1], logits[:, 1:].masked_fill(hit, float("-inf"))], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.int64, device=logits.device))


def _ranked_ids(
    seq: torch.Tensor, candidates: torch.Tensor | None, ranking: RankingBatch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """forward_ranked's candidate ids: (the step's candidates [M] (empty when None), the ranking histories' items
    [N'] row-major, the ranked [B, 1 + M'] (each window's last item, then its negatives), all three as one [M + N'
    + B (1 + M')] tensor: what the one item lookup takes behind the sequence)."""
    history, target = ranking.windows[:, :-1], ranking.windows[:, -1:]
    ranked = torch.cat([target, ranking.negatives], dim=1)  # [B, 1 + M']
    hist_ids = history[history != PAD]  # [N']
    main = candidates if candidates is not None else seq.new_empty(0)
    return main, hist_ids, ranked, torch.cat([main, hist_ids, ranked.reshape(-1)])


def time_buckets(delta: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """int64 bucket of each time difference (seconds): floor(ln(max(|dt|, 1)) / 0.301), capped at num_buckets."""
    return (torch.log(delta.abs().clamp(min=1).double()) / _TIME_LOG_BASE).long().clamp(max=num_buckets)


class HSTULayer(nn.Module):
    def __init__(self, dim: int, heads: int, attention_dim: int, max_len: int, num_buckets: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dq, self.dv = heads, attention_dim, dim // heads
        self.norm_in = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 2 * heads * self.dv + 2 * heads * self.dq)
        self.norm_attn = nn.LayerNorm(heads * self.dv)
        self.out = nn.Linear(heads * self.dv, dim)
        self.drop = nn.Dropout(dropout)
        self.pos_bias = nn.Parameter(torch.zeros(max_len))  # by relative distance i - j = 0..max_len - 1
        self.time_bias = nn.Parameter(torch.zeros(num_buckets + 1))
        self.scale = 1.0 / max_len
        self.num_buckets = num_buckets

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., D] -> u [..., H*Dv], v [..., H, Dv], q [..., H, Dq], k [..., H, Dq]."""
        hv, hq = self.heads * self.dv, self.heads * self.dq
        u, v, q, k = F.silu(self.uvqk(self.norm_in(x))).split([hv, hv, hq, hq], dim=-1)
        lead = x.shape[:-1]
        return u, v.reshape(*lead, self.heads, self.dv), q.reshape(*lead, self.heads, self.dq), k.reshape(*lead, self.heads, self.dq)

    def bias(self, distance: torch.Tensor, buckets: torch.Tensor | None) -> torch.Tensor:
        b = table_gather(self.pos_bias, distance.clamp(0, len(self.pos_bias) - 1))
        return b if buckets is None else b + table_gather(self.time_bias, buckets)

    def jagged_bias(self, offsets: torch.Tensor, buckets: torch.Tensor | None) -> torch.Tensor:
        """[P] bias of every causal pair of the jagged sequences (the position part from the distances i - j
        themselves, no [P] index); buckets [P] per pair or None."""
        b = relative_bias(self.pos_bias, offsets)
        return b if buckets is None else b + table_gather(self.time_bias, buckets)

    def finish(self, x: torch.Tensor, u: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x + W2 dropout(u * LayerNorm(attn)); attn [..., H, Dv]."""
        return x + self.out(self.drop(u * self.norm_attn(attn.flatten(-2))))

    def forward_jagged(self, x: torch.Tensor, offsets: torch.Tensor, buckets: torch.Tensor | None) -> torch.Tensor:
        """x [N, D], offsets [B + 1], buckets [P] per causal pair (or None) -> [N, D]."""
        u, v, q, k = self.project(x)
        return self.finish(x, u, jagged_causal_attention(q, k, v, self.jagged_bias(offsets, buckets), offsets, self.scale))

    def forward_padded(self, x: torch.Tensor, valid: torch.Tensor, distance: torch.Tensor, buckets: torch.Tensor | None) -> torch.Tensor:
        """x [B, L, D], valid [B, L], distance [L, L], buckets [B, L, L] -> [B, L, D]."""
        u, v, q, k = self.project(x)
        bias = self.bias(distance, buckets).expand(x.shape[0], -1, -1)  # [B, L, L]
        return self.finish(x, u, padded_causal_attention(q, k, v, bias, valid, self.scale))


class HSTU(nn.Module):
    objective = Objective.NEXT
    uses_times = True  # forward / query take the items' timestamps (the sequential family passes them with times=True)
    # A run trains the time bias only with times and the ranking head only with a ranking loss: shard() lets
    # DistributedDataParallel find the parameters a step left without a gradient.
    optional_parameters = True

    def __init__(
        self, cfg: SequenceConfig, optimizer: Optimizer = DEFAULT_OPTIMIZER, options: HSTUOptions | None = None, layout: Layout = Layout.JAGGED
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.options = options = options or HSTUOptions()
        self.layout = layout
        self.lookup = ItemLookup(cfg, optimizer)
        self.positions = nn.Embedding(cfg.max_len, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        dq = options.attention_dim or cfg.dim // cfg.num_heads
        self.layers = nn.ModuleList(
            HSTULayer(cfg.dim, cfg.num_heads, dq, cfg.max_len, options.time_buckets, cfg.dropout) for _ in range(cfg.num_layers)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.rank = nn.Linear(cfg.dim, 1)  # the ranking head of cached candidate scoring
        self.scale = math.sqrt(cfg.dim)

    @property
    def blocks(self) -> list[HSTULayer]:
        return [cast(HSTULayer, layer) for layer in self.layers]

    # -- the SequenceModel protocol -------------------------------------------------------------------
    def forward(
        self, seq: torch.Tensor, candidates: torch.Tensor | None = None, times: torch.Tensor | None = None,
        ranking: RankingBatch | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """seq [B, L] (L <= max_len, left-padded), candidates [M], times [B, L] seconds (optional)
        -> ([B, L, D] hidden states, 0 at padding; [M, D] candidate rows). With `ranking`: forward_ranked's
        (hidden, candidate rows, ranking loss). The training step takes this entry, not forward_ranked: a
        sharded model's DistributedDataParallel averages the gradients of what its forward computed only."""
        if ranking is not None:
            return self.forward_ranked(seq, candidates, times, ranking)
        states, cand = self.encode(seq, candidates, times, key=(seq, candidates))
        return self._hidden(seq, states), self.item_output(cand)

    def _hidden(self, seq: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """encode's states -> forward's [B, L, D] outputs, 0 at padding."""
        valid = seq != PAD
        match self.layout:
            case Layout.JAGGED:  # rows scattered by flat index: a boolean-mask index_put's backward sorts
                flat = valid.reshape(-1).nonzero().squeeze(1)  # [N] rows of [B * L] holding an item
                return states.new_zeros(seq.numel(), self.cfg.dim).index_copy(0, flat, self.output(states)).view(*seq.shape, -1)
            case Layout.PADDED:
                return self.output(states) * valid[..., None].to(states.dtype)

    def query(self, history: torch.Tensor, times: torch.Tensor | None = None) -> torch.Tensor:
        """[B, L] histories -> [B, D]: the vector whose dot product with item_vectors scores the next item."""
        return last_position(self(history, None, times)[0])

    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.item_output(self.lookup.candidates(ids))

    def output(self, states: torch.Tensor) -> torch.Tensor:
        t = self.options.temperature
        return F.normalize(states, dim=-1) / t if t > 0 else states

    def item_output(self, rows: torch.Tensor) -> torch.Tensor:
        return F.normalize(rows, dim=-1) if self.options.temperature > 0 else rows

    def lookup_features(self, seq: torch.Tensor, candidates: torch.Tensor | None, ranking: RankingBatch | None = None) -> SparseFeatures:
        """The item lookup that forward(seq, candidates) makes (ranking: forward_ranked(seq, candidates, times,
        ranking)), built ahead of the step: the training pipeline's worker stages it (dynamic-table remap,
        disk-tier prefetch) and the forward of these same tensors takes the staged rows. JAGGED looks up the
        items of seq without its padding, PADDED all of seq; the ranking pass's histories and candidates ride
        behind the candidates."""
        ids: torch.Tensor | None = candidates
        key: tuple[object, ...] = (seq, candidates)
        if ranking is not None:
            ids, key = _ranked_ids(seq, candidates, ranking)[3], (seq, candidates, ranking)
        looked_up = seq[seq != PAD][None] if self.layout is Layout.JAGGED else seq  # [1, N] or [B, L]
        return self.lookup.features(looked_up, ids, key)

    # -- encoding -------------------------------------------------------------------------------------
    def encode(
        self,
        seq: torch.Tensor,
        candidates: torch.Tensor | None,
        times: torch.Tensor | None,
        slot: int = 0,
        key: tuple[object, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Final states (LayerNorm'd) of the items of seq [B, L] and the candidates' rows [M, D].

        JAGGED: states [N, D] of the N items in row-major order (padding is never looked up or computed);
        PADDED: states [B, L, D]. Inputs are the item rows scaled by sqrt(D) plus learned positions
        counted back from the most recent item (`slot` more slots back: candidate scoring puts the
        candidate in the last one), then dropout. `key`: the inputs whose lookup `lookup_features`
        prepared (the training pipeline stages it), so the item lookup takes the staged rows.
        """
        if seq.shape[1] + slot > self.cfg.max_len:
            raise ValueError(f"HSTU: sequences of {seq.shape[1]} items exceed max_len {self.cfg.max_len - slot} (keep the last max_len)")
        if times is not None and times.shape != seq.shape:
            raise ValueError(f"HSTU: times must have the shape of seq {tuple(seq.shape)}, got {tuple(times.shape)}")
        valid = seq != PAD  # [B, L]; left-padded, so a row's items are contiguous and in order
        first = self.cfg.max_len - slot - seq.shape[1]  # the position of column 0
        match self.layout:
            case Layout.JAGGED:
                rows, cand = self.lookup(seq[valid][None], candidates, key)  # [1, N, D]
                column = valid.nonzero()[:, 1]  # [N]
                x = self.drop(rows[0] * self.scale + self.positions.weight[first + column])
                lengths = valid.sum(dim=1)
                offsets = torch.zeros(len(seq) + 1, dtype=torch.int64)
                torch.cumsum(lengths, dim=0, out=offsets[1:])
                buckets = None  # [P] per causal pair, from the items' times in one pass
                if times is not None:
                    buckets = log_time_buckets(times[valid], offsets, _TIME_LOG_BASE, self.options.time_buckets)
                for layer in self.blocks:
                    x = layer.forward_jagged(x, offsets, buckets)
                return self.norm(x), cand
            case Layout.PADDED:
                rows, cand = self.lookup(seq, candidates, key)
                x = self.drop(rows * self.scale + self.positions.weight[first : first + seq.shape[1]][None])
                idx = torch.arange(seq.shape[1])
                distance = idx[:, None] - idx[None, :]  # [L, L]: the same i - j inside a left-padded row
                buckets = None if times is None else time_buckets(times[:, :, None] - times[:, None, :], self.options.time_buckets)
                for layer in self.blocks:
                    x = layer.forward_padded(x, valid, distance, buckets)
                return self.norm(x), cand

    # -- cached candidate scoring (M-FALCON) ----------------------------------------------------------
    def candidate_scores(
        self,
        history: torch.Tensor,
        candidates: torch.Tensor,
        times: torch.Tensor | None = None,
        now: torch.Tensor | None = None,
        micro_batch: int = 256,
    ) -> torch.Tensor:
        """history [B, Lh] (left-padded, Lh <= max_len - 1: the candidate takes the next slot), candidates [B, C]
        -> [B, C] ranking-head scores. times [B, Lh] / now [B]: the history's and the request's seconds
        (both or neither). The history's keys and values are computed once per layer; candidates go
        through in micro-batches of `micro_batch` columns, each attending to the history and itself."""
        b = self._check_candidates(history, candidates, times, now)
        if micro_batch < 1:
            raise ValueError(f"HSTU.candidate_scores: micro_batch must be >= 1, got {micro_batch}")
        rows, cand_rows = self.lookup(history[history != PAD][None], candidates.reshape(-1))  # [1, N, D], [B*C, D]
        return self._candidate_logits(history, rows[0], cand_rows.view(b, -1, self.cfg.dim), times, now, micro_batch)  # [B*C, D] -> [B, C, D]

    def _check_candidates(self, history: torch.Tensor, candidates: torch.Tensor, times: torch.Tensor | None, now: torch.Tensor | None) -> int:
        b, lh = history.shape
        if lh > self.cfg.max_len - 1:
            raise ValueError(f"HSTU.candidate_scores: histories of {lh} items leave no slot for the candidate (max_len {self.cfg.max_len})")
        if candidates.dim() != 2 or len(candidates) != b:
            raise ValueError(f"HSTU.candidate_scores: candidates must be [B, C] = [{b}, C], got {tuple(candidates.shape)}")
        if (times is None) != (now is None):
            raise ValueError("HSTU.candidate_scores: give both times and now, or neither")
        return b

    def _candidate_logits(
        self,
        history: torch.Tensor,
        rows: torch.Tensor,
        cand_rows: torch.Tensor,
        times: torch.Tensor | None,
        now: torch.Tensor | None,
        micro_batch: int,
    ) -> torch.Tensor:
        """candidate_scores from looked-up rows: rows [N, D] of history's N items (row-major), cand_rows [B, C, D]."""
        b, lh = history.shape
        valid = history != PAD
        # the history sits one slot further back than on its own: positions end at max_len - 2
        first = self.cfg.max_len - 1 - lh
        xj = self.drop(rows * self.scale + self.positions.weight[first + valid.nonzero()[:, 1]])  # [N, D]
        lengths = valid.sum(dim=1)
        offsets = torch.zeros(b + 1, dtype=torch.int64)
        torch.cumsum(lengths, dim=0, out=offsets[1:])
        hist_buckets = None
        cand_buckets = self_bucket = None
        if times is not None and now is not None:
            hist_buckets = log_time_buckets(times[valid], offsets, _TIME_LOG_BASE, self.options.time_buckets)
            cand_buckets = time_buckets(now[:, None] - times, self.options.time_buckets)  # [B, Lh]
            self_bucket = time_buckets(torch.zeros(1, dtype=torch.int64), self.options.time_buckets)
        # the candidate slot's distance to history column j: Lh - j (the history ends one slot before it)
        cand_distance = (lh - torch.arange(lh))[None, :].expand(b, -1)  # [B, Lh]
        self_distance = torch.zeros(1, dtype=torch.int64)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: padded keys, values [B, Lh, H, D*]
        for layer in self.blocks:
            u, v, q, k = layer.project(xj)
            kp = k.new_zeros(b, lh, layer.heads, layer.dq)
            vp = v.new_zeros(b, lh, layer.heads, layer.dv)
            kp[valid], vp[valid] = k, v
            cache.append((kp, vp))
            attn = jagged_causal_attention(q, k, v, layer.jagged_bias(offsets, hist_buckets), offsets, layer.scale)
            xj = layer.finish(xj, u, attn)
        out = []
        pos_c = self.positions.weight[self.cfg.max_len - 1]
        for c0 in range(0, cand_rows.shape[1], micro_batch):
            xc = self.drop(cand_rows[:, c0 : c0 + micro_batch] * self.scale + pos_c)  # [B, m, D]
            for layer, (kp, vp) in zip(self.blocks, cache, strict=True):
                u, v, q, k = layer.project(xc)  # q, k [B, m, H, Dq]
                to_hist = torch.einsum("bmhd,bjhd->bmhj", q, kp) + layer.bias(cand_distance, cand_buckets)[:, None, None, :]
                a_hist = F.silu(to_hist) * layer.scale * valid[:, None, None, :].to(q.dtype)  # [B, m, H, Lh]
                a_self = F.silu((q * k).sum(-1) + layer.bias(self_distance, self_bucket)) * layer.scale  # [B, m, H]
                attn = torch.einsum("bmhj,bjhd->bmhd", a_hist, vp) + a_self[..., None] * v
                xc = layer.finish(xc, u, attn)
            out.append(self.rank(self.norm(xc)).squeeze(-1))  # [B, m]
        return torch.cat(out, dim=1) if out else cand_rows.new_zeros(b, 0)

    def candidate_scores_uncached(
        self, history: torch.Tensor, candidates: torch.Tensor, times: torch.Tensor | None = None, now: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The same scores from full forwards: one [B*C, Lh + 1] batch, each history followed by one candidate."""
        b, c = candidates.shape
        seq = torch.cat([history.repeat_interleave(c, dim=0), candidates.reshape(-1, 1)], dim=1)  # [B*C, Lh + 1]
        t = None
        if times is not None and now is not None:
            t = torch.cat([times.repeat_interleave(c, dim=0), now.repeat_interleave(c)[:, None]], dim=1)
        states, _ = self.encode(seq, None, t)
        match self.layout:
            case Layout.JAGGED:
                last = states[(seq != PAD).sum(dim=1).cumsum(dim=0) - 1]  # [B*C, D]: each row's last item, the candidate
            case Layout.PADDED:
                last = states[:, -1]
        return self.rank(last).squeeze(-1).view(b, c)

    def candidate_ranking_loss(self, windows: torch.Tensor, negatives: torch.Tensor, times: torch.Tensor | None = None) -> torch.Tensor:
        """Cross entropy of each window's last item against negatives [B, M], all scored by the ranking head
        against the window's other items: windows [B, W] (left-padded, W <= max_len, >= 2 items each).
        times [B, W]: the windows' seconds; the candidates sit at the time of the history's latest event
        (times[:, -2]), where the pipeline's Score stage puts them, never at the target's own time."""
        history, target = windows[:, :-1], windows[:, -1:]
        hist_times, now = (None, None) if times is None else (times[:, :-1], times[:, -2])
        logits = self.candidate_scores(history, torch.cat([target, negatives], dim=1), hist_times, now)  # [B, 1 + M]
        return ranking_cross_entropy(logits, target, negatives)

    def forward_ranked(
        self, seq: torch.Tensor, candidates: torch.Tensor | None, times: torch.Tensor | None, ranking: RankingBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """forward(seq, candidates, times) and candidate_ranking_loss(ranking.windows, ranking.negatives,
        ranking.times) from one lookup of the item table (one sparse optimizer step per backward): the
        ranking pass's history and candidate ids ride behind `candidates`. Returns (hidden, candidate rows,
        ranking loss)."""
        history, target = ranking.windows[:, :-1], ranking.windows[:, -1:]
        hist_times, now = (None, None) if ranking.times is None else (ranking.times[:, :-1], ranking.times[:, -2])
        main, hist_ids, ranked, ids = _ranked_ids(seq, candidates, ranking)
        b = self._check_candidates(history, ranked, hist_times, now)
        states, rows = self.encode(seq, ids, times, key=(seq, candidates, ranking))
        m, n = len(main), len(hist_ids)
        cand_rows = rows[m + n :].view(b, -1, self.cfg.dim)  # [B * (1 + M), D] -> [B, 1 + M, D]
        logits = self._candidate_logits(history, rows[m : m + n], cand_rows, hist_times, now, micro_batch=ranked.shape[1])
        return self._hidden(seq, states), self.item_output(rows[:m]), ranking_cross_entropy(logits, target, ranking.negatives)
