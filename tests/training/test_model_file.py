"""The model file: round trip with what built the model; damaged, crafted or foreign files are one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from hugerec.data.schema import Schema
from hugerec.embedding.optimizers import RowWiseAdagrad
from hugerec.models.model import RecModel
from hugerec.models.model_config import DLRMConfig, build_model
from hugerec.training.model_file import load_model, save_model

SCHEMA = Schema.build(dense=["d0", "d1"], sparse={"user": 50, "item": 30})
CONFIG = DLRMConfig(bottom=(8, 4), top=(8, 1))
OPTIMIZER = RowWiseAdagrad(lr=0.1)


def saved(tmp_path: Path) -> tuple[Path, RecModel]:
    torch.manual_seed(0)
    tables = SCHEMA.table_configs(dim=4)
    model = build_model(CONFIG, tables, 2, OPTIMIZER)
    return save_model(tmp_path / "model.pt", model, CONFIG, tables, OPTIMIZER, SCHEMA.to_dict()), model


def test_round_trip_rebuilds_the_model_and_its_schema(tmp_path: Path) -> None:
    path, model = saved(tmp_path)
    back = load_model(path)
    assert back.config == CONFIG and back.optimizer == OPTIMIZER and Schema.from_dict(back.schema or {}) == SCHEMA
    assert [t.name for t in back.tables] == ["user", "item"] and back.model.num_dense == 2
    for k, v in model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v), k
    bare = save_model(tmp_path / "bare.pt", model, CONFIG, back.tables, OPTIMIZER)  # the schema is optional
    assert load_model(bare).schema is None


def test_flipped_bytes_are_reported_not_loaded(tmp_path: Path) -> None:
    """#20 defects 4 and 8: 64 flipped bytes loaded as wrong weights; now the file is named as damaged."""
    path, _ = saved(tmp_path)
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"^load_model: .*model\.pt is damaged") as e:
        load_model(path)
    assert "\n" not in str(e.value)
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=r"model\.pt is damaged or not a model file"):
        load_model(path)
    with pytest.raises(FileNotFoundError, match="no model file at"):
        load_model(tmp_path / "absent.pt")


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_crafted_and_foreign_files_are_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"spec": "{}", "state": _RunsCode(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"cannot read .*evil\.pt as a model file: UnpicklingError"):
        load_model(tmp_path / "evil.pt")
    assert not marker.exists()
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match=r"foreign\.pt is not a hugerec model file: 'spec'"):
        load_model(tmp_path / "foreign.pt")
    path, model = saved(tmp_path)
    spec = json.loads(torch.load(path, weights_only=True)["spec"])
    torch.save({"spec": json.dumps({**spec, "format": 9}), "state": model.state_dict()}, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="model format 9, this hugerec reads 1"):
        load_model(tmp_path / "future.pt")
    spec["tables"][0]["num_rows"] = 51
    torch.save({"spec": json.dumps(spec), "state": model.state_dict()}, tmp_path / "mismatch.pt")
    with pytest.raises(ValueError, match=r"weights in .*mismatch\.pt do not fit the model its spec describes"):
        load_model(tmp_path / "mismatch.pt")
