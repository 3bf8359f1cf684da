"""Next-items bundles: export a sequential model, load it, answer KServe v2 requests (item list + lengths; with
the items' times for an HSTU trained on them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from hugerec.embedding.optimizers import Adam
from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.registry import Family
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SASRecConfig
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.next_items_bundle import is_next_items_bundle, load_next_items, write_next_items_bundle
from hugerec.serving.http.limits import RequestLimits
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.runtime.inference_protocol import RequestError
from hugerec.training.model_file import RawIds, load_model, save_model
from hugerec.training.sequential import SequentialFamily, recommend_next, window_batches
from hugerec.training.trainer import TrainConfig, fit

NUM_ITEMS, MAX_LEN = 40, 6
RAW = np.arange(1000, 1000 + 3 * NUM_ITEMS, 3, dtype=np.int64)  # raw id of dense item i is RAW[i - 1]
COUNTS = np.concatenate([[0], np.arange(NUM_ITEMS, 0, -1)]).astype(np.int64)  # dense item 1 is the most popular


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = SASRecConfig(max_len=MAX_LEN, dim=16, num_layers=1)
    model = SASRec(config.sequence_config(NUM_ITEMS), Adam(lr=0.01))
    rng = np.random.default_rng(0)
    start = rng.integers(1, NUM_ITEMS + 1, 200)
    windows = (start[:, None] + np.arange(MAX_LEN + 1)[None, :] - 1) % NUM_ITEMS + 1  # walks i, i + 1, ...
    quiet = TrainConfig(epochs=2, lr=0.01, progress=False, tensorboard=False, plot=False)
    fit(model, window_batches(windows, 32), None, quiet, family=SequentialFamily())
    root = tmp_path_factory.mktemp("next_items")
    save_model(root / "model.pt", model, config, Adam(lr=0.01), ids=RawIds(RAW, COUNTS))
    return export(root / "model.pt", root / "bundle", name="seq", k=5)  # the one export, by the file's family


def test_export_writes_a_verified_bundle(bundle: Path, tmp_path: Path) -> None:
    assert is_next_items_bundle(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["kind"] == "next_items" and manifest["k"] == 5 and manifest["max_len"] == MAX_LEN
    with pytest.raises(ValueError, match=r"k = 41 must be in 1\.\.40"):
        write_next_items_bundle(bundle / "model.pt", tmp_path / "b", k=41)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    with pytest.raises(ValueError, match="is not a next-items bundle"):
        write_next_items_bundle(bundle / "model.pt", tmp_path / "busy")
    # a damaged model file is refused at load
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    with open(copy / "model.pt", "r+b") as f:
        f.seek(200)
        f.write(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="does not match its checksum"):
        load_next_items(copy)


def test_next_items_match_the_library(bundle: Path) -> None:
    served = load_next_items(bundle)
    saved = load_model(bundle / "model.pt", Family.SEQUENTIAL)
    histories = [np.array([3, 4, 5]), np.array([10]), np.arange(1, 20)]  # dense ids; the last is cut to max_len
    values = np.concatenate([RAW[h - 1] for h in histories])
    lengths = np.array([len(h) for h in histories])
    out = served.next_items(values, lengths, k=7)
    ref_items, ref_scores = recommend_next(saved.model, histories, k=7, exclude_history=True)  # type: ignore[arg-type]
    np.testing.assert_array_equal(out["items"], RAW[ref_items - 1])
    np.testing.assert_allclose(out["scores"], ref_scores, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["unknown_items"], [0, 0, 0])
    np.testing.assert_array_equal(out["truncated_items"], [0, 0, 19 - MAX_LEN])  # the long one lost its 13 oldest


def test_unknown_items_are_skipped_and_counted(bundle: Path) -> None:
    served = load_next_items(bundle)
    known = RAW[[2, 3, 4]]
    with_unknown = np.array([7, known[0], 8, known[1], known[2], 9])  # 7, 8, 9 are not items
    a = served.next_items(with_unknown, np.array([6]))
    b = served.next_items(known, np.array([3]))
    np.testing.assert_array_equal(a["items"], b["items"])
    assert a["unknown_items"].tolist() == [3] and b["unknown_items"].tolist() == [0]
    # nothing known (or nothing at all): the most popular items (dense 1, 2, ...)
    cold = served.next_items(np.array([7, 8]), np.array([2, 0]))
    np.testing.assert_array_equal(cold["items"], np.tile(RAW[:5], (2, 1)))
    assert cold["unknown_items"].tolist() == [2, 0]
    with pytest.raises(RequestError, match=r"'k' = 41 must be in 1\.\.40"):
        served.next_items(known, np.array([3]), k=41)


@pytest.fixture(scope="module")
def served(bundle: Path) -> Iterator[tuple[str, InferenceServer]]:
    srv = InferenceServer(ServerConfig(limits=RequestLimits(max_request_rows=16)))
    srv.add_bundle(bundle)
    with BackgroundServer(srv) as url:
        yield url, srv
    srv.close()


@pytest.fixture(scope="module")
def server(served: tuple[str, InferenceServer]) -> str:
    return served[0]


def test_server_answers_next_items(bundle: Path, server: str) -> None:
    served = load_next_items(bundle)
    values, lengths = RAW[[2, 3, 4, 9, 10]], np.array([3, 2])
    expected = served.next_items(values, lengths, k=4)
    request = {
        "inputs": [
            {"name": "items", "datatype": "INT64", "shape": [5], "data": values.tolist()},
            {"name": "items.lengths", "datatype": "INT64", "shape": [2], "data": lengths.tolist()},
        ],
        "parameters": {"k": 4},
        "id": "r1",
    }
    r = httpx.post(f"{server}/v2/models/seq/infer", json=request)
    assert r.status_code == 200, r.text
    body = r.json()
    outputs = {o["name"]: o for o in body["outputs"]}
    assert body["id"] == "r1" and outputs["items"]["datatype"] == "INT64" and outputs["items"]["shape"] == [2, 4]
    assert np.array(outputs["items"]["data"]).reshape(2, 4).tolist() == expected["items"].tolist()
    np.testing.assert_allclose(np.array(outputs["scores"]["data"]).reshape(2, 4), expected["scores"], rtol=1e-5)
    # the same request as [B, L] padded with -1, and binary outputs
    padded = {
        "inputs": [{"name": "items", "datatype": "INT64", "shape": [2, 3], "data": [*values[:3].tolist(), *values[3:].tolist(), -1]}],
        "parameters": {"k": 4, "binary_data_output": True},
    }
    r = httpx.post(f"{server}/v2/models/seq/infer", json=padded)
    assert r.status_code == 200
    n = int(r.headers["Inference-Header-Content-Length"])
    header = json.loads(r.content[:n])
    assert header["outputs"][0]["name"] == "items"
    size = header["outputs"][0]["parameters"]["binary_data_size"]
    assert np.frombuffer(r.content[n : n + size], "<i8").reshape(2, 4).tolist() == expected["items"].tolist()
    meta = httpx.get(f"{server}/v2/models/seq").json()
    assert [i["name"] for i in meta["inputs"]] == ["items", "items.lengths"]
    assert httpx.get(f"{server}/v2/models/seq/ready").status_code == 200


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({"inputs": [{"name": "items", "datatype": "FP32", "shape": [1], "data": [1.5]}]}, "integer ids"),
        ({"inputs": [{"name": "other", "datatype": "INT64", "shape": [1], "data": [1]}]}, "unknown inputs"),
        ({"inputs": [{"name": "items", "datatype": "INT64", "shape": [1], "data": [1000]}], "parameters": {"k": 0}}, "'k' = 0"),
        ({"inputs": [{"name": "items", "datatype": "INT64", "shape": [1], "data": [1000]}], "parameters": {"k": "3"}}, "must be an integer"),
        (
            {"inputs": [{"name": "items", "datatype": "INT64", "shape": [1], "data": [1000]}], "outputs": [{"name": "logits"}]},
            "unknown output 'logits'",
        ),
    ],
)
def test_server_bad_requests_are_400(server: str, request_body: dict[str, object], message: str) -> None:
    r = httpx.post(f"{server}/v2/models/seq/infer", json=request_body)
    assert r.status_code == 400 and message in r.json()["error"], r.text
    assert httpx.post(f"{server}/v2/models/seq/versions/9/infer", json=request_body).status_code == 404


def test_every_kserve_route_answers_for_next_items_and_versions_share_the_traffic(
    bundle: Path, served: tuple[str, InferenceServer]
) -> None:
    url, srv = served
    r = httpx.get(f"{url}/v2/models/seq/config")
    assert r.status_code == 200, r.text
    assert r.json()["platform"] == "hugerec_next_items" and r.json()["max_batch_size"] == 16
    assert [i["name"] for i in r.json()["input"]] == ["items", "items.lengths"]
    r = httpx.post(f"{url}/predict", json={"model": "seq", "instances": [{"items": [1]}]})
    assert r.status_code == 400 and "next_items 'seq' (version '1') does not support /predict" in r.json()["error"]
    r = httpx.post(f"{url}/recommend", json={"pipeline": "seq", "user": 1})
    assert r.status_code == 400 and "does not support /recommend" in r.json()["error"]
    # a second version: canary routing, as for every kind
    srv.add_bundle(bundle, version="2")
    versions = srv.model_versions("seq")
    assert httpx.get(f"{url}/v2/models/seq").json()["versions"] == ["1", "2"]
    versions.set_canary("2", 1.0)
    body = {"inputs": [{"name": "items", "datatype": "INT64", "shape": [1, 2], "data": [[1, 2]]}]}
    assert httpx.post(f"{url}/v2/models/seq/infer", json=body).json()["model_version"] == "2"
    versions.rollback()
    assert httpx.post(f"{url}/v2/models/seq/infer", json=body).json()["model_version"] == "1"
    srv.unload("seq", "2")


@pytest.fixture(scope="module")
def hstu_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = HSTUConfig(max_len=MAX_LEN, dim=16, num_layers=2, num_heads=2)
    model = HSTU(config.sequence_config(NUM_ITEMS), Adam(lr=0.01), config.options())
    rng = np.random.default_rng(0)
    start = rng.integers(1, NUM_ITEMS + 1, 200)
    windows = (start[:, None] + np.arange(MAX_LEN + 1)[None, :] - 1) % NUM_ITEMS + 1
    quiet = TrainConfig(epochs=2, lr=0.01, progress=False, tensorboard=False, plot=False)
    fit(model, window_batches(windows, 32), None, quiet, family=SequentialFamily())
    root = tmp_path_factory.mktemp("hstu")
    save_model(root / "model.pt", model, config, Adam(lr=0.01), ids=RawIds(RAW, COUNTS))
    return write_next_items_bundle(root / "model.pt", root / "bundle", name="hstu", k=5)


def test_an_hstu_is_served_as_next_items_and_scores_candidates(hstu_bundle: Path, bundle: Path) -> None:
    served = load_next_items(hstu_bundle)
    saved = load_model(hstu_bundle / "model.pt")
    assert saved.model_type == "hstu" and isinstance(saved.model, HSTU) and served.scores_candidates
    histories = [np.array([3, 4, 5]), np.arange(1, 12)]
    out = served.next_items(np.concatenate([RAW[h - 1] for h in histories]), np.array([3, 11]), k=4)
    ref_items, _ = recommend_next(saved.model, histories, k=4, exclude_history=True)  # type: ignore[arg-type]
    np.testing.assert_array_equal(out["items"], RAW[ref_items - 1])
    assert out["truncated_items"].tolist() == [0, 11 - MAX_LEN]
    # candidates scored against one history, cached; unknown candidates get -inf; the history keeps its last max_len - 1
    history = RAW[np.arange(1, 12) - 1]
    candidates = np.array([RAW[5], 7, RAW[20], RAW[0]])  # 7 is not an item
    scores, truncated = served.candidate_scores(history, candidates, micro_batch=2)
    with torch.no_grad():
        want = saved.model.candidate_scores(torch.arange(12 - MAX_LEN + 1, 12)[None], torch.tensor([[6, 21, 1]]))[0].numpy()
    np.testing.assert_allclose(scores[[0, 2, 3]], want, rtol=1e-5, atol=1e-6)
    assert scores[1] == -np.inf and truncated == 11 - (MAX_LEN - 1)
    with pytest.raises(ValueError, match="sasrec, which has no candidate scoring"):
        load_next_items(bundle).candidate_scores(history, candidates)


def test_the_manifest_says_whether_the_ranking_head_was_trained(hstu_bundle: Path, tmp_path: Path) -> None:
    """An HSTU trained with model.ranking_weight > 0: "ranking_head": true in the manifest, read back as
    ranking_head_trained; without it (and in every manifest from before the key) the key is absent = untrained;
    a manifest that disagrees with its model is refused at load, naming the key."""
    import shutil

    assert "ranking_head" not in json.loads((hstu_bundle / "manifest.json").read_text()) and not load_next_items(hstu_bundle).ranking_head_trained
    torch.manual_seed(0)
    config = HSTUConfig(max_len=MAX_LEN, dim=16, num_layers=2, num_heads=2, ranking_weight=1.0)
    model = HSTU(config.sequence_config(NUM_ITEMS), Adam(lr=0.01), config.options())
    start = np.random.default_rng(0).integers(1, NUM_ITEMS + 1, 64)
    windows = (start[:, None] + np.arange(MAX_LEN + 1)[None, :] - 1) % NUM_ITEMS + 1
    quiet = TrainConfig(epochs=1, lr=0.01, progress=False, tensorboard=False, plot=False)
    fit(model, window_batches(windows, 32), None, quiet, family=SequentialFamily(ranking_weight=config.ranking_weight))
    save_model(tmp_path / "model.pt", model, config, Adam(lr=0.01), ids=RawIds(RAW, COUNTS))
    ranked = write_next_items_bundle(tmp_path / "model.pt", tmp_path / "bundle", name="ranked", k=5)
    manifest = json.loads((ranked / "manifest.json").read_text())
    assert manifest["ranking_head"] is True and load_next_items(ranked).ranking_head_trained
    assert load_model(ranked / "model.pt").config.ranking_weight == 1.0  # type: ignore[union-attr]  # an HSTUConfig
    copy = tmp_path / "copy"
    shutil.copytree(ranked, copy)
    del manifest["ranking_head"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"says ranking_head = False but the model .* was trained with model.ranking_weight = 1.0"):
        load_next_items(copy)


@pytest.fixture(scope="module")
def timed_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HSTU trained on its items' timestamps (model.times = true), exported as a next-items bundle."""
    torch.manual_seed(0)
    config = HSTUConfig(max_len=MAX_LEN, dim=16, num_layers=2, num_heads=2, times=True)
    model = HSTU(config.sequence_config(NUM_ITEMS), Adam(lr=0.01), config.options())
    rng = np.random.default_rng(0)
    start = rng.integers(1, NUM_ITEMS + 1, 200)
    windows = (start[:, None] + np.arange(MAX_LEN + 1)[None, :] - 1) % NUM_ITEMS + 1
    times = np.cumsum(rng.integers(1, 10**6, windows.shape), axis=1)  # increasing seconds, gaps of many buckets
    quiet = TrainConfig(epochs=2, lr=0.01, progress=False, tensorboard=False, plot=False)
    fit(model, window_batches(windows, 32, times=times), None, quiet, family=SequentialFamily(times=True))
    root = tmp_path_factory.mktemp("timed")
    save_model(root / "model.pt", model, config, Adam(lr=0.01), ids=RawIds(RAW, COUNTS))
    return export(root / "model.pt", root / "bundle", name="timed", k=5)


def test_a_timed_hstu_is_exported_and_its_manifest_says_so(timed_bundle: Path, bundle: Path, tmp_path: Path) -> None:
    manifest = json.loads((timed_bundle / "manifest.json").read_text())
    assert manifest["times"] is True and "times" not in json.loads((bundle / "manifest.json").read_text())
    served = load_next_items(timed_bundle)
    assert served.uses_times and not load_next_items(bundle).uses_times
    # a manifest that disagrees with its model is refused at load
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(timed_bundle, copy)
    del manifest["times"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"says times = False but the model .* was trained with model.times = True"):
        load_next_items(copy)


@pytest.fixture(scope="module")
def timed_server(timed_bundle: Path, bundle: Path) -> Iterator[str]:
    srv = InferenceServer(ServerConfig(limits=RequestLimits(max_request_rows=16)))
    srv.add_bundle(timed_bundle)
    srv.add_bundle(bundle)
    with BackgroundServer(srv) as url:
        yield url
    srv.close()


HIST = [np.array([3, 4, 5]), np.arange(1, 12)]  # dense ids; the second longer than MAX_LEN
HIST_T = [np.array([1_000, 50_000, 50_060]), np.cumsum(np.arange(1, 12) ** 4) + 1_600_000_000]


def test_the_server_answers_a_timed_hstu_as_recommend_next_with_times(timed_bundle: Path, timed_server: str) -> None:
    saved = load_model(timed_bundle / "model.pt")
    items, scores = recommend_next(saved.model, HIST, k=4, exclude_history=True, times=HIST_T)  # type: ignore[arg-type]
    request = {
        "inputs": [
            {"name": "items", "datatype": "INT64", "shape": [14], "data": RAW[np.concatenate(HIST) - 1].tolist()},
            {"name": "items.lengths", "datatype": "INT64", "shape": [2], "data": [3, 11]},
            {"name": "items.times", "datatype": "INT64", "shape": [14], "data": np.concatenate(HIST_T).tolist()},
        ],
        "parameters": {"k": 4},
    }
    r = httpx.post(f"{timed_server}/v2/models/timed/infer", json=request)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o for o in r.json()["outputs"]}
    assert outputs["items"]["data"] == RAW[items - 1].ravel().tolist()
    np.testing.assert_allclose(np.array(outputs["scores"]["data"]).reshape(2, 4), scores, rtol=1e-6, atol=1e-7)
    assert outputs["truncated_items"]["data"] == [0, 11 - MAX_LEN]
    # the history longer than max_len reads its tail's own times: the same answer as the tail alone
    tail = recommend_next(saved.model, [HIST[1][-MAX_LEN:]], k=4, times=[HIST_T[1][-MAX_LEN:]])  # type: ignore[arg-type]
    np.testing.assert_array_equal(tail[1][0], recommend_next(saved.model, [HIST[1]], k=4, times=[HIST_T[1]])[1][0])  # type: ignore[arg-type]
    meta = httpx.get(f"{timed_server}/v2/models/timed").json()
    assert [i["name"] for i in meta["inputs"]] == ["items", "items.lengths", "items.times"]


HUGE = "7" * 5000


@pytest.mark.parametrize(
    ("model", "times", "message"),
    [
        ("timed", None, "input 'items.times' is required"),
        ("timed", "[1, 2]", "input 'items.times': shape [3] needs 3 values, 'data' has 2"),
        ("timed", "[1.5, 2, 3]", "input 'items.times': datatype INT64 needs integers"),
        ("timed", f"[1, 2, {HUGE}]", "field 'inputs[2].data[2]': an integer of 5000 digits"),
        ("timed", f"[1, 2, 1{'0' * 400}]", "field 'inputs[2].data[2]': an integer of 401 digits"),
        ("timed", "[1, [2], 3]", "input 'items.times': 'data' is not a regular array"),
        ("seq", "[1, 2, 3]", "input 'items.times': model 'seq' was trained without timestamps and does not take them"),
    ],
)
def test_bad_times_over_http_are_400_naming_the_field(timed_server: str, model: str, times: str | None, message: str) -> None:
    inputs = ['{"name": "items", "datatype": "INT64", "shape": [3], "data": [1000, 1003, 1006]}',
              '{"name": "items.lengths", "datatype": "INT64", "shape": [1], "data": [3]}']
    if times is not None:
        inputs.append('{"name": "items.times", "datatype": "INT64", "shape": [3], "data": ' + times + "}")
    body = '{"inputs": [' + ", ".join(inputs) + "]}"
    r = httpx.post(f"{timed_server}/v2/models/{model}/infer", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and message in r.json()["error"], r.text


def test_a_version_without_times_ignores_them_while_a_version_with_them_is_loaded(timed_bundle: Path, bundle: Path) -> None:
    """Canary routing across a change of the fields: clients send "items.times" for the version trained with
    them; the other version (no times) reads the items alone rather than refusing the request."""
    srv = InferenceServer(ServerConfig())
    srv.add_bundle(timed_bundle, name="recs", version="1")
    srv.add_bundle(bundle, name="recs", version="2")
    body = {"inputs": [
        {"name": "items", "datatype": "INT64", "shape": [2], "data": [1000, 1003]},
        {"name": "items.lengths", "datatype": "INT64", "shape": [1], "data": [2]},
        {"name": "items.times", "datatype": "INT64", "shape": [2], "data": [10, 20]},
    ]}
    try:
        with BackgroundServer(srv) as url:
            assert httpx.post(f"{url}/v2/models/recs/infer", json=body).json()["model_version"] == "1"
            srv.model_versions("recs").set_canary("2", 1.0)
            r = httpx.post(f"{url}/v2/models/recs/infer", json=body)
            assert r.status_code == 200 and r.json()["model_version"] == "2", r.text
            meta = httpx.get(f"{url}/v2/models/recs/versions/1").json()
            assert [i["name"] for i in meta["inputs"]] == ["items", "items.lengths", "items.times"]
            srv.model_versions("recs").promote("2")
            srv.unload("recs", "1")
            r = httpx.post(f"{url}/v2/models/recs/infer", json=body)  # no loaded version takes them now
            assert r.status_code == 400 and "input 'items.times': model 'recs' was trained without timestamps" in r.json()["error"]
    finally:
        srv.close()
