from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.sessions import (
    PAD,
    ItemVocabulary,
    Sequences,
    group_sequences,
    item_feature,
    last_n,
    leave_last_out,
    prefixes,
    read_movielens,
    read_yoochoose,
    sliding_windows,
    split_by_day,
    with_reversed,
)


def _events() -> pl.DataFrame:
    # user 1: items 5 5 6 at t=0,1,2 then 7 after a long gap; user 2: 9 8 (out of time order in the file)
    return pl.DataFrame(
        {"session": [1, 1, 2, 1, 1, 2], "item": [5, 5, 8, 6, 7, 9], "timestamp": [0, 1, 20, 2, 10_000, 10]}
    )


def _slow_group(events: pl.DataFrame, gap: int | None, drop: bool, min_length: int) -> list[list[int]]:
    rows = sorted(enumerate(events.iter_rows()), key=lambda r: (r[1][0], r[1][2], r[0]))
    seqs: list[list[int]] = []
    prev = None
    for _, (key, item, t) in rows:
        if prev is None or key != prev[0] or (gap is not None and t - prev[2] > gap):
            seqs.append([])
        if not (drop and seqs[-1] and seqs[-1][-1] == item):
            seqs[-1].append(item)
        prev = (key, item, t)
    return [s for s in seqs if len(s) >= min_length]


def _lists(s: Sequences) -> list[list[int]]:
    return [s.items[s.offsets[i] : s.offsets[i + 1]].tolist() for i in range(len(s))]


@pytest.mark.parametrize("gap", [None, 100])
@pytest.mark.parametrize("drop", [True, False])
@pytest.mark.parametrize("min_length", [1, 2, 3])
def test_group_sequences_matches_slow_reference(gap: int | None, drop: bool, min_length: int) -> None:
    ev = _events()
    got = group_sequences(ev, gap_seconds=gap, drop_repeats=drop, min_length=min_length)
    assert _lists(got) == _slow_group(ev, gap, drop, min_length)


def test_group_sequences_random_against_reference() -> None:
    rng = np.random.default_rng(0)
    ev = pl.DataFrame({"session": rng.integers(0, 30, 500), "item": rng.integers(0, 4, 500), "timestamp": rng.integers(0, 1000, 500)})
    for gap in (None, 50):
        assert _lists(group_sequences(ev, gap_seconds=gap, min_length=2)) == _slow_group(ev, gap, True, 2)


def test_group_sequences_bad_input() -> None:
    with pytest.raises(ValueError, match="no column 'session'"):
        group_sequences(pl.DataFrame({"item": [1], "timestamp": [1]}))
    with pytest.raises(ValueError, match="min_length"):
        group_sequences(_events(), min_length=0)


def test_vocabulary_skips_and_counts_unknown_items() -> None:
    seqs = group_sequences(_events(), drop_repeats=False)  # [[5 5 6 7], [9 8]]
    vocab = ItemVocabulary.fit(np.array([5, 6, 9]))
    enc, report = vocab.encode(seqs, min_length=2)
    assert report.unknown_items == 2  # 7 and 8
    assert report.dropped_sequences == 1  # [9] is too short once 8 is gone
    assert _lists(enc) == [[1, 1, 2]]
    assert vocab.lookup(np.array([7, 9, -1, 2**62])).tolist() == [PAD, 3, PAD, PAD]


def test_last_n_truncates_to_most_recent_and_pads_left() -> None:
    seqs = Sequences(np.arange(3), np.array([0, 5, 5, 7]), np.array([1, 2, 3, 4, 5, 6, 7]), np.zeros(7, np.int64))
    out = last_n(seqs, 3)
    assert out.tolist() == [[3, 4, 5], [0, 0, 0], [0, 6, 7]]
    assert last_n(seqs, 2, rows=np.array([0]), ends=np.array([2])).tolist() == [[1, 2]]


def test_leave_last_out_and_prefixes() -> None:
    seqs = Sequences(np.arange(2), np.array([0, 3, 5]), np.array([1, 2, 3, 4, 5]), np.zeros(5, np.int64))
    train, targets = leave_last_out(seqs)
    assert _lists(train) == [[1, 2], [4]] and targets.tolist() == [3, 5]
    seq, end, tgt = prefixes(seqs)
    assert seq.tolist() == [0, 0, 1] and end.tolist() == [1, 2, 4] and tgt.tolist() == [2, 3, 5]
    with pytest.raises(ValueError, match="needs >= 2"):
        leave_last_out(Sequences(np.array([7]), np.array([0, 1]), np.array([1]), np.zeros(1, np.int64)))


def test_split_by_day_puts_the_last_day_in_test() -> None:
    day = 86_400
    ev = pl.DataFrame({"session": [1, 1, 2, 2, 3, 3], "item": [1, 2, 3, 4, 5, 6], "timestamp": [0, 5, day, day + 5, 3 * day, 3 * day + 1]})
    train, test = split_by_day(group_sequences(ev), test_days=1)
    assert train.keys.tolist() == [1, 2] and test.keys.tolist() == [3]
    train, test = split_by_day(group_sequences(ev), test_days=2)
    assert train.keys.tolist() == [1] and test.keys.tolist() == [2, 3]


def test_time_gaps() -> None:
    seqs = Sequences(np.arange(2), np.array([0, 2, 4]), np.array([1, 2, 3, 4]), np.array([10, 15, 100, 130]))
    assert seqs.time_gaps().tolist() == [0, 5, 0, 30]


def test_readers_name_the_bad_line(tmp_path: Path) -> None:
    p = tmp_path / "clicks.txt.gz"
    with gzip.open(p, "wt") as f:
        f.write("SessionId\tItemId\tTime\n1\t214\t1396.5\n2\tabc\t1397\n")
    with pytest.raises(ValueError, match=r"clicks.txt.gz:3: column 2 \(item\) is not a number: 'abc'"):
        read_yoochoose(p)
    q = tmp_path / "ratings.dat"
    q.write_text("1::10::5::100\n1::x::3::101\n")
    with pytest.raises(ValueError, match=r"ratings.dat:2: column 2 \(item\)"):
        read_movielens(q)
    with pytest.raises(ValueError, match="no such file"):
        read_movielens(tmp_path / "missing.dat")


@pytest.mark.shared_data("yoochoose/yoochoose-clicks-100k_train_full.txt.gz", "movielens/ml-1m/ratings.dat.gz")
def test_real_data_loads(shared_data: Path) -> None:
    ev = read_yoochoose(shared_data / "yoochoose" / "yoochoose-clicks-100k_train_full.txt.gz")
    assert ev.height == 70_278 and ev["session"].n_unique() == 17_794
    ml = read_movielens(shared_data / "movielens" / "ml-1m" / "ratings.dat.gz")
    users = group_sequences(ml, key="user", drop_repeats=False)
    assert len(users) == 2999 and int(users.lengths.min()) >= 20 and len(users.items) == 487_650


def _windows_reference(seqs: Sequences, width: int, stride: int) -> list[list[int]]:
    out = []
    for s in range(len(seqs)):
        items = seqs.items[seqs.offsets[s] : seqs.offsets[s + 1]].tolist()
        end = len(items)
        while end >= 2:
            window = items[max(0, end - width) : end]
            out.append([PAD] * (width - len(window)) + window)
            end -= stride
    return out


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=0, max_size=8),
    width=st.integers(2, 9),
    stride=st.one_of(st.none(), st.integers(1, 10)),
)
def test_sliding_windows_match_the_reference_and_cover_every_transition(lengths: list[int], width: int, stride: int | None) -> None:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    items = np.arange(1, int(offsets[-1]) + 1, dtype=np.int64)  # distinct ids: a pair names its transition
    seqs = Sequences(np.arange(len(lengths)), offsets, items, np.zeros(len(items), np.int64))
    got = sliding_windows(seqs, width, stride)
    step = width - 1 if stride is None else stride
    assert got.shape == (len(_windows_reference(seqs, width, step)), width)
    assert got.tolist() == _windows_reference(seqs, width, step)
    if stride is None:  # every transition (a, a + 1) inside a sequence trained exactly once
        pairs = [(a, b) for w in got.tolist() for a, b in itertools.pairwise(w) if a != PAD]
        expected = [(int(items[i]), int(items[i + 1])) for s in range(len(lengths)) for i in range(offsets[s], offsets[s + 1] - 1)]
        assert sorted(pairs) == sorted(expected)
    # the items' timestamps cut into the same windows: column t holds the time of the item in column t
    timed = Sequences(seqs.keys, offsets, items, items * 1000 + 7)
    times = sliding_windows(timed, width, stride, values=timed.timestamps)
    assert times.shape == got.shape and times.dtype == np.int64
    assert (times == np.where(got != PAD, got * 1000 + 7, 0)).all()


def test_sliding_windows_bad_arguments() -> None:
    seqs = Sequences(np.arange(1), np.array([0, 3]), np.arange(1, 4), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="width must be >= 2"):
        sliding_windows(seqs, 1)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        sliding_windows(seqs, 3, 0)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=0, max_size=6))
def test_with_reversed_appends_each_sequence_backwards(lengths: list[int]) -> None:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    items = np.arange(1, int(offsets[-1]) + 1, dtype=np.int64)
    seqs = Sequences(np.arange(len(lengths)) + 100, offsets, items, items * 10)
    got = with_reversed(seqs)
    n = len(lengths)
    assert len(got) == 2 * n and got.keys.tolist() == seqs.keys.tolist() * 2
    for s in range(n):
        forward = items[offsets[s] : offsets[s + 1]].tolist()
        assert got.items[got.offsets[s] : got.offsets[s + 1]].tolist() == forward
        assert got.items[got.offsets[n + s] : got.offsets[n + s + 1]].tolist() == forward[::-1]
        assert got.timestamps[got.offsets[n + s] : got.offsets[n + s + 1]].tolist() == [10 * i for i in forward[::-1]]


def test_list_features_beside_the_items_are_sliced_like_the_items() -> None:
    seqs = Sequences(np.arange(2), np.array([0, 4, 6]), np.array([1, 2, 3, 1, 3, 2]), np.array([0, 5, 7, 20, 100, 160]))
    category = np.array([0, 11, 22, 33])  # row 0: padding
    cats = item_feature(seqs, category, "category")
    assert cats.tolist() == [11, 22, 33, 11, 33, 22]
    # the last 3 items of each sequence and, column for column, their categories and time gaps
    assert last_n(seqs, 3).tolist() == [[2, 3, 1], [0, 3, 2]]
    assert last_n(seqs, 3, values=cats).tolist() == [[22, 33, 11], [0, 33, 22]]
    assert last_n(seqs, 3, values=seqs.time_gaps()).tolist() == [[5, 2, 13], [0, 0, 60]]
    with pytest.raises(ValueError, match="category has 3 rows but the sequences hold item id 3"):
        item_feature(seqs, category[:3], "category")
    with pytest.raises(ValueError, match="values has 2 entries but the sequences have 6 items"):
        last_n(seqs, 3, values=np.zeros(2))
