"""GBMModel: gradient-boosted trees as a served model, answering what InferenceModel answers.

GBMModel takes the same ModelInputs and answers the same `predict(inputs) -> logits [B]` as
InferenceModel (num_dense, features, vector_signature, device too), so the server's batcher, the
protocol and a pipeline's Score stage use either alike. The row of an example is its dense values,
then one id per sparse feature; an example without an id for a feature (lengths 0) and a NaN dense
value are missing values, which the trees route as trained (hugerec.serving.runtime.forest). More than
one id for a feature is refused (400) by the request signature. For a ranking model (lambdarank,
rank:ndcg, rank:pairwise) the logits are the raw ranking scores ("scores", their sigmoid, rank the same).

Scoring path (`GBMPredictor`): "forest" (default) parses the model into flat arrays once and scores
them with a Numba kernel, without the library's per-call overhead (500 trees, same run on the loaded
2-core VM: 3.7x LightGBM's predict at batch 1, 1.7x at 256; 46x and 1.3x XGBoost's inplace_predict;
benchmarks/serving.py --gbm-only); "library" calls the library's own predict (a reference for tests and
benchmarks, loaded in process after the bundle's checks; the server never uses it). The bundle that holds
the trees on disk is hugerec.serving.bundles.gbm_bundle, which reads the model file without the library.
"""

from __future__ import annotations

import enum

import numpy as np
import torch

from hugerec.models.gbm import Library, TreeModel
from hugerec.serving.runtime.forest import Forest
from hugerec.serving.runtime.inference_protocol import Signature
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.store.parameter_server import ParameterServer


class GBMPredictor(enum.Enum):
    FOREST = "forest"  # flat arrays + one Numba kernel (hugerec.serving.runtime.forest)
    LIBRARY = "library"  # the library's own predict


class GBMModel:
    """Scores ModelInputs with a forest: logits [B] float32 (the interface of InferenceModel).

    forest: the checked flat trees (bundles/gbm_file.read_gbm_file), what predict scores; tree: the
    library's booster, scored instead when given (GBMPredictor.LIBRARY)."""

    vector_signature: tuple[tuple[str, int], ...] = ()
    ps: ParameterServer | None = None  # trees keep no embedding rows

    def __init__(
        self, forest: Forest, library: Library, num_dense: int, features: tuple[str, ...], tree: TreeModel | None = None
    ) -> None:
        expected = forest.num_features
        if num_dense + len(features) != expected:
            raise ValueError(
                f"GBMModel: {num_dense} dense + {len(features)} sparse features, the trees read {expected} columns"
            )
        self.forest = forest
        self.tree = tree
        self.library = library
        self.num_dense = num_dense
        self.features = tuple(features)
        self.device = torch.device("cpu")
        self.predictor = GBMPredictor.FOREST if tree is None else GBMPredictor.LIBRARY

    def signature(self, max_rows: int) -> Signature:
        """What a request may send: NaN dense values and empty bags are missing values; one id at most."""
        return Signature(self.num_dense, self.features, max_rows, missing_values=True, max_ids=1)

    def columns(self, inputs: ModelInputs) -> np.ndarray:
        """inputs -> feature-major rows xt [num_dense + F, B] float32 (the forest kernel's layout): the dense
        values, then each feature's id (NaN: none)."""
        b, d = inputs.batch_size, self.num_dense
        xt = np.empty((d + len(self.features), b), np.float32)
        xt[:d] = inputs.dense.T
        one_id = inputs.one_id
        if one_id is not None and tuple(inputs.ids) == self.features:
            xt[d:] = one_id  # the ids of all features as one [F, B] block, in our order
            return xt
        for j, f in enumerate(self.features):
            values, lengths = inputs.ids[f]
            column = xt[d + j]
            if values.shape[0] == b:
                column[:] = values
            else:  # some examples have no id: missing
                if lengths.size and int(lengths.max()) > 1:
                    raise ValueError(f"GBMModel: feature {f!r} has more than one id in an example")
                column[:] = np.nan
                column[lengths > 0] = values
        return xt

    def rows(self, inputs: ModelInputs) -> np.ndarray:
        """inputs -> x [B, num_dense + F] float32, the rows the libraries' predict takes."""
        return np.ascontiguousarray(self.columns(inputs).T)

    def predict(self, inputs: ModelInputs) -> np.ndarray:
        """Logits [B] float32 (the trees' raw scores) for `inputs` (validated by the caller: see inference_protocol.py)."""
        if self.tree is None:
            return self.forest.margin_columns(self.columns(inputs)).astype(np.float32)
        return self.tree.margin(self.rows(inputs)).astype(np.float32)

