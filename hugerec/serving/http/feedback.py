"""Routes of the request log (request_log.py):

POST /feedback            {"labels": [{"request_id": "<id from /predict>", "label": 0 | 1}, ...]} (ingest token)
                          -> {"accepted", "unknown", "duplicate", "expired"}: the first label of a request id
                          issued within the window is kept (request_log.py); 409 when the server logs no requests
POST /admin/logs/flush    write the buffered requests and feedback to Parquet now (admin token)
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from hugerec.serving.http.auth import TokenScope, check_token
from hugerec.serving.http.request_log import RequestLog
from hugerec.serving.runtime.inference_protocol import RequestError

if TYPE_CHECKING:
    from hugerec.serving.http.server import InferenceServer


def _log_of(server: InferenceServer) -> RequestLog:
    if server.request_log is None:
        raise RequestError("this server keeps no request log: start it with a request log to take feedback", status=409)
    return server.request_log


def feedback_router(server: InferenceServer) -> APIRouter:
    router = APIRouter()

    @router.post("/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.INGEST, request.headers)
        request_log = _log_of(server)
        body = await server.json_body(request)
        labels = body.get("labels")
        if not isinstance(labels, list):
            raise RequestError("feedback needs {'labels': [{'request_id': '<id>', 'label': 0 or 1}, ...]}")
        limit = server.config.limits.max_request_rows
        if len(labels) > limit:
            raise RequestError(f"field 'labels' has {len(labels)} labels; this server takes at most {limit}", status=413)
        pairs = []
        for i, item in enumerate(labels):
            rid = item.get("request_id") if isinstance(item, dict) else None
            label = item.get("label") if isinstance(item, dict) else None
            if not isinstance(rid, str) or isinstance(label, bool) or not isinstance(label, int | float):
                raise RequestError(f"labels[{i}] must be {{'request_id': '<id>', 'label': <number>}}, got {item!r}"[:300])
            if not (0 <= label <= 1 and math.isfinite(label)):  # compared first: an int of any size compares
                raise RequestError(f"field 'labels[{i}].label' must be in [0, 1], got {label}"[:200])
            pairs.append((rid, float(label)))
        return asdict(request_log.add_feedback(pairs))

    @router.post("/admin/logs/flush")
    async def flush(request: Request) -> dict[str, Any]:
        check_token(server.tokens, TokenScope.ADMIN, request.headers)
        _log_of(server).flush()
        return {"directory": str(server.request_log.directory) if server.request_log else ""}

    return router
