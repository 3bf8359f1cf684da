"""Plain-torch definition of every op (embedding lookups and updates, dot interaction, HSTU's jagged attention):
the spec, the test oracle and the CUDA path.

Shapes: weight [R, D_pad] (fp32 / bf16 / fp16 storage, only columns [:D] used), state [R, S] fp32,
values [N] int64 ids, offsets [F*B + 1] int64, per_sample_weights [N] fp32 or None,
plan [F_g, 7] int64 on the CPU (see `hugerec.ops.lookup_plan`), lrs [T_g] float64 per-table learning rates.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from hugerec.ops.lookup_plan import COLUMN, TABLE
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace


class _Occurrences(NamedTuple):
    """The ids of one plan line that have a row."""

    rows: torch.Tensor  # [n] rows in the group buffer
    bags: torch.Tensor  # [n] example index b of each id
    positions: torch.Tensor  # [n] index of each id inside the feature's values
    scale: torch.Tensor  # [n] per_sample_weight / (ids with a row in the bag, for MEAN)
    invalid: int  # ids outside [0, NUM_ROWS) that are not an allowed -1


def _occurrences(
    values: torch.Tensor, offsets: torch.Tensor, per_sample_weights: torch.Tensor | None, line: list[int], batch: int
) -> _Occurrences:
    feature, _, row_offset, num_rows, _, mean, missing_ok = line
    bag_offsets = offsets[feature * batch : (feature + 1) * batch + 1]  # [B + 1]
    start = int(bag_offsets[0])
    ids = values[start : int(bag_offsets[-1])]
    bags = torch.repeat_interleave(torch.arange(batch, device=ids.device), bag_offsets.diff())  # [n_f]
    has_row = (ids >= 0) & (ids < num_rows)
    invalid = int((~has_row & ~((ids == -1) & bool(missing_ok))).sum())
    scale = torch.ones(ids.shape, dtype=torch.float32, device=ids.device)
    if per_sample_weights is not None:
        scale = per_sample_weights[start : start + ids.numel()].float()
    if mean:
        count = torch.zeros(batch, device=ids.device).index_add_(0, bags, has_row.float())  # [B]
        scale = scale / count.clamp(min=1)[bags]
    positions = torch.arange(ids.numel(), device=ids.device)
    return _Occurrences(ids[has_row] + row_offset, bags[has_row], positions[has_row], scale[has_row], invalid)


def bag_offsets(lengths: torch.Tensor, out: torch.Tensor) -> None:
    """out [K + 1] int64 = 0, then the running sum of lengths [K]."""
    out[0] = 0
    torch.cumsum(lengths.to(torch.int64), dim=0, out=out[1:])


def pooled_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    out: torch.Tensor,
) -> int:
    """Writes every plan line's pooled bags into out[:, COLUMN:COLUMN+dim]; returns the invalid-id count."""
    batch, invalid = out.shape[0], 0
    for line in plan.tolist():
        occ = _occurrences(values, offsets, per_sample_weights, line, batch)
        rows = weight[occ.rows, :dim].float() * occ.scale[:, None]  # [n, D]
        pooled = torch.zeros(batch, dim, device=out.device).index_add_(0, occ.bags, rows)
        out[:, line[COLUMN] : line[COLUMN] + dim] = pooled
        invalid += occ.invalid
    return invalid


def sequence_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    out: torch.Tensor,
) -> int:
    """Writes each id's row into out[COLUMN + position] ([N_g, D] fp32; zeros where no row); returns invalid ids."""
    invalid = 0
    for line in plan.tolist():
        occ = _occurrences(values, offsets, None, line, batch_size)
        feature = line[0]
        count = int(offsets[(feature + 1) * batch_size] - offsets[feature * batch_size])
        block = out[line[COLUMN] : line[COLUMN] + count]  # [n_f, D]
        block.zero_()
        block[occ.positions] = weight[occ.rows, :dim].float()
        invalid += occ.invalid
    return invalid


def accumulate_gradients(
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    sequence: bool,
    grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deduplicated row gradients of the plan's ids: (rows [U] sorted, grads [U, D] fp32).

    grad is the output gradient: [B, C] for pooled lookups, [N_g, D] for sequence lookups.
    """
    all_rows, all_grads = [], []
    for line in plan.tolist():
        occ = _occurrences(values, offsets, None if sequence else per_sample_weights, line, batch_size)
        if sequence:
            all_grads.append(grad[line[COLUMN] + occ.positions].float())
        else:
            all_grads.append(grad[occ.bags, line[COLUMN] : line[COLUMN] + dim].float() * occ.scale[:, None])
        all_rows.append(occ.rows)
    rows, inverse = torch.unique(torch.cat(all_rows), return_inverse=True)
    grads = torch.zeros(rows.numel(), dim, device=grad.device).index_add_(0, inverse, torch.cat(all_grads))
    return rows, grads


def sgd_update(
    weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, g: torch.Tensor, rule: UpdateRule, lr: float
) -> torch.Tensor:
    """New fp32 rows [U, D]; w -= lr * g."""
    return weight[rows, : g.shape[1]].float() - lr * g


def adagrad_update(
    weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, g: torch.Tensor, rule: UpdateRule, lr: float
) -> torch.Tensor:
    """s += g^2;  w -= lr * g / (sqrt(s) + eps)."""
    dim = g.shape[1]
    s = state[rows, :dim] + g * g
    state[rows, :dim] = s
    return weight[rows, :dim].float() - lr * g / (s.sqrt() + rule.eps)


def rowwise_adagrad_update(
    weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, g: torch.Tensor, rule: UpdateRule, lr: float
) -> torch.Tensor:
    """s += mean(g^2) over the row;  w -= lr * g / (sqrt(s) + eps)."""
    s = state[rows, 0] + (g * g).mean(dim=1)
    state[rows, 0] = s
    return weight[rows, : g.shape[1]].float() - lr * g / (s.sqrt() + rule.eps)[:, None]


def adam_update(
    weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, g: torch.Tensor, rule: UpdateRule, lr: float
) -> torch.Tensor:
    """torch.optim.SparseAdam on the rows; `lr` already holds the table's bias correction."""
    dim = g.shape[1]
    m = state[rows, :dim]
    v = state[rows, dim : 2 * dim]
    m = m + (g - m) * (1 - rule.beta1)
    v = v + (g * g - v) * (1 - rule.beta2)
    state[rows, :dim] = m
    state[rows, dim : 2 * dim] = v
    return weight[rows, :dim].float() - lr * (m / (v.sqrt() + rule.eps))


def ftrl_update(
    weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, g: torch.Tensor, rule: UpdateRule, lr: float
) -> torch.Tensor:
    """FTRL-Proximal per coordinate, state z [0:D], n [D:2D]."""
    dim = g.shape[1]
    w = weight[rows, :dim].float()
    z, n = state[rows, :dim], state[rows, dim : 2 * dim]
    n_new = n + g * g
    p = -rule.lr_power
    z = z + g - (n_new.pow(p) - n.pow(p)) / lr * w
    state[rows, :dim] = z
    state[rows, dim : 2 * dim] = n_new
    shrunk = (torch.sign(z) * rule.l1 - z) / ((rule.beta + n_new.pow(p)) / lr + 2 * rule.l2)
    return torch.where(z.abs() <= rule.l1, torch.zeros_like(w), shrunk)


def update_rows(
    weight: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor, rule: UpdateRule, lr: float
) -> None:
    """Applies `rule` in place to the unique `rows` [U] with their accumulated `grads` [U, D]."""
    if rule.weight_decay:
        grads = grads + rule.weight_decay * weight[rows, : grads.shape[1]].float()
    match rule.kind:
        case RuleKind.SGD:
            new = sgd_update(weight, state, rows, grads, rule, lr)
        case RuleKind.ADAGRAD:
            new = adagrad_update(weight, state, rows, grads, rule, lr)
        case RuleKind.ROWWISE_ADAGRAD:
            new = rowwise_adagrad_update(weight, state, rows, grads, rule, lr)
        case RuleKind.ADAM:
            new = adam_update(weight, state, rows, grads, rule, lr)
        case RuleKind.FTRL:
            new = ftrl_update(weight, state, rows, grads, rule, lr)
    weight[rows, : grads.shape[1]] = new.to(weight.dtype)


def sparse_backward(
    weight: torch.Tensor,
    state: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    sequence: bool,
    grad: torch.Tensor,
    rule: UpdateRule,
    lrs: torch.Tensor,
    workspace: Workspace,
) -> None:
    """Fused backward: per table, deduplicate, accumulate, and apply `rule` with the table's lr (in place)."""
    for table in plan[:, TABLE].unique().tolist():
        lines = plan[plan[:, TABLE] == table]
        rows, grads = accumulate_gradients(values, offsets, per_sample_weights, lines, dim, batch_size, sequence, grad)
        update_rows(weight, state, rows, grads, rule, float(lrs[table]))


def per_sample_weight_grad(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    plan: torch.Tensor,
    dim: int,
    grad: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Adds d loss / d per_sample_weights of the plan's (pooled, SUM) ids into out [N]: <grad[b, cols], row>."""
    batch = grad.shape[0]
    for line in plan.tolist():
        occ = _occurrences(values, offsets, None, line, batch)
        start = int(offsets[line[0] * batch])
        rows = weight[occ.rows, :dim].float()  # [n, D]
        dots = (grad[occ.bags, line[COLUMN] : line[COLUMN] + dim].float() * rows).sum(dim=1) * occ.scale
        out.index_add_(0, start + occ.positions, dots.to(out.dtype))


def dot_interaction(first: torch.Tensor | None, rest: torch.Tensor, self_interaction: bool) -> torch.Tensor:
    """DLRM's pairwise dots of the vectors [first[b]] + rest[b]: [B, D] / None and [B, F, D] -> [B, P].

    Pairs (i, j) with i < j (i <= j with self_interaction), row-major over the upper triangle.
    """
    x = rest if first is None else torch.cat([first.unsqueeze(1), rest.to(first.dtype)], dim=1)
    n = x.shape[1]
    rows, cols = torch.triu_indices(n, n, offset=0 if self_interaction else 1, device=x.device)
    gram = torch.bmm(x, x.transpose(1, 2))  # [B, N, D] x [B, D, N] -> [B, N, N]
    return gram.flatten(1).index_select(1, rows * n + cols)


def pair_offsets(offsets: torch.Tensor) -> torch.Tensor:
    """[B + 1] int64: where each sequence's causal (query, key) pairs start in a jagged pair array.

    Sequence b of n_b items owns n_b (n_b + 1) / 2 pairs; pair (i, j), j <= i (positions inside the
    sequence), sits at pair_offsets[b] + i (i + 1) / 2 + j.
    """
    n = offsets.diff()
    out = torch.zeros(len(offsets), dtype=torch.int64, device=offsets.device)
    torch.cumsum(n * (n + 1) // 2, dim=0, out=out[1:])
    return out


def pair_coordinates(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([P] sequence, [P] query position i, [P] key position j inside the sequence) of every causal pair, in
    the layout of `pair_offsets`."""
    pairs = pair_offsets(offsets)
    pair_seq = torch.repeat_interleave(torch.arange(len(offsets) - 1, device=offsets.device), pairs.diff())  # [P]
    p = torch.arange(int(pairs[-1]), device=offsets.device) - pairs[:-1][pair_seq]  # pair index inside its sequence
    i = ((torch.sqrt(8.0 * p.double() + 1.0) - 1.0) / 2.0).floor().long()  # p = i (i + 1) / 2 + j, 0 <= j <= i
    return pair_seq, i, p - i * (i + 1) // 2


def log_time_buckets(times: torch.Tensor, offsets: torch.Tensor, width: float, cap: int) -> torch.Tensor:
    """times [N] (the jagged rows' seconds) -> [P] int64 in the layout of `pair_offsets`: each causal pair's
    min(floor(ln(max(|t_i - t_j|, 1)) / width), cap) (HSTU's log-scale time buckets)."""
    seq, i, j = pair_coordinates(offsets)
    first = offsets[:-1][seq]
    delta = times[first + i] - times[first + j]
    return (torch.log(delta.abs().clamp(min=1).double()) / width).long().clamp(max=cap)


def relative_bias(table: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """table [T] at every causal pair's distance i - j, capped at T - 1 -> [P] in the layout of `pair_offsets`
    (HSTU's relative position bias on jagged sequences)."""
    _, i, j = pair_coordinates(offsets)
    return table[(i - j).clamp(max=table.shape[0] - 1)]


def padded_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, valid: torch.Tensor, scale: float
) -> torch.Tensor:
    """HSTU's pointwise attention on padded tensors: out[b, i] = sum_j silu(q_i . k_j + bias[b, i, j]) * scale * v_j
    over keys j that hold an item and, in the sequence's own order, come no later than i.

    q, k [B, L, H, Dq], v [B, L, H, Dv], bias [B, L, L] (shared by the heads), valid [B, L] bool (True = item;
    a sequence's items are contiguous: left- or right-padded). Rows of padding positions are 0.
    """
    length = q.shape[1]
    scores = torch.einsum("bihd,bjhd->bhij", q, k) + bias[:, None]  # [B, H, L, L]
    allowed = valid[:, None, :] & valid[:, :, None] & torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    weights = F.silu(scores) * scale * allowed[:, None].to(q.dtype)
    return torch.einsum("bhij,bjhd->bihd", weights, v)  # [B, L, H, Dv]


def jagged_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor, scale: float
) -> torch.Tensor:
    """The jagged op by way of padding: q, k [N, H, Dq], v [N, H, Dv], bias [P] (the pairs of `pair_offsets`),
    offsets [B + 1] -> [N, H, Dv]. Pads every sequence to the longest (right padding), runs
    `padded_causal_attention` and keeps the item rows."""
    n = offsets.diff()
    batch, length = len(n), int(n.max()) if len(n) else 0
    if q.shape[0] == 0 or length == 0:
        connected = (q.sum() + k.sum() + v.sum() + bias.sum()) * 0.0  # keeps an empty result in the autograd graph
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[2]) + connected
    seq = torch.repeat_interleave(torch.arange(batch, device=q.device), n)  # [N]
    pos = torch.arange(q.shape[0], device=q.device) - offsets[:-1][seq]  # [N] position inside the sequence
    valid = torch.zeros(batch, length, dtype=torch.bool, device=q.device)
    valid[seq, pos] = True

    def pad(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(batch, length, *x.shape[1:])
        out[seq, pos] = x
        return out

    dense_bias = q.new_zeros(batch, length, length)
    pair_seq, i, j = pair_coordinates(offsets)
    dense_bias[pair_seq, i, j] = bias
    return padded_causal_attention(pad(q), pad(k), pad(v), dense_bias, valid, scale)[seq, pos]
