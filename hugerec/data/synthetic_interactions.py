"""Synthetic implicit feedback with a known generating model, so the best achievable ranking is known.

    synth = generate_interactions(InteractionConfig(num_users=2000, num_items=1000, seed=0))
    synth.data                      # Interactions: user, item, timestamp
    synth.true_scores(users)        # [B, I] the logits the events were drawn from (the oracle ranks by these)

Each user u and item i has a hidden vector (x_u, y_i in R^rank, standard normal scaled so x_u . y_i has
unit variance) and each item a popularity bias b_i = popularity * log(1 / zipf rank). A user's events are
draws *without replacement* from softmax_i(affinity * x_u . y_i + b_i), made exactly with the Gumbel
top-k trick; timestamps follow the draw order. Because the next event is a softmax draw over the items
not yet seen, ranking the unseen items by the true logits is the Bayes-optimal recommender: its
Recall@K on a leave-last-out split is the ceiling a learned model is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from hugerec.data.interactions import Interactions


@dataclass(frozen=True)
class InteractionConfig:
    """num_users, num_items   U, I
    rank                     latent dimension of the hidden vectors
    min_events, max_events   events per user, uniform in [min_events, max_events] (each <= num_items)
    affinity                 scale of the user-item term x_u . y_i in the logits
    popularity               weight of the log-Zipf item popularity bias
    seed                     everything is a function of the config (seed included)
    """

    num_users: int = 2000
    num_items: int = 1000
    rank: int = 16
    min_events: int = 20
    max_events: int = 60
    affinity: float = 2.0
    popularity: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_users", "num_items", "rank", "min_events"):
            if getattr(self, name) < 1:
                raise ValueError(f"InteractionConfig: {name} must be >= 1, got {getattr(self, name)}")
        if not self.min_events <= self.max_events <= self.num_items:
            raise ValueError(
                f"InteractionConfig: need min_events <= max_events <= num_items, got "
                f"{self.min_events}, {self.max_events}, {self.num_items}"
            )
        if self.affinity < 0 or self.popularity < 0:
            raise ValueError(f"InteractionConfig: affinity and popularity must be >= 0, got {self.affinity}, {self.popularity}")


@dataclass(frozen=True)
class SyntheticInteractions:
    """The generated log and the hidden model that produced it."""

    config: InteractionConfig
    data: Interactions
    user_factors: np.ndarray  # [U, rank] float32
    item_factors: np.ndarray  # [I, rank] float32
    item_bias: np.ndarray  # [I] float32

    def true_scores(self, users: np.ndarray) -> np.ndarray:
        """[B] user ids -> [B, I] float32 logits of the generating softmax."""
        return self.config.affinity * (self.user_factors[users] @ self.item_factors.T) + self.item_bias


def generate_interactions(cfg: InteractionConfig, user_block: int = 1024) -> SyntheticInteractions:
    rng = np.random.default_rng(cfg.seed)
    scale = cfg.rank**-0.25  # each factor ~ N(0, 1/sqrt(rank)): x . y has unit variance
    user_factors = (rng.standard_normal((cfg.num_users, cfg.rank)) * scale).astype(np.float32)
    item_factors = (rng.standard_normal((cfg.num_items, cfg.rank)) * scale).astype(np.float32)
    zipf_rank = rng.permutation(cfg.num_items) + 1
    item_bias = (-cfg.popularity * np.log(zipf_rank)).astype(np.float32)
    item_bias -= item_bias.mean()
    n_events = rng.integers(cfg.min_events, cfg.max_events + 1, size=cfg.num_users)
    synth = SyntheticInteractions(cfg, Interactions(_empty(), cfg.num_users, cfg.num_items), user_factors, item_factors, item_bias)
    users, items, steps = [], [], []
    for lo in range(0, cfg.num_users, user_block):
        u = np.arange(lo, min(lo + user_block, cfg.num_users))
        # Gumbel top-k: argsort(logits + Gumbel noise) descending = a draw without replacement, in draw order
        keys = synth.true_scores(u) + rng.gumbel(size=(len(u), cfg.num_items)).astype(np.float32)  # [b, I]
        top = np.argsort(-keys, axis=1, kind="stable")[:, : cfg.max_events]  # [b, max_events]
        keep = np.arange(cfg.max_events)[None, :] < n_events[u][:, None]  # [b, max_events]
        users.append(np.broadcast_to(u[:, None], top.shape)[keep])
        items.append(top[keep])
        steps.append(np.broadcast_to(np.arange(cfg.max_events)[None, :], top.shape)[keep])
    user_col = np.concatenate(users).astype(np.int64)
    start = rng.integers(0, 10_000_000, size=cfg.num_users)  # users start at different times
    timestamp = start[user_col] + 60 * np.concatenate(steps).astype(np.int64)
    frame = pl.DataFrame({"user": user_col, "item": np.concatenate(items).astype(np.int64), "timestamp": timestamp})
    return SyntheticInteractions(cfg, Interactions(frame, cfg.num_users, cfg.num_items), user_factors, item_factors, item_bias)


def _empty() -> pl.DataFrame:
    return pl.DataFrame({c: pl.Series(c, [], pl.Int64) for c in ("user", "item", "timestamp")})
