"""A run's settings: flat dotted keys, the changed keys named in one line, the settings file of a continued run."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hugerec.training.run_settings import changed_settings, flat_settings, keep_settings


class Kind(enum.Enum):
    A = "a"


@dataclass(frozen=True)
class Inner:
    lr: float = 0.1
    kinds: tuple[Kind, ...] = (Kind.A,)


@dataclass(frozen=True)
class Outer:
    inner: Inner = field(default_factory=Inner)
    sizes: tuple[int, ...] = (4, 2)
    none: None = None


def test_flat_settings_are_dotted_json_values() -> None:
    assert flat_settings(Outer()) == {"inner.lr": 0.1, "inner.kinds": ["a"], "sizes": [4, 2], "none": None}
    assert flat_settings({"a": {"b": 1}, "c": Kind.A}) == {"a.b": 1, "c": "a"}


def test_changed_settings_name_each_key_sorted_and_count_the_rest() -> None:
    assert changed_settings({"a": 1}, {"a": 1}) is None
    assert changed_settings({"b": 1, "a": 2}, {"b": 2, "a": 2, "c": 3}) == "b: 1 -> 2, c: None -> 3"
    many = changed_settings({f"k{i}": 0 for i in range(8)}, {f"k{i}": 1 for i in range(8)})
    assert many is not None and many.endswith("k5: 0 -> 1; also k6, k7")


def test_keep_settings_writes_once_then_refuses_a_change_outside_may_change(tmp_path: Path) -> None:
    path = tmp_path / "run" / "settings.json"
    keep_settings(path, {"lr": 0.1, "last": 3, "sizes": (4, 2)}, frozenset({"last"}))
    written = path.read_text()
    assert '"last"' not in written  # keys that may change are not kept
    keep_settings(path, {"lr": 0.1, "last": 9, "sizes": [4, 2]}, frozenset({"last"}))  # a tuple reads back as a list
    with pytest.raises(ValueError, match=r"the config changed since the run in .*run started \(lr: 0\.1 -> 0\.2, sizes: \[4, 2\] -> \[8\]\)"):
        keep_settings(path, {"lr": 0.2, "last": 3, "sizes": (8,)}, frozenset({"last"}))
    assert path.read_text() == written
    path.write_text("[1]")
    with pytest.raises(ValueError, match=r"settings\.json: not the run.s settings"):
        keep_settings(path, {"lr": 0.1}, frozenset())
    path.write_text("{")
    with pytest.raises(ValueError, match=r"settings\.json: not the run.s settings \(JSON\)"):
        keep_settings(path, {"lr": 0.1}, frozenset())


def test_a_key_the_saved_settings_lack_compares_as_its_default(tmp_path: Path) -> None:
    """A setting added by a later hugerec is absent from an older run's file: that run continues while the key
    keeps its default (what the run did before the key existed), and is refused, naming the key, otherwise."""
    path = tmp_path / "settings.json"
    keep_settings(path, {"lr": 0.1}, frozenset())  # written before "share" existed
    defaults = {"lr": 0.5, "share": 1.0, "last": None}
    keep_settings(path, {"lr": 0.1, "share": 1.0}, frozenset(), defaults)
    keep_settings(path, {"lr": 0.1, "share": 1}, frozenset(), defaults)  # 1 == 1.0 as JSON reads it back
    with pytest.raises(ValueError, match=r"\(share: 1\.0 -> 0\.5\)"):
        keep_settings(path, {"lr": 0.1, "share": 0.5}, frozenset(), defaults)
    with pytest.raises(ValueError, match=r"share: None -> 1\.0"):
        keep_settings(path, {"lr": 0.1, "share": 1.0}, frozenset())  # without defaults: a key on one side only
    with pytest.raises(ValueError, match=r"lr: 0\.1 -> 0\.5"):
        keep_settings(path, {"lr": 0.5}, frozenset(), defaults)  # a key the file has is never defaulted
