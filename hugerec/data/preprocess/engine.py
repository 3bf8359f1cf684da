"""Where partition tasks run: in this process, a local process pool, or a Dask distributed cluster.

    engine = None        a local pool of os.cpu_count() processes
    engine = 4           a local pool of 4 processes (1: in this process, no pool)
    engine = "tcp://..." the Dask cluster at that scheduler address
    engine = client      an existing dask.distributed.Client

A task is `fn(job, item)`: the job (the fitted workflow, typically the large part) travels once per
worker (a pool initializer; a broadcast scatter on Dask), the items (partitions) one per task.
Results come back in item order, one at a time, so the caller can reduce them as they arrive.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from distributed import Client

    Engine = int | str | Client | None
else:
    Engine = Any

J = TypeVar("J")
T = TypeVar("T")
R = TypeVar("R")

# the job of this worker process, set once by the pool initializer
_job: Any = None


def _set_job(job: object) -> None:
    global _job
    _job = job


def _call(fn: Callable[[Any, T], R], item: T) -> R:
    return fn(_job, item)


def _pool_context() -> multiprocessing.context.BaseContext:
    # fork would copy the parent's Polars thread pool mid-flight (deadlock-prone); the fork server
    # imports the preprocessing modules once, so each worker starts fast
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["hugerec.data.preprocess.workflow"])
    return ctx


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
            with ProcessPoolExecutor(
                min(workers, len(items)), mp_context=_pool_context(), initializer=_set_job, initargs=(job,)
            ) as pool:
                yield from pool.map(_call, [fn] * len(items), items)
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
