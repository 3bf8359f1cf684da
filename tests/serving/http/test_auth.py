"""Tokens per scope: admin opens everything, ingest only ingest; a scope without a token is off; the header only."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from hugerec.serving.http.auth import Tokens, TokenScope, check_token
from hugerec.serving.runtime.inference_protocol import RequestError

ADMIN, INGEST = "a" * 16, "i" * 16


def bearer(token: str) -> Headers:
    return Headers({"authorization": f"Bearer {token}"})


def status(tokens: Tokens, scope: TokenScope, headers: Headers) -> int:
    try:
        check_token(tokens, scope, headers)
    except RequestError as e:
        return e.status
    return 200


def test_each_scope_takes_its_tokens() -> None:
    both = Tokens(ADMIN, INGEST)
    assert status(both, TokenScope.ADMIN, bearer(ADMIN)) == 200
    assert status(both, TokenScope.ADMIN, bearer(INGEST)) == 401  # an ingest client is no admin
    assert status(both, TokenScope.INGEST, bearer(INGEST)) == 200
    assert status(both, TokenScope.INGEST, bearer(ADMIN)) == 200  # an operator may do what a client may
    assert status(both, TokenScope.INGEST, Headers({})) == 401
    assert status(both, TokenScope.INGEST, Headers({"authorization": INGEST})) == 401  # "Bearer " is part of it
    assert status(both, TokenScope.INGEST, bearer(INGEST + "x")) == 401
    assert status(both, TokenScope.INGEST, Headers({"authorization": "Bearer \u00e9" * 4})) == 401  # not ASCII: no crash


def test_a_scope_without_a_token_is_off() -> None:
    assert status(Tokens(), TokenScope.ADMIN, bearer(ADMIN)) == 403
    assert status(Tokens(), TokenScope.INGEST, bearer(INGEST)) == 403
    assert status(Tokens(ingest=INGEST), TokenScope.ADMIN, bearer(INGEST)) == 403
    assert status(Tokens(admin=ADMIN), TokenScope.INGEST, bearer(ADMIN)) == 200
    with pytest.raises(RequestError, match="ingest endpoints are disabled: start the server with an ingest token"):
        check_token(Tokens(), TokenScope.INGEST, Headers({}))


def test_tokens_are_checked() -> None:
    with pytest.raises(ValueError, match="the admin token must have at least 16 characters"):
        Tokens(admin="short")
    with pytest.raises(ValueError, match="the admin and ingest tokens must differ"):
        Tokens(ADMIN, ADMIN)
