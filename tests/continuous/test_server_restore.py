"""`hugerec loop` with the embedded server, stopped while a canary is live and started again: the new server
serves the stable version, canary and share of the decision log before the next window, by replaying what was
published, or (its files gone) from bundles exported anew out of the checkpoints."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hugerec.cli import main
from hugerec.continuous.decision_log import live_roles, read_log
from hugerec.continuous.loop import Loop, version_of

from .test_loop_cli import SHRINK

WORK = Path("runs/loop")
# a lenient gate: the shrunk stream's early candidates are miscalibrated, and every window should publish
RUN = [
    *SHRINK,
    "gate.calibration_low=0.1",
    "gate.calibration_high=10",
]  # configs/loop_synthetic.toml's work_dir, relative to the working directory


@pytest.fixture(scope="module")
def canary_live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where `hugerec loop` ran windows 0 and 1 (of 3 days) and stopped: window 0's model is stable,
    window 1's the canary (at the config's share 0.5)."""
    root = tmp_path_factory.mktemp("loop")
    before = os.getcwd()
    os.chdir(root)
    try:
        assert main(["loop", "configs/loop_synthetic.toml", *RUN, "data.stream.days=3"]) == 0
    finally:
        os.chdir(before)
    live = live_roles(read_log(root / WORK / "decisions.jsonl"), 0.5)
    assert (live.stable, live.canary, live.share) == (version_of(0), version_of(1), 0.5)
    return root


class Seen(Exception):
    """Raised by the patched Loop.step with the server's status before the restarted loop's first window."""

    def __init__(self, status: dict[str, Any] | None) -> None:
        super().__init__("the restarted loop's first window")
        self.status = status


def _restart_and_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canary_live: Path) -> dict[str, Any] | None:
    if canary_live != tmp_path:
        shutil.copytree(canary_live, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)

    def look(self: Loop, k: int) -> None:
        assert self.publisher is not None
        raise Seen(self.publisher.status())

    with monkeypatch.context() as m:
        m.setattr(Loop, "step", look)
        with pytest.raises(Seen) as seen:
            main(["loop", "configs/loop_synthetic.toml", *RUN, "data.stream.days=4"])
    return seen.value.status


@pytest.mark.slow
def test_restarted_embedded_server_serves_the_logs_stable_and_canary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canary_live: Path
) -> None:
    """Replayed exactly: the stable's bundle, the canary's bundle or version delta (the ids the log recorded)."""
    status = _restart_and_look(tmp_path, monkeypatch, canary_live)
    records = read_log(tmp_path / WORK / "decisions.jsonl")
    live = live_roles(records, 0.5)
    assert status is not None
    assert (status["stable"], status["canary"], status["canary_share"]) == (live.stable, live.canary, live.share)
    restored = [r for r in records if r.action == "restore"]
    assert [r.version for r in restored] == [live.stable, live.canary]
    assert all("replayed" in r.reason and "id" not in r.extra for r in restored)


@pytest.mark.slow
def test_restart_without_the_published_files_exports_from_checkpoints_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canary_live: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bundles/ and updates/ lost: the live versions come back from their checkpoints (new content ids in
    `restore` records), and the next window decides on the canary and publishes against the new ids."""
    shutil.copytree(canary_live, tmp_path, dirs_exist_ok=True)
    for gone in ("bundles", "updates"):
        shutil.rmtree(tmp_path / WORK / gone, ignore_errors=True)
    monkeypatch.chdir(tmp_path)
    assert main(["loop", "configs/loop_synthetic.toml", *RUN, "data.stream.days=4"]) == 0
    assert "embedded server restored from the decision log" in capsys.readouterr().err
    records = read_log(tmp_path / WORK / "decisions.jsonl")
    restored = [r for r in records if r.action == "restore"]
    assert [r.version for r in restored] == [version_of(0), version_of(1)]
    assert all("exported anew" in r.reason and r.extra["id"] for r in restored)
    after = records[records.index(restored[-1]) + 1 :]
    assert {r.window for r in after} == {2} and {"publish", "refuse"} & {r.action for r in after}
    assert any(r.action in ("promote", "rollback", "wait") for r in after)  # window 2 decided on the canary


_KILLED_LOAD = """
import os, signal, sys
import hugerec.serving.bundles.version_delta as version_delta
from hugerec.cli import main

persistent = version_delta.PersistentStore

def killed_mid_load(path, dims):
    if "state-w2." in str(path):  # the server has copied the base's rows for w2; kill -9 before w2 exists
        os.kill(os.getpid(), signal.SIGKILL)
    return persistent(path, dims)

version_delta.PersistentStore = killed_mid_load
sys.exit(main(["loop", "configs/loop_synthetic.toml", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_a_delta_load_killed_midway_is_cleaned_up_on_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canary_live: Path
) -> None:
    """kill -9 inside the embedded server's load of window 2's version delta (after it copied the base's rows):
    updates/w2 (never committed by a publish record) and its working copy are left; the next start removes
    them, and keeps the committed w1 delta (whose dead working copies go too)."""
    shutil.copytree(canary_live, tmp_path, dirs_exist_ok=True)
    argv = [*RUN, "data.stream.days=4"]
    proc = subprocess.run([sys.executable, "-c", _KILLED_LOAD, *argv], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    updates = tmp_path / WORK / "updates"
    assert list((updates / "w2").glob("state-w2.*/rocksdb")), "the killed load's copy of the rows"
    assert "w2" not in {r.version for r in read_log(tmp_path / WORK / "decisions.jsonl") if r.action == "publish"}
    dead_copies = list((updates / "w1").glob("state-w1.*"))
    assert dead_copies  # the killed server's working copy of w1 (the restored canary)
    status = _restart_and_look(tmp_path, monkeypatch, tmp_path)
    live = live_roles(read_log(tmp_path / WORK / "decisions.jsonl"), 0.5)  # window 2 decided on w1 before the kill
    assert status is not None and (status["stable"], status["canary"]) == (live.stable, live.canary)
    assert not (updates / "w2").exists()
    assert (updates / "w1" / "manifest.json").is_file() and not any(p.exists() for p in dead_copies)
