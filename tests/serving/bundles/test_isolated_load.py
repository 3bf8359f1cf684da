"""Children that crash, hang, raise or answer nothing are refused loads, never a dead caller; a deadline
refuses a late load and keeps its result from being served."""

from __future__ import annotations

import asyncio
import os
import textwrap
import time
from pathlib import Path

import pytest

from hugerec.serving.bundles.isolated_load import (
    LoadDeadline,
    LoadRefused,
    commit_load,
    current_deadline,
    load_deadline,
    run_child,
    within_deadline,
)


def _script(tmp_path: Path, body: str) -> Path:
    """A child script: reads its request, runs `body` (which may set `answer`), writes the answer."""
    path = tmp_path / "child.py"
    path.write_text(
        "import json, os, signal, sys, time\n"
        "request = json.load(open(sys.argv[1]))\n"
        "answer = {'echo': request['value']}\n" + textwrap.dedent(body) + "\n"
        "open(request['result'], 'w').write(json.dumps(answer))\n"
    )
    return path


def _refused(script: Path, deadline_s: float = 30.0) -> str:
    with pytest.raises(LoadRefused) as caught:
        run_child(script, {"value": 1}, deadline_s, "bundle/model.txt")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("bundle/model.txt: "), message
    return message


def test_an_answer_comes_back_as_json(tmp_path: Path) -> None:
    assert run_child(_script(tmp_path, ""), {"value": [1, 2.5, "x"]}, 30.0, "m") == {"echo": [1, 2.5, "x"]}


def test_a_crash_is_a_refusal_naming_the_signal(tmp_path: Path) -> None:
    assert "SIGSEGV" in _refused(_script(tmp_path, "print('parsing'); sys.stdout.flush(); os.kill(os.getpid(), signal.SIGSEGV)"))
    message = _refused(_script(tmp_path, "print('terminate called', flush=True); os.abort()"))
    assert "SIGABRT" in message and "terminate called" in message  # the child's last words


def test_an_error_or_no_answer_is_a_refusal(tmp_path: Path) -> None:
    assert "ValueError: no such tree" in _refused(_script(tmp_path, "answer = {'error': 'ValueError: no such tree'}"))
    assert "status 3 and no answer" in _refused(_script(tmp_path, "sys.exit(3)"))
    assert "status 1" in _refused(_script(tmp_path, "raise RuntimeError('boom')"))
    assert "no time left" in _refused(_script(tmp_path, ""), deadline_s=0.0)


def test_a_hang_is_killed_at_the_deadline(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = _script(tmp_path, f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    t0 = time.monotonic()
    message = _refused(script, deadline_s=3.0)
    assert "no answer within 3 s" in message and time.monotonic() - t0 < 30
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_deadline_commit_and_abandon_decide_once() -> None:
    d = LoadDeadline(30.0, "b")
    d.commit()
    assert not d.abandon()  # committed first: served
    d = LoadDeadline(30.0, "b")
    assert d.abandon()
    with pytest.raises(LoadRefused, match="b: not loaded within 30 s"):
        d.commit()
    d = LoadDeadline(0.05)
    time.sleep(0.1)
    with pytest.raises(LoadRefused, match=r"^not loaded within 0\.05 s"):
        d.commit()  # past the deadline, even without the route's abandon
    with pytest.raises(ValueError, match="seconds"):
        LoadDeadline(0.0)
    commit_load()  # outside an admin load: nothing to refuse
    with load_deadline(LoadDeadline(30.0)) as inside:
        assert current_deadline() is inside
    assert current_deadline() is None


def test_within_deadline_refuses_a_late_load_and_its_result() -> None:
    served: list[str] = []

    def load(name: str, seconds: float) -> str:
        assert current_deadline() is not None  # the worker thread sees the route's deadline
        time.sleep(seconds)
        commit_load()  # where the server registers what it loaded
        served.append(name)
        return name

    async def scenario() -> None:
        assert await within_deadline(LoadDeadline(30.0), load, "fast", 0.0) == "fast"
        t0 = time.monotonic()
        with pytest.raises(LoadRefused, match=r"not loaded within 0\.3 s"):
            await within_deadline(LoadDeadline(0.3), load, "slow", 1.5)
        assert time.monotonic() - t0 < 1.2  # answered at the deadline, not when the load ends
        await asyncio.sleep(2.0)  # the abandoned load finishes, and is refused at its commit

    asyncio.run(scenario())
    assert served == ["fast"]
