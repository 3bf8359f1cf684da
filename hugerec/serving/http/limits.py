"""Limits on what one request may make the server do, applied before any work on it starts.

    read_asgi_body / read_request_body   the body, refused past `max_bytes` (413: by its Content-Length
                                         before a byte is read, else as soon as the bytes pass it) and
                                         after `timeout_s` without its next part (408)

The server's limits are `ServerConfig` fields (max_request_bytes, max_request_rows, body_timeout_s,
keep_alive_s); the rows per request are the decoders' (runtime/inference_protocol.py Signature.max_rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.types import Receive, Scope

from hugerec.serving.runtime.inference_protocol import RequestError

T = TypeVar("T")


def check_declared_length(declared: str | None, max_bytes: int) -> None:
    """413 when a Content-Length header announces more than `max_bytes`."""
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(f"payload of {declared} bytes exceeds the limit of {max_bytes}", status=413)


def _count(size: int, chunk: bytes, max_bytes: int) -> int:
    size += len(chunk)
    if size > max_bytes:
        raise RequestError(f"payload exceeds the limit of {max_bytes} bytes", status=413)
    return size


async def next_part(part: Awaitable[T], timeout_s: float) -> T:
    """The next message of a request body, or 408 after `timeout_s` without one."""
    try:
        return await asyncio.wait_for(part, timeout_s)
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {timeout_s} s (fewer bytes than Content-Length?)", status=408
        ) from None


async def read_asgi_body(scope: Scope, receive: Receive, max_bytes: int, timeout_s: float) -> bytes | None:
    """A request body from raw ASGI messages; None when the client left before sending all of it."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            check_declared_length(value.decode("latin-1"), max_bytes)
    chunks, size, more = [], 0, True
    while more:
        message = await next_part(receive(), timeout_s)
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size = _count(size, chunk, max_bytes)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


async def read_request_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """A framework request's body, with the same limits."""
    check_declared_length(request.headers.get("content-length"), max_bytes)
    chunks, size = [], 0
    stream = request.stream()
    while True:
        try:
            chunk = await next_part(anext(stream), timeout_s)
        except StopAsyncIteration:
            break
        size = _count(size, chunk, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)
