"""Body limits on raw ASGI messages: 413 by Content-Length before reading and past the limit while reading,
408 when the next part does not come in time, None when the client leaves (the HTTP-level behaviour is
tested in test_server.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hugerec.serving.http.limits import read_asgi_body
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
