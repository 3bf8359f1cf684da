"""The pipeline bundle: export writes features, seen items, popular items and (with an encoder) the retrieval
part, loads it back as a check, and the loaded pipeline recommends what the parts say (popular items minus the
seen ones; ANN neighbours of the user's vector); a changed file, a manifest naming a path outside the bundle, a
foreign format and a folder that is no bundle are refused naming them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.models.mf import MatrixFactorization
from hugerec.serving.bundles.bundle_files import MANIFEST
from hugerec.serving.bundles.pipeline_bundle import PipelineOptions, export_pipeline, is_pipeline_bundle, load_pipeline
from hugerec.serving.pipeline.declaration import declaration_from_dict
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.serving.pipeline.runner import Query

ITEMS = np.arange(100, 120, dtype=np.int64)  # raw item ids


def _features() -> FeatureStore:
    store = FeatureStore.in_memory({"item": ("available",), "user": ("age",)})
    store.write("item", ITEMS, {"available": (ITEMS % 4 != 0).astype(np.float32)})
    store.write("user", np.arange(5), {"age": np.full(5, 30.0)})  # users 0..4 are known: not a cold start
    return store


def _popular_bundle(tmp_path: Path) -> Path:
    declaration = declaration_from_dict(
        {
            "pipeline": {"name": "shop", "version": "3"},
            "retrieve": {"sources": [{"kind": "popular", "k": 10}]},
            "filter": {"exclude_seen": True, "keep": [{"column": "available", "op": "==", "value": 1}]},
        },
        "test",
    )
    seen = InteractionStore.from_pairs(np.array([7, 7]), np.array([118, 101]))
    return export_pipeline(tmp_path / "bundle", declaration, _features(), seen, popular=ITEMS[::-1].copy())


def test_export_then_load_recommends_from_the_parts(tmp_path: Path) -> None:
    path = _popular_bundle(tmp_path)
    assert is_pipeline_bundle(path) and not (path / ".check-state").exists()
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["parts"] == ["features"] and "popular.npy" in manifest["sha256"]
    loaded = load_pipeline(path)
    try:
        assert (loaded.name, loaded.version) == ("shop", "3")
        rec = loaded.pipeline.recommend(Query(7, 5))
        # the 10 most popular (119 down to 110), without the unavailable (116, 112) and the seen (118)
        assert rec.items.tolist() == [119, 117, 115, 114, 113]
        other = load_pipeline(path, name="shop-b", version="4")
        assert (other.name, other.version) == ("shop-b", "4")
        other.close()
    finally:
        loaded.close()


def test_a_retrieval_part_serves_the_users_neighbours(tmp_path: Path) -> None:
    torch.manual_seed(0)
    encoder = UserEncoder(MatrixFactorization(5, 20, 4), users_raw=np.arange(5), items_raw=ITEMS)
    declaration = declaration_from_dict(
        {"retrieve": {"sources": [{"kind": "ann", "k": 20}]}, "filter": {"exclude_seen": False}}, "test"
    )
    path = export_pipeline(tmp_path / "b", declaration, _features(), encoder=encoder)
    loaded = load_pipeline(path)
    try:
        rec = loaded.pipeline.recommend(Query(2, 3))
        assert not rec.cold_start and rec.sources == ("ann",) * 3
        user = encoder.encode(2, np.zeros(0, np.int64))
        assert user is not None
        scores = encoder.item_vectors() @ user
        assert rec.items.tolist() == ITEMS[np.argsort(-scores, kind="stable")][:3].tolist()  # exact index, no filter
    finally:
        loaded.close()


def test_a_changed_file_is_refused(tmp_path: Path) -> None:
    path = _popular_bundle(tmp_path)
    np.save(path / "popular.npy", np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"popular\.npy is missing or does not match its checksum in the manifest"):
        load_pipeline(path)
    load_pipeline(path, PipelineOptions(verify=False)).close()  # verification off: it loads


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": 2}, "has format 2, this hugerec reads 1"),
        ({"sha256": {}}, "lists no checksums"),
        ({"sha256": {"../outside": "0"}}, "names '../outside', outside the bundle"),
    ],
)
def test_a_damaged_manifest_is_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    path = _popular_bundle(tmp_path)
    manifest = json.loads((path / MANIFEST).read_text())
    (path / MANIFEST).write_text(json.dumps({**manifest, **change}))
    with pytest.raises(ValueError, match=message):
        load_pipeline(path)


def test_folders_that_are_not_pipeline_bundles(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"load_pipeline: {tmp_path} is not a pipeline bundle"):
        load_pipeline(tmp_path)
    (tmp_path / "mine.txt").write_text("keep me")
    declaration = declaration_from_dict({"retrieve": {"sources": [{"kind": "popular", "k": 1}]}}, "test")
    with pytest.raises(ValueError, match=f"export_pipeline: {tmp_path} exists and is not a pipeline bundle"):
        export_pipeline(tmp_path, declaration, _features())
    assert (tmp_path / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_interactions": 0}, "max_interactions must be an integer >= 1, got 0"),
        ({"feature_tier": "disk"}, "feature_tier must be 'memory', 'redis' or 'rocksdb', got 'disk'"),
        ({"feature_tier": "redis"}, "feature_tier 'redis' needs feature_location"),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PipelineOptions(**kwargs)  # type: ignore[arg-type]
