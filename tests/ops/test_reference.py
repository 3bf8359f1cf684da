"""The torch reference against the definitions written out element by element in plain Python."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from hugerec.ops import reference
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace

MakeCase = Callable[..., Any]


def _bags(c: Any, line: list[int]) -> list[list[int]]:
    """Positions in values of each bag of one plan line."""
    f = line[0]
    return [list(range(int(c.offsets[f * c.batch + b]), int(c.offsets[f * c.batch + b + 1]))) for b in range(c.batch)]


def _has_row(v: int, line: list[int]) -> bool:
    return 0 <= v < line[3]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_pooled_lookup_by_definition(make_case: MakeCase, data: st.DataObject) -> None:
    c = make_case(data)
    out = torch.zeros(c.batch, c.columns)
    reference.pooled_lookup(c.weight, c.values, c.offsets, c.per_sample_weights, c.plan, c.dim, out)
    for line in c.plan.tolist():
        for b, positions in enumerate(_bags(c, line)):
            acc, count = [0.0] * c.dim, 0
            for i in positions:
                v = int(c.values[i])
                if not _has_row(v, line):
                    continue
                w = 1.0 if c.per_sample_weights is None else float(c.per_sample_weights[i])
                acc = [a + w * float(c.weight[line[2] + v, k]) for k, a in enumerate(acc)]
                count += 1
            if line[5] and count:
                acc = [a / count for a in acc]
            torch.testing.assert_close(out[b, line[4] : line[4] + c.dim], torch.tensor(acc), rtol=1e-5, atol=1e-5)


def _update_one(
    rule: UpdateRule, w: float, s: list[float], g: float, k: int, dim: int, lr: float, row_mean_sq: float
) -> float:
    """One coordinate of one row, as the optimizer docstrings define it (s: the row's state, updated in place)."""
    match rule.kind:
        case RuleKind.SGD:
            return w - lr * g
        case RuleKind.ADAGRAD:
            s[k] += g * g
            return w - lr * g / (math.sqrt(s[k]) + rule.eps)
        case RuleKind.ROWWISE_ADAGRAD:
            if k == 0:
                s[0] += row_mean_sq
            return w - lr * g / (math.sqrt(s[0]) + rule.eps)
        case RuleKind.ADAM:
            s[k] = rule.beta1 * s[k] + (1 - rule.beta1) * g
            s[dim + k] = rule.beta2 * s[dim + k] + (1 - rule.beta2) * g * g
            return w - lr * s[k] / (math.sqrt(s[dim + k]) + rule.eps)
        case RuleKind.FTRL:
            p = -rule.lr_power
            n_new = s[dim + k] + g * g
            s[k] += g - (n_new**p - s[dim + k] ** p) / lr * w
            s[dim + k] = n_new
            z = s[k]
            if abs(z) <= rule.l1:
                return 0.0
            return (math.copysign(rule.l1, z) - z) / ((rule.beta + n_new**p) / lr + 2 * rule.l2)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(list(RuleKind)),
    weight_decay=st.sampled_from([0.0, 0.05]),
    seed=st.integers(0, 1000),
)
def test_update_rules_by_definition(kind: RuleKind, weight_decay: float, seed: int) -> None:
    rule = UpdateRule(
        kind,
        lr=0.1,
        eps=1e-6,
        beta1=0.9,
        beta2=0.99,
        weight_decay=weight_decay,
        l1=0.01,
        l2=0.02,
        beta=0.5,
        lr_power=-0.5,
    )
    gen = torch.Generator().manual_seed(seed)
    dim = 3
    weight = torch.randn(4, dim, generator=gen)
    state = torch.rand(4, rule.state_width(dim), generator=gen) + 0.1
    rows = torch.tensor([0, 2])
    grads = torch.randn(2, dim, generator=gen)
    want_w, want_s = weight.clone(), state.clone()
    for r, g_row in zip(rows.tolist(), grads.tolist(), strict=True):
        s = want_s[r].tolist()
        g_row = [g + weight_decay * float(weight[r, k]) for k, g in enumerate(g_row)]
        mean_sq = sum(g * g for g in g_row) / dim
        for k in range(dim):
            want_w[r, k] = _update_one(rule, float(weight[r, k]), s, g_row[k], k, dim, 0.1, mean_sq)
        want_s[r] = torch.tensor(s)
    reference.update_rows(weight, state, rows, grads, rule, 0.1)
    torch.testing.assert_close(weight, want_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, want_s, rtol=1e-5, atol=1e-6)


def test_accumulate_gradients_dedupes_and_scales() -> None:
    values = torch.tensor([2, 2, 0, 2])
    offsets = torch.tensor([0, 3, 4])  # bags [2, 2, 0], [2]
    plan = torch.tensor([[0, 0, 0, 3, 0, 1, 0]])  # MEAN
    grad = torch.tensor([[3.0], [5.0]])
    rows, grads = reference.accumulate_gradients(values, offsets, None, plan, 1, 2, False, grad)
    assert rows.tolist() == [0, 2]
    torch.testing.assert_close(grads, torch.tensor([[1.0], [2.0 + 5.0]]))


def test_sparse_backward_uses_each_tables_lr() -> None:
    weight, state = torch.zeros(4, 1), torch.zeros(4, 0)
    values = torch.tensor([0, 0])
    offsets = torch.tensor([0, 1, 2])  # feature 0 -> table 0 (rows 0..1), feature 1 -> table 1 (rows 2..3)
    plan = torch.tensor([[0, 0, 0, 2, 0, 0, 0], [1, 1, 2, 2, 1, 0, 0]])
    grad = torch.ones(1, 2)
    lrs = torch.tensor([0.5, 2.0], dtype=torch.float64)
    reference.sparse_backward(
        weight, state, values, offsets, None, plan, 1, 1, False, grad, UpdateRule(RuleKind.SGD, 1.0), lrs, Workspace()
    )
    assert weight.flatten().tolist() == [-0.5, 0.0, -2.0, 0.0]


def test_per_sample_weight_grad_is_the_dot_product() -> None:
    weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    values = torch.tensor([1, 0, 1])
    offsets = torch.tensor([0, 2, 3])
    plan = torch.tensor([[0, 0, 0, 2, 0, 0, 0]])
    grad = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    out = torch.zeros(3)
    reference.per_sample_weight_grad(weight, values, offsets, plan, 2, grad, out)
    assert out.tolist() == [7.0, 3.0, 8.0]


def test_jagged_causal_attention_by_definition() -> None:
    """The padded reference against one Python loop per (sequence, head, query, key)."""
    gen = torch.Generator().manual_seed(3)
    lengths = [3, 0, 1, 4]
    offsets = torch.tensor([0, 3, 3, 4, 8])
    q, k, v = (torch.randn(8, 2, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(int(reference.pair_offsets(offsets)[-1]), generator=gen, dtype=torch.float64)
    want = torch.zeros(8, 2, 3, dtype=torch.float64)
    p = 0
    for b, n in enumerate(lengths):
        o = int(offsets[b])
        for i in range(n):
            for j in range(i + 1):
                for h in range(2):
                    s = float(q[o + i, h] @ k[o + j, h]) + float(bias[p])
                    want[o + i, h] += s / (1 + math.exp(-s)) * 0.5 * v[o + j, h]
                p += 1
    torch.testing.assert_close(reference.jagged_causal_attention(q, k, v, bias, offsets, 0.5), want)


def test_relative_bias_by_definition() -> None:
    """table[min(i - j, T - 1)] pair by pair, in the pair order of pair_offsets, capped at the table's end."""
    table = torch.tensor([10.0, 11.0, 12.0])
    offsets = torch.tensor([0, 4, 4, 5])  # lengths 4, 0, 1
    want = [table[min(i - j, 2)].item() for n in (4, 0, 1) for i in range(n) for j in range(i + 1)]
    assert reference.relative_bias(table, offsets).tolist() == want
    assert reference.relative_bias(table, torch.tensor([0])).shape == (0,)
