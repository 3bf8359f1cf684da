"""InferenceModel (PS lookups + pooling + exported program) == the trained model, for every model family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.models.dcn import DCNv2
from hugerec.models.deepfm import DeepFM
from hugerec.models.model import RecModel
from hugerec.models.wide import wide_tables
from hugerec.models.wide_deep import WideAndDeep
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.export import export
from hugerec.serving.runtime.inference_model import CollectionLayout
from hugerec.serving.runtime.inference_protocol import Signature, to_model_inputs
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


def inputs_of(tensors: dict[str, np.ndarray], num_dense: int, features: tuple[str, ...]) -> ModelInputs:
    return to_model_inputs(tensors, Signature(num_dense, features))


@pytest.mark.parametrize("b", [1, 7, 64])
def test_predictions_equal_the_trained_model(toy: Any, tmp_path: Path, b: int) -> None:
    loaded = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        batch = toy.batch(b, seed=b)
        logits = loaded.model.predict(inputs_of(toy.tensors(batch), 4, toy.features))
        np.testing.assert_allclose(
            torch.sigmoid(torch.from_numpy(logits)).numpy(), toy.offline(batch), rtol=1e-5, atol=1e-6
        )
        assert loaded.model.features == toy.features
    finally:
        loaded.close()


def _features(b: int, seed: int) -> SparseFeatures:
    gen = torch.Generator().manual_seed(seed)
    return SparseFeatures.from_lists(
        {
            f: [
                torch.randint(0, 50, (int(n),), generator=gen).tolist()
                for n in torch.randint(0, 3, (b,), generator=gen)
            ]
            for f in ("a", "b")
        }
    )


def _two_collection_models() -> list[RecModel]:
    torch.manual_seed(1)
    tables = [TableConfig("a", 50, 4), TableConfig("b", 50, 4, pooling=Pooling.MEAN)]
    return [
        WideAndDeep(EmbeddingCollection(tables), EmbeddingCollection(wide_tables(tables)), 3, deep=(8,)),
        DeepFM(EmbeddingCollection(tables), 3, deep=(8,), wide=EmbeddingCollection(wide_tables(tables))),
        DCNv2(EmbeddingCollection(tables), 3, num_cross_layers=2, deep=(8,)),
    ]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_every_model_family_exports_and_serves_exactly(tmp_path: Path, index: int) -> None:
    model = _two_collection_models()[index].eval()
    for t in model.embedding_collections()[-1:]:  # wide tables start at zero: make them matter
        for table in t.tables:
            t.table_weight(table.name).copy_(torch.randn(table.num_rows, table.dim))
    bundle = export(model, tmp_path / "bundle")
    loaded = load_bundle(bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        sparse = _features(9, index)
        dense = torch.randn(9, 3)
        with torch.no_grad():
            expect = model(Batch(dense, sparse, torch.zeros(9))).numpy()
        tensors: dict[str, np.ndarray] = {"dense": dense.numpy()}
        for f in ("a", "b"):
            tensors[f] = sparse[f].values.numpy()
            tensors[f + ".lengths"] = sparse[f].lengths.numpy()
        got = loaded.model.predict(inputs_of(tensors, 3, loaded.model.features))
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
        assert len(loaded.model.layouts) == len(model.embedding_collections())
    finally:
        loaded.close()


def test_dense_update_switches_weights_and_checks_them(toy: Any, tmp_path: Path) -> None:
    loaded = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        other = _perturbed_copy(toy.model)  # same rows, other dense weights
        loaded.model.update([], other.state_dict())
        batch = toy.batch(16, seed=3)
        got = loaded.model.predict(inputs_of(toy.tensors(batch), 4, toy.features))
        np.testing.assert_allclose(
            torch.sigmoid(torch.from_numpy(got)).numpy(), toy.offline(batch, other), rtol=1e-5, atol=1e-6
        )
        state = {k: v for k, v in other.state_dict().items() if not k.startswith("sparse_arch.")}
        key = next(iter(loaded.model.dense_keys))
        with pytest.raises(ValueError, match="lack"):
            loaded.model.update([], {k: v for k, v in state.items() if k != key})
        with pytest.raises(ValueError, match="needs"):
            loaded.model.update([], {**state, key: torch.zeros(3)})
        with pytest.raises(ValueError, match="NaN"):
            loaded.model.update([], {**state, key: torch.full_like(state[key], float("nan"))})
    finally:
        loaded.close()


def _perturbed_copy(model: RecModel) -> RecModel:
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.dense_parameters():
            p.add_(0.1 * torch.randn_like(p))
    return other


def test_collection_layout_validates() -> None:
    t = TableConfig("t", 10, 4, features=("f", "g"))
    with pytest.raises(ValueError, match="distinct features"):
        CollectionLayout((t,), ("f", "nope"))
    with pytest.raises(ValueError, match="sequence"):
        CollectionLayout((TableConfig("s", 10, 4, pooling=Pooling.NONE),), ("s",))
    layout = CollectionLayout((t,), ("g", "f"))
    assert CollectionLayout.from_dict(layout.to_dict()) == layout


def test_one_id_blocks_merge_and_score_like_per_feature_inputs(toy: Any, tmp_path: Path) -> None:
    """Requests carrying an [F, B] id block (one id per feature) give the same scores as the same ids
    given feature by feature, also merged with each other, with per-feature requests, and with
    blocks whose features come in another order."""
    loaded = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        model, rng = loaded.model, np.random.default_rng(0)
        parts, plain = [], []
        for k, b in enumerate((1, 3, 2, 5)):
            dense = rng.standard_normal((b, 4)).astype(np.float32)
            ids = rng.integers(0, 200, (3, b))  # within every table
            order = toy.features if k % 2 == 0 else toy.features[::-1]
            block = ids if k % 2 == 0 else ids[::-1].copy()
            parts.append(ModelInputs.from_one_id(dense, order, block))
            plain.append(inputs_of({"dense": dense, **dict(zip(toy.features, ids, strict=True))}, 4, toy.features))
        want = np.concatenate([model.predict(p) for p in plain])
        for part, expected in zip(parts, plain, strict=True):
            np.testing.assert_allclose(model.predict(part), model.predict(expected), rtol=1e-6, atol=1e-7)
        same_order = ModelInputs.concat([parts[0], parts[2]])
        assert same_order.one_id is not None and same_order.one_id.shape == (3, 3)
        np.testing.assert_allclose(
            model.predict(same_order), np.concatenate([want[:1], want[4:6]]), rtol=1e-6, atol=1e-7
        )
        for mixed in (ModelInputs.concat(parts), ModelInputs.concat([parts[0], plain[1], parts[2], plain[3]])):
            assert mixed.one_id is None  # orders or forms differ: merged feature by feature
            np.testing.assert_allclose(model.predict(mixed), want, rtol=1e-6, atol=1e-7)
        with pytest.raises(ValueError, match="int64 ids \\[3, 2\\]"):
            ModelInputs.from_one_id(np.zeros((2, 4), np.float32), toy.features, np.zeros((3, 3), np.int64))
    finally:
        loaded.close()
