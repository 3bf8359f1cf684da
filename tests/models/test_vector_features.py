"""Vector features in models: the frozen rows, LayerNorm + projection, DLRM / DCN-v2, config, serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.embedding.optimizers import RowWiseAdagrad
from hugerec.embedding.table_config import TableConfig
from hugerec.models.model_config import DCNv2Config, DLRMConfig, build_ranking
from hugerec.models.registry import config_from_dict, config_to_dict
from hugerec.models.vector_features import VectorArch, VectorFeature
from hugerec.serving.bundles.any_bundle import load
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.export import export
from hugerec.serving.runtime.inference_protocol import Signature, to_model_inputs
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures

ITEMS, DIM, VDIM = 12, 4, 5


def _rows(seed: int = 0) -> np.ndarray:
    """[ITEMS, VDIM + 1]: vectors with the missing flag 0, except item 3 (no vector: zeros, flag 1)."""
    rng = np.random.default_rng(seed)
    rows = np.concatenate([rng.normal(size=(ITEMS, VDIM)), np.zeros((ITEMS, 1))], axis=1).astype(np.float32)
    rows[3] = 0.0
    rows[3, -1] = 1.0
    return rows


def _batch(b: int = 6, seed: int = 0) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    items = torch.randint(0, ITEMS, (b,), generator=gen).tolist()
    users = [[u] for u in torch.randint(0, 20, (b,), generator=gen).tolist()]
    sparse = SparseFeatures.from_lists({"user": users, "item": [[i] for i in items]})
    return Batch(torch.randn(b, 2, generator=gen), sparse, torch.randint(0, 2, (b,), generator=gen).float())


TABLES = [TableConfig("user", 20, DIM, features=("user",)), TableConfig("item", ITEMS, DIM, features=("item",))]
FEATURE = VectorFeature("text", feature="item", dim=VDIM)


def test_arch_matches_a_plain_torch_reference() -> None:
    """lookup gathers the loaded rows; forward = Linear(cat(LayerNorm(vector), flag)) per feature."""
    arch = VectorArch([FEATURE], {"item": ITEMS}, out_dim=3)
    rows = _rows()
    arch.load_rows("text", rows)
    batch = _batch()
    pooled = arch.lookup(batch.sparse)
    item_ids = batch.sparse["item"].values
    torch.testing.assert_close(pooled, torch.from_numpy(rows)[item_ids])
    (out,) = arch(pooled)
    norm, proj = arch.norms[0], arch.projections[0]
    vec = torch.from_numpy(rows)[item_ids]
    ln = torch.nn.functional.layer_norm(vec[:, :VDIM], (VDIM,), norm.weight, norm.bias)
    expected = torch.cat([ln, vec[:, VDIM:]], dim=1) @ proj.weight.T + proj.bias
    torch.testing.assert_close(out, expected)


def test_bad_rows_and_hotness_are_refused() -> None:
    arch = VectorArch([FEATURE], {"item": ITEMS}, out_dim=3)
    with pytest.raises(ValueError, match=r"rows of 'text' must be \[12, 6\], got \[12, 5\]"):
        arch.load_rows("text", np.zeros((ITEMS, VDIM), np.float32))
    with pytest.raises(ValueError, match="no vector feature 'nope'"):
        arch.load_rows("nope", _rows())
    two = SparseFeatures.from_lists({"item": [[1, 2], [3]]})
    with pytest.raises(ValueError, match="feature 'item' keys vector 'text' and must hold exactly one id"):
        arch.lookup(two)
    with pytest.raises(ValueError, match=r"id features \['nope'\] have no table"):
        VectorArch([VectorFeature("x", "nope", 2)], {"item": ITEMS}, 3)
    with pytest.raises(ValueError, match="normalize must be 'l2' or 'none'"):
        VectorFeature("x", "item", 2, normalize="l1")


@pytest.mark.parametrize(
    "config", [DLRMConfig(bottom=(8, DIM), top=(8, 1)), DCNv2Config(num_cross_layers=1, deep=(8,))]
)
def test_models_train_the_projection_and_keep_frozen_rows(config: DLRMConfig | DCNv2Config) -> None:
    """One step: the LayerNorm and projection get gradients, the frozen vector rows do not move, the
    id tables do; with trainable=True the rows move too."""
    import dataclasses

    for trainable in (False, True):
        cfg = dataclasses.replace(config, vectors=(dataclasses.replace(FEATURE, trainable=trainable),))
        model = build_ranking(cfg, TABLES, 2, RowWiseAdagrad(lr=0.5))
        arch = model.vector_arch
        assert arch is not None
        arch.load_rows("text", _rows())
        before = arch.collection.table_weight("vector_text").clone()
        items_before = model.sparse_arch.table_weight("item").clone()
        batch = _batch(16)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
        loss.backward()
        assert arch.projections[0].weight.grad is not None and arch.projections[0].weight.grad.abs().sum() > 0
        assert not torch.equal(model.sparse_arch.table_weight("item"), items_before)
        moved = not torch.equal(arch.collection.table_weight("vector_text"), before)
        assert moved == trainable


def test_config_round_trip_and_errors() -> None:
    cfg = DLRMConfig(bottom=(8, DIM), top=(8, 1), vectors=({"name": "text", "feature": "item", "dim": VDIM},))  # type: ignore[arg-type]
    assert cfg.vectors == (FEATURE,)
    again = config_from_dict(config_to_dict(cfg))
    assert again == cfg
    with pytest.raises(ValueError, match=r"vectors\[0\]: unknown keys \['size'\]"):
        DLRMConfig(vectors=({"name": "t", "feature": "item", "size": 3},))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="DLRM: the vector features project to 3, the embedding dim is 4"):
        from hugerec.embedding.collection import EmbeddingCollection
        from hugerec.models.dlrm import DLRM

        DLRM(EmbeddingCollection(TABLES), 2, [DIM], [1], vectors=VectorArch([FEATURE], {"item": ITEMS}, 3))


def test_served_bundle_equals_the_offline_model(tmp_path: Path) -> None:
    """The vector rows travel in the bundle like any table; the server's logits equal the model's."""
    cfg = DLRMConfig(bottom=(8, DIM), top=(8, 1), vectors=(FEATURE,))
    model = build_ranking(cfg, TABLES, 2, RowWiseAdagrad())
    assert model.vector_arch is not None
    model.vector_arch.load_rows("text", _rows())
    model.eval()
    bundle = export(model, tmp_path / "bundle")
    loaded = load(bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        batch = _batch(9, seed=3)
        tensors: dict[str, np.ndarray] = {"dense": batch.dense.numpy()}
        for f in ("user", "item"):
            tensors[f] = batch.sparse[f].values.numpy()
            tensors[f + ".lengths"] = batch.sparse[f].lengths.numpy().astype(np.int32)
        logits = loaded.model.predict(to_model_inputs(tensors, Signature(2, ("user", "item"))))
        with torch.no_grad():
            expected = model(batch).numpy()
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
    finally:
        loaded.close()


def test_inline_vectors_in_requests(tmp_path: Path) -> None:
    """A request's `vector.text` replaces the looked-up rows (normalised as the table's were); merged
    with a request without one, each keeps its own; a bad inline vector is a 400 naming the input."""
    import dataclasses

    from hugerec.serving.runtime.inference_protocol import RequestError
    from hugerec.serving.runtime.model_inputs import ModelInputs

    feature = dataclasses.replace(FEATURE, normalize="l2")
    model = build_ranking(DLRMConfig(bottom=(8, DIM), top=(8, 1), vectors=(feature,)), TABLES, 2, RowWiseAdagrad())
    assert model.vector_arch is not None
    rows = _rows()
    model.vector_arch.load_rows("text", rows)
    model.eval()
    loaded = load(export(model, tmp_path / "bundle"), ServeOptions(state_dir=str(tmp_path / "s")))
    try:
        signature = Signature(2, ("user", "item"), vectors=(("text", VDIM),))
        batch = _batch(5, seed=7)
        tensors: dict[str, np.ndarray] = {"dense": batch.dense.numpy()}
        for f in ("user", "item"):
            tensors[f] = batch.sparse[f].values.numpy()
            tensors[f + ".lengths"] = batch.sparse[f].lengths.numpy().astype(np.int32)
        inline = np.random.default_rng(3).normal(size=(5, VDIM)).astype(np.float32) * 4.0
        with_vectors = to_model_inputs({**tensors, "vector.text": inline}, signature)
        got = loaded.model.predict(with_vectors)
        # offline: the same model with those items' rows set to the L2-normalised inline vectors
        normalised = inline / np.linalg.norm(inline, axis=1, keepdims=True)
        expected = []
        for b in range(5):
            item = int(batch.sparse["item"].values[b])
            patched = rows.copy()
            patched[item] = [*normalised[b], 0.0]
            model.vector_arch.load_rows("text", patched)
            one = Batch(batch.dense[b : b + 1], _slice(batch.sparse, b), batch.labels[b : b + 1])
            with torch.no_grad():
                expected.append(float(model(one)[0]))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        plain = to_model_inputs(tensors, signature)
        merged = loaded.model.predict(ModelInputs.concat([with_vectors, plain]))
        np.testing.assert_allclose(merged[:5], got, rtol=1e-6)
        np.testing.assert_allclose(merged[5:], loaded.model.predict(plain), rtol=1e-6)
        bad = inline.copy()
        bad[2, 1] = np.nan
        with pytest.raises(RequestError, match=r"input 'vector.text' row 2 contains NaN"):
            to_model_inputs({**tensors, "vector.text": bad}, signature)
        with pytest.raises(RequestError, match=r"input 'vector.text' must have shape \[B, 5\], got \[5, 4\]"):
            to_model_inputs({**tensors, "vector.text": inline[:, :4]}, signature)
    finally:
        loaded.close()


def _slice(sparse: SparseFeatures, b: int) -> SparseFeatures:
    return SparseFeatures.from_lists({f: [sparse[f].to_lists()[b]] for f in sparse.keys})
