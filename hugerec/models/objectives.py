"""What a retrieval or sequential model's [model] says about its training objective, as plain data.

    [model]
    type = "two_tower"
    loss = "sampled_softmax"     # retrieval: "sampled_softmax" | "bpr"; sequential: "full_softmax" |
    negatives = "mixed"          #   "sampled_softmax" | "bce"
    num_negatives = 1024         # M sampled candidates per batch, alpha: popularity exponent of the
    alpha = 0.0                  # sampling, logq: the log-Q correction
    logq = true

The loss itself (the tensors, the sampler) is the trainer's: `hugerec.training.declared_loss` turns these
fields into `SampledSoftmax` / `BPR` / `FullSoftmax` / `BCE`. They live here so that a model config of
the registry is complete data without the models importing the trainer.
"""

from __future__ import annotations

import enum
from typing import Any


class Negatives(enum.Enum):
    IN_BATCH = "in_batch"  # the other rows' positives
    UNIFORM = "uniform"  # M items uniform over the catalogue
    POPULARITY = "popularity"  # M items ~ count^alpha
    MIXED = "mixed"  # in-batch plus M items ~ count^alpha (alpha = 0: uniform)


RETRIEVAL_LOSSES = ("sampled_softmax", "bpr")
SEQUENCE_LOSSES = ("sampled_softmax", "full_softmax", "bce")


def check_objective(config: Any, where: str, losses: tuple[str, ...]) -> None:
    """Shared __post_init__ of the objective fields: loss in `losses`, negatives a `Negatives` value (a Negatives
    member is stored as its string), M >= 1, alpha in [0, 1]."""
    if config.loss not in losses:
        raise ValueError(f"loss must be one of {list(losses)}, got {config.loss!r}")
    if isinstance(config.negatives, Negatives):  # kept as its string: configs are plain JSON data (dataclasses.asdict)
        object.__setattr__(config, "negatives", config.negatives.value)
    if config.negatives not in [n.value for n in Negatives]:
        raise ValueError(f"{where}: negatives must be one of {[n.value for n in Negatives]}, got {config.negatives!r}")
    n = config.num_negatives
    if isinstance(n, bool) or not isinstance(n, int) or (config.negatives != Negatives.IN_BATCH.value and n < 1):
        raise ValueError(f"{where}: num_negatives must be an integer >= 1, got {n!r}")
    if isinstance(config.alpha, bool) or not isinstance(config.alpha, int | float) or not 0.0 <= config.alpha <= 1.0:
        raise ValueError(f"{where}: alpha must be in [0, 1], got {config.alpha!r}")
    if not isinstance(config.logq, bool):
        raise ValueError(f"{where}: logq must be true or false, got {config.logq!r}")
