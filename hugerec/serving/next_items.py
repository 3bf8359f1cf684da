"""Serving a sequential model: "next items for this sequence" over the Open Inference Protocol v2.

    export_next_items("runs/movielens_sasrec/model.pt", "runs/movielens_sasrec/bundle", name="sasrec", k=10)
    model = load_next_items("runs/movielens_sasrec/bundle")
    out = model.next_items(values, lengths)      # raw item ids [N] + lengths [B] -> items [B, k], scores [B, k]

A next-items bundle is a folder: `manifest.json` ({"kind": "next_items", "format": 1, name, version, k,
exclude_seen, sha256 of each file}) and `model.pt` (hugerec.training.sequence_file's format). Export
writes a temporary folder and renames it into place; load checks the checksums first.

Request (KServe v2 / Triton, JSON or the binary extension):
    "items"          INT64 [N] the raw item ids of every history, oldest first, one after another
    "items.lengths"  INT64 [B] items per history            (or "items" [B, L] padded with -1)
    parameters.k     optional, 1..catalogue size (default: the bundle's k)
Outputs: "items" INT64 [B, k] (raw ids, best first; -1 where fewer than k remain), "scores" FP32
[B, k], "unknown_items" INT64 [B] (ids the model does not know, skipped), "truncated_items" INT64 [B]
(known ids left out because the history is longer than the model's max_len: it keeps the last max_len).
A history with no known item gets the most popular items. Scoring is exact: the query vector against
every item vector (one [B, I] matmul).

A bundle of an HSTU also ranks given candidates for one history (`candidate_scores`, the pipeline's
Score stage with `sequential = true`): the history is encoded once and the candidates are scored by
the model's ranking head in micro-batches (`hugerec.models.hstu`, M-FALCON).
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hugerec.models.hstu import HSTU
from hugerec.models.sequence import PAD
from hugerec.serving.bundle import MANIFEST, bundle_kind, sha256_file, staged_folder
from hugerec.serving.protocol import (
    HEADER_LENGTH,
    RequestError,
    Signature,
    _split_body,
    parse_tensors,
    to_model_inputs,
)
from hugerec.training.sequence_file import SavedSequenceModel, load_sequence_model
from hugerec.training.sequential import SequenceModel, all_item_vectors, query_vectors

KIND = "next_items"
FORMAT = 1
MODEL = "model.pt"
FEATURE = "items"
OUTPUTS = ("items", "scores", "unknown_items", "truncated_items")
_DATATYPES = {"items": "INT64", "scores": "FP32", "unknown_items": "INT64", "truncated_items": "INT64"}


def is_next_items_bundle(path: str | Path) -> bool:
    """True when `path` holds a next-items bundle (its manifest says kind "next_items")."""
    return bundle_kind(path) == KIND


def export_next_items(
    model_path: str | Path, out: str | Path, name: str = "model", version: str = "1", k: int = 10, exclude_seen: bool = True
) -> Path:
    """A sequential model file -> a next-items bundle at `out` (replaced if it is one already)."""
    saved = load_sequence_model(model_path)  # refuses anything else, before anything is written
    if not 1 <= k <= saved.num_items:
        raise ValueError(f"export_next_items: k = {k} must be in 1..{saved.num_items} (the catalogue's size)")
    final = Path(out)
    if final.exists() and not is_next_items_bundle(final):
        raise ValueError(f"export_next_items: {final} exists and is not a next-items bundle; give a new folder")
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
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "sha256": {MODEL: sha256_file(tmp / MODEL)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return final


@dataclass(frozen=True)
class NextItemsModel:
    """A loaded next-items bundle: exact top-k next items for raw-id histories."""

    name: str
    version: str
    k: int
    exclude_seen: bool
    saved: SavedSequenceModel
    item_vectors: torch.Tensor  # [I, D] rows of dense items 1..I
    max_rows: int = 65536

    @property
    def signature(self) -> Signature:
        return Signature(0, (FEATURE,), self.max_rows)

    def next_items(self, values: np.ndarray, lengths: np.ndarray, k: int | None = None) -> dict[str, np.ndarray]:
        """values [N] raw ids, lengths [B] -> {"items": [B, k] raw ids (-1: none), "scores": [B, k], "unknown_items": [B]}."""
        k = self.k if k is None else k
        num_items = self.saved.num_items
        if not 1 <= k <= num_items:
            raise RequestError(f"parameter 'k' = {k} must be in 1..{num_items} (the catalogue's size)")
        lengths = np.asarray(lengths, dtype=np.int64)
        b = len(lengths)
        dense = self.saved.lookup(values)  # [N], PAD where unknown
        row = np.repeat(np.arange(b), lengths)  # [N] history of each id
        known = dense != PAD
        unknown = np.bincount(row[~known], minlength=b).astype(np.int64)  # [B]
        dense, row = dense[known], row[known]
        n_known = np.bincount(row, minlength=b)
        max_len = self.saved.max_len
        # [B, L] left-padded: the last max_len known ids of each history (position from the history's end)
        ends = np.cumsum(n_known)
        from_end = ends[row] - np.arange(len(row)) - 1  # 0 for a history's most recent id
        keep = from_end < max_len
        truncated = np.bincount(row[~keep], minlength=b).astype(np.int64)  # [B]
        padded = np.full((b, max_len), PAD, dtype=np.int64)
        padded[row[keep], max_len - 1 - from_end[keep]] = dense[keep]
        scores = torch.full((b, num_items), float("-inf"))
        warm = n_known > 0
        if warm.any():
            model: SequenceModel = self.saved.model  # type: ignore[assignment]
            q = query_vectors(model, torch.from_numpy(padded[warm])).float()  # [W, D]
            scores[torch.from_numpy(warm)] = q @ self.item_vectors.T  # [W, I]
        if not warm.all():  # nothing known to go on: the most popular items
            scores[torch.from_numpy(~warm)] = torch.from_numpy(self.saved.item_counts[1:].astype(np.float32))
        if self.exclude_seen and len(row):
            scores[torch.from_numpy(row), torch.from_numpy(dense - 1)] = float("-inf")
        top = torch.topk(scores, k, dim=1)
        found = torch.isfinite(top.values)
        items = torch.where(found, torch.from_numpy(self.saved.items_raw)[top.indices], torch.full_like(top.indices, -1))
        return {
            "items": items.numpy().astype(np.int64),
            "scores": torch.where(found, top.values, torch.zeros_like(top.values)).numpy().astype(np.float32),
            "unknown_items": unknown,
            "truncated_items": truncated,
        }

    @property
    def scores_candidates(self) -> bool:
        """True when the model ranks given candidates itself (an HSTU: cached candidate scoring)."""
        return isinstance(self.saved.model, HSTU)

    def candidate_scores(self, history: np.ndarray, candidates: np.ndarray, micro_batch: int = 256) -> tuple[np.ndarray, int]:
        """One history's raw ids (oldest first) and K candidates' raw ids -> ([K] float32 ranking-head logits,
        -inf for a candidate the model does not know; the number of known history ids left out because
        the history is longer than max_len - 1, the slot before the candidate's)."""
        model = self.saved.model
        if not isinstance(model, HSTU):
            raise ValueError(f"next-items model {self.name!r} is a {self.saved.model_type}, which has no candidate scoring (an HSTU has)")
        dense = self.saved.lookup(np.asarray(history, dtype=np.int64))
        dense = dense[dense != PAD]
        room = self.saved.max_len - 1
        truncated = max(len(dense) - room, 0)
        cand = self.saved.lookup(np.asarray(candidates, dtype=np.int64))
        known = cand != PAD
        out = np.full(len(cand), -np.inf, dtype=np.float32)
        if known.any():
            hist = torch.from_numpy(dense[len(dense) - min(len(dense), room) :])[None]  # [1, Lh]
            with torch.no_grad():
                scores = model.candidate_scores(hist, torch.from_numpy(cand[known])[None], micro_batch=micro_batch)
            out[known] = scores[0].numpy()
        return out, truncated

    def answer(self, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
        """An infer request body -> (response body, headers); bad requests raise RequestError (400)."""
        header_bytes, blob = _split_body(body, header_length)
        request, tensors = parse_tensors(header_bytes, blob, self.max_rows)
        inputs = to_model_inputs(tensors, self.signature)
        values, lengths = inputs.ids[FEATURE]
        params = request.get("parameters") or {}
        k = params.get("k") if isinstance(params, dict) else None
        if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
            raise RequestError(f"parameter 'k' must be an integer, got {k!r}")
        outputs = self.next_items(values, lengths, k)
        return encode(self.name, self.version, request, outputs)

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": "hugerec_next_items",
            "inputs": [
                {"name": FEATURE, "datatype": "INT64", "shape": [-1]},
                {"name": FEATURE + ".lengths", "datatype": "INT64", "shape": [-1]},
            ],
            "outputs": [
                {"name": "items", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
                {"name": "unknown_items", "datatype": "INT64", "shape": [-1]},
                {"name": "truncated_items", "datatype": "INT64", "shape": [-1]},
            ],
        }


def encode(model: str, version: str, request: Mapping[str, Any], outputs: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The response: JSON data, or the binary extension for outputs asked for as binary."""
    params = request.get("parameters") or {}
    binary_all = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    wanted = request.get("outputs")
    names, binary = list(OUTPUTS), set(OUTPUTS) if binary_all else set()
    if wanted is not None:
        if not isinstance(wanted, list):
            raise RequestError("'outputs' must be a list")
        names, binary = [], set()
        for spec in wanted:
            name = spec.get("name") if isinstance(spec, dict) else None
            if name not in OUTPUTS:
                raise RequestError(f"unknown output {name!r}; the model has {list(OUTPUTS)}")
            names.append(name)
            p = spec.get("parameters") or {}
            if isinstance(p, dict) and p.get("binary_data", binary_all):
                binary.add(name)
    described, blobs = [], []
    for name in names:
        dtype = "<i8" if _DATATYPES[name] == "INT64" else "<f4"
        array = np.ascontiguousarray(outputs[name], dtype=dtype)
        entry: dict[str, Any] = {"name": name, "datatype": _DATATYPES[name], "shape": list(array.shape)}
        if name in binary:
            raw = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            entry["data"] = array.ravel().tolist()
        described.append(entry)
    body: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": described}
    if request.get("id") is not None:
        body["id"] = str(request["id"])
    header = json.dumps(body, separators=(",", ":")).encode()
    if not blobs:
        return header, {"content-type": "application/json"}
    return header + b"".join(blobs), {HEADER_LENGTH: str(len(header)), "content-type": "application/octet-stream"}


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
