"""A loaded pipeline behind HTTP: the friendly POST /recommend and a KServe v2 model.

    POST /recommend  {"user": 17, "k": 20, "history"?: [ids, oldest first], "context"?: {"hour": 9},
                      "pipeline"?: name, "version"?: v, "debug"?: false, "seed"?: int}
      -> {"pipeline", "version", "user", "items": [...], "scores": [...], "sources": [...],
          "cold_start": bool, "notes": [...], "stages"?: {stage: {"items", "scores", "sources"}}, "seconds"?: {...}}

    POST /v2/models/{pipeline}/infer   inputs "user" INT64 [B]; optional "history" INT64 [N] with
      "history.lengths" INT64 [B]; parameters.k, parameters.context (an object of numbers)
      -> outputs "items" INT64 [B, k] (-1 past the end), "scores" FP32 [B, k], "sources" BYTES [B, k]
         (the retrieval source of each item, "" past the end), "cold_start" BOOL [B];
         parameters.notes: one list of notes per user (a short list is always explained there)

    POST /recommend/interactions  {"user": 17, "items": [ids], "pipeline"?: name}: the user has now seen
                                  these items (every loaded version of the pipeline takes them)
    POST /recommend/features      {"table": "item", "ids": [...], "columns": {"available": [...]}, "pipeline"?}:
                                  overwrite some columns of existing rows (admin token required)

Every bad field is a RequestError (400) naming it; a stage that fails is a StageError (503).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from hugerec.serving.pipeline.runner import STAGE_NAMES, PipelineRunner, Query, Recommendation
from hugerec.serving.runtime.inference_protocol import LiveFields, RequestError, decode_tensor, parse_json, split_body
from hugerec.serving.runtime.served_object import ServedObject

PLATFORM = "hugerec_pipeline"
REQUEST_KEYS = ("user", "k", "history", "context", "pipeline", "version", "debug", "seed")
INFER_INPUTS = frozenset({"user", "history", "history.lengths"})
MAX_USERS = 4096  # users (and history tensors' rows) one infer request may carry
_LATENCY_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
_COUNT_BUCKETS = tuple(float(4**i) for i in range(0, 10))


class PipelineMetrics:
    """hugerec_pipeline_stage_seconds{pipeline, version, stage}      histogram per stage
    hugerec_pipeline_candidates{pipeline, version, stage, side}      histogram of candidates in / out per stage
    hugerec_pipeline_cold_starts_total{pipeline, version}            requests answered by the cold-start path"""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "hugerec_pipeline_stage_seconds", "Seconds per pipeline stage", ["pipeline", "version", "stage"],
            buckets=_LATENCY_BUCKETS, registry=registry,
        )
        self.candidates = Histogram(
            "hugerec_pipeline_candidates", "Candidates into / out of a pipeline stage", ["pipeline", "version", "stage", "side"],
            buckets=_COUNT_BUCKETS, registry=registry,
        )
        self.cold = Counter("hugerec_pipeline_cold_starts", "Requests of unknown users", ["pipeline", "version"], registry=registry)

    def observe(self, name: str, version: str, rec: Recommendation) -> None:
        for stage, s in rec.seconds.items():
            self.seconds.labels(name, version, stage).observe(s)
        for stage, (n_in, n_out) in rec.counts.items():
            self.candidates.labels(name, version, stage, "in").observe(n_in)
            self.candidates.labels(name, version, stage, "out").observe(n_out)
        if rec.cold_start:
            self.cold.labels(name, version).inc()


@dataclass(eq=False)
class ServedPipeline(ServedObject):
    """One loaded pipeline version, a served object (served_object.py): /recommend, the KServe v2 infer route,
    online updates of its seen-items and feature stores."""

    family: ClassVar[str] = "pipeline"
    platform: ClassVar[str] = PLATFORM

    name: str
    version: str
    pipeline: PipelineRunner
    metrics: PipelineMetrics | None = None
    info: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "pipeline"

    def max_rows(self) -> int:
        return MAX_USERS

    def fields(self) -> LiveFields:
        return LiveFields(INFER_INPUTS, frozenset(REQUEST_KEYS), frozenset({0}))

    async def infer(self, body: bytes, header_length: str | None, live: LiveFields) -> tuple[bytes, dict[str, str]]:
        return await asyncio.to_thread(self.answer, body, header_length)  # index, stores, a model call: off the loop

    def close(self) -> None:
        closers, self.closers = self.closers, []
        for close in closers:
            close()

    def run(self, query: Query, debug: bool) -> Recommendation:
        rec = self.pipeline.recommend(query, debug)
        if self.metrics is not None:
            self.metrics.observe(self.name, self.version, rec)
        return rec

    def recommend(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The /recommend body (already parsed; pipeline/version already routed) -> the response object."""
        query, debug = parse_recommend(body)
        rec = self.run(query, debug)
        return {"pipeline": self.name, "version": self.version, "user": query.user, **rec.to_json()}

    def answer(self, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
        """A KServe v2 infer request -> (JSON response body, headers)."""
        header_bytes, blob = split_body(body, header_length)
        try:
            request = parse_json(header_bytes)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"request body is not valid JSON: {e}") from None
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list) or not request["inputs"]:
            raise RequestError("request must be a JSON object with a non-empty list 'inputs'")
        tensors: dict[str, np.ndarray] = {}
        offset = 0
        for i, spec in enumerate(request["inputs"]):
            name, array, offset = decode_tensor(spec, i, blob, offset, MAX_USERS)
            if name not in INFER_INPUTS:
                raise RequestError(f"unknown input {name!r}; a pipeline takes 'user' and optionally 'history' + 'history.lengths'")
            tensors[name] = array
        if "user" not in tensors:
            raise RequestError("input 'user' (INT64 [B]) is required")
        users = tensors["user"].reshape(-1).astype(np.int64)
        lengths = tensors.get("history.lengths", np.zeros(len(users), np.int64)).reshape(-1).astype(np.int64)
        history = tensors.get("history", np.zeros(0, np.int64)).reshape(-1).astype(np.int64)
        if len(lengths) != len(users) or (lengths < 0).any() or int(lengths.sum()) != len(history):
            raise RequestError(f"input 'history.lengths' must give one length >= 0 per user ({len(users)}) summing to the {len(history)} history ids")
        params = request.get("parameters") or {}
        if not isinstance(params, dict):
            raise RequestError("'parameters' must be an object")
        unknown = sorted(set(params) - {"k", "context", "seed"})
        if unknown:
            raise RequestError(f"unknown parameter {unknown[0]!r}; a pipeline takes 'k', 'context' and 'seed'")
        k = params.get("k", 20)
        context = _context(params.get("context"), "parameters.context")
        seed = _optional_int(params.get("seed"), "parameters.seed")
        starts = np.r_[0, np.cumsum(lengths)]
        recs = [self.run(Query(int(u), _int(k, "parameters.k"), tuple(history[starts[i] : starts[i + 1]].tolist()), context, seed), False)
                for i, u in enumerate(users.tolist())]
        b, kk = len(users), int(k)
        items = np.full((b, kk), -1, np.int64)
        scores = np.zeros((b, kk), np.float32)
        sources = [["" for _ in range(kk)] for _ in range(b)]
        for i, rec in enumerate(recs):
            n = len(rec.items)
            items[i, :n], scores[i, :n] = rec.items, rec.scores
            sources[i][:n] = list(rec.sources)
        outputs = [
            {"name": "items", "datatype": "INT64", "shape": [b, kk], "data": items.ravel().tolist()},
            {"name": "scores", "datatype": "FP32", "shape": [b, kk], "data": [float(s) for s in scores.ravel()]},
            {"name": "sources", "datatype": "BYTES", "shape": [b, kk], "data": [s for row in sources for s in row]},
            {"name": "cold_start", "datatype": "BOOL", "shape": [b], "data": [r.cold_start for r in recs]},
        ]
        out: dict[str, Any] = {"model_name": self.name, "model_version": self.version, "outputs": outputs,
                               "parameters": {"notes": json.dumps([list(r.notes) for r in recs])}}
        if request.get("id") is not None:
            out["id"] = str(request["id"])
        return json.dumps(out, separators=(",", ":")).encode(), {"content-type": "application/json"}

    def add_interactions(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """/recommend/interactions: append items to the user's history (seen items) of this version."""
        unknown = sorted(set(body) - {"user", "items", "pipeline"})
        if unknown:
            raise RequestError(f"unknown field {unknown[0]!r}; /recommend/interactions takes 'user', 'items', 'pipeline'")
        user = _int(body.get("user"), "user")
        items = body.get("items")
        if not isinstance(items, list) or not items or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise RequestError(f"field 'items' must be a non-empty list of integer item ids, got {items!r}"[:200])
        self.pipeline.res.interactions.add(user, items)
        return {"user": user, "added": len(items)}

    def update_features(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """/recommend/features: overwrite columns of existing rows of a feature table of this version."""
        unknown = sorted(set(body) - {"table", "ids", "columns", "pipeline"})
        if unknown:
            raise RequestError(f"unknown field {unknown[0]!r}; /recommend/features takes 'table', 'ids', 'columns', 'pipeline'")
        table, ids, columns = body.get("table"), body.get("ids"), body.get("columns")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise RequestError("field 'ids' must be a non-empty list of integer ids")
        if not isinstance(columns, dict) or not columns:
            raise RequestError("field 'columns' must map column names to lists of numbers, one per id")
        arrays = {}
        for name, values in columns.items():
            if not isinstance(values, list) or len(values) != len(ids) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                raise RequestError(f"field 'columns.{name}' must be a list of {len(ids)} numbers")
            arrays[str(name)] = np.asarray(values)
        try:
            self.pipeline.res.features.update(str(table), np.asarray(ids, np.int64), arrays)
        except ValueError as e:
            raise RequestError(f"field 'table' / 'ids' / 'columns': {e}") from None
        return {"table": table, "updated": len(ids)}

    def metadata(self) -> dict[str, Any]:
        return {
            "platform": PLATFORM,
            "inputs": [
                {"name": "user", "datatype": "INT64", "shape": [-1]},
                {"name": "history", "datatype": "INT64", "shape": [-1], "optional": True},
                {"name": "history.lengths", "datatype": "INT64", "shape": [-1], "optional": True},
            ],
            "outputs": [
                {"name": "items", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
                {"name": "sources", "datatype": "BYTES", "shape": [-1, -1]},
                {"name": "cold_start", "datatype": "BOOL", "shape": [-1]},
            ],
            "stages": [n for n in STAGE_NAMES if n in {type(s).__name__.lower() for s in self.pipeline.spec.stages}],
        }


def parse_recommend(body: Mapping[str, Any]) -> tuple[Query, bool]:
    """The /recommend JSON object -> (Query, debug); RequestError naming the first bad field."""
    unknown = sorted(set(body) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}; /recommend takes {list(REQUEST_KEYS)}")
    if "user" not in body:
        raise RequestError("field 'user' (an integer id) is required")
    user = _int(body["user"], "user")
    k = _int(body.get("k", 20), "k")
    history = body.get("history", [])
    if not isinstance(history, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in history):
        raise RequestError(f"field 'history' must be a list of integer item ids, got {history!r}"[:200])
    debug = body.get("debug", False)
    if not isinstance(debug, bool):
        raise RequestError(f"field 'debug' must be true or false, got {debug!r}")
    return Query(user, k, tuple(history), _context(body.get("context"), "context"), _optional_int(body.get("seed"), "seed")), debug


def _int(v: object, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"field {name!r} must be an integer, got {v!r}"[:200])
    return v


def _optional_int(v: object, name: str) -> int | None:
    return None if v is None else _int(v, name)


def _context(v: object, name: str) -> dict[str, float]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise RequestError(f"field {name!r} must be an object of numbers, got {v!r}"[:200])
    out = {}
    for key, value in v.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RequestError(f"field '{name}.{key}' must be a finite number, got {value!r}"[:200])
        out[str(key)] = float(value)
    return out
