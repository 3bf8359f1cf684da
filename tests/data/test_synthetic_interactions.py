"""Synthetic interactions: deterministic by seed, shapes as configured, draws follow the softmax, oracle beats popularity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hugerec.data.interactions import held_out_csr, histories, leave_last_out
from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions
from hugerec.training.ranking_metrics import full_ranking_metrics


def test_deterministic_and_shaped() -> None:
    cfg = InteractionConfig(num_users=50, num_items=40, min_events=3, max_events=9, seed=3)
    a, b = generate_interactions(cfg), generate_interactions(cfg, user_block=7)
    assert a.data.frame.equals(b.data.frame)
    assert not a.data.frame.equals(generate_interactions(InteractionConfig(num_users=50, num_items=40, min_events=3, max_events=9, seed=4)).data.frame)
    counts = np.bincount(a.data.users(), minlength=50)
    assert counts.min() >= 3 and counts.max() <= 9
    # no user sees an item twice (draws without replacement)
    assert a.data.frame.select("user", "item").unique().height == a.data.num_events


def test_first_draw_follows_the_softmax() -> None:
    cfg = InteractionConfig(num_users=20000, num_items=5, rank=2, min_events=1, max_events=1, seed=0)
    synth = generate_interactions(cfg)
    # users differ, so compare the empirical first-item frequency with the mean of each user's softmax
    p = torch.softmax(torch.from_numpy(synth.true_scores(np.arange(cfg.num_users))), dim=1).mean(0).numpy()
    freq = np.bincount(synth.data.items(), minlength=5) / cfg.num_users
    np.testing.assert_allclose(freq, p, atol=0.01)


def test_oracle_beats_popularity() -> None:
    synth = generate_interactions(InteractionConfig(num_users=400, num_items=200, seed=1))
    train, test = leave_last_out(synth.data)
    held, excl = held_out_csr(test), histories(train)
    oracle = full_ranking_metrics(lambda u0, u1, i0, i1: torch.from_numpy(synth.true_scores(np.arange(u0, u1))[:, i0:i1]), held, excl, 200, [10])
    pop = torch.from_numpy(train.item_counts().astype(np.float32))
    popular = full_ranking_metrics(lambda u0, u1, i0, i1: pop[i0:i1].expand(u1 - u0, -1), held, excl, 200, [10])
    assert oracle["recall@10"] > popular["recall@10"] + 0.05


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="min_events <= max_events <= num_items"):
        InteractionConfig(num_items=5, max_events=6)
    with pytest.raises(ValueError, match="num_users must be >= 1"):
        InteractionConfig(num_users=0)
