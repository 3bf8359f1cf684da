"""A sample of answered /predict requests and the feedback that labels them, as rotated Parquet files.

    <dir>/requests-<seq>.parquet   request_id, ts, model, version, prediction, one column per dense
                                   feature (float32), one per sparse feature (its first id; null if none)
    <dir>/feedback-<seq>.parquet   request_id, label, ts

Every row answered gets a request id (returned by /predict as "request_ids"); a share `sample` of
them is logged. Feedback (POST /feedback {"labels": [{"request_id": id, "label": 0 or 1}, ...]}, an ingest
token) is kept for ids of logged requests issued within the last `feedback_window_s`, once per id: the first
label of an id wins, a later one (in the same post or another) is counted as a duplicate and dropped, so a
client repeating labels cannot weigh a version's KPIs. Any other id is counted and dropped, never an error:
unknown (never issued, not sampled, or older than the last `remember` logged ones) or expired (issued
before the window). The counts are in the answer and in hugerec_feedback_total{result}. Buffers are written
when they reach `rotate_rows` rows and on `flush()` (POST /admin/logs/flush), each file under a temporary
name then renamed: a reader sees whole files only. A monitor joins the two by request_id.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry, Counter

from hugerec.serving.runtime.model_inputs import ModelInputs


@dataclass
class FeedbackCounts:
    """What became of the labels of one /feedback post."""

    accepted: int = 0
    unknown: int = 0
    duplicate: int = 0
    expired: int = 0


@dataclass(frozen=True)
class RequestLogConfig:
    directory: str
    sample: float = 1.0
    rotate_rows: int = 100_000
    remember: int = 1_000_000
    seed: int | None = None
    feedback_window_s: float = 3600.0

    def __post_init__(self) -> None:
        if not self.directory:
            raise ValueError("RequestLogConfig: directory must be a folder path, got an empty string")
        if not 0 < self.sample <= 1:
            raise ValueError(f"RequestLogConfig: sample must be in (0, 1], got {self.sample}")
        if not 0 < self.feedback_window_s <= 30 * 86400:
            raise ValueError(f"RequestLogConfig: feedback_window_s must be in (0, 30 days], got {self.feedback_window_s}")
        if self.rotate_rows < 1 or self.remember < 1:
            raise ValueError(
                f"RequestLogConfig: rotate_rows and remember must be >= 1, got {self.rotate_rows}, {self.remember}"
            )


class RequestLog:
    def __init__(self, config: RequestLogConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.directory = Path(config.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._rng = np.random.default_rng(config.seed)
        self._lock = threading.Lock()
        self._requests: list[pa.Table] = []
        self._request_rows = 0
        self._feedback: list[tuple[str, float, float]] = []
        self._known: OrderedDict[str, float] = OrderedDict()  # logged request id -> when it was issued
        self._labelled: set[str] = set()  # ids of _known that have their label
        existing = sorted(self.directory.glob("*-*.parquet"))
        self._seq = 1 + max((int(p.stem.rsplit("-", 1)[1]) for p in existing), default=-1)
        self.logged = Counter(
            "hugerec_logged_requests", "Requests written to the request log", ["model", "version"], registry=registry
        )
        self.feedback = Counter("hugerec_feedback", "Feedback labels received", ["result"], registry=registry)

    def record(
        self, model: str, version: str, inputs: ModelInputs, scores: np.ndarray, dense_names: tuple[str, ...] | None
    ) -> list[str]:
        """Request ids for the B answered rows; logs the sampled ones."""
        b = inputs.batch_size
        ids = [uuid.uuid4().hex for _ in range(b)]
        with self._lock:
            keep = np.flatnonzero(self._rng.random(b) < self.config.sample)
        if keep.size == 0:
            return ids
        cols: dict[str, Any] = {
            "request_id": pa.array([ids[i] for i in keep]),
            "ts": pa.array(np.full(keep.size, time.time())),
            "model": pa.array([model] * keep.size),
            "version": pa.array([version] * keep.size),
            "prediction": pa.array(np.asarray(scores, np.float32).reshape(-1)[keep]),
        }
        names = dense_names or tuple(f"dense_{j}" for j in range(inputs.dense.shape[1]))
        for j, name in enumerate(names):
            cols[name] = pa.array(inputs.dense[keep, j].astype(np.float32))
        for feature, (values, lengths) in inputs.ids.items():
            starts = np.zeros(b, np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            first = values[np.minimum(starts, max(values.size - 1, 0))] if values.size else np.zeros(b, np.int64)
            cols[feature] = pa.array(first[keep].astype(np.int64), mask=lengths[keep] == 0)
        table = pa.table(cols)
        with self._lock:
            self._requests.append(table)
            self._request_rows += table.num_rows
            now = time.time()
            for i in keep:
                self._known[ids[i]] = now
            while len(self._known) > self.config.remember:
                self._labelled.discard(self._known.popitem(last=False)[0])
            if self._request_rows >= self.config.rotate_rows:
                self._write_requests()
        self.logged.labels(model, version).inc(keep.size)
        return ids

    def add_feedback(self, labels: list[tuple[str, float]]) -> FeedbackCounts:
        """Keep the first label of each logged request id issued within the window; count the others."""
        now = time.time()
        counts = FeedbackCounts()
        with self._lock:
            accepted = []
            for rid, y in labels:
                issued = self._known.get(rid)
                if issued is None:
                    counts.unknown += 1
                elif now - issued > self.config.feedback_window_s:
                    counts.expired += 1
                elif rid in self._labelled:
                    counts.duplicate += 1
                else:
                    self._labelled.add(rid)
                    accepted.append((rid, y, now))
            counts.accepted = len(accepted)
            self._feedback.extend(accepted)
            if len(self._feedback) >= self.config.rotate_rows:
                self._write_feedback()
        for result, n in (("joined", counts.accepted), ("unknown", counts.unknown), ("duplicate", counts.duplicate),
                          ("expired", counts.expired)):
            self.feedback.labels(result).inc(n)
        return counts

    def flush(self) -> None:
        with self._lock:
            self._write_requests()
            self._write_feedback()

    def _write(self, kind: str, table: pa.Table) -> None:
        path = self.directory / f"{kind}-{self._seq:08d}.parquet"
        self._seq += 1
        tmp = self.directory / f".{path.name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)

    def _write_requests(self) -> None:
        if self._requests:
            self._write("requests", pa.concat_tables(self._requests, promote_options="default"))
            self._requests, self._request_rows = [], 0

    def _write_feedback(self) -> None:
        if self._feedback:
            rid, y, ts = zip(*self._feedback, strict=True)
            self._write(
                "feedback",
                pa.table(
                    {
                        "request_id": pa.array(rid),
                        "label": pa.array(np.array(y, np.float32)),
                        "ts": pa.array(np.array(ts)),
                    }
                ),
            )
            self._feedback = []
