"""The HTTP server through real sockets on 127.0.0.1: the official tritonclient, /predict, bad input, admin, metrics."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.export import export
from hugerec.serving.http.limits import RequestLimits
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.runtime.served_model import ServedModel

TOKEN = "t" * 24


@pytest.fixture(scope="module")
def server(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InferenceServer, str]]:
    state = tmp_path_factory.mktemp("server")
    srv = InferenceServer(
        ServerConfig(
            batching=BatchingConfig(max_batch_size=64, max_delay_ms=2),
            limits=RequestLimits(max_request_bytes=1 << 16, max_json_bytes=1 << 16, max_request_rows=256),
            admin_token=TOKEN,
            seed=0,
        ),
        ServeOptions(state_dir=str(state / "v1")),
    )
    srv.add_bundle(toy.bundle)
    with BackgroundServer(srv) as url:
        yield srv, url
    srv.close()


def triton_inputs(tensors: dict[str, np.ndarray], binary: bool) -> list[triton.InferInput]:
    out = []
    for name, array in tensors.items():
        dtype = {np.float32: "FP32", np.int64: "INT64", np.int32: "INT32"}[array.dtype.type]
        t = triton.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array, binary_data=binary)
        out.append(t)
    return out


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_gets_the_offline_predictions(toy: Any, server: tuple[InferenceServer, str], binary: bool) -> None:
    _, url = server
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("toy")
    meta = client.get_model_metadata("toy")
    assert [i["name"] for i in meta["inputs"]] == ["dense", *toy.features] and meta["versions"] == ["1"]
    assert client.get_model_config("toy")["max_batch_size"] == 64
    batch = toy.batch(16, seed=11)
    outputs = [
        triton.InferRequestedOutput("scores", binary_data=binary),
        triton.InferRequestedOutput("logits", binary_data=binary),
    ]
    result = client.infer("toy", triton_inputs(toy.tensors(batch), binary), outputs=outputs, request_id="abc")
    np.testing.assert_allclose(result.as_numpy("scores"), toy.offline(batch), rtol=1e-5, atol=1e-6)
    assert result.get_response()["id"] == "abc"
    padded = {
        "dense": batch.dense.numpy(),
        **{f: batch.sparse[f].to_padded(padding_value=-1).long().numpy() for f in toy.features},
    }
    padded = {k: v if v.shape[-1] or v.ndim == 1 else np.full((16, 1), -1) for k, v in padded.items()}
    result = client.infer("toy", triton_inputs(padded, binary), model_version="1")
    np.testing.assert_allclose(result.as_numpy("scores"), toy.offline(batch), rtol=1e-5, atol=1e-6)
    with pytest.raises(InferenceServerException, match="missing inputs"):
        client.infer("toy", triton_inputs({"dense": batch.dense.numpy()}, binary))


def _mixed_forms(toy: Any, batch: Any, form: int) -> dict[str, np.ndarray]:
    """The KServe inputs of `batch` in one of three encodings, so that merged requests mix them:
    0: int64 values + int32 lengths, 1: int32 values + int64 lengths, 2: [B, L] padded with -1."""
    tensors = toy.tensors(batch)
    match form:
        case 0:
            return tensors
        case 1:
            return {
                k: v.astype(np.int64 if k.endswith(".lengths") else np.int32) if k != "dense" else v
                for k, v in tensors.items()
            }
        case _:
            padded = {f: batch.sparse[f].to_padded(padding_value=-1).long().numpy() for f in toy.features}
            return {
                "dense": tensors["dense"],
                **{f: p if p.shape[1] else np.full((p.shape[0], 1), -1) for f, p in padded.items()},
            }


def test_predict_and_concurrent_requests_match_offline(toy: Any, server: tuple[InferenceServer, str]) -> None:
    srv, url = server
    batch = toy.batch(5, seed=2)
    r = httpx.post(f"{url}/predict", json={"instances": toy.instances(batch)})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["predictions"], toy.offline(batch), rtol=1e-5, atol=1e-6)

    # the offline reference runs here, in one thread: the eager embedding lookup keeps per-module scratch
    # buffers and must not be called from several threads at once (that, not the server, once failed here)
    batches = [toy.batch(1 + seed % 9, seed=100 + seed) for seed in range(48)]
    expected = [toy.offline(b) for b in batches]
    # rows mixed up between merged requests would move scores by ~1e-3: far beyond the tolerance
    assert min(np.ptp(np.concatenate(expected)), *(np.ptp(e) for e in expected if e.shape[0] > 1)) > 1e-4
    types = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}
    merged_before = _merged_calls(srv)

    def one(seed: int) -> np.ndarray:
        tensors = _mixed_forms(toy, batches[seed], seed % 3)
        body = {
            "inputs": [
                {"name": k, "datatype": types[v.dtype], "shape": list(v.shape), "data": v.ravel().tolist()}
                for k, v in tensors.items()
            ]
        }
        with httpx.Client() as c:
            resp = c.post(f"{url}/v2/models/toy/infer", json=body)
        assert resp.status_code == 200, resp.text
        return np.array(next(o for o in resp.json()["outputs"] if o["name"] == "scores")["data"])

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(len(batches))))
    for seed, (scores, want) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-6, err_msg=f"request {seed}")
    assert _merged_calls(srv) > merged_before  # some model calls served several requests


def _merged_calls(srv: InferenceServer) -> float:
    """Model calls of toy version 1 that served more than one request (from the batch-size histogram)."""
    for metric in srv.metrics.registry.collect():
        if metric.name == "hugerec_batch_requests":
            samples = [s for s in metric.samples if s.labels.get("model") == "toy" and s.labels.get("version") == "1"]
            total = next(s.value for s in samples if s.name.endswith("_count"))
            one = next(s.value for s in samples if s.name.endswith("_bucket") and float(s.labels["le"]) == 1.0)
            return total - one
    raise AssertionError("no hugerec_batch_requests metric")


def test_bad_requests_get_4xx_and_the_server_lives_on(server: tuple[InferenceServer, str]) -> None:
    _, url = server
    infer = f"{url}/v2/models/toy/infer"
    with httpx.Client() as c:
        cases = [
            (c.post(infer, content=b"{nope"), 400, "not valid JSON"),
            (c.post(f"{url}/v2/models/nope/infer", json={"inputs": []}), 404, "unknown model 'nope'"),
            (c.post(f"{url}/v2/models/toy/versions/7/infer", json={"inputs": []}), 404, "no version '7'"),
            (
                c.post(
                    infer, json={"inputs": [{"name": "dense", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
                ),
                400,
                "missing",
            ),
            (c.post(infer, content=b"x" * (1 << 17)), 413, "exceeds the limit"),
            (
                c.post(
                    f"{url}/predict", json={"instances": [{"dense": [1] * 4, "user": 1, "item": 1, "last_item": "x"}]}
                ),
                400,
                "integer ids",
            ),
            (c.post(f"{url}/predict", json={"instances": [{"dense": [1] * 4}] * 300}), 413, "at most 256"),
            (c.get(infer), 405, ""),
            (c.get(f"{url}/nowhere"), 404, ""),
        ]
        for response, status, message in cases:
            assert response.status_code == status, (response.status_code, response.text)
            assert message in response.json()["error"]
        rng = random.Random(0)
        for _ in range(30):  # garbage of every kind: never a 5xx
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
            assert c.post(infer, content=junk).status_code < 500
            shape = [rng.randrange(-1, 4) for _ in range(rng.randrange(3))]
            spec = {
                "name": rng.choice(["dense", "user", "item"]),
                "datatype": rng.choice(["FP32", "INT64", "BOOL"]),
                "shape": shape,
                "data": [rng.choice([1, 1.5, "a", None, [1]]) for _ in range(rng.randrange(5))],
            }
            assert c.post(infer, json={"inputs": [spec]}).status_code < 500
        assert c.get(f"{url}/v2/health/live").status_code == 200


def test_admin_versions_canary_promote_rollback(
    toy: Any, server: tuple[InferenceServer, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv, url = server
    other = copy.deepcopy(toy.model)
    with torch.no_grad():
        for p in other.dense_parameters():
            p.add_(0.5)
    bundle2 = export(other, tmp_path / "v2", name="toy", version="2")
    srv.options = ServeOptions(state_dir=str(tmp_path / "state2"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="Bearer"):
        client.load_model("toy", config=json.dumps({"bundle": str(bundle2)}))
    client.load_model("toy", headers=auth, config=json.dumps({"bundle": str(bundle2)}))
    batch = toy.batch(8, seed=5)
    tensors = toy.tensors(batch)
    v1, v2 = toy.offline(batch), toy.offline(batch, other)
    assert not np.allclose(v1, v2)

    def scores(version: str = "") -> np.ndarray:
        return client.infer("toy", triton_inputs(tensors, True), model_version=version).as_numpy("scores")

    np.testing.assert_allclose(scores(), v1, rtol=1e-5)  # a new version gets no traffic until told
    np.testing.assert_allclose(scores("2"), v2, rtol=1e-5)
    with httpx.Client(headers=auth) as c:
        assert c.post(f"{url}/admin/models/toy/canary", json={"version": "2", "share": 1.0}).status_code == 200
        np.testing.assert_allclose(scores(), v2, rtol=1e-5)
        # metadata, readiness and config without a version describe the stable one, however the canary draws
        canary = srv.model_versions("toy").get("2")
        monkeypatch.setattr(canary, "platform", "canary_platform", raising=False)  # an instance attribute
        stable_meta = c.get(f"{url}/v2/models/toy/versions/1").json()
        assert c.get(f"{url}/v2/models/toy/versions/2").json()["platform"] == "canary_platform"
        for _ in range(3):
            assert c.get(f"{url}/v2/models/toy").json() == {**stable_meta, "versions": ["1", "2"]}
            assert c.get(f"{url}/v2/models/toy/config").json()["platform"] == stable_meta["platform"] != "canary_platform"
            assert c.get(f"{url}/v2/models/toy/ready").status_code == 200
        assert (
            c.post(f"{url}/admin/models/toy/canary", json={"version": "2", "share": 0.5}).json()["canary_share"] == 0.5
        )
        seen = {bool(np.allclose(scores(), v2, rtol=1e-5)) for _ in range(30)}
        assert seen == {True, False}
        assert c.post(f"{url}/admin/models/toy/promote", json={}).json()["stable"] == "2"
        np.testing.assert_allclose(scores(), v2, rtol=1e-5)
        assert c.post(f"{url}/admin/models/toy/rollback").json()["stable"] == "1"
        np.testing.assert_allclose(scores(), v1, rtol=1e-5)
        bad = c.post(f"{url}/admin/models/toy/canary", json={"version": "9", "share": 0.5})
        assert bad.status_code == 400 and "no version '9'" in bad.json()["error"]
        assert (
            c.post(f"{url}/v2/repository/models/toy/unload", json={"parameters": {"version": "2"}}).status_code == 200
        )
        assert c.post(f"{url}/v2/repository/index").json() == [{"name": "toy", "version": "1", "state": "READY"}]
        assert (
            c.post(f"{url}/v2/repository/models/toy/load", json={"bundle": str(tmp_path / "missing")}).status_code
            == 400
        )
    assert httpx.post(f"{url}/admin/models/toy/promote", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_admin_is_off_without_a_token(toy: Any, tmp_path: Path) -> None:
    srv = InferenceServer(ServerConfig(), ServeOptions(state_dir=str(tmp_path / "state")))
    srv.add_bundle(toy.bundle)
    try:
        with BackgroundServer(srv) as url:
            r = httpx.post(f"{url}/admin/models/toy/rollback", headers={"Authorization": "Bearer anything"})
            assert r.status_code == 403 and "disabled" in r.json()["error"]
            assert url.startswith("http://127.0.0.1:")
    finally:
        srv.close()


def test_metrics(server: tuple[InferenceServer, str]) -> None:
    _, url = server
    httpx.post(f"{url}/v2/models/toy/infer", content=b"bad")
    text = httpx.get(f"{url}/metrics").text
    for needle in (
        'hugerec_requests_total{code="400",endpoint="infer",model="toy",version="1"}',
        "hugerec_request_seconds_bucket",
        "hugerec_batch_rows_bucket",
        'hugerec_ps_hit_rate{model="toy",tier="cache",version="1"}',
        'hugerec_ps_keys_total{model="toy",table="user",tier="memory",version="1"}',
        "hugerec_ps_cache_rows",
    ):
        assert needle in text, needle


@pytest.mark.slow  # a fresh interpreter imports torch, FastAPI and hugerec
def test_serve_runs_until_terminated(toy: Any, tmp_path: Path) -> None:
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "from hugerec.serving.http.server import serve; from hugerec.serving.bundles.bundle_loader import ServeOptions; "
        f"serve({str(toy.bundle)!r}, port={port}, options=ServeOptions(state_dir={str(tmp_path / 'state')!r}), threads=1)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        batch = toy.batch(3, seed=1)
        r = httpx.post(f"http://127.0.0.1:{port}/predict", json={"instances": toy.instances(batch)})
        np.testing.assert_allclose(r.json()["predictions"], toy.offline(batch), rtol=1e-5, atol=1e-6)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful stop


def test_a_body_shorter_than_its_content_length_gets_408_and_the_connection_closes(toy: Any, tmp_path: Path) -> None:
    """#20 defect 11: a client sending fewer bytes than Content-Length held its connection forever."""
    import socket
    import time

    srv = InferenceServer(ServerConfig(limits=RequestLimits(body_timeout_s=0.5)), ServeOptions(state_dir=str(tmp_path / "state")))
    srv.add_bundle(toy.bundle)
    try:
        with BackgroundServer(srv) as url:
            host, port = url.removeprefix("http://").split(":")
            for path in ("/v2/models/toy/infer", "/predict"):
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode())
                    t0, got = time.monotonic(), b""
                    while chunk := s.recv(4096):  # b"" once the server closes the connection
                        got += chunk
                    assert time.monotonic() - t0 < 8, path
                head, _, payload = got.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 408"), (path, got)
                assert b"did not arrive within 0.5 s" in payload
            assert httpx.get(f"{url}/v2/health/live").status_code == 200  # and it serves on
    finally:
        srv.close()
    with pytest.raises(ValueError, match="body_timeout_s"):
        RequestLimits(body_timeout_s=0)


def test_concurrent_infer_requests_reach_the_batcher_in_one_loop_turn(toy: Any, tmp_path: Path) -> None:
    """Requests whose bodies are in go through admission, body reading and decoding to the batcher in the loop
    turn that received them, so with max_delay_ms=0 all of them join one model call. A hop to a thread on
    the way (checked: to_thread in the body reading) lets the first batch start before the rest are in and
    splits them ([30, 1] here): smaller batches, more CPU per request under concurrency."""
    srv = InferenceServer(
        ServerConfig(batching=BatchingConfig(max_batch_size=1024, max_delay_ms=0, offload_rows=1024)),
        ServeOptions(state_dir=str(tmp_path / "state")),
    )
    srv.add_bundle(toy.bundle)
    served = srv.model_versions("toy").route()
    assert isinstance(served, ServedModel)
    calls: list[int] = []
    run = served.batcher.run

    def counted(inputs: ModelInputs) -> np.ndarray:
        calls.append(inputs.batch_size)
        return run(inputs)

    served.batcher.run = counted
    types = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}
    bodies = []
    for seed in range(16):
        tensors = toy.tensors(toy.batch(1 + seed % 3, seed=200 + seed))
        inputs = [
            {"name": k, "datatype": types[v.dtype], "shape": list(v.shape), "data": v.ravel().tolist()}
            for k, v in tensors.items()
        ]
        bodies.append(json.dumps({"inputs": inputs}).encode())

    async def one(body: bytes) -> int:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v2/models/toy/infer",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        await srv(scope, receive, send)
        return int(sent[0]["status"])

    async def all_at_once() -> list[int]:
        return list(await asyncio.gather(*(one(b) for b in bodies)))

    try:
        assert asyncio.run(all_at_once()) == [200] * 16
        assert calls == [sum(1 + seed % 3 for seed in range(16))]  # one model call of all their rows
        assert srv.admission.requests == 0 and srv.admission.bytes == 0  # every request left admission
    finally:
        srv.close()
