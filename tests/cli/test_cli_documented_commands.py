"""Every `hugerec` command the README, `--help` and the configs' headers show is fed to the CLI as written.

Each documented command is checked from a directory that is not the repository root (config paths
such as `configs/quickstart.toml` must still resolve): its config and overrides must load with
`--print-config`; `serve` commands must parse. The README's model switch and the Criteo sample's
chain also run for real, shrunk with extra size overrides appended after the documented words.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from hugerec.cli import COMMANDS, SCHEMA_HELP, SERVE_HELP, _parser, main
from hugerec.cli.pipeline_commands import PIPELINE_HELP
from hugerec.cli.up_command import UP_HELP

ROOT = Path(__file__).resolve().parents[2]


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `hugerec`) for each documented `hugerec ...` command, `&&` chains split."""
    found: list[tuple[str, str]] = []
    readme = (ROOT / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S):
        found += [("README.md", line) for line in block.splitlines()]
    helps = [details for _, details in COMMANDS.values()] + [SERVE_HELP, SCHEMA_HELP, PIPELINE_HELP, UP_HELP]
    for text in helps:
        found += [("--help", m) for m in re.findall(r"example: (.*)", text)]
    for config in sorted((ROOT / "configs").glob("*.toml")):
        found += [
            (config.name, m) for m in re.findall(r"^#\s+(hugerec [a-z]+(?:\s.*)?)$", config.read_text(), flags=re.M)
        ]
    out = []
    for where, line in found:
        for part in line.split("&&"):
            words = shlex.split(part.strip())
            if words[:1] == ["hugerec"]:
                out.append((where, words[1:]))
    return out


COMMANDS_AS_WRITTEN = documented_commands()


def samples_read(argv: list[str]) -> tuple[str, ...]:
    """The real data samples a documented command reads: `$HUGEREC_DATA/...` paths in its words and its config."""
    text = " ".join(argv)
    config = next((ROOT / a for a in argv if a.endswith(".toml") and (ROOT / a).is_file()), None)
    if config is not None:
        text += "\n" + config.read_text()
    return tuple(sorted(set(re.findall(r"\$\{?HUGEREC_DATA\}?/([^\s\"']+)", text))))


def as_param(where: str, argv: list[str]) -> object:
    samples = samples_read(argv)
    return pytest.param(where, argv, marks=[pytest.mark.shared_data(*samples)] if samples else [], id=" ".join(argv))


def test_the_docs_show_commands() -> None:
    wheres = {w for w, _ in COMMANDS_AS_WRITTEN}
    assert {"README.md", "--help", "quickstart.toml", "criteo_sample.toml"} <= wheres
    assert all(argv for _, argv in COMMANDS_AS_WRITTEN)


def readme_config() -> str:
    """The edited `my_data.toml` that the README's own-data commands run on: the own-data tutorial's
    `toml title="my_data.toml"` block (docs/tutorials/own-data.md, linked from the README's tour)."""
    page = (ROOT / "docs" / "tutorials" / "own-data.md").read_text()
    start = page.index('```toml title="my_data.toml"\n') + len('```toml title="my_data.toml"\n')
    return page[start : page.index("```\n", start)]


@pytest.mark.parametrize(("where", "argv"), [as_param(w, a) for w, a in COMMANDS_AS_WRITTEN])
def test_documented_command_loads_from_another_directory(
    where: str,
    argv: list[str],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    click_log: Callable[[Path], object],
) -> None:
    """A command whose config reads the real samples runs with them (and skips without them, as in a fresh clone)."""
    if request.node.get_closest_marker("shared_data") is not None:
        request.getfixturevalue("shared_data")
    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.csv")  # the README's own-data example: its file and its edited config
    (tmp_path / "my_data.toml").write_text(readme_config())
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\n1,10,978300760\n1,11,978300761\n")  # `hugerec up`'s log
    if argv[0] == "serve":
        args = _parser().parse_args(argv)
        assert args.bundles, f"{where}: hugerec {' '.join(argv)}"
        return
    if argv[0] == "schema":  # reads a file and writes TOML: run it for real
        assert main(argv) == 0, f"{where}: hugerec {' '.join(argv)}: {capsys.readouterr().err}"
        return
    if argv[:2] == ["pipeline", "query"]:  # needs a built bundle: parsed here, run in tests/cli/test_pipeline_commands.py
        assert _parser().parse_args(argv).bundle, f"{where}: hugerec {' '.join(argv)}"
        return
    assert main([*argv, "--print-config"]) == 0, f"{where}: hugerec {' '.join(argv)}: {capsys.readouterr().err}"


def test_readme_own_data_config_runs_as_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    click_log: Callable[[Path], object],
) -> None:
    """README's `my_data.toml` on a click log like the one it describes: preprocess, a short train, and
    evaluate on the raw file, as the README's commands do."""
    import json

    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.csv")
    (tmp_path / "my_data.toml").write_text(readme_config())
    assert main(["preprocess", "my_data.toml"]) == 0, capsys.readouterr().err
    assert main(["train", "my_data.toml", *SHRINK, "train.plot=false"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["evaluate", "my_data.toml", "data.eval=clicks.csv"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["count"] == 400


SHRINK = ["train.progress=false", "train.tensorboard=false", "train.max_steps=4", "train.log_every=2"]


def test_readme_model_switch_trains(
    prepared: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hugerec train configs/quickstart.toml model.type=dcn_v2` (README): the file's DLRM fields give way."""
    monkeypatch.chdir(prepared)
    assert main(["train", "configs/quickstart.toml", "model.type=dcn_v2", *SHRINK, "data.batch_size=256"]) == 0
    err = capsys.readouterr().err
    assert "model.bottom, model.top from the config file do not apply to model.type=dcn_v2" in err


def test_unknown_config_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "configs/no_such.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hugerec train: error: config file not found: configs/no_such.toml") and "\n" not in err


def test_print_config_lists_every_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    for section, key in [
        ("preprocess", "schema"),
        ("preprocess", "eval_input"),
        ("preprocess", "max_vocab"),
        ("data", "schema"),
        ("preprocess", "columns"),
        ("preprocess", "separator"),
        ("preprocess", "encoding"),
        ("preprocess", "ops"),
        ("preprocess", "join"),
        ("preprocess", "split"),
        ("preprocess", "time_cutoff"),
        ("preprocess", "last_days"),
        ("preprocess", "test_input"),
        ("preprocess", "on_error"),
        ("predict", "input"),
        ("model", "bottom"),
    ]:
        assert key in cfg[section], f"{section}.{key}"
    assert cfg["embedding"]["optimizer"]["type"] == "rowwise_adagrad"
    assert cfg["model"]["type"] == "dlrm"


def test_hugerec_data_is_named_when_it_cannot_be_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HUGEREC_DATA", raising=False)
    config = tmp_path / "c.toml"
    config.write_text('[preprocess]\ninput = "$HUGEREC_DATA/x.tsv"\nformat = "criteo"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["preprocess", str(config), "--print-config"]) == 2
    assert "HUGEREC_DATA, which is not set" in capsys.readouterr().err
    monkeypatch.setenv("HUGEREC_DATA", str(tmp_path / "data"))
    assert main(["preprocess", str(config), "--print-config"]) == 0
    assert str(tmp_path / "data" / "x.tsv") in capsys.readouterr().out
