"""The next-items bundle: a sequential model exported for serving, and loading one as a NextItemsModel.

    write_next_items_bundle("runs/movielens_sasrec/model.pt", "runs/movielens_sasrec/bundle", name="sasrec", k=10)
    model = load_next_items("runs/movielens_sasrec/bundle")    # what hugerec.serving.load calls for this kind
    out = model.next_items(values, lengths)      # raw item ids [N] + lengths [B] -> items [B, k], scores [B, k]

A next-items bundle is a folder: `manifest.json` ({"kind": "next_items", "format": 1, name, version, k,
exclude_seen, sha256 of each file; "times": true for a model trained on its items' timestamps, an HSTU with
`model.times = true`, whose requests carry "items.times"; "ranking_head": true for an HSTU whose ranking head
was trained, `model.ranking_weight > 0`: absent, as in bundles from before the key, it never was, and the
pipeline's Score stage refuses it}) and `model.pt` (hugerec.training.model_file's format). Export
writes a temporary folder and renames it into place; load checks the checksums first.

The loaded model is hugerec.serving.runtime.next_items_model.NextItemsModel (its request and outputs are
described there).
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

from hugerec.models.hstu import HSTUConfig
from hugerec.serving.bundles.bundle_files import MANIFEST, bundle_kind, sha256_file, staged_folder
from hugerec.serving.runtime.next_items_model import NextItemsModel
from hugerec.training.model_file import load_model as load_sequence_model
from hugerec.training.sequential import SequenceModel, all_item_vectors

KIND = "next_items"
FORMAT = 1
MODEL = "model.pt"


def is_next_items_bundle(path: str | Path) -> bool:
    """True when `path` holds a next-items bundle (its manifest says kind "next_items")."""
    return bundle_kind(path) == KIND


def write_next_items_bundle(
    model_path: str | Path, out: str | Path, name: str = "model", version: str = "1", k: int = 10, exclude_seen: bool = True
) -> Path:
    """A sequential model file -> a next-items bundle at `out` (replaced if it is one already)."""
    saved = load_sequence_model(model_path)  # refuses anything else, before anything is written
    if not 1 <= k <= saved.num_items:
        raise ValueError(f"export: k = {k} must be in 1..{saved.num_items} (the catalogue's size)")
    final = Path(out)
    if final.exists() and not is_next_items_bundle(final):
        raise ValueError(f"export: {final} exists and is not a next-items bundle; give a new folder")
    with staged_folder(final) as tmp:
        shutil.copyfile(model_path, tmp / MODEL)
        manifest = {
            "kind": KIND,
            "format": FORMAT,
            "name": name,
            "version": version,
            "k": k,
            "exclude_seen": exclude_seen,
            "model_type": saved.model_type,
            "num_items": saved.num_items,
            "max_len": saved.max_len,
            **({"times": True} if _timed(saved.config) else {}),  # absent without times: such manifests are as before
            **({"ranking_head": True} if ranking_head_trained(saved.config) else {}),  # likewise
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "sha256": {MODEL: sha256_file(tmp / MODEL)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return final


def _timed(config: object) -> bool:
    """Whether a sequential model was trained on its items' timestamps (HSTU with `model.times = true`)."""
    return getattr(config, "times", False) is True


def ranking_head_trained(config: object) -> bool:
    """Whether a sequential model's ranking head was trained (an HSTU with `model.ranking_weight > 0`)."""
    return isinstance(config, HSTUConfig) and config.ranking_head_trained


def load_next_items(path: str | Path, name: str | None = None, version: str | None = None, max_rows: int = 65536) -> NextItemsModel:
    """Open a next-items bundle: checksums verified, the model rebuilt (weights only), item vectors computed once."""
    folder = Path(path)
    if not is_next_items_bundle(folder):
        raise ValueError(f"load_next_items: {folder} is not a next-items bundle (no {MANIFEST} of kind {KIND!r})")
    manifest = json.loads((folder / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"load_next_items: {folder / MANIFEST} has format {manifest.get('format')!r}, this hugerec reads {FORMAT}")
    expected = (manifest.get("sha256") or {}).get(MODEL)
    if not (folder / MODEL).is_file() or sha256_file(folder / MODEL) != expected:
        raise ValueError(f"load_next_items: {folder / MODEL} is missing or does not match its checksum in the manifest")
    saved = load_sequence_model(folder / MODEL)
    if bool(manifest.get("times", False)) != _timed(saved.config):
        raise ValueError(
            f"load_next_items: {folder / MANIFEST} says times = {bool(manifest.get('times', False))} but the model in "
            f"{folder / MODEL} was trained with model.times = {_timed(saved.config)}"
        )
    if bool(manifest.get("ranking_head", False)) != ranking_head_trained(saved.config):
        raise ValueError(
            f"load_next_items: {folder / MANIFEST} says ranking_head = {bool(manifest.get('ranking_head', False))} but the model in "
            f"{folder / MODEL} was trained with model.ranking_weight = {getattr(saved.config, 'ranking_weight', 0.0)}"
        )
    model: SequenceModel = saved.model  # type: ignore[assignment]
    vectors = all_item_vectors(model).float()
    return NextItemsModel(
        name or str(manifest["name"]),
        version or str(manifest["version"]),
        int(manifest["k"]),
        bool(manifest["exclude_seen"]),
        saved,
        vectors,
        max_rows,
    )
