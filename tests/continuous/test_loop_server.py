"""The loop against a running server: canary publish, promote, automatic rollback of a worse canary, requests
answered throughout, a server that is down, feedback for unknown request ids."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from functools import cache
from pathlib import Path

import httpx
import pyarrow as pa
import pytest

from hugerec.continuous.decision_log import Record, live_intervals, read_log
from hugerec.continuous.decisions import DecisionConfig
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig
from hugerec.continuous.observer import ServerObserver
from hugerec.continuous.publish import Publisher, PublishError, ServerTarget
from hugerec.continuous.traffic import BackgroundLoad, instances, replay
from hugerec.data.synthetic_stream import Stream
from hugerec.data.windows import holdout_mask

from .conftest import SMALL, TOKEN

Day = Callable[[int], pa.Table]


def inverted_training_rows(table: pa.Table, config: LoopConfig) -> pa.Table:
    """The window's training rows with every label flipped (the holdout keeps the true ones): a model
    warm-started from a good one and trained on them is clearly worse. Shuffled labels only wash the
    warm start out partly, and whether the canary then lost on 1,200 feedback rows was a coin flip."""
    labels = table["label"].to_numpy().copy()
    train = ~holdout_mask(table.num_rows, config.holdout_share, config.seed)
    labels[train] = 1 - labels[train]
    return table.set_column(table.column_names.index("label"), "label", pa.array(labels))


WEEK = dataclasses.replace(SMALL, days=8)  # days 0..4 are SMALL's rows; day 7 is the last window's holdout


@cache
def _week_day(d: int) -> pa.Table:
    return Stream(WEEK).day(d).table


BROKEN = (1, 4)  # the week's windows whose candidates are trained on inverted labels


@pytest.mark.slow
def test_a_week_of_publishes_promotions_and_rollbacks_under_load_never_fails_a_request(
    tmp_path: Path, server: tuple[str, Path], loop_config: Callable[..., LoopConfig]
) -> None:
    """Seven windows with a server taking a bounded load all week: a worse canary on days 1 and 4 is rolled
    back, the others are promoted; no request fails and every answer comes from a version the decision log
    says was live while the request was in flight."""
    url, logs = server
    # A lenient gate lets the broken candidates through: the canary's KPIs must then catch them. Each role's
    # feedback AUC comes from about 800 rows of its own, so two equally good versions differ by up to ~0.1;
    # the broken ones (trained from scratch on inverted labels: AUC well below 0.5) trail by far more.
    config = loop_config(
        tmp_path / "work",
        gate=GateConfig(auc_margin=1.0, calibration_low=0.01, calibration_high=100.0),
        decisions=DecisionConfig(min_feedback=100, kpi_margin=0.15, psi_alarm=10.0, baseline_margin=0.1),
        canary_share=0.5,
    )
    truth = {d: _week_day(d) for d in range(8)}  # what users do (replayed with their true labels)
    trained = dict(truth)
    for d in BROKEN:
        trained[d] = inverted_training_rows(truth[d], config)
    publisher = Publisher(ServerTarget(url, "model", TOKEN))
    observer = ServerObserver(publisher, logs, config.work_dir, config.schema.dense_names, config.schema.sparse_names)
    loop = Loop(config, trained.__getitem__, publisher, observer)
    schema = config.schema

    def step(d: int) -> None:
        if d in BROKEN:  # the loop trains window d from scratch when its log says so
            loop.log.append(Record(d, "retrain", "test: a broken candidate", extra={"windows": 1}))
        loop.step(d)

    step(0)  # w0: the first version, stable
    with BackgroundLoad(url, "model", instances(truth[0].slice(0, 200), schema)) as load:
        step(1)
        for d in range(2, 7):
            seen = replay(url, "model", truth[d].slice(0, 1600), schema, batch=40, token=TOKEN)  # day d's users and clicks
            assert seen.failed == 0 and seen.feedback_accepted == 1600, seen.errors
            step(d)
    records = loop.log.records
    actions = [(r.window, r.action, r.version) for r in records if r.action not in ("trained", "retrain", "unload")]
    assert actions == [
        (0, "publish", "w0"),
        (1, "publish", "w1"),  # broken -> canary at 50%
        (2, "rollback", "w1"),  # its feedback AUC is worse
        (2, "publish", "w2"),  # warm-started from w0
        (3, "promote", "w2"),
        (3, "publish", "w3"),
        (4, "promote", "w3"),
        (4, "publish", "w4"),  # broken again
        (5, "rollback", "w4"),
        (5, "publish", "w5"),  # warm-started from w3
        (6, "promote", "w5"),
        (6, "publish", "w6"),
    ], [(r.window, r.action, r.reason) for r in records]
    rollback = next(r for r in records if r.action == "rollback")
    assert "canary worse" in rollback.reason and rollback.gate is not None
    assert rollback.gate["canary_auc"] < rollback.gate["stable_auc"]
    assert [r.extra["base"] for r in records if r.action == "trained"] == [None, None, "w0", "w2", None, "w3", "w5"]
    status = publisher.status()
    assert status is not None and status["stable"] == "w5" and status["canary"] == "w6"
    # rolled-back canaries and stables older than the one kept (keep_versions=1) are unloaded
    unloads = [(r.window, r.version) for r in records if r.action == "unload"]
    assert unloads == [(2, "w1"), (4, "w0"), (5, "w4"), (6, "w2")]
    assert status["versions"] == ["w3", "w5", "w6"]
    # requests kept being answered all week, each by a version live (by the log) while it was in flight
    assert load.failed == [] and len(load.answers) > 50
    assert load.outside(live_intervals(records)) == []
    assert set(load.versions()) >= {"w0", "w2", "w5"}
    assert (Path(config.work_dir) / "reports" / "window-2.png").is_file()
    prom = (Path(config.work_dir) / "reports" / "window-2.prom").read_text()
    assert 'role="canary"' in prom


def test_live_intervals_follow_publish_promote_and_rollback() -> None:
    def rec(t: float, action: str, version: str, **extra: str) -> Record:
        return Record(0, action, "", None, version, dict(extra), t)

    log = [
        rec(1, "publish", "w0", stable="w0"),
        rec(2, "trained", "w1"),
        rec(3, "publish", "w1", stable="w0"),
        rec(4, "rollback", "w1", stable="w0"),
        rec(5, "publish", "w2", stable="w0"),
        rec(6, "publish", "w3", stable="w0"),  # w3 replaces the canary w2 that never got a decision
        rec(7, "promote", "w3", stable="w0"),
    ]
    inf = float("inf")
    assert live_intervals(log) == {"w0": [(0.0, 7.0)], "w1": [(2.0, 4.0)], "w2": [(4.0, 6.0)], "w3": [(5.0, inf)]}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_server_down_retries_then_fails_loudly_and_publishes_nothing(
    tmp_path: Path, small_day: Day, loop_config: Callable[..., LoopConfig]
) -> None:
    config = loop_config(tmp_path / "work")
    down = Publisher(ServerTarget(f"http://127.0.0.1:{_closed_port()}", "model", TOKEN, retries=2, backoff_s=0.01))
    loop = Loop(config, small_day, down)
    with pytest.raises(PublishError, match=r"failed after 3 attempts"):
        loop.step(0)
    # trained and checkpointed, never published: a restart with the server back gates and publishes it
    assert [r.action for r in loop.log.records] == ["trained"]


def test_publish_after_a_failed_attempt_happens_once(
    tmp_path: Path, server: tuple[str, Path], small_day: Day, loop_config: Callable[..., LoopConfig]
) -> None:
    url, _ = server
    config = loop_config(tmp_path / "work")
    good = Publisher(ServerTarget(url, "model", TOKEN))
    Loop(config, small_day, good).step(0)
    flaky = Publisher(ServerTarget(url, "model", TOKEN))
    calls = {"n": 0}
    real = flaky._call

    def fail_on_canary(method: str, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
        if path.endswith("/canary"):
            calls["n"] += 1
            raise PublishError("simulated: the server went away while setting the canary")
        return real(method, path, body)

    flaky._call = fail_on_canary  # type: ignore[method-assign]
    loop = Loop(config, small_day, flaky)
    with pytest.raises(PublishError, match="simulated"):
        loop.step(1)
    status = good.status()
    assert status is not None and status["versions"] == ["w0"] and status["canary"] is None  # w1 unloaded again
    Loop(config, small_day, good).step(1)  # the restarted loop publishes w1 once
    status = good.status()
    assert status is not None and status["versions"] == ["w0", "w1"] and status["canary"] == "w1"
    assert [r.version for r in read_publishes(config)] == ["w0", "w1"]


def read_publishes(config: LoopConfig) -> list[Record]:
    return [r for r in read_log(config.log_path) if r.action == "publish"]


def test_feedback_for_unknown_ids_is_counted_not_fatal(server: tuple[str, Path]) -> None:
    url, _ = server
    assert httpx.post(f"{url}/feedback", json={"labels": [{"request_id": "nope", "label": 1}]}).status_code == 401
    with httpx.Client(headers={"authorization": f"Bearer {TOKEN}"}) as http:
        r = http.post(f"{url}/feedback", json={"labels": [{"request_id": "nope", "label": 1}]})
        assert r.status_code == 200 and r.json() == {"accepted": 0, "unknown": 1, "duplicate": 0, "expired": 0}
        bad = http.post(f"{url}/feedback", json={"labels": [{"request_id": "x", "label": "yes"}]})
        assert bad.status_code == 400 and "labels[0]" in bad.json()["error"]
        assert http.post(f"{url}/feedback", json={"labels": 3}).status_code == 400
        metrics = http.get(f"{url}/metrics").text
    assert 'hugerec_feedback_total{result="unknown"} 1.0' in metrics
