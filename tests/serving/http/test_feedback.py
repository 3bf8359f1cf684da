"""The request log's routes: POST /feedback (ingest token) joins labels to logged request ids and counts what it
refused; bad label lists are 4xx naming the item; a server without a request log answers 409; /admin/logs/flush
writes the buffered rows to Parquet (admin token)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.http.limits import RequestLimits
from hugerec.serving.http.request_log import RequestLogConfig
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.runtime.model_inputs import ModelInputs

ADMIN, INGEST = "a" * 24, "i" * 24


@pytest.fixture(scope="module")
def served(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InferenceServer, str, Path]]:
    logs = tmp_path_factory.mktemp("logs")
    srv = InferenceServer(
        ServerConfig(admin_token=ADMIN, ingest_token=INGEST, limits=RequestLimits(max_request_rows=4)),
        ServeOptions(state_dir=str(tmp_path_factory.mktemp("state"))),
    )
    srv.add_bundle(toy.bundle)
    srv.enable_request_log(RequestLogConfig(str(logs), seed=0))
    with BackgroundServer(srv) as url:
        yield srv, url, logs
    srv.close()


def _logged(srv: InferenceServer, n: int) -> list[str]:
    assert srv.request_log is not None
    inputs = ModelInputs(np.zeros((n, 4), np.float32), {"user": (np.arange(n, dtype=np.int64), np.ones(n, np.int32))})
    return list(srv.request_log.record("toy", "1", inputs, np.zeros(n), None))


def _post(url: str, body: Any, token: str = INGEST) -> httpx.Response:
    return httpx.post(f"{url}/feedback", json=body, headers={"Authorization": f"Bearer {token}"})


def test_feedback_is_joined_and_counted(served: tuple[InferenceServer, str, Path]) -> None:
    srv, url, logs = served
    ids = _logged(srv, 3)
    body = {
        "labels": [
            {"request_id": ids[0], "label": 1},
            {"request_id": ids[0], "label": 0},
            {"request_id": "x", "label": 0.5},
        ]
    }
    r = _post(url, body)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 1, "unknown": 1, "duplicate": 1, "expired": 0}
    assert _post(url, {"labels": []}).json() == {"accepted": 0, "unknown": 0, "duplicate": 0, "expired": 0}
    flushed = httpx.post(f"{url}/admin/logs/flush", headers={"Authorization": f"Bearer {ADMIN}"})
    assert flushed.status_code == 200 and flushed.json() == {"directory": str(logs)}
    labels = pq.read_table(next(logs.glob("feedback-*.parquet")))
    assert labels["request_id"].to_pylist() == [ids[0]] and labels["label"].to_pylist() == [1.0]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({}, 400, "feedback needs {'labels'"),
        ({"labels": {"request_id": "r"}}, 400, "feedback needs {'labels'"),
        (
            {"labels": [{"request_id": "r", "label": 0}] * 5},
            413,
            "field 'labels' has 5 labels; this server takes at most 4",
        ),
        ({"labels": [{"request_id": "r", "label": 0}, 3]}, 400, "labels[1] must be {'request_id'"),
        ({"labels": [{"request_id": 7, "label": 0}]}, 400, "labels[0] must be {'request_id'"),
        ({"labels": [{"request_id": "r", "label": True}]}, 400, "labels[0] must be {'request_id'"),
        ({"labels": [{"request_id": "r", "label": [1]}]}, 400, "labels[0] must be {'request_id'"),
        ({"labels": [{"request_id": "r", "label": 2}]}, 400, "field 'labels[0].label' must be in [0, 1], got 2"),
        ({"labels": [{"request_id": "r", "label": -0.5}]}, 400, "field 'labels[0].label' must be in [0, 1], got -0.5"),
    ],
)
def test_bad_label_lists_are_4xx_naming_the_item(
    served: tuple[InferenceServer, str, Path], body: dict[str, Any], status: int, needle: str
) -> None:
    r = _post(served[1], body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_a_label_of_5000_digits_is_refused(served: tuple[InferenceServer, str, Path]) -> None:
    content = '{"labels": [{"request_id": "r", "label": ' + "9" * 5000 + "}]}"
    r = httpx.post(
        f"{served[1]}/feedback",
        content=content,
        headers={"Authorization": f"Bearer {INGEST}", "Content-Type": "application/json"},
    )
    assert 400 <= r.status_code < 500, r.text


def test_tokens_are_scoped(served: tuple[InferenceServer, str, Path]) -> None:
    _, url, _ = served
    assert _post(url, {"labels": []}, token="z" * 24).status_code == 401
    # the ingest token opens /feedback, not the admin's flush
    assert httpx.post(f"{url}/admin/logs/flush", headers={"Authorization": f"Bearer {INGEST}"}).status_code == 401


def test_a_server_without_a_request_log_answers_409(toy: Any, tmp_path: Path) -> None:
    srv = InferenceServer(ServerConfig(admin_token=ADMIN, ingest_token=INGEST), ServeOptions(state_dir=str(tmp_path)))
    srv.add_bundle(toy.bundle)
    try:
        with BackgroundServer(srv) as url:
            r = _post(url, {"labels": []})
            assert r.status_code == 409 and "keeps no request log" in r.json()["error"]
            flush = httpx.post(f"{url}/admin/logs/flush", headers={"Authorization": f"Bearer {ADMIN}"})
            assert flush.status_code == 409
    finally:
        srv.close()
