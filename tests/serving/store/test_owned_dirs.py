"""Owned working folders: removed with their owner, and when their owner died (a real kill -9), never while
another owner (another process or another object of this one) holds them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hugerec.serving.store import owned_dirs
from hugerec.serving.store.owned_dirs import LOCK, OwnedDir, remove_stale

# The child imports the module by its file alone: importing hugerec would load torch (seconds).
CHILD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("owned_dirs", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
owned = module.OwnedDir(sys.argv[2], "state-w1.")
(owned.path / "rows").write_text("x")
print(owned.path, flush=True)
time.sleep(60)
"""


def test_a_folder_lives_with_its_owner(tmp_path: Path) -> None:
    owned = OwnedDir(tmp_path, "state-w1.")
    assert owned.path.is_dir() and owned.lock.is_file() and owned.lock.name == owned.path.name + LOCK
    assert remove_stale(tmp_path, "state-") == [] and owned.path.is_dir()  # held: kept
    owned.close()
    owned.close()  # once
    assert list(tmp_path.iterdir()) == []


def test_only_folders_of_dead_owners_are_removed(tmp_path: Path) -> None:
    (tmp_path / "data.parquet").write_text("committed")
    live = OwnedDir(tmp_path, "state-w2.")  # another loaded version of this process
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, owned_dirs.__file__, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    killed = Path(child.stdout.readline().strip())
    assert killed.is_dir() and remove_stale(tmp_path, "state-") == []  # the other process still lives
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    legacy = tmp_path / "state-w0.abc"  # no lock file: left by a removal cut short
    legacy.mkdir()
    (legacy / "x").write_text("x")
    lone_lock = tmp_path / ("state-w3.def" + LOCK)  # a dead owner's lock whose folder is gone already
    lone_lock.write_text("{}")
    assert sorted(remove_stale(tmp_path, "state-")) == sorted([killed, legacy])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["data.parquet", live.path.name, live.lock.name])
    live.close()
    assert [p.name for p in tmp_path.iterdir()] == ["data.parquet"]
    assert remove_stale(tmp_path / "absent", "state-") == []
