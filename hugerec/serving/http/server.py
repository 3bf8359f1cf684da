"""InferenceServer: FastAPI + uvicorn, speaking the Open Inference Protocol v2 (KServe / Triton).

    GET  /v2                                   server metadata
    GET  /v2/health/live | /v2/health/ready    liveness, readiness (every model has a stable version)
    GET  /v2/models/{m}[/versions/{v}]         model metadata (inputs, outputs, versions)
    GET  /v2/models/{m}[/versions/{v}]/ready   model readiness
    GET  /v2/models/{m}/config                 Triton-style config (max batch size, dynamic batching)
        (without /versions/{v} these three describe the stable version, whatever share a canary takes)
    POST /v2/models/{m}[/versions/{v}]/infer   typed tensors, JSON or the binary extension (runtime/inference_protocol.py)
    POST /predict                              {"instances": [raw feature dicts], "model"?: m} -> scores
    POST /recommend                            {"user": id, "k": 20, ...} -> a pipeline's items (pipeline/served_pipeline.py)
    GET  /metrics                              Prometheus
    GET  /, /status, /status/details           the status page (status_page.py; details need the admin token)
  admin (load/unload versions, canary, promote, rollback): see admin.py
  request log and feedback (when enable_request_log was called): see feedback.py

Bad requests get a 4xx JSON {"error": message}; the server never answers 500 to bad input. Every request is
bounded before work on it starts (limits.py, connection_limits.py: the README's table of limits); write
routes take a token (auth.py).

Versions of one model trained on different schemas (a whole-bundle canary after a schema change) share
the traffic: a version ignores request fields only another loaded version takes (inference_protocol.LiveFields),
and a request the version it was routed to cannot take goes to the other of stable and canary
(_routed) unless it names its version.

Every name serves versions of one kind of served object (runtime/served_object.py: a deep model, GBM trees, a
next-items model or a pipeline). The routes ask the version they route to: a route its kind does not answer
(/predict of a pipeline, /recommend of a model, a version delta of trees) is a 400 saying so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from hugerec.serving.bundles.any_bundle import LoadSettings, open_served
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.isolated_load import DEFAULT_LOAD_DEADLINE_S, commit_load
from hugerec.serving.bundles.pipeline_bundle import PipelineOptions
from hugerec.serving.bundles.version_delta import derive_version, read_version_delta
from hugerec.serving.http.admin import admin_router
from hugerec.serving.http.auth import Tokens, TokenScope, check_token
from hugerec.serving.http.connection_limits import guarded_protocol
from hugerec.serving.http.feedback import feedback_router
from hugerec.serving.http.limits import (
    Admission,
    RequestLimits,
    error_headers,
    header_dict,
    overloaded,
    read_asgi_body,
    read_request_body,
)
from hugerec.serving.http.prometheus_metrics import ServerMetrics
from hugerec.serving.http.request_log import RequestLog, RequestLogConfig
from hugerec.serving.http.status_page import StatusPage
from hugerec.serving.http.versions import ModelVersions
from hugerec.serving.pipeline.runner import StageError
from hugerec.serving.pipeline.served_pipeline import PipelineMetrics, QueryLimits
from hugerec.serving.runtime.batching import BatchingConfig, DynamicBatcher, QueueFull
from hugerec.serving.runtime.inference_model import InferenceModel
from hugerec.serving.runtime.inference_protocol import HEADER_LENGTH, RequestError, dump_json, parse_json
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
from hugerec.serving.runtime.served_model import Scorer, ServedModel
from hugerec.serving.runtime.served_object import ServedObject

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVER_NAME = "hugerec"
_HEADER_LENGTH_KEY = HEADER_LENGTH.lower().encode("latin-1")
_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
PLATFORM = "hugerec_pytorch"
_UNCOUNTED = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})  # no work: never refused for overload


@dataclass(frozen=True)
class ServerConfig:
    """host/port to bind (loopback by default); limits on requests and connections (http/limits.py
    RequestLimits, the README's table); the tokens of the write routes (http/auth.py): admin_token opens the
    admin API and every write, ingest_token only /feedback and /recommend/interactions (without a token a
    scope is off: 403). pipeline_threads: the threads that run pipelines (None: one per CPU, at least 2).
    load_deadline_s: the longest an admin load (any bundle kind) may take, and a GBM model file's check by its
    library in a child process (isolated_load.py); past it the load is refused and the server serves what it
    served.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    admin_token: str | None = None
    ingest_token: str | None = None
    seed: int | None = None  # canary routing; None: random
    pipeline_threads: int | None = None
    load_deadline_s: float = DEFAULT_LOAD_DEADLINE_S

    def __post_init__(self) -> None:
        if not 0 < self.load_deadline_s <= 86400:
            raise ValueError(f"ServerConfig: load_deadline_s must be in (0, 86400] seconds, got {self.load_deadline_s}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"ServerConfig: port must be in 0..65535, got {self.port}")
        if not isinstance(self.limits, RequestLimits):
            raise ValueError(f"ServerConfig: limits must be a RequestLimits, got {type(self.limits).__name__}")
        if self.pipeline_threads is not None and not 1 <= self.pipeline_threads <= 256:
            raise ValueError(f"ServerConfig: pipeline_threads must be in 1..256, got {self.pipeline_threads}")
        Tokens(self.admin_token, self.ingest_token)  # ValueError naming a token too short, or both equal

    @property
    def tokens(self) -> Tokens:
        return Tokens(self.admin_token, self.ingest_token)


class InferenceServer:
    """Serves names, each with versions of one served object kind (runtime/served_object.py); `app` is the ASGI
    app, `run()` binds it. Every route asks the version it routes to, never which kind it holds.

    options: how bundles loaded by `add_bundle` (and the admin load endpoint) are served.
    """

    def __init__(self, config: ServerConfig | None = None, options: ServeOptions | None = None) -> None:
        self.config = config or ServerConfig()
        self.options = options or ServeOptions()
        self.models: dict[str, ModelVersions] = {}  # every served name: scoring models, next-items models, pipelines
        self.metrics = ServerMetrics()
        self.pipeline_options = PipelineOptions(ranker=self.options)
        self.pipeline_metrics = PipelineMetrics(self.metrics.registry)
        self._lock = threading.Lock()
        self._close_on_shutdown = False
        self.request_log: RequestLog | None = None  # enable_request_log: /predict rows logged, /feedback taken
        self.tokens = self.config.tokens
        self.limits = self.config.limits
        self.admission = Admission(self.limits)
        threads = self.config.pipeline_threads or max(2, os.cpu_count() or 1)
        self.pipeline_work = ThreadPoolExecutor(threads, thread_name_prefix="pipeline")
        self.status = StatusPage(self)  # GET /: status.show_decision_log(path) adds a loop's decisions
        self.app = self._build_app()

    def enable_request_log(self, config: RequestLogConfig) -> RequestLog:
        """Log a sample of /predict rows and take feedback for them (http/request_log.py)."""
        self.request_log = RequestLog(config, self.metrics.registry)
        return self.request_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app uvicorn runs: inference requests are answered here on raw ASGI messages, skipping
        the framework's request/response objects and middleware (most of the cost of a one-example
        request); the rest goes to FastAPI. Past `max_requests` in flight a request is answered 503 with
        Retry-After at once (health checks and /metrics excepted: they do no work)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in _UNCOUNTED:
            await self.app(scope, receive, send)
            return
        if not self.admission.enter(scope):
            e = overloaded(f"{self.limits.max_requests} requests are in flight", self.limits)
            self._observe("-", "-", "overload", 503, time.perf_counter())
            await _send(send, 503, error_headers(503, self.limits), _error_body(e, 503))
            return
        try:
            if path == "/recommend":
                if scope["method"] == "POST":
                    await self._recommend_asgi(scope, receive, send)
                else:
                    await JSONResponse({"error": "method not allowed: use POST"}, status_code=405)(scope, receive, send)
                return
            match = _INFER_PATH.fullmatch(path)
            if match is not None and scope["method"] == "POST":
                await self._infer_asgi(match["name"], match["version"], scope, receive, send)
                return
            if match is not None:  # the infer path takes POST only
                await JSONResponse({"error": "method not allowed: use POST"}, status_code=405)(scope, receive, send)
                return
            await self.app(scope, receive, send)
        finally:
            self.admission.leave(scope)

    async def _read(self, scope: Scope, receive: Receive, binary: bool) -> bytes | None:
        """A raw-ASGI request's body within the limits (binary: it may carry binary tensors)."""
        limits = self.limits
        max_bytes = limits.max_request_bytes if binary else limits.max_json_bytes
        return await read_asgi_body(scope, receive, max_bytes, limits.body_timeout_s, self.admission)

    async def _infer_asgi(self, name: str, version: str | None, scope: Scope, receive: Receive, send: Send) -> None:
        header_length = None
        for key, value in scope["headers"]:
            if key == _HEADER_LENGTH_KEY:
                header_length = value.decode("latin-1")
        t0, code, served_version = time.perf_counter(), 200, version or "-"
        holds: list[ServedObject] = []  # the routed version and a fallback that answered: released after answering
        try:
            versions = self.model_versions(name)
            served = self._hold(versions, version, holds)
            served_version = served.version
            if header_length is not None and header_length.isdigit() and int(header_length) > self.limits.max_json_bytes:
                raise RequestError(
                    f"{HEADER_LENGTH} {header_length}: the JSON header exceeds the limit of {self.limits.max_json_bytes} bytes",
                    status=413,
                )
            body = await self._read(scope, receive, header_length is not None)
            if body is None:
                code = 499  # the client went away: nobody to answer
                return
            live = versions.fields()
            served, (payload, headers) = await _routed(
                versions, served, version is not None, lambda s: s.infer(body, header_length, live), holds
            )
            served_version = served.version
            raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        except Exception as e:
            code = _status(e)
            payload, raw = _error_body(e, code), error_headers(code, self.limits)
        finally:
            _release(self.models.get(name), holds)
            if code != 499:
                self._observe(name, served_version, "infer", code, t0)
        await _send(send, code, raw, payload)

    async def _recommend_asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /recommend on raw ASGI messages, like infer: the body parsed by orjson, the pipeline run off the
        event loop, the answer written by orjson (the framework's request, routing and JSONResponse cost more
        than the pipeline's own filter, score and order stages together)."""
        t0, code, name, served_version = time.perf_counter(), 200, "-", "-"
        try:
            raw_body = await self._read(scope, receive, False)
            if raw_body is None:
                code = 499
                return
            body = _json_object(raw_body)
            versions = self._recommender(body.get("pipeline"))
            version = body.get("version")
            served = self._route(versions, None if version is None else str(version))
            name, served_version = served.name, served.version
            answer = await asyncio.get_running_loop().run_in_executor(self.pipeline_work, served.recommend, body)
            payload, raw = dump_json(answer), [(b"content-type", b"application/json")]
        except Exception as e:
            code = _status(e)
            payload, raw = _error_body(e, code), error_headers(code, self.limits)
        finally:
            if code != 499:
                self._observe(name, served_version, "recommend", code, t0)
        await _send(send, code, raw, payload)

    # -- loading -----------------------------------------------------------------------------
    def add_bundle(self, path: str | Path, name: str | None = None, version: str | None = None) -> ServedObject:
        """Load any bundle and serve it as a version of `name` (name and version default to the manifest's), through
        the one loading path (bundles/any_bundle.py: the manifest's kind says what it holds) with this server's
        options, limits, batching and metrics."""
        served = open_served(path, self._load_settings(), name, version)
        self._serve(served)  # closed when it cannot be served
        ps = served.parameter_server()
        if ps is not None:
            self.metrics.parameter_servers.add(served.name, served.version, ps)
        return served

    def _load_settings(self) -> LoadSettings:
        updates = self.metrics.updates
        return LoadSettings(
            options=self.options,
            pipeline=self.pipeline_options,
            batching=self.config.batching,
            max_request_rows=self.limits.max_request_rows,
            deadline_s=self.config.load_deadline_s,
            query_limits=QueryLimits(self.limits.max_users, self.limits.max_history, self.limits.max_k),
            pipeline_metrics=self.pipeline_metrics,
            pipeline_work=self.pipeline_work,
            batch_observer=self.metrics.batch_observer,
            on_update=lambda name, version: lambda result: updates.labels(name, version, result).inc(),
        )

    def add_model(
        self,
        name: str,
        version: str,
        model: Scorer,
        preprocess: RequestPreprocessor | None = None,
        closers: Sequence[Callable[[], None]] = (),
        info: dict[str, Any] | None = None,
        bundle_model: InferenceModel | None = None,
    ) -> ServedModel:
        """Serve a scoring model (InferenceModel or GBMModel) as version `version` of `name`, behind a dynamic
        batcher (the first version of a name becomes stable). bundle_model: the same model when it was loaded
        from a model bundle, so that version deltas apply to it."""
        signature = model.signature(self.limits.max_request_rows)
        batcher = DynamicBatcher(
            model.predict, self.config.batching, self.metrics.batch_observer(name, version), name=f"{name}:{version}"
        )
        served = ServedModel(
            name,
            version,
            model,
            batcher,
            signature,
            preprocess or RequestPreprocessor(signature),
            dict(info or {}),
            [batcher.close, *closers],  # no model call runs once the stores close
            bundle_model,
        )
        try:
            self._serve(served, close_on_error=False)
        except ValueError:
            batcher.close()  # the caller closes what it loaded
            raise
        ps = served.parameter_server()
        if ps is not None:
            self.metrics.parameter_servers.add(name, version, ps)
        return served

    def add_version_delta(self, path: str | Path, name: str, base: str, version: str) -> ServedModel:
        """Serve `base` + the version delta at `path` as a new version `version` of `name` (bundles/version_delta.py);
        the base version is only read. The new version waits for set_canary / promote like a loaded bundle."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", version):
            raise ValueError(f"version {version!r}: use letters, digits, '_', '.' and '-' (at most 128)")
        versions = self.model_versions(name)
        if version in versions:
            raise ValueError(f"model {name!r}: version {version!r} is already loaded")
        try:
            served_base = versions.get(base)
        except KeyError as e:
            raise RequestError(f"field 'base': {e.args[0]}", status=404) from None
        target = served_base.delta_base()  # Unsupported (400) for a kind that takes no deltas
        delta = read_version_delta(path)
        if delta.base_version != base:
            raise ValueError(f"version delta {path} was made against version {delta.base_version!r}, not {base!r}")
        derived = derive_version(target.model, target.preprocess, target.info, delta, version, self.options)
        try:
            return self.add_model(
                name, version, derived.model, derived.preprocess, [derived.close], derived.info, derived.model
            )
        except BaseException:
            derived.close()
            raise

    def _serve(self, served: ServedObject, close_on_error: bool = True) -> ServedObject:
        """Add a loaded version under its name (ValueError: the version is loaded, or the name serves another
        family; the version is then closed unless close_on_error is False)."""
        with self._lock:
            versions = self.models.setdefault(served.name, ModelVersions(served.name, self.config.seed))
        try:
            commit_load()  # an admin load past its deadline is refused here (bundles/isolated_load.py)
            versions.add(served)
        except ValueError:
            if close_on_error:
                served.close()
            raise
        return served

    def unload(self, name: str, version: str) -> None:
        """Unload a version that is neither stable nor canary, once the requests it is answering are done."""
        served = self.model_versions(name).remove(version)
        self.metrics.parameter_servers.remove(name, version)
        served.close()

    def close(self) -> None:
        for versions in self.models.values():
            versions.close()
        self.pipeline_work.shutdown(wait=False, cancel_futures=True)

    # -- routing -----------------------------------------------------------------------------
    def model_versions(self, name: str) -> ModelVersions:
        versions = self.models.get(name)
        if versions is None:
            raise RequestError(f"unknown model {name!r}; serving {sorted(self.models)}", status=404)
        return versions

    @staticmethod
    def _route(versions: ModelVersions, version: str | None) -> ServedObject:
        """The version a request goes to (canary routing, or the named one; 404 when absent)."""
        try:
            return versions.route() if version is None else versions.get(version)
        except KeyError as e:
            raise RequestError(f"field 'version': {e.args[0]}", status=404) from None

    @staticmethod
    def _described(versions: ModelVersions, version: str | None) -> ServedObject:
        """The version a metadata, readiness or config request describes: the named one, else the stable one
        (never the canary draw: the answer to one URL does not change from call to call; 404 when absent)."""
        try:
            return versions.live() if version is None else versions.get(version)
        except KeyError as e:
            raise RequestError(f"field 'version': {e.args[0]}", status=404) from None

    @staticmethod
    def _hold(versions: ModelVersions, version: str | None, holds: list[ServedObject]) -> ServedObject:
        """_route, holding the version for the request (appended to `holds`; an unload waits for it)."""
        try:
            served = versions.acquire(version)
        except KeyError as e:
            raise RequestError(str(e.args[0]), status=404) from None
        holds.append(served)
        return served

    def _recommender(self, name: object) -> ModelVersions:
        """The versions a /recommend-family request goes to: the name in its 'pipeline' field, else the one
        pipeline served."""
        if name is None:
            pipelines = sorted(n for n, v in self.models.items() if v.family == "pipeline")
            if len(pipelines) != 1:
                raise RequestError(f"field 'pipeline' must name one of the pipelines served: {pipelines}")
            name = pipelines[0]
        if not isinstance(name, str):
            raise RequestError(f"field 'pipeline' must be a string, got {name!r}"[:200])
        versions = self.models.get(name)
        if versions is None:
            raise RequestError(f"field 'pipeline': unknown pipeline {name!r}; serving {sorted(self.models)}", status=404)
        return versions

    # -- HTTP --------------------------------------------------------------------------------
    async def _pipeline_update(self, request: Request) -> Response:
        """/recommend/interactions and /recommend/features: online updates of every version of a pipeline."""
        t0, code, name = time.perf_counter(), 200, "-"
        endpoint = request.url.path.rsplit("/", 1)[1]
        try:
            check_token(self.tokens, TokenScope.ADMIN if endpoint == "features" else TokenScope.INGEST, request.headers)
            body = await self.json_body(request)
            versions = self._recommender(body.get("pipeline"))
            name = versions.name
            targets = [versions.get(v) for v in versions.versions()]

            def apply() -> dict[str, Any]:
                if endpoint == "interactions":  # every version checks the post first: kept by all of them or by none
                    for t in targets:
                        t.check_interactions(body)
                answers = [t.update_features(body) if endpoint == "features" else t.add_interactions(body) for t in targets]
                return {**answers[0], "versions": [t.version for t in targets]}

            return JSONResponse(await asyncio.to_thread(apply))
        except Exception as e:
            code = _status(e)
            return _error(e, code, self.limits)
        finally:
            self._observe(name, "-", endpoint, code, t0)

    async def json_body(self, request: Request) -> dict[str, Any]:
        """The body of a framework route, within the limits (http/limits.py), as a JSON object."""
        limits = self.limits
        return _json_object(await read_request_body(request, limits.max_json_bytes, limits.body_timeout_s, self.admission))

    def _observe(self, model: str, version: str, endpoint: str, code: int, t0: float) -> None:
        # names of models not served are not kept as labels: any client could add them without end
        model = model if model in self.models else "-"
        self.metrics.answered(model, version, endpoint, code, time.perf_counter() - t0)

    async def _predict(self, request: Request) -> Response:
        t0, code, name, served_version = time.perf_counter(), 200, "-", "-"
        holds: list[ServedObject] = []  # the routed version and a fallback that answered: released after answering
        try:
            body = await self.json_body(request)
            wanted = body.get("model") or (next(iter(self.models)) if len(self.models) == 1 else "")
            if not isinstance(wanted, str) or not wanted:
                raise RequestError(f"several models are served: name one with 'model' (one of {sorted(self.models)})")
            name = wanted
            version = body.get("version")
            versions = self.model_versions(name)
            served = self._hold(versions, None if version is None else str(version), holds)
            served_version = served.version
            instances, live = body.get("instances"), versions.fields()
            served, prediction = await _routed(
                versions, served, version is not None, lambda s: s.predict(instances, live), holds
            )
            served_version = served.version
            answer = {"model_name": name, "model_version": served.version, "predictions": prediction.scores.tolist()}
            if self.request_log is not None:
                answer["request_ids"] = self.request_log.record(
                    name, served.version, prediction.inputs, prediction.scores, prediction.dense_names
                )
            return JSONResponse(answer)
        except Exception as e:
            code = _status(e)
            return _error(e, code, self.limits)
        finally:
            _release(self.models.get(name), holds)
            self._observe(name, served_version, "predict", code, t0)

    def _metadata(self, name: str, version: str | None) -> dict[str, Any]:
        versions = self.model_versions(name)
        served = self._described(versions, version)
        return {
            "name": name,
            "versions": [served.version] if version is not None else versions.versions(),
            **served.metadata(),
        }

    def _build_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            yield
            if (
                self._close_on_shutdown
            ):  # `run()`: uvicorn re-raises SIGTERM/SIGINT after this, skipping callers' cleanup
                self.close()

        app = FastAPI(title="hugerec", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

        @app.exception_handler(RequestError)
        async def request_error(request: Request, e: RequestError) -> Response:
            return _error(e, e.status, self.limits)

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, e: HTTPException) -> Response:
            return JSONResponse({"error": str(e.detail)}, status_code=e.status_code)

        @app.exception_handler(Exception)
        async def internal_error(request: Request, e: Exception) -> Response:
            code = _status(e)  # logs what is not a request's fault
            return Response(_error_body(e, code), code, headers=header_dict(error_headers(code, self.limits)))

        @app.get("/v2")
        async def server_metadata() -> dict[str, Any]:
            return {"name": SERVER_NAME, "version": "0.1.0", "extensions": ["binary_tensor_data", "model_repository"]}

        @app.get("/v2/health/live")
        async def live() -> Response:
            return Response(status_code=200)

        @app.get("/v2/health/ready")
        async def ready() -> Response:
            ok = bool(self.models) and all(v.stable is not None for v in self.models.values())
            return Response(status_code=200 if ok else 503)

        @app.get("/v2/models/{name}")
        async def model_metadata(name: str) -> dict[str, Any]:
            return self._metadata(name, None)

        @app.get("/v2/models/{name}/versions/{version}")
        async def version_metadata(name: str, version: str) -> dict[str, Any]:
            return self._metadata(name, version)

        @app.get("/v2/models/{name}/ready")
        async def model_ready(name: str) -> Response:
            self._described(self.model_versions(name), None)
            return Response(status_code=200)

        @app.get("/v2/models/{name}/versions/{version}/ready")
        async def version_ready(name: str, version: str) -> Response:
            self._described(self.model_versions(name), version)
            return Response(status_code=200)

        @app.get("/v2/models/{name}/config")
        async def model_config(name: str) -> dict[str, Any]:
            return self._described(self.model_versions(name), None).config(self.config.batching)

        # /v2/models/.../infer and /recommend never reach the app: `__call__` answers them on raw ASGI messages
        app.add_route("/predict", self._predict, methods=["POST"])
        app.add_route("/recommend/interactions", self._pipeline_update, methods=["POST"])
        app.add_route("/recommend/features", self._pipeline_update, methods=["POST"])

        @app.get("/metrics")
        async def metrics() -> Response:
            body, content_type = self.metrics.render()
            return Response(body, media_type=content_type)

        app.include_router(admin_router(self))
        app.include_router(feedback_router(self))
        app.include_router(self.status.router())
        return app

    # -- running -----------------------------------------------------------------------------
    def uvicorn_config(self, port: int | None = None) -> uvicorn.Config:
        """uvicorn runs this app with the connection limits of connection_limits.py (head and body deadlines,
        head size, open connections) and the keep-alive timeout of the limits."""
        return uvicorn.Config(
            self,
            http=guarded_protocol(self.limits),
            host=self.config.host,
            port=self.config.port if port is None else port,
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # bound to loopback by default; no proxy's X-Forwarded-* is trusted
            server_header=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=self.limits.keep_alive_s,
            backlog=max(2048, self.limits.max_connections),
        )

    def run(self) -> None:
        """Serve until interrupted (SIGINT / SIGTERM), then release every model version."""
        self._close_on_shutdown = True
        uvicorn.Server(self.uvicorn_config()).run()


class BackgroundServer:
    """Runs an ASGI app with uvicorn in a thread (tests, benchmarks): `with BackgroundServer(server) as url:`."""

    def __init__(self, server: InferenceServer, port: int = 0) -> None:
        self._server = uvicorn.Server(server.uvicorn_config(port))
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)
        self.url = ""

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("BackgroundServer: uvicorn did not start")
            time.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


async def _routed(
    versions: ModelVersions,
    served: ServedObject,
    pinned: bool,
    answer: Callable[[ServedObject], Awaitable[T]],
    holds: list[ServedObject],
) -> tuple[ServedObject, T]:
    """A request answered by the version it was routed to, by `answer` -> (the version answering, what answer
    gave). When that version cannot take the request (400: it lacks a field that version needs, or a positional
    dense list has another width) and the request did not name a version (`pinned`), the other of stable and
    canary answers it if it can (ModelVersions.fallback): while versions of two schemas share the traffic, a
    client that sends only one schema's fields is answered by the version of that schema. Otherwise the first
    version's error stands. The other version is held (appended to `holds`: the caller releases them after
    answering), so an unload waits for it as for the routed one."""
    try:
        return served, await answer(served)
    except RequestError as e:
        other = None if pinned or e.status != 400 else versions.acquire_fallback(served.version)
        if other is None:
            raise
        holds.append(other)
        try:
            return other, await answer(other)
        except RequestError:
            raise e from None


def _release(versions: ModelVersions | None, holds: list[ServedObject]) -> None:
    for held in holds:
        if versions is not None:
            versions.release(held)


def _status(e: Exception) -> int:
    """The HTTP status of an error: a request's fault is its RequestError's 4xx; 503 (with Retry-After) only
    for a full server (a full batch queue, a store a stage could not reach); anything else is a bug: 500."""
    match e:
        case RequestError():
            return e.status
        case QueueFull():
            return 503
        case StageError() if isinstance(e.__cause__, ConnectionError | TimeoutError):
            return 503
        case _:
            log.exception("internal error while answering a request", exc_info=e)
            return 500


def _error(e: Exception, code: int, limits: RequestLimits) -> Response:
    return Response(
        _error_body(e, code), status_code=code, media_type="application/json", headers=header_dict(error_headers(code, limits)[1:])
    )


def _json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object ({} when empty); RequestError otherwise."""
    if not body:
        return {}
    try:
        value = parse_json(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise RequestError(f"request body must be a JSON object, got {type(value).__name__}")
    return value


async def _send(send: Send, code: int, headers: list[tuple[bytes, bytes]], payload: bytes) -> None:
    await send({"type": "http.response.start", "status": code, "headers": [*headers, (b"content-length", str(len(payload)).encode("latin-1"))]})
    await send({"type": "http.response.body", "body": payload})


def _error_body(e: Exception, code: int) -> bytes:
    message = str(e) if code < 500 or isinstance(e, QueueFull | StageError | RequestError) else f"internal error: {type(e).__name__}: {e}"
    return json.dumps({"error": message}).encode()


def serve(
    bundles: str | Path | Sequence[str | Path],
    host: str = "127.0.0.1",
    port: int = 8000,
    options: ServeOptions | None = None,
    config: ServerConfig | None = None,
    threads: int | None = None,
    request_log: RequestLogConfig | None = None,
    decision_log: str | Path | None = None,
) -> None:
    """Serve exported bundles over HTTP until SIGINT/SIGTERM (what `hugerec serve BUNDLE...` runs).

    host/port override `config`'s (binding anything but loopback exposes the server to the network);
    threads: torch intra-op threads of this process (None: torch's default);
    request_log: log a sample of /predict rows and take /feedback (serving/request_log.py);
    decision_log: a continuous loop's decision log, whose recent decisions the status page shows (read only).
    """
    base = config or ServerConfig()
    server = InferenceServer(replace(base, host=host, port=port), options)
    if request_log is not None:
        server.enable_request_log(request_log)
    server.status.show_decision_log(decision_log)
    paths = [bundles] if isinstance(bundles, str | Path) else list(bundles)
    if not paths:
        raise ValueError("serve: no bundle given")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"serve: threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    try:
        for path in paths:
            served = server.add_bundle(path)
            log.info("serving %s version %s from %s on http://%s:%d", served.name, served.version, path, host, port)
        server.run()
    finally:
        server.close()
