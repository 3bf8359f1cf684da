"""`hugerec loop` with a retrieval model: configs/loop_two_tower.toml (shrunk) runs with its embedded server, publishes
pipeline bundles with a fresh index as canaries that the server answers with, continues after a restart; the keys
of the other loop are refused in one line naming them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hugerec.cli import main
from hugerec.cli.loop_command import load_loop_file
from hugerec.cli.retrieval_loop_command import RetrievalLoopFile
from hugerec.index.vector_index import load_index
from hugerec.models.mf import MFConfig

SHRINK = [
    "data.interactions.num_users=400",
    "data.interactions.num_items=300",
    "data.drift.days=4",
    "data.drift.events=[5,10]",
    "gate.min_rows=20",
    "server.replay_users=100",
]


def _records(work: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (work / "decisions.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_loop_command_trains_a_two_tower_and_serves_its_pipelines_as_canaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["loop", "configs/loop_two_tower.toml", *SHRINK, "loop.last=2"]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    header, *rows = captured.out.splitlines()
    assert header.split()[:5] == ["window", "action", "version", "cand", "recall"]
    work = tmp_path / "runs/loop_two_tower"
    records = _records(work)
    assert [(r["window"], r["action"], r["version"]) for r in records] == [
        (0, "trained", None), (0, "publish", "w0"), (1, "trained", None), (1, "publish", "w1")
    ]
    assert "stable" in str(records[1]["reason"]) and "canary at share 0.5" in str(records[3]["reason"])
    # the config's warm start: Adagrad sums reset, half the day's event count replayed from the earlier days
    extra = records[2]["extra"]
    assert isinstance(extra, dict) and extra["replayed"] == round(0.5 * (extra["events"] - extra["replayed"])) > 0
    assert records[2]["reason"] == f"warm start from w0 (sparse optimizer state reset) with {extra['replayed']} replayed events of windows 0..0"
    for version in ("w0", "w1"):  # each pipeline bundle holds an index of its own
        manifest = json.loads((work / "bundles" / version / "manifest.json").read_text())
        assert manifest["kind"] == "pipeline"
        index = load_index(work / "bundles" / version / "retrieval" / "index")
        assert len(index) == 300 and index.config.build_threads == 1  # the config's one-thread build: the same graph every run
    # the embedded server answered window 1's users with w0 alone, window 2's with the stable w0 and the canary w1
    traffic = [line for line in captured.err.splitlines() if "traffic" in line]
    assert len(traffic) == 2 and "w0 answered 100" in traffic[0]
    assert "w0 answered" in traffic[1] and "w1 answered" in traffic[1] and "failed" not in traffic[1]
    # run on: the restarted server gets w0 and the canary w1 back, window 2 decides on the canary and publishes w2
    assert main(["loop", "configs/loop_two_tower.toml", *SHRINK]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "restored from the decision log: stable w0, canary w1 at share 0.5" in err
    later = [(r["window"], r["action"], r["version"]) for r in _records(work)[4:]]
    assert later[:2] == [(1, "restore", "w0"), (1, "restore", "w1")]
    decided = [a for w, a, v in later if w == 2 and a in ("promote", "rollback")]
    assert len(decided) == 1 and later[-1] == (2, "publish", "w2")
    assert main(["loop", "configs/loop_two_tower.toml", *SHRINK, "--log"]) == 0
    assert capsys.readouterr().out.splitlines()[1:][: len(rows)] == rows


def test_the_warm_start_keys_reach_the_loop() -> None:
    """loop.warm_start_epochs (a fraction allowed) and loop.warm_start_reset_optimizer: read from the file, overridden
    on the command line, handed to RetrievalLoopConfig; unset, a warm start trains `loop.epochs` and keeps the state."""
    from hugerec.cli.retrieval_loop_command import loop_config

    cfg, _ = load_loop_file(
        "configs/loop_two_tower.toml", ["loop.warm_start_epochs=1.5", "loop.warm_start_reset_optimizer=false", "loop.warm_start_replay=0.5"]
    )
    assert isinstance(cfg, RetrievalLoopFile)
    config = loop_config(cfg)
    assert (config.epochs, config.warm_start_epochs, config.warm_start_reset_optimizer, config.warm_start_replay) == (2, 1.5, False, 0.5)
    default = RetrievalLoopFile()
    assert (default.loop.warm_start_epochs, default.loop.warm_start_reset_optimizer, default.loop.warm_start_replay) == (None, False, 0.0)
    assert loop_config(default).warm_start_replay == 0.0


def test_loop_command_trains_a_matrix_factorisation_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["loop", "configs/loop_two_tower.toml", *SHRINK, "loop.last=2", "server.mode=offline", "model.type=mf", "model.dim=16"]
    cfg, _ = load_loop_file(argv[1], argv[2:])
    assert isinstance(cfg, RetrievalLoopFile) and cfg.model == MFConfig(dim=16)
    assert main(argv) == 0, capsys.readouterr().err
    records = _records(tmp_path / "runs/loop_two_tower")
    assert [(r["window"], r["action"]) for r in records] == [(0, "trained"), (0, "publish"), (1, "trained"), (1, "publish")]
    assert (tmp_path / "runs/loop_two_tower/bundles/w1/manifest.json").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["configs/loop_two_tower.toml", "gate.auc_margin=0.01"], "gate.auc_margin: the ranking loop's key, which model.type = 'two_tower' does not read"),
        (["configs/loop_two_tower.toml", "embedding.dim=8"], "embedding.dim: the ranking loop's key"),
        (["configs/loop_two_tower.toml", "loop.holdout_share=0.2"], "loop.holdout_share: the ranking loop's key"),
        (["configs/loop_two_tower.toml", "server.replay_rows=10"], "server.replay_rows: the ranking loop's key"),
        (["configs/loop_synthetic.toml", "model.type=two_tower"], "data.stream: the ranking loop's key, which model.type = 'two_tower'"),
        (["configs/loop_synthetic.toml", "loop.k=10"], "loop.k: the retrieval loop's (model.type = two_tower, mf) key, which model.type = 'dlrm' does not read"),
        (["configs/loop_synthetic.toml", "index.kind=exact"], "index: the retrieval loop's"),
        (["configs/loop_two_tower.toml", "gate.calibration_low=0.5"], "gate.calibration_low: the ranking loop's key"),
        (["configs/loop_synthetic.toml", "data.drift.days=3"], "data.drift: the retrieval loop's"),
        (["configs/loop_two_tower.toml", "model.max_history=10"], "model.max_history = 10: the loop's two-tower embeds user ids only"),
        (["configs/loop_two_tower.toml", "loop.last=9"], "loop.last = 9: need loop.first (0) < loop.last <= data.drift.days - 1 (6)"),
        (["configs/loop_two_tower.toml", "gate.user_share=1.5"], "gate.user_share must be in (0, 1], got 1.5"),
        (["configs/loop_two_tower.toml", "gate.user_share=0"], "gate.user_share must be in (0, 1], got 0"),
        (["configs/loop_synthetic.toml", "gate.user_share=0.5"], "gate.user_share: the retrieval loop's"),
        (["configs/loop_two_tower.toml", "loop.warm_start_epochs=0"], "loop.warm_start_epochs must be a number > 0, got 0"),
        (["configs/loop_two_tower.toml", "loop.warm_start_epochs=-1.5"], "loop.warm_start_epochs must be a number > 0, got -1.5"),
        (["configs/loop_two_tower.toml", "loop.warm_start_epochs=nan"], "loop.warm_start_epochs must be a number > 0, got nan"),
        (["configs/loop_two_tower.toml", "loop.warm_start_epochs='two'"], "loop.warm_start_epochs: expected a number, got 'two'"),
        (["configs/loop_two_tower.toml", "loop.warm_start_reset_optimizer=2"], "loop.warm_start_reset_optimizer: expected true or false, got 2"),
        (["configs/loop_synthetic.toml", "loop.warm_start_epochs=1"], "loop.warm_start_epochs: the retrieval loop's"),
        (["configs/loop_two_tower.toml", "loop.warm_start_replay=-0.5"], "loop.warm_start_replay must be a number >= 0, got -0.5"),
        (["configs/loop_two_tower.toml", "loop.warm_start_replay=nan"], "loop.warm_start_replay must be a number >= 0, got nan"),
        (["configs/loop_two_tower.toml", "loop.warm_start_replay=inf"], "loop.warm_start_replay must be a number >= 0, got inf"),
        (["configs/loop_two_tower.toml", "loop.warm_start_replay='half'"], "loop.warm_start_replay: expected a number, got 'half'"),
        (["configs/loop_two_tower.toml", "loop.warm_start_replay=true"], "loop.warm_start_replay: expected a number, got True"),
        (["configs/loop_synthetic.toml", "loop.warm_start_replay=1"], "loop.warm_start_replay: the retrieval loop's"),
    ],
)
def test_a_key_of_the_other_loop_is_refused_in_one_line(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["loop", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("hugerec loop: error: ") and message in err, err
    assert not (tmp_path / "runs").exists()


def test_a_retrieval_loop_continued_with_a_changed_config_refuses_naming_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the ranking loop: another model dimension or number of days (the drifting stream's days depend on it) in
    the same work_dir is refused in one line naming the keys; a later last window or another retention goes on."""
    monkeypatch.chdir(tmp_path)
    small = [*SHRINK, "data.interactions.num_users=200", "data.interactions.num_items=100", "server.mode=offline", "loop.epochs=1"]
    assert main(["loop", "configs/loop_two_tower.toml", *small, "loop.last=1"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    for change, named in (
        (["model.dim=16", "model.embedding_dim=16"], "model.dim: 32 -> 16, model.embedding_dim: 32 -> 16"),
        (["data.drift.days=5"], "data.drift.days: 4 -> 5"),
        (["model.type=mf"], "model.type"),
        (["loop.warm_start_epochs=1.5"], "loop.warm_start_epochs: 1.0 -> 1.5"),
        (["loop.warm_start_reset_optimizer=false"], "loop.warm_start_reset_optimizer: True -> False"),
        (["loop.warm_start_replay=0.25"], "loop.warm_start_replay: 0.5 -> 0.25"),
    ):
        assert main(["loop", "configs/loop_two_tower.toml", *small, *change]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after a note on model keys left out
        assert err.startswith("hugerec loop: error: the config changed since the run in runs/loop_two_tower started (")
        assert named in err, err
    assert main(["loop", "configs/loop_two_tower.toml", *small, "loop.last=2", "loop.keep_versions=0"]) == 0
    assert [(r["window"], r["action"]) for r in _records(tmp_path / "runs/loop_two_tower")][-2:] == [(1, "publish"), (1, "unload")]


LOG_CONFIG = """
[loop]
work_dir = "runs/log"
batch_size = 256
epochs = 2
k = 20
ann_k = 50

[preprocess]
input = "events.csv"
format = "csv"
header = true
columns = [
  { name = "who", type = "int", role = "user" },
  { name = "what", type = "int", role = "item" },
  { name = "when", type = "timestamp" },
]

[windows]
unit = "hour"
size = 6

[model]
type = "two_tower"
dim = 16
embedding_dim = 16
user_layers = []
max_history = 0
recent = []

[gate]
min_rows = 20

[index]
kind = "exact"
"""

EPOCH = 1_700_000_000 // 21_600 * 21_600  # the start of a 6-hour window


def _write_log(folder: Path, days: tuple[int, ...] = (0, 1, 2, 3)) -> tuple[np.ndarray, np.ndarray]:
    """A drifting interaction stream's days as a csv log of raw ids (users 1000 + 7u, items 50 + 3i), day d's events
    in the 6-hour window `days[d]` (a gap between two entries: empty windows); returns the raw users and items."""
    from hugerec.data.synthetic_interactions import DriftConfig, InteractionConfig, generate_interaction_days

    stream = generate_interaction_days(InteractionConfig(num_users=200, num_items=120, seed=3), DriftConfig(days=len(days), events=(4, 8)))
    rows = ["who,what,when"]
    for d, window in enumerate(days):
        f = stream.day(d).frame
        for u, i, t in zip(f["user"].to_list(), f["item"].to_list(), f["timestamp"].to_list(), strict=True):
            rows.append(f"{1000 + 7 * u},{50 + 3 * i},{EPOCH + window * 21_600 + (t % 86_400) // 4}")
    (folder / "events.csv").write_text("\n".join(rows) + "\n")
    (folder / "log.toml").write_text(LOG_CONFIG)
    f = pl.read_csv(folder / "events.csv")
    return np.sort(f["who"].unique().to_numpy()), np.sort(f["what"].unique().to_numpy())


def test_the_retrieval_loop_runs_over_an_interaction_log_split_into_windows_by_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """[preprocess] declares the log as `hugerec train` reads it; [windows] splits it by the timestamp role, from the
    window of its first event; an empty window between two is skipped with a record; the pipelines take the log's
    dense ids, whose raw ids users.parquet / items.parquet give; a log whose ids changed cannot continue."""
    users, items = _write_log(tmp_path, days=(0, 1, 3, 4))  # window 2 holds no events
    monkeypatch.chdir(tmp_path)
    assert main(["loop", "log.toml", "server.mode=offline"]) == 0, capsys.readouterr().err
    records = _records(tmp_path / "runs/log")
    assert [(r["window"], r["action"]) for r in records] == [
        (0, "trained"), (0, "publish"), (1, "trained"), (1, "refuse"), (2, "skip"), (3, "trained"), (3, "publish")
    ]
    assert "window 2 has 0 users with events" in str(records[3]["reason"]) and records[4]["reason"] == "window 2 has no events"
    assert records[5]["reason"] == "warm start from w0"
    assert pl.read_parquet(tmp_path / "runs/log/users.parquet")["raw"].to_numpy().tolist() == users.tolist()
    assert pl.read_parquet(tmp_path / "runs/log/items.parquet")["raw"].to_numpy().tolist() == items.tolist()
    assert len(load_index(tmp_path / "runs/log/bundles/w3/retrieval/index")) == len(items)
    settings = json.loads((tmp_path / "runs/log/settings.json").read_text())
    assert settings["log.users"] == len(users) and settings["log.items"] == len(items) and settings["windows.size"] == 6
    # the log grows by one user: other dense ids, other table sizes: refused, naming the keys
    with open(tmp_path / "events.csv", "a") as f:
        f.write(f"5,{items[0]},{EPOCH + 5 * 21_600}\n")
    assert main(["loop", "log.toml", "server.mode=offline", "loop.last=5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the config changed since the run in runs/log started" in err and f"log.users: {len(users)} -> {len(users) + 1}" in err
    assert "log.ids_sha256" in err


@pytest.mark.parametrize(
    ("argv", "edit", "message"),
    [
        ([], ("4,", "4,x"), "bad input at"),
        ([], ("{ name = \"who\", type = \"int\", role = \"user\" }", "{ name = \"who\", type = \"int\", role = \"none\" }"),
         "preprocess.columns: the retrieval loop needs a column with role \"user\"; the declared roles are"),
        (["loop.first=2", "loop.last=3"], None, "loop.first = 2: window 2 of preprocess.input"),
        (["loop.last=2"], None, "loop.last = 2: window 2 of preprocess.input"),
        (["loop.last=9"], None, "loop.last = 9: need 0 <= loop.first (0) < loop.last <= 4, the last window of preprocess.input"),
        (["preprocess.split=time"], None, "preprocess.split: the retrieval loop reads the log's layout"),
        (["data.drift.days=3"], None, "data and preprocess: the retrieval loop reads a synthetic stream"),
        (["windows.time_column=ts"], None, "windows.time_column: the ranking loop's key"),
        (["preprocess.input=nothing.csv"], None, "preprocess.input"),
    ],
)
def test_bad_interaction_logs_are_refused_in_one_line(
    argv: list[str], edit: tuple[str, str] | None, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    _write_log(tmp_path, days=(0, 1, 3, 4))
    if edit is not None:
        target = tmp_path / ("events.csv" if edit[0] == "4," else "log.toml")
        text = target.read_text()
        if edit[0] == "4,":  # the timestamp of the log's 4th event cannot be parsed
            lines = text.splitlines()
            who, what, _ = lines[4].split(",")
            lines[4] = f"{who},{what},not-a-time"
            target.write_text("\n".join(lines) + "\n")
        else:
            target.write_text(text.replace(*edit))
    monkeypatch.chdir(tmp_path)
    assert main(["loop", "log.toml", "server.mode=offline", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("hugerec loop: error: ") and message in err, err
    if edit is not None and edit[0] == "4,":
        assert "events.csv, line 5, column 'when'" in err and "not-a-time" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.shared_data("movielens/ml-100k/u.data.gz")
def test_configs_loop_movielens_runs_over_the_movielens_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shared_data: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["loop", str(Path(__file__).resolve().parents[2] / "configs/loop_movielens.toml"), "loop.last=2"]) == 0
    records = _records(tmp_path / "runs/loop_movielens")
    assert [(r["window"], r["action"]) for r in records if r["action"] != "unload"][:2] == [(0, "trained"), (0, "publish")]
    assert len(pl.read_parquet(tmp_path / "runs/loop_movielens/users.parquet")) == 943
    assert "preprocess.input" in json.dumps(json.loads((tmp_path / "runs/loop_movielens/settings.json").read_text()))


def test_a_loop_started_before_a_setting_existed_continues_while_it_keeps_its_default(tmp_path: Path) -> None:
    """settings.json of a loop started by an older hugerec lacks the keys added since (gate.user_share,
    index.build_threads, loop.warm_start_reset_optimizer, loop.warm_start_replay): the loop continues with them at their defaults, the
    old behaviour, and a start that changes one is refused naming it."""
    from hugerec.cli.config_file import ConfigError
    from hugerec.cli.loop_command import keep_loop_settings
    from hugerec.cli.retrieval_loop_command import CONTINUE_MAY_CHANGE, retrieval_loop_settings
    from hugerec.training.run_settings import flat_settings

    def settings(*overrides: str) -> dict[str, object]:
        config = Path(__file__).resolve().parents[2] / "configs" / "loop_two_tower.toml"
        at_defaults = ["gate.user_share=1", "index.build_threads=0", "loop.warm_start_replay=0", "loop.warm_start_reset_optimizer=false"]
        cfg, _ = load_loop_file(str(config), [f"loop.work_dir={tmp_path}", *at_defaults, *overrides])
        assert isinstance(cfg, RetrievalLoopFile)
        return retrieval_loop_settings(cfg)

    defaults = retrieval_loop_settings(RetrievalLoopFile())
    older = {k: v for k, v in flat_settings(settings()).items() if k not in CONTINUE_MAY_CHANGE}
    for added in ("gate.user_share", "index.build_threads", "loop.warm_start_reset_optimizer", "loop.warm_start_replay"):
        del older[added]
    (tmp_path / "settings.json").write_text(json.dumps(older, default=str))
    keep_loop_settings(tmp_path, settings(), CONTINUE_MAY_CHANGE, defaults)
    with pytest.raises(ConfigError, match=r"gate\.user_share: 1\.0 -> 0\.5"):
        keep_loop_settings(tmp_path, settings("gate.user_share=0.5"), CONTINUE_MAY_CHANGE, defaults)
    with pytest.raises(ConfigError, match=r"loop\.warm_start_replay: 0\.0 -> 0\.5"):
        keep_loop_settings(tmp_path, settings("loop.warm_start_replay=0.5"), CONTINUE_MAY_CHANGE, defaults)
