"""Starting W processes: `spawn` for tests and notebooks, `init_from_env` under torchrun.

spawn(3, fn, x)          -> [fn(0, 3, x), fn(1, 3, x), fn(2, 3, x)], each in its own process with
                            a gloo process group on a free 127.0.0.1 port
torchrun --nproc-per-node 2 -m hugerec train ...   -> the command calls init_from_env() once
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import multiprocessing
import multiprocessing.context
import os
import pickle
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: its rank among world_size, its rank on this node, its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launched_by_torchrun() -> bool:
    """True inside a process started by torchrun (or any launcher setting RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(backend: str | None = None, timeout_s: float = 1800.0) -> DistEnv:
    """Join the process group torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT.

    backend: None picks NCCL when CUDA is available (one GPU per local rank), else gloo. Calling it
    again in a process whose group is already up returns the same DistEnv.
    """
    if not launched_by_torchrun() and not dist.is_initialized():
        raise RuntimeError("init_from_env: RANK and WORLD_SIZE are not set; start the command with torchrun")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if backend is None else backend == "nccl"
    chosen = backend or ("nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(chosen, timeout=timedelta(seconds=timeout_s))
        # A process that ends with its group alive can abort (SIGABRT) in interpreter finalization: gloo's
        # worker threads still hold finished work whose tensors are freed after Python is torn down. The
        # group this function made is destroyed at exit, while the interpreter is whole (a no-op if the
        # caller destroyed it already).
        atexit.register(destroy_at_exit)
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, dist.get_backend())


def destroy_at_exit() -> None:
    """Destroy the default process group if it is still up (`init_from_env` registers this with atexit)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _reference(fn: Callable[..., Any]) -> tuple[str, str, str | None]:
    """(module, qualified name, file) of a module-level function, to find it again in a fresh process."""
    if "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>":
        raise ValueError(f"spawn: fn must be a module-level function, got {fn.__qualname__}")
    module = sys.modules.get(fn.__module__)
    return fn.__module__, fn.__qualname__, getattr(module, "__file__", None)


def _resolve(ref: tuple[str, str, str | None]) -> Callable[..., Any]:
    """The function `_reference` describes; a module that is not importable by name (a test file that
    pytest imported by path) is loaded from its file."""
    name, qualname, path = ref
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError:
        if path is None:
            raise
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    threads: int,
    timeout_s: float,
    fn_ref: tuple[str, str, str | None],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    torch.set_num_threads(threads)
    if backend == "nccl":  # one GPU per rank, as torchrun's LOCAL_RANK convention
        torch.cuda.set_device(rank % torch.cuda.device_count())
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        fn = _resolve(fn_ref)
        try:
            out = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        # plain pickle bytes: torch's queue reductions would share tensors through file descriptors
        # that vanish with this process
        results.put((rank, True, pickle.dumps(out)))
    except BaseException as e:  # report any failure to the parent instead of dying silently
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise


def spawn(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    backend: str = "gloo",
    threads_per_process: int = 1,
    timeout_s: float = 600.0,
    start_method: Literal["forkserver", "spawn"] = "forkserver",
) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` fresh processes joined by a process group.

    fn must be a module-level function, its arguments and result picklable. start_method "forkserver"
    (default, fast) or "spawn" (a fresh interpreter per process).
    Returns the results in rank order; raises RuntimeError with the first failing rank's traceback.
    """
    if world_size < 1:
        raise ValueError(f"spawn: world_size must be >= 1, got {world_size}")
    ctx: multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext
    match start_method:
        case "forkserver":
            ctx = multiprocessing.get_context("forkserver")
            # The server imports torch and hugerec once; every later process forks from it in milliseconds
            # (a spawned process spends seconds importing torch). It never runs a kernel: forking it is safe.
            ctx.set_forkserver_preload(["torch", "torch.distributed", "hugerec.distributed.shard"])
        case "spawn":
            ctx = multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, backend, threads_per_process, timeout_s, _reference(fn), args, results),
            daemon=False,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    failure: str | None = None
    # Collect before joining: a child blocks on a full pipe until its result is read.
    for _ in procs:
        rank, ok, value = _get(results, procs, timeout_s)
        if ok:
            # the bytes come over the in-memory queue from the child this call started, never from a file;
            # the queue itself unpickles every message it carries (multiprocessing's own IPC), so a
            # weights_only load here would add no safety, and it refuses results such as NumPy arrays
            got[rank] = pickle.loads(value)
        elif failure is None:
            failure = f"spawn: rank {rank} failed:\n{value}"
            break
    for p in procs:
        if failure is not None and p.is_alive():
            p.terminate()
        p.join()
    if failure is not None:
        raise RuntimeError(failure)
    return [got[r] for r in range(world_size)]


def _get(results: Any, procs: list[Any], timeout_s: float) -> tuple[int, bool, Any]:
    """Next result, or an error when a child died without reporting or time ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not results.empty():
            out: tuple[int, bool, Any] = results.get()
            return out
        dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead and results.empty():
            return dead[0], False, f"process exited with code {procs[dead[0]].exitcode} without a result"
        if time.monotonic() > deadline:
            return -1, False, f"no result within {timeout_s} s"
        time.sleep(0.01)
