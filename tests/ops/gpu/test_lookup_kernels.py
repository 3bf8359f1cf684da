"""Triton lookups == the torch reference (empty bags, B = 1, duplicates, -1, huge ids, every storage dtype),
several groups of mixed dims in one launch, and the kernels compile for an H100."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from hugerec.ops import reference

from .conftest import DEVICE

lookup_kernels = pytest.importorskip("hugerec.ops.gpu.lookup_kernels")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MakeCase = Callable[..., Any]


def on(t: torch.Tensor | None) -> Any:
    return None if t is None else t.to(DEVICE)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), invalid=st.booleans())
def test_pooled_lookup_matches_reference(
    make_case: MakeCase, data: st.DataObject, dtype: torch.dtype, invalid: bool
) -> None:
    c = make_case(data, dtype, invalid=invalid)
    got = torch.full((c.batch, c.columns), 7.0, device=DEVICE)  # columns no plan line owns stay untouched
    want = torch.full((c.batch, c.columns), 7.0)
    n_got = lookup_kernels.pooled_lookup(
        on(c.weight), on(c.values), on(c.offsets), on(c.per_sample_weights), c.plan, c.dim, got
    )
    n_want = reference.pooled_lookup(c.weight, c.values, c.offsets, c.per_sample_weights, c.plan, c.dim, want)
    assert n_got == n_want
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), invalid=st.booleans())
def test_sequence_lookup_matches_reference(
    make_case: MakeCase, data: st.DataObject, dtype: torch.dtype, invalid: bool
) -> None:
    c = make_case(data, dtype, invalid=invalid)
    got = torch.full((c.sequence_rows, c.dim), 7.0, device=DEVICE)
    want = torch.full((c.sequence_rows, c.dim), -7.0)
    n_got = lookup_kernels.sequence_lookup(
        on(c.weight), on(c.values), on(c.offsets), c.sequence_plan, c.dim, c.batch, got
    )
    n_want = reference.sequence_lookup(c.weight, c.values, c.offsets, c.sequence_plan, c.dim, c.batch, want)
    assert n_got == n_want
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_groups_of_mixed_dims_share_one_launch(make_case: MakeCase, data: st.DataObject) -> None:
    """Two table groups (their own buffers and dims) written side by side into one output."""
    first = make_case(data)
    second = make_case(data)
    # the second case's features and columns after the first's (same batch size: draw until equal)
    if first.batch != second.batch:
        return
    num_first = (first.offsets.shape[0] - 1) // first.batch
    values = torch.cat([first.values, second.values])
    offsets = torch.cat([first.offsets, second.offsets[1:] + first.offsets[-1]])
    plan2 = second.plan.clone()
    plan2[:, 0] += num_first
    plan2[:, 4] += first.columns + first.dim * first.plan.shape[0]
    columns = int(plan2[:, 4].max()) + second.dim
    psw = None
    got = torch.zeros(first.batch, columns, device=DEVICE)
    want = torch.zeros(first.batch, columns)
    invalid = lookup_kernels.pooled_lookup_groups(
        [on(first.weight), on(second.weight)],
        on(values),
        on(offsets),
        psw,
        [first.plan, plan2],
        [first.dim, second.dim],
        got,
    )
    assert int(invalid.item()) == 0
    reference.pooled_lookup(first.weight, values, offsets, psw, first.plan, first.dim, want)
    reference.pooled_lookup(second.weight, values, offsets, psw, plan2, second.dim, want)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_huge_ids_are_counted_not_read() -> None:
    weight = torch.randn(4, 16, device=DEVICE)
    values = torch.tensor([2**62, -(2**62), 3, 2**31 + 1], device=DEVICE)
    offsets = torch.tensor([0, 4], device=DEVICE)
    plan = torch.tensor([[0, 0, 0, 4, 0, 0, 0]])
    out = torch.zeros(1, 16, device=DEVICE)
    assert lookup_kernels.pooled_lookup(weight, values, offsets, None, plan, 16, out) == 3
    torch.testing.assert_close(out, weight[3:4])


def test_wide_rows_are_read_in_chunks() -> None:
    """Dims above MAX_BLOCK_D take several column chunks."""
    dim = lookup_kernels.MAX_BLOCK_D + 40
    weight = torch.randn(6, dim, device=DEVICE)
    values = torch.tensor([1, 5, 5, 0], device=DEVICE)
    offsets = torch.tensor([0, 3, 4], device=DEVICE)
    plan = torch.tensor([[0, 0, 0, 6, 0, 1, 0]])
    out = torch.zeros(2, dim, device=DEVICE)
    lookup_kernels.pooled_lookup(weight, values, offsets, None, plan, dim, out)
    torch.testing.assert_close(out.cpu(), torch.stack([weight[[1, 5, 5]].mean(0), weight[0]]).cpu())


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=40), st.sampled_from([torch.int32, torch.int64]))
def test_bag_offsets(lengths: list[int], dtype: torch.dtype) -> None:
    t = torch.tensor(lengths, dtype=dtype)
    got = torch.empty(len(lengths) + 1, dtype=torch.int64, device=DEVICE)
    want = torch.empty(len(lengths) + 1, dtype=torch.int64)
    lookup_kernels.bag_offsets(t.to(DEVICE), got)
    reference.bag_offsets(t, want)
    assert torch.equal(got.cpu(), want)


def test_kernels_compile_for_hopper(hopper: Any) -> None:
    module = "hugerec.ops.gpu.lookup_kernels"
    pooled = {
        "lines": "*i64",
        "values": "*i64",
        "offsets": "*i64",
        "per_sample_weights": "*fp32",
        "out": "*fp32",
        "invalid": "*i64",
        "batch": "i32",
        "out_stride": "i32",
        "DTYPE": "constexpr",
        "WEIGHTED": "constexpr",
        "BLOCK_L": "constexpr",
        "BLOCK_D": "constexpr",
    }
    sequence = {
        "lines": "*i64",
        "values": "*i64",
        "offsets": "*i64",
        "out": "*fp32",
        "invalid": "*i64",
        "batch": "i32",
        "out_stride": "i32",
        "DTYPE": "constexpr",
        "BLOCK_N": "constexpr",
        "BLOCK_D": "constexpr",
    }
    hopper(
        [
            *(
                (module, "_pooled_kernel", pooled, {"DTYPE": d, "WEIGHTED": w, "BLOCK_L": 4, "BLOCK_D": 32})
                for d in (0, 1, 2)
                for w in (False, True)
            ),
            (module, "_sequence_kernel", sequence, {"DTYPE": 1, "BLOCK_N": 16, "BLOCK_D": 128}),
        ]
    )
