"""ServedObject: what the server serves under a name and a version, one interface for every kind.

    kind        family       what it is                               runtime
    model       scoring      an exported deep model (a model bundle)  ServedModel (served_model.py)
    gbm         scoring      gradient-boosted trees (a GBM bundle)    ServedModel
    next_items  next_items   a sequential model (next-items bundle)   NextItemsModel (next_items_model.py)
    pipeline    pipeline     a recommendation pipeline                ServedPipeline (pipeline/served_pipeline.py)

The server routes every request to a version (http/versions.py: ModelVersions, canary routing, draining) and
then calls one of these methods on it; it never asks which kind it holds. Every KServe v2 route has an answer
for every kind: `metadata`, `config` and `infer` are implemented by all of them; a route a kind does not
support (/predict of a pipeline, /recommend of a model, a version delta of trees, ...) raises `Unsupported`,
a 400 naming the object, its kind and what to use instead. Versions of one name are of one family: scoring
models (deep or trees) share /predict and the infer inputs, so a GBM may be the canary of a DLRM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.runtime.inference_protocol import LiveFields, RequestError
from hugerec.serving.runtime.model_inputs import ModelInputs

if TYPE_CHECKING:
    from hugerec.serving.runtime.inference_model import InferenceModel
    from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
    from hugerec.serving.store.parameter_server import ParameterServer


class Unsupported(RequestError):
    """A route the served object's kind does not answer (400): names the object, its kind and what to use."""

    def __init__(self, served: ServedObject, what: str, instead: str = "") -> None:
        hint = f"; {instead}" if instead else ""
        super().__init__(f"{served.kind} {served.name!r} (version {served.version!r}) does not support {what}{hint}")


@dataclass(frozen=True)
class Prediction:
    """A /predict answer before it is written: scores [B] and what the request log keeps of the rows."""

    scores: np.ndarray
    inputs: ModelInputs
    dense_names: tuple[str, ...] | None  # the dense columns' names (None: positional only)


@dataclass(frozen=True)
class DeltaBase:
    """What a version delta is applied to (bundles/version_delta.py derive_version): the model as loaded from
    its bundle, its request preprocessing and its info (`bundle`, `bundle_id`)."""

    model: InferenceModel
    preprocess: RequestPreprocessor
    info: Mapping[str, Any]


class ServedObject(ABC):
    """One loaded version of a served name. Subclasses set `family` and `platform`, say their `kind` and hold
    `name`, `version` and `info` (free-form facts for status and logs: the bundle path, its content id, ...)."""

    family: ClassVar[str]
    platform: ClassVar[str]
    name: str
    version: str
    info: dict[str, Any]

    # -- every kind ----------------------------------------------------------------------------
    @property
    @abstractmethod
    def kind(self) -> str:
        """"model", "gbm", "next_items" or "pipeline" (in messages and status)."""

    @abstractmethod
    def metadata(self) -> dict[str, Any]:
        """KServe v2 model metadata without the name and versions (the server adds them): platform, inputs,
        outputs, and whatever else the kind describes."""

    @abstractmethod
    def max_rows(self) -> int:
        """The most examples (rows, users, histories) one infer request may carry."""

    def config(self, batching: BatchingConfig) -> dict[str, Any]:
        """The Triton-style model config (GET /v2/models/{m}/config); a kind with a dynamic batcher adds it."""
        meta = self.metadata()
        return {
            "name": self.name,
            "platform": self.platform,
            "max_batch_size": self.max_rows(),
            "input": meta["inputs"],
            "output": meta["outputs"],
        }

    @abstractmethod
    def fields(self) -> LiveFields:
        """The request fields this version takes (ModelVersions unions them over a name's versions)."""

    @abstractmethod
    async def infer(self, body: bytes, header_length: str | None, live: LiveFields) -> tuple[bytes, dict[str, str]]:
        """A KServe v2 infer request's body -> (response body, headers); RequestError (4xx) for a bad request.
        `live`: the fields every loaded version of the name takes together (others' fields are ignored)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the version holds (stores, threads); later calls do nothing."""

    # -- some kinds ----------------------------------------------------------------------------
    async def predict(self, instances: object, live: LiveFields) -> Prediction:
        """/predict: raw feature rows -> scores (scoring models)."""
        raise Unsupported(self, "/predict", f"send KServe v2 requests to /v2/models/{self.name}/infer")

    def recommend(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """/recommend: one user's recommendations (pipelines)."""
        raise Unsupported(self, "/recommend", "it answers /v2/models/{m}/infer; /recommend needs a pipeline")

    def add_interactions(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """/recommend/interactions: what a user has now seen (pipelines)."""
        raise Unsupported(self, "/recommend/interactions", "it keeps no seen-items store; name a pipeline")

    def check_interactions(self, body: Mapping[str, Any]) -> None:
        """The RequestError `add_interactions(body)` would raise, without adding anything: the server checks
        every loaded version before any adds, so a post is kept by all of them or by none."""
        raise Unsupported(self, "/recommend/interactions", "it keeps no seen-items store; name a pipeline")

    def update_features(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """/recommend/features: overwrite feature columns (pipelines)."""
        raise Unsupported(self, "/recommend/features", "it keeps no feature store; name a pipeline")

    def delta_base(self) -> DeltaBase:
        """What a version delta applies to (deep models loaded from a model bundle)."""
        raise Unsupported(self, "version deltas", "load a whole bundle as the new version")

    def parameter_server(self) -> ParameterServer | None:
        """The embedding rows' parameter server, for its metrics (None: the kind has none)."""
        return None
