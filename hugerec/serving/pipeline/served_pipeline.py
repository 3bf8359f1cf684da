"""A loaded pipeline behind HTTP: the friendly POST /recommend and a KServe v2 model.

    POST /recommend  {"user": 17, "k": 20, "history"?: [ids, oldest first], "history.times"?: [seconds, one per
                      history id], "context"?: {"hour": 9}, "pipeline"?: name, "version"?: v, "debug"?: false,
                      "seed"?: int}
      -> {"pipeline", "version", "user", "items": [...], "scores": [...], "sources": [...],
          "cold_start": bool, "notes": [...], "stages"?: {stage: {"items", "scores", "sources"}}, "seconds"?: {...}}

    POST /v2/models/{pipeline}/infer   inputs "user" INT64 [B]; optional "history" INT64 [N] with
      "history.lengths" INT64 [B] (and "history.times" INT64 [N]); parameters.k, parameters.context (an object
      of numbers)
      -> outputs "items" INT64 [B, k] (-1 past the end), "scores" FP32 [B, k], "sources" BYTES [B, k]
         (the retrieval source of each item, "" past the end), "cold_start" BOOL [B];
         parameters.notes: one list of notes per user (a short list is always explained there)

    POST /recommend/interactions  {"user": 17, "items": [ids], "times"?: [seconds], "pipeline"?: name}: the user
                                  has now seen these items (every loaded version of the pipeline takes them)
    POST /recommend/features      {"table": "item", "ids": [...], "columns": {"available": [...]}, "pipeline"?}:
                                  overwrite some columns of existing rows (admin token required)

Every bad field is a RequestError (4xx) naming it and its limit (QueryLimits: users per infer request,
history ids, k; ids within int64); a stage that fails is a StageError (the server answers 503 when it could
not reach a store, else 500).

Event times ("times", "history.times"): int64 seconds (integers within int64; anything else is a 400
naming the field), one per item, oldest first and never decreasing, none earlier than the user's latest
stored event (400 naming the field: training reads each user's events in time order, so a history whose
times go back is one the model never saw). A pipeline whose next-items model reads times (runner.py,
`needs_times`) requires them with every item posted and with a request's history (400 naming the field
when missing: never a time of 0); a pipeline without one checks them and keeps none, so one post serves a
version with times and another without side by side.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from hugerec.serving.pipeline.runner import STAGE_NAMES, PipelineRunner, Query, Recommendation
from hugerec.serving.runtime.inference_protocol import LiveFields, RequestError, decode_tensor, parse_json, split_body
from hugerec.serving.runtime.served_object import ServedObject

PLATFORM = "hugerec_pipeline"
REQUEST_KEYS = ("user", "k", "history", "history.times", "context", "pipeline", "version", "debug", "seed")
INFER_INPUTS = frozenset({"user", "history", "history.lengths", "history.times"})
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


@dataclass(frozen=True)
class QueryLimits:
    """What one request to a pipeline may ask (the server's RequestLimits give them): users per KServe v2 request
    (413 beyond), history ids per user and items per /recommend/interactions post (413 beyond), k (400 beyond;
    the pipeline's own Order.max_k may be lower)."""

    max_users: int = 256
    max_history: int = 1000
    max_k: int = 1000

    def __post_init__(self) -> None:
        for name in ("max_users", "max_history", "max_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"QueryLimits: {name} must be an integer >= 1, got {value!r}")


@dataclass(eq=False)
class ServedPipeline(ServedObject):
    """One loaded pipeline version, a served object (served_object.py): /recommend, the KServe v2 infer route,
    online updates of its seen-items and feature stores.

    work: the executor that runs pipelines (the server's, shared by every pipeline; None: asyncio's default).
    A KServe v2 request of B users runs as B tasks one after another, each queued behind at most one task of
    every other request in flight: a request of many users takes its turn with the others instead of
    holding the workers while small requests wait."""

    family: ClassVar[str] = "pipeline"
    platform: ClassVar[str] = PLATFORM

    name: str
    version: str
    pipeline: PipelineRunner
    metrics: PipelineMetrics | None = None
    info: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)
    limits: QueryLimits = field(default_factory=QueryLimits)
    work: Executor | None = None

    def __post_init__(self) -> None:
        # the server's k limit, or the pipeline's own (Order.max_k) when lower: the one a refusal names
        self.limits = replace(self.limits, max_k=min(self.limits.max_k, self.pipeline.order.max_k))

    @property
    def kind(self) -> str:
        return "pipeline"

    def max_rows(self) -> int:
        return self.limits.max_users

    def fields(self) -> LiveFields:
        return LiveFields(INFER_INPUTS, frozenset(REQUEST_KEYS), frozenset({0}))

    async def infer(self, body: bytes, header_length: str | None, live: LiveFields) -> tuple[bytes, dict[str, str]]:
        loop = asyncio.get_running_loop()
        request = await loop.run_in_executor(self.work, self.decode, body, header_length)
        recs = [await loop.run_in_executor(self.work, self.run, query, False) for query in request.queries]
        return await loop.run_in_executor(self.work, self.encode, request, recs)

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
        query, debug = parse_recommend(body, self.limits)
        rec = self.run(query, debug)
        return {"pipeline": self.name, "version": self.version, "user": query.user, **rec.to_json()}

    def answer(self, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
        """A KServe v2 infer request -> (JSON response body, headers), in the calling thread."""
        request = self.decode(body, header_length)
        return self.encode(request, [self.run(q, False) for q in request.queries])

    def decode(self, body: bytes, header_length: str | None) -> InferRequest:
        """A KServe v2 infer request -> its queries, one per user; RequestError naming the first bad input."""
        header_bytes, blob = split_body(body, header_length)
        try:
            request = parse_json(header_bytes)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"request body is not valid JSON: {e}") from None
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list) or not request["inputs"]:
            raise RequestError("request must be a JSON object with a non-empty list 'inputs'")
        limits = self.limits
        tensors: dict[str, np.ndarray] = {}
        offset = 0
        for i, spec in enumerate(request["inputs"]):
            # rows: users, or the history ids of all users together
            name, array, offset = decode_tensor(spec, i, blob, offset, limits.max_users * max(limits.max_history, 1))
            if name not in INFER_INPUTS:
                raise RequestError(f"unknown input {name!r}; a pipeline takes 'user' and optionally 'history' + 'history.lengths' (+ 'history.times')")
            if name in tensors:
                raise RequestError(f"input {name!r} is given twice")
            tensors[name] = _ids(array, name)
        if "user" not in tensors:
            raise RequestError("input 'user' (INT64 [B]) is required")
        users = tensors["user"].reshape(-1)
        if len(users) == 0:
            raise RequestError("input 'user' holds no users")
        if len(users) > limits.max_users:
            raise RequestError(f"input 'user' has {len(users)} users; this server takes at most {limits.max_users} per request", status=413)
        lengths = tensors.get("history.lengths", np.zeros(len(users), np.int64)).reshape(-1)
        history = tensors.get("history", np.zeros(0, np.int64)).reshape(-1)
        if len(lengths) != len(users) or (lengths < 0).any() or int(lengths.sum()) != len(history):
            raise RequestError(f"input 'history.lengths' must give one length >= 0 per user ({len(users)}) summing to the {len(history)} history ids")
        times = tensors.get("history.times")
        if times is not None and times.reshape(-1).shape != history.shape:
            raise RequestError(f"input 'history.times' has {times.size} times; it needs one per history id ({len(history)})")
        if len(lengths) and int(lengths.max()) > limits.max_history:
            raise RequestError(f"input 'history': a user has {int(lengths.max())} history ids; this server takes at most {limits.max_history}", status=413)
        params = request.get("parameters") or {}
        if not isinstance(params, dict):
            raise RequestError("'parameters' must be an object")
        unknown = sorted(set(params) - {"k", "context", "seed"})
        if unknown:
            raise RequestError(f"unknown parameter {unknown[0]!r}; a pipeline takes 'k', 'context' and 'seed'")
        k = _k(params.get("k", 20), "parameters.k", limits)
        context = _context(params.get("context"), "parameters.context")
        seed = _seed(params.get("seed"), "parameters.seed")
        starts = np.r_[0, np.cumsum(lengths)]
        flat_times = None if times is None else times.reshape(-1)
        queries = [
            Query(u, k, tuple(history[starts[i] : starts[i + 1]].tolist()), context, seed,
                  None if flat_times is None else tuple(flat_times[starts[i] : starts[i + 1]].tolist()))
            for i, u in enumerate(users.tolist())
        ]
        for q in queries:
            self.pipeline.check_query(q)
        return InferRequest(queries, k, None if request.get("id") is None else str(request["id"])[:256])

    def encode(self, request: InferRequest, recs: list[Recommendation]) -> tuple[bytes, dict[str, str]]:
        b, kk = len(recs), request.k
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
        if request.request_id is not None:
            out["id"] = request.request_id
        return json.dumps(out, separators=(",", ":")).encode(), {"content-type": "application/json"}

    def add_interactions(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """/recommend/interactions: append items to the user's history (seen items) of this version."""
        user, items, times = self._interactions(body)
        store = self.pipeline.res.interactions
        try:
            store.add(user, items, times if store.timed else None)  # a store without times keeps none
        except ValueError as e:
            raise RequestError(f"field 'times': {e}"[:300]) from None  # times going back (a post since the check)
        return {"user": user, "added": len(items)}

    def check_interactions(self, body: Mapping[str, Any]) -> None:
        self._interactions(body)

    def _interactions(self, body: Mapping[str, Any]) -> tuple[int, list[int], list[int] | None]:
        """A /recommend/interactions body -> (user, items, times); RequestError naming the first bad field,
        times going back before the user's latest stored one included."""
        unknown = sorted(set(body) - {"user", "items", "times", "pipeline"})
        if unknown:
            raise RequestError(f"unknown field {unknown[0]!r}; /recommend/interactions takes 'user', 'items', 'times', 'pipeline'")
        user = _id(body.get("user"), "user")
        items = _id_list(body.get("items"), "items", self.limits.max_history)
        if not items:
            raise RequestError("field 'items' must be a non-empty list of integer item ids")
        times = None if body.get("times") is None else _times(body["times"], "times", len(items))
        store = self.pipeline.res.interactions
        if not store.timed:  # no model here reads times: checked above, not kept
            return user, items, times
        if times is None:
            model = self.pipeline.res.sequential
            raise RequestError(
                f"field 'times' is required: next-items bundle {model.name if model else '?'!r} of pipeline {self.name!r} reads "
                "each event's time (int64 seconds, one per item)"
            )
        stored = store.history(user)[1]
        if stored is not None and len(stored) and times[0] < int(stored[-1]):
            raise RequestError(f"field 'times': times[0] = {times[0]} is earlier than user {user}'s latest event time {int(stored[-1])}: events go in time order")
        return user, items, times

    def update_features(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """/recommend/features: overwrite columns of existing rows of a feature table of this version."""
        unknown = sorted(set(body) - {"table", "ids", "columns", "pipeline"})
        if unknown:
            raise RequestError(f"unknown field {unknown[0]!r}; /recommend/features takes 'table', 'ids', 'columns', 'pipeline'")
        table, ids, columns = body.get("table"), body.get("ids"), body.get("columns")
        if not isinstance(table, str):
            raise RequestError(f"field 'table' must be a table name, got {table!r}"[:200])
        ids = _id_list(ids, "ids", None)
        if not ids:
            raise RequestError("field 'ids' must be a non-empty list of integer ids")
        if not isinstance(columns, dict) or not columns:
            raise RequestError("field 'columns' must map column names to lists of numbers, one per id")
        arrays = {}
        for name, values in columns.items():
            if not isinstance(values, list) or len(values) != len(ids) or not all(_finite(v) for v in values):
                raise RequestError(f"field 'columns.{name}' must be a list of {len(ids)} finite numbers (within float64)"[:200])
            arrays[str(name)] = np.asarray(values, np.float64)
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
                *([{"name": "history.times", "datatype": "INT64", "shape": [-1], "optional": True}] if self.pipeline.needs_times else []),
            ],
            "outputs": [
                {"name": "items", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "scores", "datatype": "FP32", "shape": [-1, -1]},
                {"name": "sources", "datatype": "BYTES", "shape": [-1, -1]},
                {"name": "cold_start", "datatype": "BOOL", "shape": [-1]},
            ],
            "stages": [n for n in STAGE_NAMES if n in {type(s).__name__.lower() for s in self.pipeline.spec.stages}],
            # the user's most recent items the models read, and why that many: "declared" ([pipeline] max_history,
            # each model handed that many) or "models" (the longest a model reads: each reads its own length)
            "max_history": self.pipeline.max_history,
            "max_history_from": self.pipeline.history_from,
        }


def parse_recommend(body: Mapping[str, Any], limits: QueryLimits | None = None) -> tuple[Query, bool]:
    """The /recommend JSON object -> (Query, debug); RequestError naming the first bad field."""
    limits = limits or QueryLimits()
    unknown = sorted(set(body) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}; /recommend takes {list(REQUEST_KEYS)}"[:300])
    if "user" not in body:
        raise RequestError("field 'user' (an integer id) is required")
    user = _id(body["user"], "user")
    k = _k(body.get("k", 20), "k", limits)
    history = _id_list(body.get("history", []), "history", limits.max_history)
    times = None if body.get("history.times") is None else tuple(_times(body["history.times"], "history.times", len(history)))
    debug = body.get("debug", False)
    if not isinstance(debug, bool):
        raise RequestError(f"field 'debug' must be true or false, got {debug!r}"[:200])
    return Query(user, k, tuple(history), _context(body.get("context"), "context"), _seed(body.get("seed"), "seed"), times), debug


@dataclass(frozen=True)
class InferRequest:
    """A decoded KServe v2 request of a pipeline: one query per user."""

    queries: list[Query]
    k: int
    request_id: str | None


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _id(v: object, name: str) -> int:
    """An id: an integer within int64 (what the stores and indexes hold)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"field {name!r} must be an integer id, got {v!r}"[:200])
    if not INT64_MIN <= v <= INT64_MAX:
        raise RequestError(f"field {name!r} = {v} is outside the int64 range of ids (-2**63 .. 2**63 - 1)"[:200])
    return v


def _id_list(v: object, name: str, max_len: int | None) -> list[int]:
    if not isinstance(v, list):
        raise RequestError(f"field {name!r} must be a list of integer ids, got {v!r}"[:200])
    if max_len is not None and len(v) > max_len:
        raise RequestError(f"field {name!r} has {len(v)} ids; this server takes at most {max_len}", status=413)
    for i, x in enumerate(v):
        _id(x, f"{name}[{i}]")
    return v


def _times(v: object, name: str, n: int) -> list[int]:
    """Event times: a list of n integers within int64 (seconds), one per item of the same request."""
    if not isinstance(v, list):
        raise RequestError(f"field {name!r} must be a list of integer seconds, one per item, got {v!r}"[:200])
    if len(v) != n:
        raise RequestError(f"field {name!r} has {len(v)} times for {n} items (one each)")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int):
            raise RequestError(f"field '{name}[{i}]' must be an integer (seconds), got {x!r}"[:200])
        if not INT64_MIN <= x <= INT64_MAX:
            raise RequestError(f"field '{name}[{i}]' = {x} is outside the int64 range of times"[:200])
        if i and x < v[i - 1]:
            raise RequestError(f"field '{name}[{i}]' = {x} is earlier than {name}[{i - 1}] = {v[i - 1]}: events go oldest first"[:200])
    return v


def _k(v: object, name: str, limits: QueryLimits) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limits.max_k:
        raise RequestError(f"field {name!r} = {v!r} must be an integer in 1..{limits.max_k}"[:200])
    return v


def _seed(v: object, name: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT64_MAX:
        raise RequestError(f"field {name!r} = {v!r} must be an integer in 0..2**63 - 1"[:200])
    return v


def _finite(v: object) -> bool:
    """A JSON number that is a finite float64 (an integer beyond float64's range is not)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    if isinstance(v, int):
        return -1.7e308 <= v <= 1.7e308  # compared as ints: float(v) of a larger one raises
    return math.isfinite(v)


def _ids(array: np.ndarray, name: str) -> np.ndarray:
    """An infer input of ids -> int64; floats (NaN, 1e300) are refused, never cast."""
    if array.dtype.kind not in "iu":
        raise RequestError(f"input {name!r} must hold integers (INT64 or another integer type), got {array.dtype}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > INT64_MAX:
        raise RequestError(f"input {name!r} has values above the int64 range")
    return array.astype(np.int64, copy=False)


def _context(v: object, name: str) -> dict[str, float]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise RequestError(f"field {name!r} must be an object of numbers, got {v!r}"[:200])
    out = {}
    for key, value in v.items():
        if not _finite(value):
            raise RequestError(f"field '{name}.{key}' must be a finite number (within float64), got {value!r}"[:200])
        out[str(key)] = float(value)
    return out
