"""A GBM model file -> a checked Forest, without the library's parser ever running in this process.

    checked = read_gbm_file("bundle/model.txt", Library.LIGHTGBM, deadline_s=120.0, sha256=expected)
    checked.forest, checked.feature_names

1. The file's bytes are read once (and, given `sha256`, checked against it: what is parsed is what the
   manifest names) and parsed by our own reader (forest.py), every tree checked before it is flattened
   (forest_check.py): a damaged or hostile file is refused in one line naming the file, tree and node.
2. Only a file that passed reaches the library, in a child process (gbm_probe.py via
   isolated_load.run_child) that loads a private copy of the same bytes and scores probe rows made from
   the forest's own thresholds and categories; a crash, a hang past the deadline or an error of the
   library is a refused load.
3. The forest's raw scores of the probe rows must equal the library's (LightGBM: to rounding of the sum,
   XGBoost: to its float32 sum): our reading of the file is the library's, or the file is refused.

The server scores the forest (GBMPredictor.FOREST); the library itself is never imported here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hugerec.models.gbm import EXTRA, Library
from hugerec.serving.bundles.isolated_load import LoadRefused, run_child
from hugerec.serving.runtime.forest import FLAG_CATEGORICAL, Forest
from hugerec.serving.runtime.forest_check import ModelFileError

PROBE = Path(__file__).with_name("gbm_probe.py")
PROBE_ROWS = 64
PROBE_CELLS = 1 << 22  # rows x features of the probe at most (16 MiB of float32)
CHILD_MEMORY = 4 << 30  # the child's address space: this + 16 x the file's size


@dataclass(frozen=True, eq=False)
class CheckedModel:
    """A model file read by our parser, checked, and agreed with by its library."""

    forest: Forest
    feature_names: tuple[str, ...]


def read_gbm_file(path: str | Path, library: Library, deadline_s: float, sha256: str | None = None) -> CheckedModel:
    """Read and check the model file at `path` (module docstring); ModelFileError / LoadRefused (both
    ValueError) in one line naming the file, ImportError naming the extra when the library is missing."""
    p = Path(path)
    where = str(p)
    raw = p.read_bytes()
    if sha256 is not None and hashlib.sha256(raw).hexdigest() != sha256:
        raise ModelFileError(f"{where}: checksum mismatch (the file changed since the manifest was written)")
    match library:
        case Library.LIGHTGBM:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ModelFileError(f"{where}: not a LightGBM text model (not UTF-8 text at byte {e.start})") from None
            forest = Forest.from_lightgbm(text, where)
        case Library.XGBOOST:
            forest = Forest.from_xgboost_json(raw, where)
    if importlib.util.find_spec(library.value) is None:
        raise ImportError(f"a {library.value} model needs the {library.value} package: pip install 'hugerec[{EXTRA}]'")
    rows = probe_rows(forest)
    with tempfile.TemporaryDirectory(prefix="hugerec-probe-") as tmp:
        copy, rows_file = Path(tmp) / library.model_file, Path(tmp) / "rows.npy"
        copy.write_bytes(raw)  # the child parses exactly the bytes checked here
        np.save(rows_file, rows, allow_pickle=False)
        request = {
            "library": library.value,
            "model": str(copy),
            "rows": str(rows_file),
            "memory_bytes": CHILD_MEMORY + 16 * len(raw),
        }
        answer = run_child(PROBE, request, deadline_s, f"{where} ({library.value} in a child process)")
    names = _agree(where, library, forest, rows, answer)
    return CheckedModel(forest, names)


def probe_rows(forest: Forest, seed: int = 0) -> np.ndarray:
    """[P, F] float32 rows that reach many of the forest's leaves: values on, just below and just above
    numerical thresholds, members of category bitsets, NaN (missing), zeros."""
    f = forest.num_features
    p = max(1, min(PROBE_ROWS, PROBE_CELLS // f))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(p, f)).astype(np.float32)
    feature, flags = forest.split_features, forest.flags
    numerical = np.flatnonzero((flags & FLAG_CATEGORICAL) == 0)
    if numerical.size:
        picks = rng.choice(numerical, size=4 * p * min(f, 64))
        t = forest.thresholds[picks]
        step = rng.integers(-1, 2, size=picks.size)
        t = np.where(step < 0, np.nextafter(t, np.float32(-np.inf)), np.where(step > 0, np.nextafter(t, np.float32(np.inf)), t))
        x[rng.integers(0, p, size=picks.size), feature[picks]] = t
    categorical = np.flatnonzero(flags & FLAG_CATEGORICAL)
    for n in rng.choice(categorical, size=min(categorical.size, 4 * p)) if categorical.size else ():
        start = int(forest.nodes[n, 1])
        words = forest.cat_bits[start + 1 : start + 1 + int(forest.cat_bits[start])]
        members = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        value = rng.choice(members) if members.size and rng.random() < 0.7 else rng.integers(0, 64)
        x[rng.integers(0, p), feature[n]] = np.float32(value)
    x[rng.random(x.shape) < 0.1] = np.nan
    x[rng.random(x.shape) < 0.05] = 0.0
    return x


def _agree(where: str, library: Library, forest: Forest, rows: np.ndarray, answer: dict[str, object]) -> tuple[str, ...]:
    """The library's view (feature count, probe scores) against the forest's; the feature names."""
    names, num, margins = answer.get("feature_names"), answer.get("num_features"), answer.get("margins")
    if not (isinstance(names, list) and isinstance(num, int) and isinstance(margins, list)):
        raise LoadRefused(f"{where}: the {library.value} check gave no answer of the expected form")
    if num != forest.num_features:
        raise ModelFileError(f"{where}: {library.value} reads {num} features, our reader {forest.num_features}")
    theirs = np.asarray([float(m) if isinstance(m, int | float) else np.nan for m in margins], np.float64)
    ours = forest.margin(rows)
    if theirs.shape != ours.shape:
        raise ModelFileError(f"{where}: {library.value} scored {theirs.shape[0]} probe rows of {ours.shape[0]}")
    # LightGBM sums in float64 in our order (equal to rounding); XGBoost sums in float32
    scale = forest.num_trees * float(np.abs(forest.leaves).max(initial=0.0)) + abs(forest.base)
    close = np.isclose(ours, theirs, rtol=1e-5, atol=1e-5 + 1e-6 * scale)
    if not close.all():
        i = int(np.flatnonzero(~close)[0])
        raise ModelFileError(
            f"{where}: our reading differs from {library.value}'s: probe row {i} scores {ours[i]:.9g} here, "
            f"{theirs[i]:.9g} there"
        )
    if names and len(names) != forest.num_features:
        raise ModelFileError(f"{where}: {len(names)} feature names for {forest.num_features} features")
    return tuple(str(n) for n in names)
