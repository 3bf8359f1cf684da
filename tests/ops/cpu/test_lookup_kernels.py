"""Numba lookups == the torch reference on random problems (empty bags, B = 1, duplicates, -1, last row)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from hugerec.ops import reference
from hugerec.ops.cpu import lookup_kernels

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MakeCase = Callable[..., Any]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_pooled_lookup_matches_reference(make_case: MakeCase, data: st.DataObject, dtype: torch.dtype) -> None:
    c = make_case(data, dtype)
    got = torch.full((c.batch, c.columns), 7.0)  # columns no plan line owns must stay untouched
    want = got.clone()
    assert lookup_kernels.pooled_lookup(c.weight, c.values, c.offsets, c.per_sample_weights, c.plan, c.dim, got) == 0
    assert reference.pooled_lookup(c.weight, c.values, c.offsets, c.per_sample_weights, c.plan, c.dim, want) == 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_sequence_lookup_matches_reference(make_case: MakeCase, data: st.DataObject, dtype: torch.dtype) -> None:
    c = make_case(data, dtype)
    got = torch.full((c.sequence_rows, c.dim), 7.0)
    want = torch.full((c.sequence_rows, c.dim), -7.0)
    assert lookup_kernels.sequence_lookup(c.weight, c.values, c.offsets, c.sequence_plan, c.dim, c.batch, got) == 0
    assert reference.sequence_lookup(c.weight, c.values, c.offsets, c.sequence_plan, c.dim, c.batch, want) == 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_invalid_ids_are_counted_and_skipped(make_case: MakeCase, data: st.DataObject) -> None:
    c = make_case(data, invalid=True)
    got, want = torch.zeros(c.batch, c.columns), torch.zeros(c.batch, c.columns)
    n_got = lookup_kernels.pooled_lookup(c.weight, c.values, c.offsets, c.per_sample_weights, c.plan, c.dim, got)
    n_want = reference.pooled_lookup(c.weight, c.values, c.offsets, c.per_sample_weights, c.plan, c.dim, want)
    assert n_got == n_want
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    seq_got, seq_want = torch.zeros(c.sequence_rows, c.dim), torch.zeros(c.sequence_rows, c.dim)
    assert lookup_kernels.sequence_lookup(c.weight, c.values, c.offsets, c.sequence_plan, c.dim, c.batch, seq_got) == n_want
    reference.sequence_lookup(c.weight, c.values, c.offsets, c.sequence_plan, c.dim, c.batch, seq_want)
    torch.testing.assert_close(seq_got, seq_want, rtol=0, atol=0)


def test_mean_counts_only_ids_with_a_row() -> None:
    weight = torch.arange(8.0).view(2, 4)  # row 0 = [0, 1, 2, 3], row 1 = [4, 5, 6, 7]
    values = torch.tensor([1, -1, 1, -1])
    offsets = torch.tensor([0, 3, 4])  # B = 2: bags [1, -1, 1] and [-1]
    plan = torch.tensor([[0, 0, 0, 2, 0, 1, 1]])  # MEAN, MISSING_OK
    out = torch.full((2, 4), 9.0)
    assert lookup_kernels.pooled_lookup(weight, values, offsets, None, plan, 4, out) == 0
    torch.testing.assert_close(out, torch.tensor([[4.0, 5, 6, 7], [0, 0, 0, 0]]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_storage_dtypes_read_exactly(dtype: torch.dtype) -> None:
    weight = torch.randn(5, 16).to(dtype)
    values = torch.tensor([4, 0, 2])
    offsets = torch.tensor([0, 3])
    out = torch.zeros(3, 16)
    lookup_kernels.sequence_lookup(weight, values, offsets, torch.tensor([[0, 0, 0, 5, 0, 0, 0]]), 16, 1, out)
    assert torch.equal(out, weight[values].float())


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=30), st.sampled_from([torch.int32, torch.int64]))
def test_bag_offsets(lengths: list[int], dtype: torch.dtype) -> None:
    got, want = torch.full((len(lengths) + 1,), -1), torch.full((len(lengths) + 1,), -2)
    lookup_kernels.bag_offsets(torch.tensor(lengths, dtype=dtype), got)
    reference.bag_offsets(torch.tensor(lengths, dtype=dtype), want)
    assert got.tolist() == want.tolist() == [0, *itertools.accumulate(lengths)]
