"""A schema change under a running server: window 2 adds a column; the loop publishes the candidate trained on it
as a whole-bundle canary next to the old stable version, the simulated traffic (the window's own columns,
dense by name) is answered by both with zero failures, feedback reaches both and the canary gets a decision."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hugerec.cli.loop_command import simulate
from hugerec.continuous.decisions import DecisionConfig
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig
from hugerec.continuous.observer import ServerObserver
from hugerec.continuous.publish import Publisher, ServerTarget
from hugerec.continuous.traffic import sent_schema
from hugerec.continuous.window_schema import window_schemas

from .conftest import SMALL, TOKEN

LENIENT = GateConfig(auc_margin=1.0, calibration_low=0.01, calibration_high=100.0, min_rows=10)
Day = Callable[[int], pa.Table]


def _served_loop(
    tmp_path: Path, url: str, logs: Path, day: Day, loop_config: Callable[..., LoopConfig]
) -> tuple[Loop, ServerObserver, Publisher]:
    """A loop publishing to the test server at canary share 0.5, its monitor on each window's own schema."""
    config = loop_config(
        tmp_path / "work",
        gate=LENIENT,
        epochs=1,
        canary_share=0.5,
        decisions=DecisionConfig(min_feedback=100, kpi_margin=0.15, psi_alarm=10.0, baseline_margin=0.1),
    )
    publisher = Publisher(ServerTarget(url, "model", TOKEN))
    schema = config.schema
    observer = ServerObserver(
        publisher,
        logs,
        config.work_dir,
        schema.dense_names,
        schema.sparse_names,
        png=False,
        window_schema=window_schemas(schema, day, config.windows.time_column),
    )
    return Loop(config, day, publisher, observer), observer, publisher


def test_sent_schema_keeps_the_window_columns_a_live_version_takes(small_day: Day) -> None:
    day = small_day(0).append_column("c9", pa.array(np.zeros(SMALL.rows_per_day, np.int64))).drop_columns(["d1"])
    new = sent_schema(SMALL.schema, day, [], "ts", "window 2")  # nothing live: the window's columns
    assert new.dense_names == ("d0",) and new.sparse_names[-1] == "c9"
    old = sent_schema(SMALL.schema, day, [SMALL.schema], "ts", "window 2")  # c9 waits for a version that reads it
    assert old.dense_names == ("d0",) and "c9" not in old.names and old.label_names == ("label",)
    assert sent_schema(SMALL.schema, day, [SMALL.schema, new], "ts", "window 2") == new


@pytest.mark.slow  # four loop windows with a server (about 10 s on an idle machine)
def test_a_new_column_goes_out_as_a_whole_bundle_canary_and_both_versions_answer_and_get_feedback(
    tmp_path: Path, server: tuple[str, Path], small_day: Day, loop_config: Callable[..., LoopConfig]
) -> None:
    url, logs = server

    def day(k: int) -> pa.Table:
        t = small_day(k).slice(0, 2000)
        return t.append_column("c9", pa.array(np.arange(t.num_rows) * 7919 % 211)) if k >= 2 else t

    loop, observer, _ = _served_loop(tmp_path, url, logs, day, loop_config)
    seen = {}
    for k in range(4):
        loop.step(k)
        seen[k + 1] = simulate(url, loop, day(k + 1).slice(0, 800), k + 1, TOKEN)  # window k + 1's users and clicks
        assert seen[k + 1].failed == 0 and seen[k + 1].feedback_accepted == 800, seen[k + 1].errors
    records = loop.log.records
    w2 = next(r for r in records if r.action == "publish" and r.version == "w2")
    assert w2.extra["mode"] == "bundle" and "schema changed since" in w2.reason and "new column c9" in w2.reason
    assert "canary at share 0.5" in w2.reason
    stable = w2.extra["stable"]
    assert stable in ("w0", "w1")
    # window 3's rows carry c9: the old stable ignores it (w2 takes it), w2 reads it; both answered
    assert set(seen[3].answered) == {stable, "w2"}, seen[3].answered
    decision = next(r for r in records if r.window == 3 and r.action in ("promote", "rollback", "wait"))
    assert decision.version == "w2" and decision.reason and decision.extra["stable"] == stable
    assert decision.gate is not None and decision.gate["stable_count"] > 0 and decision.gate["canary_count"] > 0
    report = observer.reports[-1]
    assert report.window == 3 and set(report.kpis) == {"stable", "canary"}
    assert "c9" not in report.psi and "c0" in report.psi  # the stable's reference has no c9 to compare with


class _Status:
    """A publisher stand-in: the server's roles, nothing to flush (the test writes the log files itself)."""

    def flush_logs(self) -> None:
        pass

    def status(self) -> dict[str, object]:
        return {"stable": "w1", "canary": "w2"}


def test_drift_during_a_schema_change_reads_each_feature_where_it_was_logged(tmp_path: Path, small_day: Day) -> None:
    """The stable w1 takes d1, the canary w2 does not (it logs no d1: the log files hold nulls there). d1's drift is
    measured on w1's rows only: read on every row, half of it would look missing and d1 would alarm."""
    rows = small_day(1).slice(0, 2000)
    logs = tmp_path / "requests"
    logs.mkdir()
    n = rows.num_rows
    logged = pa.table(
        {
            "request_id": pa.array([f"r{i}" for i in range(n)]),
            "version": pa.array(["w1" if i % 2 else "w2" for i in range(n)]),
            "prediction": pa.array(np.full(n, 0.2, np.float32)),
            "d0": rows["d0"],
            "d1": pa.array(np.where(np.arange(n) % 2 == 1, rows["d1"].to_numpy(), np.nan), mask=np.arange(n) % 2 == 0),
            **{c: rows[c] for c in SMALL.schema.sparse_names},
        }
    )
    pq.write_table(logged, logs / "requests-00000000.parquet")
    labels = pa.table({"request_id": logged["request_id"], "label": rows["label"]})
    pq.write_table(labels, logs / "feedback-00000001.parquet")
    reference = small_day(0)
    observer = ServerObserver(
        _Status(),
        logs,
        tmp_path,
        SMALL.schema.dense_names,
        SMALL.schema.sparse_names,
        png=False,  # type: ignore[arg-type]
    )
    observation = observer(1, reference)
    report = observer.reports[-1]
    assert report.rows == n // 2 and report.psi["d1"] < 0.1, report.psi  # w1's rows only
    assert {role: k.count for role, k in observation.kpis.items()} == {"stable": n // 2, "canary": n // 2}


@pytest.mark.slow  # four loop windows with a server (about 10 s on an idle machine)
def test_a_removed_column_makes_the_canary_that_reads_the_new_rows_stable(
    tmp_path: Path, server: tuple[str, Path], small_day: Day, loop_config: Callable[..., LoopConfig]
) -> None:
    """From window 2 the rows lack d1. Until a version without d1 is live, requests without it are refused
    naming d1 (values are not invented); w2 (trained without d1) goes out as a canary, window 3's requests all
    fall back to it, the stable gets no feedback, and the loop promotes w2 saying why instead of waiting."""
    url, logs = server

    def day(k: int) -> pa.Table:
        t = small_day(k).slice(0, 2000)
        return t.drop_columns(["d1"]) if k >= 2 else t

    loop, _, publisher = _served_loop(tmp_path, url, logs, day, loop_config)
    seen = {}
    for k in range(4):
        loop.step(k)
        seen[k + 1] = simulate(url, loop, day(k + 1).slice(0, 400), k + 1, TOKEN)
    assert not seen[2].answered and seen[2].failed > 0, seen[2]  # only versions that need d1 were live
    assert "missing dense features ['d1']" in seen[2].errors[0]
    assert seen[3].failed == 0 and set(seen[3].answered) == {"w2"}, (seen[3].answered, seen[3].errors[:1])
    decision = next(r for r in loop.log.records if r.window == 3 and r.action in ("promote", "rollback", "wait"))
    assert decision.action == "promote" and decision.version == "w2", decision
    assert "cannot read window 3: its columns ['d1'] are gone" in decision.reason
    assert publisher.status() is not None and publisher.status()["stable"] == "w2"  # type: ignore[index]
    assert seen[4].failed == 0
