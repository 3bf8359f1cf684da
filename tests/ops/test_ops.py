"""The ops' dispatch (hugerec.ops): each op on CPU tensors (the Numba kernels) and under triton_on_cpu (the Triton
kernels, run by Triton's interpreter without CUDA) gives what the plain-torch reference gives on random lookup
problems (invalid ids counted alike); pooled_lookup_groups is the groups' pooled_lookups; triton_applies follows
the context and is reset after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hugerec.ops as ops
from hugerec.ops import reference
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace
from tests.ops.conftest import draw_case

PATHS = ["numba", "triton"]


@contextlib.contextmanager
def _path(name: str) -> Iterator[None]:
    if name == "triton":
        pytest.importorskip("triton")
        with ops.triton_on_cpu():
            yield
    else:
        yield


def test_triton_applies_follows_the_context() -> None:
    t = torch.zeros(1)
    assert not ops.triton_applies(t)
    if ops.HAS_TRITON:
        with ops.triton_on_cpu():
            assert ops.triton_applies(t)
    assert not ops.triton_applies(t)
    with pytest.raises(RuntimeError), ops.triton_on_cpu():
        raise RuntimeError("the context resets on errors too")
    assert not ops.triton_applies(t)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_lookups_equal_the_reference(path: str, data: st.DataObject) -> None:
    case = draw_case(data, invalid=True)
    out = torch.full((case.batch, case.columns + 20), 7.0)
    want = out.clone()
    seq = torch.full((case.sequence_rows, case.dim), 7.0)
    want_seq = seq.clone()
    with _path(path):
        bad = ops.pooled_lookup(
            case.weight, case.values, case.offsets, case.per_sample_weights, case.plan, case.dim, out
        )
        bad_seq = ops.sequence_lookup(
            case.weight, case.values, case.offsets, case.sequence_plan, case.dim, case.batch, seq
        )
    assert bad == reference.pooled_lookup(
        case.weight, case.values, case.offsets, case.per_sample_weights, case.plan, case.dim, want
    )
    assert bad_seq == reference.sequence_lookup(
        case.weight, case.values, case.offsets, case.sequence_plan, case.dim, case.batch, want_seq
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seq, want_seq, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=6, deadline=None)
@given(data=st.data(), kind=st.sampled_from([RuleKind.SGD, RuleKind.ADAGRAD]))
def test_sparse_backward_equals_the_reference(path: str, data: st.DataObject, kind: RuleKind) -> None:
    case = draw_case(data)
    rule = UpdateRule(kind, 0.1, eps=1e-8)
    tables = int(case.plan[:, 1].max()) + 1
    lrs = torch.linspace(0.5, 1.5, tables, dtype=torch.float64)
    grad = torch.randn(case.batch, case.columns, generator=torch.Generator().manual_seed(3))
    weight, want_weight = case.weight.clone(), case.weight.clone()
    state = torch.full((case.weight.shape[0], rule.state_width(case.dim)), 0.1)
    want_state = state.clone()
    args = (case.values, case.offsets, case.per_sample_weights, case.plan, case.dim, case.batch, False, grad, rule, lrs)
    with _path(path):
        ops.sparse_backward(weight, state, *args, Workspace())
    reference.sparse_backward(want_weight, want_state, *args, Workspace())
    torch.testing.assert_close(weight, want_weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
def test_bag_offsets(path: str) -> None:
    lengths = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    out = torch.full((5,), -1, dtype=torch.int64)
    with _path(path):
        ops.bag_offsets(lengths, out)
    assert out.tolist() == [0, 2, 2, 5, 6]
    empty = torch.full((1,), -1, dtype=torch.int64)
    with _path(path):
        ops.bag_offsets(torch.zeros(0, dtype=torch.int64), empty)
    assert empty.tolist() == [0]


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_groups_are_their_pooled_lookups(data: st.DataObject) -> None:
    case = draw_case(data, invalid=True)
    k = data.draw(st.integers(0, len(case.plan)), "split")  # the plan's lines as two groups over the same rows
    out = torch.zeros(case.batch, case.columns + 20)
    want = out.clone()
    bad = ops.pooled_lookup_groups(
        [case.weight, case.weight],
        case.values,
        case.offsets,
        case.per_sample_weights,
        [case.plan[:k], case.plan[k:]],
        [case.dim] * 2,
        out,
    )
    assert bad == ops.pooled_lookup(
        case.weight, case.values, case.offsets, case.per_sample_weights, case.plan, case.dim, want
    )
    torch.testing.assert_close(out, want)
    assert ops.pooled_lookup_groups([], case.values, case.offsets, None, [], [], out) == 0
