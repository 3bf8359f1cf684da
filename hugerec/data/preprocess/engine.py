"""Where partition tasks run: in this process, a local process pool, or a Dask distributed cluster.

    engine = None        a local pool of os.cpu_count() processes (the default)
    engine = 4           a local pool of 4 processes (1: in this process, no pool)
    engine = "tcp://..." the Dask cluster at that scheduler address
    engine = client      an existing dask.distributed.Client

A task is `fn(job, item)`: the job (the fitted workflow, typically the large part) travels once per
worker (through a temporary file the local workers read once; a broadcast scatter on Dask), the
items (partitions) one per task. Results come back in item order, one at a time, so the caller can
reduce them as they arrive.

Local workers start by importing the main script (as with any multiprocessing or Dask code), so
scripts guard their entry point with `if __name__ == "__main__":`. A local pool, once started, is
kept for the life of the process, so a fit followed by a transform pays for worker start-up once.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from distributed import Client

    Engine = int | str | Client | None
else:
    Engine = Any

J = TypeVar("J")
T = TypeVar("T")
R = TypeVar("R")

_pools: dict[int, ProcessPoolExecutor] = {}
_job: tuple[str, Any] = ("", None)  # (job file, job) last loaded by this worker process


def _call(job_file: str, fn: Callable[[Any, T], R], item: T) -> R:
    global _job
    if _job[0] != job_file:
        with open(job_file, "rb") as f:
            _job = (job_file, pickle.load(f))
    return fn(_job[1], item)


def _pool(workers: int) -> ProcessPoolExecutor:
    if workers not in _pools:
        # fork would copy the parent's Polars thread pool mid-flight (deadlock-prone); the fork server
        # imports the preprocessing modules once, so each worker starts fast
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["hugerec.data.preprocess.workflow"])
        _pools[workers] = ProcessPoolExecutor(workers, mp_context=ctx)
    return _pools[workers]


@atexit.register
def shutdown_pools() -> None:
    """Stop the kept local worker pools (they restart on the next use)."""
    while _pools:
        _pools.popitem()[1].shutdown(cancel_futures=True)


def parallelism(engine: Engine) -> int:
    """How many tasks the engine runs at once (a guess of 64 for a cluster known only by address)."""
    match engine:
        case None:
            return os.cpu_count() or 1
        case int():
            return max(engine, 1)
        case str():
            return 64
        case _:
            return max(1, sum(engine.nthreads().values()))


def run_tasks(fn: Callable[[J, T], R], job: J, items: Sequence[T], engine: Engine) -> Iterator[R]:
    """fn(job, item) for every item, on the engine; yields the results in item order."""
    match engine:
        case None | int():
            workers = engine if engine is not None else os.cpu_count() or 1
            if workers < 1:
                raise ValueError(f"engine: number of local workers must be >= 1, got {workers}")
            if workers == 1 or len(items) <= 1:
                for item in items:
                    yield fn(job, item)
                return
            fd, job_file = tempfile.mkstemp(prefix="hugerec-job-", suffix=".pkl")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)
                futures = [_pool(workers).submit(_call, job_file, fn, item) for item in items]
                try:
                    for future in futures:
                        yield future.result()
                finally:
                    for future in futures:
                        future.cancel()
            except BrokenProcessPool as e:
                _pools.pop(workers).shutdown(cancel_futures=True)
                raise RuntimeError(
                    "a local worker process died. Workers start by importing the main script, so a script "
                    "must guard its entry point with `if __name__ == '__main__':`; otherwise the worker ran "
                    "out of memory (use smaller Dataset partition_bytes or fewer workers)"
                ) from e
            finally:
                os.unlink(job_file)
        case str():
            from distributed import Client

            with Client(engine) as client:
                yield from _run_dask(fn, job, items, client)
        case _:
            yield from _run_dask(fn, job, items, engine)


def _run_dask(fn: Callable[[J, T], R], job: J, items: Sequence[T], client: Client) -> Iterator[R]:
    if not hasattr(client, "scatter") or not hasattr(client, "map"):
        raise ValueError(f"engine: expected a worker count, a scheduler address or a dask Client, got {client!r}")
    job_future = client.scatter(job, broadcast=True, hash=False)
    futures = client.map(fn, [job_future] * len(items), items, pure=False)
    try:
        for future in futures:
            yield future.result()
            future.release()
    finally:
        client.cancel(futures)
        client.cancel(job_future)
