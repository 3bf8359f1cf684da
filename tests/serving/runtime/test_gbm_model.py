"""GBM bundles: the compiled forest against the libraries' own predict, the server against the library,
missing values, bad requests, and the error without the optional extra."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from hugerec.data.schema import Schema
from hugerec.models.gbm import FeatureMatrix, Library, LightGBMConfig, TreeModel, XGBoostConfig, require
from hugerec.serving.bundles.gbm_bundle import is_gbm_bundle, load_gbm_bundle, write_gbm_bundle
from hugerec.serving.http.limits import RequestLimits
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.runtime.forest import FLAG_CATEGORICAL, Forest, margin_reference
from hugerec.serving.runtime.gbm_model import GBMModel, GBMPredictor
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.training.gbm_fit import fit_trees

pytest.importorskip("lightgbm")
pytest.importorskip("xgboost")

DENSE = ("I1", "I2", "I3")
SPARSE = ("C1", "C2", "C3")
CARD = 60


def _rows(n: int, seed: int, unseen: bool = False) -> np.ndarray:
    """[n, 6] float32: 3 dense (with exact zeros and NaN), 3 ids (NaN missing; with `unseen`, ids beyond the
    training vocabulary and negative ones)."""
    rng = np.random.default_rng(seed)
    hi = CARD + 20 if unseen else CARD
    x = np.hstack([rng.normal(size=(n, 3)), rng.integers(-2 if unseen else 0, hi, size=(n, 3))]).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    x[rng.random(n) < 0.1, 1] = 0.0
    return x


def _matrix(n: int, seed: int) -> FeatureMatrix:
    x = _rows(n, seed)
    rng = np.random.default_rng(seed + 1)
    signal = np.nan_to_num(x[:, 0]) + (np.nan_to_num(x[:, 3]) % 3 == 0) - 0.5 * np.isnan(x[:, 4])
    y = (signal + 0.5 * rng.normal(size=n) > 0.3).astype(np.float32)
    return FeatureMatrix(x, y, (*DENSE, *SPARSE), len(DENSE))


def _schema() -> Schema:
    return Schema.build(["label"], DENSE, dict.fromkeys(SPARSE, CARD))


def _config(library: Library, **extra: Any) -> LightGBMConfig | XGBoostConfig:
    if library is Library.LIGHTGBM:
        params = {"min_data_per_group": 5, "cat_smooth": 1.0, "max_cat_to_onehot": 4, **extra}
        return LightGBMConfig(num_trees=40, num_leaves=15, threads=1, early_stopping_rounds=None, params=params)
    return XGBoostConfig(num_trees=40, max_depth=4, threads=1, early_stopping_rounds=None, params=extra)


@pytest.fixture(scope="module", params=[Library.LIGHTGBM, Library.XGBOOST], ids=lambda lib: lib.value)
def bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Library, Path, TreeModel]:
    library: Library = request.param
    root = tmp_path_factory.mktemp(library.value)
    model, _ = fit_trees(_config(library), _matrix(3000, 0), _matrix(600, 1), out_dir=None, log_every=0)
    path = model.save(root / library.model_file)
    out = write_gbm_bundle(path, library, root / "bundle", _schema(), name="gbm")
    return library, out, TreeModel.load(path, library)


@pytest.mark.parametrize(
    ("library", "variant"),
    [
        (Library.LIGHTGBM, "native"),
        (Library.LIGHTGBM, "codes"),
        (Library.LIGHTGBM, "zero_as_missing"),
        (Library.XGBOOST, "native"),
        (Library.XGBOOST, "codes"),
    ],
)
def test_forest_equals_the_library(library: Library, variant: str) -> None:
    """The compiled forest against the library's own predict, on rows with NaN, zeros, negative and unseen ids."""
    extra: dict[str, Any] = {"zero_as_missing": True} if variant == "zero_as_missing" else {}
    config = _config(library, **extra)
    if variant == "codes":
        config = type(config)(**{**config.__dict__, "categorical": "codes"})
    model, _ = fit_trees(config, _matrix(2000, 2), None, out_dir=None, log_every=0)
    forest = (
        Forest.from_lightgbm(model.booster.model_to_string())
        if library is Library.LIGHTGBM
        else Forest.from_xgboost_json(bytes(model.booster.save_raw("json")))
    )
    if variant != "codes":
        assert (forest.flags & FLAG_CATEGORICAL).any(), "the trees should have categorical splits"
    x = np.vstack([_rows(700, 3, unseen=True), _edges(forest)])
    expected = model.margin(x)
    got = forest.margin(x)  # 700+ rows: the parallel kernel where Numba has more than one thread
    assert_equal = np.testing.assert_array_equal
    if library is Library.LIGHTGBM:
        assert_equal(got, expected)  # bit for bit: the same float64 sum in the same order
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # XGBoost sums in float32
    assert_equal(got, margin_reference(forest, x))
    for rows in (x[:1], x[:200]):  # the columns entry point, and each kernel whatever the thread count
        want = margin_reference(forest, rows)
        assert_equal(forest.margin_columns(np.ascontiguousarray(rows.T)), want)
        for got in _each_kernel(forest, rows):
            assert_equal(got, want)


def _edges(forest: Forest) -> np.ndarray:
    """Rows whose dense values sit on the numerical thresholds and on the float32 values either side of
    them (where folding the library's rule into `x <= t` would go wrong), and ids no bitset holds."""
    feature = forest.nodes[:, 0] & 0xFFFFFF
    numerical = ((forest.flags & FLAG_CATEGORICAL) == 0) & (feature < len(DENSE))
    t = forest.thresholds[numerical]
    values = np.concatenate([t, np.nextafter(t, np.float32(np.inf)), np.nextafter(t, np.float32(-np.inf))])
    columns = np.tile(feature[numerical], 3)
    x = _rows(values.shape[0], 11)
    x[np.arange(values.shape[0]), columns] = values
    x[:20, len(DENSE)] = [3e9, 1e30, 2**31, 2**24, 1e6, 31.0, 32.0, 33.0, 63.0, 64.0] * 2
    # LightGBM reads |x| <= 1e-35f as 0.0 whatever the node's missing type: values in that band and
    # either side of its float32 edges, in every dense column
    z = np.float32(1e-35)
    tiny = np.array([z, -z, np.nextafter(z, np.float32(1)), -np.nextafter(z, np.float32(1)), z / 2, -z / 2, -0.0])
    band = _rows(tiny.shape[0] * len(DENSE), 12)
    band[np.arange(band.shape[0]), np.repeat(np.arange(len(DENSE)), tiny.shape[0])] = np.tile(tiny, len(DENSE))
    return np.vstack([x, band])


def _each_kernel(forest: Forest, x: np.ndarray) -> list[np.ndarray]:
    """The raw scores of the calling thread's kernel and of the parallel one (blocks over Numba's threads)."""
    from hugerec.serving.runtime.forest import _BLOCK, _score, _score_parallel

    xt = np.ascontiguousarray(x.T)
    one, parallel = np.empty(x.shape[0]), np.empty(x.shape[0])
    _score(xt, *forest._arrays(), forest.base, 0, x.shape[0], one)
    _score_parallel(xt, *forest._arrays(), forest.base, -(-x.shape[0] // _BLOCK), parallel)
    return [one, parallel]


def test_forest_refuses_what_it_cannot_score() -> None:
    with pytest.raises(ValueError, match="not a LightGBM text model"):
        Forest.from_lightgbm("hello")
    with pytest.raises(ValueError, match="not an XGBoost JSON model"):
        Forest.from_xgboost({"learner": {}})


def _inputs(x: np.ndarray) -> ModelInputs:
    """Rows -> ModelInputs; a NaN id is an empty bag."""
    ids = {}
    for j, f in enumerate(SPARSE):
        col = x[:, len(DENSE) + j]
        present = ~np.isnan(col)
        ids[f] = (col[present].astype(np.int64), present.astype(np.int32))
    return ModelInputs(np.ascontiguousarray(x[:, : len(DENSE)]), ids)


def test_both_paths_equal_the_library(bundle: tuple[Library, Path, TreeModel]) -> None:
    _, path, tree = bundle
    assert is_gbm_bundle(path)
    x = _rows(300, 4)
    for predictor in GBMPredictor:
        model = load_gbm_bundle(path, predictor=predictor).model
        np.testing.assert_allclose(model.predict(_inputs(x)), tree.margin(x), rtol=1e-5, atol=1e-5)


def test_damaged_bundle_is_refused(bundle: tuple[Library, Path, TreeModel], tmp_path: Path) -> None:
    library, path, _ = bundle
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(path, copy)
    with open(copy / library.model_file, "a") as f:
        f.write("\n")
    with pytest.raises(ValueError, match=f"checksum mismatch for {library.model_file}"):
        load_gbm_bundle(copy)


@pytest.fixture(scope="module")
def served(bundle: tuple[Library, Path, TreeModel]) -> Iterator[tuple[str, TreeModel]]:
    _, path, tree = bundle
    srv = InferenceServer(ServerConfig(batching=BatchingConfig(max_batch_size=64, max_delay_ms=2), limits=RequestLimits(max_request_rows=512)))
    srv.add_bundle(path)
    with BackgroundServer(srv) as url:
        yield url, tree
    srv.close()


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-v)))


@pytest.mark.parametrize("binary", [False, True])
def test_server_answers_what_the_library_predicts(served: tuple[str, TreeModel], binary: bool) -> None:
    """KServe v2 through tritonclient (NaN dense values and empty bags are missing values) and /predict."""
    url, tree = served
    x = _rows(200, 5)
    inputs = _inputs(x)
    tensors: dict[str, np.ndarray] = {"dense": inputs.dense}
    for f in SPARSE:
        tensors[f], tensors[f + ".lengths"] = inputs.ids[f]
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    request = []
    for name, array in tensors.items():
        t = triton.InferInput(name, list(array.shape), {np.float32: "FP32", np.int64: "INT64", np.int32: "INT32"}[array.dtype.type])
        t.set_data_from_numpy(array, binary_data=binary)
        request.append(t)
    result = client.infer("gbm", request)
    expected = _sigmoid(tree.margin(x))
    np.testing.assert_allclose(result.as_numpy("scores"), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("logits"), tree.margin(x), rtol=1e-5, atol=1e-5)

    full = x[~np.isnan(x[:, 3:]).any(axis=1) & ~np.isnan(x[:, :3]).any(axis=1)][:20]  # JSON: no NaN
    instances = [
        {"dense": row[:3].tolist(), **{f: int(row[3 + j]) for j, f in enumerate(SPARSE)}} for row in full
    ]
    instances[0]["C2"] = []  # no id: a missing value
    r = httpx.post(f"{url}/predict", json={"instances": instances})
    assert r.status_code == 200, r.text
    full = full.copy()
    full[0, 4] = np.nan
    np.testing.assert_allclose(r.json()["predictions"], _sigmoid(tree.margin(full)), rtol=1e-5, atol=1e-6)


def test_concurrent_requests_are_batched_and_exact(served: tuple[str, TreeModel]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    url, tree = served
    x = _rows(64, 6)
    x = x[~np.isnan(x).any(axis=1)]

    def one(row: np.ndarray) -> float:
        body = {"inputs": [
            {"name": "dense", "datatype": "FP32", "shape": [1, 3], "data": row[:3].tolist()},
            *({"name": f, "datatype": "INT64", "shape": [1], "data": [int(row[3 + j])]} for j, f in enumerate(SPARSE)),
        ]}
        r = httpx.post(f"{url}/v2/models/gbm/infer", content=json.dumps(body))
        assert r.status_code == 200, r.text
        return float(next(o for o in r.json()["outputs"] if o["name"] == "scores")["data"][0])

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, x))
    np.testing.assert_allclose(got, _sigmoid(tree.margin(x)), rtol=1e-5, atol=1e-6)


def test_bad_requests_get_400_naming_the_input(served: tuple[str, TreeModel]) -> None:
    url, _ = served
    base = [
        {"name": "dense", "datatype": "FP32", "shape": [1, 3], "data": [0.1, 0.2, 0.3]},
        *({"name": f, "datatype": "INT64", "shape": [1], "data": [1]} for f in SPARSE),
    ]
    unknown = [*base, {"name": "C99", "datatype": "INT64", "shape": [1], "data": [4]}]
    r = httpx.post(f"{url}/v2/models/gbm/infer", json={"inputs": unknown})
    assert r.status_code == 400 and "C99" in r.json()["error"]
    two = [*base[:3], {"name": "C3", "datatype": "INT64", "shape": [2], "data": [1, 2]},
           {"name": "C3.lengths", "datatype": "INT32", "shape": [1], "data": [2]}]  # fmt: skip
    r = httpx.post(f"{url}/v2/models/gbm/infer", json={"inputs": two})
    assert r.status_code == 400 and "'C3' has 2 ids in example 0" in r.json()["error"]
    r = httpx.post(f"{url}/predict", json={"instances": [{"dense": [1, 2, 3], "C1": 1, "C2": 1, "C3": 1, "C9": 2}]})
    assert r.status_code == 400 and "C9" in r.json()["error"]
    inf = [{**base[0], "data": [1e39, 0.0, 0.0]}, *base[1:]]
    r = httpx.post(f"{url}/v2/models/gbm/infer", json={"inputs": inf})
    assert r.status_code == 400 and "inf" in r.json()["error"]


def test_gbm_model_satisfies_the_inference_model_interface(bundle: tuple[Library, Path, TreeModel]) -> None:
    """What the server and a pipeline's Score stage read of a model version."""
    _, path, _ = bundle
    model = load_gbm_bundle(path).model
    assert isinstance(model, GBMModel)
    assert model.num_dense == 3 and model.features == SPARSE and model.vector_signature == ()
    assert model.device.type == "cpu"
    x = _rows(5, 9)
    x = np.nan_to_num(x)
    one = ModelInputs.from_one_id(x[:, :3].copy(), SPARSE, np.ascontiguousarray(x[:, 3:].T.astype(np.int64)))
    out = model.predict(one)
    assert out.dtype == np.float32 and out.shape == (5,)


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for library in Library:
        monkeypatch.setitem(sys.modules, library.value, None)  # `import lightgbm` now raises ImportError
        with pytest.raises(ImportError, match=r"pip install 'hugerec\[gbm\]'"):
            require(library)


# -- hostile model files (issue 28): refused in one line, the server keeps serving ----------------------
TOKEN = "a" * 24


def _lgb_edit(key: str, value: int) -> Any:
    """Tree 1's first inner node gets `key` = value (tree_sizes dropped: the block's size changes)."""

    def edit(raw: bytes) -> bytes:
        text = re.sub(r"^tree_sizes=.*\n", "", raw.decode(), flags=re.M)
        start = text.index("\nTree=1\n")
        line = re.compile(rf"^{key}=(\S+)", re.M).search(text, start)
        assert line is not None
        return (text[: line.start(1)] + str(value) + text[line.end(1) :]).encode()

    return edit


def _xgb_edit(change: Any) -> Any:
    def edit(raw: bytes) -> bytes:
        model = json.loads(raw)
        change(model["learner"], model["learner"]["gradient_booster"]["model"]["trees"])
        return json.dumps(model).encode()

    return edit


def _first_categorical(trees: list[dict[str, Any]]) -> dict[str, Any]:
    return next(t for t in trees if t["categories"])


HOSTILE: dict[Library, dict[str, tuple[Any, str]]] = {
    Library.LIGHTGBM: {
        "truncated": (lambda raw: raw[: raw.index(b"end of trees") // 2], "truncated"),
        "tree_sizes": (lambda raw: re.sub(rb"tree_sizes=(\d+)", lambda m: b"tree_sizes=" + str(int(m.group(1)) + 9).encode(), raw, count=1),
                       "tree 0: tree_sizes= says"),
        "garbage": (lambda raw: bytes(np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)), "not UTF-8"),
        "long line": (lambda raw: raw.replace(b"Tree=0\n", b"Tree=0\n" + b"x" * 5_000_000 + b"\n", 1), "tree_sizes"),
        "own node": (_lgb_edit("left_child", 0), "tree 1 node 0: left child is the node itself"),
    },
    Library.XGBOOST: {
        "truncated": (lambda raw: raw[: len(raw) // 2], "not JSON"),
        "own node": (_xgb_edit(lambda learner, trees: trees[1]["left_children"].__setitem__(0, 0)),
                     "tree 1 node 0: left child is the node itself"),
        "out of range": (_xgb_edit(lambda learner, trees: trees[2]["right_children"].__setitem__(0, 99_999)),
                         "tree 2 node 0: right child 99999 is out of range"),
        "base_score 1": (_xgb_edit(lambda learner, trees: learner["learner_model_param"].__setitem__("base_score", "[1E0]")),
                         "base_score 1.0 of objective binary:logistic"),
        "category 2**40": (_xgb_edit(lambda learner, trees: _first_categorical(trees)["categories"].__setitem__(0, 2**40)),
                           f"category {2**40} is outside"),
    },
}  # fmt: skip


def _tampered(bundle: Path, out: Path, library: Library, edit: Any) -> Path:
    """A copy of `bundle` whose model file is edit(its bytes), with the manifest's sha256 updated (as an
    insider or a compromised build would)."""
    import hashlib
    import shutil

    shutil.copytree(bundle, out)
    model = out / library.model_file
    model.write_bytes(edit(model.read_bytes()))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"][library.model_file] = hashlib.sha256(model.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def admin_served(bundle: tuple[Library, Path, TreeModel]) -> Iterator[tuple[InferenceServer, str]]:
    _, path, _ = bundle
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, limits=RequestLimits(max_request_rows=512), load_deadline_s=120.0))
    srv.add_bundle(path)
    with BackgroundServer(srv) as url:
        yield srv, url
    srv.close()


def _scores(url: str, x: np.ndarray) -> np.ndarray:
    inputs = _inputs(x)
    body = {"inputs": [
        {"name": "dense", "datatype": "FP32", "shape": list(inputs.dense.shape), "data": inputs.dense.reshape(-1).tolist()},
        *({"name": f, "datatype": "INT64", "shape": [x.shape[0]], "data": inputs.ids[f][0].tolist()} for f in SPARSE),
    ]}  # fmt: skip
    r = httpx.post(f"{url}/v2/models/gbm/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return np.asarray(next(o for o in r.json()["outputs"] if o["name"] == "logits")["data"])


def test_hostile_model_files_are_refused_and_the_server_keeps_serving(
    bundle: tuple[Library, Path, TreeModel], admin_served: tuple[InferenceServer, str], tmp_path: Path
) -> None:
    """Each finding of issue 28 as an admin load into a serving server: a 400 of one line naming the
    model file and what is wrong; the served model answers as before, nothing new is served."""
    library, path, tree = bundle
    srv, url = admin_served
    x = np.nan_to_num(_rows(16, 21))
    before = _scores(url, x)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for case, (edit, needle) in HOSTILE[library].items():
        bad = _tampered(path, tmp_path / case.replace(" ", "_").replace("*", ""), library, edit)
        r = httpx.post(f"{url}/v2/repository/models/bad/load", json={"bundle": str(bad)}, headers=auth, timeout=300)
        error = r.json()["error"]
        assert r.status_code == 400 and "\n" not in error, (case, r.status_code, error)
        assert str(bad / library.model_file) in error and needle in error, (case, error)
        np.testing.assert_array_equal(_scores(url, x), before)  # still serving, the same answers
    assert httpx.get(f"{url}/v2/health/live").status_code == 200
    assert "bad" not in srv.models
    np.testing.assert_allclose(before, tree.margin(x), rtol=1e-5, atol=1e-5)


def test_every_admin_load_is_refused_past_the_deadline(bundle: tuple[Library, Path, TreeModel], tmp_path: Path) -> None:
    """A load (here slowed down) that outlives load_deadline_s is a 400, and what it loaded is never served."""
    import threading
    import time

    _, path, _ = bundle
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, load_deadline_s=1.0))
    slow_done = threading.Event()
    add = srv.add_bundle

    def slow_add(*args: Any) -> Any:
        time.sleep(2.5)
        try:
            return add(*args)
        finally:
            slow_done.set()

    srv.add_bundle = slow_add  # type: ignore[method-assign, assignment]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with BackgroundServer(srv) as url:
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v2/repository/models/late/load", json={"bundle": str(path)}, headers=auth, timeout=60)
        assert r.status_code == 400 and "not loaded within 1 s" in r.json()["error"], r.text
        assert time.monotonic() - t0 < 2.4  # answered at the deadline, before the load ended
        assert slow_done.wait(120)
        assert "late" not in srv.models  # the late result was refused where it would have been registered
        r = httpx.post(f"{url}/v2/repository/index", headers=auth)
        assert r.status_code == 200 and r.json() == []
    srv.close()


def test_an_admin_load_without_the_library_is_a_400_naming_the_extra(
    bundle: tuple[Library, Path, TreeModel], admin_served: tuple[InferenceServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hugerec.serving.bundles import gbm_file

    _, path, _ = bundle
    _, url = admin_served
    monkeypatch.setattr(gbm_file.importlib.util, "find_spec", lambda name: None)
    r = httpx.post(f"{url}/v2/repository/models/other/load", json={"bundle": str(path)}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400 and "pip install 'hugerec[gbm]'" in r.json()["error"], r.text
