"""export: what a bundle holds, and the errors a bad export gets."""

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
from hugerec.embedding.optimizers import SGD, Adam, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Missing, Pooling, TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.models.mf import MFConfig
from hugerec.models.model_config import DLRMConfig
from hugerec.models.registry import build_model
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.model_bundle import ONNX, Bundle
from hugerec.serving.runtime.inference_protocol import Signature, to_model_inputs
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.training.checkpoint import load_checkpoint, save_checkpoint
from hugerec.training.model_file import RawIds, save_model


def test_export_refuses_to_overwrite_and_checks_the_schema(toy: Any, tmp_path: Path) -> None:
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export(toy.model, toy.bundle)
    wrong = Schema(
        (Column("label", ColumnKind.LABEL), Column("x", ColumnKind.DENSE), Column("user", ColumnKind.SPARSE))
    )
    with pytest.raises(ValueError, match="does not match the model"):
        export(toy.model, tmp_path / "b", schema=wrong)
    assert not (tmp_path / "b").exists() and not list(tmp_path.iterdir())  # nothing half-written is left


def test_sequence_features_are_refused(tmp_path: Path) -> None:
    class WithSequence(DLRM):
        pass

    tables = [TableConfig("a", 10, 4), TableConfig("s", 10, 4, pooling=Pooling.NONE)]
    model = WithSequence(EmbeddingCollection(tables), 2, [4], [4, 1])
    with pytest.raises(ValueError, match="sequence features"):
        export(model, tmp_path / "b")


def test_a_checkpoint_loaded_into_a_model_exports_the_trained_weights(toy: Any, tmp_path: Path) -> None:
    trained = copy.deepcopy(toy.model)
    with torch.no_grad():
        trained.sparse_arch.table_weight("user").mul_(3.0)
        for p in trained.dense_parameters():
            p.add_(0.25)
    path = save_checkpoint(tmp_path / "ckpt", 7, trained)  # the format one process and W ranks write alike
    fresh = copy.deepcopy(toy.model)
    load_checkpoint(path, fresh)  # into this unsharded model, whatever the layout that wrote it
    bundle = export(fresh, tmp_path / "bundle", version="7")
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


def test_optional_onnx_export(toy: Any, tmp_path: Path) -> None:
    bundle = export(toy.model, tmp_path / "bundle", onnx=True)
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
    bundle = export(model, tmp_path / "bundle")
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


def test_a_ranking_model_file_exports_as_its_model(tmp_path: Path) -> None:
    """export(model file) reads the family from the file: a ranking file gives the model bundle, with the
    schema the file holds."""
    schema = Schema.build(dense=["d0", "d1"], sparse={"user": 50, "item": 30})
    config, optimizer = DLRMConfig(bottom=(8, 4), top=(8, 1)), RowWiseAdagrad(lr=0.1)
    tables = schema.table_configs(dim=4)
    model = build_model(config, tables, 2, optimizer)
    path = save_model(tmp_path / "model.pt", model, config, optimizer, tables=tables, schema=schema.to_dict())
    bundle = Bundle.open(export(path, tmp_path / "bundle", version="3"))
    assert bundle.manifest.version == "3" and bundle.manifest.name == "model"
    with pytest.raises(ValueError, match="holds its own data schema"):
        export(path, tmp_path / "b2", schema=schema)


def test_a_retrieval_model_file_is_refused_naming_the_pipeline(tmp_path: Path) -> None:
    config = MFConfig(dim=8, loss="bpr")
    model = build_model(config, optimizer=Adam(lr=0.01), num_users=3, num_items=4)
    ids = RawIds(np.arange(4) + 7, np.ones(4, dtype=np.int64), np.arange(3) + 100, (np.arange(4, dtype=np.int64), np.arange(3) % 4))
    path = save_model(tmp_path / "mf.pt", model, config, Adam(lr=0.01), ids=ids)
    with pytest.raises(ValueError, match=r"retrieval model; its vectors are served by a pipeline bundle"):
        export(path, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()


def test_a_file_that_is_no_model_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "x.pt").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"x\.pt"):
        export(tmp_path / "x.pt", tmp_path / "bundle")
