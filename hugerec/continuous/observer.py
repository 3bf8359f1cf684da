"""The loop's eyes on a running server: its request log and feedback -> a monitor report per window.

ServerObserver(k, reference) asks the server to flush its request log, reads the request and
feedback files it has not read before (their names are kept in <work_dir>/observed.json, so a
restarted loop does not count them twice), joins feedback to requests by request_id, maps versions
to roles (the server's stable and canary) and returns the monitor's Observation; the report is also
written as <report_dir>/window-<k>.prom (Prometheus text) and window-<k>.png.

The features watched for drift in window k: those of `window_schema(k)` (the schema the loop trains on
window k, window_schema.adapt_schema; without it the configured `numeric` and `categorical` names) that
both the reference and the logged requests hold. While versions of two schemas share the traffic, each
logs only the features it takes (the log's files fill the others with nulls): drift is then measured on
the rows of the versions that logged every watched feature (the stable version always does: it was
trained on the reference's columns), so a feature one version does not take never reads as "missing".
KPIs use every labelled row of each role.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hugerec.continuous.decisions import Observation
from hugerec.continuous.monitor import MonitorConfig, Reference, Report, report, write_png, write_prometheus
from hugerec.continuous.publish import Publisher
from hugerec.data.schema import Schema


class ServerObserver:
    def __init__(
        self,
        publisher: Publisher,
        log_dir: str | Path,
        work_dir: str | Path,
        numeric: Sequence[str],
        categorical: Sequence[str],
        config: MonitorConfig | None = None,
        png: bool = True,
        window_schema: Callable[[int], Schema] | None = None,
    ) -> None:
        self.publisher = publisher
        self.log_dir = Path(log_dir)
        self.work_dir = Path(work_dir)
        self.numeric, self.categorical = tuple(numeric), tuple(categorical)
        self.config = config or MonitorConfig()
        self.png = png
        self.window_schema = window_schema
        self._seen_path = self.work_dir / "observed.json"
        self.seen: set[str] = set(json.loads(self._seen_path.read_text())) if self._seen_path.exists() else set()
        self.reports: list[Report] = []

    def _new(self, kind: str) -> tuple[list[Path], pa.Table | None]:
        files = sorted(p for p in self.log_dir.glob(f"{kind}-*.parquet") if p.name not in self.seen)
        tables = [pq.read_table(p) for p in files]
        return files, (pa.concat_tables(tables, promote_options="default") if tables else None)

    def __call__(self, k: int, reference: pa.Table | None) -> Observation:
        self.publisher.flush_logs()
        status = self.publisher.status() or {}
        req_files, requests = self._new("requests")
        fb_files, feedback = self._new("feedback")
        if requests is None or reference is None:
            return Observation()
        labelled = None
        if feedback is not None:
            labelled = requests.join(feedback.select(["request_id", "label"]), "request_id", join_type="inner")
        roles = {status[r]: r for r in ("stable", "canary") if status.get(r) is not None}
        numeric, categorical = self._features(k, reference, requests)
        ref = Reference.of(reference, numeric, categorical, self.config)
        rep = report(k, ref, _logged_all(requests, (*numeric, *categorical)), roles, labelled)
        write_prometheus(rep, self.work_dir / "reports" / f"window-{k}.prom")
        if self.png:
            write_png(rep, self.work_dir / "reports" / f"window-{k}.png")
        self.reports.append(rep)
        self.seen.update(p.name for p in (*req_files, *fb_files))
        tmp = self._seen_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(self.seen)))
        os.replace(tmp, self._seen_path)
        return rep.observation()

    def _features(self, k: int, reference: pa.Table, requests: pa.Table) -> tuple[list[str], list[str]]:
        """(numeric, categorical) features watched in window k (the module docstring says which)."""
        if self.window_schema is not None:
            schema = self.window_schema(k)
            numeric, categorical = schema.dense_names, schema.sparse_names
        else:
            numeric, categorical = self.numeric, self.categorical
        both = set(reference.column_names) & set(requests.column_names)
        return [n for n in numeric if n in both], [n for n in categorical if n in both]


def _logged_all(requests: pa.Table, features: Sequence[str]) -> pa.Table:
    """The rows of the versions that logged every one of `features` (a version logs each feature it takes, a
    sparse one null only for an empty bag: a feature null in every row of a version is one it does not take)."""
    if not any(requests[f].null_count for f in features):  # one schema: every row (the usual case, no scan)
        return requests
    keep = []
    for version in pc.unique(requests["version"]).to_pylist():
        rows = requests.filter(pc.equal(requests["version"], version))
        if all(rows[f].null_count < rows.num_rows for f in features):
            keep.append(version)
    return requests.filter(pc.is_in(requests["version"], pa.array(keep, requests["version"].type)))
