"""Defaults that depend on the data: the batch size and the MLP widths from the number of training rows,
the DLRM dense arch from the dense features, the embedding widths from the tables' cardinalities.

    auto_batch_size(8_000)      -> 128     (63 steps per epoch)
    auto_batch_size(80_000)     -> 512     (157 steps per epoch)
    auto_batch_size(1_000_000)  -> 2048    (the cap: large data keeps the usual large batch)
    auto_width(10_000)          -> 256     (DCN-v2's default deep [1024, 1024] becomes [256, 256])
    auto_width(1_000_000)       -> 1024    (the cap: the published widths stand)
    auto_embedding_dim(10)      -> 16      (6 * 10 ** 0.25 = 10.7, up to a multiple of 8)
    auto_embedding_dim(1_000)   -> 40
    auto_embedding_dim(10**7)   -> 64      (the cap, reached from ~10,000 rows: 6 * 10_000 ** 0.25 = 60)

A fixed batch of 2048 gives a 10,000-row set four steps per epoch: measured on the real Criteo sample
(benchmarks/quality.py, `real criteo auc`, DCN-v2, 3 seeds) it ended at 0.709 test AUC against
0.747 at batch 128. The rule keeps a few dozen to a few hundred steps per epoch on small data:
the power of two nearest to 2 * sqrt(rows), between MIN_BATCH and MAX_BATCH.

An embedding table's width grows with the fourth root of its rows (the rule of thumb of TensorFlow's
feature-column guide, 6 * cardinality ** 0.25), rounded up to a multiple of 8 and capped at 64: a
table of ten values needs no 64 numbers per value, and past ~10,000 values the width stays at 64 (the
cost of a row grows with it on every lookup and update, in memory and in the sparse optimizer's state).
DLRM and DeepFM take dot products between the tables' rows, so every table there gets one width: the
rule at the largest table's cardinality.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import replace

from hugerec.models.model_config import DCNv2Config, DeepFMConfig, DLRMConfig, RankingConfig, WideAndDeepConfig

MIN_BATCH = 32
MAX_BATCH = 2048
MIN_WIDTH = 64
MAX_WIDTH = 1024
MIN_EMBEDDING_DIM = 8
MAX_EMBEDDING_DIM = 64
EMBEDDING_DIM_MULTIPLE = 8


def auto_batch_size(rows: int) -> int:
    """The batch size for `rows` training rows (see the module docstring)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"auto_batch_size: rows must be a positive int, got {rows!r}")
    batch = 2 ** round(math.log2(2.0 * math.sqrt(rows)))
    return max(MIN_BATCH, min(MAX_BATCH, batch))


def auto_width(rows: int) -> int:
    """The widest hidden layer for `rows` training rows: the power of two nearest 2 * sqrt(rows), from
    MIN_WIDTH to MAX_WIDTH. The published widths (1024) are for millions of rows; on 10,000 rows
    DCN-v2's [1024, 1024] took seconds per step on 2 cores and fits no better than a narrow net."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"auto_width: rows must be a positive int, got {rows!r}")
    return max(MIN_WIDTH, min(MAX_WIDTH, 2 ** round(math.log2(2.0 * math.sqrt(rows)))))


def auto_embedding_dim(cardinality: int) -> int:
    """The width of a table of `cardinality` rows: 6 * cardinality ** 0.25 rounded up to a multiple of 8,
    from MIN_EMBEDDING_DIM to MAX_EMBEDDING_DIM (see the module docstring)."""
    if isinstance(cardinality, bool) or not isinstance(cardinality, int) or cardinality < 1:
        raise ValueError(f"auto_embedding_dim: cardinality must be a positive int, got {cardinality!r}")
    dim = EMBEDDING_DIM_MULTIPLE * math.ceil(6.0 * cardinality**0.25 / EMBEDDING_DIM_MULTIPLE)
    return max(MIN_EMBEDDING_DIM, min(MAX_EMBEDDING_DIM, dim))


def auto_embedding_dims(cardinalities: Mapping[str, int], one_width: bool) -> dict[str, int]:
    """{table: width} by auto_embedding_dim; one_width: every table the largest table's width (the models
    whose interaction is a dot product between tables' rows: DLRM, DeepFM)."""
    dims = {name: auto_embedding_dim(card) for name, card in cardinalities.items()}
    if one_width and dims:
        widest = auto_embedding_dim(max(cardinalities.values()))
        dims = dict.fromkeys(dims, widest)
    return dims


def _capped(widths: tuple[int, ...], cap: int, out: int | None) -> tuple[int, ...]:
    """Hidden widths capped at `cap`; `out` (when given) replaces the last width, the layer's output."""
    hidden = widths[:-1] if out is not None else widths
    return tuple(min(w, cap) for w in hidden) + (() if out is None else (out,))


def fitted_to_data(
    config: RankingConfig, given: Collection[str], rows: int, num_dense: int, dim: int
) -> tuple[RankingConfig, list[str]]:
    """`config` with the MLP widths it was not given (`given`: the [model] keys the user set) fitted to
    the data: hidden widths at most auto_width(rows); a DLRM's dense arch ending at the embedding dim
    `dim`, or none without dense features (num_dense = 0). Returns the config and one note per change."""
    cap = auto_width(rows)
    changes: dict[str, tuple[int, ...]] = {}
    match config:
        case DLRMConfig():
            if "bottom" not in given:
                changes["bottom"] = () if num_dense == 0 else _capped(config.bottom, cap, dim)
            if "top" not in given:
                changes["top"] = _capped(config.top, cap, 1)
        case DCNv2Config() | DeepFMConfig() | WideAndDeepConfig():
            if "deep" not in given:
                changes["deep"] = _capped(config.deep, cap, None)
    changes = {k: v for k, v in changes.items() if v != getattr(config, k)}
    why = {
        "bottom": "no dense features" if num_dense == 0 else f"ends at embedding.dim {dim}, widths <= {cap} for {rows:,} rows",
    }
    notes = [
        f"model.{k} = {list(v)} (default {list(getattr(config, k))}: {why.get(k, f'widths <= {cap} for {rows:,} rows')})"
        for k, v in changes.items()
    ]
    return replace(config, **changes), notes  # type: ignore[arg-type]  # the keys are fields of the matched config
