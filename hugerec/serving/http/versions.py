"""ModelVersions: the loaded versions of one served name (any kind: runtime/served_object.py) and how traffic
is split between them.

    stable   answers every request not sent to the canary
    canary   optional; receives `share` of the traffic (0..1) until promoted or rolled back
    history  previous stables, newest last: `rollback` without a canary returns to the last one

Requests may also name a version explicitly (/v2/models/{name}/versions/{v}/infer). A request that names
no version and only asks about the model (metadata, readiness, config) is answered by the stable version
(`live`), so the answer does not depend on the canary draw.

Unloading never fails a request in flight: a request holds its version from routing to its answer
(`acquire` / `release`); `remove` takes the version out of routing at once (new requests go elsewhere, or
get 404 when they name it) and then waits until the requests holding it are answered (at most `drain_s`)
before the caller closes it.

fields() is what the loaded versions take together (inference_protocol.LiveFields): a version ignores request
fields only another loaded version takes, so a stable and a canary of different schemas share the
traffic; it is computed once after each load or unload, not per request. fallback(v): the other of
stable and canary, which answers a request the version it was routed to cannot take (the server's
routing, server.py).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from hugerec.serving.runtime.inference_protocol import LiveFields
from hugerec.serving.runtime.served_object import ServedObject


class ModelVersions:
    """Versions of the model `name`; all methods are thread safe."""

    def __init__(self, name: str, seed: int | None = None) -> None:
        self.name = name
        self._versions: dict[str, ServedObject] = {}
        self.stable: str | None = None
        self.canary: str | None = None
        self.share = 0.0
        self.history: list[str] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a version's last request is answered
        self._inflight: dict[int, int] = {}  # id(ServedObject) -> requests holding it
        self._fields: LiveFields | None = None  # computed on first use after a load or unload

    def __contains__(self, version: str) -> bool:
        return version in self._versions

    def versions(self) -> list[str]:
        return list(self._versions)

    @property
    def family(self) -> str | None:
        """The family of the loaded versions (served_object.py; None while none is loaded)."""
        first = next(iter(self._versions.values()), None)
        return None if first is None else first.family

    def add(self, served: ServedObject) -> None:
        """Load a version; the first one becomes stable, later ones wait for set_canary/promote. Versions of one
        name are of one family (scoring models, next-items models or pipelines): ValueError otherwise."""
        with self._lock:
            family = self.family
            if family is not None and served.family != family:
                kinds = sorted({s.kind for s in self._versions.values()})
                raise ValueError(
                    f"{self.name!r} serves {' / '.join(kinds)} versions; version {served.version!r} is a {served.kind}: "
                    "serve it under another name"
                )
            if served.version in self._versions:
                raise ValueError(f"model {self.name!r}: version {served.version!r} is already loaded")
            self._versions[served.version] = served
            self._fields = None
            if self.stable is None:
                self.stable = served.version

    def get(self, version: str) -> ServedObject:
        try:
            return self._versions[version]
        except KeyError:
            raise KeyError(f"model {self.name!r} has no version {version!r}; loaded: {list(self._versions)}") from None

    def acquire(self, version: str | None = None) -> ServedObject:
        """The version a request goes to (route() or the named one), held until `release`: unloading it
        waits for the request."""
        with self._lock:
            served = self.route() if version is None else self.get(version)
            self._inflight[id(served)] = self._inflight.get(id(served), 0) + 1
            return served

    def release(self, served: ServedObject) -> None:
        with self._lock:
            left = self._inflight.pop(id(served)) - 1
            if left:
                self._inflight[id(served)] = left
            else:
                self._idle.notify_all()

    def route(self) -> ServedObject:
        """The version this request goes to: the canary with probability `share`, else the stable one."""
        stable, canary, share = self.stable, self.canary, self.share
        if stable is None:
            raise KeyError(f"model {self.name!r} has no version loaded")
        if canary is not None and self._rng.random() < share:
            return self._versions[canary]
        return self._versions[stable]

    def live(self) -> ServedObject:
        """The stable version: what an unversioned metadata, readiness or config request describes, whatever
        share of the traffic a canary takes (KeyError while none is loaded)."""
        stable = self.stable
        if stable is None:
            raise KeyError(f"model {self.name!r} has no version loaded")
        return self._versions[stable]

    def fields(self) -> LiveFields:
        """The request fields the loaded versions take together (inference_protocol.LiveFields)."""
        fields = self._fields
        if fields is None:
            with self._lock:
                each = [s.fields() for s in self._versions.values()]
                fields = LiveFields(
                    frozenset().union(*(f.inputs for f in each)),
                    frozenset().union(*(f.keys for f in each)),
                    frozenset().union(*(f.dense for f in each)),
                    len(each),
                )
                self._fields = fields
        return fields

    def fallback(self, version: str) -> ServedObject | None:
        """The version that answers a request `version` (routed to by share) cannot take: the canary for the
        stable one while the canary has a share of the traffic, the stable one for the canary; else None."""
        stable, canary, share = self.stable, self.canary, self.share
        if canary is None or stable is None:
            return None
        if version == stable and share > 0:
            return self._versions.get(canary)
        return self._versions.get(stable) if version == canary else None

    def acquire_fallback(self, version: str) -> ServedObject | None:
        """fallback(version), held like acquire() (release it after answering): once a rollback has made it
        neither stable nor canary, an unload still waits for the request it answers."""
        with self._lock:
            served = self.fallback(version)
            if served is not None:
                self._inflight[id(served)] = self._inflight.get(id(served), 0) + 1
            return served

    def set_canary(self, version: str, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"model {self.name!r}: canary share must be in [0, 1], got {share}")
        with self._lock:
            self.get(version)
            if version == self.stable:
                raise ValueError(f"model {self.name!r}: version {version!r} is the stable one, not a canary")
            self.canary, self.share = version, share

    def promote(self, version: str | None = None) -> str:
        """Make `version` (default: the canary) the stable one; returns it."""
        with self._lock:
            target = version if version is not None else self.canary
            if target is None:
                raise ValueError(f"model {self.name!r}: no canary to promote (name a version)")
            self.get(target)
            if target != self.stable:
                if self.stable is not None:
                    self.history.append(self.stable)
                self.stable = target
            if self.canary == target or version is None:
                self.canary, self.share = None, 0.0
            return target

    def rollback(self) -> str:
        """Drop the canary if there is one, else return to the previous stable; returns the stable version."""
        with self._lock:
            if self.canary is not None:
                self.canary, self.share = None, 0.0
            elif self.history:
                self.stable = self.history.pop()
            else:
                raise ValueError(f"model {self.name!r}: nothing to roll back (no canary, no previous stable version)")
            assert self.stable is not None
            return self.stable

    def remove(self, version: str, drain_s: float = 60.0) -> ServedObject:
        """Take out a version that is neither stable nor canary and wait (at most drain_s seconds) until the
        requests holding it are answered; the caller then closes it. KeyError: no such version."""
        with self._lock:
            served = self.get(version)
            if version in (self.stable, self.canary):
                raise ValueError(
                    f"model {self.name!r}: version {version!r} is serving traffic; promote or roll back first"
                )
            del self._versions[version]
            self._fields = None
            self.history = [v for v in self.history if v != version]
            deadline = time.monotonic() + drain_s
            while id(served) in self._inflight and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            return served

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": list(self._versions),
            "stable": self.stable,
            "canary": self.canary,
            "canary_share": self.share,
            "history": list(self.history),
        }

    def close(self) -> None:
        for served in self._versions.values():
            served.close()
