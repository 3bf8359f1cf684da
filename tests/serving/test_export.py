"""export_bundle / export_checkpoint: what a bundle holds, and the errors a bad export gets."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hugerec.data.schema import Column, ColumnKind, Schema
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.config import Pooling, TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundle import ONNX, Bundle
from hugerec.serving.export import export_bundle, export_checkpoint
from hugerec.serving.loader import ServeOptions, load_model
from hugerec.serving.protocol import Signature, to_model_inputs
from hugerec.training.checkpoint import save_checkpoint


def test_export_refuses_to_overwrite_and_checks_the_schema(toy: Any, tmp_path: Path) -> None:
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_bundle(toy.model, toy.bundle)
    wrong = Schema(
        (Column("label", ColumnKind.LABEL), Column("x", ColumnKind.DENSE), Column("user", ColumnKind.SPARSE))
    )
    with pytest.raises(ValueError, match="does not match the model"):
        export_bundle(toy.model, tmp_path / "b", schema=wrong)
    assert not (tmp_path / "b").exists() and not list(tmp_path.iterdir())  # nothing half-written is left


def test_sequence_features_are_refused(tmp_path: Path) -> None:
    class WithSequence(DLRM):
        pass

    tables = [TableConfig("a", 10, 4), TableConfig("s", 10, 4, pooling=Pooling.NONE)]
    model = WithSequence(EmbeddingCollection(tables), 2, [4], [4, 1])
    with pytest.raises(ValueError, match="sequence features"):
        export_bundle(model, tmp_path / "b")


def test_export_checkpoint_loads_the_trained_weights(toy: Any, tmp_path: Path) -> None:
    trained = copy.deepcopy(toy.model)
    with torch.no_grad():
        trained.sparse_arch.table_weight("user").mul_(3.0)
        for p in trained.dense_parameters():
            p.add_(0.25)
    path = save_checkpoint(tmp_path / "ckpt", 7, {"step": 7, "model": trained.state_dict()})
    fresh = copy.deepcopy(toy.model)
    bundle = export_checkpoint(path, fresh, tmp_path / "bundle", version="7")
    assert Bundle.open(bundle).manifest.version == "7"
    loaded = load_model(bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        batch = toy.batch(12, seed=4)
        logits = loaded.model.predict(to_model_inputs(toy.tensors(batch), Signature(4, toy.features)))
        np.testing.assert_allclose(
            torch.sigmoid(torch.from_numpy(logits)).numpy(), toy.offline(batch, trained), rtol=1e-5, atol=1e-6
        )
    finally:
        loaded.close()
    with pytest.raises(ValueError, match="no 'model' entry"):
        export_checkpoint(save_checkpoint(tmp_path / "other", 1, {"step": 1}), fresh, tmp_path / "b2")
    (tmp_path / "dir").mkdir()
    with pytest.raises(FileNotFoundError, match=r"\.metadata"):
        export_checkpoint(tmp_path / "dir", fresh, tmp_path / "b3")


def test_optional_onnx_export(toy: Any, tmp_path: Path) -> None:
    bundle = export_bundle(toy.model, tmp_path / "bundle", onnx=True)
    info = Bundle.open(bundle).manifest.info["onnx"]
    if importlib.util.find_spec("onnx") is None or importlib.util.find_spec("onnxscript") is None:
        assert info.startswith("skipped") and not (bundle / ONNX).exists()
        return
    assert info == ONNX and (bundle / ONNX).is_file()
    if importlib.util.find_spec("onnxruntime") is None:
        return
    import onnxruntime

    session = onnxruntime.InferenceSession(str(bundle / ONNX))
    dense = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    pooled = np.random.default_rng(1).standard_normal((5, 24)).astype(np.float32)
    names = [i.name for i in session.get_inputs()]
    (got,) = session.run(None, dict(zip(names, (dense, pooled), strict=True)))
    with torch.no_grad():
        expect = toy.model.dense_forward(torch.from_numpy(dense), (torch.from_numpy(pooled),)).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-5)
