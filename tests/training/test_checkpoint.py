"""A run's checkpoints: round trip, rotation, atomic writes, damage named, nothing unpickled, RNG states."""

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hugerec.distributed import checkpoint_directory as directory_format
from hugerec.training.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    read_weights,
    remove_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def small(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # some optimizer state to carry
    return model, opt


def same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_save_load_roundtrip_and_latest(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    model, opt = small()
    extra = {"step": 3, "nested": {"a": [1, 2.5, "x", None]}}
    path = save_checkpoint(tmp_path, 3, model, opt, extra, rank_state={"w": torch.arange(4.0), "n": 5})
    assert path.name == "step-0000000003" and path.is_dir()
    save_checkpoint(tmp_path, 12, model)
    assert latest_checkpoint(tmp_path) == tmp_path / "step-0000000012"
    fresh, fresh_opt = small(seed=1)
    resumed = load_checkpoint(path, fresh, fresh_opt)
    assert same(fresh, model) and resumed.extra == extra and resumed.path == path
    assert resumed.rank_state is not None and resumed.rank_state["n"] == 5
    assert torch.equal(resumed.rank_state["w"], torch.arange(4.0))
    state, want = fresh_opt.state_dict()["state"], opt.state_dict()["state"]
    assert all(torch.equal(state[i]["exp_avg"], want[i]["exp_avg"]) for i in want)
    assert load_checkpoint(tmp_path / "step-0000000012", small(2)[0]).extra is None


def test_keeps_only_the_newest(tmp_path: Path) -> None:
    model, _ = small()
    for step in (1, 2, 3, 4, 5):
        save_checkpoint(tmp_path, step, model, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    for step in (6, 7):
        save_checkpoint(tmp_path, step, model, keep_last=0)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5, 6, 7]
    remove_checkpoints(tmp_path)
    assert list_checkpoints(tmp_path) == []


def test_crash_mid_write_keeps_previous_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = small()
    save_checkpoint(tmp_path, 1, model, extra={"step": 1})

    def torn_save(obj: object, f: object) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(directory_format.torch, "save", torn_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, model, extra={"step": 2})
    monkeypatch.undo()
    assert (tmp_path / ".step-0000000002.tmp").is_dir()  # the torn write, under no checkpoint's name
    assert latest_checkpoint(tmp_path) == tmp_path / "step-0000000001"
    assert load_checkpoint(tmp_path / "step-0000000001", small(3)[0]).extra == {"step": 1}
    save_checkpoint(tmp_path, 3, model)  # the next save sweeps the torn temporary directory away
    assert not list(tmp_path.glob(".*.tmp"))


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_refuses_pickled_code_damage_and_garbage(tmp_path: Path) -> None:
    model, _ = small()
    path = save_checkpoint(tmp_path, 1, model)
    data = path / "rank-00000.pt"
    _flip(data)
    with pytest.raises(ValueError, match=r"rank-00000\.pt is damaged \(sha256"):
        load_checkpoint(path, small()[0])
    marker = tmp_path / "pwned"
    torch.save({"dense/0.weight": _RunsCode(marker)}, data)  # checksum forged to match
    index = json.loads((path / "index.json").read_text())
    index["files"]["rank-00000.pt"] = directory_format._sha256(data)
    (path / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="UnpicklingError"):
        load_checkpoint(path, small()[0])
    assert not marker.exists()
    with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
        load_checkpoint(tmp_path / "nope", small()[0])
    # the single-file reader (model files): zip CRCs, then weights_only
    single = tmp_path / "one.pt"
    torch.save({"w": torch.randn(256, 64)}, single)
    _flip(single)
    with pytest.raises(ValueError, match=r"read: .*one\.pt is damaged \(checksum mismatch"):
        read_weights(single, "read", "file")
    torch.save({"obj": _RunsCode(marker)}, single)
    with pytest.raises(ValueError, match="cannot read"):
        read_weights(single, "read", "file")
    single.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"one\.pt is damaged or not a file"):
        read_weights(single, "read", "file")
    assert not marker.exists()


def test_the_newest_intact_checkpoint_is_loaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = small()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, extra={"step": step})
    _flip(tmp_path / "step-0000000003" / "rank-00000.pt")
    with caplog.at_level("WARNING"):
        resumed = load_latest_checkpoint(tmp_path, small(1)[0])
    assert resumed is not None and resumed.extra == {"step": 2}
    assert [r.getMessage().count("\n") for r in caplog.records] == [0]
    assert "step-0000000003/rank-00000.pt is damaged" in caplog.records[0].getMessage()
    assert (tmp_path / "step-0000000003.damaged").is_dir()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]
    assert load_latest_checkpoint(tmp_path / "none", model) is None


def test_rng_state_roundtrip_through_a_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's legacy state
    save_checkpoint(tmp_path, 0, nn.Linear(1, 1), rank_state={"rng": rng_state()})
    expected = (torch.rand(3), np.random.standard_normal(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    resumed = load_checkpoint(tmp_path / "step-0000000000", nn.Linear(1, 1))
    assert resumed.rank_state is not None
    set_rng_state(resumed.rank_state["rng"])
    got = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[2] == expected[2]
