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
from hugerec.serving.pipeline.declaration import PipelineDeclaration, declaration_from_dict
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
        PipelineOptions(**kwargs)


# -- event times in the bundle's interaction store ------------------------------------------------------------
def _timed_hstu(tmp_path: Path, head: bool = True) -> Path:
    """A next-items bundle of an HSTU trained with model.times = true over ITEMS (time biases not zero); head:
    its config says the ranking head was trained (model.ranking_weight 1; else 0, as every HSTU before the key)."""
    from hugerec.embedding.optimizers import Adam
    from hugerec.models.hstu import HSTU, HSTUConfig
    from hugerec.serving.bundles.next_items_bundle import write_next_items_bundle
    from hugerec.training.model_file import RawIds, save_model

    torch.manual_seed(5)
    config = HSTUConfig(max_len=6, dim=8, num_layers=1, num_heads=2, times=True, ranking_weight=1.0 if head else 0.0)
    model = HSTU(config.sequence_config(len(ITEMS)))
    with torch.no_grad():
        for layer in model.blocks:
            layer.time_bias.normal_(0.0, 2.0)
    save_model(tmp_path / "hstu.pt", model, config, Adam(lr=0.01), ids=RawIds(ITEMS, np.r_[0, np.ones(len(ITEMS), np.int64)]))
    return write_next_items_bundle(tmp_path / "hstu.pt", tmp_path / "hstu", name="hstu")


def _sequential_declaration(score: bool) -> PipelineDeclaration:
    spec: dict[str, object] = {"pipeline": {"name": "timed", "version": "1"}, "retrieve": {"sources": [{"kind": "sequential", "k": 8}]}}
    if score:
        spec = {"pipeline": {"name": "timed", "version": "1"}, "retrieve": {"sources": [{"kind": "popular", "k": 15}]}, "score": {"sequential": True}}
    return declaration_from_dict(spec, "test")


SEEN_USERS, SEEN_ITEMS = np.array([1, 1, 2, 1, 2]), np.array([101, 105, 110, 103, 111])
SEEN_TIMES = np.array([1_000, 90_000, 95_000, 3_000_000, 3_000_001])


def test_a_timed_model_reads_the_bundles_stored_times(tmp_path: Path) -> None:
    """The store's times are written into the bundle and read back for a pipeline whose HSTU reads them: the
    answer is the next-items bundle's for the stored history and its times."""
    from hugerec.serving.bundles.next_items_bundle import load_next_items

    seq = _timed_hstu(tmp_path)
    seen = InteractionStore.from_pairs(SEEN_USERS, SEEN_ITEMS, times=SEEN_TIMES)
    path = export_pipeline(tmp_path / "pipe", _sequential_declaration(False), _features(), seen, ITEMS, sequential_bundle=seq)
    with np.load(path / "interactions.npz") as saved:
        assert saved["times"].tolist() == [1_000, 90_000, 3_000_000, 95_000, 3_000_001]  # user 1's, then user 2's
    loaded = load_pipeline(path)
    try:
        assert loaded.pipeline.needs_times and loaded.pipeline.res.interactions.timed
        want = load_next_items(seq).next_items(np.array([101, 105, 103]), np.array([3]), 8, np.array([1_000, 90_000, 3_000_000]))
        assert loaded.pipeline.recommend(Query(1, 8)).items.tolist() == want["items"][0].tolist()
    finally:
        loaded.close()


@pytest.mark.parametrize("score", [False, True])
def test_a_timed_model_beside_a_store_without_times_is_refused_naming_the_stage_and_the_bundle(tmp_path: Path, score: bool) -> None:
    """At export (which loads the bundle back) and at load (a bundle whose interactions.npz has no times, the file
    of a store before times existed): one line naming the stage and the next-items bundle."""
    seq = _timed_hstu(tmp_path)
    stage = "Score with sequential = 'ranking_head'" if score else "source 'sequential'"
    message = f"^Pipeline: {stage} uses next-items bundle 'hstu', an HSTU trained with model.times = true, but the interaction store keeps no event times"
    seen = InteractionStore.from_pairs(SEEN_USERS, SEEN_ITEMS)
    with pytest.raises(ValueError, match=message):
        export_pipeline(tmp_path / "pipe", _sequential_declaration(score), _features(), seen, ITEMS, sequential_bundle=seq)
    assert not (tmp_path / "pipe").exists()  # nothing written
    timed = InteractionStore.from_pairs(SEEN_USERS, SEEN_ITEMS, times=SEEN_TIMES)
    path = export_pipeline(tmp_path / "pipe", _sequential_declaration(score), _features(), timed, ITEMS, sequential_bundle=seq)
    seen.save(path / "interactions.npz")  # the store without times, as written before they existed
    with pytest.raises(ValueError, match=message):
        load_pipeline(path, PipelineOptions(verify=False))


def test_a_pipeline_without_a_timed_model_serves_as_before_times_existed(tmp_path: Path) -> None:
    """Across the change: a bundle whose store keeps no times (the file layout before them: users, offsets,
    items) and the same bundle with times in the file answer the same, bit for bit, and neither store keeps
    times when no model reads them."""
    declaration = declaration_from_dict({"pipeline": {"name": "shop", "version": "1"}, "retrieve": {"sources": [{"kind": "popular", "k": 12}]}}, "test")
    old = export_pipeline(tmp_path / "old", declaration, _features(), InteractionStore.from_pairs(SEEN_USERS, SEEN_ITEMS), ITEMS[::-1].copy())
    new = export_pipeline(tmp_path / "new", declaration, _features(), InteractionStore.from_pairs(SEEN_USERS, SEEN_ITEMS, times=SEEN_TIMES), ITEMS[::-1].copy())
    with np.load(old / "interactions.npz") as saved:
        assert sorted(saved.files) == ["items", "offsets", "users"]
    a, b = load_pipeline(old), load_pipeline(new)
    try:
        assert not a.pipeline.res.interactions.timed and not b.pipeline.res.interactions.timed
        for user in (1, 2, 3):
            ra, rb = a.pipeline.recommend(Query(user, 10)), b.pipeline.recommend(Query(user, 10))
            assert ra.items.tobytes() == rb.items.tobytes() and ra.scores.tobytes() == rb.scores.tobytes()
    finally:
        a.close()
        b.close()


def test_a_score_stage_over_an_untrained_ranking_head_is_refused_at_export_and_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A next-items bundle whose HSTU was trained with model.ranking_weight = 0 (or before the key: its manifest
    has no "ranking_head", the same) serves the sequential source, but a Score stage over it is refused when
    the pipeline is exported and when an old pipeline bundle holding one is loaded, in one line naming the
    stage, the bundle and the key."""
    from hugerec.serving.runtime.next_items_model import NextItemsModel

    seq = _timed_hstu(tmp_path, head=False)
    assert "ranking_head" not in json.loads((seq / MANIFEST).read_text())
    timed = InteractionStore.from_pairs(SEEN_USERS, SEEN_ITEMS, times=SEEN_TIMES)
    message = (r"^Pipeline: Score with sequential = 'ranking_head' uses next-items bundle 'hstu', an HSTU whose ranking head was never trained; "
               r"train it with model.ranking_weight > 0")
    with pytest.raises(ValueError, match=message):
        export_pipeline(tmp_path / "pipe", _sequential_declaration(True), _features(), timed, ITEMS, sequential_bundle=seq)
    assert not (tmp_path / "pipe").exists()
    source_only = export_pipeline(tmp_path / "source", _sequential_declaration(False), _features(), timed, ITEMS, sequential_bundle=seq)
    load_pipeline(source_only).close()  # the next items of any HSTU
    monkeypatch.setattr(NextItemsModel, "ranking_head_trained", property(lambda self: True))  # an export from before the check
    old = export_pipeline(tmp_path / "old", _sequential_declaration(True), _features(), timed, ITEMS, sequential_bundle=seq)
    monkeypatch.undo()
    with pytest.raises(ValueError, match=message):
        load_pipeline(old)
