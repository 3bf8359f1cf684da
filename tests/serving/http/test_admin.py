"""The admin routes one by one, on a served toy model: repository index and status, the canary share's bounds,
promote and roll back with nothing to do, unload's refusals (404 for an unknown version, 400 for the stable one),
load's and load_delta's bad bodies; each refusal a 4xx naming the field or value, never a 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig

TOKEN = "a" * 24


@pytest.fixture(scope="module")
def admin(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    srv = InferenceServer(
        ServerConfig(admin_token=TOKEN, seed=0), ServeOptions(state_dir=str(tmp_path_factory.mktemp("admin")))
    )
    srv.add_bundle(toy.bundle)
    with BackgroundServer(srv) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c
    srv.close()


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"])


def test_index_and_status(admin: httpx.Client) -> None:
    assert admin.post("/v2/repository/index").json() == [{"name": "toy", "version": "1", "state": "READY"}]
    status = admin.get("/admin/models/toy").json()
    assert status["stable"] == "1" and status["canary"] is None
    assert "nope" in _error(admin.get("/admin/models/nope"), 404)


def test_every_route_needs_the_token(admin: httpx.Client) -> None:
    url = str(admin.base_url)
    for method, path in [
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/toy/load"),
        ("POST", "/v2/repository/models/toy/load_delta"),
        ("POST", "/v2/repository/models/toy/unload"),
        ("GET", "/admin/models/toy"),
        ("POST", "/admin/models/toy/canary"),
        ("POST", "/admin/models/toy/promote"),
        ("POST", "/admin/models/toy/rollback"),
    ]:
        r = httpx.request(method, url + path, headers={"Authorization": "Bearer " + "b" * 24})
        assert r.status_code == 401, (path, r.text)
        assert "Bearer" in r.json()["error"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"version": "1"}, "canary needs {'version'"),
        ({"share": 0.5}, "canary needs {'version'"),
        ({"version": "1", "share": True}, "canary needs {'version'"),
        ({"version": "1", "share": [0.5]}, "canary needs {'version'"),
        ({"version": "1", "share": 1.5}, "field 'share' must be in [0, 1], got 1.5"),
        ({"version": "1", "share": 7}, "field 'share' must be in [0, 1], got 7"),
        ({"version": "1", "share": 2**70}, "field 'share': an integer of 22 digits"),
        ({"version": "9", "share": 0.5}, "no version '9'"),
        ({"version": "1", "share": 0.5}, "version '1' is the stable one"),
    ],
)
def test_bad_canary_bodies_are_400_naming_the_field(admin: httpx.Client, body: dict[str, Any], needle: str) -> None:
    assert needle in _error(admin.post("/admin/models/toy/canary", json=body), 400)


def test_a_share_of_5000_digits_is_400_naming_the_field(admin: httpx.Client) -> None:
    content = '{"version": "1", "share": ' + "1" * 5000 + "}"
    r = admin.post("/admin/models/toy/canary", content=content, headers={"Content-Type": "application/json"})
    assert "field 'share': an integer of 5000 digits" in _error(r, 400)


def test_promote_and_rollback_with_nothing_to_do_are_400(admin: httpx.Client) -> None:
    assert "no canary to promote" in _error(admin.post("/admin/models/toy/promote", json={}), 400)
    assert "nothing to roll back" in _error(admin.post("/admin/models/toy/rollback"), 400)
    assert admin.get("/admin/models/toy").json()["stable"] == "1"


def test_unload_refusals(admin: httpx.Client) -> None:
    assert "unload needs {'version'" in _error(admin.post("/v2/repository/models/toy/unload", json={}), 400)
    assert "field 'version'" in _error(admin.post("/v2/repository/models/toy/unload", json={"version": "7"}), 404)
    assert "field 'version'" in _error(admin.post("/v2/repository/models/toy/unload", json={"version": "1"}), 400)
    assert admin.post("/v2/repository/index").json() == [{"name": "toy", "version": "1", "state": "READY"}]


def test_load_refusals_name_the_path(admin: httpx.Client, tmp_path: Path) -> None:
    load = "/v2/repository/models/toy/load"
    assert "load needs {'bundle'" in _error(admin.post(load, json={"bundle": ""}), 400)
    assert "load needs {'bundle'" in _error(admin.post(load, json={"bundle": 3}), 400)
    missing = str(tmp_path / "missing")
    assert f"cannot load {missing!r}" in _error(admin.post(load, json={"bundle": missing}), 400)
    bad_json = {"parameters": {"config": "{not json"}}
    assert "parameters.config is not valid JSON" in _error(admin.post(load, json=bad_json), 400)
    delta = "/v2/repository/models/toy/load_delta"
    assert "load_delta needs {'delta'" in _error(admin.post(delta, json={"delta": "d", "base": "1"}), 400)
    assert "load_delta needs {'delta'" in _error(admin.post(delta, json={"delta": "d", "base": 1, "version": "2"}), 400)


def test_load_reads_tritons_config_form(admin: httpx.Client, tmp_path: Path) -> None:
    """tritonclient's load_model(config=...) sends {"parameters": {"config": "<JSON>"}}: read as the plain body."""
    load = "/v2/repository/models/toy/load"
    missing = str(tmp_path / "nowhere")
    config = {"parameters": {"config": json.dumps({"bundle": missing})}}
    assert f"cannot load {missing!r}" in _error(admin.post(load, json=config), 400)
    listed = {"parameters": {"config": "[1, 2]"}}
    assert "parameters.config must be a JSON object" in _error(admin.post(load, json=listed), 400)
    unload = {"parameters": {"version": "7"}}  # other parameters are read as the body's keys
    assert "field 'version'" in _error(admin.post("/v2/repository/models/toy/unload", json=unload), 404)
