"""The seen-items store: the last max_items per user, appended without copying the history, readers never see
half an update, save / load."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from hugerec.serving.pipeline.interaction_store import InteractionStore


def test_only_the_last_max_items_are_kept_in_order() -> None:
    store = InteractionStore(max_items=5)
    reference: list[int] = []
    rng = np.random.default_rng(0)
    for _ in range(200):
        new = rng.integers(0, 1000, rng.integers(1, 8)).tolist()
        store.add(7, new)
        reference += new
        np.testing.assert_array_equal(store.items(7), reference[-5:])
    assert store.items(8).size == 0 and 7 in store and len(store) == 1
    with pytest.raises(ValueError, match="max_items must be an integer >= 1"):
        InteractionStore(0)


def test_an_append_copies_the_new_items_not_the_history() -> None:
    """#28: each add copied the whole history (a poisoned user's /recommend went from 6 to 550 ms). Appends go into
    the spare room of one buffer; a new buffer is made only when that is full, at most once per max_items added."""
    store = InteractionStore(max_items=1000)
    buffers = set()
    for i in range(5000):
        store.add(1, [i])
        buffers.add(id(store._items[1][0]))  # the buffer a reader's view points into
    assert len(buffers) <= 5000 // 1000 + 12  # doublings up to 2 x max_items, then one per max_items appends
    np.testing.assert_array_equal(store.items(1), np.arange(4000, 5000))
    view = store.items(1)
    assert not view.flags.writeable


def test_readers_see_the_old_or_the_new_history_never_half() -> None:
    store = InteractionStore(max_items=64)
    stop = threading.Event()
    bad: list[np.ndarray] = []

    def read() -> None:
        while not stop.is_set():
            items = store.items(3)
            if items.size and not (np.diff(items) == 1).all():  # always a run of consecutive ids
                bad.append(items.copy())

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for start in range(0, 20000, 10):
        store.add(3, list(range(start, start + 10)))
    stop.set()
    for t in readers:
        t.join()
    assert bad == []


def test_save_and_load_keep_each_users_last_items(tmp_path: Path) -> None:
    store = InteractionStore.from_pairs(np.array([1, 2, 1, 1, 2]), np.array([10, 20, 11, 12, 21]), max_items=2)
    np.testing.assert_array_equal(store.items(1), [11, 12])
    store.add(2, [22])
    path = store.save(tmp_path / "seen.npz")
    again = InteractionStore.load(path, max_items=1)
    assert again.items(1).tolist() == [12] and again.items(2).tolist() == [22]
    assert InteractionStore.load(path).items(2).tolist() == [21, 22]


def _reference(users: np.ndarray, items: np.ndarray, max_items: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for u, i in zip(users.tolist(), items.tolist(), strict=True):
        out.setdefault(u, []).append(i)
    return {u: v[-max_items:] for u, v in out.items()}


def test_from_pairs_save_load_and_adds_equal_a_per_user_reference(tmp_path: Path) -> None:
    """The store made from events or a file keeps them as one CSR (array operations, no per-user Python); adds on
    top of it, save and load give each user's last max_items as a dict of lists does."""
    rng = np.random.default_rng(1)
    users, items = rng.integers(-5, 40, 500), rng.integers(0, 1000, 500)
    users[:3] = [2**62, -(2**62), 2**62]
    store = InteractionStore.from_pairs(users, items, max_items=7)
    reference = _reference(users, items, 7)
    assert len(store) == len(reference)
    for u in [*reference, 41, -6, 10**30, -(10**30)]:
        assert store.items(u).tolist() == reference.get(u, []) and (u in store) == (u in reference)
    with pytest.raises(ValueError):
        store.items(3)[0] = 1  # read-only views
    for u, new in ((3, [1, 2]), (3, [5] * 9), (100, [7]), (2**62, [8])):  # a base user, again, a new user
        store.add(u, new)
        reference[u] = (reference.get(u, []) + new)[-7:]
    assert len(store) == len(reference) and store.items(3).tolist() == reference[3]
    for max_items in (7, 3):
        again = InteractionStore.load(store.save(tmp_path / "seen.npz"), max_items=max_items)
        assert len(again) == len(reference)
        assert all(again.items(u).tolist() == v[-max_items:] for u, v in reference.items())
    empty = InteractionStore.from_pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(empty) == 0 and empty.items(0).size == 0
    assert len(InteractionStore.load(empty.save(tmp_path / "empty.npz"))) == 0


def test_load_refuses_a_file_whose_users_are_not_sorted_and_distinct(tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", users=np.array([3, 1]), offsets=np.array([0, 1, 2]), items=np.array([5, 6]))
    with pytest.raises(ValueError, match="users must be sorted and distinct, got 3 before 1"):
        InteractionStore.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "bad.npz", users=np.array([1, 3]), offsets=np.array([0, 2, 1]), items=np.array([5]))
    with pytest.raises(ValueError, match="offsets decrease at user 3"):
        InteractionStore.load(tmp_path / "bad.npz")
