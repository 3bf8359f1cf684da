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
