"""Every code block of the documentation runs as written (docs/tools/doc_blocks.py says how each kind is treated).

A page's blocks run in order in one scratch folder: `hugerec ...` commands in process through the CLI's
`main` (with a block's `<!-- docs: append ... -->` overrides, or only loaded with `--print-config`),
other shell commands through bash, Python blocks in one namespace per page; toml and json blocks are
parsed, a titled toml block written to its file. A page that reads the real data samples skips without them.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hugerec.cli import _parser, main
from tests.conftest import missing_samples

# docs/tools is a folder of scripts (the MkDocs hook and its generators), not a package: imported from there
TOOLS = Path(__file__).resolve().parents[1] / "docs" / "tools"
sys.path.insert(0, str(TOOLS))
import doc_blocks  # noqa: E402
from doc_blocks import Block, read_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NO_OVERRIDES = ("serve", "schema", "pipeline")  # commands whose words are not a config and KEY=VALUE overrides


def _param(rel: str) -> Any:
    samples = doc_blocks.samples_read(read_page(rel))
    return pytest.param(rel, marks=[pytest.mark.shared_data(*samples)] if samples else [], id=rel)


PAGES = [_param(rel) for rel in doc_blocks.pages() if read_page(rel).blocks]


def test_every_page_is_read() -> None:
    """Every page parses (fences have a known language, directives a reason), and most show code."""
    assert len(doc_blocks.pages()) >= 20
    assert len(PAGES) >= 12


def run_hugerec(block: Block, words: list[str]) -> None:
    argv = words[1:]
    if argv[:1] == ["serve"]:  # serves until Ctrl-C: parsed, and the bundles it names must exist
        args = _parser().parse_args(argv)
        missing = [str(b) for b in args.bundles if not (Path(b) / "manifest.json").is_file()]
        assert not missing, f"{block.where}: hugerec serve: no bundle at {missing}"
        return
    if argv[:1] not in ([c] for c in NO_OVERRIDES):
        argv += list(block.append)
        if block.print_config is not None:
            argv.append("--print-config")
    elif block.print_config is not None and argv[:2] == ["pipeline", "build"]:
        argv.append("--print-config")
    rc = main(argv)
    assert rc == 0, f"{block.where}: hugerec {' '.join(argv)} exited {rc}"


def run_torchrun(block: Block, words: list[str]) -> None:
    """`torchrun ... -m hugerec ARGS`: only loaded (two processes of torch are too slow for every CI run)."""
    assert block.print_config is not None, f"{block.where}: a torchrun command needs <!-- docs: print-config: REASON -->"
    at = words.index("-m")
    assert words[at + 1] == "hugerec", f"{block.where}: torchrun of {words[at + 1]!r}"
    run_hugerec(block, ["hugerec", *words[at + 2 :]])


def run_bash(block: Block, tmp: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in doc_blocks.commands(block):
        for part in command.split("&&"):
            words = shlex.split(part)
            match words[0]:
                case "hugerec":
                    run_hugerec(block, words)
                case "torchrun":
                    run_torchrun(block, words)
                case _:
                    done = subprocess.run(["bash", "-c", part], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
                    assert done.returncode == 0, f"{block.where}: {part!r} exited {done.returncode}: {done.stderr[-2000:]}"


@pytest.mark.parametrize("rel", PAGES)
def test_page_runs_as_written(
    rel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if request.node.get_closest_marker("shared_data") is not None:
        request.getfixturevalue("shared_data")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for block in read_page(rel).blocks:
        if block.action in ("output", "not run"):
            continue
        if block.action == "loaded" and missing_samples(doc_blocks.block_samples(block)):
            continue  # only loads a config of the real samples, absent here (the page's other blocks still run)
        match block.lang:
            case "bash":
                run_bash(block, tmp_path)
            case "python":
                exec(compile(block.code, block.where, "exec"), namespace)
            case "toml":
                try:
                    tomllib.loads(block.code)
                except tomllib.TOMLDecodeError as e:
                    raise AssertionError(f"{block.where}: invalid TOML: {e}") from None
                if block.title is not None:
                    (tmp_path / block.title).parent.mkdir(parents=True, exist_ok=True)
                    (tmp_path / block.title).write_text(block.code)
            case "json":
                json.loads(block.code)


def test_directives_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The directive comments and fence attributes mean what doc_blocks says (a page of each kind)."""
    monkeypatch.setattr(doc_blocks, "DOCS", tmp_path)
    (tmp_path / "p.md").write_text(
        "# t\n\n<!-- docs: not run: starts a server that runs until Ctrl-C -->\n```bash\nhugerec serve x\n```\n\n"
        "<!-- docs: append train.max_steps=2 train.progress=false -->\n```bash\nhugerec train\n```\n\n"
        '```toml title="a.toml"\n[train]\nepochs = 1\n```\n\n```text\noutput\n```\n'
    )
    blocks = read_page("p.md").blocks
    assert [b.action for b in blocks] == ["not run", "run", "parsed", "output"]
    assert blocks[1].append == ("train.max_steps=2", "train.progress=false")
    assert blocks[2].title == "a.toml"
    (tmp_path / "q.md").write_text("<!-- docs: not run: no -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        read_page("q.md")
    (tmp_path / "r.md").write_text("```\nls\n```\n")
    with pytest.raises(ValueError, match="without a language"):
        read_page("r.md")
