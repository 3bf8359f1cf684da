"""RequestPreprocessor: raw feature dicts -> fitted Workflow -> ModelInputs, for /predict.

[{"I1": 3, "C1": "68fd1e64", ...}, ...]
  -> workflow.transform_request  (exactly the training transform: fills, logs, Categorify, ...)
  -> polars frame: dense columns (floats), sparse columns (ids, or lists of ids when multi-hot)
  -> ModelInputs(dense [B, Dd], ids {feature: (values, lengths)})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.serving.runtime.inference_protocol import (
    LENGTHS_SUFFIX,
    ONE_VERSION,
    LiveFields,
    RequestError,
    Signature,
    decode_instances,
    to_model_inputs,
)
from hugerec.serving.runtime.model_inputs import ModelInputs


class RequestPreprocessor:
    """Turns raw rows into model inputs with the fitted `workflow`.

    Without a workflow the rows are already encoded: see inference_protocol.decode_instances (dense values as
    "dense": [...] or, with a schema, one key per dense column). `keys`: the instance keys this version
    takes (the workflow's raw columns, or the encoded features); keys only other loaded versions of the
    model take (LiveFields.keys) are ignored, as inference_protocol.LiveFields says.
    """

    def __init__(self, signature: Signature, schema: Schema | None = None, workflow: Workflow | None = None) -> None:
        if workflow is not None and schema is None:
            raise ValueError("RequestPreprocessor: a workflow needs the schema of its output")
        if schema is None:
            self.dense_names: tuple[str, ...] | None = None
        elif len(schema.dense_names) != signature.num_dense or any(
            f not in schema.sparse_names for f in signature.features
        ):
            raise ValueError(
                f"RequestPreprocessor: the schema (dense {list(schema.dense_names)}, sparse {list(schema.sparse_names)}) "
                f"does not give the model's {signature.num_dense} dense features and sparse features {list(signature.features)}"
            )
        else:
            self.dense_names = schema.dense_names
        self.signature = signature
        self.workflow = workflow
        # the target columns the workflow passes through: a serving row has no label, so they are given
        # as missing (null) rather than refused by the workflow's output selection
        fitted = {} if workflow is None or workflow.input_schema is None else workflow.input_schema
        self.labels = tuple(c for c in (schema.label_names if schema else ()) if c in fitted)
        if workflow is not None:
            self.keys = frozenset(fitted)
        else:
            dense = ({"dense"} if signature.num_dense else set()) | set(self.dense_names or ())
            self.keys = frozenset({*signature.features, *dense})

    def __call__(self, instances: Sequence[Mapping[str, Any]], live: LiveFields = ONE_VERSION) -> ModelInputs:
        if not isinstance(instances, list) or not instances or not all(isinstance(i, dict) for i in instances):
            raise RequestError("'instances' must be a non-empty list of objects (one per example)")
        if len(instances) > self.signature.max_rows:
            raise RequestError(
                f"{len(instances)} instances; this server takes at most {self.signature.max_rows}", status=413
            )
        if self.workflow is None:
            return decode_instances(instances, self.signature, self.dense_names, live)
        rows: Sequence[Mapping[str, Any]] = instances
        others = live.keys - self.keys
        if others and any(not others.isdisjoint(row) for row in rows):  # other versions' columns: not read
            rows = [{k: v for k, v in row.items() if k not in others} for row in rows]
        if self.labels:
            rows = [{**dict.fromkeys(self.labels), **row} for row in rows]
        try:
            frame = self.workflow.transform_request(rows)
        except (ValueError, TypeError, pl.exceptions.PolarsError) as e:
            raise RequestError(f"preprocessing failed: {e}") from None
        return self._inputs(frame)

    def _inputs(self, frame: pl.DataFrame) -> ModelInputs:
        tensors: dict[str, np.ndarray] = {}
        dense_names = self.dense_names or ()
        absent = [c for c in (*dense_names, *self.signature.features) if c not in frame.columns]
        if absent:
            raise RequestError(f"the request lacks features {absent}")
        if self.signature.num_dense:
            dense = frame.select(dense_names)
            nulls = [c for c in dense_names if dense[c].null_count()]
            if nulls:
                raise RequestError(f"dense features {nulls} are missing or null (and the workflow does not fill them)")
            try:
                tensors["dense"] = dense.cast(pl.Float32).to_numpy().reshape(frame.height, -1)
            except pl.exceptions.PolarsError as e:
                raise RequestError(f"dense features are not numbers: {e}") from None
        for f in self.signature.features:
            column = frame[f]
            if column.null_count():
                raise RequestError(f"feature {f!r} is missing or null in {column.null_count()} instances")
            if isinstance(column.dtype, pl.List):
                if column.list.eval(pl.element().is_null().any()).explode().any():
                    raise RequestError(f"feature {f!r} has null ids inside its lists")
                tensors[f + LENGTHS_SUFFIX] = column.list.len().to_numpy().astype(np.int32)
                column = column.explode()  # [N] ids, example after example (empty lists add none)
            if not column.dtype.is_integer():
                raise RequestError(f"feature {f!r} must be integer ids after preprocessing, got {column.dtype}")
            tensors[f] = column.to_numpy()
        return to_model_inputs(tensors, self.signature)
