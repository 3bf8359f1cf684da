"""The `hugerec` command as a user meets it: exit codes, one-line errors, help, the quickstart's report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hugerec.cli import COMMANDS, main

from .conftest import TINY


def test_quickstart_reports_auc_next_to_the_oracle(
    tiny_run: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quickstart", *TINY]) == 0
    out = capsys.readouterr().out
    assert "eval AUC" in out and "oracle AUC" in out and "of the oracle's lift" in out
    for name in ("model.pt", "metrics.jsonl", "curves.png"):
        assert (tmp_path / "runs" / "quickstart" / name).is_file()
    assert main(["evaluate", *TINY]) == 0
    assert '"auc": 0.' in capsys.readouterr().out
    assert main(["predict", *TINY, "predict.out=scores.parquet"]) == 0
    assert "-> scores.parquet" in capsys.readouterr().out
    assert main(["export", *TINY]) == 0
    bundle = tmp_path / "runs" / "quickstart" / "bundle"
    assert f"bundle -> {bundle.relative_to(tmp_path)}" in capsys.readouterr().out
    assert (bundle / "manifest.json").is_file() and (bundle / "workflow").is_dir()


def test_serve_refuses_what_is_not_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"hugerec serve: error: {tmp_path} is not a bundle (no manifest.json); make one with `hugerec export`"


@pytest.mark.parametrize(
    ("manifest", "flags", "message"),
    [
        ({"kind": "gbm", "format": 1}, ["--updates-dir", "u"], "--updates-dir applies to model bundles and pipeline bundles with a ranker only; {b} is a gbm bundle"),
        ({"kind": "next_items", "format": 1}, ["--max-delay-ms", "2"], "--max-delay-ms applies to model and gbm bundles only; {b} is a next_items bundle"),
        (
            {"kind": "pipeline", "format": 1, "parts": ["features", "retrieval"]},
            ["--state-dir", "s"],
            "--state-dir applies to model bundles and pipeline bundles with a ranker only; {b} is a pipeline bundle without a ranker",
        ),
    ],
)
def test_serve_refuses_a_flag_no_bundle_given_reads(
    manifest: dict[str, object], flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """serving.load refuses an option of another bundle kind; `hugerec serve` did ignore the flag. Refused before
    any part of the bundle is read (here the folder holds only its manifest)."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert main(["serve", str(bundle), *flags]) == 2
    assert capsys.readouterr().err == "hugerec serve: error: " + message.format(b=bundle) + "\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "train.lrr=0.1"], "hugerec train: error: unknown key 'train.lrr'; did you mean 'train.lr'?"),
        (["train", "train.epochs=x"], "hugerec train: error: train.epochs: expected an integer, got 'x'"),
        (["train", "missing.toml"], "hugerec train: error: config file not found: missing.toml"),
        (["train", "a.toml", "b.toml"], "hugerec train: error: expected one config file"),
        (["train", "data.train=nowhere", "data.schema=nowhere.json"], "hugerec train: error: data.schema: no schema"),
        (["evaluate"], "hugerec evaluate: error: no model at runs/quickstart/model.pt"),
        (["preprocess", "preprocess.input=nowhere"], "hugerec preprocess: error: preprocess.input: Dataset: no input files match"),
        (["train", "train.lr"], "hugerec train: error: 'train.lr' is neither a config file nor a KEY=VALUE override"),
        (
            ["train", "train.early_stopping.metric=accuracy"],
            "hugerec train: error: train.early_stopping: metric: unknown metric 'accuracy'; expected one of",
        ),
        (
            ["train", "train.early_stopping.patiense=3"],
            "hugerec train: error: unknown key 'train.early_stopping.patiense'; "
            "did you mean 'train.early_stopping.patience'?",
        ),
        (["train", "train.early_stopping.patience=0"], "hugerec train: error: train.early_stopping: patience: must be"),
        (["train", "train.early_stopping.min_delta=-1"], "hugerec train: error: train.early_stopping: min_delta: must"),
        (["train", "train.schedule.decay_epochs=-1"], "hugerec train: error: train.schedule: Schedule: decay_epochs"),
        (["train", "data.batch_size=big"], 'hugerec train: error: data: batch_size must be an int >= 1 or "auto"'),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message)
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HUGEREC_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown key"):
        main(["train", "train.lrr=1"])


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"] if command is None else [command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "KEY=VALUE" in out
    assert (command or "quickstart") in out


def test_print_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--print-config", "train.lr=0.5"]) == 0
    assert '"lr": 0.5' in capsys.readouterr().out


def test_print_config_lists_the_early_stopping_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--print-config", "train.early_stopping.metric=logloss"]) == 0
    train = json.loads(capsys.readouterr().out)["train"]
    assert train["early_stopping"] == {"metric": "logloss", "patience": 2, "min_delta": 0.001, "restore_best": False}
    assert train["schedule"] is None  # the model family's: for ranking a linear decay over the first epoch
    assert main(["train", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["early_stopping"]["metric"] is None  # the family's: auc, recall@10


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_help_says_the_best_model_is_the_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "best.pt" in capsys.readouterr().out


def test_python_dash_m_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hugerec", "train", "train.lr=x"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "hugerec train: error: train.lr: expected a number, got 'x'"


def _criteo_rows(n: int, label: str = "0") -> str:
    row = "\t".join([label, *[str(i) for i in range(13)], *(["abcdef01"] * 26)])
    return "".join(row + "\n" for _ in range(n))


def test_preprocess_input_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#20 defects 6 and 7: empty input, labels other than 0/1, a folder without data, each one line naming it."""
    import gzip

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "labels.tsv").write_text(_criteo_rows(5) + _criteo_rows(1, "2") + _criteo_rows(5, "1"))
    (tmp_path / "cut.gz").write_bytes(gzip.compress(_criteo_rows(5000).encode())[:300])
    (tmp_path / "folder").mkdir()
    expected = {
        "empty.tsv": "no rows to learn from in 'empty.tsv'",
        "labels.tsv": "labels.tsv, line 6, column 'label': a label must be 0 or 1 (value '2')",
        "cut.gz": "cut.gz: truncated or damaged gzip file",
        "folder": "'folder' is a folder with no input files",
    }
    for name, message in expected.items():
        argv = ["preprocess", f"preprocess.input={name}", "preprocess.format=criteo", f"preprocess.out=out_{name}"]
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err


def test_preprocess_on_error_skip_counts_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labels.tsv").write_text(_criteo_rows(8) + _criteo_rows(2, "-1") + _criteo_rows(8, "1"))
    argv = ["preprocess", "preprocess.input=labels.tsv", "preprocess.format=criteo", "preprocess.on_error=skip"]
    assert main([*argv, "preprocess.out=out"]) == 0
    out = capsys.readouterr().out
    assert "2 of 18 rows skipped as bad input" in out and "labels.tsv, line 9, column 'label'" in out
    assert main([*argv, "preprocess.on_error=ignore"]) == 2
    assert "preprocess.on_error" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["evaluate", "export", "predict"])
def test_a_damaged_model_file_is_one_line_naming_it(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """#20 defect 8: a damaged model.pt gave a 22-line traceback."""
    monkeypatch.chdir(tmp_path)
    model = Path("runs/quickstart/model.pt")
    model.parent.mkdir(parents=True)
    model.write_bytes(b"PK\x03\x04" + bytes(200))
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hugerec {command}: error: load_model: {model} is damaged")
    assert err.count("\n") == 1 and "Traceback" not in err
