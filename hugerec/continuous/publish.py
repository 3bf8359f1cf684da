"""Publishing to a running server over its admin API: a candidate (a whole bundle, or a version delta on
top of the stable version) as a canary, promote, roll back, unload an old version.

Every call is retried (`retries` times, doubling `backoff_s`) while the server cannot be reached or
answers 5xx; then PublishError says which server, what and why. Publishing is all or nothing and
idempotent: the version is loaded (unless the server already has it), then made the canary; if either
step fails (a refusal, a checksum mismatch, retries exhausted, a load whose answer was lost) a version
the server holds without serving it is unloaded again, so the server is never left with half a publish,
and a loop restarted after a kill can publish the same version again without loading it twice.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PublishError(RuntimeError):
    """The server could not be reached, or refused the update, after every retry."""


@dataclass(frozen=True)
class ServerTarget:
    """The admin API of a hugerec server: url (http://host:port), model name, admin token."""

    url: str
    model: str
    token: str
    retries: int = 3
    backoff_s: float = 0.2
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"ServerTarget: url must start with http:// or https://, got {self.url!r}")
        if self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError(
                f"ServerTarget: need retries >= 0, backoff_s >= 0, timeout_s > 0, got "
                f"{self.retries}, {self.backoff_s}, {self.timeout_s}"
            )


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Publisher:
    def __init__(self, target: ServerTarget) -> None:
        self.target = target

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One admin call, retried on connection errors and 5xx; 4xx raise _Refused at once."""
        t = self.target
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {t.token}", "Content-Type": "application/json"}
        last = ""
        for attempt in range(t.retries + 1):
            if attempt:
                time.sleep(t.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(t.url.rstrip("/") + path, data, headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=t.timeout_s) as response:
                    answer = json.loads(response.read() or b"{}")
                    return answer if isinstance(answer, dict) else {"result": answer}
            except urllib.error.HTTPError as e:
                text = e.read().decode(errors="replace")[:300]
                if e.code < 500:
                    raise _Refused(e.code, text) from None
                last = f"HTTP {e.code}: {text}"
            except (urllib.error.URLError, OSError) as e:
                last = str(getattr(e, "reason", e))
        raise PublishError(f"server {t.url}: {method} {path} failed after {t.retries + 1} attempts: {last}")

    def status(self) -> dict[str, Any] | None:
        """stable, canary, canary_share, versions, history of the model; None when the server has no such model."""
        try:
            return self._call("GET", f"/admin/models/{self.target.model}")
        except _Refused as e:
            if e.status == 404:
                return None
            raise PublishError(f"server {self.target.url}: status of {self.target.model!r} refused: {e}") from None

    def flush_logs(self) -> None:
        """Ask the server to write its buffered request log and feedback to Parquet now."""
        try:
            self._call("POST", "/admin/logs/flush")
        except _Refused as e:
            raise PublishError(f"server {self.target.url}: flushing the request log refused: {e}") from None

    def publish(self, bundle: str | Path, version: str, share: float) -> dict[str, Any]:
        """Load `bundle` as `version` and make it the canary with `share` of the traffic (the first version
        of a model becomes stable instead). Returns the model's status afterwards."""
        m = self.target.model
        body = {"bundle": str(bundle), "version": version}
        return self._publish(
            f"/v2/repository/models/{m}/load", body, version, share, f"loading {bundle} as {m}:{version}"
        )

    def publish_delta(self, delta: str | Path, base: str, version: str, share: float) -> dict[str, Any]:
        """Make `version` on the server from the loaded version `base` plus the version delta at `delta`
        (hugerec.serving.bundles.version_delta; `base` is not touched) and make it the canary with `share` of the
        traffic. Returns the model's status afterwards."""
        m = self.target.model
        body = {"delta": str(delta), "base": base, "version": version}
        what = f"deriving {m}:{version} from {m}:{base} + {delta}"
        return self._publish(f"/v2/repository/models/{m}/load_delta", body, version, share, what)

    def _publish(self, path: str, body: dict[str, Any], version: str, share: float, what: str) -> dict[str, Any]:
        m = self.target.model
        status = self.status()
        loaded_now = False
        if status is None or version not in status["versions"]:
            try:
                self._call("POST", path, body)
            except (PublishError, _Refused) as e:
                self._take_back(version)  # the server may have loaded it and lost the answer
                raise PublishError(f"server {self.target.url}: {what} failed: {e}") from None
            loaded_now = True
        if status is None:
            return self.status() or {}
        if status["stable"] == version or status["canary"] == version:
            return status
        try:
            return self._call("POST", f"/admin/models/{m}/canary", {"version": version, "share": share})
        except (PublishError, _Refused) as e:
            if loaded_now:  # all or nothing: take the version back out
                self._take_back(version)
            raise PublishError(f"server {self.target.url}: making {m}:{version} the canary failed: {e}") from None

    def _take_back(self, version: str) -> None:
        """Unload `version` if the server holds it without serving it (best effort: the server may be gone)."""
        with contextlib.suppress(PublishError, _Refused):
            status = self.status()
            if (
                status is not None
                and version in status["versions"]
                and version not in (status["stable"], status["canary"])
            ):
                self._call("POST", f"/v2/repository/models/{self.target.model}/unload", {"version": version})

    def unload(self, version: str) -> bool:
        """Unload `version`, which must be neither the stable version nor the canary (PublishError); False when
        the server does not hold it (unloaded before, e.g. by a loop killed before it logged the unload)."""
        m = self.target.model
        status = self.status()
        if status is None or version not in status["versions"]:
            return False
        if version in (status["stable"], status["canary"]):
            raise PublishError(f"server {self.target.url}: {m}:{version} is serving traffic: not unloading it")
        try:
            self._call("POST", f"/v2/repository/models/{m}/unload", {"version": version})
        except _Refused as e:
            if e.status == 404:
                return False  # gone between the status and the call
            raise PublishError(f"server {self.target.url}: unloading {m}:{version} refused: {e}") from None
        return True

    def promote(self, version: str) -> dict[str, Any]:
        """Make the canary `version` stable (nothing to do when it already is)."""
        status = self.status()
        if status is not None and status["stable"] == version:
            return status
        try:
            return self._call("POST", f"/admin/models/{self.target.model}/promote", {"version": version})
        except _Refused as e:
            raise PublishError(f"server {self.target.url}: promoting {version!r} refused: {e}") from None

    def rollback(self, version: str) -> dict[str, Any]:
        """Drop the canary `version` (nothing to do when it is no longer the canary)."""
        status = self.status()
        if status is None or status["canary"] != version:
            return status or {}
        try:
            return self._call("POST", f"/admin/models/{self.target.model}/rollback")
        except _Refused as e:
            raise PublishError(f"server {self.target.url}: rolling back {version!r} refused: {e}") from None
