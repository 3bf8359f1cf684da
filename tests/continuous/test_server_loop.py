"""The loop against a running server: canary publish, promote, automatic rollback of a worse canary, requests
answered throughout, a server that is down, feedback for unknown request ids."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest

from hugerec.continuous.decisions import DecisionConfig
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig
from hugerec.continuous.observer import ServerObserver
from hugerec.continuous.publish import Publisher, PublishError, ServerTarget
from hugerec.continuous.traffic import instances, replay
from hugerec.data.windows import holdout_mask
from hugerec.serving.request_log import RequestLogConfig
from hugerec.serving.server import BackgroundServer, InferenceServer, ServerConfig

TOKEN = "continuous-test-token"
Day = Callable[[int], pa.Table]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    logs = tmp_path / "requests"
    srv.enable_request_log(RequestLogConfig(str(logs), seed=0))
    with BackgroundServer(srv) as url:
        yield url, logs
    srv.close()


def inverted_training_rows(table: pa.Table, config: LoopConfig) -> pa.Table:
    """The window's training rows with every label flipped (the holdout keeps the true ones): a model
    warm-started from a good one and trained on them is clearly worse. Shuffled labels only wash the
    warm start out partly, and whether the canary then lost on 1,200 feedback rows was a coin flip."""
    labels = table["label"].to_numpy().copy()
    train = ~holdout_mask(table.num_rows, config.holdout_share, config.seed)
    labels[train] = 1 - labels[train]
    return table.set_column(table.column_names.index("label"), "label", pa.array(labels))


class Load:
    """A bounded request load from a thread: one 4-row /predict at a time until stopped."""

    def __init__(self, url: str, rows: list[dict[str, object]]) -> None:
        self.url, self.rows = url, rows
        self.versions: Counter[str] = Counter()
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as http:
            i = 0
            while not self._stop.is_set():
                batch = self.rows[i % (len(self.rows) - 4) :][:4]
                try:
                    r = http.post(f"{self.url}/predict", json={"model": "model", "instances": batch})
                    if r.status_code == 200:
                        self.versions[r.json()["model_version"]] += 1
                    else:
                        self.failed.append(f"HTTP {r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                i += 4
                self._stop.wait(0.01)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@pytest.mark.slow
def test_worse_canary_is_rolled_back_and_requests_never_fail(
    tmp_path: Path, server: tuple[str, Path], small_day: Day, loop_config: Callable[..., LoopConfig]
) -> None:
    url, logs = server
    # a lenient gate lets the broken candidate through: the canary's KPIs must then catch it
    config = loop_config(
        tmp_path / "work",
        gate=GateConfig(auc_margin=1.0, calibration_low=0.01, calibration_high=100.0),
        decisions=DecisionConfig(min_feedback=100, psi_alarm=10.0, baseline_margin=0.1),
        canary_share=0.5,
    )
    days = {d: small_day(d) for d in range(5)}
    days[1] = inverted_training_rows(days[1], config)
    publisher = Publisher(ServerTarget(url, "model", TOKEN))
    observer = ServerObserver(publisher, logs, config.work_dir, config.schema.dense_names, config.schema.sparse_names)
    loop = Loop(config, days.__getitem__, publisher, observer)
    loop.step(0)  # w0: the first version, stable
    schema = config.schema
    with Load(url, instances(days[1].slice(0, 200), schema)) as load:
        loop.step(1)  # w1 (trained on inverted labels) -> canary at 50%
        seen = replay(url, "model", days[2].slice(0, 1200), schema, batch=40)
        assert seen.failed == 0 and seen.answered["w1"] > 0 and seen.feedback_accepted == 1200
        loop.step(2)  # the canary's feedback AUC is worse: rolled back; w2 (warm from w0) -> canary
        seen = replay(url, "model", days[3].slice(0, 1200), schema, batch=40)
        loop.step(3)  # w2 is as good as w0 on feedback: promoted; w3 -> canary
    actions = [(r.window, r.action, r.version) for r in loop.log.records if r.action not in ("trained",)]
    assert actions == [
        (0, "publish", "w0"),
        (1, "publish", "w1"),
        (2, "rollback", "w1"),
        (2, "publish", "w2"),
        (3, "promote", "w2"),
        (3, "publish", "w3"),
    ], [(r.window, r.action, r.reason) for r in loop.log.records]
    rollback = next(r for r in loop.log.records if r.action == "rollback")
    assert "canary worse" in rollback.reason and rollback.gate is not None
    assert rollback.gate["canary_auc"] < rollback.gate["stable_auc"]
    trained = [r.extra["base"] for r in loop.log.records if r.action == "trained"]
    assert trained == [None, "w0", "w0", "w2"]  # after the rollback, w2 warm-starts from w0, not from w1
    status = publisher.status()
    assert status is not None and status["stable"] == "w2" and status["canary"] == "w3"
    # requests kept being answered throughout, each by a version the log says was live
    live = {r.version for r in loop.log.records if r.action == "publish"}
    assert load.failed == [] and sum(load.versions.values()) > 10
    assert set(load.versions) <= live
    assert (Path(config.work_dir) / "reports" / "window-2.png").is_file()
    prom = (Path(config.work_dir) / "reports" / "window-2.prom").read_text()
    assert 'role="canary"' in prom


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


def read_publishes(config: LoopConfig) -> list[object]:
    from hugerec.continuous.decision_log import read_log

    return [r for r in read_log(config.log_path) if r.action == "publish"]


def test_feedback_for_unknown_ids_is_counted_not_fatal(server: tuple[str, Path]) -> None:
    url, _ = server
    with httpx.Client() as http:
        r = http.post(f"{url}/feedback", json={"labels": [{"request_id": "nope", "label": 1}]})
        assert r.status_code == 200 and r.json() == {"accepted": 0, "unknown": 1}
        bad = http.post(f"{url}/feedback", json={"labels": [{"request_id": "x", "label": "yes"}]})
        assert bad.status_code == 400 and "labels[0]" in bad.json()["error"]
        assert http.post(f"{url}/feedback", json={"labels": 3}).status_code == 400
        metrics = http.get(f"{url}/metrics").text
    assert 'hugerec_feedback_total{result="unknown"} 1.0' in metrics
