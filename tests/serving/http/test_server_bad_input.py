"""#28's bad input, one test case each: every one was a 5xx (or a silent cast) and is now a 4xx naming the field
and the limit, over real HTTP against a server with a model, a pipeline and a request log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from hugerec.serving.http.request_log import RequestLogConfig
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.pipeline.served_pipeline import ServedPipeline

from ..pipeline.test_served_pipeline import build

ADMIN = "a" * 16
INGEST = "i" * 16
BIG = "1" + "0" * 400  # 10**400
HUGE = "7" * 5000  # past CPython's 4,300-digit limit of int(str)
AS_ADMIN = {"authorization": f"Bearer {ADMIN}"}
AS_INGEST = {"authorization": f"Bearer {INGEST}"}


@pytest.fixture(scope="module")
def server(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, InferenceServer]]:
    tmp = tmp_path_factory.mktemp("bad")
    srv = InferenceServer(ServerConfig(admin_token=ADMIN, ingest_token=INGEST, seed=0))
    srv.add_bundle(build(toy, tmp / "recs"))
    srv.add_bundle(toy.bundle, name="toy")
    srv.enable_request_log(RequestLogConfig(str(tmp / "log"), seed=0))
    with BackgroundServer(srv) as url:
        yield url, srv
    srv.close()


def fill(template: str, value: object) -> str:
    """The JSON text `template` with its @ replaced by `value` written out (integers too large for json.dumps)."""
    return template.replace("@", str(value))


def _user_tensor(datatype: str, value: str) -> str:
    return fill(fill('{"inputs": [{"name": "user", "datatype": "#", "shape": [1], "data": [@]}]}', value).replace("#", "@"), datatype)


CASES: list[tuple[str, str, str, dict[str, str], int, str]] = [
    # (case, path, body, headers, status, what the error names)
    ("integer of 5000 digits in /recommend", "/recommend", fill('{"user": @}', HUGE), {}, 400, "field 'user': an integer of 5000 digits (7777777777777777777777777777777777777777...); JSON integers must fit in 64 bits"),
    ("integer of 30 digits in /predict (a float to orjson)", "/predict", fill('{"model": "toy", "instances": [{"user": [@]}]}', 10**29 + 7), {}, 400,
     "field 'instances[0].user[0]': an integer of 30 digits (100000000000000000000000000007)"),
    ("integer of 5000 digits in infer", "/v2/models/toy/infer", fill('{"inputs": [], "id": @}', HUGE), {}, 400, "field 'id': an integer of 5000 digits"),
    ("integer of 5000 digits in /predict", "/predict", fill('{"model": "toy", "instances": [{"user": [@]}]}', HUGE), {}, 400, "field 'instances[0].user[0]': an integer of 5000 digits"),
    ("integer of 5000 digits in pipeline infer", "/v2/models/recs/infer", _user_tensor("INT64", HUGE), {}, 400, "field 'inputs[0].data[0]': an integer of 5000 digits"),
    ("10**400 as /feedback label", "/feedback", fill('{"labels": [{"request_id": "x", "label": @}]}', BIG), AS_INGEST, 400, "field 'labels[0].label': an integer of 401 digits"),
    ("10**400 in /recommend context", "/recommend", fill('{"user": 3, "context": {"hour": @}}', BIG), {}, 400, "field 'context.hour': an integer of 401 digits"),
    ("10**400 in pipeline parameters.context", "/v2/models/recs/infer",
     fill('{"inputs": [{"name": "user", "datatype": "INT64", "shape": [1], "data": [3]}], "parameters": {"context": {"hour": @}}}', BIG),
     {}, 400, "field 'parameters.context.hour': an integer of 401 digits"),
    ("10**400 as canary share", "/admin/models/toy/canary", fill('{"version": "1", "share": @}', BIG), AS_ADMIN, 400, "field 'share': an integer of 401 digits"),
    ("10**400 in /recommend/features", "/recommend/features",
     fill('{"table": "item", "ids": [1], "columns": {"available": [@]}}', BIG), AS_ADMIN, 400, "field 'columns.available[0]': an integer of 401 digits"),
    ("2**64 - 1 in /recommend/features columns", "/recommend/features",
     fill('{"table": "item", "ids": [1], "columns": {"available": [@]}}', (2**64 - 1)), AS_ADMIN, 200, ""),
    ("item id 2**63 in /recommend/features", "/recommend/features",
     fill('{"table": "item", "ids": [@], "columns": {"available": [1]}}', 2**63), AS_ADMIN, 400, "field 'ids[0]' = 9223372036854775808 is outside the int64 range"),
    ("item id 2**63 in /recommend/interactions", "/recommend/interactions", fill('{"user": 3, "items": [@]}', 2**63), AS_INGEST, 400, "field 'items[0]' = 9223372036854775808 is outside the int64 range"),
    ('"pipeline": ["x"] in /recommend/interactions', "/recommend/interactions", '{"pipeline": ["x"], "user": 3, "items": [1]}', AS_INGEST, 400, "field 'pipeline' must be a string"),
    ("/recommend user 2**63", "/recommend", fill('{"user": @}', 2**63), {}, 400, "field 'user' = 9223372036854775808 is outside the int64 range"),
    ("/recommend user 10**400", "/recommend", fill('{"user": @}', BIG), {}, 400, "field 'user': an integer of 401 digits"),
    ("/recommend history [2**63]", "/recommend", fill('{"user": 3, "history": [@]}', 2**63), {}, 400, "field 'history[0]' = 9223372036854775808 is outside the int64 range"),
    ("/recommend seed -1", "/recommend", '{"user": 3, "seed": -1}', {}, 400, "field 'seed' = -1 must be an integer in 0..2**63 - 1"),
    ("/recommend k past the pipeline's max_k", "/recommend", fill('{"user": 3, "k": @}', (2**63 - 1)), {}, 400, "field 'k' = 9223372036854775807 must be an integer in 1..50"),
    ("/recommend history past max_history", "/recommend", json.dumps({"user": 3, "history": list(range(1001))}), {}, 413, "field 'history' has 1001 ids; this server takes at most 1000"),
    ("pipeline user FP32 NaN", "/v2/models/recs/infer", _user_tensor("FP32", "NaN"), {}, 400, "input 'user' must hold integers"),
    ("pipeline user 1e300", "/v2/models/recs/infer", _user_tensor("FP64", "1e300"), {}, 400, "input 'user' must hold integers"),
    ("pipeline user 2**64 - 1 as UINT64", "/v2/models/recs/infer", _user_tensor("UINT64", str(2**64 - 1)), {}, 400, "input 'user' has values above the int64 range"),
    ("pipeline users past max_users", "/v2/models/recs/infer",
     json.dumps({"inputs": [{"name": "user", "datatype": "INT64", "shape": [257], "data": list(range(257))}]}), {}, 413,
     "input 'user' has 257 users; this server takes at most 256"),
    ("pipeline history past max_history", "/v2/models/recs/infer", json.dumps({"inputs": [
        {"name": "user", "datatype": "INT64", "shape": [1], "data": [3]},
        {"name": "history", "datatype": "INT64", "shape": [1001], "data": list(range(1001))},
        {"name": "history.lengths", "datatype": "INT64", "shape": [1], "data": [1001]}]}), {}, 413,
     "a user has 1001 history ids; this server takes at most 1000"),
    ("/feedback labels past max_request_rows", "/feedback", json.dumps({"labels": [{"request_id": "x", "label": 1}] * 65537}), AS_INGEST, 413,
     "field 'labels' has 65537 labels; this server takes at most 65536"),
    ("1e400 as /feedback label", "/feedback", '{"labels": [{"request_id": "x", "label": 1e400}]}', AS_INGEST, 400, "field 'labels[0].label' must be in [0, 1], got inf"),
    ("2**63 as canary share", "/admin/models/toy/canary", fill('{"version": "1", "share": @}', 2**63), AS_ADMIN, 400, "field 'share' must be in [0, 1]"),
    ("a JSON body past max_json_bytes", "/recommend", fill('{"user": 3, "history": [@]}', ",".join(["1"] * (4 << 20))), {}, 413,
     "exceeds the limit of 8388608"),
]


@pytest.mark.parametrize(("case", "path", "body", "headers", "status", "says"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_4xx_naming_the_field_and_the_limit(
    server: tuple[str, InferenceServer], case: str, path: str, body: str, headers: dict[str, str], status: int, says: str
) -> None:
    url, _ = server
    r = httpx.post(f"{url}{path}", content=body.encode(), headers={"content-type": "application/json", **headers}, timeout=60)
    assert r.status_code == status, (case, r.text[:300])
    if says:
        assert says in r.json()["error"], (case, r.text[:300])


def test_kserve_routes_of_a_pipeline_answer_and_load_delta_naming_it_is_a_400(server: tuple[str, InferenceServer]) -> None:
    url, _ = server
    r = httpx.get(f"{url}/v2/models/recs/config")
    assert r.status_code == 200 and r.json()["max_batch_size"] == 256
    r = httpx.post(f"{url}/v2/repository/models/recs/load_delta", json={"delta": "/x", "base": "1", "version": "2"}, headers=AS_ADMIN)
    assert r.status_code == 400 and "does not support version deltas" in r.json()["error"]


def test_a_stage_failing_on_its_own_is_a_500_and_one_that_cannot_reach_a_store_a_503(server: tuple[str, InferenceServer]) -> None:
    """A 503 tells a load balancer the server is busy or cut off; a stage's own bug is a 500 (and input never
    reaches a stage unchecked: the cases above)."""
    url, srv = server
    served = srv.model_versions("recs").get("1")
    assert isinstance(served, ServedPipeline)
    features = served.pipeline.res.features
    real = features.store

    def failing(error: Exception) -> Any:
        class Failing:
            name, dims = real.name, real.dims

            def get(self, table: str, keys: np.ndarray) -> Any:
                raise error

        return Failing()

    try:
        features.store = failing(ConnectionError("redis is down"))
        r = httpx.post(f"{url}/recommend", json={"user": 3})
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and "ConnectionError: redis is down" in r.json()["error"]
        features.store = failing(IndexError("a bug"))
        r = httpx.post(f"{url}/recommend", json={"user": 3})
        assert r.status_code == 500 and "IndexError: a bug" in r.json()["error"]
    finally:
        features.store = real
    assert httpx.post(f"{url}/recommend", json={"user": 3}).status_code == 200


def test_a_content_length_of_40_digits_is_a_400(server: tuple[str, InferenceServer]) -> None:
    import socket

    host, port = server[0].removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: " + b"9" * 40 + b"\r\n\r\n{}")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400"), answer
