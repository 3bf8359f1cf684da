"""The fused Triton backward == reference (deduplicate, accumulate, update) for every rule and storage dtype;
fp16 / bf16 rows rounded stochastically stay within one unit in the last place and are unbiased."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from hugerec.ops import reference
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace

from .conftest import DEVICE

sparse_backward = pytest.importorskip("hugerec.ops.gpu.sparse_backward")

MakeCase = Callable[..., Any]
# fp32: the sum order differs from the reference's; fp16 / bf16: stochastic rounding is off by at most one ulp
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def rules() -> st.SearchStrategy[UpdateRule]:
    small = st.floats(0.0, 0.1)
    return st.builds(
        UpdateRule,
        kind=st.sampled_from(list(RuleKind)),
        lr=st.floats(0.01, 0.5),
        eps=st.sampled_from([1e-8, 1e-3]),
        beta1=st.floats(0.0, 0.95),
        beta2=st.floats(0.5, 0.999),
        weight_decay=st.one_of(st.just(0.0), small),
        l1=small,
        l2=small,
        beta=small,
        lr_power=st.sampled_from([-0.5, -0.3, 0.0]),
    )


@settings(max_examples=40, deadline=None)
@given(
    data=st.data(),
    rule=rules(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    sequence=st.booleans(),
)
def test_sparse_backward_matches_reference(
    make_case: MakeCase, data: st.DataObject, rule: UpdateRule, dtype: torch.dtype, sequence: bool
) -> None:
    c = make_case(data, dtype, invalid=data.draw(st.booleans(), "invalid"))
    plan = c.sequence_plan if sequence else c.plan
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), "seed"))
    grad = torch.randn((c.sequence_rows, c.dim) if sequence else (c.batch, c.columns), generator=gen)
    state = torch.rand(c.weight.shape[0], rule.state_width(c.dim), generator=gen) + 0.1  # sums, v and n are > 0
    lrs = torch.rand(int(plan[:, 1].max()) + 1, generator=gen, dtype=torch.float64) * 0.5
    # copies: on the CPU (the interpreter) `.to(DEVICE)` would alias the tensors the reference then updates
    w_got, s_got = c.weight.clone().to(DEVICE), state.clone().to(DEVICE)
    w_want, s_want = c.weight.clone(), state.clone()
    psw = None if c.per_sample_weights is None else c.per_sample_weights.to(DEVICE)
    sparse_backward.sparse_backward(
        w_got,
        s_got,
        c.values.to(DEVICE),
        c.offsets.to(DEVICE),
        psw,
        plan,
        c.dim,
        c.batch,
        sequence,
        grad.to(DEVICE),
        rule,
        lrs,
        Workspace(),
    )
    reference.sparse_backward(
        w_want,
        s_want,
        c.values,
        c.offsets,
        c.per_sample_weights,
        plan,
        c.dim,
        c.batch,
        sequence,
        grad,
        rule,
        lrs,
        Workspace(),
    )
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(w_got.cpu().float(), w_want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(s_got.cpu(), s_want, rtol=1e-4, atol=1e-5)
    touched = w_want.float().ne(c.weight.float()).any(dim=1) | s_want.ne(state).any(dim=1)
    assert torch.equal(w_got.cpu()[~touched], c.weight[~touched])  # rows no id hit are not written


def test_duplicates_accumulate_before_the_update() -> None:
    """Row-wise Adagrad is not linear in g: updating per occurrence would give a different result."""
    rule = UpdateRule(RuleKind.ROWWISE_ADAGRAD, lr=1.0, eps=0.0)
    weight, state = torch.zeros(3, 4, device=DEVICE), torch.zeros(3, 1, device=DEVICE)
    values = torch.tensor([1, 1, 1], device=DEVICE)  # row 1 three times, in two bags
    offsets = torch.tensor([0, 2, 3], device=DEVICE)
    plan = torch.tensor([[0, 0, 0, 3, 0, 0, 0]])
    grad = torch.ones(2, 4, device=DEVICE)
    lrs = torch.tensor([1.0], dtype=torch.float64)
    sparse_backward.sparse_backward(
        weight, state, values, offsets, None, plan, 4, 2, False, grad, rule, lrs, Workspace()
    )
    torch.testing.assert_close(state[1].cpu(), torch.tensor([9.0]))  # g = 3, s = mean(g^2) = 9
    torch.testing.assert_close(weight[1].cpu(), -torch.ones(4))  # -1 * 3 / sqrt(9)
    assert not weight[[0, 2]].any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_keeps_updates_below_half_an_ulp(dtype: torch.dtype) -> None:
    """SGD steps of 1/8 ulp: round-to-nearest never moves a row of ones, stochastic rounding moves it by
    the fp32 total on average."""
    rows, dim, steps = 8, 16, 16
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10  # just above 1.0
    weight = torch.ones(rows, dim, dtype=dtype, device=DEVICE)
    values = torch.arange(rows, device=DEVICE)
    offsets = torch.arange(rows + 1, device=DEVICE)
    plan = torch.tensor([[0, 0, 0, rows, 0, 0, 0]])
    grad = torch.full((rows, dim), -ulp / 8, device=DEVICE)  # w -= lr * g: +ulp/8 per step
    rule = UpdateRule(RuleKind.SGD, lr=1.0)
    lrs = torch.tensor([1.0], dtype=torch.float64)
    workspace = Workspace()
    for _ in range(steps):
        sparse_backward.sparse_backward(
            weight,
            torch.empty(rows, 0, device=DEVICE),
            values,
            offsets,
            None,
            plan,
            dim,
            rows,
            False,
            grad,
            rule,
            lrs,
            workspace,
        )
    mean_step = (weight.float().mean().item() - 1.0) / steps
    assert abs(mean_step - ulp / 8) < ulp / 8 * 0.25  # 128 values x 16 steps: 25% is about four standard deviations
    nearest = torch.ones(rows, dim, dtype=dtype)
    for _ in range(steps):
        reference.sparse_backward(
            nearest,
            torch.empty(rows, 0),
            values.cpu(),
            offsets.cpu(),
            None,
            plan,
            dim,
            rows,
            False,
            grad.cpu(),
            rule,
            lrs,
            Workspace(),
        )
    assert bool((nearest == 1).all())  # the reference's round-to-nearest loses every step


def test_a_hot_row_sums_many_occurrences() -> None:
    """A row seen by most ids of a large batch: one segment of many tiles."""
    gen = torch.Generator().manual_seed(3)
    batch, dim, num_rows = 160, 8, 20
    values = (torch.rand(batch, generator=gen) ** 6 * num_rows).long()
    offsets = torch.arange(batch + 1)
    plan = torch.tensor([[0, 0, 0, num_rows, 0, 0, 0]])
    grad = torch.randn(batch, dim, generator=gen)
    rule = UpdateRule(RuleKind.ADAGRAD, lr=0.1, eps=1e-8)
    lrs = torch.tensor([0.1], dtype=torch.float64)
    weight = torch.randn(num_rows, dim, generator=gen)
    state = torch.zeros(num_rows, dim)
    got_w, got_s = weight.clone().to(DEVICE), state.clone().to(DEVICE)  # copies, not aliases on the CPU
    sparse_backward.sparse_backward(
        got_w,
        got_s,
        values.to(DEVICE),
        offsets.to(DEVICE),
        None,
        plan,
        dim,
        batch,
        False,
        grad.to(DEVICE),
        rule,
        lrs,
        Workspace(),
    )
    reference.sparse_backward(
        weight, state, values, offsets, None, plan, dim, batch, False, grad, rule, lrs, Workspace()
    )
    torch.testing.assert_close(got_w.cpu(), weight, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got_s.cpu(), state, rtol=1e-4, atol=1e-5)


BLOCKS = (16, 32, 64, 128, 256, 512)  # BLOCK_D of dims up to 512


def test_kernels_compile_for_hopper(hopper: Any) -> None:
    module = "hugerec.ops.gpu.sparse_backward"
    occurrences = {
        "lines": "*i64",
        "values": "*i64",
        "offsets": "*i64",
        "per_sample_weights": "*fp32",
        "rows": "*i64",
        "grad_at": "*i64",
        "scale": "*fp32",
        "tables": "*i32",
        "batch": "i32",
        "grad_stride": "i32",
        "WEIGHTED": "constexpr",
        "SEQUENCE": "constexpr",
        "BLOCK_L": "constexpr",
    }
    update = {
        "sorted_rows": "*i64",
        "order": "*i64",
        "grad_at": "*i64",
        "scale": "*fp32",
        "tables": "*i32",
        "seg_first": "*i64",
        "grad": "*fp32",
        "weight_address": "i64",
        "state": "*fp32",
        "lrs": "*fp32",
        "n": "i32",
        "weight_stride": "i32",
        "state_stride": "i32",
        "dim": "i32",
        **{k: "fp32" for k in ("eps", "beta1", "beta2", "decay", "l1", "l2", "beta", "power")},
        "seed": "i32",
        "KIND": "constexpr",
        "DTYPE": "constexpr",
        "STOCHASTIC": "constexpr",
        "SHORT": "constexpr",
        "BLOCK_S": "constexpr",
        "BLOCK_D": "constexpr",
    }
    hot = {("BLOCK_K" if k == "BLOCK_S" else k): v for k, v in update.items()}  # same order, BLOCK_K for BLOCK_S
    hopper(
        [
            *(
                (module, "_occurrences_kernel", occurrences, {"WEIGHTED": w, "SEQUENCE": s, "BLOCK_L": 4})
                for w, s in ((False, False), (True, False), (False, True))
            ),
            *(  # every rule and dtype at dim 128, every tile shape the launcher picks with two rules
                (module, kernel, signature, {"KIND": k, "DTYPE": d, "STOCHASTIC": True, "SHORT": 8, **c})
                for kernel, signature, shapes in (
                    ("_update_kernel", update, [{"BLOCK_S": max(1, min(32, 2048 // b)), "BLOCK_D": b} for b in BLOCKS]),
                    (
                        "_hot_update_kernel",
                        hot,
                        [{"BLOCK_K": max(1, min(16, 4096 // b)), "BLOCK_D": b} for b in BLOCKS],
                    ),
                )
                for c in shapes
                for k in (range(5) if c["BLOCK_D"] == 128 else (1, 2))
                for d in ((0, 1, 2) if c["BLOCK_D"] == 128 else (0,))
            ),
        ]
    )


@pytest.mark.parametrize("kind", list(RuleKind))
def test_short_and_long_segments_side_by_side(kind: RuleKind) -> None:
    """Segments just under, at and over the short limit, and hot rows of several tiles, in the same programs:
    the side-by-side and one-by-one sums both land on the right rows."""
    short = sparse_backward.SHORT_SEGMENT
    lengths = [1, short - 1, short, short + 1, 2 * short + 3, 1, 40, short]  # occurrences of rows 0..7
    values = torch.cat([torch.full((n,), r) for r, n in enumerate(lengths)])
    values = values[torch.randperm(values.shape[0], generator=torch.Generator().manual_seed(5))]
    batch, dim, num_rows = values.shape[0], 24, 10
    offsets = torch.arange(batch + 1)
    plan = torch.tensor([[0, 0, 0, num_rows, 0, 0, 0]])
    gen = torch.Generator().manual_seed(6)
    grad = torch.randn(batch, dim, generator=gen)
    rule = UpdateRule(kind, lr=0.1, eps=1e-6, beta1=0.9, beta2=0.99, l1=0.01, l2=0.01, beta=0.1, lr_power=-0.5)
    lrs = torch.tensor([0.1], dtype=torch.float64)
    weight = torch.randn(num_rows, dim, generator=gen)
    state = torch.rand(num_rows, rule.state_width(dim), generator=gen) + 0.1
    got_w, got_s = weight.clone().to(DEVICE), state.clone().to(DEVICE)  # copies, not aliases on the CPU
    sparse_backward.sparse_backward(
        got_w, got_s, values.to(DEVICE), offsets.to(DEVICE), None, plan, dim, batch, False, grad.to(DEVICE), rule,
        lrs, Workspace(),
    )  # fmt: skip
    reference.sparse_backward(
        weight, state, values, offsets, None, plan, dim, batch, False, grad, rule, lrs, Workspace()
    )
    torch.testing.assert_close(got_w.cpu(), weight, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got_s.cpu(), state, rtol=1e-4, atol=1e-5)
    assert torch.equal(got_w.cpu()[8:], weight[8:])  # rows no id hit
