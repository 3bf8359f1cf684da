"""ModelVersions: the loaded versions of one model and how traffic is split between them.

    stable   answers every request not sent to the canary
    canary   optional; receives `share` of the traffic (0..1) until promoted or rolled back
    history  previous stables, newest last: `rollback` without a canary returns to the last one

Requests may also name a version explicitly (/v2/models/{name}/versions/{v}/infer).

Unloading never fails a request in flight: a request holds its version from routing to its answer
(`acquire` / `release`); `remove` takes the version out of routing at once (new requests go elsewhere, or
get 404 when they name it) and then waits until the requests holding it are answered (at most `drain_s`)
before the caller closes it.

fields() is what the loaded versions take together (protocol.LiveFields): a version ignores request
fields only another loaded version takes, so a stable and a canary of different schemas share the
traffic; it is computed once after each load or unload, not per request. fallback(v): the other of
stable and canary, which answers a request the version it was routed to cannot take (the server's
routing, server.py).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hugerec.serving.runtime.batching import DynamicBatcher
from hugerec.serving.runtime.gbm_model import GBMModel
from hugerec.serving.runtime.inference_model import InferenceModel
from hugerec.serving.runtime.inference_protocol import LiveFields, Signature
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor


@dataclass(eq=False)
class ServedModel:
    """One loaded model version: the model, its batcher, its request signature and preprocessing.

    preprocess   /predict's raw feature dicts -> ModelInputs (with the fitted workflow, when there is one)
    closers      called on unload, in order (batcher, update watchers, parameter server)
    """

    name: str
    version: str
    model: InferenceModel | GBMModel  # a GBM version scores the same ModelInputs (serving/gbm.py)
    batcher: DynamicBatcher
    signature: Signature
    preprocess: RequestPreprocessor
    info: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)

    async def logits(self, inputs: ModelInputs) -> np.ndarray:
        return await self.batcher.submit(inputs)

    def close(self) -> None:
        """Release the version's resources (once; later calls do nothing)."""
        closers, self.closers = self.closers, []
        for close in closers:
            close()


class ModelVersions:
    """Versions of the model `name`; all methods are thread safe."""

    def __init__(self, name: str, seed: int | None = None) -> None:
        self.name = name
        self._versions: dict[str, ServedModel] = {}
        self.stable: str | None = None
        self.canary: str | None = None
        self.share = 0.0
        self.history: list[str] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a version's last request is answered
        self._inflight: dict[int, int] = {}  # id(ServedModel) -> requests holding it
        self._fields: LiveFields | None = None  # computed on first use after a load or unload

    def __contains__(self, version: str) -> bool:
        return version in self._versions

    def versions(self) -> list[str]:
        return list(self._versions)

    def add(self, served: ServedModel) -> None:
        """Load a version; the first one becomes stable, later ones wait for set_canary/promote."""
        with self._lock:
            if served.version in self._versions:
                raise ValueError(f"model {self.name!r}: version {served.version!r} is already loaded")
            self._versions[served.version] = served
            self._fields = None
            if self.stable is None:
                self.stable = served.version

    def get(self, version: str) -> ServedModel:
        try:
            return self._versions[version]
        except KeyError:
            raise KeyError(f"model {self.name!r} has no version {version!r}; loaded: {list(self._versions)}") from None

    def acquire(self, version: str | None = None) -> ServedModel:
        """The version a request goes to (route() or the named one), held until `release`: unloading it
        waits for the request."""
        with self._lock:
            served = self.route() if version is None else self.get(version)
            self._inflight[id(served)] = self._inflight.get(id(served), 0) + 1
            return served

    def release(self, served: ServedModel) -> None:
        with self._lock:
            left = self._inflight.pop(id(served)) - 1
            if left:
                self._inflight[id(served)] = left
            else:
                self._idle.notify_all()

    def route(self) -> ServedModel:
        """The version this request goes to: the canary with probability `share`, else the stable one."""
        stable, canary, share = self.stable, self.canary, self.share
        if stable is None:
            raise KeyError(f"model {self.name!r} has no version loaded")
        if canary is not None and self._rng.random() < share:
            return self._versions[canary]
        return self._versions[stable]

    def fields(self) -> LiveFields:
        """The request fields the loaded versions take together (protocol.LiveFields)."""
        fields = self._fields
        if fields is None:
            with self._lock:
                served = [s for s in self._versions.values() if isinstance(s, ServedModel)]
                fields = LiveFields(
                    frozenset().union(*(s.signature.input_names() for s in served)),
                    frozenset().union(*(s.preprocess.keys for s in served)),
                    frozenset(s.signature.num_dense for s in served),
                    len(served),
                )
                self._fields = fields
        return fields

    def fallback(self, version: str) -> ServedModel | None:
        """The version that answers a request `version` (routed to by share) cannot take: the canary for the
        stable one while the canary has a share of the traffic, the stable one for the canary; else None."""
        stable, canary, share = self.stable, self.canary, self.share
        if canary is None or stable is None:
            return None
        if version == stable and share > 0:
            return self._versions.get(canary)
        return self._versions.get(stable) if version == canary else None

    def acquire_fallback(self, version: str) -> ServedModel | None:
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

    def remove(self, version: str, drain_s: float = 60.0) -> ServedModel:
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
