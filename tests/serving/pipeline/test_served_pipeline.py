"""The pipeline bundle (export, verified load, TOML) and the pipeline served: /recommend, KServe v2,
metrics, versions, and the answers to bad input."""

from __future__ import annotations

import json
import shutil
import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from hugerec.index.vector_index import IndexConfig, IndexKind
from hugerec.models.mf import MatrixFactorization
from hugerec.serving.bundles.pipeline_bundle import PipelineOptions, export_pipeline, load_pipeline
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.pipeline.declaration import declaration_from_dict, declaration_to_dict
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.serving.pipeline.runner import Query
from hugerec.serving.pipeline.served_pipeline import ServedPipeline

TOML = """
[pipeline]
name = "recs"
version = "1"
context = { hour = 12.0 }

[retrieve]
sources = [{ kind = "ann", k = 60 }, { kind = "item_to_item", k = 20, last = 3 }, { kind = "popular", k = 20, cold_k = 40 }]

[filter]
exclude_seen = true
keep = [{ column = "available", op = "==", value = 1 }, { column = "min_age", op = "<=", value = "user.age" }]
deny = [3]

[score]
dense = ["user.age", "item.price", "context.hour", "item.category"]
sparse = [["user", "user.id"], ["item", "item.id"], ["last_item", "item.category"]]

[order]
boosts = [{ when = { column = "promoted", op = "==", value = 1 }, multiply = 1.5 }]
diversity = "category"
per_category = 4
max_k = 50
"""


INGEST = {"authorization": "Bearer " + "i" * 16}
INGEST_TOKEN = "i" * 16


def build(toy: Any, out: Path, version: str = "1", seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    store = FeatureStore.in_memory({"user": ("age",), "item": ("available", "min_age", "category", "price", "promoted")})
    store.write("user", np.arange(250), {"age": rng.integers(10, 70, 250)})
    store.write("item", np.arange(200), {"available": (rng.random(200) < 0.9).astype(int), "min_age": rng.choice([0, 18], 200),
                                         "category": rng.integers(0, 8, 200), "price": rng.random(200), "promoted": (rng.random(200) < 0.1).astype(int)})
    torch.manual_seed(seed)
    encoder = UserEncoder(MatrixFactorization(250, 200, 8))
    interactions = InteractionStore.from_pairs(rng.integers(0, 250, 2000), rng.integers(0, 200, 2000))
    data = tomllib.loads(TOML)
    data["pipeline"]["version"] = version
    decl = declaration_from_dict(data, "test.toml")
    return export_pipeline(out, decl, store, interactions, np.arange(200), encoder, IndexConfig(IndexKind.HNSW), toy.bundle)


@pytest.fixture(scope="module")
def bundle(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(toy, tmp_path_factory.mktemp("pipe") / "recs")


def test_declaration_round_trips_and_mistakes_name_the_key() -> None:
    decl = declaration_from_dict(tomllib.loads(TOML), "p.toml")
    assert declaration_from_dict(declaration_to_dict(decl), "again") == decl
    bad = tomllib.loads(TOML)
    bad["filter"]["keep"][1]["op"] = "=<"
    with pytest.raises(ValueError, match=r"p.toml \[filter\] keep\[1\]: Condition: op must be one of"):
        declaration_from_dict(bad, "p.toml")
    bad = tomllib.loads(TOML)
    bad["order"]["colour"] = 1
    with pytest.raises(ValueError, match=r"\[order\]: unknown key 'colour'"):
        declaration_from_dict(bad, "p.toml")
    seq = tomllib.loads(TOML)
    seq["score"] = {"sequential": True}  # ranked by an HSTU next-items bundle
    decl = declaration_from_dict(seq, "p.toml")
    assert declaration_from_dict(declaration_to_dict(decl), "again") == decl
    seq["score"]["sparse"] = [["item", "item.id"]]
    with pytest.raises(ValueError, match=r"\[score\]: Score: sequential = 'ranking_head' takes no dense or sparse inputs"):
        declaration_from_dict(seq, "p.toml")
    bad = tomllib.loads(TOML)
    bad["retrieve"]["sources"][0]["kind"] = "faiss"
    with pytest.raises(ValueError, match=r"sources\[0\]: kind must be one of"):
        declaration_from_dict(bad, "p.toml")


def test_bundle_loads_verified_and_refuses_a_changed_file(bundle: Path, tmp_path: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["kind"] == "pipeline" and set(manifest["parts"]) == {"features", "retrieval", "ranker"}
    assert "ranker/manifest.json" in manifest["sha256"] and "retrieval/index/index.json" in manifest["sha256"]
    loaded = load_pipeline(bundle, PipelineOptions(ranker=_state(tmp_path)))
    try:
        rec = loaded.pipeline.recommend(Query(3, 10))
        assert len(rec.items) == 10 and not rec.cold_start
    finally:
        loaded.close()
    # the HNSW search breadth: as built (IndexConfig's 512), or PipelineOptions', never below the largest ANN k (60)
    for asked, want in ((None, 512), (100, 100), (10, 60)):
        loaded = load_pipeline(bundle, PipelineOptions(ranker=_state(tmp_path), expansion_search=asked))
        try:
            assert loaded.pipeline.res.index is not None and loaded.pipeline.res.index.config.expansion_search == want
        finally:
            loaded.close()
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy, ignore=shutil.ignore_patterns("state"))
    with open(copy / "features" / "item.npz", "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match=r"item\.npz is missing or does not match its checksum"):
        load_pipeline(copy)


def _state(tmp: Path) -> Any:
    from hugerec.serving.bundles.bundle_loader import ServeOptions

    return ServeOptions(state_dir=str(tmp / "state"))


@pytest.fixture(scope="module")
def server(bundle: Path, toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InferenceServer, Path]]:
    srv = InferenceServer(ServerConfig(admin_token="t" * 16, ingest_token=INGEST_TOKEN, seed=0))
    srv.add_bundle(bundle)
    v2 = build(toy, tmp_path_factory.mktemp("pipe2") / "recs", version="2", seed=1)
    with BackgroundServer(srv) as url:
        yield url, srv, v2
    srv.close()


def test_recommend_answers_with_sources_and_debug_stages(server: tuple[str, InferenceServer, Path]) -> None:
    url = server[0]
    r = httpx.post(f"{url}/recommend", json={"user": 3, "k": 20, "debug": True, "context": {"hour": 8}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["items"]) == 20 and len(body["scores"]) == 20 and set(body["sources"]) <= {"ann", "item_to_item", "popular"}
    assert body["cold_start"] is False and list(body["stages"]) == ["retrieve", "filter", "score", "order"]
    assert body["stages"]["order"]["items"] == body["items"]
    assert set(body["items"]) <= set(body["stages"]["filter"]["items"]) and 3 not in body["items"]
    r = httpx.post(f"{url}/recommend", json={"user": 100000, "k": 5})
    assert r.status_code == 200 and r.json()["cold_start"] is True and "cold start" in r.json()["notes"][0]
    metrics = httpx.get(f"{url}/metrics").text
    assert 'hugerec_pipeline_stage_seconds_count{pipeline="recs",stage="score",version="1"}' in metrics
    assert 'hugerec_pipeline_candidates_bucket{le="1.0",pipeline="recs",side="in",stage="retrieve",version="1"}' in metrics


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user": 3, "k": 0}, "'k'"),
        ({"user": 3, "k": 51}, "'k'"),
        ({"user": 3, "k": "ten"}, "'k'"),
        ({"k": 5}, "'user'"),
        ({"user": 3, "context": {"weather": 1}}, "'context'"),
        ({"user": 3, "context": {"hour": "noon"}}, "'context.hour'"),
        ({"user": 3, "colour": 1}, "'colour'"),
        ({"user": 3, "history": [1, "x"]}, "'history[1]'"),
        ({"user": 3, "pipeline": "nope"}, "'pipeline'"),
    ],
)
def test_bad_requests_get_4xx_naming_the_field(server: tuple[str, InferenceServer, Path], body: dict[str, Any], field: str) -> None:
    r = httpx.post(f"{server[0]}/recommend", json=body)
    assert 400 <= r.status_code < 500 and field in r.json()["error"], r.text


def test_kserve_infer_with_history(server: tuple[str, InferenceServer, Path]) -> None:
    url = server[0]
    request = {
        "inputs": [
            {"name": "user", "datatype": "INT64", "shape": [2], "data": [3, 100000]},
            {"name": "history", "datatype": "INT64", "shape": [2], "data": [5, 6]},
            {"name": "history.lengths", "datatype": "INT64", "shape": [2], "data": [0, 2]},
        ],
        "parameters": {"k": 6},
    }
    r = httpx.post(f"{url}/v2/models/recs/infer", json=request)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["items"]["shape"] == [2, 6] and out["cold_start"]["data"] == [False, True]
    assert "item_to_item" in out["sources"]["data"][6:]
    single = httpx.post(f"{url}/recommend", json={"user": 3, "k": 6}).json()
    assert out["items"]["data"][:6] == single["items"]
    meta = httpx.get(f"{url}/v2/models/recs").json()
    assert meta["platform"] == "hugerec_pipeline" and meta["stages"] == ["retrieve", "filter", "score", "order"]
    r = httpx.post(f"{url}/v2/models/recs/infer", json={"inputs": [{"name": "user", "datatype": "INT64", "shape": [1], "data": [3]}], "parameters": {"k": 0}})
    assert r.status_code == 400 and "'parameters.k' = 0 must be an integer in 1..50" in r.json()["error"]


def test_versions_canary_and_rollback_work_for_pipelines(server: tuple[str, InferenceServer, Path]) -> None:
    url, _, v2 = server
    auth = {"authorization": "Bearer " + "t" * 16}
    r = httpx.post(f"{url}/v2/repository/models/recs/load", json={"bundle": str(v2)}, headers=auth)
    assert r.status_code == 200, r.text
    one = httpx.post(f"{url}/recommend", json={"user": 3, "k": 5, "version": "1"}).json()
    two = httpx.post(f"{url}/recommend", json={"user": 3, "k": 5, "version": "2"}).json()
    assert one["version"] == "1" and two["version"] == "2" and one["items"] != two["items"]
    assert httpx.post(f"{url}/admin/models/recs/canary", json={"version": "2", "share": 1.0}, headers=auth).status_code == 200
    assert httpx.post(f"{url}/recommend", json={"user": 3, "k": 5}).json()["version"] == "2"
    assert httpx.post(f"{url}/admin/models/recs/rollback", headers=auth).json()["stable"] == "1"
    assert httpx.post(f"{url}/recommend", json={"user": 3, "k": 5}).json()["version"] == "1"


def test_a_failing_stage_is_a_503_naming_it(server: tuple[str, InferenceServer, Path]) -> None:
    url, srv = server[0], server[1]
    served = srv.model_versions("recs").get("1")
    assert isinstance(served, ServedPipeline)
    features = served.pipeline.res.features
    real = features.store

    class Down:
        name, dims = real.name, real.dims

        def get(self, table: str, keys: np.ndarray) -> Any:
            raise ConnectionError("feature store is down")

    features.store = Down()  # type: ignore[assignment]
    try:
        r = httpx.post(f"{url}/recommend", json={"user": 3, "k": 5, "version": "1"})
    finally:
        features.store = real
    assert r.status_code == 503 and "'features' failed: ConnectionError: feature store is down" in r.json()["error"]


def test_online_updates_of_interactions_and_features(server: tuple[str, InferenceServer, Path]) -> None:
    url = server[0]
    before = httpx.post(f"{url}/recommend", json={"user": 7, "k": 5, "version": "1"}).json()["items"]
    r = httpx.post(f"{url}/recommend/interactions", json={"user": 7, "items": before[:2]})
    assert r.status_code == 401 and "ingest endpoints need" in r.json()["error"]  # #28: anyone could hide any user's items
    r = httpx.post(f"{url}/recommend/interactions", json={"user": 7, "items": before[:2]}, headers=INGEST)
    assert r.status_code == 200, r.text
    after = httpx.post(f"{url}/recommend", json={"user": 7, "k": 5, "version": "1"}).json()["items"]
    assert not set(before[:2]) & set(after)  # now seen: filtered out
    update = {"table": "item", "ids": [after[0]], "columns": {"available": [0]}}
    assert httpx.post(f"{url}/recommend/features", json=update).status_code == 401  # admin only
    assert httpx.post(f"{url}/recommend/features", json=update, headers=INGEST).status_code == 401
    auth = {"authorization": "Bearer " + "t" * 16}
    assert httpx.post(f"{url}/recommend/features", json=update, headers=auth).status_code == 200
    assert after[0] not in httpx.post(f"{url}/recommend", json={"user": 7, "k": 5, "version": "1"}).json()["items"]
    bad = httpx.post(f"{url}/recommend/features", json={**update, "columns": {"colour": [1]}}, headers=auth)
    assert bad.status_code == 400 and "colour" in bad.json()["error"]
    bad = httpx.post(f"{url}/recommend/interactions", json={"user": 7, "items": []}, headers=INGEST)
    assert bad.status_code == 400 and "'items'" in bad.json()["error"]


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response from `sock`: the head and then content-length bytes of body, which may
    arrive in separate segments (one recv can return the head alone)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed inside the response head: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed inside the response body: {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def test_recommend_on_raw_asgi_answers_like_the_rest_of_the_server(server: tuple[str, InferenceServer, Path]) -> None:
    """POST /recommend skips the framework (server.py): its answers and errors keep the server's contract."""
    url = server[0]
    r = httpx.post(f"{url}/recommend", content=b'{"user": 3, "k": 4, "version": "1"}')
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["items"] == httpx.post(f"{url}/recommend", json={"user": 3, "k": 4, "version": "1"}).json()["items"]
    assert int(r.headers["content-length"]) == len(r.content)
    for body, code, says in ((b"{not json", 400, "not valid JSON"), (b"[1, 2]", 400, "must be a JSON object"), (b"", 400, "'user'")):
        r = httpx.post(f"{url}/recommend", content=body)
        assert r.status_code == code and says in r.json()["error"], r.text
    r = httpx.get(f"{url}/recommend")
    assert r.status_code == 405 and "use POST" in r.json()["error"]
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /recommend HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n{" % (100 << 20))
        answer = _read_response(sock)
    assert answer.startswith(b"HTTP/1.1 413") and b"exceeds the limit" in answer
    count = 'hugerec_requests_total{code="200",endpoint="recommend",model="recs",version="1"}'
    assert count in httpx.get(f"{url}/metrics").text


def test_every_kserve_route_answers_for_a_pipeline_or_is_a_4xx_saying_what_it_lacks(
    server: tuple[str, InferenceServer, Path], toy: Any, tmp_path: Path
) -> None:
    """#28: GET /v2/models/<pipeline>/config was a 500 ('ServedPipeline' object has no attribute 'signature'),
    and so was admin load_delta naming a pipeline."""
    url = server[0]
    auth = {"authorization": "Bearer " + "t" * 16}
    r = httpx.get(f"{url}/v2/models/recs/config")
    assert r.status_code == 200, r.text
    config = r.json()
    assert config["name"] == "recs" and config["platform"] == "hugerec_pipeline" and config["max_batch_size"] == 256  # RequestLimits.max_users
    assert [i["name"] for i in config["input"]] == ["user", "history", "history.lengths"]
    assert [o["name"] for o in config["output"]] == ["items", "scores", "sources", "cold_start"]
    meta = httpx.get(f"{url}/v2/models/recs").json()
    assert meta["name"] == "recs" and "1" in meta["versions"] and meta["stages"]
    assert httpx.get(f"{url}/v2/models/recs/versions/1/ready").status_code == 200
    assert httpx.get(f"{url}/v2/models/recs/versions/nope/ready").status_code == 404

    r = httpx.post(f"{url}/v2/repository/models/recs/load_delta", json={"delta": "/nowhere", "base": "1", "version": "9"}, headers=auth)
    assert r.status_code == 400 and "pipeline 'recs' (version '1') does not support version deltas" in r.json()["error"]
    r = httpx.post(f"{url}/predict", json={"model": "recs", "instances": [{"user": 3}]})
    assert r.status_code == 400 and "pipeline 'recs'" in r.json()["error"] and "/predict" in r.json()["error"]

    # a scoring model beside it: /recommend and the online updates naming it are 400s, not 500s
    r = httpx.post(f"{url}/v2/repository/models/dlrm/load", json={"bundle": str(toy.bundle)}, headers=auth)
    assert r.status_code == 200, r.text
    for path, body in (
        ("/recommend", {"pipeline": "dlrm", "user": 3}),
        ("/recommend/interactions", {"pipeline": "dlrm", "user": 3, "items": [1]}),
    ):
        r = httpx.post(f"{url}{path}", json=body, headers=INGEST)
        assert r.status_code == 400 and f"does not support {path}" in r.json()["error"], (path, r.text)
    r = httpx.post(f"{url}/recommend", json={"pipeline": ["recs"], "user": 3})
    assert r.status_code == 400 and "'pipeline' must be a string" in r.json()["error"]
    assert httpx.post(f"{url}/recommend", json={"user": 3, "k": 5}).status_code == 200  # still the one pipeline
    # one name serves one family: a model bundle is not a version of a pipeline
    copy = tmp_path / "bundle"  # (toy.bundle's state folder is the loaded "dlrm"'s)
    shutil.copytree(toy.bundle, copy, ignore=shutil.ignore_patterns("state"))
    r = httpx.post(f"{url}/v2/repository/models/recs/load", json={"bundle": str(copy), "version": "m"}, headers=auth)
    assert r.status_code == 400 and "'recs' serves pipeline versions; version 'm' is a model" in r.json()["error"]
    r = httpx.post(f"{url}/v2/repository/models/dlrm/unload", json={"version": "1"}, headers=auth)
    assert r.status_code == 400  # the stable one


# -- a pipeline whose HSTU was trained with times: the stored history's times, "times" and "history.times" ------
TIMED_TOML = """
[pipeline]
name = "timed"
version = "1"

[retrieve]
sources = [{ kind = "sequential", k = 12 }]

[order]
max_k = 12
"""


def timed_bundle(out: Path, times: bool = True) -> tuple[Path, Path]:
    """A pipeline of one source, the next items of an HSTU trained with model.times = true (time biases not
    zero, so times matter), over a store with each event's time (times=False: without); (pipeline, next-items
    bundle)."""
    from hugerec.embedding.optimizers import Adam
    from hugerec.models.hstu import HSTU, HSTUConfig
    from hugerec.serving.bundles.next_items_bundle import write_next_items_bundle
    from hugerec.training.model_file import RawIds, save_model

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(3)
    config = HSTUConfig(max_len=8, dim=8, num_layers=2, num_heads=2, times=True)
    model = HSTU(config.sequence_config(200))
    with torch.no_grad():
        for layer in model.blocks:
            layer.time_bias.normal_(0.0, 2.0)
    save_model(out / "hstu.pt", model, config, Adam(lr=0.01), ids=RawIds(np.arange(200), np.r_[0, np.ones(200, np.int64)]))
    seq = write_next_items_bundle(out / "hstu.pt", out / "next", name="next", k=12)
    rng = np.random.default_rng(4)
    store = FeatureStore.in_memory({"user": ("age",), "item": ("price",)})
    store.write("user", np.arange(50), {"age": rng.integers(10, 70, 50)})
    store.write("item", np.arange(200), {"price": rng.random(200)})
    users, items = rng.integers(0, 50, 600), rng.integers(0, 200, 600)
    seconds = 1_700_000_000 + np.cumsum(rng.integers(0, 90_000, 600))
    interactions = InteractionStore.from_pairs(users, items, times=seconds if times else None)
    decl = declaration_from_dict(tomllib.loads(TIMED_TOML), "timed.toml")
    return export_pipeline(out / "pipe", decl, store, interactions, np.arange(200), sequential_bundle=seq), seq


@pytest.fixture(scope="module")
def timed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InferenceServer, Path]]:
    pipe, seq = timed_bundle(tmp_path_factory.mktemp("timed"))
    srv = InferenceServer(ServerConfig(admin_token="t" * 16, ingest_token=INGEST_TOKEN, seed=0))
    srv.add_bundle(pipe)
    srv.add_bundle(seq)
    with BackgroundServer(srv) as url:
        yield url, srv, pipe
    srv.close()


def _next_items(url: str, items: list[int], times: list[int]) -> list[int]:
    """The next-items bundle's answer over HTTP for one history with its times ("items.times")."""
    body = {"inputs": [{"name": "items", "datatype": "INT64", "shape": [len(items)], "data": items},
                       {"name": "items.lengths", "datatype": "INT64", "shape": [1], "data": [len(items)]},
                       {"name": "items.times", "datatype": "INT64", "shape": [len(items)], "data": times}], "parameters": {"k": 12}}
    r = httpx.post(f"{url}/v2/models/next/infer", json=body)
    assert r.status_code == 200, r.text
    return list(r.json()["outputs"][0]["data"])


def test_a_timed_pipeline_answers_what_the_next_items_bundle_gives_over_http(timed_server: tuple[str, InferenceServer, Path]) -> None:
    """/recommend of a user reads the stored history with its times: the next-items bundle's answer for that
    history and those times; after POST /recommend/interactions with "times", the longer history's; a request's
    history with "history.times" (and the KServe input of the same name) likewise."""
    url, srv = timed_server[0], timed_server[1]
    served = srv.model_versions("timed").get("1")
    assert isinstance(served, ServedPipeline) and served.pipeline.needs_times
    user = 7
    items, times = served.pipeline.res.interactions.history(user)
    assert times is not None and len(items) >= 3
    items_l, times_l = items.tolist(), times.tolist()
    r = httpx.post(f"{url}/recommend", json={"user": user, "k": 12})
    assert r.status_code == 200, r.text
    assert r.json()["items"] == _next_items(url, items_l, times_l)
    latest = times_l[-1]
    post = {"user": user, "items": [11, 12], "times": [latest + 60, latest + 7_200]}
    r = httpx.post(f"{url}/recommend/interactions", json=post, headers=INGEST)
    assert r.status_code == 200, r.text
    items_l, times_l = [*items_l, 11, 12], [*times_l, latest + 60, latest + 7200]
    assert httpx.post(f"{url}/recommend", json={"user": user, "k": 12}).json()["items"] == _next_items(url, items_l, times_l)
    given = {"user": user, "k": 12, "history": [40, 41], "history.times": [latest + 8_000, latest + 9_000]}
    r = httpx.post(f"{url}/recommend", json=given)
    assert r.status_code == 200, r.text
    want = _next_items(url, [*items_l, 40, 41], [*times_l, latest + 8000, latest + 9000])
    assert r.json()["items"] == want
    infer = {"inputs": [{"name": "user", "datatype": "INT64", "shape": [1], "data": [user]},
                        {"name": "history", "datatype": "INT64", "shape": [2], "data": [40, 41]},
                        {"name": "history.lengths", "datatype": "INT64", "shape": [1], "data": [2]},
                        {"name": "history.times", "datatype": "INT64", "shape": [2], "data": [latest + 8_000, latest + 9_000]}],
             "parameters": {"k": 12}}
    r = httpx.post(f"{url}/v2/models/timed/infer", json=infer)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == want
    meta = httpx.get(f"{url}/v2/models/timed").json()
    assert [i["name"] for i in meta["inputs"]] == ["user", "history", "history.lengths", "history.times"]


HUGE = "9" * 5000  # past CPython's 4,300-digit limit of int(str)


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("interactions", '{"user": 7, "items": [1]}', "field 'times' is required: next-items bundle 'next' of pipeline 'timed'"),
        ("interactions", '{"user": 7, "items": [1], "times": [' + HUGE + "]}", "'times[0]'"),
        ("interactions", '{"user": 7, "items": [1], "times": [1' + "0" * 400 + "]}", "'times[0]'"),
        ("interactions", '{"user": 7, "items": [1], "times": [[1]]}', "field 'times[0]' must be an integer"),
        ("interactions", '{"user": 7, "items": [1], "times": [1.5]}', "field 'times[0]' must be an integer"),
        ("interactions", '{"user": 7, "items": [1], "times": 5}', "field 'times' must be a list"),
        ("interactions", '{"user": 7, "items": [1, 2], "times": [5]}', "field 'times' has 1 times for 2 items"),
        ("interactions", '{"user": 7, "items": [1, 2], "times": [2000000000, 1999999999]}', "field 'times[1]' = 1999999999 is earlier than times[0]"),
        ("interactions", '{"user": 7, "items": [1], "times": [5]}', "field 'times': times[0] = 5 is earlier than user 7's latest event time"),
        ("recommend", '{"user": 7, "k": 5, "history": [1]}', "field 'history.times' is required with a history"),
        ("recommend", '{"user": 7, "k": 5, "history": [1], "history.times": [' + HUGE + "]}", "'history.times[0]'"),
        ("recommend", '{"user": 7, "k": 5, "history": [1], "history.times": [-1' + "0" * 400 + "]}", "'history.times[0]'"),
        ("recommend", '{"user": 7, "k": 5, "history": [1], "history.times": [[1]]}', "field 'history.times[0]' must be an integer"),
        ("recommend", '{"user": 7, "k": 5, "history": [1], "history.times": [5]}', "field 'history.times[0]' = 5 is earlier than user 7's latest stored event time"),
        ("recommend", '{"user": 7, "k": 5, "history": [1, 2], "history.times": [5]}', "field 'history.times' has 1 times for 2 items"),
    ],
)
def test_bad_times_get_4xx_naming_the_field(timed_server: tuple[str, InferenceServer, Path], route: str, body: str, field: str) -> None:
    """Times are int64 seconds, one per item, in time order: anything else is a 4xx naming the field (never a
    5xx, never a time of 0), and nothing of a refused post is kept."""
    url, srv = timed_server[0], timed_server[1]
    served = srv.model_versions("timed").get("1")
    assert isinstance(served, ServedPipeline)
    before = served.pipeline.res.interactions.history(7)[0].tolist()
    path = "/recommend/interactions" if route == "interactions" else "/recommend"
    r = httpx.post(f"{url}{path}", content=body, headers={**INGEST, "content-type": "application/json"})
    assert 400 <= r.status_code < 500 and field in r.json()["error"], r.text
    assert served.pipeline.res.interactions.history(7)[0].tolist() == before


def test_a_pipeline_without_a_timed_model_takes_times_and_keeps_none(server: tuple[str, InferenceServer, Path]) -> None:
    """A pipeline whose models read no times checks "times" and keeps none (its store has none): one post serves a
    version with times and another without; bad times are still a 400 naming the field."""
    url, srv = server[0], server[1]
    served = srv.model_versions("recs").get("1")
    assert isinstance(served, ServedPipeline) and not served.pipeline.needs_times and not served.pipeline.res.interactions.timed
    r = httpx.post(f"{url}/recommend/interactions", json={"user": 9, "items": [1, 2], "times": [5, 6]}, headers=INGEST)
    assert r.status_code == 200, r.text
    assert served.pipeline.res.interactions.items(9).tolist()[-2:] == [1, 2]
    r = httpx.post(f"{url}/recommend/interactions", json={"user": 9, "items": [1], "times": ["x"]}, headers=INGEST)
    assert r.status_code == 400 and "'times[0]'" in r.json()["error"]
    r = httpx.post(f"{url}/recommend", json={"user": 9, "k": 5, "history": [1], "history.times": [3]})
    assert r.status_code == 200, r.text
    assert [i["name"] for i in httpx.get(f"{url}/v2/models/recs").json()["inputs"]] == ["user", "history", "history.lengths"]


def test_a_post_is_kept_by_every_version_of_the_pipeline_or_by_none(tmp_path: Path) -> None:
    """Version 1 reads times, version 0 (no sequential model, asked first) does not: a post without times is
    refused by version 1 before version 0 keeps anything; with times, both keep the items (version 0 without
    the times)."""
    pipe, _ = timed_bundle(tmp_path / "v1")
    decl = declaration_from_dict({"pipeline": {"name": "timed", "version": "0"}, "retrieve": {"sources": [{"kind": "popular", "k": 12}]},
                                  "order": {"max_k": 12}}, "v0")
    features = FeatureStore.in_memory({"user": ("age",), "item": ("price",)})
    features.write("item", np.arange(200), {"price": np.ones(200)})
    v2 = export_pipeline(tmp_path / "v2", decl, features, InteractionStore.from_pairs(np.array([7]), np.array([3])), np.arange(200))
    srv = InferenceServer(ServerConfig(admin_token="t" * 16, ingest_token=INGEST_TOKEN, seed=0))
    srv.add_bundle(v2)
    srv.add_bundle(pipe)
    try:
        with BackgroundServer(srv) as url:
            one, two = (srv.model_versions("timed").get(v) for v in ("1", "0"))
            assert isinstance(one, ServedPipeline) and isinstance(two, ServedPipeline)
            r = httpx.post(f"{url}/recommend/interactions", json={"user": 7, "items": [50]}, headers=INGEST)
            assert r.status_code == 400 and "field 'times' is required" in r.json()["error"]
            assert two.pipeline.res.interactions.items(7).tolist() == [3]  # nothing kept by the version that takes it
            latest = int(one.pipeline.res.interactions.history(7)[1][-1])  # type: ignore[index]
            r = httpx.post(f"{url}/recommend/interactions", json={"user": 7, "items": [50], "times": [latest + 1]}, headers=INGEST)
            assert r.status_code == 200 and r.json()["versions"] == ["0", "1"], r.text
            assert two.pipeline.res.interactions.items(7).tolist() == [3, 50] and one.pipeline.res.interactions.items(7)[-1] == 50
    finally:
        srv.close()


def test_a_sequential_model_reading_more_than_50_items_answers_over_http_as_its_bundle(tmp_path: Path) -> None:
    """A SASRec of max_len 64 as the pipeline's sequential source: a request's 90-item history is read as the
    next-items bundle reads it (its last 64), so /recommend answers what the bundle's infer route answers; the
    metadata says how many items the models read and why."""
    from hugerec.embedding.optimizers import Adam
    from hugerec.models.sasrec import SASRec
    from hugerec.models.sequence import SASRecConfig
    from hugerec.serving.bundles.next_items_bundle import write_next_items_bundle
    from hugerec.training.model_file import RawIds, save_model

    torch.manual_seed(5)
    config = SASRecConfig(max_len=64, dim=8, num_layers=1, num_heads=2)
    save_model(tmp_path / "sasrec.pt", SASRec(config.sequence_config(200)), config, Adam(lr=0.01), ids=RawIds(np.arange(200), np.r_[0, np.ones(200, np.int64)]))
    seq = write_next_items_bundle(tmp_path / "sasrec.pt", tmp_path / "next", name="next", k=12)
    features = FeatureStore.in_memory({"user": ("age",), "item": ("price",)})
    features.write("item", np.arange(200), {"price": np.ones(200)})
    decl = declaration_from_dict({"pipeline": {"name": "long"}, "retrieve": {"sources": [{"kind": "sequential", "k": 200}]},
                                  "filter": {"exclude_seen": True}, "order": {"max_k": 12}}, "long")
    pipe = export_pipeline(tmp_path / "pipe", decl, features, InteractionStore(), np.arange(200), sequential_bundle=seq)
    history = np.random.default_rng(6).integers(0, 200, 90).tolist()
    srv = InferenceServer(ServerConfig(seed=0))
    srv.add_bundle(pipe)
    srv.add_bundle(seq)
    try:
        with BackgroundServer(srv) as url:
            meta = httpx.get(f"{url}/v2/models/long").json()
            assert (meta["max_history"], meta["max_history_from"]) == (64, "models")
            body = {"inputs": [{"name": "items", "datatype": "INT64", "shape": [90], "data": history},
                               {"name": "items.lengths", "datatype": "INT64", "shape": [1], "data": [90]}], "parameters": {"k": 12}}
            r = httpx.post(f"{url}/v2/models/next/infer", json=body)
            assert r.status_code == 200, r.text
            out = {o["name"]: o["data"] for o in r.json()["outputs"]}
            assert out["truncated_items"] == [90 - 64]  # the bundle reads the last 64
            r = httpx.post(f"{url}/recommend", json={"user": 10**6, "k": 12, "history": history})
            assert r.status_code == 200, r.text
            assert r.json()["items"] == out["items"]  # (both leave the 90 seen items out)
    finally:
        srv.close()
