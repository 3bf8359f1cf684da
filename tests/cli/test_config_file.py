import enum
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hugerec.cli.config_file import ConfigError, apply_overrides, from_dict, parse_value, read_toml, to_dict
from hugerec.embedding.optimizers import Adam, Optimizer, RowWiseAdagrad, optimizer_from_dict


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    steps: int | None = None

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"Inner: rate must be >= 0, got {self.rate}")


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    widths: tuple[int, ...] = (4, 2)
    color: Color = Color.RED
    flag: bool = False
    inner: Inner = field(default_factory=Inner)
    optimizer: Optimizer = field(default_factory=RowWiseAdagrad)


READERS = {Optimizer: optimizer_from_dict}


def test_reads_nested_typed_values_and_defaults() -> None:
    cfg = from_dict(
        Outer,
        {
            "widths": [8, 4, 1],
            "color": "green",
            "inner": {"rate": 1, "steps": 3},
            "optimizer": {"type": "adam", "lr": 0.1},
        },
        readers=READERS,
    )
    assert cfg == Outer("x", (8, 4, 1), Color.GREEN, False, Inner(1.0, 3), Adam(lr=0.1))
    assert isinstance(cfg.inner.rate, float)
    assert from_dict(Outer, {}) == Outer()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"colour": "red"}, "unknown key 'colour'; did you mean 'color'?"),
        ({"inner": {"rte": 1.0}}, "unknown key 'inner.rte'; did you mean 'inner.rate'?"),
        ({"zzz": 1}, "unknown key 'zzz'; known keys: color, flag, inner, name, optimizer, widths"),
        ({"widths": [1, "a"]}, "widths[1]: expected an integer, got 'a'"),
        ({"widths": 3}, "widths: expected a list like [1, 2], got 3"),
        ({"flag": 1}, "flag: expected true or false, got 1"),
        ({"color": "gren"}, "color: 'gren' is not one of ['red', 'green']; did you mean 'green'?"),
        ({"inner": {"rate": -1.0}}, "inner: Inner: rate must be >= 0, got -1.0"),
        ({"inner": {"rate": None}}, "inner.rate: a value is required, got none"),
        ({"inner": 3}, "inner: expected a table of keys, got 3"),
        ({"name": 5}, "name: expected a string, got 5"),
        ({"optimizer": {"type": "adamw"}}, "optimizer: unknown optimizer type 'adamw'"),
    ],
)
def test_mistakes_are_one_line_config_errors(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(Outer, data, readers=READERS)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_overrides_are_typed_by_the_fields() -> None:
    data = apply_overrides(
        {"inner": {"rate": 0.1}},
        ["inner.steps=none", "inner.rate=2", "widths=[3, 2]", "color=green", "name=hello world", "flag=true"],
    )
    assert from_dict(Outer, data) == Outer("hello world", (3, 2), Color.GREEN, True, Inner(2.0, None))
    with pytest.raises(ConfigError, match=r"unknown key 'inner\.rat'; did you mean 'inner\.rate'"):
        from_dict(Outer, apply_overrides({}, ["inner.rat=1"]))
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["inner.rate"])
    with pytest.raises(ConfigError, match="'name' is a value, not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_parse_value() -> None:
    assert parse_value("1e-3") == 0.001
    assert parse_value("none") is None
    assert parse_value("bf16") == "bf16"
    assert parse_value('"007"') == "007"
    assert parse_value("[1, 2]") == [1, 2]


def test_read_toml_and_roundtrip(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('name = "y"\nwidths = [2]\n[inner]\nrate = 0.25\n')
    cfg = from_dict(Outer, read_toml(p), readers=READERS)
    assert cfg.inner.rate == 0.25
    assert to_dict(Inner(0.25)) == {"rate": 0.25}
    with pytest.raises(ConfigError, match="config file not found"):
        read_toml(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("x = = 1")
    with pytest.raises(ConfigError, match="invalid TOML"):
        read_toml(tmp_path / "bad.toml")


def test_internal_fields_are_no_config_keys() -> None:
    """A field marked INTERNAL (the loader's bookkeeping, like RunConfig.model_keys) is neither read from a
    file nor written out."""
    import dataclasses

    from hugerec.cli.config_file import INTERNAL, ConfigError, from_dict, to_dict

    @dataclasses.dataclass(frozen=True)
    class Section:
        lr: float = 0.1
        seen: frozenset[str] = dataclasses.field(default=frozenset(), metadata=INTERNAL)

    assert to_dict(Section(0.5, frozenset({"lr"}))) == {"lr": 0.5}
    assert from_dict(Section, {"lr": 0.2}) == Section(0.2)
    with pytest.raises(ConfigError, match="unknown key 'seen'"):
        from_dict(Section, {"seen": ["lr"]})
