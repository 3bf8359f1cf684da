"""DynamicBatcher: concurrent requests merge into few model calls and every request gets exactly its rows back."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from hugerec.serving.runtime.batching import BatchingConfig, DynamicBatcher, QueueFull
from hugerec.serving.runtime.model_inputs import ModelInputs


def request(rows: list[float]) -> ModelInputs:
    dense = np.array(rows, np.float32).reshape(-1, 1)
    ids = {"f": (np.arange(len(rows), dtype=np.int64), np.ones(len(rows), np.int32))}
    return ModelInputs(dense, ids)


class Recorder:
    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[int] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, inputs: ModelInputs) -> np.ndarray:
        time.sleep(self.delay)
        with self.lock:
            self.batches.append(inputs.batch_size)
        return inputs.dense[:, 0] * 10  # [B]: a row's output names its input


async def run_all(batcher: DynamicBatcher, requests: list[ModelInputs]) -> list[np.ndarray]:
    return list(await asyncio.gather(*(batcher.submit(r) for r in requests)))


@pytest.mark.parametrize("offload_rows", [1, 1000])  # on the worker thread, inline on the event loop
def test_concurrent_requests_merge_and_split_back(offload_rows: int) -> None:
    model = Recorder(delay=0.01)
    batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=16, max_delay_ms=20, offload_rows=offload_rows))
    try:
        reqs = [request([i * 100 + j for j in range(1 + i % 3)]) for i in range(30)]
        outs = asyncio.run(run_all(batcher, reqs))
        for r, out in zip(reqs, outs, strict=True):
            np.testing.assert_array_equal(out, r.dense[:, 0] * 10)
        assert sum(model.batches) == sum(r.batch_size for r in reqs)
        assert max(model.batches) <= 16
        assert len(model.batches) < len(reqs) // 2  # really merged
    finally:
        batcher.close()


def test_big_request_runs_alone_in_calls_of_a_batch_and_delay_bounds_latency() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, BatchingConfig(max_batch_size=4, max_delay_ms=5))
    try:
        t0 = time.perf_counter()
        (out,) = asyncio.run(run_all(batcher, [request([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]))
        (single,) = asyncio.run(run_all(batcher, [request([7.0])]))
        assert time.perf_counter() - t0 < 2.0
        np.testing.assert_array_equal(out, [10, 20, 30, 40, 50, 60])
        np.testing.assert_array_equal(single, [70])
        assert model.batches == [4, 2, 1]  # the request of 6 rows as calls of max_batch_size: bounded memory
    finally:
        batcher.close()


@pytest.mark.parametrize("offload_rows", [1, 1000])
def test_model_errors_reach_every_request_of_the_batch_and_the_batcher_survives(offload_rows: int) -> None:
    calls = []

    def flaky(inputs: ModelInputs) -> np.ndarray:
        calls.append(inputs.batch_size)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return inputs.dense[:, 0]

    batcher = DynamicBatcher(flaky, BatchingConfig(max_batch_size=8, max_delay_ms=1, offload_rows=offload_rows))
    try:
        with pytest.raises(RuntimeError, match="boom"):
            asyncio.run(run_all(batcher, [request([1.0])]))
        (out,) = asyncio.run(run_all(batcher, [request([2.0])]))
        np.testing.assert_array_equal(out, [2.0])
    finally:
        batcher.close()


def test_queue_limit_and_config_validation() -> None:
    gate = threading.Event()

    def blocked(inputs: ModelInputs) -> np.ndarray:
        gate.wait(10)
        return inputs.dense[:, 0]

    batcher = DynamicBatcher(blocked, BatchingConfig(max_batch_size=1, max_delay_ms=0, max_queue=2, offload_rows=1))

    async def flood() -> list[object]:
        tasks = [asyncio.ensure_future(batcher.submit(request([float(i)]))) for i in range(6)]
        await asyncio.sleep(0.2)
        gate.set()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    try:
        results = asyncio.run(flood())
        assert any(isinstance(r, QueueFull) for r in results)
        assert any(isinstance(r, np.ndarray) for r in results)
    finally:
        batcher.close()
    for bad in ({"max_batch_size": 0}, {"max_delay_ms": -1}, {"max_queue": 0}, {"offload_rows": 0}):
        with pytest.raises(ValueError):
            BatchingConfig(**bad)  # type: ignore[arg-type]


def test_rows_of_model_inputs_slice_every_layout() -> None:
    """ModelInputs.rows (what splits a large request into batches): jagged ids, one-id blocks, inline vectors."""
    lengths = np.array([2, 0, 1, 3], np.int32)
    jagged = ModelInputs(np.arange(8, dtype=np.float32).reshape(4, 2), {"f": (np.arange(6, dtype=np.int64), lengths)},
                         vectors={"v": np.arange(4, dtype=np.float32).reshape(4, 1)})
    part = jagged.rows(1, 4)
    assert part.batch_size == 3 and part.ids["f"][0].tolist() == [2, 3, 4, 5] and part.ids["f"][1].tolist() == [0, 1, 3]
    assert part.vectors["v"][:, 0].tolist() == [1, 2, 3]
    block = ModelInputs.from_one_id(np.zeros((4, 0), np.float32), ["a", "b"], np.arange(8, dtype=np.int64).reshape(2, 4))
    part = block.rows(2, 4)
    assert part.one_id is not None and part.one_id.tolist() == [[2, 3], [6, 7]] and part.ids["b"][0].tolist() == [6, 7]
    assert ModelInputs.concat([jagged.rows(0, 2), jagged.rows(2, 4)]).ids["f"][0].tolist() == list(range(6))
