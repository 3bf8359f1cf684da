"""The drifting stream (churn, concept drift, feature shift), time windows, the gate and the decision log."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hugerec.continuous.decision_log import DecisionLog, Record, read_log
from hugerec.continuous.gate import GateConfig, check
from hugerec.continuous.window_schema import adapt_schema
from hugerec.data.synthetic_stream import SECONDS_PER_DAY, Stream, StreamConfig
from hugerec.data.windows import Windows, holdout_mask, split_holdout, table_batches

CFG = StreamConfig(
    days=4,
    rows_per_day=4000,
    num_sparse=3,
    num_dense=2,
    vocabulary=200,
    churn=0.1,
    concept_drift_day=2,
    feature_shift_day=3,
    seed=1,
)


def test_stream_is_deterministic_and_timed() -> None:
    a, b = Stream(CFG).day(1), Stream(CFG).day(1)
    assert a.table.equals(b.table) and np.array_equal(a.probability, b.probability)
    ts = a.table["ts"].to_numpy()
    assert ts.min() >= SECONDS_PER_DAY and ts.max() < 2 * SECONDS_PER_DAY and np.all(np.diff(ts) >= 0)
    assert abs(Stream(CFG).day(0).table["label"].to_numpy().mean() - CFG.positive_rate) < 0.03
    with pytest.raises(ValueError, match=r"concept_drift_day must be in 1\.\.3"):
        StreamConfig(days=4, concept_drift_day=4)


def test_new_ids_arrive_and_old_ones_fade() -> None:
    s = Stream(CFG)
    seen0 = set(s.day(0).table["c1"].to_pylist())
    day3 = s.day(3).table["c1"].to_numpy()
    new = ~np.isin(day3, list(seen0))
    assert 0.02 < new.mean() < 0.6  # churn 0.1 a day: a good share of day 3's traffic is on ids born since
    assert day3.max() >= CFG.vocabulary  # keys of reassigned ranks lie beyond the first vocabulary


def test_concept_drift_changes_the_hidden_model_not_the_features() -> None:
    s = Stream(CFG)
    keys, dense = s._features(1, np.random.default_rng(0), 2000)
    before, after = s._logit(1, keys, dense), s._logit(2, keys, dense)
    assert np.corrcoef(before, after)[0, 1] < 0.7
    d1, d2 = s.day(1).table, s.day(2).table
    assert abs(d1["d0"].to_numpy().mean() - d2["d0"].to_numpy().mean()) < 0.1  # same feature distribution


def test_feature_shift_moves_dense_and_flattens_feature_0() -> None:
    s = Stream(CFG)
    d2, d3 = s.day(2).table, s.day(3).table
    assert d3["d0"].to_numpy().mean() - d2["d0"].to_numpy().mean() == pytest.approx(CFG.feature_shift, abs=0.1)
    assert abs(d3["d1"].to_numpy().mean() - d2["d1"].to_numpy().mean()) < 0.1
    top = lambda t, c: np.unique(t[c].to_numpy(), return_counts=True)[1].max() / t.num_rows  # noqa: E731
    assert top(d3, "c0") < 0.5 * top(d2, "c0") and top(d3, "c2") > 0.7 * top(d2, "c2")


def test_windows_select_read_and_hours(tmp_path: Path) -> None:
    s = Stream(CFG)
    table = pa.concat_tables([s.day(d).table for d in range(3)])
    pq.write_table(table, tmp_path / "all.parquet", row_group_size=1000)
    w = Windows("ts", "day")
    assert w.present(tmp_path) == [0, 1, 2]
    assert w.read(tmp_path, 1).equals(s.day(1).table)
    assert w.select(table, 1, count=2).num_rows == 2 * CFG.rows_per_day
    assert w.read(tmp_path, 7).num_rows == 0
    hours = Windows("ts", "hour", size=6)
    assert sum(hours.select(table, k).num_rows for k in range(12)) == table.num_rows
    quarters = Windows("ts", "minute", size=15)  # 96 windows a day
    assert quarters.seconds == 900 and quarters.select(table, 96 + 5).equals(Windows("ts", "minute", 5).select(table, 3 * 96 + 15, 3))
    with pytest.raises(ValueError, match="no time column 'when'"):
        Windows("when").select(table, 0)
    with pytest.raises(ValueError, match="unit must be 'day', 'hour' or 'minute', got 'week'"):
        Windows("ts", "week")  # type: ignore[arg-type]


def test_holdout_is_fixed_and_batches_cover_the_window() -> None:
    t = Stream(CFG).day(0).table
    train, hold = split_holdout(t, 0.1, 0)
    assert train.num_rows + hold.num_rows == t.num_rows and 0.07 < hold.num_rows / t.num_rows < 0.13
    assert np.array_equal(holdout_mask(t.num_rows, 0.1, 0), holdout_mask(t.num_rows, 0.1, 0))
    batches = table_batches(train, CFG.schema, 512, shuffle=True)
    assert sum(b.batch_size for b in batches) == train.num_rows
    assert batches[0].sparse["c0"].values.dtype.is_floating_point is False


def test_gate_thresholds() -> None:
    good = {"auc": 0.75, "logloss": 0.4, "calibration": 1.02, "count": 1000}
    cfg = GateConfig(auc_margin=0.01)
    assert check(good, {"auc": 0.755, "logloss": 0.4, "calibration": 1.0}, cfg).passed
    worse = check(good, {"auc": 0.77, "logloss": 0.4, "calibration": 1.0}, cfg)
    assert not worse.passed and "AUC 0.7500 < serving 0.7700" in worse.reason
    nan = check({**good, "auc": math.nan}, None, cfg)
    assert not nan.passed and "auc not finite" in nan.reason
    cal = check({**good, "calibration": 1.6}, None, cfg)
    assert not cal.passed and "calibration 1.600 outside" in cal.reason
    with pytest.raises(ValueError, match="calibration_low <= 1 <= calibration_high"):
        GateConfig(calibration_low=1.1)


def test_decision_log_ignores_and_cuts_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    log = DecisionLog(path)
    log.append(Record(0, "publish", "ok", {"candidate_auc": 0.7}, "w0"))
    with open(path, "ab") as f:
        f.write(b'{"window": 1, "act')  # a kill in the middle of a write
    assert [r.window for r in read_log(path)] == [0]
    again = DecisionLog(path)
    again.append(Record(1, "skip", "empty"))
    assert [(r.window, r.action) for r in read_log(path)] == [(0, "publish"), (1, "skip")]
    path.write_text('{"window": 0, "action": "publish", "reason": "x"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        read_log(path)
    with pytest.raises(ValueError, match="action must be one of"):
        Record(0, "deploy", "x")


def test_workflow_fits_on_one_window_and_transforms_the_next() -> None:
    """Preprocessing per window: statistics from window k (its vocabulary, its means) applied to window k + 1;
    ids born after window k fall into Categorify's out-of-vocabulary id."""
    import polars as pl

    from hugerec.data.preprocess.categorical import Categorify
    from hugerec.data.preprocess.numeric import Normalize
    from hugerec.data.preprocess.workflow import Workflow

    s = Stream(CFG)
    table = pa.concat_tables([s.day(d).table for d in range(3)])
    w = Windows("ts", "day")
    fit_on = pl.from_arrow(w.select(table, 1))
    assert isinstance(fit_on, pl.DataFrame)
    wf = Workflow([Normalize(("d0", "d1")), Categorify(("c1",))]).fit(fit_on)
    nxt = w.select(table, 2)
    out = wf.transform_frame(pl.from_arrow(nxt))  # type: ignore[arg-type]
    assert out.height == nxt.num_rows and abs(float(out["d0"].mean())) < 0.1
    seen = set(fit_on["c1"].to_list())
    unseen = np.array([k not in seen for k in nxt["c1"].to_pylist()])
    assert unseen.any() and (out["c1"].to_numpy()[unseen] == 1).all()  # out of vocabulary


def test_windows_read_keeps_a_column_that_later_files_add(tmp_path: Path) -> None:
    """Days 0-1 in one file, days 2-3 in another that adds c9: window 2 holds c9 (one dataset over both files
    kept the first file's columns only and dropped it), window 1 does not, and a window over days 1-2 holds
    c9 with nulls for day 1's rows (a sparse column: empty bags)."""
    s = Stream(CFG)
    old = pa.concat_tables([s.day(d).table for d in (0, 1)])
    new = pa.concat_tables([s.day(d).table for d in (2, 3)])
    new = new.append_column("c9", pa.array(np.arange(new.num_rows) % 5))
    pq.write_table(old, tmp_path / "a.parquet")
    pq.write_table(new, tmp_path / "b.parquet")
    w = Windows("ts", "day")
    assert "c9" not in w.read(tmp_path, 1).column_names
    day2 = w.read(tmp_path, 2)
    assert day2.equals(new.slice(0, CFG.rows_per_day)) and day2["c9"].null_count == 0
    both = w.read(tmp_path, 1, count=2)
    assert both.num_rows == 2 * CFG.rows_per_day and both["c9"].null_count == CFG.rows_per_day
    schema = adapt_schema(CFG.schema, both, "ts", "window 1")
    assert schema.sparse_names[-1] == "c9"
    assert sum(b.batch_size for b in table_batches(both, schema, 1024)) == both.num_rows
    assert w.read(tmp_path, 9).num_rows == 0
