"""The fused Numba backward == reference (deduplicate, accumulate, update) for every rule and storage dtype."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from hugerec.ops import reference
from hugerec.ops.cpu import sparse_backward
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace

MakeCase = Callable[..., Any]
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


@settings(max_examples=80, deadline=None)
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
    w_got, s_got, w_want, s_want = c.weight.clone(), state.clone(), c.weight.clone(), state.clone()
    workspace = Workspace()
    args = (c.values, c.offsets, c.per_sample_weights, plan, c.dim, c.batch, sequence, grad, rule, lrs, workspace)
    limit = sparse_backward.ACCUMULATE_MAX_BYTES
    if not data.draw(st.booleans(), "accumulate"):  # the occurrence mode, which large batches take
        sparse_backward.ACCUMULATE_MAX_BYTES = 0
    try:
        sparse_backward.sparse_backward(w_got, s_got, *args)
    finally:
        sparse_backward.ACCUMULATE_MAX_BYTES = limit
    reference.sparse_backward(w_want, s_want, *args)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(w_got.float(), w_want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(s_got, s_want, rtol=1e-4, atol=1e-5)
    assert bool((workspace.row_map(c.weight.shape[0]) == -1).all())  # the dedupe map is left clean
    touched = w_want.float().ne(c.weight.float()).any(dim=1) | s_want.ne(state).any(dim=1)
    assert torch.equal(w_got[~touched], c.weight[~touched])  # rows no id hit are not written


@pytest.mark.parametrize("limit", [0, sparse_backward.ACCUMULATE_MAX_BYTES])
def test_duplicates_accumulate_before_the_update(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """Row-wise Adagrad is not linear in g: updating per occurrence would give a different result."""
    monkeypatch.setattr(sparse_backward, "ACCUMULATE_MAX_BYTES", limit)
    rule = UpdateRule(RuleKind.ROWWISE_ADAGRAD, lr=1.0, eps=0.0)
    weight, state = torch.zeros(3, 4), torch.zeros(3, 1)
    values = torch.tensor([1, 1, 1])  # row 1 three times, in two bags
    offsets = torch.tensor([0, 2, 3])
    plan = torch.tensor([[0, 0, 0, 3, 0, 0, 0]])
    grad = torch.ones(2, 4)
    lrs = torch.tensor([1.0], dtype=torch.float64)
    sparse_backward.sparse_backward(
        weight, state, values, offsets, None, plan, 4, 2, False, grad, rule, lrs, Workspace()
    )
    # g = 3 per coordinate, s = mean(g^2) = 9, w = -1 * 3 / sqrt(9) = -1
    torch.testing.assert_close(state[1], torch.tensor([9.0]))
    torch.testing.assert_close(weight[1], -torch.ones(4))
    assert not weight[[0, 2]].any()


@pytest.mark.parametrize("sequence", [False, True])
def test_modes_agree_bit_for_bit_on_a_large_zipf_batch(monkeypatch: pytest.MonkeyPatch, sequence: bool) -> None:
    """Accumulate and occurrence modes sum each row's gradients in the same (id) order: identical rows,
    on a batch long enough for the prefetch distances and for many ids per hot row."""
    gen = torch.Generator().manual_seed(3)
    batch, dim, num_rows = 3000, 16, 5000
    values = (torch.rand(2 * batch, generator=gen) ** 4 * num_rows).long()  # skewed: hot rows repeat
    offsets = torch.arange(2 * batch + 1)  # two features, one id per bag
    plan = torch.tensor([[0, 0, 0, num_rows, 0, 0, 0], [1, 1, num_rows, num_rows, dim, 0, 0]])
    if sequence:
        plan[1, 4] = batch
    grad = torch.randn((2 * batch, dim) if sequence else (batch, 2 * dim), generator=gen)
    rule = UpdateRule(RuleKind.ROWWISE_ADAGRAD, lr=0.1, eps=1e-8)
    lrs = torch.tensor([0.1, 0.2], dtype=torch.float64)
    results = []
    for limit in (0, sparse_backward.ACCUMULATE_MAX_BYTES):
        monkeypatch.setattr(sparse_backward, "ACCUMULATE_MAX_BYTES", limit)
        weight = torch.randn(2 * num_rows, dim, generator=torch.Generator().manual_seed(1))
        state = torch.zeros(2 * num_rows, 1)
        args = (values, offsets, None, plan, dim, batch, sequence, grad, rule, lrs, Workspace())
        sparse_backward.sparse_backward(weight, state, *args)
        results.append((weight, state))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    touched = values[:batch].unique().numel() + values[batch:].unique().numel()
    assert results[0][1].count_nonzero() == touched  # sanity: every touched row updated


# Runs every update rule in both modes on a skewed batch and prints a digest of the rows and states.
_DIGEST = """
import hashlib, torch
from hugerec.ops.cpu import sparse_backward
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace
gen = torch.Generator().manual_seed(5)
batch, dim, num_rows = 700, 24, 900
values = (torch.rand(2 * batch, generator=gen) ** 4 * num_rows).long()
offsets = torch.arange(2 * batch + 1)
plan = torch.tensor([[0, 0, 0, num_rows, 0, 0, 0], [1, 1, num_rows, num_rows, dim, 0, 0]])
grad = torch.randn(batch, 2 * dim, generator=gen)
lrs = torch.tensor([0.1, 0.2], dtype=torch.float64)
digest = hashlib.sha256()
for kind in RuleKind:
    rule = UpdateRule(kind, lr=0.1, eps=1e-8, weight_decay=0.01, l1=0.01, l2=0.01, beta=0.1, lr_power=-0.5)
    for dtype in (torch.float32, torch.bfloat16):
        for limit in (0, sparse_backward.ACCUMULATE_MAX_BYTES):
            sparse_backward.ACCUMULATE_MAX_BYTES = limit
            weight = torch.randn(2 * num_rows, dim, generator=torch.Generator().manual_seed(1)).to(dtype)
            state = torch.rand(2 * num_rows, rule.state_width(dim), generator=torch.Generator().manual_seed(2)) + 0.1
            for _ in range(3):
                sparse_backward.sparse_backward(
                    weight, state, values, offsets, None, plan, dim, batch, False, grad, rule, lrs, Workspace()
                )
            digest.update(weight.view(torch.uint8).numpy().tobytes() + state.numpy().tobytes())
print(digest.hexdigest())
"""


@pytest.mark.slow
def test_cached_kernels_update_bit_for_bit_like_freshly_compiled_ones(tmp_path: Path) -> None:
    """The first process compiles the kernels and writes Numba's cache, the second loads them from it: both
    must update every rule's rows identically, or a killed run resumed in a new process would not continue
    bit for bit (fastmath's "reassoc" broke this: the two compile paths reordered sums differently)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _DIGEST], env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr
        runs.append(proc.stdout.strip())
        assert any(p.suffix == ".nbc" for p in (tmp_path / "numba-cache").rglob("*"))  # the second run loaded these
    assert runs[0] == runs[1]
