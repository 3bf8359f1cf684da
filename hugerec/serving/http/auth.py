"""Who may call a route that writes: bearer tokens, one per scope.

    TokenScope.ADMIN   the admin API (load, load_delta, unload, index, canary, promote, rollback, /admin/*) and the
                  feature overwrite POST /recommend/features
    TokenScope.INGEST  what clients feed back: POST /feedback and POST /recommend/interactions

The admin token is accepted for every scope (an operator may do what a client may); an ingest token only for
ingest. A scope without a token configured is off (403), so a server started without tokens takes no writes
at all. A call carries "Authorization: Bearer <token>", compared in constant time (hmac.compare_digest) with
every token accepted for the scope (401 otherwise); a token is never read from the query string or the body.
A later read-only scope (a status page) is one more member here and one more token in Tokens.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import Enum

from starlette.datastructures import Headers

from hugerec.serving.runtime.inference_protocol import RequestError

MIN_TOKEN_CHARS = 16


class TokenScope(Enum):
    ADMIN = "admin"
    INGEST = "ingest"


@dataclass(frozen=True)
class Tokens:
    """The server's tokens (None: that scope's own token is not set)."""

    admin: str | None = None
    ingest: str | None = None

    def __post_init__(self) -> None:
        for name in ("admin", "ingest"):
            token = getattr(self, name)
            if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS):
                raise ValueError(f"Tokens: the {name} token must have at least {MIN_TOKEN_CHARS} characters")
        if self.admin is not None and self.admin == self.ingest:
            raise ValueError("Tokens: the admin and ingest tokens must differ (an ingest client would be an admin)")

    def accepted(self, scope: TokenScope) -> list[str]:
        """The tokens that open `scope`."""
        match scope:
            case TokenScope.ADMIN:
                return [t for t in (self.admin,) if t is not None]
            case TokenScope.INGEST:
                return [t for t in (self.admin, self.ingest) if t is not None]


def check_token(tokens: Tokens, scope: TokenScope, headers: Headers) -> None:
    """RequestError (403: no token opens the scope on this server, 401: missing or wrong) unless the
    Authorization header carries a token of `scope`."""
    accepted = tokens.accepted(scope)
    if not accepted:
        raise RequestError(
            f"{scope.value} endpoints are disabled: start the server with an {scope.value} token", status=403
        )
    given = headers.get("authorization", "").encode("utf-8", "replace")
    ok = False
    for token in accepted:  # every token compared, whichever matches: the time does not say which
        ok |= hmac.compare_digest(given, f"Bearer {token}".encode())
    if not ok:
        raise RequestError(f"{scope.value} endpoints need 'Authorization: Bearer <token>'", status=401)
