import os
import socket

import pytest
import torch.distributed as dist

from hugerec.distributed.launch import free_port, init_from_env, launched_by_torchrun, spawn


def _where(rank: int, world: int, tag: str) -> tuple[int, int, str, str, int, bool]:
    # init_from_env joins the group spawn already set up and reads the torchrun-style variables
    env = init_from_env()
    return rank, world, tag, env.backend, env.world_size, launched_by_torchrun() and dist.get_rank() == env.rank


def _fail_on_one(rank: int, world: int) -> int:
    if rank == 1:
        raise KeyError("boom on rank one")
    return rank


def test_spawn_runs_every_rank_and_propagates_failures() -> None:
    out = spawn(3, _where, "x")
    assert out == [(r, 3, "x", "gloo", 3, True) for r in range(3)]
    with pytest.raises(RuntimeError, match=r"rank 1 failed:\nKeyError: 'boom on rank one'"):
        spawn(2, _fail_on_one)


def test_spawn_rejects_what_cannot_be_found_again() -> None:
    with pytest.raises(ValueError, match="module-level function"):
        spawn(2, lambda r, w: r)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        spawn(0, _where)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_init_from_env_needs_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert not launched_by_torchrun()
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="start the command with torchrun"):
            init_from_env()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert launched_by_torchrun() and os.environ["RANK"] == "0"


EXIT_SCRIPT = """
import atexit, sys
import torch
import torch.distributed as dist
from hugerec.distributed.launch import init_from_env

# registered before init_from_env's handler, so atexit runs it after: it sees what that handler left
atexit.register(lambda: print("group alive at exit:", dist.is_initialized(), flush=True))
env = init_from_env("gloo")
t = torch.ones(3) * (env.rank + 1)
dist.all_reduce(t)
print("sum", int(t[0]), flush=True)
"""


def test_init_from_env_destroys_its_group_at_exit() -> None:
    """A torchrun-style process that never calls destroy_process_group still ends with its group destroyed
    (by the atexit handler init_from_env registers), while the interpreter is whole: exiting with a live gloo
    group can abort in finalization."""
    import subprocess
    import sys

    port = str(free_port())
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT], env=base | {"RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for out in outs:
        assert "sum 3" in out and "group alive at exit: False" in out, out
