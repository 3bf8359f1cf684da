"""A small drifting stream and the loop settings shared by the continuous-loop tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pyarrow as pa
import pytest

from hugerec.continuous.decisions import DecisionConfig
from hugerec.continuous.loop import LoopConfig, ModelSpec
from hugerec.data.synthetic_stream import Stream, StreamConfig
from hugerec.embedding.optimizers import Adagrad
from hugerec.models.model_config import DLRMConfig
from hugerec.serving.http.request_log import RequestLogConfig
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig

TOKEN = "continuous-test-token"  # the admin token of the `server` fixture
SMALL = StreamConfig(days=5, rows_per_day=6000, num_sparse=4, num_dense=2, vocabulary=500, seed=3)
SPEC = ModelSpec(DLRMConfig(bottom=(8, 4), top=(8, 1)), dim=4, optimizer=Adagrad(lr=0.1), capacity=4000)


@cache
def _day(d: int) -> pa.Table:
    return Stream(SMALL).day(d).table


@pytest.fixture
def small_day() -> Callable[[int], pa.Table]:
    return _day


@pytest.fixture
def loop_config() -> Callable[..., LoopConfig]:
    def make(work: Path, **kw: object) -> LoopConfig:
        # 600-row holdouts: their AUC varies by about 0.03, which the baseline check allows for (confidence_z)
        base: dict[str, object] = {
            "model": SPEC,
            "batch_size": 128,
            "lr": 1e-2,
            "epochs": 2,
            "decisions": DecisionConfig(),
        }
        return LoopConfig(str(work), SMALL.schema, **{**base, **kw})  # type: ignore[arg-type]

    return make


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A server in this process with a request log (url, log folder), for loops that publish to it."""
    srv = InferenceServer(ServerConfig(admin_token=TOKEN, seed=0))
    logs = tmp_path / "requests"
    srv.enable_request_log(RequestLogConfig(str(logs), seed=0))
    with BackgroundServer(srv) as url:
        yield url, logs
    srv.close()
