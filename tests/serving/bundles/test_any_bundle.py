"""serving.load: every bundle kind by its manifest, as the server serves it; options of another kind, folders
that are no bundle, unknown kinds and newer formats refused in one line; the server loads through it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hugerec.data.schema import Schema
from hugerec.embedding.optimizers import Adam
from hugerec.index.vector_index import IndexConfig, IndexKind
from hugerec.models.gbm import FeatureMatrix, LightGBMConfig
from hugerec.models.mf import MatrixFactorization
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SASRecConfig
from hugerec.serving.bundles.any_bundle import BATCHING, SERVE_OPTIONS, bundle_kind_of, load, server_settings_read
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.pipeline_bundle import PipelineOptions, export_pipeline
from hugerec.serving.http.server import InferenceServer
from hugerec.serving.pipeline.declaration import declaration_from_dict
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.serving.pipeline.served_pipeline import ServedPipeline
from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.runtime.next_items_model import NextItemsModel
from hugerec.serving.runtime.served_model import ServedModel
from hugerec.training.gbm_fit import fit_trees
from hugerec.training.model_file import RawIds, save_model


@pytest.fixture(scope="module")
def bundles(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One bundle of each kind, each written by the project's own writers."""
    root = tmp_path_factory.mktemp("any")
    out = {"model": toy.bundle}
    pytest.importorskip("lightgbm")
    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(size=(400, 2)), rng.integers(0, 5, size=(400, 1))]).astype(np.float32)
    y = (x[:, 0] + (x[:, 2] == 1) > 0.3).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan  # missing values, as in real logs
    matrix = FeatureMatrix(x, y, ("d0", "d1", "c0"), 2)
    config = LightGBMConfig(num_trees=5, num_leaves=7, threads=1, early_stopping_rounds=None)
    trees, _ = fit_trees(config, matrix, matrix, out_dir=None, log_every=0)
    schema = Schema.build(["label"], ["d0", "d1"], {"c0": 5})
    save_model(root / "trees.txt", trees, config, schema=schema.to_dict())
    out["gbm"] = export(root / "trees.txt", root / "gbm", name="trees")

    torch.manual_seed(0)
    seq_config = SASRecConfig(max_len=4, dim=8, num_layers=1)
    sasrec = SASRec(seq_config.sequence_config(30), Adam(lr=0.01))
    counts = np.concatenate([[0], np.arange(30, 0, -1)]).astype(np.int64)
    save_model(root / "seq.pt", sasrec, seq_config, Adam(lr=0.01), ids=RawIds(np.arange(1000, 1030), counts))
    out["next_items"] = export(root / "seq.pt", root / "seq", name="seq", k=5)

    store = FeatureStore.in_memory({"user": ("age",), "item": ("price",)})
    store.write("user", np.arange(50), {"age": rng.integers(10, 70, 50)})
    store.write("item", np.arange(40), {"price": rng.random(40)})
    interactions = InteractionStore.from_pairs(rng.integers(0, 50, 300), rng.integers(0, 40, 300))
    declaration = declaration_from_dict(
        {"pipeline": {"name": "recs", "version": "1"}, "retrieve": {"sources": [{"kind": "ann", "k": 20}]}}, "test"
    )
    encoder = UserEncoder(MatrixFactorization(50, 40, 8))
    out["pipeline"] = export_pipeline(
        root / "recs", declaration, store, interactions, np.arange(40), encoder, IndexConfig(IndexKind.EXACT)
    )
    return out


def test_each_kind_loads_as_the_object_the_server_serves(toy: Any, bundles: dict[str, Path], tmp_path: Path) -> None:
    model = load(bundles["model"], ServeOptions(state_dir=str(tmp_path / "state")), version="7")
    try:
        assert isinstance(model, ServedModel) and (model.kind, model.name, model.version) == ("model", "toy", "7")
        batch = toy.batch(6, seed=3)
        logits = model.model.predict(model.preprocess(toy.instances(batch)))
        np.testing.assert_allclose(torch.sigmoid(torch.from_numpy(logits)).numpy(), toy.offline(batch), rtol=1e-5, atol=1e-6)
    finally:
        model.close()

    trees = load(bundles["gbm"], ServeOptions(verify=False), batching=BatchingConfig(max_batch_size=8), deadline_s=60)
    try:
        assert isinstance(trees, ServedModel) and (trees.kind, trees.name) == ("gbm", "trees")
        scores = trees.model.predict(trees.preprocess([{"d0": 1.0, "d1": 0.0, "c0": 1}, {"d0": -2.0, "d1": 0.0, "c0": 0}]))
        assert scores.shape == (2,) and scores[0] > scores[1]
    finally:
        trees.close()

    seq = load(bundles["next_items"], max_request_rows=4)
    assert isinstance(seq, NextItemsModel) and (seq.kind, seq.name, seq.max_rows()) == ("next_items", "seq", 4)
    top = seq.next_items(np.array([1000, 1001], np.int64), np.array([2], np.int64))
    assert top["items"].shape == (1, 5)

    recs = load(bundles["pipeline"], pipeline=PipelineOptions(seed=0), name="mine")
    try:
        assert isinstance(recs, ServedPipeline) and (recs.kind, recs.name, recs.version) == ("pipeline", "mine", "1")
        answer = recs.recommend({"user": 3, "k": 5})
        assert len(answer["items"]) == 5
    finally:
        recs.close()


@pytest.mark.parametrize(
    ("kind", "given", "message"),
    [
        ("model", {"pipeline": PipelineOptions()}, "a model bundle; pipeline applies to pipeline bundles only"),
        ("model", {"deadline_s": 5.0}, "a model bundle; deadline_s applies to gbm bundles only"),
        ("gbm", {"options": ServeOptions(redis_url="redis://x")}, "a gbm bundle; options.redis_url applies to model bundles only"),
        ("next_items", {"options": ServeOptions()}, "a next_items bundle; options applies to model and gbm bundles only"),
        ("next_items", {"batching": BatchingConfig()}, "a next_items bundle; batching applies to model and gbm bundles only"),
        ("pipeline", {"options": ServeOptions()}, "a pipeline bundle; options applies to model and gbm bundles only"),
        ("pipeline", {"max_request_rows": 8}, "a pipeline bundle; max_request_rows applies to model, gbm and next_items bundles only"),
    ],
)
def test_an_option_of_another_kind_is_refused(bundles: dict[str, Path], kind: str, given: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^load: {bundles[kind]} is {message}") as e:
        load(bundles[kind], **given)
    assert "\n" not in str(e.value)


def test_the_server_settings_each_kind_reads(bundles: dict[str, Path]) -> None:
    """What `hugerec serve` checks its flags against: a model bundle reads the ServeOptions and the batching, a GBM
    bundle the batching, a next-items bundle neither, a pipeline the ServeOptions only through its ranker (this
    one has none)."""
    assert server_settings_read(bundles["model"]) == ("model", {SERVE_OPTIONS, BATCHING})
    assert server_settings_read(bundles["gbm"]) == ("gbm", {BATCHING})
    assert server_settings_read(bundles["next_items"]) == ("next_items", set())
    assert server_settings_read(bundles["pipeline"]) == ("pipeline", set())
    assert "ranker" not in json.loads((bundles["pipeline"] / "manifest.json").read_text())["parts"]


def test_a_bad_option_value_is_refused_naming_it(bundles: dict[str, Path]) -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match=f"^load: max_request_rows must be an integer >= 1, got {bad!r}$"):
            load(bundles["next_items"], max_request_rows=bad)


def _manifest(folder: Path, manifest: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_what_is_not_a_loadable_bundle_is_refused_in_one_line(bundles: dict[str, Path], tmp_path: Path) -> None:
    newer_model = tmp_path / "newer_model"
    shutil.copytree(bundles["model"], newer_model, ignore=shutil.ignore_patterns("state"))
    manifest = json.loads((newer_model / "manifest.json").read_text())
    (newer_model / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2}))
    newer_pipeline = tmp_path / "newer_pipeline"
    shutil.copytree(bundles["pipeline"], newer_pipeline)
    manifest = json.loads((newer_pipeline / "manifest.json").read_text())
    (newer_pipeline / "manifest.json").write_text(json.dumps({**manifest, "format": 2}))
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    cases = {
        tmp_path / "missing": "is not a folder",
        tmp_path / "a_file": "is not a folder",
        tmp_path / "empty": "is not a bundle: it has no manifest.json",
        tmp_path / "broken": "is not valid JSON",
        _manifest(tmp_path / "list", [1, 2]): "must hold a JSON object, got list",
        _manifest(tmp_path / "unknown", {"kind": "rules", "format": 1}): "declares kind 'rules'; this hugerec loads model, gbm, next_items and pipeline bundles",
        _manifest(tmp_path / "other", {"format": "parquet"}): "declares no bundle kind",
        _manifest(tmp_path / "delta", {"format": "hugerec-version-delta"}): "is a version delta, not a bundle",
        newer_model: "a model bundle of format 2, newer than this hugerec reads (1); upgrade hugerec",
        newer_pipeline: "a pipeline bundle of format 2, newer than this hugerec reads (1); upgrade hugerec",
        _manifest(tmp_path / "odd", {"kind": "gbm", "format": "one"}): "a gbm bundle of format 'one'; this hugerec reads format 1",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError) as e:
            load(path)
        text = str(e.value)
        assert text.startswith("load: ") and str(path) in text and message in text and "\n" not in text, (path, text)
    assert bundle_kind_of(bundles["gbm"]) == "gbm"  # the manifest's kind, whatever the folder is called


def test_the_server_loads_through_the_same_path(toy: Any, bundles: dict[str, Path], tmp_path: Path) -> None:
    """InferenceServer.add_bundle (hugerec serve, the admin load route) goes through serving.load's path: the same
    refusals, and the same served objects, registered with the server's metrics."""
    server = InferenceServer(options=ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        with pytest.raises(ValueError, match="declares kind 'rules'"):
            server.add_bundle(_manifest(tmp_path / "unknown", {"kind": "rules", "format": 1}))
        served = {kind: server.add_bundle(path) for kind, path in bundles.items()}
        assert {kind: s.kind for kind, s in served.items()} == {k: k for k in bundles}
        assert isinstance(served["model"], ServedModel) and served["model"].info["watchers"] == []
        assert sorted(server.models) == ["recs", "seq", "toy", "trees"]
    finally:
        server.close()
