"""/predict with raw rows: the bundle's fitted Workflow preprocesses them exactly as the training data."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import polars as pl
import pytest
import torch

from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.numeric import FillMissing, LogOp, Normalize
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.export import export
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.runtime.inference_protocol import RequestError, Signature
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures

RAW = pl.DataFrame(
    {
        "label": [0, 1, 0, 1, 1, 0, 0, 1],
        "clicks": [3, None, 10, 0, 7, 1, None, 2],
        "user": ["ann", "bob", "ann", "cid", "bob", "ann", "dan", "bob"],
        "city": ["x", "y", "x", "x", None, "z", "y", "x"],
    }
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Workflow, DLRM]]:
    workflow = Workflow(
        [FillMissing(["clicks"]), LogOp(["clicks"]), Normalize(["clicks"]), Categorify(["user", "city"])]
    )
    workflow.fit(RAW)
    cards = workflow.cardinalities()
    schema = Schema.build(dense=["clicks"], sparse={"user": cards["user"], "city": cards["city"]})
    torch.manual_seed(0)
    tables = [TableConfig("user", cards["user"], 4), TableConfig("city", cards["city"], 4)]
    model = DLRM(EmbeddingCollection(tables), 1, [4], [8, 1]).eval()
    root = tmp_path_factory.mktemp("pre")
    bundle = export(model, root / "bundle", name="m", schema=schema, workflow=workflow)
    server = InferenceServer(ServerConfig(), ServeOptions(state_dir=str(root / "state")))
    server.add_bundle(bundle)
    with BackgroundServer(server) as url:
        yield url, workflow, model
    server.close()


def offline(workflow: Workflow, model: DLRM, rows: list[dict[str, object]]) -> np.ndarray:
    frame = workflow.transform_request(rows)
    sparse = SparseFeatures.from_lists({f: [[int(v)] for v in frame[f].to_list()] for f in ("user", "city")})
    dense = torch.tensor(frame["clicks"].to_list(), dtype=torch.float32).unsqueeze(1)
    with torch.no_grad():
        return torch.sigmoid(model(Batch(dense, sparse, torch.zeros(len(rows))))).numpy()


def test_raw_rows_are_preprocessed_like_training(served: tuple[str, Workflow, DLRM]) -> None:
    url, workflow, model = served
    rows: list[dict[str, object]] = [
        {"clicks": 5, "user": "ann", "city": "x"},
        {"clicks": None, "user": "never-seen", "city": "q"},  # missing count, out-of-vocabulary strings
        {"user": "bob"},  # absent keys are missing values, as in training files
    ]
    r = httpx.post(f"{url}/predict", json={"instances": rows})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["predictions"], offline(workflow, model, rows), rtol=1e-5, atol=1e-6)


def test_bad_raw_rows_get_400(served: tuple[str, Workflow, DLRM]) -> None:
    url, _, _ = served
    for body, message in (
        ({"instances": [{"nope": 1}]}, "unknown column"),
        ({"instances": [{"clicks": "many"}]}, "does not convert"),
        ({"instances": "x"}, "non-empty list"),
        ({"instances": [{"user": "ann"}], "model": "other"}, "unknown model 'other'"),
    ):
        r = httpx.post(f"{url}/predict", json=body)
        assert r.status_code in (400, 404) and message in r.json()["error"], r.text


def test_preprocessor_needs_a_matching_schema() -> None:
    schema = Schema.build(dense=["a"], sparse={"u": 3})
    with pytest.raises(ValueError, match="needs the schema"):
        RequestPreprocessor(Signature(1, ("u",)), None, Workflow([Categorify(["u"])]))
    with pytest.raises(ValueError, match="does not give"):
        RequestPreprocessor(Signature(2, ("u",)), schema)
    pre = RequestPreprocessor(Signature(1, ("u",)), schema)  # no workflow: encoded rows, dense by column name
    inputs = pre([{"a": 1.5, "u": 2}])
    np.testing.assert_array_equal(inputs.dense, [[1.5]])
    with pytest.raises(RequestError, match="needs 'dense'"):
        pre([{"u": 2}])


def test_multi_hot_columns_become_jagged_ids() -> None:
    schema = Schema.build(dense=["a"], sparse={"u": 10, "tags": 10}, multi_hot=["tags"])
    workflow = Workflow([Normalize(["a"])])  # a workflow whose output already holds the ids
    workflow.fit(pl.DataFrame({"label": [0, 1], "a": [1.0, 3.0], "u": [1, 2], "tags": [[1, 2], []]}))
    pre = RequestPreprocessor(Signature(1, ("u", "tags")), schema, workflow)
    inputs = pre(
        [{"a": 2.0, "u": 3, "tags": [4, 5, 6]}, {"a": 1.0, "u": 1, "tags": []}, {"a": 3.0, "u": 2, "tags": [7]}]
    )
    np.testing.assert_array_equal(inputs.ids["tags"][0], [4, 5, 6, 7])
    np.testing.assert_array_equal(inputs.ids["tags"][1], [3, 0, 1])
    np.testing.assert_allclose(inputs.dense[:, 0], [0.0, -1.0, 1.0])
    with pytest.raises(RequestError, match="null ids inside"):
        pre([{"a": 2.0, "u": 3, "tags": [4, None]}])
    with pytest.raises(RequestError, match=r"lacks features \['u'\]"):
        pre([{"a": 2.0, "tags": [4]}])
    with pytest.raises(RequestError, match="missing or null in 1 instances"):
        pre([{"a": 2.0, "u": 1, "tags": [4]}, {"a": 2.0, "tags": [4]}])


def test_raw_rows_without_the_label_are_scored_when_the_workflow_keeps_it() -> None:
    """#20 defect 5: the CLI's workflow keeps the label among its output columns; a serving row has none."""
    workflow = Workflow([Normalize(["a"]), Categorify(["u"])], output_columns=("label", "a", "u"))
    workflow.fit(pl.DataFrame({"label": [0, 1, 1], "a": [1.0, 3.0, 2.0], "u": ["x", "y", "x"]}))
    schema = Schema.build(["label"], dense=["a"], sparse={"u": workflow.cardinalities()["u"]})
    pre = RequestPreprocessor(Signature(1, ("u",)), schema, workflow)
    inputs = pre([{"a": 3.0, "u": "y"}, {"a": 1.0, "u": "x"}])
    np.testing.assert_allclose(inputs.dense[:, 0], [1.5**0.5, -(1.5**0.5)], rtol=1e-5)  # (x - 2) / std([1, 3, 2])
    labelled = pre([{"a": 3.0, "u": "y", "label": 1}, {"a": 1.0, "u": "x"}])  # a label, when sent, is ignored
    np.testing.assert_array_equal(labelled.dense, inputs.dense)
