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


def test_interaction_days_drift_launch_items_and_never_repeat_an_item() -> None:
    from hugerec.data.synthetic_interactions import DAY_SECONDS, DriftConfig, generate_interaction_days

    cfg, drift = InteractionConfig(num_users=300, num_items=200, seed=2), DriftConfig(days=4, drift=0.3, new_items=0.25, events=(2, 6))
    a, b = generate_interaction_days(cfg, drift), generate_interaction_days(cfg, drift, user_block=17)
    assert all(x.frame.equals(y.frame) for x, y in zip(a.days, b.days, strict=True))
    for d, day in enumerate(a.days):
        ts, counts = day.frame["timestamp"].to_numpy(), np.bincount(day.users(), minlength=300)
        assert ((ts >= d * DAY_SECONDS) & (ts < (d + 1) * DAY_SECONDS)).all() and counts.min() >= 2 and counts.max() <= 6
        assert (a.launch[day.items()] <= d).all()  # only launched items are drawn
    assert a.launch.max() == 3 and (a.launch > 0).sum() == 50
    everything = a.up_to(3)
    assert everything.frame.select("user", "item").unique().height == everything.num_events  # never twice, across days
    assert np.isin(a.day(3).items(), np.flatnonzero(a.launch == 3)).mean() > 0  # new items are met on their day
    # the users' tastes drift: day 3's vectors correlate with day 0's, but not fully
    corr = np.corrcoef(a.user_factors[0].ravel(), a.user_factors[3].ravel())[0, 1]
    assert 0.3 < corr < 0.9
    assert np.isneginf(a.true_scores(0, np.arange(2))[:, a.launch > 0]).all()
    with pytest.raises(ValueError, match="drift must be in"):
        DriftConfig(drift=1.5)
    with pytest.raises(ValueError, match="need more than the 150 items launched on day 0"):
        generate_interaction_days(cfg, DriftConfig(days=20, new_items=0.25, events=(5, 10)))
