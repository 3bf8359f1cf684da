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

A drifting stream of days (`generate_interaction_days`): day d's events of every user are draws without
replacement, from the items launched by day d that the user has not met on an earlier day, of the same
softmax with day d's user vectors, each a mix of the day before and a fresh draw (x_u(d) = sqrt(1 - drift)
x_u(d-1) + sqrt(drift) z, so their variance stays put); a share `new_items` of the catalogue is launched
on days 1.. (evenly), the rest is there from day 0. Timestamps fall inside their day (86,400 s each).
"""

from __future__ import annotations

import dataclasses
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


DAY_SECONDS = 86_400


@dataclass(frozen=True)
class DriftConfig:
    """days          D: days of events (0..D-1)
    drift            the share of each user vector's variance redrawn each day, in [0, 1]
    new_items        the share of the catalogue launched on days 1..D-1 (evenly), in [0, 1)
    events           (min, max) events per user and day, uniform (cfg.min_events / max_events are ignored)
    """

    days: int = 7
    drift: float = 0.2
    new_items: float = 0.2
    events: tuple[int, int] = (5, 15)

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ValueError(f"DriftConfig: days must be >= 1, got {self.days}")
        if not 0.0 <= self.drift <= 1.0:
            raise ValueError(f"DriftConfig: drift must be in [0, 1], got {self.drift}")
        if not 0.0 <= self.new_items < 1.0:
            raise ValueError(f"DriftConfig: new_items must be in [0, 1), got {self.new_items}")
        low, high = self.events
        if not 1 <= low <= high:
            raise ValueError(f"DriftConfig: events must be (min, max) with 1 <= min <= max, got {self.events}")


@dataclass(frozen=True)
class InteractionDays:
    """A drifting stream: day d's events (`day(d)`, Interactions over the whole id space, timestamps in day d),
    the hidden model of each day, and each item's launch day."""

    config: InteractionConfig
    drift: DriftConfig
    days: tuple[Interactions, ...]
    user_factors: tuple[np.ndarray, ...]  # per day: [U, rank] float32
    item_factors: np.ndarray  # [I, rank] float32
    item_bias: np.ndarray  # [I] float32
    launch: np.ndarray  # [I] int64: the day each item can first be drawn

    def day(self, d: int) -> Interactions:
        return self.days[d]

    def up_to(self, d: int) -> Interactions:
        """Every event of days 0..d in one log (sorted by user and time)."""
        frame = pl.concat([x.frame for x in self.days[: d + 1]]).sort(["user", "timestamp"], maintain_order=True)
        return Interactions(frame, self.config.num_users, self.config.num_items)

    def true_scores(self, d: int, users: np.ndarray) -> np.ndarray:
        """[B] user ids -> [B, I] float32 logits of day d's softmax (items not launched yet: -inf)."""
        logits = self.config.affinity * (self.user_factors[d][users] @ self.item_factors.T) + self.item_bias
        return np.where(self.launch[None, :] <= d, logits, -np.inf).astype(np.float32)


def generate_interaction_days(cfg: InteractionConfig, drift: DriftConfig, user_block: int = 1024) -> InteractionDays:
    """The drifting stream of `drift.days` days (module docstring); everything a function of the configs."""
    if drift.events[1] * drift.days > cfg.num_items * (1 - drift.new_items):
        raise ValueError(
            f"generate_interaction_days: {drift.days} days of up to {drift.events[1]} events need more than the "
            f"{int(cfg.num_items * (1 - drift.new_items))} items launched on day 0 (num_items {cfg.num_items})"
        )
    rng = np.random.default_rng([cfg.seed, 1])
    scale = cfg.rank**-0.25  # as generate_interactions: x . y has unit variance
    users = [(rng.standard_normal((cfg.num_users, cfg.rank)) * scale).astype(np.float32)]
    item_factors = (rng.standard_normal((cfg.num_items, cfg.rank)) * scale).astype(np.float32)
    item_bias = (-cfg.popularity * np.log(rng.permutation(cfg.num_items) + 1)).astype(np.float32)
    item_bias -= item_bias.mean()
    for _ in range(1, drift.days):
        fresh = rng.standard_normal((cfg.num_users, cfg.rank)) * scale
        users.append((np.sqrt(1 - drift.drift) * users[-1] + np.sqrt(drift.drift) * fresh).astype(np.float32))
    launch = np.zeros(cfg.num_items, dtype=np.int64)
    late = rng.permutation(cfg.num_items)[: int(cfg.num_items * drift.new_items)]
    if drift.days > 1:
        launch[late] = 1 + np.arange(late.size) % (drift.days - 1)
    stream = InteractionDays(cfg, drift, (), tuple(users), item_factors, item_bias, launch)
    seen = np.zeros((cfg.num_users, cfg.num_items), dtype=bool)  # [U, I]: met on an earlier day
    out = []
    for d in range(drift.days):
        n_events = rng.integers(drift.events[0], drift.events[1] + 1, size=cfg.num_users)
        cols: dict[str, list[np.ndarray]] = {"user": [], "item": [], "step": []}
        for lo in range(0, cfg.num_users, user_block):
            u = np.arange(lo, min(lo + user_block, cfg.num_users))
            keys = stream.true_scores(d, u) + rng.gumbel(size=(len(u), cfg.num_items)).astype(np.float32)  # [b, I]
            keys[seen[u]] = -np.inf
            top = np.argsort(-keys, axis=1, kind="stable")[:, : drift.events[1]]  # [b, max events]
            keep = np.arange(drift.events[1])[None, :] < n_events[u][:, None]  # [b, max events]
            cols["user"].append(np.broadcast_to(u[:, None], top.shape)[keep])
            cols["item"].append(top[keep])
            cols["step"].append(np.broadcast_to(np.arange(drift.events[1])[None, :], top.shape)[keep])
        user, item = np.concatenate(cols["user"]).astype(np.int64), np.concatenate(cols["item"]).astype(np.int64)
        seen[user, item] = True
        start = rng.integers(0, DAY_SECONDS // 2, size=cfg.num_users)
        timestamp = d * DAY_SECONDS + start[user] + 60 * np.concatenate(cols["step"]).astype(np.int64)
        out.append(Interactions(pl.DataFrame({"user": user, "item": item, "timestamp": timestamp}), cfg.num_users, cfg.num_items))
    return dataclasses.replace(stream, days=tuple(out))
