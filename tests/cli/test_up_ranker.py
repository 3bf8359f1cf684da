"""The ranking stage of `hugerec up`: sampled negatives are never items the user has interacted with, the
label ratio is the configured one, a labelled log is used as it is, and bad settings are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.cli import main
from hugerec.cli.config_file import ConfigError
from hugerec.cli.up_ranker import RankerSection, hard_pools, is_seen, read_up_toml, sample_rows, time_cutoff, up_toml
from tests.cli.test_up_command import write_log


def _histories(rng: np.random.Generator, users: int, items: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (offsets, items) of distinct items per user, lengths 1..max_len."""
    lengths = rng.integers(1, max_len + 1, users)
    rows = [rng.choice(items, int(n), replace=False) for n in lengths]
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.concatenate(rows).astype(np.int64)


def _sample(seed: int, users: int, items: int, max_len: int, section: RankerSection) -> tuple[dict[str, np.ndarray], dict[str, int], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    offsets, history = _histories(rng, users, items, max_len)
    positive_users = np.repeat(np.arange(users), np.diff(offsets))
    vectors = rng.standard_normal((users, 4)).astype(np.float32), rng.standard_normal((items, 4)).astype(np.float32)
    pools = hard_pools(*vectors, offsets, history, section.hard_pool)
    counts = np.bincount(history, minlength=items)
    times = np.arange(len(history), dtype=np.int64)
    columns, done = sample_rows(positive_users, history, times, offsets, history, counts, pools, section)
    return columns, done, offsets, history


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    users=st.integers(1, 30),
    items=st.integers(2, 40),
    negatives=st.integers(1, 8),
    hard_fraction=st.sampled_from([0.0, 0.5, 1.0]),
    power=st.sampled_from([0.0, 1.0]),
)
def test_negatives_are_never_items_the_user_has_seen(seed: int, users: int, items: int, negatives: int, hard_fraction: float, power: float) -> None:
    section = RankerSection(negatives=negatives, hard_fraction=hard_fraction, hard_pool=5, popularity_power=power)
    columns, done, offsets, history = _sample(seed, users, items, max(1, items - 1), section)
    negative = columns["label"] == 0
    seen = np.unique(np.repeat(np.arange(users), np.diff(offsets)) * items + history)
    keys = columns["user"][negative] * items + columns["item"][negative]
    assert not np.isin(keys, seen).any()
    assert ((columns["item"] >= 0) & (columns["item"] < items)).all()
    assert done["negatives"] + done["dropped"] == negatives * done["positives"]
    assert not is_seen(seen, columns["user"][negative], columns["item"][negative], items).any()


def test_the_label_ratio_and_the_hard_share_are_the_configured_ones() -> None:
    section = RankerSection(negatives=6, hard_fraction=0.5, hard_pool=20)
    columns, done, offsets, _ = _sample(0, 50, 400, 20, section)
    positives = int(np.diff(offsets).sum())
    assert done["positives"] == positives and done["dropped"] == 0
    assert (columns["label"] == 1).sum() == positives and (columns["label"] == 0).sum() == 6 * positives
    assert done["hard"] == 3 * positives and done["catalogue"] == 3 * positives
    # each negative keeps its positive's user and time
    first = columns["label"] == 1
    assert np.array_equal(np.repeat(columns["user"][first], 6), columns["user"][~first])
    assert np.array_equal(np.repeat(columns["timestamp"][first], 6), columns["timestamp"][~first])
    # max_rows bounds the rows: positives subsampled to max_rows / (1 + negatives)
    capped, done = _sample(0, 50, 400, 20, RankerSection(negatives=6, max_rows=1400))[:2]
    assert done["positives"] == 200 and len(capped["label"]) == 1400 and done["subsampled"] == positives - 200


def test_hard_pools_are_the_retrievers_top_unseen_items() -> None:
    user_vectors = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    item_vectors = np.array([[5.0, 0.0], [4.0, 0.0], [3.0, 0.0], [0.0, 5.0], [0.0, 4.0]], np.float32)
    offsets, history = np.array([0, 1, 5]), np.array([0, 0, 1, 2, 3])  # user 1 has seen 4 of 5 items
    pools = hard_pools(user_vectors, item_vectors, offsets, history, pool=2)
    assert pools[0].tolist() == [1, 2] and pools[1].tolist() == [4, -1]


def test_time_cutoff_leaves_rows_on_both_sides() -> None:
    times = np.arange(100)
    cut = time_cutoff(times, 0.1)
    assert (times >= cut).sum() == 10
    with pytest.raises(ConfigError, match="needs rows at two or more times"):
        time_cutoff(np.full(10, 7), 0.1)


def test_up_toml_round_trips_and_bad_values_are_named(tmp_path: Path) -> None:
    section = RankerSection(negatives=8, hard_fraction=0.25)
    path = tmp_path / "up.toml"
    path.write_text(up_toml(section, tmp_path / "retriever.toml"))
    assert read_up_toml(path, []) == section
    assert read_up_toml(path, ["ranker.enabled=false"]).enabled is False
    assert read_up_toml(None, []) == RankerSection()
    assert read_up_toml(path, ['ranker.enabled="auto"']).enabled == "auto"
    for override, expected in [
        ("ranker.negatives=0", "ranker.negatives must be in 1..100, got 0"),
        ("ranker.hard_fraction=2", "ranker.hard_fraction must be in [0, 1], got 2"),
        ("ranker.positives=some", 'ranker.positives must be "held_out" or "all"'),
        ("ranker.enabled=1", "ranker.enabled: expected true or false, got 1"),
        ("ranker.enabled=yes", 'ranker.enabled must be true, false or "auto", got \'yes\''),
    ]:
        with pytest.raises((ValueError, ConfigError), match=expected.replace("[", r"\[").replace("]", r"\]")):
            read_up_toml(path, [override])


def test_auto_builds_the_ranker_for_a_labelled_log_only() -> None:
    assert RankerSection().enabled == "auto"
    assert RankerSection().trains(labelled=True) and not RankerSection().trains(labelled=False)
    assert RankerSection(enabled=True).trains(labelled=False) and RankerSection(enabled=True).trains(labelled=True)
    assert not RankerSection(enabled=False).trains(labelled=True)


def test_ranker_and_no_ranker_together_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--print-config", "--ranker", "--no-ranker", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hugerec up: error: --ranker and --no-ranker contradict each other") and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_print_config_shows_the_ranker_only_where_it_would_be_built(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain, labelled = tmp_path / "plain.csv", tmp_path / "clicks.csv"
    write_log(plain)
    _labelled_log(labelled)
    for argv, built in [([str(plain)], False), ([str(plain), "--ranker"], True), ([str(labelled)], True), ([str(labelled), "--no-ranker"], False), ([], False)]:
        assert main(["up", *argv, "--print-config", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
        text = capsys.readouterr().out
        assert ("ranker.toml: written once the labelled rows are" in text) is built, (argv, text)
        expected = "true" if "--ranker" in argv else "false" if "--no-ranker" in argv else '"auto"'
        assert f"\nenabled = {expected}\n" in text, (argv, text)


def _labelled_log(path: Path, bad: str | None = None) -> None:
    rng = np.random.default_rng(3)
    lines = ["visitor_id,product_id,clicked,event_time"]
    for u in range(30):
        for j, item in enumerate(rng.choice(40, 12, replace=False)):
            lines.append(f"{1000 + u},{int(item) + 1},{int(rng.random() < 0.4)},2024-03-{1 + j:02d} 10:{u % 60:02d}:00")
    if bad is not None:
        lines[5] = lines[5].rsplit(",", 2)[0] + f",{bad}," + lines[5].rsplit(",", 1)[1]
    path.write_text("\n".join(lines) + "\n")


FAST = ["train.epochs=1", "train.progress=false", "train.tensorboard=false", "train.plot=false"]


@pytest.mark.slow
def test_a_labelled_log_trains_the_ranker_on_its_labels_and_no_ranker_is_retrieval_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No flag (ranker.enabled = "auto"): a log with a label column gets the ranker."""
    monkeypatch.chdir(tmp_path)
    _labelled_log(tmp_path / "clicks.csv")
    assert main(["up", "clicks.csv", "--no-serve", *FAST, "ranker.epochs=1"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "clicked = label" in printed and "[3/5] ranker on the log's labels (clicked)" in printed
    out = tmp_path / "runs" / "up"
    rows = pl.read_parquet(out / "ranker" / "rows.parquet")
    log = pl.read_csv(tmp_path / "clicks.csv")
    # the log's own rows and labels, less each visitor's held-out last event: nothing sampled
    assert rows.height == log.height - 30
    joined = rows.join(log.rename({"visitor_id": "user", "product_id": "item"}), on=["user", "item"])
    assert joined.height == rows.height and (joined["label"] == joined["clicked"]).all()
    pipeline = (out / "pipeline.toml").read_text()
    assert "\n[score]" in pipeline and "ranker_bundle" in pipeline
    assert main(["pipeline", "query", str(out / "pipeline"), "--user", "1003", "--k", "5", "--debug"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert list(answer["stages"]) == ["retrieve", "filter", "score", "order"] and len(answer["items"]) == 5
    # --no-ranker: today's retrieval-only pipeline, and up.toml says so
    assert main(["up", "clicks.csv", "--no-serve", "--no-ranker", *FAST]) == 0, capsys.readouterr().err
    assert "[3/5] no ranker" in capsys.readouterr().out
    assert "\n[score]" not in (out / "pipeline.toml").read_text() and "enabled = false" in (out / "up.toml").read_text()
    assert main(["pipeline", "query", str(out / "pipeline"), "--user", "1003", "--k", "5", "--debug"]) == 0
    assert list(json.loads(capsys.readouterr().out)["stages"]) == ["retrieve", "filter", "order"]


@pytest.mark.slow
def test_ranker_forces_the_ranking_stage_on_an_implicit_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path / "events.csv")  # visitor_id, product_id, price, event_time: no label column
    assert main(["up", "events.csv", "--no-serve", "--ranker", *FAST, "ranker.epochs=1"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "[3/5] ranker on each interaction + 4 sampled negatives" in printed, printed
    out = tmp_path / "runs" / "up"
    rows = pl.read_parquet(out / "ranker" / "rows.parquet")
    assert int(rows["label"].sum()) * 4 == int((rows["label"] == 0).sum())  # 1 : 4, as ranker.negatives says
    assert "\n[score]" in (out / "pipeline.toml").read_text() and "enabled = true" in (out / "up.toml").read_text()
    assert main(["pipeline", "query", str(out / "pipeline"), "--user", "1003", "--k", "5", "--debug"]) == 0
    assert list(json.loads(capsys.readouterr().out)["stages"]) == ["retrieve", "filter", "score", "order"]


@pytest.mark.slow
def test_a_label_column_that_is_not_0_or_1_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    _labelled_log(tmp_path / "clicks.csv", bad="3")
    assert main(["up", "clicks.csv", "--no-serve", *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hugerec up: error: ") and "\n" not in err
    assert "clicked" in err and "clicks.csv" in err, err


def test_label_columns_by_name_and_by_flag_and_bad_ones_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hugerec.cli.up_command import log_spec
    from hugerec.data.input_spec import Role

    log = tmp_path / "log.csv"
    _labelled_log(log)
    assert log_spec(log, None, None, None).column("clicked").role is Role.LABEL
    write_log(tmp_path / "plain.csv")  # visitor_id, product_id, price, event_time: no label
    assert all(c.role is not Role.LABEL for c in log_spec(tmp_path / "plain.csv", None, None, None).columns)
    assert log_spec(tmp_path / "plain.csv", None, None, None, "price").column("price").role is Role.LABEL
    for flags, expected in [
        (["--label-column", "nope"], "--label-column 'nope':"),
        (["--label-column", "visitor_id"], "cannot be both the label and the user"),
    ]:
        assert main(["up", str(log), "--print-config", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("hugerec up: error: ") and expected in err and "\n" not in err, err
    assert main(["up", "--print-config", "ranker.negatives=many"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hugerec up: error: ") and "ranker.negatives" in err and "\n" not in err, err
    assert main(["up", "--print-config", "--label-column", "x"]) == 2
    assert "give the log" in capsys.readouterr().err
