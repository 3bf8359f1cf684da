"""Loads that cannot take the server down: a deadline for every admin load, foreign parsers in a child.

    deadline = LoadDeadline(120.0, "runs/gbm/bundle")
    served = await within_deadline(deadline, server.add_bundle, path)   # the admin load route
    commit_load()                         # where a loaded object is about to be served: refuses it past the deadline
    answer = run_child(script, request, deadline.remaining(), "runs/gbm/bundle/model.txt")   # JSON back

`run_child` runs a script in a fresh interpreter (`python -I script REQUEST.json`: no fork of the
server's state, no PYTHONPATH, its own session so the whole group can be killed) and reads its answer
as JSON from a file it writes; a crash (a signal), an exit without an answer, or no answer before the
deadline is a LoadRefused (a ValueError) of one line naming what was loaded, and the server goes on.

The deadline of an admin load covers the whole load, whatever the bundle kind: `within_deadline` runs
the load in a worker thread and answers "refused" when the deadline passes; a load still running then
is abandoned: `commit_load`, called where the server registers what it loaded, refuses it (the loader
closes what it opened), so a load that finishes late is never served. A thread cannot be killed, so
the work itself stops at the deadline only where it runs in a child (the GBM libraries' parsers); the
server's own loaders read files whose sizes bound their work.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

DEFAULT_LOAD_DEADLINE_S = 120.0  # ServerConfig.load_deadline_s: an admin load (or a GBM library check) takes at most this
MAX_ANSWER_BYTES = 256 << 20  # a child's JSON answer larger than this is refused unread
T = TypeVar("T")


class LoadRefused(ValueError):
    """A load refused in one line: past its deadline, or its child process crashed, hung or raised."""


class LoadDeadline:
    """The time an admin load may take, and whether what it loaded may still be served: `commit` (in the
    loading thread, when about to serve) and `abandon` (by the route, at the deadline) decide it once."""

    def __init__(self, seconds: float, what: str = "") -> None:
        if not 0 < seconds <= 86400:
            raise ValueError(f"LoadDeadline: seconds must be in (0, 86400], got {seconds!r}")
        self.seconds, self.what = seconds, what
        self.at = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._state = "open"  # -> "committed" | "abandoned"

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> LoadRefused:
        prefix = f"{self.what}: " if self.what else ""
        return LoadRefused(f"{prefix}not loaded within {self.seconds:g} s (the server's load deadline, load_deadline_s)")

    def commit(self) -> None:
        """What this load made may be served now; LoadRefused once the deadline has passed or the load
        was abandoned."""
        with self._lock:
            if self._state == "abandoned" or (self._state == "open" and time.monotonic() > self.at):
                self._state = "abandoned"
                raise self.expired()
            self._state = "committed"

    def abandon(self) -> bool:
        """Give up on the load (its route answers "refused"); False when it has committed already."""
        with self._lock:
            if self._state == "committed":
                return False
            self._state = "abandoned"
            return True


_CURRENT: contextvars.ContextVar[LoadDeadline | None] = contextvars.ContextVar("hugerec_load_deadline", default=None)


def current_deadline() -> LoadDeadline | None:
    """The deadline of the admin load running in this thread (None outside one: a load at start-up)."""
    return _CURRENT.get()


def commit_load() -> None:
    """Called where the server is about to serve what it loaded: refuses it (LoadRefused) when this is
    an admin load past its deadline; no-op outside an admin load."""
    deadline = _CURRENT.get()
    if deadline is not None:
        deadline.commit()


@contextmanager
def load_deadline(deadline: LoadDeadline) -> Iterator[LoadDeadline]:
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


async def within_deadline(deadline: LoadDeadline, load: Callable[..., T], *args: Any) -> T:
    """Run `load(*args)` in a worker thread under `deadline`: its result, or LoadRefused once the
    deadline passes (the thread's late result is then refused by commit_load and closed by its loader)."""
    with load_deadline(deadline):  # the task copies this context, so the worker thread sees the deadline
        task = asyncio.ensure_future(asyncio.to_thread(load, *args))
    try:
        return await asyncio.wait_for(asyncio.shield(task), deadline.remaining())
    except TimeoutError:
        if deadline.abandon():
            task.add_done_callback(_drop_result)
            raise deadline.expired() from None
        return await task  # it committed as the deadline passed: it is served, say so


def _drop_result(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned load's LoadRefused is expected, not "never retrieved"


def run_child(script: Path, request: dict[str, Any], deadline_s: float, what: str) -> dict[str, Any]:
    """Run `python -I script REQUEST.json` with `request` (+ "result": where to answer) and return its JSON
    answer; LoadRefused naming `what` when it is killed by a signal, exits without an answer, answers
    {"error": ...}, or runs past `deadline_s` (then its process group is killed)."""
    if deadline_s <= 0:
        raise LoadRefused(f"{what}: no time left before the load deadline")
    folder = Path(tempfile.mkdtemp(prefix="hugerec-load-"))
    try:
        result = folder / "answer.json"
        (folder / "request.json").write_text(json.dumps({**request, "result": str(result)}))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        with open(folder / "output.txt", "wb") as output:
            child = subprocess.Popen(
                [sys.executable, "-I", str(script), str(folder / "request.json")],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: killed whole at the deadline
            )
            try:
                code = child.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                _kill_group(child)
                raise LoadRefused(f"{what}: no answer within {deadline_s:.3g} s (the load deadline); refused") from None
            except BaseException:
                _kill_group(child)
                raise
        answer = _read_answer(result)
        if answer is not None and "error" in answer:
            raise LoadRefused(f"{what}: {_one_line(str(answer['error']))}")
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            raise LoadRefused(f"{what}: the parser crashed ({name}){_last_line(folder / 'output.txt')}")
        if code != 0 or answer is None:
            raise LoadRefused(f"{what}: the check exited with status {code} and no answer{_last_line(folder / 'output.txt')}")
        return answer
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _read_answer(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_ANSWER_BYTES:
        raise LoadRefused(f"{path.name}: the check's answer is larger than {MAX_ANSWER_BYTES >> 20} MiB")
    try:
        answer = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return None
    return answer if isinstance(answer, dict) else None


def _last_line(path: Path) -> str:
    """': <the last line the child printed>' (e.g. the library's own complaint), or ''."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 2048))
            lines = [line for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return f": {_one_line(lines[-1])}" if lines else ""


def _one_line(s: str, limit: int = 300) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."
