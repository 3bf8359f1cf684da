"""Publishing version deltas: the canary made from the stable version plus a delta answers exactly as a whole
bundle of the candidate, the stable is untouched, a failed publish (refused, checksum mismatch, lost answer,
server down) leaves no version behind; a schema change between windows goes out as a whole bundle."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pytest

from hugerec.continuous.decision_log import DecisionLog, Record
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig, ModelSpec
from hugerec.continuous.model_diff import diff_rows, table_rows, write_model_delta
from hugerec.continuous.publish import Publisher, PublishError, ServerTarget
from hugerec.continuous.traffic import instances
from hugerec.continuous.window_schema import adapt_schema, describe_change
from hugerec.data.synthetic_stream import Stream, StreamConfig
from hugerec.data.windows import table_batches
from hugerec.embedding.optimizers import Adagrad
from hugerec.models.dlrm import DLRM
from hugerec.models.model_config import DLRMConfig
from hugerec.serving.bundles.bundle_files import MANIFEST
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.model_bundle import Bundle
from hugerec.serving.bundles.version_delta import ROWS, read_version_delta
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.training.trainer import TrainConfig, fit

TOKEN = "continuous-test-token"
Day = Callable[[int], pa.Table]
SMALL = StreamConfig(days=4, rows_per_day=3000, num_sparse=4, num_dense=2, vocabulary=500, seed=3)  # as conftest's
SPEC = ModelSpec(DLRMConfig(bottom=(8, 4), top=(8, 1)), dim=4, optimizer=Adagrad(lr=0.1), capacity=300)  # 300 rows: stale ids get evicted
LENIENT = GateConfig(auc_margin=1.0, calibration_low=0.01, calibration_high=100.0, min_rows=10)


def _train(model: DLRM, rows: pa.Table, seed: int) -> DLRM:
    config = TrainConfig(epochs=1, lr=1e-2, progress=False, tensorboard=False, plot=False, device="cpu", pipeline=False, seed=seed)
    fit(model.train(), table_batches(rows, SMALL.schema, 256, shuffle=True, seed=seed), config=config)
    return model.eval()


@pytest.fixture(scope="module")
def models(small_day_module: Day, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DLRM, DLRM]:
    """The stable model's bundle, the stable model and a candidate warm-started from it on the next day
    (tables of 300 rows: the candidate evicts stale ids)."""
    spec = SPEC
    stable = _train(spec.build(SMALL.schema, 0), small_day_module(0).slice(0, 2000), 0)
    candidate = spec.build(SMALL.schema, 0)
    candidate.load_state_dict(stable.state_dict())
    candidate = _train(candidate, small_day_module(1).slice(0, 2000), 1)
    bundle = export(stable, tmp_path_factory.mktemp("b") / "w0", version="w0", schema=SMALL.schema)
    return bundle, stable, candidate


@pytest.fixture(scope="module")
def small_day_module() -> Day:
    stream = Stream(SMALL)
    days = {d: stream.day(d).table for d in range(SMALL.days)}
    return days.__getitem__


@pytest.fixture
def served(models: tuple[Path, DLRM, DLRM], tmp_path: Path) -> Iterator[tuple[InferenceServer, Publisher, str]]:
    """A server whose stable version w0 is the stable model's bundle (its content id returned)."""
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    with BackgroundServer(srv) as url:
        publisher = Publisher(ServerTarget(url, "model", TOKEN, retries=1, backoff_s=0.0))
        publisher.publish(models[0], "w0", 0.5)
        yield srv, publisher, Bundle.open(models[0], verify=False).id
    srv.close()


def _scores(srv: InferenceServer, version: str, rows: list[dict[str, object]]) -> np.ndarray:
    served = srv.model_versions("model").get(version)
    return served.model.predict(served.preprocess(rows))


def test_delta_canary_answers_as_the_whole_bundle_and_leaves_the_stable(
    served: tuple[InferenceServer, Publisher, str], models: tuple[Path, DLRM, DLRM], small_day_module: Day, tmp_path: Path
) -> None:
    srv, publisher, base_id = served
    _, stable, candidate = models
    rows = instances(small_day_module(2).slice(0, 300), SMALL.schema)  # known, new and evicted ids
    before = _scores(srv, "w0", rows)
    delta = write_model_delta(stable, candidate, tmp_path / "w1", "w0", base_id)
    read = read_version_delta(delta)
    assert all(u.deleted.shape[0] > 0 and u.keys.shape[0] > 0 for u in read.updates)  # evictions and new rows
    status = publisher.publish_delta(delta, "w0", "w1", 0.25)
    assert (status["stable"], status["canary"], status["canary_share"]) == ("w0", "w1", 0.25)
    full = export(candidate, tmp_path / "full", version="full", schema=SMALL.schema)
    srv.add_bundle(full, "model", "full")
    np.testing.assert_array_equal(_scores(srv, "w1", rows), _scores(srv, "full", rows))
    np.testing.assert_array_equal(_scores(srv, "w0", rows), before)  # the stable is untouched
    assert not np.array_equal(_scores(srv, "w1", rows), before)
    size = sum(p.stat().st_size for p in delta.glob("*") if p.is_file())
    assert size < sum(p.stat().st_size for p in (full / "embeddings").rglob("*") if p.is_file()) + (full / "dense.pt2").stat().st_size
    # publishing again (a restarted loop) loads nothing twice; a second delta on w1 is refused against w0's content
    assert publisher.publish_delta(delta, "w0", "w1", 0.25)["versions"] == ["w0", "w1", "full"]
    stale = write_model_delta(stable, candidate, tmp_path / "w2", "w1", base_id)
    with pytest.raises(PublishError, match="was made against base content"):
        publisher.publish_delta(stale, "w1", "w2", 0.25)


def _versions(publisher: Publisher) -> tuple[list[str], str | None, str | None]:
    status = publisher.status()
    assert status is not None
    return status["versions"], status["stable"], status["canary"]


@pytest.mark.parametrize("fault", ["canary refused", "load answer lost", "canary unreachable"])
def test_a_failed_publish_leaves_no_version(
    served: tuple[InferenceServer, Publisher, str],
    models: tuple[Path, DLRM, DLRM],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
) -> None:
    """A fault-injected transport: the call fails after (or instead of) reaching the server."""
    _, publisher, base_id = served
    delta = write_model_delta(models[1], models[2], tmp_path / "w1", "w0", base_id)
    real = Publisher._call

    def call(self: Publisher, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        match fault:
            case "canary refused" if path.endswith("/canary"):
                return real(self, method, path, {"version": "w1", "share": 7})  # a 400 from the server
            case "load answer lost" if path.endswith("/load_delta"):
                real(self, method, path, body)
                raise PublishError("connection reset after the request was sent")
            case "canary unreachable" if path.endswith("/canary"):
                raise PublishError("server down: retries exhausted")
        return real(self, method, path, body)

    monkeypatch.setattr(Publisher, "_call", call)
    with pytest.raises(PublishError, match="failed"):
        publisher.publish_delta(delta, "w0", "w1", 0.25)
    assert _versions(publisher) == (["w0"], "w0", None)
    assert not list(delta.glob("state-*"))  # the derived version's rows are gone with it


def test_damaged_or_foreign_deltas_are_refused(
    served: tuple[InferenceServer, Publisher, str], models: tuple[Path, DLRM, DLRM], tmp_path: Path
) -> None:
    _, publisher, base_id = served
    delta = write_model_delta(models[1], models[2], tmp_path / "w1", "w0", base_id)
    data = bytearray((delta / ROWS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (delta / ROWS).write_bytes(bytes(data))
    with pytest.raises(PublishError, match=r"checksum mismatch for rows\.parquet"):
        publisher.publish_delta(delta, "w0", "w1", 0.25)
    other = write_model_delta(models[1], models[2], tmp_path / "w2", "w0", "0" * 64)
    with pytest.raises(PublishError, match="made against base content 000000000000"):
        publisher.publish_delta(other, "w0", "w2", 0.25)
    with pytest.raises(PublishError, match="field 'base': model 'model' has no version 'w9'"):
        publisher.publish_delta(other, "w9", "w2", 0.25)
    url, auth = publisher.target.url, {"Authorization": f"Bearer {TOKEN}"}
    bad = httpx.post(f"{url}/v2/repository/models/model/load_delta", json={"delta": 3}, headers=auth)
    assert bad.status_code == 400 and "load_delta needs {'delta'" in bad.json()["error"]
    body = {"delta": str(other), "base": "w0", "version": "../w3"}
    bad = httpx.post(f"{url}/v2/repository/models/model/load_delta", json=body, headers=auth)
    assert bad.status_code == 400 and "version '../w3': use letters, digits" in bad.json()["error"]
    assert _versions(publisher) == (["w0"], "w0", None)


def test_server_down_fails_loudly(models: tuple[Path, DLRM, DLRM], tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    publisher = Publisher(ServerTarget(f"http://127.0.0.1:{port}", "model", TOKEN, retries=1, backoff_s=0.0))
    delta = write_model_delta(models[1], models[2], tmp_path / "w1", "w0", "0" * 64)
    with pytest.raises(PublishError, match=rf"server http://127.0.0.1:{port}: GET /admin/models/model failed after 2 attempts"):
        publisher.publish_delta(delta, "w0", "w1", 0.25)


def test_diff_rows_is_exact() -> None:
    """Against a plain per-key loop: new, changed (one bit), unchanged, evicted keys and the default row."""
    rng = np.random.default_rng(0)
    ks = np.array([1, 3, 5, 9], np.int64)
    rs = rng.standard_normal((4, 2)).astype(np.float32)
    kc = np.array([3, 5, 7], np.int64)
    rc = np.stack([rs[1], rs[2], rng.standard_normal(2).astype(np.float32)])
    rc[1, 0] = np.nextafter(rc[1, 0], np.float32(np.inf))
    (u,) = diff_rows({"t": (ks, rs, None)}, {"t": (kc, rc, np.ones(2, np.float32))})
    old = dict(zip(ks.tolist(), rs, strict=True))
    expect = [k for k, r in zip(kc.tolist(), rc, strict=True) if k not in old or not np.array_equal(old[k], r)]
    assert u.keys.tolist() == expect == [5, 7]
    assert u.deleted.tolist() == [k for k in ks.tolist() if k not in kc.tolist()] == [1, 9]
    assert u.default is not None and u.default.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="other tables"):
        diff_rows({"t": (ks, rs, None)}, {})


def test_table_rows_match_the_bundle(models: tuple[Path, DLRM, DLRM]) -> None:
    bundle, stable, _ = models
    rows = table_rows(stable)
    assert {t: len(k) for t, (k, _, _) in rows.items()} == Bundle.open(bundle).manifest.info["rows"]


def test_window_schema_changes_are_adapted_and_named(small_day_module: Day) -> None:
    day = small_day_module(0)
    new = day.append_column("c9", pa.array(np.arange(day.num_rows) % 7)).drop_columns(["d1"])
    schema = adapt_schema(SMALL.schema, new, "ts", "window 3")
    assert schema.dense_names == ("d0",) and schema.sparse_names == ("c0", "c1", "c2", "c3", "c9")
    old = {f.name: str(f.type) for f in day.schema if f.name != "ts"}
    now = {f.name: str(f.type) for f in new.schema if f.name != "ts"} | {"c0": "int32"}
    assert describe_change(old, now) == "new column c9 (int64); column d1 removed; column c0 retyped int64 -> int32"
    assert describe_change(old, old) is None
    with pytest.raises(ValueError, match=r"window 3: new column 'name' holds string; the loop takes new integer"):
        adapt_schema(SMALL.schema, day.append_column("name", pa.array(["x"] * day.num_rows)), "ts", "window 3")
    with pytest.raises(ValueError, match=r"window 3: column 'c0' is sparse in the loop's schema but holds double"):
        adapt_schema(SMALL.schema, day.set_column(day.column_names.index("c0"), "c0", pa.array(np.zeros(day.num_rows))), "ts", "window 3")


@pytest.mark.slow  # three loop windows with a server (a few seconds on an idle machine)
def test_loop_publishes_deltas_and_a_whole_bundle_on_a_schema_change(
    tmp_path: Path, small_day_module: Day, loop_config: Callable[..., LoopConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Window 0 goes out whole, window 1 as a delta on w0 (a kill between the server's answer and the log
    line: the restarted loop publishes it once, without writing the delta again), window 2 with a new
    column whole again, trained from scratch."""

    def day(k: int) -> pa.Table:
        t = small_day_module(k).slice(0, 3000)
        return t.append_column("c9", pa.array(np.arange(t.num_rows) % 11)) if k >= 2 else t

    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    with BackgroundServer(srv) as url:
        publisher = Publisher(ServerTarget(url, "model", TOKEN))
        config = dataclasses.replace(loop_config(tmp_path, gate=LENIENT, epochs=1), schema=SMALL.schema, model=SPEC)
        Loop(config, day, publisher).step(0)
        append = DecisionLog.append

        def killed_before_publish_record(self: DecisionLog, record: Record) -> Record:
            if record.action == "publish":
                raise SystemExit("kill -9")
            return append(self, record)

        monkeypatch.setattr(DecisionLog, "append", killed_before_publish_record)
        with pytest.raises(SystemExit):
            Loop(config, day, publisher).step(1)
        monkeypatch.undo()
        written = (tmp_path / "updates" / "w1" / MANIFEST).stat().st_mtime_ns
        assert _versions(publisher) == (["w0", "w1"], "w0", "w1")
        loop = Loop(config, day, publisher)  # the restart: everything from the log and the server
        loop.step(1)
        assert (tmp_path / "updates" / "w1" / MANIFEST).stat().st_mtime_ns == written
        publisher.promote("w1")
        loop.step(2)
        published = [r for r in loop.log.records if r.action == "publish"]
        assert [(r.version, r.extra["mode"]) for r in published] == [("w0", "bundle"), ("w1", "delta"), ("w2", "bundle")]
        assert "whole bundle (nothing serves yet)" in published[0].reason
        assert "version delta on w0" in published[1].reason and published[1].extra["base"] == "w0"
        assert "whole bundle (schema changed since w1: new column c9 (int64))" in published[2].reason
        assert published[1].extra["bytes"] < published[0].extra["bytes"]
        trained = [r for r in loop.log.records if r.action == "trained"]
        assert trained[2].reason == "from scratch on 1 window(s): the schema changed since w1 (new column c9 (sparse))"
        assert loop.schema_of("w2").sparse_names[-1] == "c9"
        assert srv.model_versions("model").get("w2").model.features[-1] == "c9"
        assert _versions(publisher) == (["w0", "w1", "w2"], "w1", "w2")
        assert not (tmp_path / "bundles" / "w1").exists()
    srv.close()


def test_a_retrain_across_a_schema_change_leaves_out_the_windows_without_the_new_column(
    tmp_path: Path, small_day_module: Day, loop_config: Callable[..., LoopConfig]
) -> None:
    """Windows 1 and 2 add column c9; a from-scratch retrain of window 2 over 3 windows cannot feed c9 from
    window 0, so it trains on windows 1 and 2 and says which window it left out (it used to fail joining them)."""

    def day(k: int) -> pa.Table:
        t = small_day_module(k).slice(0, 2000)
        return t.append_column("c9", pa.array(np.arange(t.num_rows) % 11)) if k >= 1 else t

    config = dataclasses.replace(loop_config(tmp_path, gate=LENIENT, epochs=1), schema=SMALL.schema, model=SPEC)
    loop = Loop(config, day)  # offline: no server
    for k in range(2):
        loop.step(k)
    loop.log.append(Record(2, "retrain", "drift (the test's)", extra={"windows": 3}))
    loop.step(2)
    trained = [r for r in loop.log.records if r.action == "trained"]
    assert [r.window for r in trained] == [0, 1, 2]
    assert trained[2].reason == "from scratch on 2 window(s) (windows [0] lack columns of window 2: left out)"
    assert trained[2].extra["base"] is None and loop.schema_of("w2").sparse_names[-1] == "c9"


@pytest.mark.parametrize("kind", ["dcn_v2", "deepfm", "wide_and_deep"])
def test_every_ranking_type_of_the_loop_publishes_a_delta_that_answers_as_its_whole_bundle(
    kind: str, small_day_module: Day, tmp_path: Path
) -> None:
    """The loop's other ranking types (built by the registry; DeepFM and Wide & Deep carry a second, dim-1
    collection of dynamic tables) go out as version deltas whose canary answers as the candidate's whole bundle."""
    from hugerec.models.registry import config_from_dict

    spec = dataclasses.replace(SPEC, model=config_from_dict({"type": kind, "deep": [8]}))
    stable = _train(spec.build(SMALL.schema, 0), small_day_module(0).slice(0, 1500), 0)
    candidate = spec.build(SMALL.schema, 0)
    candidate.load_state_dict(stable.state_dict())
    candidate = _train(candidate, small_day_module(1).slice(0, 1500), 1)
    assert len(candidate.embedding_collections()) == (1 if kind == "dcn_v2" else 2)
    rows = instances(small_day_module(2).slice(0, 200), SMALL.schema)
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    with BackgroundServer(srv) as url:
        publisher = Publisher(ServerTarget(url, "model", TOKEN, retries=1, backoff_s=0.0))
        base = export(stable, tmp_path / "w0", version="w0", schema=SMALL.schema)
        publisher.publish(base, "w0", 0.5)
        delta = write_model_delta(stable, candidate, tmp_path / "w1", "w0", Bundle.open(base, verify=False).id)
        assert publisher.publish_delta(delta, "w0", "w1", 0.5)["canary"] == "w1"
        srv.add_bundle(export(candidate, tmp_path / "full", version="full", schema=SMALL.schema), "model", "full")
        np.testing.assert_array_equal(_scores(srv, "w1", rows), _scores(srv, "full", rows))
        assert not np.array_equal(_scores(srv, "w1", rows), _scores(srv, "w0", rows))
    srv.close()
