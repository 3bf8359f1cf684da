"""`hugerec loop` as documented: runs a shrunk synthetic stream with the embedded server, prints the log table."""

from __future__ import annotations

from pathlib import Path

import pytest

from hugerec.cli import main
from hugerec.cli.loop_command import load_loop_file

SHRINK = [
    "data.stream.days=3",
    "data.stream.rows_per_day=3000",
    "data.stream.vocabulary=300",
    "data.stream.concept_drift_day=none",
    "data.stream.feature_shift_day=none",
    "embedding.capacity=3000",
    "server.replay_rows=300",
    "decisions.min_feedback=50",
]


@pytest.mark.slow
def test_loop_command_runs_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["loop", "configs/loop_synthetic.toml", *SHRINK]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["window", "action", "version"]
    actions = [line.split()[:3] for line in out[1:]]
    outcomes = [(w, a) for w, a, _ in actions if a in ("publish", "refuse", "skip")]
    assert [w for w, _ in outcomes] == ["0", "1"] and ("1", "publish") in outcomes
    # the same command again: everything is done, nothing is published twice
    assert main(["loop", "configs/loop_synthetic.toml", *SHRINK]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == out[1:]
    assert main(["loop", "configs/loop_synthetic.toml", "--log"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == out[1:]


@pytest.mark.slow
def test_loop_command_trains_the_configured_dcn_v2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """model.type = "dcn_v2": the loop trains, gates and publishes a DCN-v2 to its embedded server, which answers the
    simulated traffic with it."""
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["loop", "configs/loop_synthetic.toml", *SHRINK, "model.type=dcn_v2", "model.deep=[16]"]) == 0
    captured = capsys.readouterr()
    assert "model.bottom, model.top from the config file do not apply to model.type=dcn_v2" in captured.err
    records = [json.loads(line) for line in (tmp_path / "runs/loop/decisions.jsonl").read_text().splitlines()]
    trained = [r for r in records if r["action"] == "trained"]
    assert trained and all(r["extra"]["model"]["model"]["type"] == "dcn_v2" for r in trained)
    assert trained[0]["extra"]["model"]["model"]["deep"] == [16]
    published = [r for r in records if r["action"] == "publish"]
    assert published
    manifest = json.loads((tmp_path / "runs/loop/bundles" / published[0]["version"] / "manifest.json").read_text())
    assert "DCNv2" in json.dumps(manifest)


def test_loop_config_mistakes_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["loop", "configs/loop_synthetic.toml", "server.mode=cloud"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hugerec loop: error:") and "server.mode must be" in err and "\n" not in err
    assert main(["loop", "configs/loop_synthetic.toml", "gate.auc_margin=-1"]) == 2
    assert "auc_margin must be a finite number >= 0" in capsys.readouterr().err
    assert main(["loop", "configs/loop_synthetic.toml", "loop.keep_versions=-1"]) == 2
    assert "LoopConfig: keep_versions must be >= 0, got -1" in capsys.readouterr().err
    assert main(["loop", "data.paths=x/*.parquet"]) == 2
    assert "data.sparse must name the sparse columns" in capsys.readouterr().err
    assert main(["loop", "configs/loop_synthetic.toml", "data.paths=x/*.parquet"]) == 2
    assert "exactly one of data.paths" in capsys.readouterr().err
    cfg, _ = load_loop_file("configs/loop_synthetic.toml", [])
    assert cfg.data.stream is not None and cfg.data.stream.concept_drift_day == 4
    assert main(["loop", "configs/loop_synthetic.toml", "model.type=sasrec", "--print-config"]) == 2
    note, err = capsys.readouterr().err.strip().split("\n")  # the note: model.bottom, model.top left out
    assert note.startswith("note: model.bottom, model.top") and err.startswith("hugerec loop: error: model:")
    assert "model.type = 'sasrec' (sequential) cannot be trained by the loop" in err
    assert "['dlrm', 'dcn_v2', 'deepfm', 'wide_and_deep']" in err
    assert main(["loop", "configs/loop_synthetic.toml", "model.bottom=[32,4]"]) == 2
    assert "model.bottom must end with dim (8)" in capsys.readouterr().err


def test_loop_reads_the_model_dialect_of_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """[model] is the registry's (type, bottom, top); the tables are [embedding]'s. The old [model] (dim,
    capacity, sparse_lr beside bottom / top) still reads, with one line naming the new keys; mixed, it is refused."""
    from hugerec.embedding.optimizers import Adagrad
    from hugerec.models.model_config import DLRMConfig

    monkeypatch.chdir(tmp_path)
    cfg, _ = load_loop_file("configs/loop_synthetic.toml", [])
    assert cfg.model.model == DLRMConfig(bottom=(32, 8), top=(32, 1))
    assert (cfg.model.dim, cfg.model.capacity, cfg.model.optimizer) == (8, 20000, Adagrad(lr=0.1))
    old = tmp_path / "old.toml"
    old.write_text("[model]\ndim = 4\ncapacity = 100\nbottom = [8, 4]\ntop = [8, 1]\nsparse_lr = 0.2\n")
    capsys.readouterr()
    back, _ = load_loop_file(str(old), [])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.sparse_lr -> embedding.optimizer" in err and "model.capacity -> embedding.capacity" in err
    assert back.model.model == DLRMConfig(bottom=(8, 4), top=(8, 1))
    assert (back.model.dim, back.model.capacity, back.model.optimizer) == (4, 100, Adagrad(lr=0.2))
    assert main(["loop", str(old), "model.type=dlrm", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "model.dim and model.type: the config mixes the loop's old [model]" in err and err.count("\n") == 1


def test_serve_takes_a_request_log_and_remote_needs_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hugerec.cli import _parser

    assert _parser().parse_args(["serve", "b", "--request-log", "logs"]).request_log == "logs"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    argv = ["loop", "configs/loop_synthetic.toml", "server.mode=remote", "server.url=http://127.0.0.1:9"]
    assert main([*argv, "server.token_env=NO_SUCH_TOKEN_VAR", "data.stream.rows_per_day=500"]) == 2
    assert "the environment variable NO_SUCH_TOKEN_VAR is not set" in capsys.readouterr().err


def test_the_embedded_server_shows_the_loops_decisions_with_the_operators_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from contextlib import ExitStack

    import httpx

    from hugerec.cli.loop_command import embedded_server
    from hugerec.continuous.decision_log import DecisionLog, Record

    log = DecisionLog(tmp_path / "decisions.jsonl")
    log.append(Record(0, "skip", "window 0 had no rows"))
    token = "operator-token-" + "o" * 16
    monkeypatch.setenv("LOOP_TOKEN_FOR_TEST", token)
    with ExitStack() as stack:
        url, used = embedded_server(tmp_path, log.path, 0, "LOOP_TOKEN_FOR_TEST", "i" * 16, stack)
        assert used == token
        details = httpx.get(f"{url}/status/details", headers={"Authorization": f"Bearer {token}"}).json()
        assert details["loop"]["log"] == str(log.path)
        assert [(r["window"], r["action"]) for r in details["loop"]["records"]] == [(0, "skip")]
    err = capsys.readouterr().err
    assert f"status page {url}/ (details with the token in $LOOP_TOKEN_FOR_TEST)" in err and token not in err
    monkeypatch.setenv("LOOP_TOKEN_FOR_TEST", "short")
    with ExitStack() as stack, pytest.raises(ValueError, match=r"\$LOOP_TOKEN_FOR_TEST: the admin token must have at least 16"):
        embedded_server(tmp_path, log.path, 0, "LOOP_TOKEN_FOR_TEST", "i" * 16, stack)
    monkeypatch.delenv("LOOP_TOKEN_FOR_TEST")
    with ExitStack() as stack:
        url, used = embedded_server(tmp_path, log.path, 0, "LOOP_TOKEN_FOR_TEST", "i" * 16, stack)
        assert len(used) >= 16 and httpx.get(f"{url}/status/details", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert "set $LOOP_TOKEN_FOR_TEST before `hugerec loop` to open its details" in capsys.readouterr().err


def test_a_loop_continued_with_a_changed_config_refuses_naming_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first start keeps the settings in work_dir/settings.json; a later start with another lr or model is
    refused in one line naming the keys, before anything runs; a later last window, a longer stream, another
    retention or replay goes on."""
    monkeypatch.chdir(tmp_path)
    small = [*SHRINK, "server.mode=offline", "loop.epochs=1", "data.stream.rows_per_day=1000"]
    assert main(["loop", "configs/loop_synthetic.toml", *small, "loop.last=1"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    log = (tmp_path / "runs/loop/decisions.jsonl").read_text()
    for change, named in (
        (["loop.lr=0.02"], "loop.lr: 0.01 -> 0.02"),
        (["model.type=dcn_v2"], "model.type"),
        (["embedding.optimizer={type='sgd',lr=0.05}"], "embedding.optimizer.type: 'adagrad' -> 'sgd'"),
    ):
        assert main(["loop", "configs/loop_synthetic.toml", *small, *change]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after a note on model keys left out
        assert err.startswith("hugerec loop: error: the config changed since the run in runs/loop started (")
        assert named in err and "give another loop.work_dir" in err, err
        assert (tmp_path / "runs/loop/decisions.jsonl").read_text() == log  # nothing ran
    allowed = ["loop.last=2", "data.stream.days=4", "loop.keep_versions=3", "server.replay_rows=10"]
    assert main(["loop", "configs/loop_synthetic.toml", *small, *allowed]) == 0, capsys.readouterr().err
    assert '"window": 1' in (tmp_path / "runs/loop/decisions.jsonl").read_text()
