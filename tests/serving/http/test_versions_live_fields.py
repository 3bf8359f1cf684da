"""Two versions of one model trained on different schemas share the traffic: each ignores the request fields
only the other takes (protocol.LiveFields, ModelVersions.fields), a request one version cannot take goes to
the other (server._routed), fields no loaded version takes and fields the answering version needs
but lacks are still 4xx naming them, and after the canary is unloaded its fields are refused again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import polars as pl
import pytest
import torch

from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.numeric import Normalize
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundles.export import export
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.http.versions import ModelVersions
from hugerec.serving.runtime.inference_protocol import (
    LiveFields,
    RequestError,
    Signature,
    decode_instances,
    to_model_inputs,
)
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
from hugerec.serving.runtime.served_model import ServedModel

TOKEN = "live-fields-test-token"
OLD = Schema.build(dense=["d0", "d1"], sparse=["c0", "c1"])  # the stable version's columns
NEW = Schema.build(dense=["d0"], sparse=["c0", "c1", "c6"])  # the canary's: c6 added, d1 removed


def _model(schema: Schema, seed: int) -> DLRM:
    torch.manual_seed(seed)
    tables = [TableConfig(n, 50, 4) for n in schema.sparse_names]
    return DLRM(EmbeddingCollection(tables), len(schema.dense_names), [8, 4], [8, 1]).eval()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("live")
    old = export(_model(OLD, 0), out / "old", name="m", version="old", schema=OLD)
    new = export(_model(NEW, 1), out / "new", name="m", version="new", schema=NEW)
    return old, new


@pytest.fixture
def served(bundles: tuple[Path, Path]) -> Iterator[tuple[InferenceServer, str]]:
    """Stable "old" and canary "new" of model "m", the canary at share 0.5."""
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    srv.add_bundle(bundles[0])
    srv.add_bundle(bundles[1])
    srv.model_versions("m").set_canary("new", 0.5)
    with BackgroundServer(srv) as url:
        yield srv, url
    srv.close()


def _rows(n: int, schema_fields: tuple[str, ...], seed: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    return [
        {f: (float(rng.normal()) if f.startswith("d") else [int(rng.integers(50))]) for f in schema_fields}
        for _ in range(n)
    ]


OLD_FIELDS = ("d0", "d1", "c0", "c1")
NEW_FIELDS = ("d0", "c0", "c1", "c6")
BOTH_FIELDS = ("d0", "d1", "c0", "c1", "c6")


def _predict(url: str, rows: list[dict[str, object]], **extra: object) -> httpx.Response:
    return httpx.post(f"{url}/predict", json={"model": "m", "instances": rows, **extra})


def _offline(srv: InferenceServer, version: str, rows: list[dict[str, object]]) -> np.ndarray:
    """What `version` scores for the rows cut to its own fields (no LiveFields involved)."""
    served = srv.model_versions("m").get(version)
    own = [{k: v for k, v in r.items() if k in served.preprocess.keys} for r in rows]
    logits = served.model.predict(served.preprocess(own))
    return np.asarray(1 / (1 + np.exp(-logits)), np.float32)


def test_old_new_and_union_rows_are_all_answered_at_share_half(served: tuple[InferenceServer, str]) -> None:
    srv, url = served
    seen: dict[tuple[str, ...], dict[str, int]] = {}
    for fields in (OLD_FIELDS, NEW_FIELDS, BOTH_FIELDS):
        counts: dict[str, int] = {}
        for i in range(24):
            rows = _rows(3, fields, seed=i)
            r = _predict(url, rows)
            assert r.status_code == 200, r.text
            version = r.json()["model_version"]
            counts[version] = counts.get(version, 0) + 1
            np.testing.assert_allclose(r.json()["predictions"], _offline(srv, version, rows), rtol=1e-5, atol=1e-6)
        seen[fields] = counts
    assert seen[OLD_FIELDS] == {"old": 24}  # the canary lacks c6: the stable answers them all
    assert seen[NEW_FIELDS] == {"new": 24}  # the stable lacks d1: the canary answers them all
    both = seen[BOTH_FIELDS]  # each version ignores the other's field: the share holds
    assert set(both) == {"old", "new"} and 4 <= both["new"] <= 20, both


def _infer(url: str, inputs: dict[str, np.ndarray], version: str | None = None) -> httpx.Response:
    path = f"/v2/models/m/versions/{version}/infer" if version else "/v2/models/m/infer"
    specs = [
        {"name": k, "datatype": "FP32" if k == "dense" else "INT64", "shape": list(v.shape), "data": v.ravel().tolist()}
        for k, v in inputs.items()
    ]
    return httpx.post(url + path, json={"inputs": specs})


def test_infer_ignores_the_other_versions_inputs_and_refuses_unknown_ones(served: tuple[InferenceServer, str]) -> None:
    _, url = served
    ids = np.arange(3, dtype=np.int64)
    old = {"dense": np.ones((3, 2), np.float32), "c0": ids, "c1": ids}
    new = {"dense": np.ones((3, 1), np.float32), "c0": ids, "c1": ids, "c6": ids}
    answered = set()
    for _ in range(20):
        for inputs, version in ((old | {"c6": ids}, "old"), (new, "new")):  # c6 to the stable: ignored
            r = _infer(url, inputs)
            assert r.status_code == 200 and r.json()["model_version"] == version, r.text
            answered.add(version)
    assert answered == {"old", "new"}
    pinned = _infer(url, old | {"c6": ids, "c6.lengths": np.ones(3, np.int64)}, "old")
    assert pinned.status_code == 200 and pinned.json()["model_version"] == "old", pinned.text
    r = _infer(url, old | {"c7": ids})
    assert r.status_code == 400 and "unknown inputs ['c7']; no loaded version of the model takes them" in r.json()["error"]
    r = _infer(url, {k: v for k, v in new.items() if k != "c0"})
    assert r.status_code == 400 and "missing inputs ['c0']" in r.json()["error"]
    r = _infer(url, old | {"c6": ids}, "new")  # a pinned version answers or refuses: no fallback
    assert r.status_code == 400
    assert "must have shape [B, 1], got [3, 2] (other loaded versions of the model take [2] dense values)" in r.json()["error"]


def test_predict_refuses_unknown_and_missing_fields_naming_them(served: tuple[InferenceServer, str]) -> None:
    _, url = served
    r = _predict(url, [{**_rows(1, BOTH_FIELDS, 0)[0], "c7": 1}])
    assert r.status_code == 400
    assert "unknown features ['c7']; no loaded version of the model takes them" in r.json()["error"]
    r = _predict(url, [{k: v for k, v in _rows(1, BOTH_FIELDS, 0)[0].items() if k != "c1"}])
    assert r.status_code == 400 and "missing feature 'c1'" in r.json()["error"]  # both versions need c1
    r = _predict(url, _rows(2, OLD_FIELDS, 0), version="new")  # pinned: the canary needs c6
    assert r.status_code == 400 and "missing feature 'c6'" in r.json()["error"]
    r = _predict(url, _rows(2, NEW_FIELDS, 0), version="old")  # pinned: the stable needs d1
    assert r.status_code == 400 and "missing dense features ['d1']" in r.json()["error"]
    positional = [{"dense": [0.5, 1.0], "c0": 1, "c1": 2, "c6": 3}]
    r = _predict(url, positional, version="new")
    error = r.json()["error"]
    assert r.status_code == 400 and "'dense' has 2 values, this version takes 1" in error
    assert "other loaded versions of the model take [2]" in error and "send the dense features by name (['d0'])" in error
    assert _predict(url, positional).json()["model_version"] == "old"  # unpinned: the stable takes 2 values


def test_after_the_canary_is_rolled_back_and_unloaded_its_fields_are_refused(
    served: tuple[InferenceServer, str],
) -> None:
    srv, url = served
    assert _predict(url, _rows(2, BOTH_FIELDS, 1)).status_code == 200
    with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}) as admin:
        assert admin.post(f"{url}/admin/models/m/rollback").status_code == 200
        assert admin.post(f"{url}/v2/repository/models/m/unload", json={"version": "new"}).status_code == 200
    r = _predict(url, _rows(2, BOTH_FIELDS, 1))
    assert r.status_code == 400 and "unknown features ['c6']; expected" in r.json()["error"]
    r = _infer(url, {"dense": np.ones((1, 2), np.float32), "c0": np.zeros(1, np.int64), "c1": np.zeros(1, np.int64), "c6": np.zeros(1, np.int64)})
    assert r.status_code == 400 and "unknown inputs ['c6']; the model takes" in r.json()["error"]
    assert srv.model_versions("m").fields().keys == {"dense", "d0", "d1", "c0", "c1"}


SIG = Signature(1, ("u",))


def test_to_model_inputs_reads_only_its_own_inputs() -> None:
    live = LiveFields(frozenset({"dense", "u", "u.lengths", "v", "v.lengths"}), frozenset(), frozenset({1, 3}), 2)
    tensors: dict[str, Any] = {"dense": np.ones((2, 1)), "u": np.arange(2), "v": np.arange(5), "v.lengths": np.array([5, 0])}
    inputs = to_model_inputs(tensors, SIG, live)  # v's batch size is not checked: v is not read
    assert list(inputs.ids) == ["u"] and inputs.dense.shape == (2, 1)
    with pytest.raises(RequestError, match=r"unknown inputs \['v', 'v.lengths'\]; the model takes \['dense', 'u'\]"):
        to_model_inputs(tensors, SIG)
    with pytest.raises(RequestError, match=r"got \[2, 3\] \(other loaded versions of the model take \[3\] dense values\)"):
        to_model_inputs({"dense": np.ones((2, 3)), "u": np.arange(2)}, SIG, live)


def test_decode_instances_ignores_other_versions_keys() -> None:
    live = LiveFields(frozenset(), frozenset({"dense", "a", "b", "u", "v"}), frozenset({1, 2}), 2)
    rows = [{"a": 1.0, "b": 2.0, "u": 3, "v": 4}, {"a": 5.0, "u": [6, 7], "v": []}]
    inputs = decode_instances(rows, SIG, ("a",), live)
    np.testing.assert_array_equal(inputs.dense, [[1.0], [5.0]])
    np.testing.assert_array_equal(inputs.ids["u"][0], [3, 6, 7])
    with pytest.raises(RequestError, match=r"instances\[0\]: unknown features \['b', 'v'\]; expected"):
        decode_instances(rows, SIG, ("a",))
    with pytest.raises(RequestError, match=r"instances\[1\]: unknown features \['w'\]; no loaded version"):
        decode_instances([rows[0], {**rows[1], "w": 1}], SIG, ("a",), live)
    with pytest.raises(RequestError, match=r"'dense' has 2 values, this version takes 1; other loaded versions"):
        decode_instances([{"dense": [1.0, 2.0], "u": 1}], SIG, ("a",), live)
    with pytest.raises(RequestError, match=r"needs 'dense' \(a list of 1 numbers\) or the dense features \['a'\] by name"):
        decode_instances([{"u": 1}], SIG, ("a",), live)


def test_raw_rows_through_a_workflow_drop_only_other_versions_columns() -> None:
    raw = pl.DataFrame({"label": [0, 1, 0, 1], "clicks": [3, 1, 10, 0], "user": ["ann", "bob", "ann", "cid"]})
    workflow = Workflow([Normalize(["clicks"]), Categorify(["user"])])
    workflow.fit(raw)
    schema = Schema.build(dense=["clicks"], sparse={"user": workflow.cardinalities()["user"]})
    pre = RequestPreprocessor(Signature(1, ("user",)), schema, workflow)
    assert pre.keys == {"label", "clicks", "user"}
    live = LiveFields(frozenset(), pre.keys | {"tier"}, frozenset({1}), 2)  # another version reads "tier"
    rows: list[dict[str, object]] = [{"clicks": 2, "user": "bob", "tier": 3}, {"clicks": 5, "user": "zed"}]
    got, want = pre(rows, live), pre([{k: v for k, v in r.items() if k != "tier"} for r in rows])
    np.testing.assert_array_equal(got.dense, want.dense)
    np.testing.assert_array_equal(got.ids["user"][0], want.ids["user"][0])
    with pytest.raises(RequestError, match=r"unknown column\(s\) \['tier'\]"):
        pre(rows)  # no other version takes "tier": refused, not dropped


def test_fallback_is_the_other_of_stable_and_canary_while_the_canary_has_traffic() -> None:
    vs = ModelVersions("m")
    for v in ("1", "2", "3"):
        served = ServedModel.__new__(ServedModel)
        served.name, served.version, served.closers = "m", v, []
        vs.add(served)
    assert vs.fallback("1") is None  # no canary
    vs.set_canary("2", 0.0)
    assert vs.fallback("1") is None and vs.fallback("2") is vs.get("1")  # a canary without traffic takes none
    vs.set_canary("2", 0.3)
    assert vs.fallback("1") is vs.get("2") and vs.fallback("2") is vs.get("1") and vs.fallback("3") is None


def test_a_fallback_version_is_held_so_an_unload_after_a_rollback_waits_for_its_request() -> None:
    vs = ModelVersions("m")
    for v in ("1", "2"):
        served = ServedModel.__new__(ServedModel)
        served.name, served.version, served.closers = "m", v, []
        vs.add(served)
    vs.set_canary("2", 0.5)
    held = vs.acquire_fallback("1")  # the stable could not take a request: the canary answers it
    assert held is vs.get("2")
    vs.rollback()  # "2" no longer the canary: it may be unloaded, but not under the request it answers
    removed: list[ServedModel] = []
    t = threading.Thread(target=lambda: removed.append(vs.remove("2", drain_s=10.0)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not removed  # waiting for the request
    vs.release(held)
    t.join(5.0)
    assert removed == [held] and vs.acquire_fallback("1") is None
