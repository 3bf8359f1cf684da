"""Version hygiene on a long-running server: a delta-built version's state folder lives exactly as long as the
version (a dead server's leftovers are removed, a live one's never), unloading waits for requests in flight,
and the loop keeps at most the stable, the canary and `keep_versions` previous stables loaded, logging each
unload once even across a kill."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pytest

from hugerec.continuous.decision_log import DecisionLog, Record, live_intervals
from hugerec.continuous.decisions import DecisionConfig, Kpis, Observation
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig, ModelSpec
from hugerec.continuous.model_diff import write_model_delta
from hugerec.continuous.publish import Publisher, PublishError, ServerTarget
from hugerec.continuous.traffic import BackgroundLoad, instances
from hugerec.data.synthetic_stream import Stream, StreamConfig
from hugerec.data.windows import table_batches
from hugerec.embedding.optimizers import Adagrad
from hugerec.models.dlrm import DLRM
from hugerec.models.model_config import DLRMConfig
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.model_bundle import Bundle
from hugerec.serving.bundles.version_delta import read_version_delta
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.store.owned_dirs import LOCK
from hugerec.serving.store.parameter_server import ParameterServer
from hugerec.training.trainer import TrainConfig, fit

TOKEN = "continuous-test-token"
STREAM = StreamConfig(days=7, rows_per_day=1500, num_sparse=4, num_dense=2, vocabulary=300, seed=5)
SPEC = ModelSpec(DLRMConfig(bottom=(8, 4), top=(8, 1)), dim=4, optimizer=Adagrad(lr=0.1), capacity=400)
LENIENT = GateConfig(auc_margin=1.0, calibration_low=0.01, calibration_high=100.0, min_rows=10)


@cache
def _day(d: int) -> pa.Table:
    return Stream(STREAM).day(d).table


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DLRM, DLRM]:
    """w0's bundle, the model w0 and a candidate trained on from it (a delta's two ends)."""
    config = TrainConfig(epochs=1, lr=1e-2, progress=False, tensorboard=False, plot=False, device="cpu", pipeline=False)
    stable = SPEC.build(STREAM.schema, 0)
    fit(stable.train(), table_batches(_day(0), STREAM.schema, 256, shuffle=True, seed=0), config=config)
    candidate = SPEC.build(STREAM.schema, 0)
    candidate.load_state_dict(stable.state_dict())
    fit(candidate.train(), table_batches(_day(1), STREAM.schema, 256, shuffle=True, seed=1), config=config)
    bundle = export(stable.eval(), tmp_path_factory.mktemp("b") / "w0", version="w0", schema=STREAM.schema)
    return bundle, stable, candidate.eval()


@pytest.fixture
def served(models: tuple[Path, DLRM, DLRM]) -> Iterator[tuple[InferenceServer, Publisher, str]]:
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    with BackgroundServer(srv) as url:
        publisher = Publisher(ServerTarget(url, "model", TOKEN, retries=1, backoff_s=0.0))
        publisher.publish(models[0], "w0", 0.5)
        yield srv, publisher, Bundle.open(models[0], verify=False).id
    srv.close()


def _states(delta: Path) -> list[str]:
    return sorted(p.name for p in delta.iterdir() if p.name.startswith("state-") and p.is_dir())


def test_state_folders_live_with_their_version_and_dead_ones_are_removed(
    served: tuple[InferenceServer, Publisher, str],
    models: tuple[Path, DLRM, DLRM],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, publisher, base_id = served
    delta = write_model_delta(models[1], models[2], tmp_path / "w1", "w0", base_id)
    files = sorted(p.name for p in delta.iterdir())
    # another live server sharing the folder (its own copy of w0's state) holds a version built from the delta
    other = InferenceServer(ServerConfig(seed=0), ServeOptions(state_dir=str(tmp_path / "other-state")))
    other.add_bundle(models[0], "model", "w0")
    other.add_version_delta(delta, "model", "w0", "w1")
    (held,) = _states(delta)
    # a server killed while building (or serving) w1: its folder and an unheld lock; and a lockless leftover
    dead = delta / "state-w1.dead"
    (dead / "rocksdb").mkdir(parents=True)
    (delta / ("state-w1.dead" + LOCK)).write_text('{"pid": 1}')
    (delta / "state-w1.old").mkdir()
    sibling = write_model_delta(models[1], models[2], tmp_path / "w7", "w0", base_id)  # a delta never loaded again
    (sibling / "state-w7.dead").mkdir()
    (tmp_path / "other" / "state-x").mkdir(parents=True)  # not a version delta: none of ours
    publisher.publish_delta(delta, "w0", "w1", 0.25)  # this server's load of the delta cleans up
    mine = [s for s in _states(delta) if s != held]
    assert len(mine) == 1 and sorted(_states(delta)) == sorted([held, *mine])
    assert _states(sibling) == [] and (tmp_path / "other" / "state-x").is_dir()
    # a failure while building leaves no folder
    real = ParameterServer.apply

    def fail(self: ParameterServer, *args: Any, **kw: Any) -> None:
        raise ValueError("simulated: the disk is full")

    monkeypatch.setattr(ParameterServer, "apply", fail)
    with pytest.raises(ValueError, match="disk is full"):
        other.add_version_delta(delta, "model", "w0", "w2")
    monkeypatch.setattr(ParameterServer, "apply", real)
    assert sorted(_states(delta)) == sorted([held, *mine])
    other.unload("model", "w1")  # unloading a delta-built version removes its folder
    assert _states(delta) == mine
    other.close()
    publisher.rollback("w1")
    assert publisher.unload("w1") is True
    assert _states(delta) == [] and sorted(p.name for p in delta.iterdir()) == files  # the delta stays whole
    read_version_delta(delta)


def test_unload_waits_for_requests_in_flight_and_refuses_what_serves(
    served: tuple[InferenceServer, Publisher, str], models: tuple[Path, DLRM, DLRM], tmp_path: Path
) -> None:
    srv, publisher, base_id = served
    delta = write_model_delta(models[1], models[2], tmp_path / "w1", "w0", base_id)
    publisher.publish_delta(delta, "w0", "w1", 0.25)
    url, auth = publisher.target.url, {"Authorization": f"Bearer {TOKEN}"}
    unload = f"{url}/v2/repository/models/model/unload"
    for version, code, says in [
        ("w0", 400, "serving traffic"),
        ("w1", 400, "serving traffic"),
        ("w9", 404, "no version 'w9'"),
    ]:
        r = httpx.post(unload, json={"version": version}, headers=auth)
        assert r.status_code == code and says in r.json()["error"] and "field 'version'" in r.json()["error"]
    assert (
        httpx.post(f"{url}/v2/repository/models/nope/unload", json={"version": "w0"}, headers=auth).status_code == 404
    )
    with pytest.raises(PublishError, match="serving traffic: not unloading it"):
        publisher.unload("w1")
    publisher.rollback("w1")
    served_w1 = srv.model_versions("model").get("w1")
    started, run = threading.Event(), served_w1.batcher.run

    def slow(inputs: Any) -> np.ndarray:
        started.set()
        time.sleep(0.5)
        return run(inputs)

    served_w1.batcher.run = slow
    rows = instances(_day(2).slice(0, 300), STREAM.schema)  # >= offload_rows: the batch runs on a worker thread
    answers: dict[int, httpx.Response] = {}

    def send(i: int, n: int) -> None:
        answers[i] = httpx.post(f"{url}/predict", json={"version": "w1", "instances": rows[:n]}, timeout=30)

    first = threading.Thread(target=send, args=(0, 300))
    first.start()
    assert started.wait(10)  # the first request's batch runs; the second waits in the batcher behind it
    second = threading.Thread(target=send, args=(1, 2))
    second.start()
    deadline = time.monotonic() + 10
    while not served_w1.batcher._pending and time.monotonic() < deadline:
        time.sleep(0.005)
    assert publisher.unload("w1") is True  # answers once both requests are answered
    first.join()
    second.join()
    assert [(a.status_code, a.json().get("model_version")) for a in answers.values()] == [(200, "w1")] * 2
    gone = httpx.post(f"{url}/predict", json={"version": "w1", "instances": rows[:2]})
    assert gone.status_code == 404 and "no version 'w1'" in gone.json()["error"]
    assert publisher.unload("w1") is False  # absent: nothing to do
    assert _states(delta) == []


def test_live_intervals_end_at_an_unload() -> None:
    def rec(t: float, action: str, version: str) -> Record:
        return Record(0, action, "", None, version, {"stable": "w0"}, t)

    log = [rec(1, "publish", "w0"), rec(2, "publish", "w1"), rec(3, "rollback", "w1"), rec(4, "unload", "w1")]
    log += [rec(5, "publish", "w2"), rec(6, "promote", "w2"), rec(7, "unload", "w0"), rec(8, "unload", "w9")]
    inf = float("inf")
    assert live_intervals(log) == {"w0": [(0.0, 6.0)], "w1": [(1.0, 3.0)], "w2": [(4.0, inf)]}


ROLLED_BACK = (2, 5)  # windows whose decision rolls the canary back (scripted observations)


def _observe(k: int, reference: pa.Table | None) -> Observation:
    stable = Kpis(count=500, auc=0.75, ctr=0.2, mean_prediction=0.2)
    canary = dataclasses.replace(stable, auc=0.55 if k in ROLLED_BACK else 0.76)
    return Observation({"stable": stable, "canary": canary}, {})


@pytest.mark.slow  # six loop windows with a server and a request thread (4-9 s)
def test_the_loop_keeps_stable_canary_and_keep_versions_loaded_across_a_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six windows with requests all along: rolled-back canaries and stables beyond keep_versions=1 are
    unloaded; a kill between the server's unload and its record is logged once on restart, as already gone;
    no request fails and every answer comes from a version live (by the log) while it was in flight."""
    decisions = DecisionConfig(min_feedback=10, confidence_z=0.0, psi_alarm=10.0, baseline_margin=1.0)
    config = LoopConfig(
        str(tmp_path / "work"), STREAM.schema, model=SPEC, gate=LENIENT, decisions=decisions, batch_size=256,
        lr=1e-2, canary_share=0.5, keep_versions=1,
    )  # fmt: skip
    append = DecisionLog.append

    def killed(self: DecisionLog, record: Record) -> Record:
        if record.action == "unload":
            raise SystemExit("kill -9")
        return append(self, record)

    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    with BackgroundServer(srv) as url:
        publisher = Publisher(ServerTarget(url, "model", TOKEN))
        loop = Loop(config, _day, publisher, _observe)
        loop.step(0)
        loaded = []
        with BackgroundLoad(url, "model", instances(_day(0).slice(0, 100), STREAM.schema)) as load:
            for k in range(1, 6):
                if k == 4:  # killed after the server unloaded w0, before the record
                    monkeypatch.setattr(DecisionLog, "append", killed)
                    with pytest.raises(SystemExit):
                        loop.step(k)
                    monkeypatch.undo()
                    loop = Loop(config, _day, publisher, _observe)
                loop.step(k)
                status = publisher.status()
                assert status is not None
                loaded.append(status["versions"])
        records = loop.log.records
    srv.close()
    assert all(len(v) <= 2 + config.keep_versions for v in loaded), loaded
    assert loaded[-1] == ["w2", "w3", "w5"] and (status["stable"], status["canary"]) == ("w3", "w5")
    unloads = [(r.window, r.version, r.extra["unloaded"]) for r in records if r.action == "unload"]
    assert unloads == [(2, "w1", True), (4, "w0", False), (5, "w4", True)], [
        (r.window, r.action, r.reason) for r in records
    ]
    assert "already not loaded" in next(r.reason for r in records if r.version == "w0" and r.action == "unload")
    assert "rolled back in window 5" in next(r.reason for r in records if r.version == "w4" and r.action == "unload")
    assert [r.version for r in records if r.action == "publish"] == [f"w{k}" for k in range(6)]  # each once
    assert load.failed == [] and len(load.answers) > 20
    assert load.outside(live_intervals(records)) == []
    assert not list((tmp_path / "work" / "updates").glob("*/state-*"))  # w1, w4 derived: their folders gone with them
    assert [(r.version, r.extra["mode"]) for r in records if r.action == "publish"][:2] == [
        ("w0", "bundle"),
        ("w1", "delta"),
    ]
    work = tmp_path / "work"
    assert sorted(p.name for p in (work / "updates").iterdir()) == ["w2", "w3", "w5"]  # unloaded w1, w4: deltas gone
    assert sorted(p.name for p in (work / "bundles").iterdir()) == ["w0"]  # unloaded, but w2, w3, w5 build on it


def test_publish_folders_of_unloaded_versions_go_unless_a_loaded_version_builds_on_them(tmp_path: Path) -> None:
    """w0 a whole bundle, w1 a delta on w0, w2 a whole bundle (a schema change), w3 a delta on w1: the folders of
    unloaded versions are deleted, but a whole bundle stays while a loaded version's chain of deltas starts there."""
    loop = Loop(LoopConfig(str(tmp_path), STREAM.schema, model=SPEC), _day)
    for v, mode, base in (("w0", "bundle", None), ("w1", "delta", "w0"), ("w2", "bundle", None), ("w3", "delta", "w1")):
        loop.log.append(Record(int(v[1]), "publish", "test", None, v, extra={"mode": mode, "base": base}))
        (loop.bundle(v) if mode == "bundle" else loop.update(v)).mkdir(parents=True)
    for v in ("w0", "w1"):
        loop.log.append(Record(3, "unload", "test", None, v, extra={"unloaded": True}))
    loop._drop_publish_folders({"w2", "w3"})
    assert not loop.update("w1").exists() and loop.bundle("w0").is_dir()  # w3 is w0 + two deltas
    assert loop.update("w3").is_dir() and loop.bundle("w2").is_dir()
    loop.log.append(Record(4, "unload", "test", None, "w3", extra={"unloaded": True}))
    loop._drop_publish_folders({"w2"})
    assert not loop.bundle("w0").exists() and not loop.update("w3").exists() and loop.bundle("w2").is_dir()
