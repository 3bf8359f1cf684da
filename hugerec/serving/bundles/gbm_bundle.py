"""The GBM bundle: gradient-boosted trees exported for serving, and loading one as a GBMModel.

    write_gbm_bundle("runs/gbm/model.txt", Library.LIGHTGBM, "runs/gbm/bundle", schema, workflow)
    server.add_bundle("runs/gbm/bundle")       # KServe v2 infer and /predict, batched, as for a deep model

A GBM bundle is a folder: manifest.json ({"kind": "gbm", "format": 1, name, version, library,
num_dense, features, files -> sha256, info}), the model in its library's own format (model.txt:
LightGBM text, model.json: XGBoost JSON; never a pickle), schema.json and the fitted workflow/
(when the data had one, so /predict takes raw rows). Export writes a temporary folder and renames
it into place; loading checks every checksum first.

The trees are served by hugerec.serving.runtime.gbm_model.GBMModel (the same ModelInputs and
`predict(inputs) -> logits [B]` as InferenceModel); `load_gbm_bundle` builds one from the folder.

Loading never runs the library's parser in this process (gbm_file.py): our reader checks every tree
(runtime/forest_check.py), then the library loads the same bytes in a child process under a deadline
and must score probe rows as the forest does; a crash, hang or disagreement is a refused load
(ValueError). The "library" predictor (a reference for tests and benchmarks) then loads the library in
process too; the server never uses it.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.models.gbm import Library, TreeModel
from hugerec.serving.bundles.bundle_files import (
    MANIFEST,
    bundle_kind,
    checksums,
    inside_bundle,
    sha256_file,
    staged_folder,
)
from hugerec.serving.bundles.gbm_file import read_gbm_file
from hugerec.serving.bundles.isolated_load import DEFAULT_LOAD_DEADLINE_S
from hugerec.serving.bundles.model_bundle import SCHEMA, WORKFLOW
from hugerec.serving.runtime.gbm_model import GBMModel, GBMPredictor
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor

KIND = "gbm"
FORMAT = 1


def is_gbm_bundle(path: str | Path) -> bool:
    """True when `path` holds a GBM bundle (its manifest says kind "gbm")."""
    return bundle_kind(path) == KIND


def write_gbm_bundle(
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
        raise FileExistsError(f"export: {target} exists (pass overwrite=True to replace it)")
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
        files = {inside_bundle(str(k), str(where)): str(v) for k, v in manifest["files"].items()}
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
