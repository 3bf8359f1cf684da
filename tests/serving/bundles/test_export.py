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
from hugerec.embedding.optimizers import SGD
from hugerec.embedding.table_config import DynamicConfig, Missing, Pooling, TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.export import export_bundle, export_checkpoint
from hugerec.serving.bundles.model_bundle import ONNX, Bundle
from hugerec.serving.runtime.inference_protocol import Signature, to_model_inputs
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
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
    path = save_checkpoint(tmp_path / "ckpt", 7, trained)  # the format one process and W ranks write alike
    fresh = copy.deepcopy(toy.model)
    bundle = export_checkpoint(path, fresh, tmp_path / "bundle", version="7")
    assert Bundle.open(bundle).manifest.version == "7"
    loaded = load_bundle(bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        batch = toy.batch(12, seed=4)
        logits = loaded.model.predict(to_model_inputs(toy.tensors(batch), Signature(4, toy.features)))
        np.testing.assert_allclose(
            torch.sigmoid(torch.from_numpy(logits)).numpy(), toy.offline(batch, trained), rtol=1e-5, atol=1e-6
        )
    finally:
        loaded.close()
    (tmp_path / "dir").mkdir()
    with pytest.raises(FileNotFoundError, match=r"not a checkpoint \(no index\.json\)"):
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


@pytest.mark.parametrize("missing", [Missing.ZEROS, Missing.UNKNOWN_ROW])
def test_dynamic_tables_serve_their_raw_keys_and_default_row(tmp_path: Path, missing: Missing) -> None:
    torch.manual_seed(0)
    tables = [
        TableConfig("user", 64, 4, dynamic=DynamicConfig(missing=missing)),  # raw keys, capacity 64
        TableConfig("item", 30, 4),
    ]
    model = DLRM(EmbeddingCollection(tables, optimizer=SGD(lr=0.5)), 2, [4], [8, 1])
    opt = torch.optim.SGD(model.dense_parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    raw = torch.randint(-(2**40), 2**40, (40,), generator=gen)  # big and negative raw keys
    for _ in range(5):  # a few training steps: keys get rows, rows move away from their init
        users = raw[torch.randint(0, 40, (16,), generator=gen)]
        batch = Batch(
            torch.randn(16, 2, generator=gen),
            SparseFeatures.from_lists(
                {
                    "user": [[int(u)] for u in users],
                    "item": [[int(i)] for i in torch.randint(0, 30, (16,), generator=gen)],
                }
            ),
            torch.randint(0, 2, (16,), generator=gen).float(),
        )
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    bundle = export_bundle(model, tmp_path / "bundle")
    spec = next(t for t in Bundle.open(bundle).manifest.tables if t.name == "user")
    assert spec.num_rows is None and (spec.default is not None) == (missing is Missing.UNKNOWN_ROW)
    loaded = load_bundle(bundle, ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        users = [[int(raw[0])], [int(raw[1]), 123456789], [], [-5]]  # known, known + unseen, empty, unseen
        sparse = SparseFeatures.from_lists({"user": users, "item": [[1], [2], [3], [29]]})
        dense = torch.randn(4, 2)
        with torch.no_grad():
            expect = model(Batch(dense, sparse, torch.zeros(4))).numpy()
        tensors = {"dense": dense.numpy()}
        for f in ("user", "item"):
            tensors[f], tensors[f + ".lengths"] = sparse[f].values.numpy(), sparse[f].lengths.numpy()
        got = loaded.model.predict(to_model_inputs(tensors, Signature(2, ("user", "item"))))
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
    finally:
        loaded.close()
