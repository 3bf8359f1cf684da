"""Live updates: directory and Redis Streams sources, refusals, no replay after restart, and atomic switches under load."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from hugerec.embedding.delta import TableDelta, UnknownRow, write_delta
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.runtime.inference_protocol import Signature, to_model_inputs
from hugerec.serving.store.parameter_server import TableUpdate
from hugerec.serving.store.updates import (
    DirectorySource,
    RedisStreamSource,
    UpdateWatcher,
    publish_to_directory,
    publish_to_stream,
)


def delta(table: str, keys: np.ndarray, rows: np.ndarray, unknown: np.ndarray | None = None) -> TableDelta:
    n = keys.shape[0]
    return TableDelta(
        table=table,
        dim=rows.shape[1],
        dtype="fp32",
        optimizer={"type": "sgd", "lr": 0.1, "weight_decay": 0.0},
        since_step=0,
        keys=torch.from_numpy(keys.astype(np.int64)),
        vectors=torch.from_numpy(rows.astype(np.float32)),
        state={},
        steps=torch.zeros(n, dtype=torch.int64),
        unknown=None if unknown is None else UnknownRow(torch.from_numpy(unknown.astype(np.float32)), {}, 0),
    )


def retrained(toy: Any, seed: int) -> DLRM:
    """The toy model with every row of both tables and every dense weight changed."""
    other: DLRM = copy.deepcopy(toy.model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in ("user", "item"):
            w = other.sparse_arch.table_weight(t)
            w.copy_(torch.randn(w.shape, generator=gen))
        for p in other.dense_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return other


def deltas_of(model: DLRM) -> list[TableDelta]:
    out = []
    for t in ("user", "item"):
        w = model.sparse_arch.table_weight(t).detach().numpy()
        out.append(delta(t, np.arange(w.shape[0]), w))
    return out


def scores(loaded: Any, toy: Any, batch: Any) -> np.ndarray:
    logits = loaded.model.predict(to_model_inputs(toy.tensors(batch), Signature(4, toy.features)))
    return torch.sigmoid(torch.from_numpy(logits)).numpy()


def test_directory_updates_apply_in_order_and_survive_restarts(toy: Any, tmp_path: Path) -> None:
    updates = tmp_path / "updates"
    options = ServeOptions(state_dir=str(tmp_path / "state"))
    new = retrained(toy, 1)
    batch = toy.batch(10, seed=1)
    loaded = load_bundle(toy.bundle, options)
    results: list[str] = []
    watcher = UpdateWatcher(
        loaded.model, DirectorySource(updates), loaded.model.ps.persistent, loaded.state_dir, 0.05, results.append
    )
    # step-10 sorts after step-9 (natural order): its rows win
    publish_to_directory(updates, "step-10", deltas_of(new), dense=new.state_dict())
    publish_to_directory(updates, "step-9", [delta("user", np.arange(5), np.ones((5, 8)))])
    (updates / ".step-11.tmp").mkdir()  # an update still being written: ignored
    assert watcher.poll_once() == 2 and results == ["applied", "applied"]
    np.testing.assert_allclose(scores(loaded, toy, batch), toy.offline(batch, new), rtol=1e-5, atol=1e-6)
    assert loaded.model.ps.versions() == {"user": 2, "item": 1}
    loaded.close()

    loaded = load_bundle(toy.bundle, options)  # restart: rows from RocksDB, dense weights kept in the state dir
    try:
        np.testing.assert_allclose(scores(loaded, toy, batch), toy.offline(batch, new), rtol=1e-5, atol=1e-6)
        again = UpdateWatcher(loaded.model, DirectorySource(updates), loaded.model.ps.persistent, loaded.state_dir)
        assert again.poll_once() == 0  # nothing replayed
        assert len(list((tmp_path / "state").glob("dense-*.pt"))) == 1
    finally:
        loaded.close()


def test_bad_updates_are_refused_whole_and_the_next_one_applies(toy: Any, tmp_path: Path) -> None:
    updates = tmp_path / "updates"
    loaded = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        results: list[str] = []
        watcher = UpdateWatcher(
            loaded.model, DirectorySource(updates), loaded.model.ps.persistent, None, 1.0, results.append
        )
        publish_to_directory(
            updates, "u1", [delta("user", np.arange(3), np.ones((3, 8))), delta("nope", np.arange(2), np.ones((2, 8)))]
        )
        publish_to_directory(updates, "u2", [delta("user", np.arange(3), np.ones((3, 4)))])
        write_delta(
            [delta("user", np.arange(3), np.full((3, 8), 2.0), unknown=np.full(8, 5.0))], updates / "u3.parquet"
        )
        (updates / "u4.pt").write_bytes(b"garbage")
        import os

        os.utime(updates / "u4.pt", (time.time() - 3600, time.time() - 3600))  # old enough: not a write in progress
        assert watcher.poll_once() == 1
        assert results == ["refused", "refused", "applied", "refused"]
        assert (
            "unknown table 'nope'" in watcher.errors[0]
            and "width 4" in watcher.errors[1]
            and "u4.pt" in watcher.errors[2]
        )
        rows = loaded.model.ps.lookup("user", np.array([0, 1, 2, 999], np.int64)).numpy()
        np.testing.assert_array_equal(rows[:3], 2.0)  # u1 was refused whole: its user rows never showed
        np.testing.assert_array_equal(rows[3], 5.0)  # the new default row of keys without one
    finally:
        loaded.close()


def test_redis_stream_source(toy: Any, tmp_path: Path, redis_url: str) -> None:
    stream = f"updates-{uuid.uuid4().hex}"
    loaded = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        source = RedisStreamSource(redis_url, stream)
        watcher = UpdateWatcher(loaded.model, source, loaded.model.ps.persistent, loaded.state_dir)
        new = retrained(toy, 2)
        tables = [TableUpdate(d.table, d.keys.numpy(), d.vectors.numpy()) for d in deltas_of(new)]
        first = publish_to_stream(redis_url, stream, tables, dense=new.state_dict())
        import redis

        redis.Redis.from_url(redis_url).xadd(stream, {"tables": "not json"})
        redis.Redis.from_url(redis_url).xadd(stream, {"tables": "[" * 100_000 + "]" * 100_000})  # too deep
        assert watcher.poll_once() == 1 and len(watcher.errors) == 2 and "malformed" in watcher.errors[0]
        assert "malformed update: RecursionError" in watcher.errors[1]
        batch = toy.batch(6, seed=3)
        np.testing.assert_allclose(scores(loaded, toy, batch), toy.offline(batch, new), rtol=1e-5, atol=1e-6)
        assert loaded.model.ps.persistent is not None
        assert loaded.model.ps.persistent.get_meta(watcher.meta_key) not in (None, first)  # past the refused entry too
        assert watcher.poll_once() == 0
        with pytest.raises(ValueError, match="nothing to publish"):
            publish_to_stream(redis_url, stream)
    finally:
        loaded.close()


def test_update_during_http_load_is_never_half_applied(toy: Any, tmp_path: Path) -> None:
    updates = tmp_path / "updates"
    server = InferenceServer(
        ServerConfig(batching=BatchingConfig(max_batch_size=64, max_delay_ms=1)),
        ServeOptions(state_dir=str(tmp_path / "state"), updates_dir=str(updates), update_interval=0.05),
    )
    served = server.add_bundle(toy.bundle)
    new = retrained(toy, 3)
    batch = toy.batch(8, seed=9)
    old_scores, new_scores = toy.offline(batch), toy.offline(batch, new)
    assert np.abs(old_scores - new_scores).min() > 1e-3
    body = {
        "inputs": [
            {
                "name": k,
                "datatype": {"f": "FP32", "i": "INT64"}[v.dtype.kind] if v.dtype != np.int32 else "INT32",
                "shape": list(v.shape),
                "data": v.ravel().tolist(),
            }
            for k, v in toy.tensors(batch).items()
        ]
    }
    seen: list[str] = []
    errors: list[str] = []
    stop = threading.Event()

    def client(url: str) -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(400):  # bounded
                if stop.is_set():
                    return
                r = c.post(f"{url}/v2/models/toy/infer", json=body)
                got = np.array(next(o for o in r.json()["outputs"] if o["name"] == "scores")["data"], np.float32)
                if np.allclose(got, old_scores, rtol=1e-5, atol=1e-6):
                    seen.append("old")
                elif np.allclose(got, new_scores, rtol=1e-5, atol=1e-6):
                    seen.append("new")
                else:
                    errors.append(f"a mix of versions: {got} (old {old_scores}, new {new_scores})")

    try:
        with BackgroundServer(server) as url:
            threads = [threading.Thread(target=client, args=(url,)) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(0.3)
            publish_to_directory(updates, "step-1", deltas_of(new), dense=new.state_dict())
            watcher = served.info["watchers"][0]
            deadline = time.monotonic() + 30
            while watcher.applied < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)
            stop.set()
            for t in threads:
                t.join(timeout=60)
            r = httpx.post(f"{url}/v2/models/toy/infer", json=body)
            after = np.array(next(o for o in r.json()["outputs"] if o["name"] == "scores")["data"], np.float32)
    finally:
        server.close()
    assert not errors, errors[:2]
    assert "old" in seen and "new" in seen
    assert seen.index("new") > 0 and "old" not in seen[len(seen) - seen[::-1].index("old") :]
    np.testing.assert_allclose(after, new_scores, rtol=1e-5, atol=1e-6)
