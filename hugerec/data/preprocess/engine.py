"""Where partition tasks run: in this process, a local process pool, or a Dask distributed cluster.

    engine = None        a local pool of os.cpu_count() processes (the default)
    engine = 4           a local pool of 4 processes (1: in this process, no pool)
    engine = "tcp://..." the Dask cluster at that scheduler address
    engine = client      an existing dask.distributed.Client

A task is `fn(job, item)`: the job (the fitted workflow, typically the large part) travels once per
worker (in memory: handed to each local worker as it starts, through the pipe that starts it; a
broadcast scatter on Dask), the items (partitions) one per task. Results come back in item order,
one at a time, so the caller can reduce them as they arrive. Nothing goes through a file: no worker
ever reads a pickle from disk.

Local workers start by importing the main script (as with any multiprocessing or Dask code), so
scripts guard their entry point with `if __name__ == "__main__":`. A local pool lives for one
`run_tasks` call (its workers hold that call's job); the fork server they start from is kept, with
the preprocessing modules imported, so a worker starts in milliseconds.
"""

from __future__ import annotations

import multiprocessing
import os
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

_job: Any = None  # in a local worker: the job of the run_tasks call that started it


def _set_job(job: Any) -> None:
    global _job
    _job = job


def _call(fn: Callable[[Any, T], R], item: T) -> R:
    return fn(_job, item)


def _pool(workers: int, job: Any) -> ProcessPoolExecutor:
    """`workers` processes, each given `job` as it starts (pickled into its start-up pipe, not a file)."""
    # fork would copy the parent's Polars thread pool mid-flight (deadlock-prone); the fork server
    # imports the preprocessing modules once, so each worker starts fast
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["hugerec.data.preprocess.workflow"])
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_set_job, initargs=(job,))


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
            pool = _pool(min(workers, len(items)), job)
            try:
                futures = [pool.submit(_call, fn, item) for item in items]
                for future in futures:
                    yield future.result()
            except BrokenProcessPool as e:
                raise RuntimeError(
                    "a local worker process died. Workers start by importing the main script, so a script "
                    "must guard its entry point with `if __name__ == '__main__':`; otherwise the worker ran "
                    "out of memory (use smaller Dataset partition_bytes or fewer workers)"
                ) from e
            finally:
                pool.shutdown(cancel_futures=True)
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
