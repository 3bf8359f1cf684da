"""Shared inputs for the preprocessing tests: a small synthetic Criteo-format TSV and the real sample."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hugerec.data.preprocess.dataset import CRITEO_DENSE, CRITEO_SPARSE

from ...conftest import SHARED_DATA, missing_samples


def make_criteo_frame(rows: int, seed: int = 0) -> pl.DataFrame:
    """Criteo-like raw values: int label, 13 skewed ints (some negative, ~20% null), 26 hex strings
    from small skewed vocabularies (~10% null)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, pl.Series] = {"label": pl.Series((rng.random(rows) < 0.3).astype(np.int64))}
    for name in CRITEO_DENSE:
        values = (rng.pareto(1.5, rows) * 5).astype(np.int64) - 1
        cols[name] = pl.Series(values).set(pl.Series(rng.random(rows) < 0.2), None)
    for i, name in enumerate(CRITEO_SPARSE):
        ids = (rng.random(rows) ** 2 * (5 + 7 * i)).astype(np.int64)
        strings = pl.Series([f"{(k * 2654435761 + i) & 0xFFFFFFFF:08x}" for k in range(5 + 7 * i)])
        cols[name] = strings.gather(ids).set(pl.Series(rng.random(rows) < 0.1), None)
    return pl.DataFrame(cols)


def write_tsv(frame: pl.DataFrame, path: Path) -> Path:
    frame.write_csv(path, separator="\t", include_header=False, null_value="")
    return path


@pytest.fixture
def make_frame() -> Callable[..., pl.DataFrame]:
    return make_criteo_frame


@pytest.fixture
def tsv() -> Callable[[pl.DataFrame, Path], Path]:
    return write_tsv


@pytest.fixture
def criteo_frame() -> pl.DataFrame:
    return make_criteo_frame(3000)


@pytest.fixture
def criteo_tsv(tmp_path: Path, criteo_frame: pl.DataFrame) -> Path:
    return write_tsv(criteo_frame, tmp_path / "train.tsv")


@pytest.fixture
def criteo_sample(tmp_path: Path) -> Path:
    """The real 10,000-row Criteo sample, unzipped (skips when it is absent: tests/conftest.py)."""
    missing = missing_samples(("criteo/train_examples.txt.gz",))
    if missing:
        pytest.skip(f"real data sample {missing[0]} not found (set HUGEREC_DATA or put shared/data beside the checkout)")
    assert SHARED_DATA is not None
    source = SHARED_DATA / "criteo" / "train_examples.txt.gz"
    target = tmp_path / "criteo_sample.tsv"
    target.write_bytes(gzip.decompress(source.read_bytes()))
    return target
