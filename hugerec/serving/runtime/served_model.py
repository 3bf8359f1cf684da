"""ServedModel: a scoring model version served (a deep model of a model bundle, or GBM trees), batched.

    infer    KServe v2 tensors -> ModelInputs (the binary one-id layout cached per header) -> the dynamic
             batcher -> logits [B] -> "scores" (their sigmoid) and / or "logits"
    predict  /predict rows -> the fitted workflow (when the bundle has one) -> ModelInputs -> scores [B]

Both models answer `predict(ModelInputs) -> logits [B]` with the attributes a request signature needs
(`Scorer`). Decoding runs on the event loop except a workflow's transform (Polars releases the GIL: a thread
keeps the loop free meanwhile); the batcher runs large batches on a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from hugerec.serving.runtime.batching import BatchingConfig, DynamicBatcher
from hugerec.serving.runtime.inference_model import InferenceModel
from hugerec.serving.runtime.inference_protocol import (
    OUTPUTS,
    LiveFields,
    Signature,
    decode_infer_request,
    encode_infer_response,
)
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
from hugerec.serving.runtime.served_object import DeltaBase, Prediction, ServedObject, Unsupported
from hugerec.serving.store.parameter_server import ParameterServer


class Scorer(Protocol):
    """What a scoring version serves: InferenceModel or GBMModel."""

    num_dense: int
    features: tuple[str, ...]

    @property
    def ps(self) -> ParameterServer | None: ...  # the embedding rows (None: trees)

    def predict(self, inputs: ModelInputs) -> np.ndarray: ...

    def signature(self, max_rows: int) -> Signature: ...


@dataclass(eq=False)
class ServedModel(ServedObject):
    """One loaded scoring version: the model, its batcher, its request signature and preprocessing.

    preprocess    /predict's raw feature dicts -> ModelInputs (with the fitted workflow, when there is one)
    closers       called on close, in order (batcher, update watchers, parameter server)
    bundle_model  the deep model as loaded from a model bundle, which a version delta can apply to (None:
                  trees, or a model not served from a bundle)
    """

    family: ClassVar[str] = "scoring"
    platform: ClassVar[str] = "hugerec_pytorch"

    name: str
    version: str
    model: Scorer
    batcher: DynamicBatcher
    signature: Signature
    preprocess: RequestPreprocessor
    info: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], None]] = field(default_factory=list)
    bundle_model: InferenceModel | None = None

    @property
    def kind(self) -> str:  # a deep model or trees (the GBM bundle's info says "gbm")
        return str(self.info.get("kind", "model"))

    async def logits(self, inputs: ModelInputs) -> np.ndarray:
        return await self.batcher.submit(inputs)

    def close(self) -> None:
        """Release the version's resources (once; later calls do nothing)."""
        closers, self.closers = self.closers, []
        for close in closers:
            close()

    def metadata(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "inputs": self.signature.inputs_metadata(),
            "outputs": self.signature.outputs_metadata(),
        }

    def max_rows(self) -> int:
        return self.signature.max_rows

    def config(self, batching: BatchingConfig) -> dict[str, Any]:
        return {
            **super().config(batching),
            "max_batch_size": batching.max_batch_size,
            "dynamic_batching": {"max_queue_delay_microseconds": int(batching.max_delay_ms * 1000)},
        }

    def fields(self) -> LiveFields:
        return LiveFields(
            self.signature.input_names(), frozenset(self.preprocess.keys), frozenset({self.signature.num_dense})
        )

    async def infer(self, body: bytes, header_length: str | None, live: LiveFields) -> tuple[bytes, dict[str, str]]:
        inputs, options = decode_infer_request(body, header_length, self.signature, live)
        logits = await self.logits(inputs)
        return encode_infer_response(self.name, self.version, options, outputs(logits, options.outputs))

    async def predict(self, instances: object, live: LiveFields) -> Prediction:
        if self.preprocess.workflow is None:
            inputs = self.preprocess(instances, live)  # type: ignore[arg-type]  # validated inside
        else:  # polars releases the GIL: keep the event loop free while the workflow runs
            inputs = await asyncio.to_thread(self.preprocess, instances, live)  # type: ignore[arg-type]
        scores = outputs(await self.logits(inputs))["scores"]
        return Prediction(scores, inputs, self.preprocess.dense_names)

    def delta_base(self) -> DeltaBase:
        if self.bundle_model is None:
            raise Unsupported(
                self, "version deltas", "a delta applies to a deep model loaded from a model bundle; load a whole bundle"
            )
        return DeltaBase(self.bundle_model, self.preprocess, self.info)

    def parameter_server(self) -> ParameterServer | None:
        return self.model.ps


def outputs(logits: np.ndarray, names: Sequence[str] = OUTPUTS) -> dict[str, np.ndarray]:
    """The outputs asked for (scores: the sigmoid of the logits)."""
    out = {"logits": logits} if "logits" in names else {}
    if "scores" in names:
        # clipped: exp stays finite in float32 (sigmoid(-88) = 6e-39, below that the score is 0 anyway)
        scores = np.exp(np.clip(logits, -88.0, 88.0, dtype=np.float32) * np.float32(-1.0))
        scores += np.float32(1.0)
        out["scores"] = np.reciprocal(scores, out=scores)
    return out
