"""InteractionStore: the items each user has interacted with, oldest first, the last `max_items` per user,
updatable while serving.

Each user's items live in a buffer with room to spare: `add` writes the new items after the ones readers can
see, then publishes the new (buffer, start, end) in one assignment, so a reader (one dict lookup, no lock)
sees the old history or the new one, never half of an update, and an add costs the items added, not the
whole history. Only the last `max_items` are kept: when a buffer is full, its last `max_items` move to a
fresh buffer of twice that size (at most max_items copied per max_items added: amortised O(1) per item).
On disk: an npz of users [U], offsets [U + 1] and items [N] (CSR, each user's items oldest first).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

_EMPTY = np.zeros(0, np.int64)
_EMPTY.flags.writeable = False
DEFAULT_MAX_ITEMS = 1000


class InteractionStore:
    def __init__(self, max_items: int = DEFAULT_MAX_ITEMS) -> None:
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise ValueError(f"InteractionStore: max_items must be an integer >= 1, got {max_items!r}")
        self.max_items = max_items
        self._items: dict[int, tuple[np.ndarray, int, int]] = {}  # user -> (buffer, start, end)
        self._lock = threading.Lock()

    @staticmethod
    def from_pairs(users: np.ndarray, items: np.ndarray, max_items: int = DEFAULT_MAX_ITEMS) -> InteractionStore:
        """Events (users [N], items [N]) in time order -> each user's last `max_items` items in that order."""
        users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
        if users.shape != items.shape or users.ndim != 1:
            raise ValueError(f"InteractionStore: users {users.shape} and items {items.shape} must be [N] of one length")
        store = InteractionStore(max_items)
        order = np.argsort(users, kind="stable")
        u, start = np.unique(users[order], return_index=True)
        for user, part in zip(u.tolist(), np.split(items[order], start[1:]), strict=True):
            store._put(user, part)
        return store

    def _put(self, user: int, items: np.ndarray) -> None:
        kept = items[-self.max_items :]
        self._items[user] = (kept.copy(), 0, len(kept))

    def items(self, user: int) -> np.ndarray:
        """The user's items, oldest first (empty when none): a read-only view."""
        entry = self._items.get(user)
        if entry is None:
            return _EMPTY
        buffer, start, end = entry
        view = buffer[start:end]
        view.flags.writeable = False
        return view

    def add(self, user: int, items: np.ndarray | list[int]) -> None:
        """Append items (oldest first) to the user's history, keeping the last max_items."""
        new = np.asarray(items, np.int64).reshape(-1)[-self.max_items :]
        n = len(new)
        if n == 0:
            return
        with self._lock:
            buffer, start, end = self._items.get(user, (_EMPTY, 0, 0))
            if end + n <= len(buffer):  # room after what readers see: write there, then publish
                buffer[end : end + n] = new
                end += n
                self._items[user] = (buffer, max(start, end - self.max_items), end)
                return
            kept = min(end - start, self.max_items - n)
            size = min(max(2 * (kept + n), 8), 2 * self.max_items)
            fresh = np.empty(size, np.int64)
            fresh[:kept] = buffer[end - kept : end]
            fresh[kept : kept + n] = new
            self._items[user] = (fresh, 0, kept + n)

    def __contains__(self, user: int) -> bool:
        return user in self._items

    def __len__(self) -> int:
        return len(self._items)

    def save(self, path: str | Path) -> Path:
        users = np.array(sorted(self._items), np.int64)
        parts = [self.items(int(u)) for u in users]
        offsets = np.zeros(len(users) + 1, np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        items = np.concatenate(parts) if parts else _EMPTY
        np.savez(path, users=users, offsets=offsets, items=items)
        return Path(path)

    @staticmethod
    def load(path: str | Path, max_items: int = DEFAULT_MAX_ITEMS) -> InteractionStore:
        """A saved store; each user keeps its last `max_items` items."""
        with np.load(path, allow_pickle=False) as saved:
            users, offsets, items = saved["users"], saved["offsets"], saved["items"]
        if offsets.shape != (users.shape[0] + 1,) or (offsets.shape[0] and offsets[-1] != items.shape[0]):
            raise ValueError(f"InteractionStore.load: {path} holds {users.shape[0]} users, offsets {offsets.shape} and {items.shape[0]} items that do not match")
        store = InteractionStore(max_items)
        items = items.astype(np.int64, copy=False)
        for i, u in enumerate(users.tolist()):
            store._put(u, items[offsets[i] : offsets[i + 1]])
        return store
