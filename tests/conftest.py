"""The real data samples, for every test that reads them.

The samples (Criteo, MovieLens, YOOCHOOSE) are not in the repository: they are found at `$HUGEREC_DATA`,
else in a `shared/data` folder beside the checkout or above it (the layout CI has). A fresh clone has
neither, and the suite must still pass there: a test that reads the samples declares which files with
`@pytest.mark.shared_data("criteo/train_examples.txt.gz", ...)` and takes the `shared_data` fixture (the
folder, with `HUGEREC_DATA` set to it for the test). Without those files the test is skipped, naming
them. CI runs the suite a second time from a clone with no samples in reach (`.ci/run`), which fails
on any test that needs them without saying so.

Without a CUDA device the Triton kernels (hugerec/ops/gpu) run under Triton's interpreter on the CPU.
Triton decides interpreted or compiled when a kernel is defined, so the variable is set here, before any
test module imports them; with a CUDA device they are compiled and run on it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def find_shared_data() -> Path | None:
    """The samples' folder: `$HUGEREC_DATA` when set (None if it is not a folder), else the first
    `shared/data` above the checkout; None when there is none."""
    env = os.environ.get("HUGEREC_DATA")
    if env:
        return Path(env) if Path(env).is_dir() else None
    for d in ROOT.parents:
        if (d / "shared" / "data").is_dir():
            return d / "shared" / "data"
    return None


SHARED_DATA = find_shared_data()


def missing_samples(paths: tuple[str, ...]) -> list[str]:
    """The sample files (relative to the data folder) that are not there; all of them without a folder."""
    if SHARED_DATA is None:
        return list(paths)
    return [p for p in paths if not (SHARED_DATA / p).exists()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "shared_data(*paths): reads these real data samples (relative to $HUGEREC_DATA); skipped without them"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        missing = [p for marker in item.iter_markers("shared_data") for p in missing_samples(tuple(marker.args))]
        if missing:
            why = f"real data sample(s) {', '.join(missing)} not found (set HUGEREC_DATA or put shared/data beside the checkout)"
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture
def shared_data(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The samples' folder, with `HUGEREC_DATA` pointing at it for the test (configs use `$HUGEREC_DATA`)."""
    if request.node.get_closest_marker("shared_data") is None:
        raise RuntimeError(f"{request.node.nodeid} takes shared_data without @pytest.mark.shared_data(...) naming its files")
    assert SHARED_DATA is not None  # the marker's check skipped the test otherwise
    monkeypatch.setenv("HUGEREC_DATA", str(SHARED_DATA.resolve()))
    return SHARED_DATA
