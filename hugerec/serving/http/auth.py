"""Who may call a write route: the bearer token of the admin API (load, unload, canary, promote, rollback,
/admin/*, /recommend/features).

Off (403) while the server has no admin token; with one, a call needs "Authorization: Bearer <token>",
compared in constant time (401 otherwise). The token is never read from a query string.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from hugerec.serving.runtime.inference_protocol import RequestError


def check_admin_token(token: str | None, request: Request) -> None:
    """RequestError (403: no token configured, 401: missing or wrong) unless `request` carries `token`."""
    if token is None:
        raise RequestError("admin endpoints are disabled: start the server with an admin token", status=403)
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise RequestError("admin endpoints need 'Authorization: Bearer <token>'", status=401)
