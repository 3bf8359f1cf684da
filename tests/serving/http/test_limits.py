"""Body limits on raw ASGI messages: 413 by Content-Length before reading and past the limit while reading,
408 when the whole body does not come in time, None when the client leaves; the in-flight admission; the
limits' checks (the HTTP-level behaviour is tested in test_server.py and test_connection_limits.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hugerec.serving.http.limits import BODY_DEADLINE, Admission, RequestLimits, limits_from_overrides, read_asgi_body
from hugerec.serving.runtime.inference_protocol import RequestError


def receiver(messages: list[dict[str, Any]], stall: bool = False) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def receive() -> dict[str, Any]:
        if not messages:
            if stall:
                await asyncio.sleep(60)
            return {"type": "http.disconnect"}
        return messages.pop(0)

    return receive


def read(headers: list[tuple[bytes, bytes]], messages: list[dict[str, Any]], max_bytes: int = 10, stall: bool = False) -> bytes | None:
    return asyncio.run(read_asgi_body({"headers": headers}, receiver(messages, stall), max_bytes, 0.2))  # type: ignore[arg-type]


def part(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_the_body_arrives_in_parts_within_the_limit() -> None:
    assert read([(b"content-length", b"6")], [part(b"abc", True), part(b"def", False)]) == b"abcdef"
    assert read([], [part(b"", False)]) == b""


def test_too_large_is_413_before_or_while_reading() -> None:
    with pytest.raises(RequestError, match="payload of 11 bytes exceeds the limit of 10") as e:
        read([(b"content-length", b"11")], [part(b"x", False)])
    assert e.value.status == 413
    with pytest.raises(RequestError, match="payload exceeds the limit of 10 bytes") as e:
        read([], [part(b"123456", True), part(b"78901", False)])  # no Content-Length: counted as it comes
    assert e.value.status == 413


def test_a_stalled_body_is_408_and_a_client_that_left_is_none() -> None:
    with pytest.raises(RequestError, match=r"did not arrive within 0\.2 s") as e:
        read([], [part(b"abc", True)], stall=True)
    assert e.value.status == 408
    assert read([], [part(b"abc", True)]) is None


def test_the_deadline_is_for_the_whole_body_not_per_part() -> None:
    """#28: the body timeout reset on every chunk, so a byte every few seconds held a request for ever."""

    async def trickle() -> dict[str, Any]:
        await asyncio.sleep(0.05)  # each part well within the 0.2 s deadline
        return part(b"x", True)

    with pytest.raises(RequestError, match=r"did not arrive within 0\.2 s") as e:
        asyncio.run(read_asgi_body({"headers": []}, trickle, 1 << 20, 0.2))  # type: ignore[arg-type]
    assert e.value.status == 408


def test_a_scope_whose_connection_keeps_the_body_deadline_is_read_without_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guarded protocol (connection_limits.py) closes a request at the body deadline and says so in the scope:
    the read arms no timer of its own (one per request was 4% of a batch-1 request's server CPU); at the
    deadline it sees the disconnect the protocol makes. A connection deadline longer than the app's keeps the
    app's timer."""

    def no_timer(seconds: float) -> Any:
        raise AssertionError(f"a {seconds} s timer was armed")

    with monkeypatch.context() as m:
        m.setattr(asyncio, "timeout", no_timer)
        one = {"headers": [(b"content-length", b"3")], BODY_DEADLINE: 0.2}
        assert asyncio.run(read_asgi_body(one, receiver([part(b"abc", False)]), 10, 0.2)) == b"abc"
        parts = {"headers": [], BODY_DEADLINE: 0.2}
        assert asyncio.run(read_asgi_body(parts, receiver([part(b"ab", True), part(b"c", False)]), 10, 0.2)) == b"abc"
        cut = {"headers": [], BODY_DEADLINE: 0.2}
        assert asyncio.run(read_asgi_body(cut, receiver([part(b"ab", True)]), 10, 0.2)) is None
    longer = {"headers": [], BODY_DEADLINE: 60.0}
    with pytest.raises(RequestError, match=r"did not arrive within 0\.2 s"):
        asyncio.run(read_asgi_body(longer, receiver([part(b"abc", True)], stall=True), 10, 0.2))


def test_a_body_longer_or_shorter_than_its_content_length_is_refused() -> None:
    with pytest.raises(RequestError, match="longer than its Content-Length of 3"):
        read([(b"content-length", b"3")], [part(b"abcd", False)])
    with pytest.raises(RequestError, match="has 2 bytes, its Content-Length says 3"):
        read([(b"content-length", b"3")], [part(b"ab", False)])
    with pytest.raises(RequestError, match="is not a byte count") as e:
        read([(b"content-length", b"9" * 30)], [part(b"ab", False)])
    assert e.value.status == 400


def test_admission_answers_503_past_the_requests_and_bytes_in_flight() -> None:
    admission = Admission(RequestLimits(max_requests=2, max_inflight_bytes=3000, max_request_bytes=2048, max_json_bytes=1024))
    scopes: list[dict[str, Any]] = [{"headers": []} for _ in range(3)]
    assert admission.enter(scopes[0]) and admission.enter(scopes[1]) and not admission.enter(scopes[2])
    admission.reserve(scopes[0], 2000)
    with pytest.raises(RequestError, match="bodies in flight would pass 3000 bytes") as e:
        admission.reserve(scopes[1], 1001)
    assert e.value.status == 503
    admission.leave(scopes[0])
    assert admission.requests == 1 and admission.bytes == 0
    admission.reserve(scopes[1], 1001)  # room again
    assert admission.enter(scopes[2])
    body = asyncio.run(read_asgi_body({"headers": [(b"content-length", b"2")], **scopes[2]}, receiver([part(b"ab", False)]), 10, 1, admission))  # type: ignore[arg-type]
    assert body == b"ab"


def test_limits_are_checked_and_set_from_words() -> None:
    for bad, says in (
        ({"header_timeout_s": 0}, "header_timeout_s must be in"),
        ({"max_users": 0}, "max_users must be an integer >= 1"),
        ({"max_json_bytes": 100}, "max_json_bytes must be an integer >= 1024"),
        ({"max_json_bytes": 1 << 30}, "must not exceed max_request_bytes"),
        ({"max_inflight_bytes": 1 << 20}, "must hold one request of max_request_bytes"),
        ({"max_k": True}, "max_k must be an integer"),
    ):
        with pytest.raises(ValueError, match=says):
            RequestLimits(**bad)
    assert limits_from_overrides(["max_users=64", "body_timeout_s=2.5"]) == RequestLimits(max_users=64, body_timeout_s=2.5)
    with pytest.raises(ValueError, match="use NAME=VALUE with NAME one of"):
        limits_from_overrides(["users=3"])
    with pytest.raises(ValueError, match="'many' is not a number"):
        limits_from_overrides(["max_users=many"])


def test_past_max_requests_a_request_is_answered_503_at_once_over_http() -> None:
    import socket
    import time

    import httpx

    from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig

    srv = InferenceServer(ServerConfig(limits=RequestLimits(max_requests=1, body_timeout_s=5)))
    try:
        with BackgroundServer(srv) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=10) as held:  # in flight: its body never comes
                held.sendall(b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{")
                time.sleep(0.3)
                t0 = time.monotonic()
                r = httpx.post(f"{url}/recommend", json={"user": 1}, timeout=10)
                assert r.status_code == 503 and r.headers["retry-after"] == "1" and "1 requests are in flight" in r.json()["error"]
                assert time.monotonic() - t0 < 1.0  # answered at once, not queued
                assert httpx.get(f"{url}/v2/health/live").status_code == 200  # health checks are never refused
            time.sleep(0.3)
            assert httpx.post(f"{url}/recommend", json={"user": 1}).status_code == 400  # room again (no pipeline)
    finally:
        srv.close()
