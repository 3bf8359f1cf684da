"""DynamicBatcher: merge concurrent requests into one model call (Triton's dynamic batching).

    submit(inputs) -> pending ----(max_batch_size rows, or max_delay_ms after the first)----> one model call
    await future   <-- outputs[rows of this request] ------------------------------------------+

Lives on the server's event loop. A batch starts when `max_batch_size` rows wait or `max_delay_ms`
after the first request arrived (0, the default: once the loop has handled what was already
received, so a lone request waits for nothing); one batch runs at a time, and requests arriving
meanwhile form the next one. A request bigger than `max_batch_size` runs alone, as model calls of
`max_batch_size` rows each: the memory a model call takes stays that of one batch whatever a request's size
(the request's own memory is its body's: serving/http/limits.py). Small batches run inline on the
event loop: they take less time than handing them to a thread would; batches of `offload_rows`
or more run on a worker thread, so the loop keeps decoding requests while torch kernels (which
release the GIL) compute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hugerec.serving.runtime.model_inputs import ModelInputs


@dataclass(frozen=True)
class BatchingConfig:
    """max_batch_size rows per model call; max_delay_ms to wait for more; max_queue requests waiting;
    offload_rows: batches at least this big run on a worker thread."""

    max_batch_size: int = 1024
    max_delay_ms: float = 0.0
    max_queue: int = 4096
    offload_rows: int = 256

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"BatchingConfig: max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.max_delay_ms <= 1000:
            raise ValueError(f"BatchingConfig: max_delay_ms must be in [0, 1000], got {self.max_delay_ms}")
        if self.max_queue < 1:
            raise ValueError(f"BatchingConfig: max_queue must be >= 1, got {self.max_queue}")
        if self.offload_rows < 1:
            raise ValueError(f"BatchingConfig: offload_rows must be >= 1, got {self.offload_rows}")


class QueueFull(RuntimeError):
    """More requests are waiting than `max_queue`: the caller should answer 503 and let the client retry."""


@dataclass(frozen=True, eq=False)
class _Pending:
    inputs: ModelInputs
    future: asyncio.Future[np.ndarray]


class DynamicBatcher:
    """Runs `run(inputs) -> outputs [B, ...]` on merged requests; use it from one event loop.

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
        self._pending: list[_Pending] = []
        self._rows = 0
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._closed = False

    async def submit(self, inputs: ModelInputs) -> np.ndarray:
        """Outputs for `inputs` (rows in order), computed in some merged batch."""
        if self._closed:
            raise RuntimeError("DynamicBatcher: closed")
        if len(self._pending) >= self.config.max_queue:
            raise QueueFull(f"{len(self._pending)} requests are already waiting (max_queue={self.config.max_queue})")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self._pending.append(_Pending(inputs, future))
        self._rows += inputs.batch_size
        self._schedule(loop)
        return await future

    def close(self) -> None:
        """Refuse new requests and stop the worker thread (requests still waiting get an error)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for p in self._pending:
            loop = p.future.get_loop()
            if not p.future.done() and not loop.is_closed():
                loop.call_soon_threadsafe(_fail, p.future, RuntimeError("DynamicBatcher: closed"))
        self._pending, self._rows = [], 0
        self._executor.shutdown(wait=True)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._busy or not self._pending:
            return  # the running batch schedules the next one when it ends
        if self._rows >= self.config.max_batch_size:
            self._start(loop)
        elif self._timer is None:
            # delay 0: start once the event loop has handled what is ready now (requests already
            # received join this batch; a lone request waits for nothing)
            self._timer = loop.call_later(self.config.max_delay_ms / 1000, self._start, loop)

    def _take(self) -> list[_Pending]:
        """The oldest requests that fit in max_batch_size rows (at least one)."""
        batch, rows = [self._pending[0]], self._pending[0].inputs.batch_size
        for p in self._pending[1:]:
            if rows + p.inputs.batch_size > self.config.max_batch_size:
                break
            batch.append(p)
            rows += p.inputs.batch_size
        del self._pending[: len(batch)]
        self._rows -= rows
        return batch

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._busy or not self._pending or self._closed:
            return
        batch = [p for p in self._take() if not p.future.done()]  # skip requests whose client went away
        if not batch:
            self._schedule(loop)
            return
        merged = ModelInputs.concat([p.inputs for p in batch])
        self._busy = True
        if merged.batch_size < self.config.offload_rows:
            self._finish(loop, batch, *self._call(merged))
            return
        work = loop.run_in_executor(self._executor, self._call, merged)
        work.add_done_callback(lambda f: self._finish(loop, batch, *f.result()))

    def _call(self, merged: ModelInputs) -> tuple[np.ndarray | Exception, float]:
        t0 = time.perf_counter()
        try:
            size, b = self.config.max_batch_size, merged.batch_size
            if b <= size:
                outputs = self.run(merged)
            else:  # one request larger than a batch: in batches, one after another
                outputs = np.concatenate([self.run(merged.rows(s, min(s + size, b))) for s in range(0, b, size)])
            if outputs.shape[0] != merged.batch_size:
                raise RuntimeError(f"model returned {outputs.shape[0]} rows for a batch of {merged.batch_size}")
        except Exception as e:  # the model failed: every request of the batch gets the error
            return e, time.perf_counter() - t0
        return outputs, time.perf_counter() - t0

    def _finish(
        self, loop: asyncio.AbstractEventLoop, batch: list[_Pending], outputs: np.ndarray | Exception, seconds: float
    ) -> None:
        self._busy = False
        start = 0
        for p in batch:
            n = p.inputs.batch_size
            if not p.future.done():
                if isinstance(outputs, Exception):
                    p.future.set_exception(outputs)
                else:
                    p.future.set_result(outputs[start : start + n])
            start += n
        if self.on_batch is not None and not isinstance(outputs, Exception):
            self.on_batch(start, len(batch), seconds)
        self._schedule(loop)


def _fail(future: asyncio.Future[np.ndarray], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
