"""InteractionStore: the items each user has interacted with, oldest first, updatable while serving.

Reads take the current per-user array (one dict lookup, no lock); `add` builds a new array and swaps
it in under a lock, so a reader sees the old history or the new one, never half of an update.
On disk: an npz of users [U], offsets [U + 1] and items [N] (CSR, each user's items oldest first).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

_EMPTY = np.zeros(0, np.int64)


class InteractionStore:
    def __init__(self) -> None:
        self._items: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    @staticmethod
    def from_pairs(users: np.ndarray, items: np.ndarray) -> InteractionStore:
        """Events (users [N], items [N]) in time order -> each user's items in that order."""
        users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
        if users.shape != items.shape or users.ndim != 1:
            raise ValueError(f"InteractionStore: users {users.shape} and items {items.shape} must be [N] of one length")
        store = InteractionStore()
        order = np.argsort(users, kind="stable")
        u, start = np.unique(users[order], return_index=True)
        for user, part in zip(u.tolist(), np.split(items[order], start[1:]), strict=True):
            store._items[user] = part.copy()
        return store

    def items(self, user: int) -> np.ndarray:
        """The user's items, oldest first (empty when none)."""
        return self._items.get(user, _EMPTY)

    def add(self, user: int, items: np.ndarray | list[int]) -> None:
        new = np.asarray(items, np.int64).reshape(-1)
        with self._lock:
            self._items[user] = np.concatenate([self._items.get(user, _EMPTY), new])

    def __contains__(self, user: int) -> bool:
        return user in self._items

    def __len__(self) -> int:
        return len(self._items)

    def save(self, path: str | Path) -> Path:
        users = np.array(sorted(self._items), np.int64)
        parts = [self._items[int(u)] for u in users]
        offsets = np.zeros(len(users) + 1, np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        items = np.concatenate(parts) if parts else _EMPTY
        np.savez(path, users=users, offsets=offsets, items=items)
        return Path(path)

    @staticmethod
    def load(path: str | Path) -> InteractionStore:
        with np.load(path, allow_pickle=False) as saved:
            users, offsets, items = saved["users"], saved["offsets"], saved["items"]
        if offsets.shape != (users.shape[0] + 1,) or (offsets.shape[0] and offsets[-1] != items.shape[0]):
            raise ValueError(f"InteractionStore.load: {path} holds {users.shape[0]} users, offsets {offsets.shape} and {items.shape[0]} items that do not match")
        store = InteractionStore()
        for i, u in enumerate(users.tolist()):
            store._items[u] = items[offsets[i] : offsets[i + 1]].astype(np.int64)
        return store
