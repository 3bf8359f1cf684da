"""ServerObserver over a fake publisher and request-log files written as the server writes them: feedback is
joined to requests by id and KPIs given per role (the server's stable and canary), drift is measured only on
features both the reference and the log hold, and only on the versions that logged them all; files read once
are never counted again, even by a restarted observer; a window without requests or reference observes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hugerec.continuous.decisions import Observation
from hugerec.continuous.monitor import MonitorConfig
from hugerec.continuous.observer import ServerObserver
from hugerec.data.schema import Column, ColumnKind, Schema


class FakePublisher:
    """What the observer asks of a publisher: flush the server's logs, the model's status."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.flushes = 0
        self._status = status

    def flush_logs(self) -> None:
        self.flushes += 1

    def status(self) -> dict[str, Any]:
        return self._status


def _requests(n: int, version: str, start: int, seed: int, with_c0: bool = True) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns: dict[str, Any] = {
        "request_id": [f"r{start + i}" for i in range(n)],
        "version": [version] * n,
        "prediction": rng.random(n),
        "d0": rng.normal(size=n),
        "c0": pa.array(rng.integers(0, 5, n) if with_c0 else [None] * n, pa.int64()),
    }
    return pa.table(columns)


def _reference(n: int = 500) -> pa.Table:
    rng = np.random.default_rng(9)
    return pa.table({"d0": rng.normal(size=n), "c0": rng.integers(0, 5, n), "only_in_reference": rng.normal(size=n)})


def _observer(tmp_path: Path, publisher: FakePublisher, **kw: Any) -> ServerObserver:
    config = MonitorConfig()
    return ServerObserver(
        publisher, tmp_path / "logs", tmp_path / "work", ["d0", "only_in_reference"], ["c0"], config, png=False, **kw
    )  # type: ignore[arg-type]


def test_kpis_per_role_drift_and_a_report(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(
        pa.concat_tables([_requests(200, "1", 0, 0), _requests(100, "2", 200, 1)]), logs / "requests-0001.parquet"
    )
    labels = np.random.default_rng(3).integers(0, 2, 300).astype(np.float64)
    pq.write_table(
        pa.table({"request_id": [f"r{i}" for i in range(300)], "label": labels}), logs / "feedback-0001.parquet"
    )
    publisher = FakePublisher({"stable": "1", "canary": "2"})
    observer = _observer(tmp_path, publisher)
    obs = observer(4, _reference())
    assert publisher.flushes == 1
    assert obs.kpis["stable"].count == 200 and obs.kpis["canary"].count == 100
    assert obs.kpis["stable"].ctr == pytest.approx(labels[:200].mean())
    assert set(obs.drift) == {"d0", "c0"}  # no prediction drift: the reference carries no predictions
    assert "only_in_reference" not in obs.drift  # the log does not hold it
    assert (tmp_path / "work" / "reports" / "window-4.prom").is_file()
    assert observer.reports[0].window == 4 and observer.reports[0].rows == 300


def test_files_are_read_once_even_after_a_restart(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(_requests(50, "1", 0, 0), logs / "requests-0001.parquet")
    publisher = FakePublisher({"stable": "1"})
    assert _observer(tmp_path, publisher)(0, _reference()).drift  # the first window reads the file
    again = _observer(tmp_path, publisher)  # a restarted loop: observed.json remembers the file
    assert again(1, _reference()) == Observation()
    pq.write_table(_requests(30, "1", 50, 1), logs / "requests-0002.parquet")
    again(2, _reference())
    assert again.reports[-1].rows == 30


def test_nothing_to_observe(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    observer = _observer(tmp_path, FakePublisher({}))
    assert observer(0, _reference()) == Observation()  # no request files
    pq.write_table(_requests(10, "1", 0, 0), tmp_path / "logs" / "requests-0001.parquet")
    assert observer(1, None) == Observation()  # no reference yet
    assert observer.reports == []


def test_drift_skips_a_version_that_does_not_take_a_feature(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # version 2 was trained without c0: it logs nulls in c0 for every row
    pq.write_table(
        pa.concat_tables([_requests(100, "1", 0, 0), _requests(400, "2", 100, 1, with_c0=False)]),
        logs / "requests-0001.parquet",
    )
    schema = Schema(
        (Column("label", ColumnKind.LABEL), Column("d0", ColumnKind.DENSE), Column("c0", ColumnKind.SPARSE))
    )
    observer = _observer(tmp_path, FakePublisher({"stable": "1", "canary": "2"}), window_schema=lambda k: schema)
    obs = observer(0, _reference())
    assert observer.reports[0].rows == 100  # only version 1's rows logged every watched feature
    assert obs.drift["c0"] < 0.25  # its c0 is drawn as the reference's: no drift read from version 2's nulls
