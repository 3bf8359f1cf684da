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

Event times (`timed=True`, for a next-items model trained on timestamps: an HSTU with model.times = true):
each item keeps its int64 seconds in a parallel array (the base's `times` [N] beside `items`, each added
user's buffer a second buffer beside the first, published in the same assignment), saved as `times` [N] in
the npz. A timed store takes every event with its time, and in time order: a user's times never decrease
(training reads each user's events sorted by timestamp, so a history whose times go back is one the model
never saw); `add` refuses times earlier than the user's latest with a ValueError naming both. An untimed
store keeps no times and refuses none (the store before times existed, bit for bit).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

_EMPTY = np.zeros(0, np.int64)
_EMPTY.flags.writeable = False
DEFAULT_MAX_ITEMS = 1000


class InteractionStore:
    def __init__(self, max_items: int = DEFAULT_MAX_ITEMS, timed: bool = False) -> None:
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise ValueError(f"InteractionStore: max_items must be an integer >= 1, got {max_items!r}")
        if not isinstance(timed, bool):
            raise ValueError(f"InteractionStore: timed must be True or False, got {timed!r}")
        self.max_items = max_items
        self.timed = timed  # each item keeps its event time (int64 seconds)
        # user -> (buffer, start, end, time buffer or None): the users added to; the time buffer is parallel
        self._items: dict[int, tuple[np.ndarray, int, int, np.ndarray | None]] = {}
        self._users = _EMPTY  # [B] sorted, distinct: the base's users
        self._offsets = np.zeros(1, np.int64)  # [B + 1]
        self._base = _EMPTY  # [N] read-only: each base user's last max_items items, oldest first
        self._base_times = _EMPTY  # [N] read-only: their times (timed stores; empty otherwise)
        self._added = 0  # users of `_items` not in the base
        self._lock = threading.Lock()

    @staticmethod
    def from_pairs(
        users: np.ndarray, items: np.ndarray, max_items: int = DEFAULT_MAX_ITEMS, times: np.ndarray | None = None
    ) -> InteractionStore:
        """Events (users [N], items [N]) in time order -> each user's last `max_items` items in that order.
        times [N] int64 seconds: a timed store (each user's times must not decrease)."""
        users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
        if users.shape != items.shape or users.ndim != 1:
            raise ValueError(f"InteractionStore: users {users.shape} and items {items.shape} must be [N] of one length")
        seconds = None
        if times is not None:
            seconds = np.asarray(times)
            if seconds.shape != users.shape or seconds.dtype.kind not in "iu":
                raise ValueError(f"InteractionStore: times must be [N] integer seconds beside the users {users.shape}, got {seconds.shape} {seconds.dtype}")
            seconds = seconds.astype(np.int64)
        order = np.argsort(users, kind="stable")  # each user's events, still in time order
        distinct, start = np.unique(users[order], return_index=True)
        offsets = np.append(start, len(users)).astype(np.int64)
        ordered_times = None if seconds is None else seconds[order]
        if ordered_times is not None:
            _check_order(distinct, offsets, ordered_times, "InteractionStore.from_pairs")
        return InteractionStore._of_csr(distinct, offsets, items[order], max_items, ordered_times)

    @staticmethod
    def _of_csr(users: np.ndarray, offsets: np.ndarray, items: np.ndarray, max_items: int, times: np.ndarray | None = None) -> InteractionStore:
        """The store whose base is the CSR (users [B] sorted and distinct, offsets [B + 1], items [N], times [N]
        or None), each row cut to its last max_items."""
        store = InteractionStore(max_items, timed=times is not None)
        lengths = np.minimum(np.diff(offsets), max_items)  # [B]
        kept, base = _gather(offsets[1:] - lengths, lengths, items)  # each row's last max_items
        base.flags.writeable = False
        store._users, store._offsets, store._base = np.array(users, np.int64), kept, base
        if times is not None:
            _, base_times = _gather(offsets[1:] - lengths, lengths, times)  # the same rows of the times
            base_times.flags.writeable = False
            store._base_times = base_times
        return store

    def _row(self, user: int) -> int:
        """The user's row of the base, or -1."""
        if not self._users.size or not -(1 << 63) <= user < 1 << 63:
            return -1
        i = int(np.searchsorted(self._users, user))
        return i if i < self._users.size and self._users[i] == user else -1

    def items(self, user: int) -> np.ndarray:
        """The user's items, oldest first (empty when none): a read-only view."""
        return self.history(user)[0]

    def history(self, user: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The user's items, oldest first, and their times (None in an untimed store), read together: the same
        version of the history (read-only views)."""
        entry = self._items.get(user)  # one lookup: items and times of one published version
        if entry is None:
            i = self._row(user)
            if i < 0:
                return _EMPTY, (_EMPTY if self.timed else None)
            a, b = self._offsets[i], self._offsets[i + 1]
            return self._base[a:b], (self._base_times[a:b] if self.timed else None)
        buffer, start, end, tbuffer = entry
        view = buffer[start:end]
        view.flags.writeable = False
        if tbuffer is None:
            return view, None
        tview = tbuffer[start:end]
        tview.flags.writeable = False
        return view, tview

    def add(self, user: int, items: np.ndarray | list[int], times: np.ndarray | list[int] | None = None) -> None:
        """Append items (oldest first) to the user's history, keeping the last max_items. A timed store needs
        their times (int64 seconds, not decreasing, none earlier than the user's latest: ValueError); an
        untimed store takes none."""
        new = np.asarray(items, np.int64).reshape(-1)
        if self.timed != (times is not None):
            raise ValueError("InteractionStore.add: " + ("this store keeps event times: give one per item" if self.timed else "this store keeps no event times"))
        new_times = None
        if times is not None:
            new_times = np.asarray(times, np.int64).reshape(-1)
            if new_times.shape != new.shape:
                raise ValueError(f"InteractionStore.add: {len(new_times)} times for {len(new)} items")
            if len(new_times) > 1 and (np.diff(new_times) < 0).any():
                j = int(np.argmax(np.diff(new_times) < 0)) + 1
                raise ValueError(f"times[{j}] = {int(new_times[j])} is earlier than times[{j - 1}] = {int(new_times[j - 1])}: events go in time order")
            new_times = new_times[-self.max_items :]
        new = new[-self.max_items :]
        n = len(new)
        if n == 0:
            return
        with self._lock:
            entry = self._items.get(user)
            if entry is None:  # the user's first add: start from the base row (read-only, and never written to:
                i = self._row(user)  # a buffer with no room after its end is copied first)
                a, b = (self._offsets[i], self._offsets[i + 1]) if i >= 0 else (0, 0)
                row = self._base[a:b] if i >= 0 else _EMPTY
                row_times = (self._base_times[a:b] if i >= 0 else _EMPTY) if self.timed else None
                entry = (row, 0, len(row), row_times)
                self._added += i < 0
            buffer, start, end, tbuffer = entry
            if new_times is not None and tbuffer is not None and end > start and int(new_times[0]) < int(tbuffer[end - 1]):
                raise ValueError(f"times[0] = {int(new_times[0])} is earlier than user {user}'s latest event time {int(tbuffer[end - 1])}: events go in time order")
            if end + n <= len(buffer):  # room after what readers see: write there, then publish
                buffer[end : end + n] = new
                if tbuffer is not None and new_times is not None:
                    tbuffer[end : end + n] = new_times
                end += n
                self._items[user] = (buffer, max(start, end - self.max_items), end, tbuffer)
                return
            kept = min(end - start, self.max_items - n)
            size = min(max(2 * (kept + n), 8), 2 * self.max_items)
            fresh = np.empty(size, np.int64)
            fresh[:kept] = buffer[end - kept : end]
            fresh[kept : kept + n] = new
            fresh_times = None
            if tbuffer is not None and new_times is not None:
                fresh_times = np.empty(size, np.int64)
                fresh_times[:kept] = tbuffer[end - kept : end]
                fresh_times[kept : kept + n] = new_times
            self._items[user] = (fresh, 0, kept + n, fresh_times)

    def __contains__(self, user: int) -> bool:
        return user in self._items or self._row(user) >= 0

    def __len__(self) -> int:
        return int(self._users.size) + self._added

    def save(self, path: str | Path) -> Path:
        added = np.array(sorted(self._items), np.int64)  # users added to: their buffers replace their base rows
        parts = [self.history(int(u)) for u in added]
        untouched = np.flatnonzero(~np.isin(self._users, added))  # [B'] base rows saved as they are
        starts, lengths = self._offsets[untouched], np.diff(self._offsets)[untouched]
        offsets, items = _gather(starts, lengths, self._base)
        users = np.concatenate([self._users[untouched], added])
        lengths = np.concatenate([np.diff(offsets), [len(p[0]) for p in parts]]).astype(np.int64)  # [U]
        items = np.concatenate([items, *(p[0] for p in parts)])
        order = np.argsort(users, kind="stable")  # by user
        row_starts = _cumsum0(lengths)[:-1][order]
        offsets, items = _gather(row_starts, lengths[order], items)
        arrays = {"users": users[order], "offsets": offsets, "items": items}
        if self.timed:
            _, times = _gather(starts, np.diff(self._offsets)[untouched], self._base_times)
            times = np.concatenate([times, *(p[1] for p in parts if p[1] is not None)])
            _, arrays["times"] = _gather(row_starts, lengths[order], times)  # the same rows as the items
        np.savez(path, **arrays)  # type: ignore[arg-type]
        return Path(path)

    @staticmethod
    def load(path: str | Path, max_items: int = DEFAULT_MAX_ITEMS, times: bool = True) -> InteractionStore:
        """A saved store; each user keeps its last `max_items` items. times=False leaves the file's event times
        out (an untimed store); a file without them is always untimed."""
        try:
            with np.load(path, allow_pickle=False) as saved:  # no pickle: nothing in the file runs
                users, offsets, items = saved["users"], saved["offsets"], saved["items"]
                seconds = saved["times"] if times and "times" in saved.files else None
        except (KeyError, ValueError, OSError, EOFError) as e:  # a missing array, object arrays, not an npz
            raise ValueError(f"InteractionStore.load: {path}: not a saved interaction store: {' '.join(str(e).split())[:200]}") from None
        if users.ndim != 1 or offsets.shape != (users.shape[0] + 1,) or items.ndim != 1 or offsets[0] != 0 or offsets[-1] != items.shape[0]:
            raise ValueError(f"InteractionStore.load: {path} holds {users.shape[0]} users, offsets {offsets.shape} and {items.shape[0]} items that do not match")
        if (np.diff(offsets) < 0).any():
            raise ValueError(f"InteractionStore.load: {path}: offsets decrease at user {int(users[np.argmax(np.diff(offsets) < 0)])}")
        if (np.diff(users) <= 0).any():
            i = int(np.argmax(np.diff(users) <= 0))
            raise ValueError(f"InteractionStore.load: {path}: users must be sorted and distinct, got {int(users[i])} before {int(users[i + 1])}")
        if seconds is not None:
            if seconds.dtype != np.int64 or seconds.shape != items.shape:
                raise ValueError(f"InteractionStore.load: {path}: times must be int64 seconds, one per item ({items.shape[0]}), got {seconds.dtype} {list(seconds.shape)}")
            _check_order(users, offsets.astype(np.int64), seconds, f"InteractionStore.load: {path}")
        return InteractionStore._of_csr(users.astype(np.int64), offsets.astype(np.int64), items.astype(np.int64, copy=False), max_items, seconds)


def _check_order(users: np.ndarray, offsets: np.ndarray, times: np.ndarray, where: str) -> None:
    """ValueError naming the first user whose times decrease (CSR rows: users [B], offsets [B + 1], times [N])."""
    if len(times) < 2:
        return
    back = np.diff(times) < 0  # [N - 1] position p + 1 earlier than p ...
    cuts = offsets[1:-1]
    back[cuts[(cuts > 0) & (cuts < len(times))] - 1] = False  # ... within one user (not across a row boundary)
    if back.any():
        p = int(np.argmax(back)) + 1
        user = int(users[int(np.searchsorted(offsets, p, side="right")) - 1])
        raise ValueError(f"{where}: user {user}'s event times decrease ({int(times[p - 1])} then {int(times[p])}): a history is in time order")


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
