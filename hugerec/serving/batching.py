"""DynamicBatcher: merge concurrent requests into one model call (Triton's dynamic batching).

    event loop:  submit(inputs) --queue--> worker thread --+
                 await future   <--------------------------+  outputs[rows of this request]

The worker takes the first waiting request, then keeps taking more until the batch holds
`max_batch_size` rows or `max_delay_ms` has passed since it took the first, runs the model once on
the concatenation and hands every request its own rows back. A request that would overflow the
batch starts the next one; a request bigger than `max_batch_size` runs alone. The model runs on
the worker thread, so the event loop keeps accepting and decoding requests meanwhile (torch
releases the GIL inside its kernels).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hugerec.serving.model import ModelInputs


@dataclass(frozen=True)
class BatchingConfig:
    """max_batch_size rows per model call; max_delay_ms to wait for more; max_queue requests waiting."""

    max_batch_size: int = 1024
    max_delay_ms: float = 2.0
    max_queue: int = 4096

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"BatchingConfig: max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.max_delay_ms <= 1000:
            raise ValueError(f"BatchingConfig: max_delay_ms must be in [0, 1000], got {self.max_delay_ms}")
        if self.max_queue < 1:
            raise ValueError(f"BatchingConfig: max_queue must be >= 1, got {self.max_queue}")


class QueueFull(RuntimeError):
    """More requests are waiting than `max_queue`: the caller should answer 503 and let the client retry."""


@dataclass(frozen=True, eq=False)
class _Pending:
    inputs: ModelInputs
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop


def _resolve(future: asyncio.Future[np.ndarray], result: np.ndarray | BaseException) -> None:
    if future.done():  # the client went away and the request was cancelled
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class DynamicBatcher:
    """Runs `run(inputs) -> outputs [B, ...]` on merged requests in one worker thread.

    on_batch(rows, requests, seconds) is called after every model call (metrics).
    """

    def __init__(
        self,
        run: Callable[[ModelInputs], np.ndarray],
        config: BatchingConfig | None = None,
        on_batch: Callable[[int, int, float], None] | None = None,
        name: str = "batcher",
    ) -> None:
        self.run = run
        self.config = config or BatchingConfig()
        self.on_batch = on_batch
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._carry: _Pending | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def submit(self, inputs: ModelInputs) -> np.ndarray:
        """Outputs for `inputs` (rows in order), computed in some merged batch."""
        if self._closed:
            raise RuntimeError("DynamicBatcher: closed")
        if self._queue.qsize() >= self.config.max_queue:
            raise QueueFull(f"{self._queue.qsize()} requests are already waiting (max_queue={self.config.max_queue})")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._queue.put(_Pending(inputs, future, loop))
        return await future

    def close(self, timeout: float = 10.0) -> None:
        """Finish the requests already queued, then stop the worker."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout)

    def _next_batch(self) -> list[_Pending] | None:
        first = self._carry if self._carry is not None else self._queue.get()
        self._carry = None
        if first is None:
            return None
        batch, rows = [first], first.inputs.batch_size
        deadline = time.perf_counter() + self.config.max_delay_ms / 1000
        while rows < self.config.max_batch_size:
            remaining = deadline - time.perf_counter()
            try:
                item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this batch
                break
            if rows + item.inputs.batch_size > self.config.max_batch_size:
                self._carry = item
                break
            batch.append(item)
            rows += item.inputs.batch_size
        return batch

    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            t0 = time.perf_counter()
            try:
                merged = ModelInputs.concat([p.inputs for p in batch])
                outputs = self.run(merged)
                if outputs.shape[0] != merged.batch_size:
                    raise RuntimeError(f"model returned {outputs.shape[0]} rows for a batch of {merged.batch_size}")
            except Exception as e:  # the model failed: every request of the batch gets the error
                for p in batch:
                    p.loop.call_soon_threadsafe(_resolve, p.future, e)
                continue
            start = 0
            for p in batch:
                n = p.inputs.batch_size
                p.loop.call_soon_threadsafe(_resolve, p.future, outputs[start : start + n])
                start += n
            if self.on_batch is not None:
                self.on_batch(start, len(batch), time.perf_counter() - t0)
