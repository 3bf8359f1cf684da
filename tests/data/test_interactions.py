"""Interaction logs: reading (incl. `::`), categorify, splits, histories and examples vs plain-Python references."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.interactions import (
    Interactions,
    categorify,
    epoch_examples,
    full_ranking,
    held_out_csr,
    histories,
    iter_examples,
    last_items,
    leave_last_out,
    read_interactions,
    time_split,
)
from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions


def _frame(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame({"user": [r[0] for r in rows], "item": [r[1] for r in rows], "timestamp": [r[2] for r in rows]},
                        schema={"user": pl.Int64, "item": pl.Int64, "timestamp": pl.Int64})


_rows = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7), st.integers(0, 4)), max_size=40)


@settings(max_examples=60, deadline=None)
@given(_rows)
def test_leave_last_out_and_examples_match_reference(rows: list[tuple[int, int, int]]) -> None:
    data = Interactions(_frame(rows), 6, 8)
    train, test = leave_last_out(data)
    # reference: per user, stable sort by timestamp, last one held out when the user has >= 2 events
    per_user: dict[int, list[tuple[int, int]]] = {}
    for u, i, t in rows:
        per_user.setdefault(u, []).append((t, i))
    want_train, want_test = [], []
    for u, ev in sorted(per_user.items()):
        ev = sorted(ev, key=lambda x: x[0])  # stable: ties keep row order
        items = [i for _, i in ev]
        (want_train.extend((u, i) for i in items[:-1]), want_test.append((u, items[-1]))) if len(items) > 1 else want_train.extend((u, i) for i in items)
    assert list(zip(train.frame["user"], train.frame["item"], strict=True)) == want_train
    assert list(zip(test.frame["user"], test.frame["item"], strict=True)) == want_test
    offsets, items = histories(train)
    for u in range(6):
        assert items[offsets[u] : offsets[u + 1]].tolist() == [i for uu, i in want_train if uu == u]
    # every example's history is the user's previous (at most 3) items
    seen = 0
    for users, targets, hist in iter_examples(train, batch_size=4, max_history=3, seed=1):
        ends = np.cumsum(hist.lengths.numpy())
        for b in range(users.numel()):
            h = hist.values[ends[b] - int(hist.lengths[b]) : ends[b]].tolist()
            u_items = [i for uu, i in want_train if uu == int(users[b])]
            assert len(h) <= 3 and u_items  # the user has events
            # h followed by the target is a contiguous window of the user's list ending at the target
            window = [*h, int(targets[b])]
            assert any(u_items[s : s + len(window)] == window and (s == 0 or len(h) == 3) for s in range(len(u_items)))
            seen += 1
    assert seen == train.num_events


def test_time_split_and_categorify() -> None:
    raw = pl.DataFrame({"user": ["b", "a", "b", "c"], "item": [30, 10, 10, 20], "timestamp": [5, 1, 3, 9]})
    data, vocab = categorify(raw)
    assert vocab.users.tolist() == ["a", "b", "c"] and vocab.items.tolist() == [10, 20, 30]
    assert data.frame.rows() == [(0, 0, 1), (1, 0, 3), (1, 2, 5), (2, 1, 9)]
    train, test = time_split(data, cutoff=5)
    assert train.frame["timestamp"].to_list() == [1, 3] and test.frame["timestamp"].to_list() == [5, 9]
    train, test = time_split(data, fraction=0.5)
    assert train.num_events + test.num_events == 4 and test.frame["timestamp"].min() >= train.frame["timestamp"].max()  # type: ignore[operator]  # ints
    with pytest.raises(ValueError, match="exactly one"):
        time_split(data)
    offsets, _ = held_out_csr(test)
    assert offsets.tolist()[-1] == test.num_events


def test_last_items_empty_and_errors() -> None:
    jt = last_items(np.array([0, 0, 2]), np.array([5, 6]), np.array([0, 1]), max_len=5)
    assert jt.lengths.tolist() == [0, 2] and jt.values.tolist() == [5, 6]
    with pytest.raises(ValueError, match=r"item ids must be in 0\.\.2"):
        Interactions(_frame([(0, 3, 0)]), 1, 3)
    with pytest.raises(ValueError, match="must be Int64"):
        Interactions(pl.DataFrame({"user": [0.5], "item": [0], "timestamp": [0]}), 1, 1)


def test_read_multibyte_separator(tmp_path: Path) -> None:
    path = tmp_path / "r.dat.gz"
    with gzip.open(path, "wt") as f:
        f.write("1::10::5::100\n2::11::3::50\n")
    frame = read_interactions(path, ("user", "item", "rating", "timestamp"), separator="::")
    assert frame.rows() == [(1, 10, 5, 100), (2, 11, 3, 50)]
    bad = tmp_path / "bad.dat"
    bad.write_text("1::10::5::100\n2::x::3::50\n")
    with pytest.raises(ValueError, match=r"bad.dat: line 2, column 'item': 'x'"):
        read_interactions(bad, ("user", "item", "rating", "timestamp"), separator="::")
    bad.write_text("1::10::5\n")
    with pytest.raises(ValueError, match="line 1: 3 fields, expected 4"):
        read_interactions(bad, ("user", "item", "rating", "timestamp"), separator="::")


def test_read_csv_through_project_readers(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("user,item,timestamp\n1,2,3\n4,5,6\n")
    frame = read_interactions(path, has_header=True)
    assert frame.rows() == [(1, 2, 3), (4, 5, 6)]


@pytest.mark.shared_data("movielens/ml-1m/ratings.dat.gz")
def test_movielens_1m_leave_last_out(shared_data: Path) -> None:
    raw = read_interactions(shared_data / "movielens/ml-1m/ratings.dat.gz", ("user", "item", "rating", "timestamp"), separator="::")
    data, _ = categorify(raw)
    train, test = leave_last_out(data)
    assert test.num_events == data.num_users and train.num_events + test.num_events == raw.height
    last = data.frame.group_by("user").agg(pl.col("timestamp").max()).sort("user")["timestamp"]
    assert (test.frame.sort("user")["timestamp"] == last).all()
    assert torch.is_tensor(last_items(*histories(train), np.array([0]), 5).values)


def test_epoch_examples_and_full_ranking_are_what_the_retrieval_family_trains_and_validates_on() -> None:
    """epoch_examples is iter_examples per epoch (seed + epoch), W ranks' parts make the one process's
    batch in rank order; full_ranking ranks every user from their training history."""
    synth = generate_interactions(InteractionConfig(num_users=50, num_items=30, rank=2, min_events=4, max_events=9, seed=1))
    train, test = leave_last_out(synth.data)
    make, length = epoch_examples(train, 16, 5, seed=3)
    one, want = list(make(1)), list(iter_examples(train, 16, 5, seed=4))
    assert len(one) == len(want) == length == -(-train.num_events // 16)
    for (u, i, h), (wu, wi, wh) in zip(one, want, strict=True):
        assert torch.equal(u, wu) and torch.equal(i, wi) and h.to_lists() == wh.to_lists()
    parts = [list(epoch_examples(train, 16, 5, seed=3, rank=r, world=3)[0](1)) for r in range(3)]
    for b, (u, i, h) in enumerate(one):
        assert torch.equal(torch.cat([p[b][0] for p in parts]), u) and torch.equal(torch.cat([p[b][1] for p in parts]), i)
        assert [row for p in parts for row in p[b][2].to_lists()] == h.to_lists()
    with pytest.raises(ValueError, match=r"rank must be in 0\.\.world - 1, got rank 3 of 3"):
        epoch_examples(train, 16, 5, rank=3, world=3)
    users, history, held, exclude = full_ranking(train, test, 5)
    seen = histories(train)
    assert torch.equal(users, torch.arange(50))
    assert all(np.array_equal(a, b) for a, b in zip(held, held_out_csr(test), strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(exclude, seen, strict=True))
    assert history.to_lists() == last_items(*seen, np.arange(50), 5).to_lists()



def test_time_windows_number_from_the_first_event_keep_empty_ones_and_the_id_spaces() -> None:
    from hugerec.data.interactions import time_windows

    frame = pl.DataFrame({"user": [0, 0, 1, 1, 2], "item": [0, 1, 1, 2, 0], "timestamp": [1050, 1190, 990, 1420, 1199]})
    data = Interactions(frame, 4, 5)
    windows = time_windows(data, 100)  # epoch windows 9, 10, 11, 11, 14 -> 0..5
    assert [w.frame["timestamp"].to_list() for w in windows] == [[990], [1050], [1190, 1199], [], [], [1420]]
    assert all((w.num_users, w.num_items) == (4, 5) for w in windows)
    assert sum(w.num_events for w in windows) == data.num_events
    assert time_windows(data.with_frame(frame.clear()), 100) == []
    with pytest.raises(ValueError, match="seconds must be >= 1, got 0"):
        time_windows(data, 0)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12), st.integers(1, 15), st.integers(0, 80), st.integers(0, 2**31 - 1))
def test_held_out_csr_is_each_users_distinct_items_as_first_met(users: int, items: int, n: int, seed: int) -> None:
    # the reference: polars' first-kept unique over (user, item), then a stable sort by user (what it was computed by)
    rng = np.random.default_rng(seed)
    frame = pl.DataFrame({"user": rng.integers(0, users, n), "item": rng.integers(0, items, n), "timestamp": rng.integers(0, 5, n)})
    test = Interactions(frame, users, items)  # sorted by (user, timestamp) here, repeats and ties kept
    ref = test.frame.select("user", "item").unique(maintain_order=True).sort("user", maintain_order=True)
    offsets, got = held_out_csr(test)
    assert np.array_equal(got, ref["item"].to_numpy())
    assert np.array_equal(offsets, np.concatenate([[0], np.cumsum(np.bincount(ref["user"].to_numpy(), minlength=users))]))
    assert offsets.dtype == got.dtype == np.int64
    huge = Interactions(frame, users, 1 << 62)  # a (user, item) key past int64 from 2 users on: the polars path
    assert all(np.array_equal(a, b) for a, b in zip(held_out_csr(huge), (offsets, got), strict=True))
