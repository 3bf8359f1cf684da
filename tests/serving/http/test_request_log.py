"""The request log: sampling, rotation into whole Parquet files, feedback joined only for logged ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hugerec.serving.http.request_log import FeedbackCounts, RequestLog, RequestLogConfig
from hugerec.serving.runtime.model_inputs import ModelInputs


def inputs(b: int) -> ModelInputs:
    lengths = np.array([1, 0, 2] * (b // 3), np.int32)
    values = np.arange(int(lengths.sum()), dtype=np.int64) + 100
    return ModelInputs(np.arange(b * 2, dtype=np.float32).reshape(b, 2), {"item": (values, lengths)})


def test_rows_rotate_into_parquet_with_first_ids_and_feedback(tmp_path: Path) -> None:
    log = RequestLog(RequestLogConfig(str(tmp_path), rotate_rows=6, remember=8, seed=0))
    ids = log.record("m", "v1", inputs(3), np.array([0.1, 0.2, 0.3]), ("a", "b"))
    assert len(ids) == 3 and not list(tmp_path.glob("*.parquet"))  # buffered below rotate_rows
    ids += log.record("m", "v2", inputs(3), np.array([0.4, 0.5, 0.6]), ("a", "b"))
    files = sorted(tmp_path.glob("requests-*.parquet"))
    assert len(files) == 1
    t = pq.read_table(files[0])
    assert t["request_id"].to_pylist() == ids and t["version"].to_pylist() == ["v1"] * 3 + ["v2"] * 3
    assert t["item"].to_pylist() == [100, None, 101] * 2  # first id per row, null for an empty bag
    assert t["b"].to_pylist() == [1.0, 3.0, 5.0] * 2
    assert log.add_feedback([(ids[0], 1.0), ("never-issued", 0.0)]) == FeedbackCounts(accepted=1, unknown=1)
    log.flush()
    fb = pq.read_table(next(tmp_path.glob("feedback-*.parquet")))
    assert fb["request_id"].to_pylist() == [ids[0]] and fb["label"].to_pylist() == [1.0]
    for _ in range(3):
        log.record("m", "v1", inputs(3), np.zeros(3), None)
    assert log.add_feedback([(ids[0], 1.0)]) == FeedbackCounts(unknown=1)  # older than the last `remember` logged ids
    assert not list(tmp_path.glob(".*.tmp"))


def test_sampling_logs_a_share_and_config_is_checked(tmp_path: Path) -> None:
    log = RequestLog(RequestLogConfig(str(tmp_path), sample=0.25, seed=1))
    for _ in range(100):
        log.record("m", "v", inputs(30), np.zeros(30), None)
    log.flush()
    rows = sum(pq.read_metadata(p).num_rows for p in tmp_path.glob("requests-*.parquet"))
    assert 0.2 < rows / 3000 < 0.3
    with pytest.raises(ValueError, match=r"sample must be in \(0, 1\], got 0"):
        RequestLogConfig(str(tmp_path), sample=0)


def test_the_first_label_of_a_request_id_wins_and_later_ones_are_counted(tmp_path: Path) -> None:
    """#28: every duplicate label of a request id was kept, so a client could weigh a version's KPIs."""
    log = RequestLog(RequestLogConfig(str(tmp_path), seed=0))
    ids = log.record("m", "v1", inputs(3), np.zeros(3), None)
    assert log.add_feedback([(ids[0], 1.0), (ids[0], 0.0), (ids[1], 0.0)]) == FeedbackCounts(accepted=2, duplicate=1)
    assert log.add_feedback([(ids[0], 0.0), (ids[1], 1.0), (ids[2], 1.0)]) == FeedbackCounts(accepted=1, duplicate=2)
    log.flush()
    fb = pq.read_table(next(tmp_path.glob("feedback-*.parquet")))
    assert dict(zip(fb["request_id"].to_pylist(), fb["label"].to_pylist(), strict=True)) == {ids[0]: 1.0, ids[1]: 0.0, ids[2]: 1.0}
    assert log.feedback.labels("duplicate")._value.get() == 3


def test_feedback_is_taken_only_within_the_window_after_the_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    log = RequestLog(RequestLogConfig(str(tmp_path), seed=0, feedback_window_s=60))
    ids = log.record("m", "v1", inputs(3), np.zeros(3), None)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 61)
    assert log.add_feedback([(ids[0], 1.0)]) == FeedbackCounts(expired=1)
    monkeypatch.setattr(time, "time", lambda: now + 30)
    assert log.add_feedback([(ids[0], 1.0)]) == FeedbackCounts(accepted=1)
    with pytest.raises(ValueError, match="feedback_window_s"):
        RequestLogConfig(str(tmp_path), feedback_window_s=0)
