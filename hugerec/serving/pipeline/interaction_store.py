"""InteractionStore: the items each user has interacted with, oldest first, the last `max_items` per user,
updatable while serving.

Each user's items live in a buffer with room to spare: `add` writes the new items after the ones readers can
see, then publishes the new (buffer, start, end) in one assignment, so a reader (one dict lookup, no lock)
sees the old history or the new one, never half of an update, and an add costs the items added, not the
whole history. Only the last `max_items` are kept: when a buffer is full, its last `max_items` move to a
fresh buffer of twice that size (at most max_items copied per max_items added: amortised O(1) per item).
A store made from events or a file (`from_pairs`, `load`) holds them as one read-only CSR (the base: sorted
users, offsets, items), built and saved with array operations rather than one Python call per user; a user's
first `add` copies their base row into a buffer of their own, which readers see from then on (the base row
stays as it was, so a reader still sees the old history or the new one).
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
        self._items: dict[int, tuple[np.ndarray, int, int]] = {}  # user -> (buffer, start, end): users added to
        self._users = _EMPTY  # [B] sorted, distinct: the base's users
        self._offsets = np.zeros(1, np.int64)  # [B + 1]
        self._base = _EMPTY  # [N] read-only: each base user's last max_items items, oldest first
        self._added = 0  # users of `_items` not in the base
        self._lock = threading.Lock()

    @staticmethod
    def from_pairs(users: np.ndarray, items: np.ndarray, max_items: int = DEFAULT_MAX_ITEMS) -> InteractionStore:
        """Events (users [N], items [N]) in time order -> each user's last `max_items` items in that order."""
        users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
        if users.shape != items.shape or users.ndim != 1:
            raise ValueError(f"InteractionStore: users {users.shape} and items {items.shape} must be [N] of one length")
        order = np.argsort(users, kind="stable")  # each user's events, still in time order
        distinct, start = np.unique(users[order], return_index=True)
        offsets = np.append(start, len(users)).astype(np.int64)
        return InteractionStore._of_csr(distinct, offsets, items[order], max_items)

    @staticmethod
    def _of_csr(users: np.ndarray, offsets: np.ndarray, items: np.ndarray, max_items: int) -> InteractionStore:
        """The store whose base is the CSR (users [B] sorted and distinct, offsets [B + 1], items [N]), each row cut
        to its last max_items."""
        store = InteractionStore(max_items)
        lengths = np.minimum(np.diff(offsets), max_items)  # [B]
        kept, base = _gather(offsets[1:] - lengths, lengths, items)  # each row's last max_items
        base.flags.writeable = False
        store._users, store._offsets, store._base = np.array(users, np.int64), kept, base
        return store

    def _row(self, user: int) -> int:
        """The user's row of the base, or -1."""
        if not self._users.size or not -(1 << 63) <= user < 1 << 63:
            return -1
        i = int(np.searchsorted(self._users, user))
        return i if i < self._users.size and self._users[i] == user else -1

    def items(self, user: int) -> np.ndarray:
        """The user's items, oldest first (empty when none): a read-only view."""
        entry = self._items.get(user)
        if entry is None:
            i = self._row(user)
            return self._base[self._offsets[i] : self._offsets[i + 1]] if i >= 0 else _EMPTY
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
            entry = self._items.get(user)
            if entry is None:  # the user's first add: start from the base row (read-only, and never written to:
                i = self._row(user)  # a buffer with no room after its end is copied first)
                row = self._base[self._offsets[i] : self._offsets[i + 1]] if i >= 0 else _EMPTY
                entry = (row, 0, len(row))
                self._added += i < 0
            buffer, start, end = entry
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
        return user in self._items or self._row(user) >= 0

    def __len__(self) -> int:
        return int(self._users.size) + self._added

    def save(self, path: str | Path) -> Path:
        added = np.array(sorted(self._items), np.int64)  # users added to: their buffers replace their base rows
        parts = [self.items(int(u)) for u in added]
        untouched = np.flatnonzero(~np.isin(self._users, added))  # [B'] base rows saved as they are
        offsets, items = _gather(self._offsets[untouched], np.diff(self._offsets)[untouched], self._base)
        users = np.concatenate([self._users[untouched], added])
        lengths = np.concatenate([np.diff(offsets), [len(p) for p in parts]]).astype(np.int64)  # [U]
        items = np.concatenate([items, *parts])
        order = np.argsort(users, kind="stable")  # by user
        offsets, items = _gather(_cumsum0(lengths)[:-1][order], lengths[order], items)
        np.savez(path, users=users[order], offsets=offsets, items=items)
        return Path(path)

    @staticmethod
    def load(path: str | Path, max_items: int = DEFAULT_MAX_ITEMS) -> InteractionStore:
        """A saved store; each user keeps its last `max_items` items."""
        with np.load(path, allow_pickle=False) as saved:
            users, offsets, items = saved["users"], saved["offsets"], saved["items"]
        if users.ndim != 1 or offsets.shape != (users.shape[0] + 1,) or items.ndim != 1 or offsets[0] != 0 or offsets[-1] != items.shape[0]:
            raise ValueError(f"InteractionStore.load: {path} holds {users.shape[0]} users, offsets {offsets.shape} and {items.shape[0]} items that do not match")
        if (np.diff(offsets) < 0).any():
            raise ValueError(f"InteractionStore.load: {path}: offsets decrease at user {int(users[np.argmax(np.diff(offsets) < 0)])}")
        if (np.diff(users) <= 0).any():
            i = int(np.argmax(np.diff(users) <= 0))
            raise ValueError(f"InteractionStore.load: {path}: users must be sorted and distinct, got {int(users[i])} before {int(users[i + 1])}")
        return InteractionStore._of_csr(users.astype(np.int64), offsets.astype(np.int64), items.astype(np.int64, copy=False), max_items)


def _gather(starts: np.ndarray, lengths: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows items[starts[r] : starts[r] + lengths[r]] (r = 0..R-1) as a CSR of their own: offsets [R + 1], items (int64)."""
    offsets = _cumsum0(lengths)
    source = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))  # [N] positions in `items`
    return offsets, np.array(items[source], np.int64)


def _cumsum0(lengths: np.ndarray) -> np.ndarray:
    """[n] -> [n + 1] int64: 0, then the running sums (CSR offsets of rows of these lengths)."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out
