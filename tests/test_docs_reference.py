"""The generated references are complete: every key of every config file has a type, a default and a meaning
(docs/tools/config_reference.py), and every command and documented argument of the `hugerec` parser is in
the command-line reference (docs/tools/cli_reference.py)."""

from __future__ import annotations

import dataclasses
import enum
import sys
from pathlib import Path

import pytest

from hugerec.cli import _parser
from hugerec.cli.pipeline_commands import INPUT_KEYS
from hugerec.cli.run_config import load_run_config, resolved_dict
from hugerec.serving.pipeline.declaration import declaration_from_dict

# docs/tools is a folder of scripts (the MkDocs hook and its generators), not a package: imported from there
TOOLS = Path(__file__).resolve().parents[1] / "docs" / "tools"
sys.path.insert(0, str(TOOLS))
import cli_reference  # noqa: E402
import config_reference as cr  # noqa: E402
from config_reference import Key  # noqa: E402


def test_every_key_has_a_meaning() -> None:
    keys = cr.all_keys()
    assert len(keys) > 300
    missing = sorted({f"{k.owner}.{k.name}" for _, k in keys if k in cr.missing([k])})
    assert not missing, (
        "config fields without a meaning (write it as a comment on the field, or in the class docstring's "
        f"`name  meaning` block): {missing}"
    )


def _keys_of(config: str) -> set[str]:
    """Dotted paths of the keys of one config file in the reference (variants folded into their table)."""
    out = set()
    for c, k in cr.all_keys():
        if c.anchor == config:
            table = k.table.split(" (")[0].replace("[]", "")
            out.add(f"{table}.{k.name}" if table else k.name)
    return out


def test_the_reference_holds_every_printed_key() -> None:
    """What `hugerec train --print-config` lists (the quickstart's config, every key) is in the reference."""
    printed = resolved_dict(load_run_config(None))
    documented = _keys_of("run-config")
    for section, keys in printed.items():
        assert section in documented
        for key in keys:
            assert f"{section}.{key}" in documented, f"{section}.{key}"


def test_every_model_type_has_its_table() -> None:
    tables = {k.table for c, k in cr.all_keys() if c.anchor == "run-config"}
    for name in ("dlrm", "dcn_v2", "deepfm", "wide_and_deep", "lightgbm", "xgboost", "two_tower", "mf", "sasrec"):
        assert f'model (type = "{name}")' in tables, name


def test_pipeline_inputs_and_head_are_the_readers_keys() -> None:
    """The pipeline config's [inputs] and [pipeline] tables are described in docs/tools: they must stay the keys
    `hugerec pipeline build` reads (its INPUT_KEYS, and what declaration_from_dict takes in [pipeline])."""
    assert {f.name for f in dataclasses.fields(cr.PipelineInputs)} == set(INPUT_KEYS)
    head = {f.name: f for f in dataclasses.fields(cr.PipelineHead)}
    sources = {"retrieve": {"sources": [{"kind": "popular", "k": 3}]}}
    declaration_from_dict({"pipeline": {"name": "p", "version": "2", "context": {"hour": 1.0}, "max_history": 9}, **sources}, "t")
    assert set(head) == {"name", "version", "context", "max_history"}
    with pytest.raises(ValueError, match="unknown key"):
        declaration_from_dict({"pipeline": {"nme": "p"}, **sources}, "t")


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Inner:
    """An inner table.

    depth   how deep it goes
    """

    depth: int = 2


@dataclasses.dataclass(frozen=True)
class Sample:
    """A sample section; width: how wide, in cells.

    size, count   how many (block form, two names)
    color         the color,
                  continued on a second line
    """

    size: int = 3
    count: int | None = None
    color: Color = Color.RED
    name: str = "x"  # its name
    # a comment above the field
    tags: tuple[str, ...] = ("a",)
    width: float = 1.5
    inner: Inner = dataclasses.field(default_factory=Inner)
    bare: bool = False


def test_meanings_types_and_defaults_are_read_from_the_code() -> None:
    keys = {k.name if not k.table.startswith("s.") else f"inner.{k.name}": k for k in cr.walk(Sample, "s", {})}
    assert keys["size"].meaning == keys["count"].meaning == "how many (block form, two names)"
    assert keys["color"].meaning == "the color, continued on a second line"
    assert keys["color"].type == '"red" | "blue"' and keys["color"].default == '"red"'
    assert keys["name"].meaning == "its name" and keys["tags"].meaning == "a comment above the field"
    assert keys["width"].meaning == "how wide, in cells" and keys["width"].default == "1.5"
    assert keys["count"].type == "int or none" and keys["count"].default == "none"
    assert keys["tags"].type == "list of string" and keys["tags"].default == '["a"]'
    assert keys["inner"].meaning == "An inner table" and keys["inner.depth"].meaning == "how deep it goes"
    assert keys["bare"].meaning is None and cr.missing([keys["bare"]]) == [keys["bare"]]


def test_render_writes_one_table_per_toml_table() -> None:
    text = cr.render_all()
    for heading in ("### `[train.early_stopping]`", "### `[[preprocess.join]]`", '### `[model] type = "dcn_v2"`',
                    '### `[embedding.optimizer] type = "ftrl"`', '### `[[retrieve.sources]] kind = "ann"`', "### `[windows]`"):
        assert heading in text, heading
    assert isinstance(Key, type)


def test_every_command_and_argument_is_in_the_reference() -> None:
    parser = _parser()
    text = cli_reference.render(parser)
    commands = list(cli_reference.commands(parser))
    names = [full for full, _, _ in commands]
    assert {"hugerec train", "hugerec serve", "hugerec loop", "hugerec pipeline build", "hugerec schema"} <= set(names)
    for full, _, sub in commands:
        assert f"## `{full}` {{#{cli_reference.anchor(full)}}}" in text
        assert sub.format_usage().strip() in text
        for flags, _, _ in cli_reference.arguments(sub):
            assert flags.replace("|", "\\|") in text, f"{full}: {flags}"


def test_hidden_arguments_stay_hidden() -> None:
    """`serve --admin-token` is suppressed from --help (a token belongs in the environment); so it is here."""
    serve = dict((full, sub) for full, _, sub in cli_reference.commands(_parser()))["hugerec serve"]
    assert not any("--admin-token" in flags for flags, _, _ in cli_reference.arguments(serve))
