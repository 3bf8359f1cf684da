"""Connection-level limits in the HTTP protocol, where uvicorn has none: a deadline for the request head, one for
the whole body, a bound on the head's size and on the open connections.

uvicorn (0.54, httptools) starts no timer while a connection sends its request line and headers (its
keep-alive timer is cancelled by the first byte), so a client sending one byte every few seconds holds a
connection for ever; headers are collected without a size bound; and its `limit_concurrency` answers 503
without Retry-After and counts idle connections and requests together. `guarded_protocol(limits)` is
uvicorn's httptools protocol with:

    head deadline   header_timeout_s from a connection's first byte (or from when it opened) to the end of the
                    headers: 408 and the connection closed
    head size       max_header_bytes of request line + headers: 431, closed
    body deadline   body_timeout_s for the whole body once the headers are in, whether or not the app reads it:
                    408 when nothing was answered yet, then closed; the request's scope carries the deadline
                    (limits.BODY_DEADLINE), so that the app's raw-ASGI reading arms no timer of its own (it sees a
                    disconnect at the deadline; limits.read_asgi_body)
    connections     beyond max_connections open ones, a new connection's request is answered 503 with
                    Retry-After and the connection closed, without reaching the app

Idle kept-alive connections keep uvicorn's keep-alive timer (keep_alive_s).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from enum import Enum
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hugerec.serving.http.limits import BODY_DEADLINE, RequestLimits


class _Phase(Enum):
    HEAD = "head"  # waiting for (the rest of) a request head
    BODY = "body"  # headers in, body still arriving
    ANSWER = "answer"  # the whole request is in: the app answers it, then uvicorn's keep-alive timer runs


_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def raw_response(code: int, message: str, retry_after_s: int | None = None) -> bytes:
    """A whole HTTP/1.1 error response with a JSON body that closes the connection."""
    body = json.dumps({"error": message}).encode()
    head = [
        b"HTTP/1.1 %d %s" % (code, _REASONS[code]),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if retry_after_s is not None:
        head.append(b"retry-after: %d" % retry_after_s)
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def guarded_protocol(limits: RequestLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the limits above (pass it as uvicorn.Config(http=...))."""

    def answer(code: int, message: str, retry_after_s: int | None = None) -> Any:
        """An ASGI app answering every request with `code` and closing the connection."""
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        if retry_after_s is not None:
            headers.append((b"retry-after", str(retry_after_s).encode()))

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": code, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return app

    refuse = answer(
        503, f"server busy: {limits.max_connections} connections are open; retry after {limits.retry_after_s} s", limits.retry_after_s
    )
    oversized = answer(431, f"the request head exceeds {limits.max_header_bytes} bytes")

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        # Two methods run per request beyond uvicorn's (data_received, on_headers_complete): this guard's cost is
        # the server's at batch 1, where a request costs the server about 100 us
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._phase = _Phase.HEAD
            self._head_bytes = 0
            self._timer: asyncio.TimerHandle | None = None
            self._request_cycle: Any = None  # the cycle whose head completed last

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self.app = refuse  # every request of this connection (uvicorn reads self.app per request)
            self._arm(limits.header_timeout_s, self._head_expired)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            # A timer is armed only for what is still to come: a request whose head (and body) came in this
            # one call, as small requests do, starts and cancels no timer here (its deadlines had nothing
            # to bound: the parse of one chunk).
            phase = self._phase
            if phase is _Phase.ANSWER:  # the first bytes of the next request (kept alive, or pipelined)
                phase = self._phase = _Phase.HEAD
                self._head_bytes = len(data)
                first = True
            else:
                first = False
                if phase is _Phase.HEAD:
                    self._head_bytes += len(data)
            super().data_received(data)
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if phase is _Phase.HEAD:
                if cycle is not None and cycle is not self._request_cycle:  # the head is complete
                    self._request_cycle = cycle
                    if cycle.more_body:
                        self._phase = _Phase.BODY
                        self._arm(limits.body_timeout_s, self._body_expired)
                        return
                    self._phase = _Phase.ANSWER  # no deadline until the answer (then uvicorn's keep-alive timer)
                    if self._timer is not None:
                        self._disarm()
                elif self._head_bytes > limits.max_header_bytes:
                    self._close_with(431, f"the request head exceeds {limits.max_header_bytes} bytes")
                elif first:  # the head deadline runs from this first byte
                    self._arm(limits.header_timeout_s, self._head_expired)
            elif phase is _Phase.BODY and cycle is not None and not cycle.more_body:
                self._phase = _Phase.ANSWER
                self._disarm()
            # BODY and answered before the body was in (413, 503...): the body deadline still runs for the bytes
            # still coming

        def on_headers_complete(self) -> None:
            # a head that came in one piece is measured here (one that trickles in, as it arrives); ": " and CRLF
            # per header; map and chain, not a generator: this runs on every request
            headers = self.headers
            if len(self.url) + sum(map(len, itertools.chain.from_iterable(headers))) + 4 * len(headers) > limits.max_header_bytes:
                self.app = oversized  # this request, and the connection closes after its answer
            # the app reads the body without a timer of its own: this protocol closes the request at the deadline
            self.scope[BODY_DEADLINE] = limits.body_timeout_s  # type: ignore[literal-required]
            super().on_headers_complete()

        def _arm(self, seconds: float, callback: Any) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, callback)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _head_expired(self) -> None:
            self._timer = None
            if self._phase is not _Phase.HEAD or self.transport.is_closing():
                return
            if self._head_bytes == 0:  # opened and never used
                self.transport.close()
                return
            self._close_with(408, f"the request head did not arrive within {limits.header_timeout_s} s")

        def _body_expired(self) -> None:
            self._timer = None
            if self._phase is not _Phase.BODY or self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                self._close_with(408, f"the request body did not arrive within {limits.body_timeout_s} s")
            else:
                self.transport.close()

        def _close_with(self, code: int, message: str) -> None:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True  # the app's answer, if any, is not written; its reading sees a disconnect
                cycle.message_event.set()
            self.transport.write(raw_response(code, message))
            self.transport.close()

    return GuardedHttpToolsProtocol
