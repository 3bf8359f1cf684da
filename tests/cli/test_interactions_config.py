"""The retrieval and sequential tasks' config sections: defaults and every refusal naming the key and value;
the old [interactions] / [sequences] dialect rewritten into [preprocess] with a one-line note (header names
read from the file, the other family's keys left out), and refused when [preprocess] declares the input too;
resolve_task_inputs passes [recommend]'s files through the finder."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from hugerec.cli.config_file import ConfigError
from hugerec.cli.interactions_config import (
    IndexSection,
    InteractionsSection,
    RecommendSection,
    SequencesSection,
    resolve_task_inputs,
    upgrade_old_sections,
)
from hugerec.data.input_spec import Role
from hugerec.index.vector_index import IndexKind


def test_sections_defaults() -> None:
    assert InteractionsSection().ks == (10, 50)
    spec = SequencesSection(group="user", gap_seconds=1800).spec()
    assert spec.group is Role.USER and spec.gap_seconds == 1800
    assert IndexSection(kind=IndexKind.HNSW, dtype="f16").index_config().kind is IndexKind.HNSW
    assert RecommendSection().k == 10


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: InteractionsSection(min_item_count=0), "min_item_count must be >= 1, got 0"),
        (lambda: InteractionsSection(batch_size=0), "batch_size must be >= 1, got 0"),
        (lambda: InteractionsSection(max_users=0), "max_users must be >= 1 or none, got 0"),
        (lambda: InteractionsSection(ks=()), r"ks must be a non-empty list of K >= 1, got \[\]"),
        (lambda: InteractionsSection(ks=(10, 0)), r"ks must be a non-empty list of K >= 1, got \[10, 0\]"),
        (lambda: SequencesSection(group="item"), "group must be 'session' or 'user' \\(or none\\), got 'item'"),
        (lambda: SequencesSection(batch_size=0), "batch_size must be >= 1, got 0"),
        (lambda: SequencesSection(ks=(0,)), r"ks must be a non-empty list of K >= 1, got \[0\]"),
        (lambda: RecommendSection(k=0), "k must be >= 1, got 0"),
        (lambda: IndexSection(dtype="f64"), "f64"),
    ],
)
def test_bad_values_are_refused(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_config_without_old_keys_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    data = {"preprocess": {"input": "x.csv"}, "interactions": {"batch_size": 64}}
    assert upgrade_old_sections(data, "retrieval") is data
    assert capsys.readouterr().err == ""


def test_old_interactions_become_a_declaration(capsys: pytest.CaptureFixture[str]) -> None:
    data = {
        "interactions": {
            "files": "ratings.csv",
            "columns": ["u", "i", "t", "rating"],
            "user": "u",
            "item": "i",
            "timestamp": "t",
            "split": "time",
            "time_cutoff": 900,
            "batch_size": 64,
        },
        "sequences": {"files": "sessions.csv", "min_length": 3},
    }
    out = upgrade_old_sections(data, "retrieval")
    assert out["interactions"] == {"batch_size": 64}  # the view's own keys stay
    assert out["sequences"] == {"min_length": 3}  # the other family's reader keys are left out
    assert out["preprocess"] == {
        "format": "csv",
        "columns": [
            {"name": "u", "type": "int", "role": "user"},
            {"name": "i", "type": "int", "role": "item"},
            {"name": "t", "type": "timestamp"},
            {"name": "rating", "type": "string", "role": "none"},
        ],
        "input": "ratings.csv",
        "separator": ",",
        "header": False,
        "split": "time",
        "time_cutoff": 900,
    }
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "[interactions] files, columns, user, item, timestamp, split, time_cutoff are the old dialect" in err
    )
    assert "sequences.files do not apply to this model.type and are left out" in err
    assert data["interactions"]["batch_size"] == 64 and "files" in data["interactions"]  # the input is not changed


def test_old_sequences_read_the_header_and_the_protocol(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "clicks.csv").write_text("session_id,item_id,ts\n1,5,100\n")
    data = {"sequences": {"files": "clicks.csv", "header": True, "protocol": "every_prefix", "test_days": 2}}
    out = upgrade_old_sections(data, "sequential", find=lambda p: str(tmp_path / p))
    assert [c["name"] for c in out["preprocess"]["columns"]] == [
        "session_id",
        "item_id",
        "ts",
    ]  # named as the header does
    assert out["preprocess"]["split"] == "time" and out["preprocess"]["last_days"] == 2.0
    assert out["sequences"] == {"protocol": "every_prefix", "group": "session"}
    capsys.readouterr()


def test_mixing_the_dialects_is_refused() -> None:
    data = {"preprocess": {"input": "new.csv"}, "interactions": {"files": "old.csv"}}
    with pytest.raises(ConfigError, match=r"interactions.files and preprocess.input: the config mixes the old dialect"):
        upgrade_old_sections(data, "retrieval")


@dataclasses.dataclass(frozen=True)
class _Config:
    recommend: RecommendSection


def test_resolve_task_inputs_finds_recommends_files() -> None:
    cfg = _Config(RecommendSection(users_file="users.txt"))
    out = resolve_task_inputs(cfg, lambda p: None if p is None else f"/data/{p}")
    assert out.recommend.users_file == "/data/users.txt" and out.recommend.history_file is None
