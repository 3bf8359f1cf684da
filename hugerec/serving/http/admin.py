"""The admin API: load and unload model versions, canary share, promote, roll back.

    POST /v2/repository/index                  loaded models and versions
    POST /v2/repository/models/{m}/load        {"bundle": path, "version"?: v} (also as parameters.config JSON,
                                               what tritonclient's load_model(config=...) sends)
    POST /v2/repository/models/{m}/load_delta  {"delta": path, "base": v0, "version": v}: v = v0 + a version delta
                                               (bundles/version_delta.py); v0 is only read
    POST /v2/repository/models/{m}/unload      {"version": v}: neither the stable version nor the canary (400);
                                               404 for a version not loaded; answers once v's requests in
                                               flight are answered (versions.py)
    GET  /admin/models/{m}                     stable, canary, share, history
    POST /admin/models/{m}/canary              {"version": v, "share": 0.1}
    POST /admin/models/{m}/promote             {"version"?: v}   (default: the canary)
    POST /admin/models/{m}/rollback            drop the canary, else back to the previous stable

A load (load, load_delta) that takes longer than ServerConfig.load_deadline_s is refused (400) and what
it loaded is never served (isolated_load.py); the server serves what it served meanwhile.

Off (403) unless the server has an admin token; then every call needs "Authorization: Bearer <token>" (auth.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from hugerec.serving.bundles.isolated_load import LoadDeadline, within_deadline
from hugerec.serving.http.auth import TokenScope, check_token
from hugerec.serving.runtime.inference_protocol import RequestError, parse_json

if TYPE_CHECKING:
    from hugerec.serving.http.server import InferenceServer


def admin_router(server: InferenceServer) -> APIRouter:
    router = APIRouter()

    @router.post("/v2/repository/index")
    async def repository_index(request: Request) -> list[dict[str, str]]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        return [
            {"name": name, "version": v, "state": "READY"}
            for name, vs in server.models.items()
            for v in vs.versions()
        ]

    @router.post("/v2/repository/models/{name}/load")
    async def load(name: str, request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        body = _load_parameters(await server.json_body(request))
        bundle = body.get("bundle")
        if not isinstance(bundle, str) or not bundle:
            raise RequestError("load needs {'bundle': '<path of an exported bundle>', 'version'?: '<v>'}")
        version = body.get("version")
        deadline = LoadDeadline(server.config.load_deadline_s)  # refused past it, whatever the kind
        try:  # loading reads files and fills the parameter server: keep serving meanwhile
            served = await within_deadline(deadline, server.add_bundle, bundle, name, None if version is None else str(version))
        except RequestError:
            raise
        except (ValueError, FileNotFoundError, FileExistsError, ImportError) as e:  # ImportError: a missing optional extra
            raise RequestError(f"cannot load {bundle!r}: {e}") from None
        return {"name": name, "version": served.version, **server.model_versions(name).status()}

    @router.post("/v2/repository/models/{name}/load_delta")
    async def load_delta(name: str, request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        body = await server.json_body(request)
        delta, base, version = body.get("delta"), body.get("base"), body.get("version")
        if not all(isinstance(v, str) and v for v in (delta, base, version)):
            raise RequestError("load_delta needs {'delta': '<path of a version delta>', 'base': '<v>', 'version': '<v>'}")
        deadline = LoadDeadline(server.config.load_deadline_s)
        try:  # checks files and copies the base's rows: keep serving meanwhile
            served = await within_deadline(deadline, server.add_version_delta, str(delta), name, str(base), str(version))
        except RequestError:
            raise  # an unknown model or base version (404), a kind that takes no deltas (400)
        except (ValueError, FileNotFoundError) as e:
            raise RequestError(f"cannot load the version delta {delta!r}: {e}") from None
        return {"name": name, "version": served.version, **server.model_versions(name).status()}

    @router.post("/v2/repository/models/{name}/unload")
    async def unload(name: str, request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        body = _load_parameters(await server.json_body(request))
        version = body.get("version")
        if version is None:
            raise RequestError("unload needs {'version': '<v>'}")
        try:  # waits for its requests in flight, stops its update watcher, closes its stores: off the event loop
            await asyncio.to_thread(server.unload, name, str(version))
        except RequestError:
            raise  # an unknown model: 404
        except KeyError as e:
            raise RequestError(f"field 'version': {e.args[0]}", status=404) from None
        except ValueError as e:
            raise RequestError(f"field 'version': {e.args[0]}") from None
        return server.model_versions(name).status()

    @router.get("/admin/models/{name}")
    async def status(name: str, request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        return server.model_versions(name).status()

    @router.post("/admin/models/{name}/canary")
    async def canary(name: str, request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        body = await server.json_body(request)
        versions = server.model_versions(name)
        share = body.get("share")
        if "version" not in body or not isinstance(share, int | float) or isinstance(share, bool):
            raise RequestError("canary needs {'version': '<v>', 'share': <0..1>}")
        if not 0 <= share <= 1:  # compared before float(): an integer of any size compares
            raise RequestError(f"field 'share' must be in [0, 1], got {share}"[:200])
        try:
            versions.set_canary(str(body["version"]), float(share))
        except (KeyError, ValueError) as e:
            raise RequestError(str(e.args[0])) from None
        return versions.status()

    @router.post("/admin/models/{name}/promote")
    async def promote(name: str, request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        body = await server.json_body(request)
        versions = server.model_versions(name)
        try:
            versions.promote(None if body.get("version") is None else str(body["version"]))
        except (KeyError, ValueError) as e:
            raise RequestError(str(e.args[0])) from None
        return versions.status()

    @router.post("/admin/models/{name}/rollback")
    async def rollback(name: str, request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        versions = server.model_versions(name)
        try:
            versions.rollback()
        except ValueError as e:
            raise RequestError(str(e)) from None
        return versions.status()

    return router


def _load_parameters(body: dict[str, Any]) -> dict[str, Any]:
    """Triton's load API sends {"parameters": {"config": "<JSON>"}}; plain {"bundle": ...} works too."""
    params = body.get("parameters")
    if isinstance(params, dict):
        config = params.get("config")
        if isinstance(config, str):
            try:
                parsed = parse_json(config.encode())
            except (json.JSONDecodeError, UnicodeEncodeError) as e:
                raise RequestError(f"parameters.config is not valid JSON: {e}") from None
            if not isinstance(parsed, dict):
                raise RequestError("parameters.config must be a JSON object")
            return parsed
        return {k: v for k, v in params.items() if k != "config"}
    return body
