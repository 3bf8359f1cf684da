"""`hugerec loop`'s file: defaults without a file, overrides, relative data paths found beside the config, a
retrieval model.type giving the retrieval loop's file, another loop's key refused naming it, the old [model]
dialect upgraded with a note (and refused when mixed), settings kept across starts except what a continued
loop may change, the LoopConfig built from the sections, and the decision log as a table."""

from __future__ import annotations

from pathlib import Path

import pytest

from hugerec.cli.config_file import ConfigError
from hugerec.cli.loop_command import (
    CONTINUE_MAY_CHANGE,
    LoopDataSection,
    LoopFile,
    ServerSection,
    keep_loop_settings,
    load_loop_file,
    log_table,
    loop_config,
    loop_settings,
)
from hugerec.cli.retrieval_loop_command import RetrievalLoopFile
from hugerec.continuous.decision_log import Record
from hugerec.data.synthetic_stream import StreamConfig
from hugerec.models.model_config import DLRMConfig


def test_defaults_and_overrides_without_a_file() -> None:
    cfg, base = load_loop_file(None, ["loop.batch_size=64", "data.stream.days=4"])
    assert isinstance(cfg, LoopFile) and base == Path.cwd()
    assert cfg.loop.batch_size == 64 and cfg.data.stream == StreamConfig(days=4)
    assert isinstance(cfg.model.model, DLRMConfig) and cfg.model.dim == 8
    config = loop_config(cfg)
    assert config.batch_size == 64 and config.schema.names == StreamConfig(days=4).schema.names


def test_relative_data_paths_are_found_beside_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "loop.toml").write_text('[data]\npaths = "windows/*.parquet"\nsparse = ["c0"]\n')
    monkeypatch.chdir(tmp_path)
    cfg, base = load_loop_file(str(tmp_path / "conf" / "loop.toml"), [])
    assert isinstance(cfg, LoopFile) and base == tmp_path / "conf"
    assert cfg.data.paths == str(tmp_path / "conf" / "windows/*.parquet")
    assert loop_config(cfg).schema.names == ("label", "c0")


def test_a_retrieval_type_reads_the_retrieval_loops_file() -> None:
    cfg, _ = load_loop_file(None, ["model.type=two_tower", "model.max_history=0", "model.recent=[]"])
    assert isinstance(cfg, RetrievalLoopFile)
    with pytest.raises(
        ConfigError,
        match=r"server\.replay_users: the retrieval loop's .* key, which model\.type = 'dlrm' does not read",
    ):
        load_loop_file(None, ["server.replay_users=5"])
    with pytest.raises(
        ConfigError, match=r"server\.replay_rows: the ranking loop's key, which model\.type = 'two_tower' does not read"
    ):
        load_loop_file(None, ["model.type=two_tower", "server.replay_rows=5"])


def test_the_old_model_dialect_is_upgraded_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.toml").write_text("[model]\ndim = 12\nsparse_lr = 0.2\nbottom = [16, 12]\ntop = [16, 1]\n")
    cfg, _ = load_loop_file(str(tmp_path / "old.toml"), [])
    assert isinstance(cfg, LoopFile) and cfg.model.dim == 12 and cfg.model.optimizer.lr == 0.2  # type: ignore[union-attr]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.dim -> embedding.dim, model.sparse_lr -> embedding.optimizer" in err
    (tmp_path / "mixed.toml").write_text("[model]\ndim = 12\n[embedding]\ncapacity = 100\n")
    with pytest.raises(ConfigError, match=r"model.dim and \[embedding\]: the config mixes the loop's old \[model\]"):
        load_loop_file(str(tmp_path / "mixed.toml"), [])


def test_settings_are_kept_across_starts(tmp_path: Path) -> None:
    cfg, _ = load_loop_file(None, [f"loop.work_dir={tmp_path}"])
    assert isinstance(cfg, LoopFile)
    keep_loop_settings(tmp_path, loop_settings(cfg), CONTINUE_MAY_CHANGE)
    assert (tmp_path / "settings.json").is_file()
    more, _ = load_loop_file(None, [f"loop.work_dir={tmp_path}", "loop.last=6", "server.replay_rows=10"])
    assert isinstance(more, LoopFile)
    keep_loop_settings(tmp_path, loop_settings(more), CONTINUE_MAY_CHANGE)  # how far it runs may change
    other, _ = load_loop_file(None, [f"loop.work_dir={tmp_path}", "loop.lr=0.5"])
    assert isinstance(other, LoopFile)
    with pytest.raises(ConfigError, match=r"loop\.lr.*continue it with its settings"):
        keep_loop_settings(tmp_path, loop_settings(other), CONTINUE_MAY_CHANGE)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LoopDataSection(), r"give exactly one of data.paths \(Parquet files\) and \[data.stream\]"),
        (lambda: LoopDataSection(paths="x", stream=StreamConfig()), "give exactly one of data.paths"),
        (lambda: LoopDataSection(paths="x"), "data.sparse must name the sparse columns of data.paths"),
        (lambda: ServerSection(replay_rows=-1), "server.replay_rows must be >= 0, got -1"),
    ],
)
def test_bad_sections_are_refused(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_log_table() -> None:
    records = [
        Record(0, "publish", "first model", {"candidate_auc": 0.71234, "serving_auc": 0.5}, "v1"),
        Record(1, "refuse", "worse than serving"),
    ]
    lines = log_table(records).splitlines()
    assert lines[0].split() == ["window", "action", "version", "cand", "AUC", "serving", "AUC", "reason"]
    assert lines[1].split()[:5] == ["0", "publish", "v1", "0.7123", "0.5000"] and lines[1].endswith("first model")
    assert lines[2].split()[:5] == ["1", "refuse", "-", "-", "-"]
    recall = log_table([Record(2, "publish", "ok", {"candidate_recall": 0.25}, "v2")]).splitlines()
    assert "cand recall" in recall[0] and "0.2500" in recall[1]
