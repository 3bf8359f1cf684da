"""The serving bundle on disk: manifest, checksums, and loading that never runs code from the files.

    bundle/
      manifest.json        format, name, version, tables, collections, files -> sha256
      dense.pt2            the dense part: torch.export program (dense, pooled...) -> logits
      dense.onnx           optional, the same program as ONNX
      embeddings/          RocksDB (column family per table): key -> row, see store/persistent.py
      schema.json          optional, hugerec.data.schema.Schema
      workflow/            optional, the fitted hugerec.data.preprocess Workflow (JSON + Parquet)

Every file except manifest.json is listed in the manifest with its sha256; `Bundle.open` checks
them all and names the first file that is missing or differs. The program is read with torch's
own graph format after checking that the archive holds no pickled objects, and with
torch.load forced to weights_only, so a crafted bundle cannot run code when loaded.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.serving.bundles.bundle_files import MANIFEST, inside_bundle, sha256_file
from hugerec.serving.runtime.inference_model import CollectionLayout
from hugerec.serving.store.parameter_server import TableSpec

FORMAT = "hugerec-bundle"
FORMAT_VERSION = 1
PROGRAM = "dense.pt2"
ONNX = "dense.onnx"
EMBEDDINGS = "embeddings"
SCHEMA = "schema.json"
WORKFLOW = "workflow"
PROGRAM_PREFIX = "model."  # parameter names inside the program: "model." + the model's own names


@dataclass(frozen=True)
class Manifest:
    """What a bundle holds (manifest.json)."""

    name: str
    version: str
    num_dense: int
    collections: tuple[CollectionLayout, ...]
    tables: tuple[TableSpec, ...]
    dense_keys: tuple[str, ...]  # the model's state-dict keys that live in the dense program
    files: dict[str, str]  # relative path -> sha256
    info: dict[str, Any]  # created, hugerec / torch versions, model class, rows per table, onnx

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "version": self.version,
            "num_dense": self.num_dense,
            "collections": [c.to_dict() for c in self.collections],
            "tables": [
                {
                    "name": t.name,
                    "dim": t.dim,
                    "num_rows": t.num_rows,
                    "default": None if t.default is None else list(t.default),
                }
                for t in self.tables
            ],
            "dense_keys": list(self.dense_keys),
            "files": dict(sorted(self.files.items())),
            "info": self.info,
        }

    @staticmethod
    def from_dict(d: dict[str, Any], where: str) -> Manifest:
        if d.get("format") != FORMAT:
            raise ValueError(f"{where}: not a hugerec bundle manifest (format {d.get('format')!r})")
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{where}: bundle format version {d.get('format_version')!r}, this hugerec reads {FORMAT_VERSION}"
            )
        try:
            return Manifest(
                name=str(d["name"]),
                version=str(d["version"]),
                num_dense=int(d["num_dense"]),
                collections=tuple(CollectionLayout.from_dict(c) for c in d["collections"]),
                tables=tuple(
                    TableSpec(
                        t["name"],
                        int(t["dim"]),
                        None if t["default"] is None else tuple(float(x) for x in t["default"]),
                        None if t["num_rows"] is None else int(t["num_rows"]),
                    )
                    for t in d["tables"]
                ),
                dense_keys=tuple(d["dense_keys"]),
                files={inside_bundle(str(k), where): str(v) for k, v in d["files"].items()},
                info=dict(d.get("info") or {}),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: manifest is missing or mistypes {e}") from None


class Bundle:
    """An exported bundle, opened and (by default) verified against its manifest."""

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest

    @staticmethod
    def open(path: str | Path, verify: bool = True) -> Bundle:
        root = Path(path)
        manifest_path = root / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"Bundle: {root} has no {MANIFEST} (is it an exported bundle?)")
        try:
            raw = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"Bundle: {manifest_path} is not valid JSON: {type(e).__name__}: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"Bundle: {manifest_path} must hold a JSON object")
        manifest = Manifest.from_dict(raw, str(manifest_path))
        bundle = Bundle(root, manifest)
        if verify:
            bundle.verify()
        return bundle

    @property
    def id(self) -> str:
        """sha256 of the manifest: names this exact bundle (a re-export gets a new id)."""
        return sha256_file(self.path / MANIFEST)

    def verify(self) -> None:
        """ValueError naming the first file that is missing or whose sha256 differs from the manifest."""
        root = self.path.resolve()
        for rel, expected in self.manifest.files.items():
            p = self.path / rel
            if not p.resolve().is_relative_to(root):  # a link inside the bundle pointing out of it
                raise ValueError(f"Bundle {self.path}: file {rel} listed in the manifest lies outside the bundle")
            if not p.is_file():
                raise ValueError(f"Bundle {self.path}: file {rel} listed in the manifest is missing")
            got = sha256_file(p)
            if got != expected:
                raise ValueError(
                    f"Bundle {self.path}: checksum mismatch for {rel}: manifest {expected[:16]}..., file {got[:16]}..."
                )

    def program(self) -> torch.nn.Module:
        """The dense program, as an eval-mode module: (dense [B, Dd], pooled_1, ...) -> logits [B]."""
        return load_program(self.path / PROGRAM)

    def schema(self) -> Schema | None:
        p = self.path / SCHEMA
        return Schema.load(p) if p.is_file() else None

    def workflow(self) -> Workflow | None:
        p = self.path / WORKFLOW
        return Workflow.load(p) if p.is_dir() else None


def load_program(path: Path) -> torch.nn.Module:
    """Load a torch.export program without running pickled code (see the module docstring)."""
    _refuse_pickles(path)
    forced = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"  # torch.export.load falls back to full pickle otherwise
    try:
        program = torch.export.load(str(path))
    except Exception as e:  # torch raises many types for a damaged archive: report which file
        raise ValueError(f"cannot load the dense program {path}: {type(e).__name__}: {e}") from None
    finally:
        if forced is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = forced
    return program.module()  # traced in eval mode; the unlifted module refuses .eval()


def _refuse_pickles(path: Path) -> None:
    """The PT2 archive may mark weights or constants as pickled, or hold pickled objects: refuse those."""
    try:
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                base = name.rsplit("/", 1)[-1]
                if base.startswith(("custom_obj_", "opaque_obj_")):
                    raise ValueError(f"the dense program {path} holds a pickled object ({name}); refusing to load it")
                if name.endswith("_config.json") and "/data/" in f"/{name}":
                    config = json.loads(archive.read(name))
                    entries = config.get("config", {}) if isinstance(config, dict) else {}
                    pickled = [k for k, v in entries.items() if isinstance(v, dict) and v.get("use_pickle")]
                    if pickled:
                        raise ValueError(
                            f"the dense program {path} stores {pickled[:3]} as pickles; refusing to load it"
                        )
    except zipfile.BadZipFile as e:
        raise ValueError(f"the dense program {path} is not a PT2 archive: {e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"the dense program {path} holds a damaged JSON config: {type(e).__name__}: {e}") from None
