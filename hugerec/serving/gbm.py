"""Serving gradient-boosted trees: the GBM bundle and GBMModel, a model version like InferenceModel.

    export_gbm_bundle("runs/gbm/model.txt", Library.LIGHTGBM, "runs/gbm/bundle", schema, workflow)
    server.add_bundle("runs/gbm/bundle")       # KServe v2 infer and /predict, batched, as for a deep model

A GBM bundle is a folder: manifest.json ({"kind": "gbm", "format": 1, name, version, library,
num_dense, features, files -> sha256, info}), the model in its library's own format (model.txt:
LightGBM text, model.json: XGBoost JSON; never a pickle), schema.json and the fitted workflow/
(when the data had one, so /predict takes raw rows). Export writes a temporary folder and renames
it into place; loading checks every checksum first.

GBMModel takes the same ModelInputs and answers the same `predict(inputs) -> logits [B]` as
InferenceModel (num_dense, features, vector_signature, device too), so the server's batcher, the
protocol and a pipeline's Score stage use either alike. The row of an example is its dense values,
then one id per sparse feature; an example without an id for a feature (lengths 0) and a NaN dense
value are missing values, which the trees route as trained (hugerec.serving.forest). More than one
id for a feature is refused (400) by the request signature. For a ranking model (lambdarank, rank:ndcg,
rank:pairwise) the logits are the raw ranking scores ("scores", their sigmoid, rank the same).

Scoring path (`GBMPredictor`): "forest" (default) parses the model into flat arrays once and scores
them with a Numba kernel, without the library's per-call overhead (500 trees, same run on the loaded
2-core VM: 3.7x LightGBM's predict at batch 1, 1.7x at 256; 46x and 1.3x XGBoost's inplace_predict;
benchmarks/serving.py --gbm-only); "library" calls the library's own predict (a reference for tests
and benchmarks: it loads the library in process, after the checks below; the server never uses it).

Loading never runs the library's parser in this process (gbm_file.py): our reader checks every tree
(forest_check.py), then the library loads the same bytes in a child process under a deadline and must
score probe rows as the forest does; a crash, hang or disagreement is a refused load (ValueError).
"""

from __future__ import annotations

import datetime
import enum
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.models.gbm import Library, TreeModel
from hugerec.serving.bundle import (
    MANIFEST,
    SCHEMA,
    WORKFLOW,
    _inside,
    bundle_kind,
    checksums,
    sha256_file,
    staged_folder,
)
from hugerec.serving.forest import Forest
from hugerec.serving.gbm_file import read_gbm_file
from hugerec.serving.inference_model import ModelInputs
from hugerec.serving.isolated_load import DEFAULT_LOAD_DEADLINE_S
from hugerec.serving.preprocess import RequestPreprocessor
from hugerec.serving.protocol import Signature

KIND = "gbm"
FORMAT = 1


class GBMPredictor(enum.Enum):
    FOREST = "forest"  # flat arrays + one Numba kernel (hugerec.serving.forest)
    LIBRARY = "library"  # the library's own predict


def is_gbm_bundle(path: str | Path) -> bool:
    """True when `path` holds a GBM bundle (its manifest says kind "gbm")."""
    return bundle_kind(path) == KIND


def export_gbm_bundle(
    model_path: str | Path,
    library: Library,
    out: str | Path,
    schema: Schema,
    workflow: Workflow | None = None,
    name: str = "model",
    version: str = "1",
    info: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """A trained model file (`TreeModel.save`) + its data schema (+ workflow) -> a GBM bundle at `out`."""
    tree = TreeModel.load(model_path, library)
    names = (*schema.dense_names, *schema.sparse_names)
    if tree.feature_names != names:
        raise ValueError(
            f"{model_path}: the model's features {list(tree.feature_names)} are not the schema's {list(names)}"
        )
    target = Path(out)
    if target.exists() and not overwrite:
        raise FileExistsError(f"export_gbm_bundle: {target} exists (pass overwrite=True to replace it)")
    with staged_folder(target) as tmp:
        shutil.copyfile(model_path, tmp / library.model_file)
        schema.save(tmp / SCHEMA)
        if workflow is not None:
            workflow.save(tmp / WORKFLOW)
        manifest = {
            "kind": KIND,
            "format": FORMAT,
            "name": name,
            "version": version,
            "library": library.value,
            "num_dense": len(schema.dense_names),
            "features": list(schema.sparse_names),
            "files": checksums(tmp),
            "info": {
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "num_trees": tree.num_trees,
                f"{library.value}_version": str(__import__(library.value).__version__),
                **dict(info or {}),
            },
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return target


class GBMModel:
    """Scores ModelInputs with a forest: logits [B] float32 (the interface of InferenceModel).

    forest: the checked flat trees (gbm_file.read_gbm_file), what predict scores; tree: the library's
    booster, scored instead when given (GBMPredictor.LIBRARY)."""

    vector_signature: tuple[tuple[str, int], ...] = ()

    def __init__(
        self, forest: Forest, library: Library, num_dense: int, features: tuple[str, ...], tree: TreeModel | None = None
    ) -> None:
        expected = forest.num_features
        if num_dense + len(features) != expected:
            raise ValueError(
                f"GBMModel: {num_dense} dense + {len(features)} sparse features, the trees read {expected} columns"
            )
        self.forest = forest
        self.tree = tree
        self.library = library
        self.num_dense = num_dense
        self.features = tuple(features)
        self.device = torch.device("cpu")
        self.predictor = GBMPredictor.FOREST if tree is None else GBMPredictor.LIBRARY

    def signature(self, max_rows: int) -> Signature:
        """What a request may send: NaN dense values and empty bags are missing values; one id at most."""
        return Signature(self.num_dense, self.features, max_rows, missing_values=True, max_ids=1)

    def columns(self, inputs: ModelInputs) -> np.ndarray:
        """inputs -> feature-major rows xt [num_dense + F, B] float32 (the forest kernel's layout): the dense
        values, then each feature's id (NaN: none)."""
        b, d = inputs.batch_size, self.num_dense
        xt = np.empty((d + len(self.features), b), np.float32)
        xt[:d] = inputs.dense.T
        one_id = inputs.one_id
        if one_id is not None and tuple(inputs.ids) == self.features:
            xt[d:] = one_id  # the ids of all features as one [F, B] block, in our order
            return xt
        for j, f in enumerate(self.features):
            values, lengths = inputs.ids[f]
            column = xt[d + j]
            if values.shape[0] == b:
                column[:] = values
            else:  # some examples have no id: missing
                if lengths.size and int(lengths.max()) > 1:
                    raise ValueError(f"GBMModel: feature {f!r} has more than one id in an example")
                column[:] = np.nan
                column[lengths > 0] = values
        return xt

    def rows(self, inputs: ModelInputs) -> np.ndarray:
        """inputs -> x [B, num_dense + F] float32, the rows the libraries' predict takes."""
        return np.ascontiguousarray(self.columns(inputs).T)

    def predict(self, inputs: ModelInputs) -> np.ndarray:
        """Logits [B] float32 (the trees' raw scores) for `inputs` (validated by the caller: see protocol.py)."""
        if self.tree is None:
            return self.forest.margin_columns(self.columns(inputs)).astype(np.float32)
        return self.tree.margin(self.rows(inputs)).astype(np.float32)


@dataclass(eq=False)
class LoadedGBM:
    path: Path
    manifest: dict[str, Any]
    bundle_id: str
    model: GBMModel
    preprocess: RequestPreprocessor

    @property
    def name(self) -> str:
        return str(self.manifest["name"])

    @property
    def version(self) -> str:
        return str(self.manifest["version"])


def load_gbm_bundle(
    path: str | Path,
    max_request_rows: int = 65536,
    predictor: GBMPredictor = GBMPredictor.FOREST,
    verify: bool = True,
    deadline_s: float = DEFAULT_LOAD_DEADLINE_S,
) -> LoadedGBM:
    """Open a GBM bundle, check its checksums, read and check the trees (gbm_file.py: the library parses
    the file only in a child process, within `deadline_s`); no code runs from the files."""
    root = Path(path)
    where = root / MANIFEST
    try:
        manifest = json.loads(where.read_text())
        library = Library(manifest["library"])
        files = {_inside(str(k), str(where)): str(v) for k, v in manifest["files"].items()}
        num_dense, features = int(manifest["num_dense"]), tuple(str(f) for f in manifest["features"])
        if manifest.get("kind") != KIND or manifest.get("format") != FORMAT:
            raise ValueError(f"kind {manifest.get('kind')!r} format {manifest.get('format')!r}")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{where}: not a GBM bundle manifest ({type(e).__name__}: {e})") from None
    if library.model_file not in files:
        raise ValueError(f"{where}: lists no {library.model_file}")
    if verify:
        for rel, expected in files.items():
            p = root / rel
            if not p.is_file():
                raise ValueError(f"GBM bundle {root}: file {rel} listed in the manifest is missing")
            if sha256_file(p) != expected:
                raise ValueError(f"GBM bundle {root}: checksum mismatch for {rel}")
    model_file = root / library.model_file
    checked = read_gbm_file(model_file, library, deadline_s, files[library.model_file] if verify else None)
    tree = TreeModel.load(model_file, library) if predictor is GBMPredictor.LIBRARY else None  # the reference, checked above
    model = GBMModel(checked.forest, library, num_dense, features, tree)
    schema = Schema.load(root / SCHEMA) if (root / SCHEMA).is_file() else None
    workflow = Workflow.load(root / WORKFLOW) if (root / WORKFLOW).is_dir() else None
    preprocess = RequestPreprocessor(model.signature(max_request_rows), schema, workflow)
    return LoadedGBM(root, manifest, sha256_file(where), model, preprocess)
