"""Export: a trained RecModel (or a training checkpoint) -> a serving bundle (layout in model_bundle.py).

    model.embed(sparse)          -> the embedding rows go to embeddings/ (RocksDB, key -> row)
    model.dense_forward(dense, pooled...) -> dense.pt2 (torch.export; batch size dynamic)

Static tables export every row under its row id as the key; dynamic tables every key that holds a
row (and their shared unknown row, as the table's default). Writing goes to a temporary
directory that is renamed into place at the end, so a crash never leaves a half bundle under
the final name.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.delta import collect_delta
from hugerec.models.gbm import GBMConfig, is_ranking, library_of
from hugerec.models.model import RecModel
from hugerec.models.registry import Family
from hugerec.models.vector_features import VectorArch
from hugerec.serving.bundles.bundle_files import MANIFEST, checksums, staged_folder
from hugerec.serving.bundles.gbm_bundle import write_gbm_bundle
from hugerec.serving.bundles.model_bundle import EMBEDDINGS, ONNX, PROGRAM, PROGRAM_PREFIX, SCHEMA, WORKFLOW, Manifest
from hugerec.serving.bundles.next_items_bundle import write_next_items_bundle
from hugerec.serving.runtime.inference_model import CollectionLayout
from hugerec.serving.store.parameter_server import TableSpec
from hugerec.serving.store.persistent import PersistentStore
from hugerec.sparse.features import SparseFeatures
from hugerec.training.model_file import load_model

log = logging.getLogger(__name__)

EXPORT_CHUNK_ROWS = 1 << 16


class DenseProgram(nn.Module):
    """The dense part of `model` as a module of tensors only: (dense, pooled_1, ...) -> logits."""

    def __init__(self, model: RecModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, *pooled: torch.Tensor) -> torch.Tensor:
        return self.model.dense_forward(dense, tuple(pooled))


def collections_in_embed_order(model: RecModel) -> list[EmbeddingCollection]:
    """The collections whose outputs `model.embed` returns, in that order (found by running it once)."""
    collections = model.embedding_collections()
    if not collections:
        raise ValueError(f"export: {type(model).__name__} has no EmbeddingCollection")
    sequence = [f for c in collections for f in c.sequence_feature_names]
    if sequence:
        raise ValueError(f"export: sequence features {sequence} (pooling NONE) cannot be served yet")
    features = list(dict.fromkeys(f for c in collections for f in c.feature_names))
    sparse = SparseFeatures.from_lists({f: [[0], [0]] for f in features})  # B = 2, id 0 exists in every table
    outputs: dict[int, torch.Tensor] = {}
    hooks = [
        c.register_forward_hook(lambda m, args, out, i=i: outputs.__setitem__(i, out.values))
        for i, c in enumerate(collections)
    ]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            embedded = model.embed(sparse)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    order = []
    for k, tensor in enumerate(embedded):
        match = [i for i, out in outputs.items() if out is tensor]
        if len(match) != 1:
            raise ValueError(
                f"export: output {k} of {type(model).__name__}.embed is not the pooled output of one of its "
                "EmbeddingCollections; serving needs embed() to return the collections' outputs unchanged"
            )
        order.append(collections[match[0]])
    return order


def write_model_bundle(
    model: RecModel,
    out: str | Path,
    *,
    name: str = "model",
    version: str = "1",
    schema: Schema | None = None,
    workflow: Workflow | None = None,
    onnx: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write the serving bundle of `model` to `out`; returns its path.

    schema    the schema of the model's inputs (the workflow's output); enables named dense columns
    workflow  the fitted preprocessing workflow; /predict then takes raw rows
    onnx      also write dense.onnx (needs the `onnx` package; skipped with a warning without it)
    """
    threads = torch.get_num_threads()
    try:
        return _write_model_bundle(model, Path(out), name, version, schema, workflow, onnx, overwrite)
    finally:
        # the collections' Numba kernels (run once to find the output order) and torch.export both
        # change the process's intra-op thread count; a serving process sized its own
        torch.set_num_threads(threads)


def _write_model_bundle(
    model: RecModel,
    target: Path,
    name: str,
    version: str,
    schema: Schema | None,
    workflow: Workflow | None,
    onnx: bool,
    overwrite: bool,
) -> Path:
    if target.exists() and not overwrite:
        raise FileExistsError(f"export: {target} exists (pass overwrite=True to replace it)")
    if workflow is not None and schema is None:
        raise ValueError("export: a workflow needs the schema of its output (schema=...)")
    collections = collections_in_embed_order(model)
    layouts = [CollectionLayout(c.tables, c.feature_names) for c in collections]
    if schema is not None:
        missing = [f for c in collections for f in c.feature_names if f not in schema.sparse_names]
        if missing or len(schema.dense_names) != model.num_dense:
            raise ValueError(
                f"export: the schema (dense {list(schema.dense_names)}, sparse {list(schema.sparse_names)}) "
                f"does not match the model ({model.num_dense} dense features; sparse features missing: {missing})"
            )
    names = [t.name for c in collections for t in c.tables]
    if len(set(names)) != len(names):
        raise ValueError(f"export: table names must be unique across collections, got {names}")
    with staged_folder(target) as tmp:
        program = DenseProgram(model)
        info: dict[str, Any] = {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "model": type(model).__name__,
            "torch": torch.__version__,
        }
        info["vectors"] = [
            {"name": f.name, "table": f.table, "feature": f.feature, "dim": f.dim, "normalize": f.normalize}
            for arch in model.modules()
            if isinstance(arch, VectorArch)
            for f in arch.features
        ]  # vector features a request may send inline (hugerec.serving.inference_model.VectorInput)
        program_keys = _export_program(program, model, collections, tmp, onnx, info)
        model_keys = set(model.state_dict())
        dense_keys = tuple(k[len(PROGRAM_PREFIX) :] for k in program_keys if k[len(PROGRAM_PREFIX) :] in model_keys)
        info["rows"], defaults = _export_rows(collections, tmp / EMBEDDINGS)
        if schema is not None:
            schema.save(tmp / SCHEMA)
        if workflow is not None:
            workflow.save(tmp / WORKFLOW)
        specs = [
            TableSpec(
                t.name,
                t.dim,
                None if t.name not in defaults else tuple(float(x) for x in defaults[t.name]),
                t.num_rows if t.dynamic is None else None,  # dynamic tables: raw keys, num_rows is a capacity
            )
            for c in collections
            for t in c.tables
        ]
        manifest = Manifest(
            name, version, model.num_dense, tuple(layouts), tuple(specs), dense_keys, checksums(tmp), info
        )
        (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2))
    return target


def export(
    model: RecModel | str | Path,
    out: str | Path,
    *,
    name: str | None = None,
    version: str = "1",
    schema: Schema | None = None,
    workflow: Workflow | None = None,
    onnx: bool = False,
    k: int = 10,
    exclude_seen: bool = True,
    overwrite: bool = False,
) -> Path:
    """Write the bundle that serves `model` to `out`; returns its path. The one export of every family.

    model         a ranking model in memory (`RecModel`), or a model file `hugerec.training.save_model`
                  wrote; a file's family (the registry's) picks the bundle:
                    ranking     the model bundle (dense program, embedding rows, schema; + workflow)
                    trees       the GBM bundle (the library's file, schema, objective; + workflow)
                    sequential  the next-items bundle (top `k`, seen items left out when `exclude_seen`)
                    retrieval   refused: its user and item vectors are served by a pipeline bundle
                                (`hugerec pipeline build`)
    name          the served name (default: "model", or the model type of a sequential model file)
    schema        a model in memory: the schema of its inputs (a model file holds its own)
    workflow      the fitted preprocessing workflow; /predict then takes raw rows (ranking, trees)
    onnx          also write dense.onnx (ranking; needs the `onnx` package, skipped with a warning without it)

    A model of a checkpoint: `hugerec.training.load_checkpoint(checkpoint, model)`, then `export(model, ...)`.
    """
    if isinstance(model, RecModel):
        return write_model_bundle(
            model, out, name=name or "model", version=version, schema=schema, workflow=workflow, onnx=onnx, overwrite=overwrite
        )
    path = Path(model)
    saved = load_model(path)  # one line naming the file when it is not a model file
    saved_schema = Schema.from_dict(saved.schema) if saved.schema is not None else None
    if schema is not None:
        raise ValueError(f"export: {path} holds its own data schema; pass schema only with a model in memory")
    match saved.family:
        case Family.RANKING:
            assert isinstance(saved.model, RecModel)  # load_model built a ranking model
            return write_model_bundle(
                saved.model,
                out,
                name=name or "model",
                version=version,
                schema=saved_schema,
                workflow=workflow,
                onnx=onnx,
                overwrite=overwrite,
            )
        case Family.TREES:
            assert isinstance(saved.config, GBMConfig)  # the family of a GBM config
            if saved_schema is None:
                raise ValueError(f"export: {path} holds no data schema (save_model(..., schema=...) writes one)")
            info = {"objective": saved.config.objective, **({"group": saved.config.group} if is_ranking(saved.config) else {})}
            return write_gbm_bundle(
                path, library_of(saved.config), out, saved_schema, workflow, name or "model", version, info, overwrite
            )
        case Family.SEQUENTIAL:
            if Path(out).exists() and not overwrite:
                raise FileExistsError(f"export: {out} exists (pass overwrite=True to replace it)")
            return write_next_items_bundle(path, out, name or saved.model_type, version, min(k, saved.num_items), exclude_seen)
        case Family.RETRIEVAL:
            raise ValueError(
                f"export: {path} holds a {saved.model_type!r} retrieval model; its vectors are served by a pipeline "
                "bundle (`hugerec pipeline build`), not a bundle of their own"
            )



def _example(model: RecModel, collections: Sequence[EmbeddingCollection], b: int = 2) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    dense = torch.randn(b, model.num_dense, generator=gen)
    return (dense, *(torch.randn(b, c.output_dim, generator=gen) for c in collections))


def _export_program(
    program: DenseProgram,
    model: RecModel,
    collections: Sequence[EmbeddingCollection],
    out: Path,
    onnx: bool,
    info: dict[str, Any],
) -> list[str]:
    """Write dense.pt2 (and dense.onnx); returns the program's state-dict keys."""
    was_training = model.training
    program.eval()  # dropout off, batch-norm statistics frozen: the inference graph
    try:
        example = _example(model, collections)
        batch = torch.export.Dim("batch", min=1, max=1 << 24)
        shapes = ({0: batch}, tuple({0: batch} for _ in collections))
        try:
            exported = torch.export.export(program, example, dynamic_shapes=shapes)
        except Exception as e:  # torch.export raises many error types; say what failed
            raise ValueError(f"export: torch.export of {type(model).__name__}.dense_forward failed: {e}") from e
        module = exported.module()
        with torch.no_grad():
            expect = program(*example)
            got = module(*example)
        if not torch.allclose(expect, got, rtol=1e-5, atol=1e-6):
            raise ValueError("export: the exported program disagrees with the model on an example batch")
        torch.export.save(exported, str(out / PROGRAM))
        info["onnx"] = _export_onnx(program, example, shapes, out / ONNX) if onnx else "not requested"
        return list(module.state_dict())
    finally:
        model.train(was_training)


def _export_onnx(program: DenseProgram, example: tuple[torch.Tensor, ...], shapes: Any, path: Path) -> str:
    try:
        import onnx  # noqa: F401  # only to know whether ONNX export can work
    except ImportError:
        log.warning("export: the onnx package is not installed; skipping dense.onnx")
        return "skipped: onnx is not installed"
    try:
        torch.onnx.export(program, example, str(path), dynamic_shapes=shapes, dynamo=True, verbose=False)
    except Exception as e:  # the ONNX exporter fails in many ways; the bundle works without it
        log.warning("export: ONNX export failed, skipping dense.onnx: %s", e)
        path.unlink(missing_ok=True)
        return f"skipped: {type(e).__name__}: {e}"
    return "dense.onnx"


def _export_rows(
    collections: Sequence[EmbeddingCollection], path: Path
) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Every row into RocksDB: static tables under their row ids, dynamic tables under their raw keys.

    Returns the rows written per table and the trained default row of each dynamic table whose
    missing keys share one (Missing.UNKNOWN_ROW).
    """
    dims = {t.name: t.dim for c in collections for t in c.tables}
    store = PersistentStore(path, dims)
    rows_written, defaults = {}, {}
    try:
        for c in collections:
            for delta in collect_delta(c, since=-1):  # dynamic tables: every key that holds a row
                for start in range(0, len(delta), EXPORT_CHUNK_ROWS):
                    end = start + EXPORT_CHUNK_ROWS
                    store.put(delta.table, delta.keys[start:end].numpy(), delta.vectors[start:end].numpy())
                rows_written[delta.table] = len(delta)
                if delta.unknown is not None:
                    defaults[delta.table] = delta.unknown.vector.numpy()
            for t in c.tables:
                if t.dynamic is not None:
                    continue
                weight = c.table_weight(t.name)  # [R, D] storage dtype
                for start in range(0, t.num_rows, EXPORT_CHUNK_ROWS):
                    rows = weight[start : start + EXPORT_CHUNK_ROWS].detach().float().cpu().numpy()
                    keys = np.arange(start, start + rows.shape[0], dtype=np.int64)
                    store.put(t.name, keys, rows)
                rows_written[t.name] = t.num_rows
    finally:
        store.close()
    return rows_written, defaults
