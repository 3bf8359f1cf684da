"""Routes of the request log (request_log.py):

POST /feedback            {"labels": [{"request_id": "<id from /predict>", "label": 0 | 1}, ...]}
                          -> {"accepted": n, "unknown": m}; 409 when the server logs no requests
POST /admin/logs/flush    write the buffered requests and feedback to Parquet now (admin token)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from hugerec.serving.http.auth import check_admin_token
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
        request_log = _log_of(server)
        body = await server.json_body(request)
        labels = body.get("labels")
        if not isinstance(labels, list):
            raise RequestError("feedback needs {'labels': [{'request_id': '<id>', 'label': 0 or 1}, ...]}")
        pairs = []
        for i, item in enumerate(labels):
            rid = item.get("request_id") if isinstance(item, dict) else None
            label = item.get("label") if isinstance(item, dict) else None
            if not isinstance(rid, str) or isinstance(label, bool) or not isinstance(label, int | float):
                raise RequestError(f"labels[{i}] must be {{'request_id': '<id>', 'label': <number>}}, got {item!r}")
            if not (math.isfinite(label) and 0 <= label <= 1):
                raise RequestError(f"labels[{i}].label must be in [0, 1], got {label}")
            pairs.append((rid, float(label)))
        accepted, unknown = request_log.add_feedback(pairs)
        return {"accepted": accepted, "unknown": unknown}

    @router.post("/admin/logs/flush")
    async def flush(request: Request) -> dict[str, Any]:
        check_admin_token(server.config.admin_token, request)
        _log_of(server).flush()
        return {"directory": str(server.request_log.directory) if server.request_log else ""}

    return router
