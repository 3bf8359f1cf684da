"""InferenceServer: FastAPI + uvicorn, speaking the Open Inference Protocol v2 (KServe / Triton).

    GET  /v2                                   server metadata
    GET  /v2/health/live | /v2/health/ready    liveness, readiness (every model has a stable version)
    GET  /v2/models/{m}[/versions/{v}]         model metadata (inputs, outputs, versions)
    GET  /v2/models/{m}[/versions/{v}]/ready   model readiness
    GET  /v2/models/{m}/config                 Triton-style config (max batch size, dynamic batching)
    POST /v2/models/{m}[/versions/{v}]/infer   typed tensors, JSON or the binary extension (protocol.py)
    POST /predict                              {"instances": [raw feature dicts], "model"?: m} -> scores
    POST /recommend                            {"user": id, "k": 20, ...} -> a pipeline's items (pipeline/served.py)
    GET  /metrics                              Prometheus
  admin (load/unload versions, canary, promote, rollback): see admin.py
  request log and feedback (when enable_request_log was called): see feedback.py

Bad requests get a 4xx JSON {"error": message}; the server never answers 500 to bad input.

Versions of one model trained on different schemas (a whole-bundle canary after a schema change) share
the traffic: a version ignores request fields only another loaded version takes (protocol.LiveFields),
and a request the version it was routed to cannot take goes to the other of stable and canary
(_decode_routed) unless it names its version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from hugerec.serving.admin import _check_token as _check_admin
from hugerec.serving.admin import admin_router
from hugerec.serving.batching import BatchingConfig, DynamicBatcher, QueueFull
from hugerec.serving.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.feedback import feedback_router
from hugerec.serving.gbm import GBMModel, is_gbm_bundle, load_gbm_bundle
from hugerec.serving.inference_model import InferenceModel, ModelInputs
from hugerec.serving.isolated_load import DEFAULT_LOAD_DEADLINE_S, commit_load, current_deadline
from hugerec.serving.next_items import NextItemsModel, is_next_items_bundle, load_next_items
from hugerec.serving.pipeline.bundle import PipelineOptions, is_pipeline_bundle, load_pipeline
from hugerec.serving.pipeline.runner import StageError
from hugerec.serving.pipeline.served import PipelineMetrics, ServedPipeline, add_interactions, update_features
from hugerec.serving.preprocess import RequestPreprocessor
from hugerec.serving.prometheus_metrics import ServerMetrics
from hugerec.serving.protocol import (
    HEADER_LENGTH,
    OUTPUTS,
    RequestError,
    Signature,
    decode_infer_request,
    dump_json,
    encode_infer_response,
    parse_json,
)
from hugerec.serving.request_log import RequestLog, RequestLogConfig
from hugerec.serving.version_delta import derive_version, read_version_delta
from hugerec.serving.versions import ModelVersions, ServedModel

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVER_NAME = "hugerec"
_HEADER_LENGTH_KEY = HEADER_LENGTH.lower().encode("latin-1")
_INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
PLATFORM = "hugerec_pytorch"


@dataclass(frozen=True)
class ServerConfig:
    """host/port to bind (loopback by default); limits on requests; admin_token enables the admin API.

    body_timeout_s: the longest wait for the next part of a request body; a client that sends fewer
    bytes than its Content-Length gets 408 and the connection is closed. keep_alive_s: how long an
    idle kept-alive connection stays open (uvicorn's timeout_keep_alive). load_deadline_s: the longest
    an admin load (any bundle kind) may take, and a GBM model file's check by its library in a child
    process (isolated_load.py); past it the load is refused and the server serves what it served.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    max_request_bytes: int = 64 << 20
    max_request_rows: int = 65536
    admin_token: str | None = None
    seed: int | None = None  # canary routing; None: random
    body_timeout_s: float = 30.0
    keep_alive_s: int = 5
    load_deadline_s: float = DEFAULT_LOAD_DEADLINE_S

    def __post_init__(self) -> None:
        if not 0 < self.load_deadline_s <= 86400:
            raise ValueError(f"ServerConfig: load_deadline_s must be in (0, 86400] seconds, got {self.load_deadline_s}")
        if not (0 < self.body_timeout_s <= 3600 and 0 < self.keep_alive_s <= 3600):
            raise ValueError(
                f"ServerConfig: body_timeout_s and keep_alive_s must be in (0, 3600] seconds, got "
                f"{self.body_timeout_s}, {self.keep_alive_s}"
            )
        if not 0 <= self.port < 65536:
            raise ValueError(f"ServerConfig: port must be in 0..65535, got {self.port}")
        if self.max_request_bytes < 1024 or self.max_request_rows < 1:
            raise ValueError(
                f"ServerConfig: max_request_bytes must be >= 1024 and max_request_rows >= 1, got "
                f"{self.max_request_bytes}, {self.max_request_rows}"
            )
        if self.admin_token is not None and len(self.admin_token) < 16:
            raise ValueError("ServerConfig: admin_token must have at least 16 characters")


class InferenceServer:
    """Serves models (each with versions) over HTTP; `app` is the ASGI app, `run()` binds it.

    options: how bundles loaded by `add_bundle` (and the admin load endpoint) are served.
    """

    def __init__(self, config: ServerConfig | None = None, options: ServeOptions | None = None) -> None:
        self.config = config or ServerConfig()
        self.options = options or ServeOptions()
        self.models: dict[str, ModelVersions] = {}
        self.next_item_models: dict[str, NextItemsModel] = {}  # sequential models: "next items for this sequence"
        self.metrics = ServerMetrics()
        self.pipelines: dict[str, ModelVersions] = {}  # recommendation pipelines, versions of ServedPipeline
        self.pipeline_options = PipelineOptions(ranker=self.options)
        self.pipeline_metrics = PipelineMetrics(self.metrics.registry)
        self._lock = threading.Lock()
        self._close_on_shutdown = False
        self.request_log: RequestLog | None = None  # enable_request_log: /predict rows logged, /feedback taken
        self.app = self._build_app()

    def enable_request_log(self, config: RequestLogConfig) -> RequestLog:
        """Log a sample of /predict rows and take feedback for them (serving/request_log.py)."""
        self.request_log = RequestLog(config, self.metrics.registry)
        return self.request_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app uvicorn runs: inference requests are answered here on raw ASGI messages, skipping
        the framework's request/response objects and middleware (most of the cost of a one-example
        request); the rest goes to FastAPI."""
        if scope["type"] == "http":
            if scope["path"] == "/recommend":
                if scope["method"] == "POST":
                    await self._recommend_asgi(scope, receive, send)
                else:
                    await JSONResponse({"error": "method not allowed: use POST"}, status_code=405)(scope, receive, send)
                return
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None and scope["method"] == "POST":
                await self._infer_asgi(match["name"], match["version"], scope, receive, send)
                return
            if match is not None:  # the infer path takes POST only
                await JSONResponse({"error": "method not allowed: use POST"}, status_code=405)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _infer_asgi(self, name: str, version: str | None, scope: Scope, receive: Receive, send: Send) -> None:
        header_length = None
        for key, value in scope["headers"]:
            if key == _HEADER_LENGTH_KEY:
                header_length = value.decode("latin-1")
        t0, code, served_version = time.perf_counter(), 200, version or "-"
        held: ServedModel | None = None
        holds: list[ServedModel] = []  # a fallback version that answered (ModelVersions.acquire_fallback)
        try:
            served = self._target(name, version, hold=True)
            if isinstance(served, ServedModel):
                held = served
            served_version = served.version
            body = await self._asgi_body(scope, receive)
            if body is None:
                code = 499  # the client went away: nobody to answer
                return
            payload, headers, served_version = await self._answer(served, body, header_length, version is not None, holds)
            raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        except Exception as e:
            code = _status(e)
            payload, raw = _error_body(e, code), _error_headers(code)
        finally:
            for h in holds if held is None else [held, *holds]:
                self.model_versions(name).release(h)
            if code != 499:
                self._observe(name, served_version, "infer", code, t0)
        await _send(send, code, raw, payload)

    async def _recommend_asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /recommend on raw ASGI messages, like infer: the body parsed by orjson, the pipeline run off the
        event loop, the answer written by orjson (the framework's request, routing and JSONResponse cost more
        than the pipeline's own filter, score and order stages together)."""
        t0, code, name, served_version = time.perf_counter(), 200, "-", "-"
        try:
            raw_body = await self._asgi_body(scope, receive)
            if raw_body is None:
                code = 499
                return
            body = _json_object(raw_body)
            wanted, version = body.get("pipeline"), body.get("version")
            if wanted is not None and not isinstance(wanted, str):
                raise RequestError(f"field 'pipeline' must be a string, got {wanted!r}")
            served = self._pipeline(wanted, None if version is None else str(version))
            name, served_version = served.name, served.version
            payload, raw = dump_json(await asyncio.to_thread(served.recommend, body)), [(b"content-type", b"application/json")]
        except Exception as e:
            code = _status(e)
            payload, raw = _error_body(e, code), _error_headers(code)
        finally:
            if code != 499:
                self._observe(name, served_version, "recommend", code, t0)
        await _send(send, code, raw, payload)

    async def _asgi_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request body from raw ASGI messages (413 past max_request_bytes); None when the client left."""
        limit = self.config.max_request_bytes
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value.decode("latin-1")
                if declared.isdigit() and int(declared) > limit:
                    raise RequestError(f"payload of {declared} bytes exceeds the limit of {limit}", status=413)
        chunks, size, more = [], 0, True
        while more:
            message = await self._next_part(receive())
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestError(f"payload exceeds the limit of {limit} bytes", status=413)
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _answer(
        self,
        served: ServedModel | NextItemsModel | ServedPipeline,
        body: bytes,
        header_length: str | None,
        pinned: bool,
        holds: list[ServedModel],
    ) -> tuple[bytes, dict[str, str], str]:
        """An infer request's body -> the response's body and headers, and the version that answered
        (`pinned`: the request named the version, which then answers or refuses it)."""
        if isinstance(served, NextItemsModel | ServedPipeline):  # index, stores and a model call: off the event loop
            return (*await asyncio.to_thread(served.answer, body, header_length), served.version)
        versions = self.models[served.name]
        live = versions.fields()
        served, (inputs, options) = _decode_routed(
            versions, served, pinned, lambda s: decode_infer_request(body, header_length, s.signature, live), holds
        )
        logits = await served.logits(inputs)
        payload, headers = encode_infer_response(served.name, served.version, options, _outputs(logits, options.outputs))
        return payload, headers, served.version

    # -- models ------------------------------------------------------------------------------
    def add_model(
        self,
        name: str,
        version: str,
        model: InferenceModel | GBMModel,
        preprocess: RequestPreprocessor | None = None,
        closers: Sequence[Callable[[], None]] = (),
        info: dict[str, Any] | None = None,
    ) -> ServedModel:
        """Serve `model` as version `version` of `name` (the first version of a model becomes stable)."""
        if isinstance(model, GBMModel):  # trees: NaN dense values are missing values, one id per feature
            signature = model.signature(self.config.max_request_rows)
        else:
            signature = Signature(
                model.num_dense, model.features, self.config.max_request_rows, vectors=model.vector_signature
            )
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
        )
        with self._lock:
            versions = self.models.setdefault(name, ModelVersions(name, self.config.seed))
        try:
            commit_load()  # an admin load past its deadline is refused here (isolated_load.py)
            versions.add(served)
        except ValueError:
            batcher.close()
            raise
        if isinstance(model, InferenceModel):  # a GBM version has no parameter server
            self.metrics.parameter_servers.add(name, version, model.ps)
        return served

    def add_bundle(self, path: str | Path, name: str | None = None, version: str | None = None) -> ServedModel:
        """Load an exported bundle and serve it (name and version default to the bundle's manifest)."""
        if is_gbm_bundle(path):
            return self._add_gbm_bundle(path, name, version)
        loaded = load_bundle(path, self.options, self.config.max_request_rows)
        m = loaded.bundle.manifest
        name, version = name or m.name, version or m.version
        info = {"bundle": str(loaded.bundle.path), "bundle_id": loaded.bundle.id, **m.info}
        try:
            served = self.add_model(name, version, loaded.model, loaded.preprocess, [loaded.close], info)
        except BaseException:
            loaded.close()
            raise
        updates = self.metrics.updates
        loaded.start_updates(lambda result: updates.labels(name, version, result).inc())
        served.info["watchers"] = loaded.watchers
        return served

    def add_version_delta(self, path: str | Path, name: str, base: str, version: str) -> ServedModel:
        """Serve `base` + the version delta at `path` as a new version `version` of `name` (version_delta.py);
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
        if not isinstance(served_base.model, InferenceModel) or "bundle" not in served_base.info:
            raise ValueError(f"model {name!r}: version {base!r} is not a bundle-loaded model a delta can apply to")
        delta = read_version_delta(path)
        if delta.base_version != base:
            raise ValueError(f"version delta {path} was made against version {delta.base_version!r}, not {base!r}")
        derived = derive_version(served_base.model, served_base.preprocess, served_base.info, delta, version, self.options)
        try:
            return self.add_model(name, version, derived.model, derived.preprocess, [derived.close], derived.info)
        except BaseException:
            derived.close()
            raise

    def _add_gbm_bundle(self, path: str | Path, name: str | None, version: str | None) -> ServedModel:
        """A GBM bundle (`hugerec export` of a lightgbm / xgboost model; see serving/gbm.py)."""
        deadline = current_deadline()  # an admin load's; at start-up the configured one
        seconds = self.config.load_deadline_s if deadline is None else deadline.remaining()
        loaded = load_gbm_bundle(path, self.config.max_request_rows, verify=self.options.verify, deadline_s=seconds)
        info = {"bundle": str(loaded.path), "bundle_id": loaded.bundle_id, "kind": "gbm", **loaded.manifest["info"]}
        return self.add_model(name or loaded.name, version or loaded.version, loaded.model, loaded.preprocess, (), info)

    def add_next_items_bundle(self, path: str | Path, name: str | None = None, version: str | None = None) -> NextItemsModel:
        """Serve a next-items bundle (`hugerec export` of a sequential model; see serving/next_items.py)."""
        model = load_next_items(path, name, version, self.config.max_request_rows)
        with self._lock:
            if model.name in self.models or model.name in self.next_item_models:
                raise ValueError(f"a model named {model.name!r} is already served")
            commit_load()
            self.next_item_models[model.name] = model
        return model

    def add_pipeline_bundle(self, path: str | Path, name: str | None = None, version: str | None = None) -> ServedPipeline:
        """Serve a pipeline bundle (pipeline/bundle.py) as a version of the pipeline `name`."""
        loaded = load_pipeline(path, self.pipeline_options, name, version)
        served = ServedPipeline(loaded.name, loaded.version, loaded.pipeline, self.pipeline_metrics, {"bundle": str(path)}, [loaded.close])
        with self._lock:
            if served.name in self.models or served.name in self.next_item_models:
                served.close()
                raise ValueError(f"a model named {served.name!r} is already served")
            versions = self.pipelines.setdefault(served.name, ModelVersions(served.name, self.config.seed))
        try:
            commit_load()
            versions.add(served)  # type: ignore[arg-type]  # ModelVersions needs only name, version and close
        except ValueError:
            served.close()
            raise
        return served

    def _pipeline(self, name: str | None, version: str | None) -> ServedPipeline:
        """The pipeline version a /recommend request goes to (canary routing as for models)."""
        if name is None:
            if len(self.pipelines) != 1:
                raise RequestError(f"field 'pipeline' must name one of the pipelines served: {sorted(self.pipelines)}")
            name = next(iter(self.pipelines))
        versions = self.pipelines.get(name)
        if versions is None:
            raise RequestError(f"field 'pipeline': unknown pipeline {name!r}; serving {sorted(self.pipelines)}", status=404)
        try:
            served = versions.route() if version is None else versions.get(version)
        except KeyError as e:
            raise RequestError(f"field 'version': {e.args[0]}", status=404) from None
        assert isinstance(served, ServedPipeline)
        return served

    async def _pipeline_update(self, request: Request) -> Response:
        """/recommend/interactions and /recommend/features: online updates of every version of a pipeline."""
        t0, code, name = time.perf_counter(), 200, "-"
        endpoint = request.url.path.rsplit("/", 1)[1]
        try:
            if endpoint == "features":
                _check_admin(self, request)
            body = await self.json_body(request)
            served = self._pipeline(body.get("pipeline"), None)
            name = served.name
            versions = self.pipelines[name]
            targets = [t for t in (versions.get(v) for v in versions.versions()) if isinstance(t, ServedPipeline)]
            apply = update_features if endpoint == "features" else add_interactions
            return JSONResponse(await asyncio.to_thread(apply, targets, body))
        except Exception as e:
            code = _status(e)
            return _error(e, code)
        finally:
            self._observe(name, "-", endpoint, code, t0)

    def _target(self, name: str, version: str | None, hold: bool = False) -> ServedModel | NextItemsModel | ServedPipeline:
        """The model an infer request names: a next-items model, or a version of a scoring model (held for
        the request when `hold`: ModelVersions.release it after answering)."""
        if name in self.pipelines:
            return self._pipeline(name, version)
        nxt = self.next_item_models.get(name)
        if nxt is None:
            return self._served(name, version, hold)
        if version is not None and version != nxt.version:
            raise RequestError(f"model {name!r} has no version {version!r}; it serves {nxt.version!r}", status=404)
        return nxt

    def unload(self, name: str, version: str) -> None:
        """Unload a version that is neither stable nor canary, once the requests it is answering are done."""
        served = self.model_versions(name).remove(version)
        self.metrics.parameter_servers.remove(name, version)
        served.close()

    def close(self) -> None:
        for versions in self.models.values():
            versions.close()
        for versions in self.pipelines.values():
            versions.close()

    def model_versions(self, name: str) -> ModelVersions:
        versions = self.models.get(name) or self.pipelines.get(name)
        if versions is None:
            raise RequestError(f"unknown model {name!r}; serving {sorted(self.models)}", status=404)
        return versions

    def _served(self, name: str, version: str | None, hold: bool = False) -> ServedModel:
        versions = self.model_versions(name)
        try:
            if hold:
                return versions.acquire(version)
            return versions.route() if version is None else versions.get(version)
        except KeyError as e:
            raise RequestError(str(e.args[0]), status=404) from None

    # -- HTTP --------------------------------------------------------------------------------
    async def _body(self, request: Request) -> bytes:
        limit = self.config.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(f"payload of {declared} bytes exceeds the limit of {limit}", status=413)
        chunks, size = [], 0
        stream = request.stream()
        while True:
            try:
                chunk = await self._next_part(anext(stream))
            except StopAsyncIteration:
                break
            size += len(chunk)
            if size > limit:
                raise RequestError(f"payload exceeds the limit of {limit} bytes", status=413)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _next_part(self, part: Awaitable[T]) -> T:
        """The next message of a request body, or 408 after body_timeout_s without one."""
        try:
            return await asyncio.wait_for(part, self.config.body_timeout_s)
        except TimeoutError:
            raise RequestError(
                f"the request body did not arrive within {self.config.body_timeout_s} s (fewer bytes than Content-Length?)",
                status=408,
            ) from None

    async def json_body(self, request: Request) -> dict[str, Any]:
        return _json_object(await self._body(request))

    def _observe(self, model: str, version: str, endpoint: str, code: int, t0: float) -> None:
        # names of models not served are not kept as labels: any client could add them without end
        model = model if model in self.models or model in self.next_item_models or model in self.pipelines else "-"
        self.metrics.answered(model, version, endpoint, code, time.perf_counter() - t0)

    async def _predict(self, request: Request) -> Response:
        t0, code, name, served_version = time.perf_counter(), 200, "-", "-"
        held: ServedModel | None = None
        holds: list[ServedModel] = []  # a fallback version that answered (ModelVersions.acquire_fallback)
        try:
            body = await self.json_body(request)
            name = body.get("model") or (next(iter(self.models)) if len(self.models) == 1 else "")
            if not isinstance(name, str) or not name:
                raise RequestError(f"several models are served: name one with 'model' (one of {sorted(self.models)})")
            version = body.get("version")
            served = held = self._served(name, None if version is None else str(version), hold=True)
            served_version = served.version
            versions, instances = self.model_versions(name), body.get("instances")
            live = versions.fields()

            def decode(s: ServedModel) -> ModelInputs:
                return s.preprocess(instances, live)  # type: ignore[arg-type]  # validated inside

            pinned = version is not None
            fallback = None if pinned else versions.fallback(served.version)
            if all(s.preprocess.workflow is None for s in (served, fallback) if s is not None):
                served, inputs = _decode_routed(versions, served, pinned, decode, holds)
            else:  # polars releases the GIL: keep the event loop free while the workflow runs
                served, inputs = await asyncio.to_thread(_decode_routed, versions, served, pinned, decode, holds)
            served_version = served.version
            scores = _outputs(await served.logits(inputs))["scores"]
            answer = {"model_name": name, "model_version": served.version, "predictions": scores.tolist()}
            if self.request_log is not None:
                answer["request_ids"] = self.request_log.record(
                    name, served.version, inputs, scores, served.preprocess.dense_names
                )
            return JSONResponse(answer)
        except Exception as e:
            code = _status(e)
            return _error(e, code)
        finally:
            for h in holds if held is None else [held, *holds]:
                self.model_versions(name).release(h)
            self._observe(name, served_version, "predict", code, t0)

    def _metadata(self, name: str, version: str | None) -> dict[str, Any]:
        if name in self.pipelines:
            return self._pipeline(name, version).metadata()
        nxt = self._target(name, version) if name in self.next_item_models else None
        if isinstance(nxt, NextItemsModel):
            return nxt.metadata()
        served = self._served(name, version)
        versions = [served.version] if version is not None else self.model_versions(name).versions()
        return {
            "name": name,
            "versions": versions,
            "platform": PLATFORM,
            "inputs": served.signature.inputs_metadata(),
            "outputs": served.signature.outputs_metadata(),
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
            return _error(e, e.status)

        @app.exception_handler(HTTPException)
        async def http_error(request: Request, e: HTTPException) -> Response:
            return JSONResponse({"error": str(e.detail)}, status_code=e.status_code)

        @app.get("/v2")
        async def server_metadata() -> dict[str, Any]:
            return {"name": SERVER_NAME, "version": "0.1.0", "extensions": ["binary_tensor_data", "model_repository"]}

        @app.get("/v2/health/live")
        async def live() -> Response:
            return Response(status_code=200)

        @app.get("/v2/health/ready")
        async def ready() -> Response:
            ok = bool(self.models or self.next_item_models or self.pipelines) and all(v.stable is not None for v in self.models.values())
            return Response(status_code=200 if ok else 503)

        @app.get("/v2/models/{name}")
        async def model_metadata(name: str) -> dict[str, Any]:
            return self._metadata(name, None)

        @app.get("/v2/models/{name}/versions/{version}")
        async def version_metadata(name: str, version: str) -> dict[str, Any]:
            return self._metadata(name, version)

        @app.get("/v2/models/{name}/ready")
        async def model_ready(name: str) -> Response:
            self._target(name, None)
            return Response(status_code=200)

        @app.get("/v2/models/{name}/versions/{version}/ready")
        async def version_ready(name: str, version: str) -> Response:
            self._target(name, version)
            return Response(status_code=200)

        @app.get("/v2/models/{name}/config")
        async def model_config(name: str) -> dict[str, Any]:
            served = self._served(name, None)
            batching = self.config.batching
            return {
                "name": name,
                "platform": PLATFORM,
                "max_batch_size": batching.max_batch_size,
                "input": served.signature.inputs_metadata(),
                "output": served.signature.outputs_metadata(),
                "dynamic_batching": {"max_queue_delay_microseconds": int(batching.max_delay_ms * 1000)},
            }

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
        return app

    # -- running -----------------------------------------------------------------------------
    def uvicorn_config(self, port: int | None = None) -> uvicorn.Config:
        return uvicorn.Config(
            self,
            host=self.config.host,
            port=self.config.port if port is None else port,
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # bound to loopback by default; no proxy's X-Forwarded-* is trusted
            server_header=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=self.config.keep_alive_s,
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


def _decode_routed(
    versions: ModelVersions,
    served: ServedModel,
    pinned: bool,
    decode: Callable[[ServedModel], T],
    holds: list[ServedModel],
) -> tuple[ServedModel, T]:
    """A request's fields decoded for the version it was routed to, by `decode` -> (the version answering, what
    decode gave). When that version cannot take the request (400: it lacks a field that version needs, or a
    positional dense list has another width) and the request did not name a version (`pinned`), the other of
    stable and canary answers it if it can take it (ModelVersions.fallback): while versions of two schemas share
    the traffic, a client that sends only one schema's fields is answered by the version of that schema.
    Otherwise the first version's error stands. The other version is held (appended to `holds`: the caller
    releases them after answering), so an unload waits for it as for the routed one."""
    try:
        return served, decode(served)
    except RequestError as e:
        other = None if pinned or e.status != 400 else versions.acquire_fallback(served.version)
        if other is None:
            raise
        holds.append(other)
        try:
            return other, decode(other)
        except RequestError:
            raise e from None


def _outputs(logits: np.ndarray, names: Sequence[str] = OUTPUTS) -> dict[str, np.ndarray]:
    """The outputs asked for (scores: the sigmoid of the logits)."""
    out = {"logits": logits} if "logits" in names else {}
    if "scores" in names:
        # clipped: exp stays finite in float32 (sigmoid(-88) = 6e-39, below that the score is 0 anyway)
        scores = np.exp(np.clip(logits, -88.0, 88.0, dtype=np.float32) * np.float32(-1.0))
        scores += np.float32(1.0)
        out["scores"] = np.reciprocal(scores, out=scores)
    return out


def _status(e: Exception) -> int:
    match e:
        case RequestError():
            return e.status
        case QueueFull() | StageError():
            return 503
        case _:
            log.exception("internal error while answering a request", exc_info=e)
            return 500


def _error(e: Exception, code: int) -> Response:
    headers = {"connection": "close"} if code == 408 else None  # the rest of that body is not read
    return Response(_error_body(e, code), status_code=code, media_type="application/json", headers=headers)


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


def _error_headers(code: int) -> list[tuple[bytes, bytes]]:
    raw = [(b"content-type", b"application/json")]
    if code == 408:  # the rest of that body is not read
        raw.append((b"connection", b"close"))
    return raw


async def _send(send: Send, code: int, headers: list[tuple[bytes, bytes]], payload: bytes) -> None:
    await send({"type": "http.response.start", "status": code, "headers": [*headers, (b"content-length", str(len(payload)).encode("latin-1"))]})
    await send({"type": "http.response.body", "body": payload})


def _error_body(e: Exception, code: int) -> bytes:
    message = str(e) if code < 500 or isinstance(e, QueueFull | StageError) else f"internal error: {type(e).__name__}: {e}"
    return json.dumps({"error": message}).encode()


def serve(
    bundles: str | Path | Sequence[str | Path],
    host: str = "127.0.0.1",
    port: int = 8000,
    options: ServeOptions | None = None,
    config: ServerConfig | None = None,
    threads: int | None = None,
    request_log: RequestLogConfig | None = None,
) -> None:
    """Serve exported bundles over HTTP until SIGINT/SIGTERM (what `hugerec serve BUNDLE...` runs).

    host/port override `config`'s (binding anything but loopback exposes the server to the network);
    threads: torch intra-op threads of this process (None: torch's default);
    request_log: log a sample of /predict rows and take /feedback (serving/request_log.py).
    """
    base = config or ServerConfig()
    server = InferenceServer(replace(base, host=host, port=port), options)
    if request_log is not None:
        server.enable_request_log(request_log)
    paths = [bundles] if isinstance(bundles, str | Path) else list(bundles)
    if not paths:
        raise ValueError("serve: no bundle given")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"serve: threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    try:
        for path in paths:
            served: ServedModel | NextItemsModel | ServedPipeline
            if is_pipeline_bundle(path):
                served = server.add_pipeline_bundle(path)
            else:
                served = server.add_next_items_bundle(path) if is_next_items_bundle(path) else server.add_bundle(path)
            log.info("serving %s version %s from %s on http://%s:%d", served.name, served.version, path, host, port)
        server.run()
    finally:
        server.close()
