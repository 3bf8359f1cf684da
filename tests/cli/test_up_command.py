"""`hugerec up`: a tiny log and the synthetic world each to a live server answering /recommend over HTTP,
stopped cleanly by Ctrl-C; the configs it writes run as written; bad input is one line naming what is wrong."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from hugerec.cli import main
from hugerec.cli.up_command import log_spec
from hugerec.data.input_spec import ColumnType, Role

START_TIMEOUT_S = 600  # import, train and build under a loaded 2-core CI machine


def write_log(path: Path, users: int = 40, items: int = 60, per_user: int = 12, seed: int = 0) -> None:
    """An event log as a user would bring it: visitor_id, product_id, a date and a column `up` does not use."""
    rng = np.random.default_rng(seed)
    lines = ["visitor_id,product_id,price,event_time"]
    for u in range(users):
        for j, item in enumerate(rng.choice(items, per_user, replace=False)):
            lines.append(f"{1000 + u},{7 * int(item) + 3},{rng.uniform(1, 50):.2f},2024-03-{1 + j:02d} 10:{u % 60:02d}:00")
    path.write_text("\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Up:
    """`hugerec up ...` in a child process, its stdout read line by line in a thread."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hugerec", "up", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"hugerec up ended (rc {self.proc.wait()}) before {pattern!r}:\n" + "\n".join(self.seen))
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n" + "\n".join(self.seen))

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def recommend(port: int, user: int, k: int, timeout: float = 60) -> dict[str, object]:
    """POST /recommend, retried while the server is still binding its port."""
    body = json.dumps({"user": user, "k": k}).encode()
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/recommend", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                assert r.status == 200
                answer: dict[str, object] = json.loads(r.read())
                return answer
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.slow
def test_up_on_a_log_serves_recommendations_over_http(tmp_path: Path) -> None:
    log = tmp_path / "events.csv"
    write_log(log)
    port = free_port()
    up = Up([str(log), "--out", "out", "--port", str(port), "train.epochs=1"], tmp_path)
    try:
        up.wait_for(r"columns: visitor_id = user, product_id = item, price = none, event_time = timestamp")
        curl = up.wait_for(r"curl -s http://127\.0\.0\.1:(\d+)/recommend .* -d '(.*)'")
        assert int(curl.group(1)) == port
        example = json.loads(curl.group(2))
        answer = recommend(port, example["user"], 5)
        items = answer["items"]
        assert isinstance(items, list) and len(items) == 5 and len(set(items)) == 5
        assert all((i - 3) % 7 == 0 for i in items), items  # raw product ids of the log
        cold = recommend(port, 99_999, 3)  # a visitor the log never saw: popular items
        assert cold["cold_start"] is True and len(cold["items"]) == 3  # type: ignore[arg-type]
    finally:
        rc = up.stop()
    assert rc == 0, "\n".join(up.seen)
    out = tmp_path / "out"
    assert (out / "retriever.toml").is_file() and (out / "pipeline.toml").is_file()
    assert (out / "retriever" / "model.pt").is_file() and (out / "pipeline" / "manifest.json").is_file()


@pytest.mark.slow
def test_up_without_a_log_serves_the_synthetic_world_and_reports_the_oracle(tmp_path: Path) -> None:
    port = free_port()
    up = Up(["--world-users", "300", "--world-items", "200", "--port", str(port), "train.epochs=2"], tmp_path)
    try:
        m = up.wait_for(r"hit rate@20 .*: pipeline ([0-9.]+), oracle ([0-9.]+)")
        pipeline, oracle = float(m.group(1)), float(m.group(2))
        assert 0.0 < pipeline <= oracle + 0.05 and oracle > 0.3, (pipeline, oracle)
        up.wait_for(r"curl -s")
        answer = recommend(port, 0, 20)
        assert len(answer["items"]) == 20 and answer["cold_start"] is False  # type: ignore[arg-type]
        assert all(0 <= i < 200 for i in answer["items"])  # type: ignore[attr-defined]
    finally:
        rc = up.stop()
    assert rc == 0, "\n".join(up.seen)
    assert (tmp_path / "runs" / "up" / "events.csv").is_file()


@pytest.mark.slow
def test_up_loop_serves_a_new_version_when_a_file_lands(tmp_path: Path) -> None:
    """--loop on a folder: a visitor first seen in a new file is unknown (popular items), then, once the
    retrained version serves, known to the model."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "part-1.csv")
    port = free_port()
    up = Up([str(logs), "--loop", "--loop-every", "1", "--out", "out", "--port", str(port), "train.epochs=1"], tmp_path)
    try:
        up.wait_for(r"curl -s")
        assert recommend(port, 5555, 3)["cold_start"] is True
        lines = ["visitor_id,product_id,price,event_time"] + [f"5555,{7 * i + 3},9.99,2024-04-{1 + i:02d} 10:00:00" for i in range(8)]
        (logs / ".part-2.csv.tmp").write_text("\n".join(lines) + "\n")
        (logs / ".part-2.csv.tmp").rename(logs / "part-2.csv")  # lands whole
        up.wait_for(r"\[loop\] up version 2 serving, version 1 unloaded")
        answer = recommend(port, 5555, 3)
        assert answer["cold_start"] is False and len(answer["items"]) == 3, answer  # type: ignore[arg-type]
    finally:
        rc = up.stop()
    assert rc == 0, "\n".join(up.seen)
    assert (tmp_path / "out" / "pipeline-v2" / "manifest.json").is_file()


def test_the_configs_up_writes_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--no-serve on a log: retriever.toml and pipeline.toml are what `hugerec train` / `pipeline build` take, from any directory."""
    log = tmp_path / "events.csv"
    write_log(log)
    monkeypatch.chdir(tmp_path)
    assert main(["up", "events.csv", "--no-serve", "train.epochs=1"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "[5/5] not serving (--no-serve): hugerec serve" in printed
    # ranker.enabled = "auto" and no label column: no ranker, said in one line with how to add one
    (line,) = [x for x in printed.splitlines() if x.startswith("[3/5]")]
    assert line.startswith("[3/5] no ranker: the log has no label column") and line.endswith("add one with --ranker or ranker.enabled = true"), line
    assert "\n[score]" not in (tmp_path / "runs" / "up" / "pipeline.toml").read_text()
    assert not (tmp_path / "runs" / "up" / "ranker.toml").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "runs" / "up"
    assert main(["train", str(out / "retriever.toml"), "--print-config"]) == 0
    assert main(["pipeline", "build", str(out / "pipeline.toml")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["pipeline", "query", str(out / "pipeline"), "--user", "1000", "--k", "4"]) == 0
    assert len(json.loads(capsys.readouterr().out)["items"]) == 4
    # and `up CONFIG.toml` reruns from the (edited) config, with the pipeline.toml beside it
    assert main(["up", str(out / "retriever.toml"), "--no-serve", "train.epochs=1"]) == 0, capsys.readouterr().err


def test_print_config_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["up", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert 'type = "two_tower"' in text and '{ name = "user", type = "int", role = "user" }' in text
    assert not (tmp_path / "runs").exists()


def test_columns_by_name_and_by_flag(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    log.write_text("userId,movieId,rating,ts\n1,10,4,978300760\n2,11,5,978300761\n")
    spec = log_spec(log, None, None, None)
    roles = {c.name: c.role for c in spec.columns}
    assert roles == {"userId": Role.USER, "movieId": Role.ITEM, "rating": Role.NONE, "ts": Role.TIMESTAMP}
    assert spec.column("ts").type is ColumnType.TIMESTAMP
    swapped = log_spec(log, "movieId", "userId", "ts")
    assert swapped.column("movieId").role is Role.USER and swapped.column("userId").role is Role.ITEM


@pytest.mark.parametrize(
    ("content", "flags", "expected"),
    [
        ("who,movieId,ts\n1,10,978300760\n", [], "has no user column (columns ['who', 'movieId', 'ts']); name it with --user-column COLUMN"),
        ("user_id,what,ts\n1,10,978300760\n", [], "has no item column (columns ['user_id', 'what', 'ts']); name it with --item-column COLUMN"),
        ("user_id,item_id,rating\n1,10,4\n", [], "has no time column (columns ['user_id', 'item_id', 'rating'])"),
        ("user_id,item_id,ts\nab,10,978300760\n", [], "column 'user_id' of"),
        ("user_id,item_id,ts\n1,10,978300760\n", ["--user-column", "nope"], "--user-column 'nope':"),
        ("user_id,item_id,ts\n1,10,978300760\n", ["--item-column", "user_id"], "cannot be both the user and the item"),
        ("", [], "cannot read"),
    ],
)
def test_bad_logs_are_one_line_naming_the_column_and_file(
    content: str, flags: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.csv"
    log.write_text(content)
    assert main(["up", str(log), "--print-config", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hugerec up: error: ") and "\n" not in err, err
    assert expected in err and (str(log) in err or "--" in expected), err


def test_missing_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, expected in [
        ([str(tmp_path / "nope.csv")], f"{tmp_path / 'nope.csv'}: no such file"),
        ([str(tmp_path)], f"{tmp_path}: no log files in this folder"),
        (["--loop"], "--loop watches a folder of log files"),
        (["--user-column", "u"], "--user-column / --item-column / --time-column / --label-column name a log's columns; give the log"),
        ([str(tmp_path / "nope.toml")], f"config file not found: {tmp_path / 'nope.toml'}"),
        (["a.csv", "b.csv"], "expected one event log or config file"),
    ]:
        assert main(["up", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("hugerec up: error: ") and expected in err and "\n" not in err, err


def test_a_folder_is_one_log_read_through_its_glob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "day-1.csv", seed=1)
    write_log(logs / "day-2.csv", seed=2)
    (logs / ".half-written.csv.tmp").write_text("not,a,log\n")
    assert main(["up", str(logs), "--print-config", "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert f'input = "{logs.resolve() / "*.csv"}"' in text and '{ name = "visitor_id", type = "int", role = "user" }' in text
