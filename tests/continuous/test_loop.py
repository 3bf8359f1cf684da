"""The loop offline: warm start, gate refusing a broken candidate, empty windows, schema changes, kill -9."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from hugerec.continuous.decision_log import read_log
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig, Recovery
from hugerec.data.synthetic_stream import Stream
from hugerec.data.windows import holdout_mask
from hugerec.embedding.collection import EmbeddingCollection

from .conftest import SMALL

Day = Callable[[int], pa.Table]
MakeConfig = Callable[..., LoopConfig]


def shuffled(table: pa.Table, config: LoopConfig) -> pa.Table:
    """The window with its training rows' labels shuffled (its holdout, which gates window k - 1, kept)."""
    labels = table["label"].to_numpy().copy()
    train = ~holdout_mask(table.num_rows, config.holdout_share, config.seed)
    labels[train] = np.random.default_rng(0).permutation(labels[train])
    return table.set_column(table.column_names.index("label"), "label", pa.array(labels))


def test_gate_refuses_a_candidate_trained_on_shuffled_labels(
    tmp_path: Path, small_day: Day, loop_config: MakeConfig
) -> None:
    days = {d: small_day(d) for d in range(4)}
    config = loop_config(tmp_path)
    days[2] = shuffled(days[2], config)
    loop = Loop(config, days.__getitem__)
    records = loop.run(0, 3)
    actions = [(r.window, r.action) for r in records]
    assert actions == [(0, "trained"), (0, "publish"), (1, "trained"), (1, "publish"), (2, "trained"), (2, "refuse")]
    refused = records[-1]
    assert "AUC" in refused.reason and refused.gate is not None
    assert refused.gate["candidate_auc"] < refused.gate["serving_auc"] - 0.005
    assert loop.serving_version() == "w1" and loop.base_version() == "w1"  # the served model is unchanged


def test_warm_start_learns_and_log_reads_back(tmp_path: Path, small_day: Day, loop_config: MakeConfig) -> None:
    loop = Loop(loop_config(tmp_path), small_day)
    records = loop.run(0, 3)
    published = [r for r in records if r.action == "publish"]
    assert [r.version for r in published] == ["w0", "w1", "w2"]
    assert published[-1].gate is not None and published[-1].gate["candidate_auc"] > 0.6
    trained = [r for r in records if r.action == "trained"]
    assert [r.extra["base"] for r in trained] == [None, "w0", "w1"]
    assert read_log(tmp_path / "decisions.jsonl") == records


def test_empty_window_is_skipped_and_schema_change_is_named(
    tmp_path: Path, small_day: Day, loop_config: MakeConfig
) -> None:
    days = {0: small_day(0), 1: small_day(0).slice(0, 0), 2: small_day(2), 3: small_day(3)}
    loop = Loop(loop_config(tmp_path), days.__getitem__)
    loop.run(0, 2)
    assert [(r.window, r.action) for r in loop.log.records] == [(0, "trained"), (0, "refuse"), (1, "skip")]
    assert "min_rows" in loop.log.records[1].reason  # window 0's gate had no holdout (window 1 is empty)
    days[2] = small_day(2).drop_columns(["label"])  # other schema changes: tests/continuous/test_publish_delta.py
    with pytest.raises(ValueError, match=r"window 2: the label column 'label' is missing"):
        loop.step(2)
    assert loop.serving_version() is None and len(loop.log.records) == 3


def test_gate_refuses_an_empty_holdout(tmp_path: Path, small_day: Day, loop_config: MakeConfig) -> None:
    days = {0: small_day(0), 1: small_day(1).slice(0, 0)}
    loop = Loop(loop_config(tmp_path, gate=GateConfig(min_rows=10)), days.__getitem__)
    loop.step(0)
    last = loop.log.records[-1]
    assert last.action == "refuse" and "min_rows" in last.reason and "not finite" in last.reason


_CHILD = """
import sys
sys.path.insert(0, {root!r})
from hugerec.continuous.loop import Loop, LoopConfig, ModelSpec
from hugerec.data.synthetic_stream import Stream, StreamConfig
from hugerec.embedding.optimizers import Adagrad
from hugerec.models.model_config import DLRMConfig
small = StreamConfig(days=5, rows_per_day=40000, num_sparse=4, num_dense=2, vocabulary=500, seed=3)
stream = Stream(small)
spec = ModelSpec(DLRMConfig(bottom=(8, 4), top=(8, 1)), dim=4, optimizer=Adagrad(lr=0.1), capacity=4000)
config = LoopConfig({work!r}, small.schema, model=spec, batch_size=128, lr=1e-2, epochs=2)
Loop(config, lambda k: stream.day(k).table).run(0, 4)
print("done")
"""


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_kill_9_at_any_point_resumes_without_double_publish_or_skip(tmp_path: Path) -> None:
    """The loop is killed (SIGKILL) a short random time after each new log line, three times, then runs to
    the end: every window has exactly one outcome, in order, and no version is published twice."""
    root = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "child.py"
    work = tmp_path / "work"
    script.write_text(_CHILD.format(root=root, work=str(work)))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    log = work / "decisions.jsonl"
    rng = np.random.default_rng(7)
    kills = 0
    for _ in range(3):
        seen = _lines(log)
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while _lines(log) == seen and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(float(rng.uniform(0.0, 0.6)))  # somewhere in the next phase: training, gate, export, append
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate()
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, timeout=240)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert kills >= 2
    records = read_log(log)
    terminal = [r.window for r in records if r.action in ("publish", "refuse", "skip")]
    assert terminal == [0, 1, 2, 3]  # one outcome per window, none skipped, in order
    published = [r.version for r in records if r.action == "publish"]
    assert len(published) == len(set(published))
    for line in log.read_text().splitlines():
        json.loads(line)  # whole records only


def test_dynamic_tables_admit_new_ids_and_evict_stale_ones(
    tmp_path: Path, small_day: Day, loop_config: MakeConfig
) -> None:
    config = loop_config(tmp_path)
    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, capacity=150), keep_all_checkpoints=True
    )
    loop = Loop(config, small_day)
    loop.run(0, 3)
    assert [r.version for r in loop.log.records if r.action == "publish"] == ["w0", "w1", "w2"]
    held = []
    for version in ("w0", "w2"):
        table = loop.load(version).sparse_arch.hash_tables["c0"]
        assert len(table) == 150  # full: the window had more distinct ids than rows
        held.append(set(table.export().keys.tolist()))
    vocabulary = 500  # the stream's (conftest.SMALL): keys >= 500 are ids born after day 0
    assert not any(k >= vocabulary for k in held[0])  # day 0 knows only first-generation ids
    assert any(k >= vocabulary for k in held[1])  # ids born on days 1-2 got rows in the warm-started table
    assert held[0] - held[1]  # and some of day 0's ids lost theirs


def test_a_concept_drift_starts_a_recovery_that_retrains_again_as_the_windows_since_it_double(
    tmp_path: Path, loop_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concept drift on day 2 (every per-id effect redrawn): the gate of step 1 sees the serving model fall on
    day 2's holdout; window 2 retrains the model published before the drift (its sparse optimizer state reset)
    on window 2, window 3 on windows 2-3, window 5 on windows 2-5 (the windows since the drift doubled),
    windows 4 and 6 warm-start; day windows span 24 h, so `hours` 100 allows 4 windows and not 8. The old model
    still serving at step 2 is below its baseline on window 3 too: that is the same drift, not a second one."""
    stream = Stream(dataclasses.replace(SMALL, days=8, concept_drift_day=2, concept_drift_share=1.0))
    days = [stream.day(d).table for d in range(8)]
    resets: list[int] = []
    original = EmbeddingCollection.reset_optimizer_state

    def counted(self: EmbeddingCollection, tables: object = None) -> None:
        resets.append(int(sum(float(v.sum()) > 0 for k, v in self.state_dict().items() if k.endswith(".sum"))))
        original(self)

    monkeypatch.setattr(EmbeddingCollection, "reset_optimizer_state", counted)
    loop = Loop(loop_config(tmp_path, recovery=Recovery(epochs=2, lr=1e-2, growth=2.0, hours=100)), days.__getitem__)
    records = loop.run(0, 7)
    drift = [r for r in records if r.action == "retrain"]
    assert [(r.window, r.extra) for r in drift] == [(2, {"windows": 1, "concept": True})]
    trained = {r.window: r for r in records if r.action == "trained"}
    before = [r.version for r in records if r.action == "publish" and r.window < 2][-1]
    plans = {k: r.extra.get("recovery") for k, r in trained.items()}
    assert plans == {
        0: None,
        1: None,
        2: {"since": 2, "windows": 1, "base": before},
        3: {"since": 2, "windows": 2, "base": before},
        4: None,
        5: {"since": 2, "windows": 4, "base": before},
        6: None,
    }
    assert trained[5].reason.startswith(
        f"concept-drift recovery: {before} with its sparse optimizer state reset, on the 4 window(s) since window 2"
    )
    assert [trained[k].extra["base"] for k in (2, 3, 5)] == [before] * 3 and trained[4].reason == "warm start"
    assert resets == [SMALL.num_sparse] * 3  # three recoveries, each from a model whose every table had trained
    serving = [r for r in records if r.action == "publish"][-1]
    assert serving.gate is not None and serving.gate["candidate_auc"] > 0.7  # the new relation learnt


def test_until_a_model_is_published_each_candidate_learns_from_every_window_so_far(
    tmp_path: Path, small_day: Day, loop_config: MakeConfig
) -> None:
    """Windows 1 and 2 hold 500 rows: their holdouts (about 50) are below min_rows, so the candidates of steps 0
    and 1 are refused. Step 2's candidate is a fresh model on windows 0-2 (not on window 2 alone: with short
    windows a loop that trained each refused candidate on its own window would never publish), step 3 warm-starts."""

    def day(k: int) -> pa.Table:
        return small_day(k).slice(0, 500) if k in (1, 2) else small_day(k)

    records = Loop(loop_config(tmp_path), day).run(0, 4)
    assert [(r.window, r.action) for r in records if r.action in ("publish", "refuse")] == [
        (0, "refuse"),
        (1, "refuse"),
        (2, "publish"),
        (3, "publish"),
    ]
    trained = [r for r in records if r.action == "trained"]
    assert [r.reason for r in trained] == [
        "a fresh model (nothing published yet)",  # the loop's first window: nothing earlier to add
        "from scratch on 2 window(s) (nothing published yet: every window since 0)",
        "from scratch on 3 window(s) (nothing published yet: every window since 0)",
        "warm start",
    ]
    assert [r.extra["base"] for r in trained] == [None, None, None, "w2"]


def test_only_the_checkpoints_a_later_step_reads_are_kept(
    tmp_path: Path, small_day: Day, loop_config: MakeConfig
) -> None:
    """Window 2's candidate is refused (shuffled labels): its checkpoint goes at once; each published version's
    goes when a newer one is the base and serves; keep_all_checkpoints keeps every one."""

    def day(k: int) -> pa.Table:
        return shuffled(small_day(k), config) if k == 2 else small_day(k)

    config = loop_config(tmp_path / "pruned")
    loop = Loop(config, day)
    kept = []
    for k in range(4):
        loop.step(k)
        kept.append(sorted(p.stem for p in (tmp_path / "pruned" / "checkpoints").glob("*.pt")))
    actions = [(r.window, r.action) for r in loop.log.records if r.action in ("publish", "refuse")]
    assert actions == [(0, "publish"), (1, "publish"), (2, "refuse"), (3, "publish")]
    assert kept == [["w0"], ["w1"], ["w1"], ["w3"]]
    assert loop.load("w3") is not None
    everything = Loop(dataclasses.replace(config, work_dir=str(tmp_path / "all"), keep_all_checkpoints=True), day)
    everything.run(0, 4)
    assert sorted(p.stem for p in (tmp_path / "all" / "checkpoints").glob("*.pt")) == ["w0", "w1", "w2", "w3"]
