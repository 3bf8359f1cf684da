"""Simulated users: rows of a window sent to a server's /predict, then their labels as feedback.

What the tests, the benchmark and `hugerec loop --simulate` use to put traffic and feedback through a
running server while the loop publishes, promotes and rolls back.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import httpx
import numpy as np
import pyarrow as pa

from hugerec.data.schema import Schema


@dataclass
class Replay:
    """What a replay saw: answers per version, failed requests (anything but 200) and their messages."""

    answered: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    feedback_accepted: int = 0
    feedback_unknown: int = 0


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
) -> Replay:
    """Send `table`'s rows in requests of `batch` rows; with feedback, post every answered row's label."""
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
                f = http.post(f"{url}/feedback", json=body)
                if f.status_code == 200:
                    out.feedback_accepted += f.json()["accepted"]
                    out.feedback_unknown += f.json()["unknown"]
    finally:
        if own:
            http.close()
    return out
