"""RowCache: tier 1, a bounded cache of one table's hot rows, on the GPU when one is present.

Set-associative, as the embedding caches of HugeCTR and FBGEMM: S sets of W ways.

    keys   [S, W] int64    key held by each way
    used   [S, W] bool     occupancy (every int64 is a valid key, so no sentinel key)
    score  [S, W] int64    LRU: tick of the last hit or insert; LFU: hits since insert (halved as it ages)
    rows   [S*W, D] f32    row of way w of set s at s*W + w

A key lives only in set hash(key) % S, so a batch of N lookups is a few tensor ops over [N, W]:
no per-key Python, the same code on CPU and CUDA. An insert fills empty ways first, then evicts
the lowest score of the set; more than W new keys for one set in one batch keep the first W.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

import torch

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing spreads consecutive ids


class CachePolicy(enum.Enum):
    LRU = "lru"  # evict the row hit longest ago
    LFU = "lfu"  # evict the row hit least often (counts halve every `capacity` hits, so old fame fades)


@dataclass(frozen=True)
class CacheConfig:
    """rows: capacity per table (rounded up to a multiple of `ways`); 0 turns the cache off."""

    rows: int = 65536
    policy: CachePolicy = CachePolicy.LRU
    ways: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.policy, str):
            object.__setattr__(self, "policy", CachePolicy(self.policy))
        if self.rows < 0:
            raise ValueError(f"CacheConfig: rows must be >= 0, got {self.rows}")
        if not 1 <= self.ways <= 64:
            raise ValueError(f"CacheConfig: ways must be in 1..64, got {self.ways}")


class RowCache:
    """Bounded LRU/LFU cache of rows [D] keyed by int64, on `device`. Thread safe."""

    def __init__(self, dim: int, config: CacheConfig, device: torch.device | str = "cpu") -> None:
        if dim <= 0:
            raise ValueError(f"RowCache: dim must be > 0, got {dim}")
        if config.rows <= 0:
            raise ValueError(f"RowCache: needs a capacity > 0, got rows={config.rows}")
        self.dim = dim
        self.policy = config.policy
        self.ways = config.ways
        self.sets = -(-config.rows // config.ways)
        self.device = torch.device(device)
        s, w = self.sets, self.ways
        self.keys = torch.zeros(s, w, dtype=torch.int64, device=self.device)
        self.used = torch.zeros(s, w, dtype=torch.bool, device=self.device)
        self.score = torch.zeros(s, w, dtype=torch.int64, device=self.device)
        self.rows = torch.zeros(s * w, dim, dtype=torch.float32, device=self.device)
        self._tick = 0
        self._hits_since_aging = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self.sets * self.ways

    def __len__(self) -> int:
        return int(self.used.sum())

    def _set_of(self, keys: torch.Tensor) -> torch.Tensor:
        h = keys * _GOLDEN  # wraps modulo 2^64
        return torch.remainder(h ^ (h >> 29), self.sets)

    def _probe(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """keys [N] -> (set [N], way [N], found [N])."""
        s = self._set_of(keys)
        hit = (self.keys[s] == keys.unsqueeze(1)) & self.used[s]  # [N, W]
        found = hit.any(dim=1)
        way = hit.to(torch.uint8).argmax(dim=1)
        return s, way, found

    def get(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """keys [N] int64 -> (rows [N, D], found [N] bool); rows of keys not cached are garbage."""
        keys = keys.to(self.device)
        with self._lock:
            s, way, found = self._probe(keys)
            rows = self.rows[s * self.ways + way]
            hs, hw = s[found], way[found]
            self._tick += 1
            match self.policy:
                case CachePolicy.LRU:
                    self.score[hs, hw] = self._tick
                case CachePolicy.LFU:
                    self.score.index_put_((hs, hw), torch.ones_like(hs), accumulate=True)
                    self._hits_since_aging += int(hs.shape[0])
                    if self._hits_since_aging >= self.capacity:
                        self.score >>= 1
                        self._hits_since_aging = 0
        return rows, found

    def insert(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Cache rows [M, D] of keys [M] (duplicates and keys already cached are skipped)."""
        keys = keys.to(self.device)
        rows = rows.to(self.device, torch.float32)
        with self._lock:
            keys, first = _first_occurrence(keys)
            rows = rows[first]
            _, _, cached = self._probe(keys)
            keys, rows = keys[~cached], rows[~cached]
            if keys.shape[0] == 0:
                return
            s = self._set_of(keys)
            s, order = torch.sort(s, stable=True)
            keys, rows = keys[order], rows[order]
            idx = torch.arange(s.shape[0], device=self.device)
            starts = torch.ones_like(s, dtype=torch.bool)
            starts[1:] = s[1:] != s[:-1]
            rank = idx - torch.cummax(torch.where(starts, idx, 0), dim=0).values  # position inside its set's run
            keep = rank < self.ways
            s, rank, keys, rows = s[keep], rank[keep], keys[keep], rows[keep]
            # empty ways first (score -1), then the lowest score: the LRU or LFU victim
            priority = torch.where(self.used[s], self.score[s], -1)  # [K, W]
            way = torch.argsort(priority, dim=1, stable=True).gather(1, rank.unsqueeze(1)).squeeze(1)
            self._tick += 1
            self.keys[s, way] = keys
            self.used[s, way] = True
            self.score[s, way] = self._tick if self.policy is CachePolicy.LRU else 1
            self.rows[s * self.ways + way] = rows

    def refresh(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Overwrite the rows of those keys [M] that are cached (an update); others are not inserted."""
        keys = keys.to(self.device)
        with self._lock:
            s, way, found = self._probe(keys)
            self.rows[(s * self.ways + way)[found]] = rows.to(self.device, torch.float32)[found]

    def invalidate(self, keys: torch.Tensor) -> None:
        """Drop keys [M] from the cache (absent keys are ignored)."""
        keys = keys.to(self.device)
        with self._lock:
            s, way, found = self._probe(keys)
            self.used[s[found], way[found]] = False


def _first_occurrence(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [M] -> (unique keys [U], index of each one's first occurrence in keys [U])."""
    uniq, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((uniq.shape[0],), keys.shape[0], dtype=torch.int64, device=keys.device)
    first.scatter_reduce_(0, inverse, torch.arange(keys.shape[0], device=keys.device), reduce="amin")
    return uniq, first
