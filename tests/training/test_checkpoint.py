import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.training import checkpoint as ckpt
from hugerec.training.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_save_load_roundtrip_and_latest(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    w = torch.arange(4.0)
    state = {"w": w, "step": 3, "nested": {"a": [1, 2.5, "x", None]}}
    path = save_checkpoint(tmp_path, 3, state)
    assert path.name == "step-0000000003.pt"
    save_checkpoint(tmp_path, 12, {"step": 12})
    assert latest_checkpoint(tmp_path) == tmp_path / "step-0000000012.pt"
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["w"], w)
    assert loaded["nested"] == state["nested"]


def test_keeps_only_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4, 5):
        save_checkpoint(tmp_path, step, {"step": step}, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    for step in (6, 7):
        save_checkpoint(tmp_path, step, {"step": step}, keep_last=0)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5, 6, 7]


def test_crash_mid_write_keeps_previous_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save_checkpoint(tmp_path, 1, {"step": 1})

    def torn_save(obj: object, f: object) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", torn_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"step": 2})
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == tmp_path / "step-0000000001.pt"
    assert load_checkpoint(latest_checkpoint(tmp_path))["step"] == 1  # type: ignore[arg-type]
    save_checkpoint(tmp_path, 3, {"step": 3})  # the next save sweeps the torn temporary file away
    assert not list(tmp_path.glob(".*.tmp"))


def test_refuses_pickled_code_and_garbage(tmp_path: Path) -> None:
    evil = tmp_path / "step-0000000001.pt"
    torch.save({"obj": Path("/")}, evil)  # an arbitrary class: weights_only must refuse it
    with pytest.raises(ValueError, match="cannot read"):
        load_checkpoint(evil)
    garbage = tmp_path / "step-0000000002.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"step-0000000002\.pt"):
        load_checkpoint(garbage)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nope.pt")


def test_rng_state_roundtrip_through_a_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's legacy state
    save_checkpoint(tmp_path, 0, {"rng": rng_state()})
    expected = (torch.rand(3), np.random.standard_normal(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    set_rng_state(load_checkpoint(tmp_path / "step-0000000000.pt")["rng"])
    got = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[2] == expected[2]
