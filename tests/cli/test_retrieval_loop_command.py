"""`hugerec loop` with a retrieval model: configs/loop_two_tower.toml (shrunk) runs with its embedded server, publishes
pipeline bundles with a fresh index as canaries that the server answers with, continues after a restart; the keys
of the other loop are refused in one line naming them."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert records[2]["reason"] == "warm start from w0"
    for version in ("w0", "w1"):  # each pipeline bundle holds an index of its own
        manifest = json.loads((work / "bundles" / version / "manifest.json").read_text())
        assert manifest["kind"] == "pipeline"
        assert len(load_index(work / "bundles" / version / "retrieval" / "index")) == 300
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
    ):
        assert main(["loop", "configs/loop_two_tower.toml", *small, *change]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after a note on model keys left out
        assert err.startswith("hugerec loop: error: the config changed since the run in runs/loop_two_tower started (")
        assert named in err, err
    assert main(["loop", "configs/loop_two_tower.toml", *small, "loop.last=2", "loop.keep_versions=0"]) == 0
    assert [(r["window"], r["action"]) for r in _records(tmp_path / "runs/loop_two_tower")][-2:] == [(1, "publish"), (1, "unload")]
