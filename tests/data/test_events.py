"""Retrieval and sequential data as views of the declared input: roles pick the columns, the timestamp
column's format parses the times, [preprocess]'s split holds out, sequences group by session or user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hugerec.data.events import SequenceProtocol, SequenceSpec, read_events, retrieval_view, sequence_view
from hugerec.data.input_spec import ColumnSpec, ColumnType, InputFormat, InputSpec, Role
from hugerec.data.prepare import SplitKind, SplitSpec


def _spec(*columns: ColumnSpec, separator: str = ",") -> InputSpec:
    return InputSpec(InputFormat.CSV, separator, header=False, columns=columns)


EVENTS = _spec(
    ColumnSpec("user", ColumnType.INT, Role.USER),
    ColumnSpec("item", ColumnType.INT, Role.ITEM),
    ColumnSpec("when", ColumnType.TIMESTAMP, format="%Y-%m-%d %H:%M:%S"),
)


def _write(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    """rows of (user, item, seconds after 2020-01-01) as `user,item,YYYY-mm-dd HH:MM:SS` lines."""
    import datetime

    base = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    lines = [f"{u},{i},{(base + datetime.timedelta(seconds=t)).strftime('%Y-%m-%d %H:%M:%S')}" for u, i, t in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_events_take_the_role_columns_and_parse_times_by_the_format(tmp_path: Path) -> None:
    path = _write(tmp_path / "log.csv", [(1, 10, 0), (1, 11, 60), (2, 10, 30)])
    frame, report = read_events(EVENTS, str(path), {"user": "user", "item": "item", "timestamp": "when"}, "preprocess.input")
    assert frame.columns == ["user", "item", "timestamp"] and report.rows_skipped == 0
    assert frame["timestamp"].to_list() == [1577836800, 1577836860, 1577836830]
    (tmp_path / "bad.csv").write_text("1,10,2020-01-01 00:00:00\n1,11,yesterday\n")
    with pytest.raises(ValueError, match=r"bad\.csv.*line 2.*'when'.*yesterday"):
        read_events(EVENTS, str(tmp_path / "bad.csv"), {"timestamp": "when"}, "preprocess.input")


def test_retrieval_view_holds_out_by_the_declared_split(tmp_path: Path) -> None:
    rows = [(u, 100 + (u + t) % 7, u * 1000 + t) for u in range(1, 6) for t in range(4)]
    path = str(_write(tmp_path / "log.csv", rows))
    d = retrieval_view(EVENTS, path)  # default: each user's last event
    assert (d.data.num_users, d.train.num_events, d.test.num_events) == (5, 15, 5)
    assert d.users_raw.tolist() == [1, 2, 3, 4, 5] and d.items_raw.min() == 100
    two = retrieval_view(EVENTS, path, SplitSpec(SplitKind.LEAVE_LAST_OUT, holdout=2))
    assert two.test.num_events == 10
    late = retrieval_view(EVENTS, path, SplitSpec(SplitKind.TIME, eval_fraction=0.2))  # the latest 20% of events
    assert late.test.num_events == 4 and set(late.test.frame["user"].to_list()) == {4}
    assert retrieval_view(EVENTS, path, min_item_count=4).data.num_items < 7
    with pytest.raises(ValueError, match=r'preprocess\.split = "random": retrieval holds out by user or by time'):
        retrieval_view(EVENTS, path, SplitSpec(SplitKind.RANDOM))
    with pytest.raises(ValueError, match=r"preprocess\.test_split: retrieval and sequential models hold out one part"):
        retrieval_view(EVENTS, path, SplitSpec(SplitKind.LEAVE_LAST_OUT, test_split=True))


def test_the_validation_split_is_cut_from_train_as_the_test_split_was(tmp_path: Path) -> None:
    rows = [(u, 100 + (u + t) % 7, u * 1000 + t) for u in range(1, 6) for t in range(4)]
    path = str(_write(tmp_path / "log.csv", rows))
    fit_part, valid = retrieval_view(EVENTS, path).validation_split()  # each user's last training event
    assert (fit_part.num_events, valid.num_events) == (10, 5)
    last_fit = fit_part.frame.group_by("user").agg(pl.col("timestamp").max()).sort("user")["timestamp"]
    assert valid.frame["user"].to_list() == list(range(5)) and (valid.frame["timestamp"] - last_fit).to_list() == [1] * 5
    late = retrieval_view(EVENTS, path, SplitSpec(SplitKind.TIME, eval_fraction=0.2))
    fit_part, valid = late.validation_split()  # the latest 20% of the training part's 16 events
    assert valid.frame["timestamp"].min() > fit_part.frame["timestamp"].max() and valid.num_events == 4
    two = retrieval_view(EVENTS, path, SplitSpec(SplitKind.LEAVE_LAST_OUT, holdout=2))  # 2 training events per user
    with pytest.raises(ValueError, match=r'preprocess\.split = "leave_last_out" leaves 10 training and 0 validation events'):
        two.validation_split()  # a user keeps what holding out 2 would leave empty: nothing to validate on


def test_a_view_names_the_role_it_lacks(tmp_path: Path) -> None:
    path = str(_write(tmp_path / "log.csv", [(1, 10, 0), (1, 11, 60)]))
    no_user = _spec(ColumnSpec("user", ColumnType.INT, Role.NONE), *EVENTS.columns[1:])
    with pytest.raises(ValueError, match=r"preprocess.columns: two_tower / mf needs a column with role \"user\"; the declared roles are \['item', 'none', 'timestamp'\]"):
        retrieval_view(no_user, path)
    text_ids = _spec(ColumnSpec("user", ColumnType.STRING, Role.USER), *EVENTS.columns[1:])
    with pytest.raises(ValueError, match=r"column 'user' \(role user\) must be type = \"int\""):
        retrieval_view(text_ids, path)


SESSIONS = _spec(
    ColumnSpec("session", ColumnType.INT, Role.SESSION),
    ColumnSpec("item", ColumnType.INT, Role.ITEM),
    ColumnSpec("t", ColumnType.TIMESTAMP),
)


def _sessions(path: Path, sessions: list[list[int]], start: int = 0) -> str:
    lines = [f"{s},{item},{start + s * 100 + k}" for s, items in enumerate(sessions) for k, item in enumerate(items)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_drop_repeats_defaults_to_what_the_protocol_expects(tmp_path: Path) -> None:
    path = _sessions(tmp_path / "s.csv", [[1, 1, 2, 3], [2, 2, 3, 3, 4]])
    llo = sequence_view(SESSIONS, path, SequenceSpec(), max_len=5)  # leave_last_out: repeats dropped
    assert llo.train.lengths.tolist() == [2, 2] and llo.targets.tolist() == [3, 4]
    kept = sequence_view(SESSIONS, path, SequenceSpec(drop_repeats=False), max_len=5)
    assert kept.train.lengths.tolist() == [3, 4]
    assert SequenceSpec(protocol=SequenceProtocol.EVERY_PREFIX).repeats_dropped is False
    assert SequenceSpec(protocol=SequenceProtocol.EVERY_PREFIX, drop_repeats=True).repeats_dropped is True


def test_min_item_count_drops_rare_items_before_grouping(tmp_path: Path) -> None:
    path = _sessions(tmp_path / "s.csv", [[1, 2, 3], [1, 2, 4], [1, 2, 9, 3]])
    every = sequence_view(SESSIONS, path, SequenceSpec(), max_len=4)
    assert every.vocab.raw.tolist() == [1, 2, 3, 4, 9]
    common = sequence_view(SESSIONS, path, SequenceSpec(min_item_count=2), max_len=4)
    assert common.vocab.raw.tolist() == [1, 2, 3]  # 4 and 9 seen once; session 1 keeps [1, 2]
    assert common.targets.tolist() == [3, 2, 3]
    with pytest.raises(ValueError, match="min_item_count must be >= 1, got 0"):
        SequenceSpec(min_item_count=0)


def test_every_prefix_tests_on_a_test_file_or_the_latest_sequences(tmp_path: Path) -> None:
    train = _sessions(tmp_path / "train.csv", [[1, 2, 3], [2, 3, 4], [3, 4, 5]])
    test = _sessions(tmp_path / "test.csv", [[1, 2, 7, 3]], start=10_000)
    spec = SequenceSpec(protocol=SequenceProtocol.EVERY_PREFIX)
    d = sequence_view(SESSIONS, train, spec, max_len=3, test_paths=test)
    assert d.unknown_test_items == 1 and d.targets.tolist() == [2, 3]  # item 7 skipped: 1 -> 2, (1, 2) -> 3
    assert d.exclude is None and d.histories.shape == (2, 3)
    by_time = sequence_view(SESSIONS, train, spec, max_len=3, split=SplitSpec(SplitKind.TIME, cutoff=150))
    assert len(by_time.train) == 2 and by_time.targets.tolist() == [4]  # the session ending at 202, without its unseen 5
    assert by_time.unknown_test_items == 1
    with pytest.raises(ValueError, match='every_prefix" tests on whole sequences'):
        sequence_view(SESSIONS, train, spec, max_len=3, split=SplitSpec(SplitKind.RANDOM))
    with pytest.raises(ValueError, match=r'preprocess\.split must be unset or "leave_last_out" with holdout = 1'):
        sequence_view(SESSIONS, train, SequenceSpec(), max_len=3, split=SplitSpec(SplitKind.TIME, cutoff=250))


def test_sequences_group_by_user_when_no_session_is_declared(tmp_path: Path) -> None:
    path = str(_write(tmp_path / "log.csv", [(1, 10, 0), (1, 11, 60), (1, 12, 90), (2, 10, 30), (2, 12, 31)]))
    d = sequence_view(EVENTS, path, SequenceSpec(), max_len=4)
    assert len(d.train) == 2 and np.array_equal(d.vocab.raw, [10, 11, 12])
    with pytest.raises(ValueError, match=r'needs a column with role "session"'):
        sequence_view(EVENTS, path, SequenceSpec(group=Role.SESSION), max_len=4)


@pytest.mark.slow
@pytest.mark.shared_data("movielens/ml-1m/ratings.dat.gz")
def test_the_retrieval_example_runs(tmp_path: Path, shared_data: Path) -> None:
    """examples/retrieval_movielens.py as documented (its data declared by roles, read through retrieval_view),
    300 users and one epoch, from another directory."""
    example = Path(__file__).resolve().parents[2] / "examples" / "retrieval_movielens.py"
    done = subprocess.run(
        [sys.executable, str(example), "--users", "300", "--epochs", "1"],
        cwd=tmp_path,
        env={**os.environ, "HUGEREC_DATA": str(shared_data.resolve())},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "300 users" in done.stdout and "'recall@10'" in done.stdout and "HNSW top-5" in done.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran
