"""The seen-items store: the last max_items per user, appended without copying the history, readers never see
half an update, save / load."""

from __future__ import annotations

import re
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


# -- event times (a timed store, for a next-items model trained with times) ----------------------------------
def _timed_events(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n events of 40 users in time order: times non-decreasing overall (so within each user), ties included."""
    users, items = rng.integers(-5, 35, n), rng.integers(0, 1000, n)
    times = np.cumsum(rng.integers(0, 3, n)) + 1_700_000_000
    return users, items, times


def test_a_timed_store_keeps_each_items_own_time_through_adds_save_and_load(tmp_path: Path) -> None:
    """Times ride beside the items: from events, through adds that move buffers, save and load (at another
    max_items), each user's last items keep their own times, as a dict of (item, time) lists does."""
    rng = np.random.default_rng(2)
    users, items, times = _timed_events(rng, 600)
    store = InteractionStore.from_pairs(users, items, max_items=6, times=times)
    assert store.timed
    reference: dict[int, list[tuple[int, int]]] = {}
    for u, i, t in zip(users.tolist(), items.tolist(), times.tolist(), strict=True):
        reference.setdefault(u, []).append((i, t))
    clock = int(times[-1])
    for step in range(300):  # base users and new ones, adds of 1..9 items (more than max_items: the last kept)
        u = int(rng.integers(-8, 40))
        n = int(rng.integers(1, 10))
        new_t = clock + np.cumsum(rng.integers(0, 5, n))
        clock = int(new_t[-1])
        new_i = rng.integers(0, 1000, n)
        store.add(u, new_i, new_t)
        reference.setdefault(u, []).extend(zip(new_i.tolist(), new_t.tolist(), strict=True))
        if step % 50 == 0 or step == 299:
            for user, pairs in reference.items():
                got_i, got_t = store.history(user)
                assert got_t is not None and got_i.tolist() == [p[0] for p in pairs[-6:]] and got_t.tolist() == [p[1] for p in pairs[-6:]]
                assert not got_t.flags.writeable
    for max_items in (6, 2):
        again = InteractionStore.load(store.save(tmp_path / "seen.npz"), max_items=max_items)
        assert again.timed and len(again) == len(reference)
        for user, pairs in reference.items():
            got_i, got_t = again.history(user)
            assert got_t is not None and got_i.tolist() == [p[0] for p in pairs[-max_items:]] and got_t.tolist() == [p[1] for p in pairs[-max_items:]]
    untimed = InteractionStore.load(tmp_path / "seen.npz", max_items=6, times=False)  # the file's times left out
    assert not untimed.timed and untimed.history(int(users[0]))[1] is None
    assert untimed.items(int(users[0])).tolist() == store.items(int(users[0])).tolist()


def test_an_untimed_store_is_the_store_before_times_and_refuses_them(tmp_path: Path) -> None:
    """A store without times writes the same file as before times existed (users, offsets, items) and reads a
    file of that layout; it takes no times, and a timed store takes none without them."""
    store = InteractionStore.from_pairs(np.array([1, 2, 1]), np.array([10, 20, 11]))
    path = store.save(tmp_path / "old.npz")
    with np.load(path) as saved:
        assert sorted(saved.files) == ["items", "offsets", "users"]
    assert not InteractionStore.load(path).timed and store.history(1)[1] is None
    with pytest.raises(ValueError, match="this store keeps no event times"):
        store.add(1, [5], [1])
    timed = InteractionStore.from_pairs(np.array([1]), np.array([10]), times=np.array([100]))
    with pytest.raises(ValueError, match="this store keeps event times: give one per item"):
        timed.add(1, [5])
    with pytest.raises(ValueError, match="2 times for 1 items"):
        timed.add(1, [5], [100, 101])


def test_times_that_go_back_are_refused_naming_them() -> None:
    """Training reads each user's events sorted by time: a history whose times decrease is refused, in a post
    (naming the position) and against the user's latest stored time (naming both); equal times are fine."""
    store = InteractionStore.from_pairs(np.array([1, 1]), np.array([10, 11]), times=np.array([100, 200]))
    store.add(1, [12], [200])  # a tie with the latest: kept
    with pytest.raises(ValueError, match=r"^times\[0\] = 150 is earlier than user 1's latest event time 200"):
        store.add(1, [13], [150])
    with pytest.raises(ValueError, match=r"^times\[2\] = 250 is earlier than times\[1\] = 300"):
        store.add(1, [13, 14, 15], [210, 300, 250])
    assert store.items(1).tolist() == [10, 11, 12]  # nothing of a refused add was kept
    store.add(7, [1, 2], [5, 6])  # a new user: any first time
    with pytest.raises(ValueError, match=r"InteractionStore.from_pairs: user 2's event times decrease \(9 then 8\)"):
        InteractionStore.from_pairs(np.array([1, 2, 2]), np.array([1, 2, 3]), times=np.array([50, 9, 8]))
    with pytest.raises(ValueError, match="times must be \\[N\\] integer seconds"):
        InteractionStore.from_pairs(np.array([1]), np.array([1]), times=np.array([1.5]))


@pytest.mark.parametrize(
    ("times", "message"),
    [
        (np.array([1.0, 2.0, 3.0]), "times must be int64 seconds, one per item \\(3\\), got float64 \\[3\\]"),
        (np.array([1, 2], np.int64), "times must be int64 seconds, one per item \\(3\\), got int64 \\[2\\]"),
        (np.array([1, 2, 3], np.int32), "got int32"),
        (np.array([5, 1, 9], np.int64), "user 1's event times decrease \\(5 then 1\\)"),
        (np.array(["a", "b", "c"]), "times must be int64 seconds"),
    ],
)
def test_load_refuses_bad_times_in_one_line_naming_the_file(tmp_path: Path, times: np.ndarray, message: str) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, users=np.array([1, 2]), offsets=np.array([0, 2, 3]), items=np.array([5, 6, 7]), times=times)
    with pytest.raises(ValueError, match=f"^InteractionStore.load: {re.escape(str(path))}: .*{message}") as e:
        InteractionStore.load(path)
    assert "\n" not in str(e.value)
    np.savez(path, users=np.array([1, 2]), offsets=np.array([0, 2, 3]), items=np.array([5, 6, 7]), times=np.array([1, 2, 3], dtype=object))
    with pytest.raises(ValueError, match=f"^InteractionStore.load: {re.escape(str(path))}: not a saved interaction store: Object arrays"):
        InteractionStore.load(path)  # no pickle: nothing in the file runs


def test_readers_see_items_and_times_of_one_version() -> None:
    """history() reads items and times from one published entry: a reader never pairs new items with old times."""
    store = InteractionStore(max_items=32, timed=True)
    stop = threading.Event()
    bad: list[tuple[np.ndarray, np.ndarray]] = []

    def read() -> None:
        while not stop.is_set():
            items, times = store.history(4)
            assert times is not None
            if items.shape != times.shape or (items != times - 1000).any():  # each item's time is its id + 1000
                bad.append((items.copy(), times.copy()))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for start in range(0, 8000, 7):
        ids = np.arange(start, start + 7)
        store.add(4, ids, ids + 1000)
    stop.set()
    for t in readers:
        t.join()
    assert bad == []
