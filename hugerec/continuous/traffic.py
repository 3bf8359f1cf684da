"""Simulated users: rows of a window sent to a server's /predict, then their labels as feedback; a bounded
background load that records which version answered each request and when.

What the tests, the benchmark and `hugerec loop --simulate` use to put traffic and feedback through a
running server while the loop publishes, promotes and rolls back.

Across a schema change (a column added or removed between windows) the simulated clients send what
`sent_schema` says: the window's own columns that a live version takes, dense features by name. A
version ignores the fields only another live version takes, and a row one version cannot take (it
lacks a column that version needs) is answered by the other of stable and canary (serving/server.py).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np
import pyarrow as pa

from hugerec.continuous.window_schema import adapt_schema
from hugerec.data.schema import ColumnKind, Schema


@dataclass
class Replay:
    """What a replay saw: answers per version, failed requests (anything but 200) and their messages."""

    answered: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    feedback_accepted: int = 0
    feedback_unknown: int = 0


def sent_schema(schema: Schema, rows: pa.Table, live: Sequence[Schema], time_column: str, where: str) -> Schema:
    """The columns simulated clients send for `rows`: the window's own (adapt_schema of the configured `schema`)
    that one of the `live` versions' schemas (stable, canary) takes, and the labels (for feedback). A client
    starts sending a new column once a version that reads it is live (before, the server refuses it as a
    field no version takes). No live version: the window's columns as they are."""
    window = adapt_schema(schema, rows, time_column, where)
    if not live:
        return window
    taken = {name for s in live for name in s.names}
    return Schema(tuple(c for c in window.columns if c.kind is ColumnKind.LABEL or c.name in taken))


def instances(table: pa.Table, schema: Schema) -> list[dict[str, object]]:
    """/predict instances of the rows: {"d0": x, ..., "c0": [id], ...} (dense by name, ids as one-id lists)."""
    cols = {n: table[n].to_numpy(zero_copy_only=False) for n in (*schema.dense_names, *schema.sparse_names)}
    dense = schema.dense_names
    return [
        {**{d: float(cols[d][i]) for d in dense}, **{s: [int(cols[s][i])] for s in schema.sparse_names}}
        for i in range(table.num_rows)
    ]


def replay(
    url: str,
    model: str,
    table: pa.Table,
    schema: Schema,
    batch: int = 32,
    feedback: bool = True,
    client: httpx.Client | None = None,
    token: str | None = None,
) -> Replay:
    """Send `table`'s rows in requests of `batch` rows; with feedback, post every answered row's label (POST
    /feedback takes the server's ingest or admin `token`; a refused post is counted as a failure)."""
    out = Replay()
    own = client is None
    http = client or httpx.Client(timeout=60)
    labels = table[schema.label_names[0]].to_numpy(zero_copy_only=False).astype(np.float64)
    rows = instances(table, schema)
    try:
        for s in range(0, len(rows), batch):
            try:
                r = http.post(f"{url}/predict", json={"model": model, "instances": rows[s : s + batch]})
            except httpx.HTTPError as e:
                out.failed += 1
                out.errors.append(f"rows {s}..: {e}")
                continue
            if r.status_code != 200:
                out.failed += 1
                out.errors.append(f"rows {s}..: HTTP {r.status_code}: {r.text[:200]}")
                continue
            answer = r.json()
            out.answered[answer["model_version"]] += 1
            ids = answer.get("request_ids")
            if feedback and ids:
                body = {
                    "labels": [
                        {"request_id": rid, "label": float(y)}
                        for rid, y in zip(ids, labels[s : s + batch], strict=True)
                    ]
                }
                headers = {"authorization": f"Bearer {token}"} if token else None
                f = http.post(f"{url}/feedback", json=body, headers=headers)
                if f.status_code == 200:
                    out.feedback_accepted += f.json()["accepted"]
                    out.feedback_unknown += f.json()["unknown"]
                else:
                    out.failed += 1
                    out.errors.append(f"feedback of rows {s}..: HTTP {f.status_code}: {f.text[:200]}")
    finally:
        if own:
            http.close()
    return out


@dataclass(frozen=True)
class Answer:
    """One answered request: when it was sent and received (unix seconds) and the version that answered."""

    sent: float
    received: float
    version: str


class BackgroundLoad:
    """A bounded request load from a thread: one `batch`-row /predict of `rows` at a time, `pause_s` apart,
    until stopped (a context manager). Keeps every answer and every failure (anything but 200)."""

    def __init__(
        self, url: str, model: str, rows: list[dict[str, object]], batch: int = 4, pause_s: float = 0.01
    ) -> None:
        if len(rows) < batch or batch < 1:
            raise ValueError(f"BackgroundLoad: needs batch >= 1 and at least batch rows, got {batch}, {len(rows)} rows")
        self.url, self.model, self.rows, self.batch, self.pause_s = url, model, rows, batch, pause_s
        self.answers: list[Answer] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as http:
            i = 0
            while not self._stop.is_set():
                s = i % (len(self.rows) - self.batch + 1)
                sent = time.time()
                try:
                    r = http.post(
                        f"{self.url}/predict", json={"model": self.model, "instances": self.rows[s : s + self.batch]}
                    )
                    if r.status_code == 200:
                        self.answers.append(Answer(sent, time.time(), r.json()["model_version"]))
                    else:
                        self.failed.append(f"HTTP {r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                i += self.batch
                self._stop.wait(self.pause_s)

    def versions(self) -> Counter[str]:
        return Counter(a.version for a in self.answers)

    def outside(self, live: Mapping[str, Sequence[tuple[float, float]]]) -> list[Answer]:
        """The answers from a version that was not live (by `live`, decision_log.live_intervals) while in flight."""
        return [
            a
            for a in self.answers
            if not any(a.received >= start and a.sent <= end for start, end in live.get(a.version, ()))
        ]

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
