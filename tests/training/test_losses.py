"""Retrieval losses: a hand-computed tiny case, a plain-torch reference (values and gradients), masking, sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.training.losses import (
    BPR,
    Negatives,
    NegativeSampler,
    SampledSoftmax,
    bpr,
    full_softmax,
    matching_columns,
    sampled_softmax,
    sampled_softmax_plain,
)


def test_hand_computed_mixed_with_logq() -> None:
    # B = 2 users, D = 1; positives items 0 and 1, one sampled negative item 2
    q = torch.tensor([[1.0], [2.0]])
    pos = torch.tensor([[1.0], [0.5]])
    neg = torch.tensor([[-1.0]])
    counts = np.array([3.0, 1.0, 0.0, 0.0])  # p_data = [.75, .25, 0, 0]
    sampler = NegativeSampler(SampledSoftmax(Negatives.MIXED, num_negatives=1, alpha=0.0), counts)
    ids = torch.tensor([0, 1, 2])
    log_q = sampler.log_q(ids, batch_size=2)
    # expected counts: B * p_data + M * 1/4
    want_q = [math.log(2 * 0.75 + 0.25), math.log(2 * 0.25 + 0.25), math.log(0.25)]
    assert log_q.tolist() == pytest.approx(want_q, rel=1e-6)
    loss = sampled_softmax(q, pos, ids[:2], neg, ids[2:], log_q, in_batch=True, temperature=0.5)
    # row 0 logits: [1*1, 1*.5, 1*-1] / .5 - log_q ; row 1: [2, 1, -2] / .5 - log_q ; targets 0 and 1
    rows = [[2.0, 1.0, -2.0], [4.0, 2.0, -4.0]]
    want = 0.0
    for r, t in zip(rows, (0, 1), strict=True):
        z = [x - lq for x, lq in zip(r, want_q, strict=True)]
        want += -(z[t] - math.log(sum(math.exp(v) for v in z)))
    assert float(loss) == pytest.approx(want / 2, rel=1e-6)


def _reference(q: torch.Tensor, pos: torch.Tensor, pos_ids: torch.Tensor, neg: torch.Tensor, neg_ids: torch.Tensor,
               log_q: torch.Tensor, in_batch: bool, temperature: float,
               excluded: list[set[int]] | None = None) -> torch.Tensor:
    """Row by row in plain torch: candidates listed explicitly, accidental hits (and row i's
    excluded ids) dropped."""
    b = q.shape[0]
    losses = []
    for i in range(b):
        drop = {int(pos_ids[i])} | (excluded[i] if excluded else set())
        cand = [(pos[i], log_q[i], True)]
        if in_batch:
            cand += [(pos[j], log_q[j], False) for j in range(b) if j != i and int(pos_ids[j]) not in drop]
        cand += [(neg[m], log_q[b + m], False) for m in range(neg.shape[0]) if int(neg_ids[m]) not in drop]
        z = torch.stack([q[i] @ v / temperature - lq for v, lq, _ in cand])
        losses.append(-(z[0] - torch.logsumexp(z, 0)))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("negatives", list(Negatives))
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_exclude", [False, True])
def test_matches_reference_forward_backward(negatives: Negatives, seed: int, with_exclude: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    b, d, items = 6, 4, 9  # few items: duplicates and accidental hits are common
    counts = np.arange(1, items + 1, dtype=np.float64)
    sampler = NegativeSampler(SampledSoftmax(negatives, num_negatives=7, alpha=0.5), counts)
    pos_ids = torch.randint(0, items, (b,), generator=g)
    neg_ids = sampler.sample(b, g)
    log_q = sampler.log_q(torch.cat([pos_ids, neg_ids]), b)
    exclude, excluded = None, None
    if with_exclude:  # each row excludes up to 3 ids (its history), sometimes its own positive (never masked)
        lengths = torch.randint(0, 4, (b,), generator=g)
        ex_ids = torch.randint(0, items, (int(lengths.sum()),), generator=g)
        exclude = (torch.repeat_interleave(torch.arange(b), lengths), ex_ids)
        excluded = [set() for _ in range(b)]
        for r, i in zip(*exclude, strict=True):
            excluded[int(r)].add(int(i))
    # item vectors are a function of the id (a table), as in the towers: copies of an item are equal
    tensors = [torch.randn(b, d, generator=g, requires_grad=True), torch.randn(items, d, generator=g, requires_grad=True)]
    q, table = tensors
    got = sampled_softmax(q, table[pos_ids], pos_ids, table[neg_ids], neg_ids, log_q, sampler.uses_in_batch, 0.3, exclude)
    grads = torch.autograd.grad(got, tensors, allow_unused=True, materialize_grads=True)
    want = _reference(q, table[pos_ids], pos_ids, table[neg_ids], neg_ids, log_q, sampler.uses_in_batch, 0.3, excluded)
    want_grads = torch.autograd.grad(want, tensors, allow_unused=True, materialize_grads=True)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    for a, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-6)


def test_accidental_hit_is_masked() -> None:
    q = torch.tensor([[1.0, 0.0]])
    pos = torch.tensor([[1.0, 0.0]])
    same = sampled_softmax(q, pos, torch.tensor([3]), pos.clone(), torch.tensor([3]), None, in_batch=False)
    assert float(same) == pytest.approx(0.0, abs=1e-7)  # the only negative is the positive itself


def test_bpr_value_and_masking() -> None:
    q = torch.tensor([[1.0], [1.0]])
    pos, neg = torch.tensor([[2.0], [1.0]]), torch.tensor([[0.0], [1.0]])
    loss = bpr(q, pos, torch.tensor([0, 1]), neg, torch.tensor([2, 1]))
    assert float(loss) == pytest.approx(-math.log(1 / (1 + math.exp(-2.0))))


def test_sampler_distributions_and_errors() -> None:
    counts = np.array([100.0, 0.0, 0.0, 1.0])
    g = torch.Generator().manual_seed(0)
    pop = NegativeSampler(SampledSoftmax(Negatives.POPULARITY, num_negatives=1000, alpha=1.0), counts).sample(8, g)
    assert set(pop.tolist()) <= {0, 3} and (pop == 0).sum() > 900
    uni = NegativeSampler(SampledSoftmax(Negatives.UNIFORM, num_negatives=1000), counts).sample(8, g)
    assert set(uni.tolist()) == {0, 1, 2, 3}
    assert NegativeSampler(SampledSoftmax(Negatives.IN_BATCH), counts).sample(8, g).numel() == 0
    assert NegativeSampler(BPR(), counts).sample(8, g).numel() == 8
    with pytest.raises(ValueError, match="negatives must be one of"):
        SampledSoftmax("random")  # type: ignore[arg-type]  # the string form is what configs give
    with pytest.raises(ValueError, match="alpha"):
        SampledSoftmax(alpha=2.0)
    with pytest.raises(ValueError, match="item_counts"):
        NegativeSampler(SampledSoftmax(), np.zeros(3))


@pytest.mark.parametrize("use_log_q", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_fused_in_batch_matches_the_plain_formulation(use_log_q: bool, seed: int) -> None:
    """The fused in-batch path (distinct candidates weighted by their copies, one addmm, in-place softmax,
    hand-written backward) against the plain torch ops and autograd (every copy a column), at a size
    where accidental hits and repeated positives occur."""
    g = torch.Generator().manual_seed(seed)
    b, m, d, items = 64, 48, 8, 40
    pos_ids, neg_ids = torch.randint(0, items, (b,), generator=g), torch.randint(0, items, (m,), generator=g)
    log_q = torch.randn(items, generator=g)[torch.cat([pos_ids, neg_ids])] if use_log_q else None  # a function of the id
    tensors = [torch.randn(b, d, generator=g, requires_grad=True), torch.randn(items, d, generator=g, requires_grad=True)]
    q, table = tensors
    got = sampled_softmax(q, table[pos_ids], pos_ids, table[neg_ids], neg_ids, log_q, True, 0.2)
    want = sampled_softmax_plain(q, table[pos_ids], pos_ids, table[neg_ids], neg_ids, log_q, True, 0.2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    (got * 3.0).backward()  # a non-unit upstream gradient
    grads = [t.grad.clone() for t in tensors if t.grad is not None]
    for t in tensors:
        t.grad = None
    (want * 3.0).backward()
    for a, t in zip(grads, tensors, strict=True):
        torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.lists(st.integers(0, 8), max_size=30))
def test_matching_columns_are_the_dense_comparison(cand: list[int], ids: list[int]) -> None:
    """The sorted-ids search finds exactly the pairs of the [K, C] comparison, each once."""
    cand_ids, wanted = torch.tensor(cand, dtype=torch.int64), torch.tensor(ids, dtype=torch.int64)
    rows, cols = matching_columns(cand_ids, torch.arange(len(ids)), wanted)
    dense = wanted[:, None] == cand_ids[None, :]
    got = torch.zeros_like(dense)
    got[rows, cols] = True
    assert torch.equal(got, dense)
    assert rows.numel() == int(dense.sum())


@pytest.mark.parametrize("exclude", [None, (torch.tensor([0, 1]), torch.tensor([3, 2]))])
def test_fused_loss_of_a_row_whose_target_probability_underflows(exclude: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """A positive 200 logits below the best candidate: P[i, i] is 0 in fp32, the loss is still the exact
    logsumexp - target (and finite), as the plain formulation computes it."""
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    pos = torch.tensor([[-100.0, 0.0], [0.0, 1.0]], requires_grad=True)
    neg = torch.tensor([[100.0, 0.0], [3.0, 0.0]], requires_grad=True)
    pos_ids, neg_ids = torch.tensor([0, 1]), torch.tensor([2, 3])
    got = sampled_softmax(query, pos, pos_ids, neg, neg_ids, None, True, 1.0, exclude)
    want = sampled_softmax_plain(query, pos, pos_ids, neg, neg_ids, None, True, 1.0, exclude)
    assert torch.isfinite(got) and float(got.detach()) > 100.0
    torch.testing.assert_close(got, want)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 70), num_items=st.integers(1, 40), dim=st.integers(1, 6), block=st.integers(1, 33), seed=st.integers(0, 2**16),
    spread=st.sampled_from([1.0, 60.0]),
)
def test_blocked_full_softmax_is_cross_entropy(n: int, num_items: int, dim: int, block: int, seed: int, spread: float) -> None:
    # blocks of any size (1, not dividing N, larger than N), no rows, one item, and logits wide enough that
    # a target's probability underflows fp32 (spread 60): value and both gradients as F.cross_entropy's
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(n, dim, generator=gen) * spread).requires_grad_()
    w = torch.randn(num_items, dim, generator=gen).requires_grad_()
    t = torch.randint(0, num_items, (n,), generator=gen)
    got = full_softmax(q, w, t, block=block)
    (got * 1.7).backward()
    gq, gw = q.grad, w.grad
    q.grad = w.grad = None
    want = torch.nn.functional.cross_entropy(q @ w.T, t) if n else (q @ w.T).sum() * 0.0
    (want * 1.7).backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gq, q.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gw, w.grad, rtol=1e-4, atol=1e-4)


def test_blocked_full_softmax_without_gradient_and_bad_shapes() -> None:
    q, w, t = torch.randn(5, 3), torch.randn(4, 3), torch.tensor([0, 1, 2, 3, 0])
    with torch.no_grad():
        assert float(full_softmax(q, w, t, block=2)) == pytest.approx(float(torch.nn.functional.cross_entropy(q @ w.T, t)), rel=1e-5)
    with pytest.raises(ValueError, match="share D"):
        full_softmax(q, torch.randn(4, 2), t)
    with pytest.raises(ValueError, match="target must be"):
        full_softmax(q, w, t[:3])
    with pytest.raises(ValueError, match="block must be"):
        full_softmax(q, w, t, block=0)
