"""The connection limits of the HTTP protocol, with real slow sockets against a live server: a head that trickles
in, a body that trickles in (one deadline for all of it, not one per chunk), a head too large, too many
connections; and a normal client still answered at once while slow ones are held."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.http.connection_limits import raw_response
from hugerec.serving.http.limits import RequestLimits
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig

LIMITS = RequestLimits(header_timeout_s=1.0, body_timeout_s=1.5, max_header_bytes=4096, max_connections=40)


@pytest.fixture(scope="module")
def url(toy: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    srv = InferenceServer(ServerConfig(limits=LIMITS), ServeOptions(state_dir=str(tmp_path_factory.mktemp("state"))))
    srv.add_bundle(toy.bundle)  # the infer route reads its body on raw ASGI messages, with the connection's deadline
    with BackgroundServer(srv) as url:
        yield url
    srv.close()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)


def _trickle(sock: socket.socket, data: bytes, every_s: float, until_s: float) -> tuple[bytes, float]:
    """Send `data` a byte every `every_s` until the server answers or closes -> (what it sent, seconds taken)."""
    t0 = time.monotonic()
    sock.settimeout(every_s)
    got = b""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:  # the server closed the connection
            break
        try:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
            if b"\r\n\r\n" in got:
                break
        except TimeoutError:
            pass
        assert time.monotonic() - t0 < until_s, "the server still holds the connection"
    sock.settimeout(5)
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except OSError:
        pass
    return got, time.monotonic() - t0


def test_a_head_sent_a_byte_at_a_time_is_cut_at_the_head_deadline(url: str) -> None:
    """#28: uvicorn starts no timer while headers arrive: one byte every 10 s held a connection for ever."""
    head = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n" + b"x-slow: " + b"a" * 200 + b"\r\n\r\n"
    with _connect(url) as sock:
        got, took = _trickle(sock, head, 0.1, until_s=6)
    assert got.startswith(b"HTTP/1.1 408") and b"request head did not arrive within 1.0 s" in got, got
    assert 0.9 < took < 4


def test_a_body_sent_a_byte_at_a_time_is_cut_at_the_whole_body_deadline(url: str) -> None:
    """Each byte arrives well within body_timeout_s, but the whole body does not: 408 (the deadline did reset on
    every chunk)."""
    with _connect(url) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n")
        got, took = _trickle(sock, b"{" + b" " * 399, 0.1, until_s=6)
    assert got.startswith(b"HTTP/1.1 408") and b"did not arrive within 1.5 s" in got, got
    assert 1.3 < took < 4.5


def test_an_infer_body_sent_a_byte_at_a_time_is_cut_at_the_whole_body_deadline(url: str) -> None:
    """The infer route's read arms no timer of its own: the connection's deadline ends it (408, closed)."""
    with _connect(url) as sock:
        sock.sendall(b"POST /v2/models/toy/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n")
        got, took = _trickle(sock, b"{" + b" " * 399, 0.1, until_s=30)
    assert got.startswith(b"HTTP/1.1 408") and b"request body did not arrive within 1.5 s" in got, got
    assert took > 1.3  # never before the deadline


def test_a_body_the_app_does_not_read_is_cut_too(url: str) -> None:
    """A GET with a trickling body: the app answers without reading it; the connection goes at the deadline."""
    with _connect(url) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")
        got, took = _trickle(sock, b"x" * 1000, 0.1, until_s=6)
    assert got.startswith(b"HTTP/1.1 200"), got
    assert took < 4.5


def test_a_connection_that_sends_nothing_is_closed(url: str) -> None:
    with _connect(url) as sock:
        t0 = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - t0 < 4


def test_a_head_too_large_is_431(url: str) -> None:
    with _connect(url) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n" + b"x-big: " + b"a" * 8000 + b"\r\n\r\n")
        got = sock.recv(65536)
    assert got.startswith(b"HTTP/1.1 431") and b"exceeds 4096 bytes" in got, got


def test_past_max_connections_a_request_is_answered_503_with_retry_after(url: str) -> None:
    held = [_connect(url) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.2)
        r = httpx.get(f"{url}/v2/health/live", timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and "40 connections are open" in r.json()["error"]
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert httpx.get(f"{url}/v2/health/live", timeout=10).status_code == 200


def test_a_normal_client_is_answered_at_once_while_slow_clients_are_held(url: str) -> None:
    """30 connections trickling their heads (inside max_connections): a normal request does not wait for them."""
    slow = [_connect(url) for _ in range(30)]
    try:
        for s in slow:
            s.sendall(b"POST /predict HTTP/1.1\r\nhost: x\r\n")
        t0 = time.monotonic()
        assert httpx.get(f"{url}/v2/health/live", timeout=10).status_code == 200
        assert time.monotonic() - t0 < 1.0
    finally:
        for s in slow:
            s.close()


def test_raw_response_is_a_whole_http_answer() -> None:
    raw = raw_response(503, "busy", retry_after_s=2)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable") and b"retry-after: 2" in head and b"connection: close" in head
    assert body == b'{"error": "busy"}' and f"content-length: {len(body)}".encode() in head
