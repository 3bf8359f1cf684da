"""Limits on what one request, and all requests together, may make the server do, applied before any work
on a request starts.

    RequestLimits       every limit, with its safe default (the README's table lists them; ServerConfig.limits)
    Admission           requests and body bytes in flight: beyond `max_requests` or `max_inflight_bytes` a
                        request is answered 503 with Retry-After at once, never queued
    read_asgi_body      the body of a request, refused past its size limit (413: by its Content-Length before a
    read_request_body   byte is read, else as soon as the bytes pass it) and past a deadline for the whole body
                        (408; a deadline per request, not per chunk: a client sending a byte every few seconds
                        does not hold the request open for ever)

The connection-level limits (header deadline and size, connections, the whole-body deadline when the app does
not read the body) live in the HTTP protocol (connection_limits.py); the per-field limits (users, history, k)
in the decoders that read those fields (runtime/inference_protocol.py, pipeline/served_pipeline.py).

Memory: a request holds its body once (read into one buffer of its Content-Length) plus what decoding makes
of it: binary tensors are views of the body (plus a float32 copy of the dense values), a request larger than a
batch runs as model calls of max_batch_size rows (runtime/batching.py). The stated bounds, peak bytes per body
byte: BINARY_MEMORY_FACTOR for binary tensors, JSON_MEMORY_FACTOR for a parsed JSON body (benchmarks/serving.py
`large body memory` measures them); `max_inflight_bytes` bounds the sum of the bodies in flight, so the
server's memory for requests is at most that factor x max_inflight_bytes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, fields
from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope

from hugerec.serving.runtime.inference_protocol import RequestError

TICKET = "hugerec.reserved"  # the scope key of the body bytes a request holds of the in-flight budget
RETRY_AFTER = "retry-after"
# the scope key a protocol sets when it closes a request whose body is not in within this many seconds
# (connection_limits.py): read_asgi_body then arms no timer of its own
BODY_DEADLINE = "hugerec.body_deadline"
BINARY_MEMORY_FACTOR = 4  # peak bytes per byte of a body of binary tensors, one model call of a batch included
# peak bytes per byte of a JSON body while it is parsed: 4 measured on tensors of numbers; the worst shapes
# (arrays of empty arrays, of one-character strings: 3 to 4 bytes of text per 56-64 byte object) reach 24
JSON_MEMORY_FACTOR = 24


@dataclass(frozen=True)
class RequestLimits:
    """Every limit of the server. Defaults are safe for a server reachable by strangers on a small machine.

    max_request_bytes: a body with binary tensors (KServe v2 binary extension), 413 beyond.
    max_json_bytes: a JSON body, or the JSON header of a binary one, 413 beyond.
    max_request_rows: examples per /infer or /predict request of a model, labels per /feedback (413 beyond).
    max_users: users per request of a pipeline's KServe v2 model (413 beyond).
    max_history: history ids per user in a request, items per /recommend/interactions post (413 beyond).
    max_k: the largest k a request may ask (400 beyond; a pipeline's own max_k may be lower).
    max_header_bytes: request line + headers (431 beyond, the connection closed).
    header_timeout_s: from a connection's first byte (or a kept-alive one's next request) to the end of its
        headers (408, closed). body_timeout_s: for the whole body once the headers are in (408, closed).
    keep_alive_s: how long an idle kept-alive connection stays open (uvicorn's timeout_keep_alive).
    max_connections: open connections; the next one is answered 503 with Retry-After and closed.
    max_requests: requests being answered at once; the next is answered 503 with Retry-After at once.
    max_inflight_bytes: the bodies of the requests in flight together; a body that would pass it is 503.
    retry_after_s: the Retry-After of those 503s.
    """

    max_request_bytes: int = 64 << 20
    max_json_bytes: int = 8 << 20
    max_request_rows: int = 65536
    max_users: int = 256
    max_history: int = 1000
    max_k: int = 1000
    max_header_bytes: int = 64 << 10
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: int = 5
    max_connections: int = 1000
    max_requests: int = 256
    max_inflight_bytes: int = 512 << 20
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
                raise ValueError(f"RequestLimits: {name} must be in (0, 3600] seconds, got {value!r}")
        minimum = {"max_request_bytes": 1024, "max_json_bytes": 1024, "max_header_bytes": 1024}
        for name in (
            "max_request_bytes", "max_json_bytes", "max_request_rows", "max_users", "max_history", "max_k",
            "max_header_bytes", "max_connections", "max_requests", "max_inflight_bytes", "retry_after_s",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum.get(name, 1):
                raise ValueError(f"RequestLimits: {name} must be an integer >= {minimum.get(name, 1)}, got {value!r}")
        if self.max_json_bytes > self.max_request_bytes:
            raise ValueError(
                f"RequestLimits: max_json_bytes ({self.max_json_bytes}) must not exceed max_request_bytes "
                f"({self.max_request_bytes})"
            )
        if self.max_inflight_bytes < self.max_request_bytes:
            raise ValueError(
                f"RequestLimits: max_inflight_bytes ({self.max_inflight_bytes}) must hold one request of "
                f"max_request_bytes ({self.max_request_bytes})"
            )


def limits_from_overrides(overrides: list[str]) -> RequestLimits:
    """RequestLimits from NAME=VALUE words (`hugerec serve --limit max_users=64`); ValueError naming a bad one."""
    types = {f.name: f.type for f in fields(RequestLimits)}
    values: dict[str, Any] = {}
    for word in overrides:
        name, sep, text = word.partition("=")
        name = name.strip()
        if not sep or name not in types:
            raise ValueError(f"--limit {word!r}: use NAME=VALUE with NAME one of {sorted(types)}")
        try:
            values[name] = float(text) if types[name] == "float" else int(text)
        except ValueError:
            raise ValueError(f"--limit {word!r}: {text!r} is not a number") from None
    return RequestLimits(**values)


def overloaded(what: str, limits: RequestLimits) -> RequestError:
    """The 503 of a full server (answered with Retry-After: retry_after_s)."""
    return RequestError(f"server busy: {what}; retry after {limits.retry_after_s} s", status=503)


class Admission:
    """Requests and body bytes in flight, against RequestLimits.max_requests and max_inflight_bytes.

    Runs on the event loop only (no lock): `enter` when a request arrives, `reserve` as its body is read,
    `leave` when it has been answered."""

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self.requests = 0
        self.bytes = 0

    def enter(self, scope: Scope) -> bool:
        """Admit a request (False: max_requests are in flight; answer 503 at once)."""
        if self.requests >= self.limits.max_requests:
            return False
        self.requests += 1
        scope[TICKET] = 0
        return True

    def reserve(self, scope: Scope, n: int) -> None:
        """Count n more body bytes of the request (503 when the bodies in flight would pass the budget)."""
        reserved = scope.get(TICKET)
        if reserved is None:  # a request that did not come through enter (an app mounted elsewhere)
            return
        if self.bytes + n > self.limits.max_inflight_bytes:
            raise overloaded(f"request bodies in flight would pass {self.limits.max_inflight_bytes} bytes", self.limits)
        self.bytes += n
        scope[TICKET] = reserved + n

    def leave(self, scope: Scope) -> None:
        reserved = scope.pop(TICKET, None)
        if reserved is not None:
            self.requests -= 1
            self.bytes -= reserved


def check_declared_length(declared: str | None, max_bytes: int) -> int | None:
    """The Content-Length (None when absent); 413 when it announces more than `max_bytes`."""
    if declared is None:
        return None
    if not declared.isdigit() or len(declared) > 18:
        raise RequestError(f"Content-Length {declared[:30]!r} is not a byte count", status=400)
    if int(declared) > max_bytes:
        raise RequestError(f"payload of {declared} bytes exceeds the limit of {max_bytes}", status=413)
    return int(declared)


def _body_timeout(timeout_s: float) -> RequestError:
    return RequestError(
        f"the request body did not arrive within {timeout_s} s (fewer bytes than Content-Length?)", status=408
    )


class _Body:
    """A body read into one buffer: preallocated from the Content-Length (one copy of the bytes), else grown."""

    def __init__(self, declared: int | None, max_bytes: int, admission: Admission | None, scope: Scope) -> None:
        self.max_bytes, self.admission, self.scope = max_bytes, admission, scope
        self.size = 0
        self.declared = declared
        if declared is not None and admission is not None:
            admission.reserve(scope, declared)
        self.buffer = bytearray(declared) if declared is not None else bytearray()

    def add(self, chunk: bytes) -> None:
        n = len(chunk)
        if self.size + n > self.max_bytes:
            raise RequestError(f"payload exceeds the limit of {self.max_bytes} bytes", status=413)
        if self.declared is None:
            if self.admission is not None:
                self.admission.reserve(self.scope, n)
            self.buffer += chunk
        elif self.size + n > self.declared:
            raise RequestError(f"the body is longer than its Content-Length of {self.declared} bytes")
        else:
            self.buffer[self.size : self.size + n] = chunk
        self.size += n

    def bytes(self) -> bytes:
        """The body (the buffer itself, not a copy: a bytearray is read like bytes by the decoders)."""
        if self.declared is not None and self.size != self.declared:
            raise RequestError(f"the body has {self.size} bytes, its Content-Length says {self.declared}")
        return self.buffer  # type: ignore[return-value]


async def read_asgi_body(
    scope: Scope, receive: Receive, max_bytes: int, timeout_s: float, admission: Admission | None = None
) -> bytes | None:
    """A request body from raw ASGI messages; None when the client left before sending all of it.

    One deadline for the whole body: the connection's (a scope with BODY_DEADLINE no longer than timeout_s:
    the protocol closes the request then, and receive() answers a disconnect), else an asyncio.timeout here
    (a timer, where wait_for per message made a task and an event-loop turn of each). A body that came in one
    message of its Content-Length (every small request) is that message's bytes, reserved and returned
    without a buffer or a copy."""
    declared = None
    for key, value in scope["headers"]:
        if key == b"content-length":
            declared = check_declared_length(value.decode("latin-1"), max_bytes)
    if declared is not None and admission is not None:
        admission.reserve(scope, declared)  # before a byte is read: receive() resumes reading the socket
    kept = scope.get(BODY_DEADLINE)
    if kept is not None and kept <= timeout_s:
        return await _receive_body(scope, receive, declared, max_bytes, admission)
    try:
        async with asyncio.timeout(timeout_s):
            return await _receive_body(scope, receive, declared, max_bytes, admission)
    except TimeoutError:
        raise _body_timeout(timeout_s) from None


async def _receive_body(
    scope: Scope, receive: Receive, declared: int | None, max_bytes: int, admission: Admission | None
) -> bytes | None:
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    chunk = message.get("body", b"")
    more = message.get("more_body", False)
    if not more and declared is not None and len(chunk) == declared:
        return chunk  # bytes, as ASGI says
    body = _Body(declared, max_bytes, admission if declared is None else None, scope)  # reserved above
    body.add(chunk)
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body.add(message.get("body", b""))
        more = message.get("more_body", False)
    return body.bytes()


async def read_request_body(
    request: Request, max_bytes: int, timeout_s: float, admission: Admission | None = None
) -> bytes:
    """A framework request's body, with the same limits."""
    declared = check_declared_length(request.headers.get("content-length"), max_bytes)
    body = _Body(declared, max_bytes, admission, request.scope)
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body.add(chunk)
    except TimeoutError:
        raise _body_timeout(timeout_s) from None
    return body.bytes()


def error_headers(code: int, limits: RequestLimits) -> list[tuple[bytes, bytes]]:
    """Headers of an error answer: the connection closes after 408 and 413 (the rest of the body is not read),
    and a 503 says when to come back."""
    raw = [(b"content-type", b"application/json")]
    if code in (408, 413, 431):
        raw.append((b"connection", b"close"))
    if code == 503:
        raw.append((RETRY_AFTER.encode(), str(limits.retry_after_s).encode()))
    return raw


def header_dict(raw: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}
