"""RunLog: metrics.jsonl gets one JSON object per record (NaN and inf as null, never invalid JSON), a fresh run
starts the log afresh, a resumed one drops what was logged after its checkpoint (and a line torn by a crash);
TensorBoard gets finite scalars; plot_curves writes a PNG."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from hugerec.training.run_log import RunLog, plot_curves, truncate_log


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_records_are_json_lines_with_null_for_nan(tmp_path: Path) -> None:
    with RunLog(tmp_path, tensorboard=False) as log:
        log.write("train", 10, {"loss": 0.5, "auc": math.nan})
        log.write("eval", 20, {"auc": 0.75, "logloss": math.inf})
    assert _records(tmp_path) == [
        {"split": "train", "step": 10, "loss": 0.5, "auc": None},
        {"split": "eval", "step": 20, "auc": 0.75, "logloss": None},
    ]


def test_a_fresh_run_starts_afresh_and_a_resumed_one_drops_later_steps(tmp_path: Path) -> None:
    with RunLog(tmp_path, tensorboard=False) as log:
        for step in (10, 20, 30):
            log.write("train", step, {"loss": 1.0 / step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"split": "train", "st')  # a line torn by a crash
    with RunLog(tmp_path, tensorboard=False, append=True, resume_step=20) as log:
        log.write("train", 30, {"loss": 0.0})
    assert [(r["step"], r["loss"]) for r in _records(tmp_path)] == [(10, 0.1), (20, 0.05), (30, 0.0)]
    with RunLog(tmp_path, tensorboard=False):
        pass
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_truncate_log_keeps_steps_up_to_and_skips_foreign_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n[1, 2]\n{"step": "x"}\n{"step": 2.0}\n{"step": 3}\n')
    truncate_log(path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2.0}\n'
    truncate_log(tmp_path / "absent.jsonl", 5)  # nothing to truncate
    assert not (tmp_path / "absent.jsonl").exists()


def test_no_out_dir_keeps_nothing(tmp_path: Path) -> None:
    log = RunLog(None)
    log.write("train", 1, {"loss": 1.0})
    log.close()
    assert list(tmp_path.iterdir()) == []


def _scalars(folder: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the event files under `folder`, read as TFRecords (length u64,
    its crc u32, the Event bytes, their crc u32) with tensorboardX's own Event message."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        raw = path.read_bytes()
        at = 0
        while at < len(raw):
            (n,) = struct.unpack("<Q", raw[at : at + 8])
            event = event_pb2.Event.FromString(raw[at + 12 : at + 12 + n])
            at += 12 + n + 4
            out += [(v.tag, event.step, round(v.simple_value, 6)) for v in event.summary.value]
    return out


def test_tensorboard_gets_the_finite_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    with RunLog(tmp_path) as log:
        log.write("eval", 5, {"auc": 0.7, "epoch": 1.0, "logloss": math.nan})
    assert _scalars(tmp_path / "tensorboard") == [("eval/auc", 5, 0.7)]  # not the epoch, not the NaN


def test_plot_curves_writes_a_png(tmp_path: Path) -> None:
    out = plot_curves(
        [{"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.7}],
        [{"step": 2, "logloss": 0.6, "recall@10": 0.2}],
        tmp_path / "plots" / "curves.png",
        metric="recall@10",
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_curves([], [], tmp_path / "empty.png").is_file()
