"""NextItemsModel: a sequential model served as "next items for this sequence" over the Open Inference Protocol v2.

    model = hugerec.serving.load("runs/movielens_sasrec/bundle")   # a next-items bundle (bundles/any_bundle.py)
    out = model.next_items(values, lengths)      # raw item ids [N] + lengths [B] -> items [B, k], scores [B, k]

Request (KServe v2 / Triton, JSON or the binary extension):
    "items"          INT64 [N] the raw item ids of every history, oldest first, one after another
    "items.lengths"  INT64 [B] items per history            (or "items" [B, L] padded with -1)
    "items.times"    INT64 [N] (or [B, L] beside padded items) each item's time in seconds: required by a
                     model trained with times (an HSTU with `model.times = true`: its time buckets read the
                     differences, so any epoch works, negative seconds too, as the data path reads them),
                     refused by any other; the metadata lists it only for such a model
    parameters.k     optional, 1..catalogue size (default: the bundle's k)
Outputs: "items" INT64 [B, k] (raw ids, best first; -1 where fewer than k remain), "scores" FP32
[B, k], "unknown_items" INT64 [B] (ids the model does not know, skipped), "truncated_items" INT64 [B]
(known ids left out because the history is longer than the model's max_len: it keeps the last max_len,
with their own times).
A history with no known item gets the most popular items. Scoring is exact: the query vector against
every item vector (one [B, I] matmul).

Given candidates for one history are scored for the pipeline's Score stage: by any model's next-item score
(`next_item_scores`, `sequential = "next_item"`: one query vector, one dot product per candidate), or by an
HSTU's ranking head (`candidate_scores`, `sequential = "ranking_head"`): the history is encoded once and the
candidates are scored by the head in micro-batches (`hugerec.models.hstu`, M-FALCON).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.sequence import PAD
from hugerec.serving.runtime.inference_protocol import (
    HEADER_LENGTH,
    LENGTHS_SUFFIX,
    PADDING,
    LiveFields,
    RequestError,
    Signature,
    parse_tensors,
    split_body,
    to_model_inputs,
)
from hugerec.serving.runtime.served_object import ServedObject
from hugerec.training.model_file import SavedModel as SavedSequenceModel
from hugerec.training.sequential import SequenceModel, query_vectors

FEATURE = "items"
TIMES = FEATURE + ".times"
OUTPUTS = ("items", "scores", "unknown_items", "truncated_items")
_DATATYPES = {"items": "INT64", "scores": "FP32", "unknown_items": "INT64", "truncated_items": "INT64"}


@dataclass(frozen=True, eq=False)
class NextItemsModel(ServedObject):
    """A loaded next-items bundle: exact top-k next items for raw-id histories (a served object: see
    served_object.py; versions, canaries and the admin API treat it as any other kind)."""

    family: ClassVar[str] = "next_items"
    platform: ClassVar[str] = "hugerec_next_items"

    name: str
    version: str
    k: int
    exclude_seen: bool
    saved: SavedSequenceModel
    item_vectors: torch.Tensor  # [I, D] rows of dense items 1..I
    request_rows: int = 65536  # histories per request
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return "next_items"

    @property
    def signature(self) -> Signature:
        return Signature(0, (FEATURE,), self.request_rows)

    def max_rows(self) -> int:
        return self.request_rows

    @property
    def uses_times(self) -> bool:
        """True when the model was trained on its items' timestamps (an HSTU with `model.times = true`):
        a request then carries "items.times"."""
        return getattr(self.saved.config, "times", False) is True

    def fields(self) -> LiveFields:
        names = self.signature.input_names()
        return LiveFields(names | {TIMES} if self.uses_times else names, frozenset(), frozenset({0}))

    async def infer(self, body: bytes, header_length: str | None, live: LiveFields) -> tuple[bytes, dict[str, str]]:
        return await asyncio.to_thread(self.answer, body, header_length, live)  # a [B, I] matmul: off the event loop

    def close(self) -> None:
        """Nothing to release: the model and the item vectors are tensors in memory."""

    def next_items(
        self, values: np.ndarray, lengths: np.ndarray, k: int | None = None, times: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """values [N] raw ids, lengths [B] -> {"items": [B, k] raw ids (-1: none), "scores": [B, k], "unknown_items": [B]}.

        times [N] int64 seconds beside the values: required by a model with `uses_times`, refused otherwise."""
        k = self.k if k is None else k
        if self.uses_times and times is None:
            raise RequestError(f"input {TIMES!r} is required: model {self.name!r} was trained on its items' timestamps (int64 seconds, one per item)")
        if not self.uses_times and times is not None:
            raise RequestError(f"input {TIMES!r}: model {self.name!r} was trained without timestamps and does not take them")
        if times is not None and np.shape(times) != np.shape(values):
            raise RequestError(f"input {TIMES!r} has shape {list(np.shape(times))}; it needs one time per item, {list(np.shape(values))}")
        num_items = self.saved.num_items
        if not 1 <= k <= num_items:
            raise RequestError(f"parameter 'k' = {k} must be in 1..{num_items} (the catalogue's size)")
        lengths = np.asarray(lengths, dtype=np.int64)
        b = len(lengths)
        cut = self._cut(values, lengths, times)
        unknown, truncated, n_known, padded, padded_times = cut.unknown, cut.truncated, cut.n_known, cut.padded, cut.padded_times
        dense, row = cut.dense, cut.row
        scores = torch.full((b, num_items), float("-inf"))
        warm = n_known > 0
        if warm.any():
            model: SequenceModel = self.saved.model  # type: ignore[assignment]
            t = None if padded_times is None else padded_times[warm]
            q = query_vectors(model, torch.from_numpy(padded[warm]), times=t).float()  # [W, D]
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

    def _cut(self, values: np.ndarray, lengths: np.ndarray, times: np.ndarray | None) -> _Cut:
        """Histories (raw ids [N], lengths [B], optional seconds [N]) -> the model's input: unknown ids dropped
        (with their times) and counted, the last max_len known ids of each history kept, left-padded."""
        b = len(lengths)
        dense = self.saved.lookup(values)  # [N], PAD where unknown
        row = np.repeat(np.arange(b), lengths)  # [N] history of each id
        known = dense != PAD
        unknown = np.bincount(row[~known], minlength=b).astype(np.int64)  # [B]
        dense, row = dense[known], row[known]
        seconds = None if times is None else np.asarray(times, dtype=np.int64)[known]  # [N_known], the same cut
        n_known = np.bincount(row, minlength=b)
        max_len = self.saved.max_len
        # [B, L] left-padded: the last max_len known ids of each history (position from the history's end)
        ends = np.cumsum(n_known)
        from_end = ends[row] - np.arange(len(row)) - 1  # 0 for a history's most recent id
        keep = from_end < max_len
        truncated = np.bincount(row[~keep], minlength=b).astype(np.int64)  # [B]
        padded = np.full((b, max_len), PAD, dtype=np.int64)
        padded[row[keep], max_len - 1 - from_end[keep]] = dense[keep]
        padded_times = None  # [B, L]: the kept items' own times (0 at padding, which the model never reads)
        if seconds is not None:
            padded_times = np.zeros((b, max_len), dtype=np.int64)
            padded_times[row[keep], max_len - 1 - from_end[keep]] = seconds[keep]
        return _Cut(dense, row, unknown, truncated, n_known, padded, padded_times)

    def next_item_scores(self, history: np.ndarray, candidates: np.ndarray, times: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """One history's raw ids (oldest first) and K candidates' raw ids -> ([K] float32 next-item logits: the
        query vector of the history's last max_len known ids . each candidate's item vector, the scores
        `next_items` ranks the catalogue by; -inf for a candidate the model does not know; the number of known
        history ids left out). A history with no known id scores by popularity, log(1 + training count), as
        `next_items` falls back to the most popular items. times [H]: as `next_items` takes them."""
        raw = np.asarray(history, dtype=np.int64)
        if self.uses_times != (times is not None):
            raise ValueError(f"next-items model {self.name!r} " + ("reads its items' times: give one per history item" if self.uses_times else "was trained without timestamps and takes no times"))
        if times is not None and np.shape(times) != raw.shape:
            raise ValueError(f"next_item_scores: {len(times)} times for {len(raw)} history items")
        cut = self._cut(raw, np.array([len(raw)]), times)
        truncated = int(cut.truncated[0])
        cand = self.saved.lookup(np.asarray(candidates, dtype=np.int64))
        cand_known = cand != PAD
        out = np.full(len(cand), -np.inf, dtype=np.float32)
        if not cand_known.any():
            return out, truncated
        rows = torch.from_numpy(cand[cand_known] - 1)  # dense id d is item vector row d - 1
        if not cut.n_known[0]:
            out[cand_known] = np.log1p(self.saved.item_counts[cand[cand_known]].astype(np.float64)).astype(np.float32)
            return out, truncated
        model: SequenceModel = self.saved.model  # type: ignore[assignment]
        q = query_vectors(model, torch.from_numpy(cut.padded), times=cut.padded_times).float()  # [1, D]
        out[cand_known] = (q @ self.item_vectors[rows].T)[0].numpy()
        return out, truncated

    @property
    def scores_candidates(self) -> bool:
        """True when the model ranks given candidates itself (an HSTU: cached candidate scoring)."""
        return isinstance(self.saved.model, HSTU)

    @property
    def ranking_head_trained(self) -> bool:
        """True when the ranking head of candidate_scores was trained (an HSTU with model.ranking_weight > 0);
        an HSTU trained before the key has an untrained one."""
        config = self.saved.config
        return isinstance(config, HSTUConfig) and config.ranking_head_trained

    def candidate_scores(
        self, history: np.ndarray, candidates: np.ndarray, micro_batch: int = 256, times: np.ndarray | None = None
    ) -> tuple[np.ndarray, int]:
        """One history's raw ids (oldest first) and K candidates' raw ids -> ([K] float32 ranking-head logits,
        -inf for a candidate the model does not know; the number of known history ids left out because
        the history is longer than max_len - 1, the slot before the candidate's).

        times [H] int64 seconds beside the history: required by a model with `uses_times`, refused otherwise;
        the kept ids keep their own times and the candidates sit at the time of the history's latest event."""
        model = self.saved.model
        if not isinstance(model, HSTU):
            raise ValueError(f"next-items model {self.name!r} is a {self.saved.model_type}, which has no candidate scoring (an HSTU has)")
        if self.uses_times != (times is not None):
            raise ValueError(f"next-items model {self.name!r} " + ("reads its items' times: give one per history item" if self.uses_times else "was trained without timestamps and takes no times"))
        raw = np.asarray(history, dtype=np.int64)
        if times is not None and np.shape(times) != raw.shape:
            raise ValueError(f"candidate_scores: {len(times)} times for {len(raw)} history items")
        dense = self.saved.lookup(raw)
        known = dense != PAD
        dense = dense[known]
        room = self.saved.max_len - 1
        truncated = max(len(dense) - room, 0)
        cand = self.saved.lookup(np.asarray(candidates, dtype=np.int64))
        cand_known = cand != PAD
        out = np.full(len(cand), -np.inf, dtype=np.float32)
        if cand_known.any():
            first = len(dense) - min(len(dense), room)
            hist = torch.from_numpy(dense[first:])[None]  # [1, Lh]
            hist_times = now = None
            if times is not None:
                seconds = np.asarray(times, dtype=np.int64)
                hist_times = torch.from_numpy(seconds[known][first:])[None]  # [1, Lh]: the kept ids' own times
                now = torch.tensor(seconds[-1:] if len(seconds) else [0], dtype=torch.int64)  # [1]: the latest event's time
            with torch.no_grad():
                scores = model.candidate_scores(hist, torch.from_numpy(cand[cand_known])[None], hist_times, now, micro_batch=micro_batch)
            out[cand_known] = scores[0].numpy()
        return out, truncated

    def answer(self, body: bytes, header_length: str | None, live: LiveFields | None = None) -> tuple[bytes, dict[str, str]]:
        """An infer request body -> (response body, headers); bad requests raise RequestError (400). "items.times"
        sent to a model without times is refused, unless another loaded version of it (`live`) takes them."""
        header_bytes, blob = split_body(body, header_length)
        request, tensors = parse_tensors(header_bytes, blob, self.request_rows)
        raw_times = tensors.pop(TIMES, None)
        if raw_times is not None and not self.uses_times and live is not None and TIMES in live.inputs and live.versions > 1:
            raw_times = None  # a canary or stable version trained with times takes them: this one reads the items alone
        if raw_times is not None and not self.uses_times:
            raise RequestError(f"input {TIMES!r}: model {self.name!r} was trained without timestamps and does not take them")
        inputs = to_model_inputs(tensors, self.signature)
        values, lengths = inputs.ids[FEATURE]
        times = None if raw_times is None else request_times(raw_times, tensors[FEATURE], FEATURE + LENGTHS_SUFFIX in tensors)
        params = request.get("parameters") or {}
        k = params.get("k") if isinstance(params, dict) else None
        if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
            raise RequestError(f"parameter 'k' must be an integer, got {k!r}")
        outputs = self.next_items(values, lengths, k, times)
        return encode(self.name, self.version, request, outputs)

    def metadata(self) -> dict[str, Any]:
        inputs: list[dict[str, Any]] = [
            {"name": FEATURE, "datatype": "INT64", "shape": [-1]},
            {"name": FEATURE + LENGTHS_SUFFIX, "datatype": "INT64", "shape": [-1]},
        ]
        if self.uses_times:
            inputs.append({"name": TIMES, "datatype": "INT64", "shape": [-1]})
        return {
            "platform": self.platform,
            "inputs": inputs,
            "outputs": [
                {"name": "items", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
                {"name": "unknown_items", "datatype": "INT64", "shape": [-1]},
                {"name": "truncated_items", "datatype": "INT64", "shape": [-1]},
            ],
        }


@dataclass(frozen=True)
class _Cut:
    """Histories as the model reads them (NextItemsModel._cut): the known ids (dense) and their history (row),
    per history the unknown ids skipped, the known ids left out (longer than max_len) and the known ids, and
    the [B, max_len] left-padded ids and times (None without times)."""

    dense: np.ndarray
    row: np.ndarray
    unknown: np.ndarray
    truncated: np.ndarray
    n_known: np.ndarray
    padded: np.ndarray
    padded_times: np.ndarray | None


def request_times(raw: np.ndarray, items: np.ndarray, jagged: bool) -> np.ndarray:
    """The request's "items.times" -> int64 seconds [N] beside the item values `to_model_inputs` kept (the
    slots of a [B, L] padded "items" that hold -1 are dropped from both); RequestError naming the field for
    another shape than the items', non-integers, or values beyond int64 (the decoder already refused
    integers beyond 64 bits and values outside the declared datatype)."""
    if raw.shape != items.shape:
        how = "[N] beside \"items\" and \"items.lengths\"" if jagged else "the shape of \"items\""
        raise RequestError(f"input {TIMES!r} has shape {list(raw.shape)}; it needs {how}: {list(items.shape)}")
    if raw.dtype.kind not in "iu":
        raise RequestError(f"input {TIMES!r} must hold integer seconds, got {raw.dtype}")
    if raw.dtype == np.uint64 and raw.size and int(raw.max()) > np.iinfo(np.int64).max:
        raise RequestError(f"input {TIMES!r} has values above the int64 range")
    seconds = raw.astype(np.int64, copy=False)
    if not jagged and items.ndim == 2:
        return seconds[items != PADDING]  # row-major: the same order as the kept item values
    return seconds.reshape(-1)


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

