"""TOML config files with `key=value` overrides, read into frozen dataclasses, typed by their fields.

    [train]                          hugerec train my.toml train.lr=0.01 train.max_steps=none
    lr = 0.001          ->           RunConfig(train=TrainConfig(lr=0.01, max_steps=None, ...), ...)
    precision = "bf16"

Every mistake is a `ConfigError` with one line naming the file, the dotted key and the problem: an
unknown key (with the closest known key suggested), a value of the wrong type, an enum value
outside its choices, or the ValueError a dataclass's own validation raised.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Field types read by a function of their own (e.g. a sparse optimizer union from {"type": ..., ...}).
Readers = Mapping[Any, Callable[[Any], Any]]


class ConfigError(ValueError):
    """A mistake in a config file or an override, meant to be shown to the user as one line."""


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from None


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of `data` with each "dotted.key=value" set; values are TOML ("[1, 2]", "0.5", "true")
    or, when they do not parse as TOML, bare strings ("bf16"); "none" means None."""
    out = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected key=value, e.g. train.lr=0.01")
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        node[leaf] = parse_value(raw.strip())
    return out


def parse_value(raw: str) -> Any:
    if raw.lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


INTERNAL = {"internal": True}  # field metadata: the field is bookkeeping of the loader, not a config key


def is_internal(f: dataclasses.Field[Any]) -> bool:
    """Whether dataclass field `f` is marked INTERNAL: no file or override sets it, no dump shows it."""
    return bool(f.metadata.get("internal", False))


def from_dict(cls: type[T], data: Mapping[str, Any], where: str = "", readers: Readers | None = None) -> T:
    """Build dataclass `cls` from `data`, converting each value to its field's type.

    `where` prefixes keys in messages ("train" -> "train.lr"); missing keys take the field defaults.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a table of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not is_internal(f)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            raise ConfigError(f"unknown key {_join(where, key)!r}{_suggest(key, fields, where)}")
    kwargs = {name: _convert(hints[name], value, _join(where, name), readers or {}) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None


def section_keys(cls: type) -> set[str]:
    """Every dotted key a config file of dataclass `cls` reads: its fields, and those of each field that is a
    section (a dataclass, or a dataclass or None), recursively."""
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if is_internal(f):
            continue
        out.add(f.name)
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = options[0] if len(options) == 1 else None
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out |= {f"{f.name}.{k}" for k in section_keys(tp)}
    return out


def to_dict(obj: Any, keep_none: bool = False) -> Any:
    """Dataclass -> TOML-ready dict (enums as values, tuples as lists; None left out unless keep_none)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if is_internal(f):
                continue
            v = to_dict(getattr(obj, f.name), keep_none)
            if v is not None or keep_none:
                out[f.name] = v
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, tuple | list):
        return [to_dict(v, keep_none) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v, keep_none) for k, v in obj.items()}
    return obj


def _convert(tp: Any, value: Any, where: str, readers: Readers) -> Any:
    """`value` as field type `tp`: a reader of its own, else by the kind of type (one small function each)."""
    if tp in readers:
        try:
            return readers[tp](value)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{where}: {e}") from None
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _convert_union(typing.get_args(tp), value, where, readers)
    if value is None:
        raise ConfigError(f"{where}: a value is required, got none")
    if tp is Any:
        return value
    if origin in (tuple, list):
        return _convert_sequence(origin, typing.get_args(tp), value, where, readers)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table of keys, got {value!r}")
        return dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where, readers)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _convert_enum(tp, value, where)
    if tp in _SCALARS:
        accepts, expected, make = _SCALARS[tp]
        if not accepts(value):
            raise ConfigError(f"{where}: expected {expected}, got {value!r}")
        return make(value)
    raise TypeError(f"config field {where} has a type the config reader does not handle: {tp!r}")


def _convert_union(args: tuple[Any, ...], value: Any, where: str, readers: Readers) -> Any:
    """X | None takes None; otherwise the first option that converts (the first option's error if none does)."""
    if value is None:
        if type(None) in args:
            return None
        raise ConfigError(f"{where}: a value is required, got none")
    errors = []
    for option in (a for a in args if a is not type(None)):
        try:
            return _convert(option, value, where, readers)
        except ConfigError as e:
            errors.append(str(e))
    raise ConfigError(errors[0])


def _convert_sequence(origin: Any, args: tuple[Any, ...], value: Any, where: str, readers: Readers) -> Any:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{where}: expected a list like [1, 2], got {value!r}")
    item = args[0] if args else Any
    items = [_convert(item, v, f"{where}[{i}]", readers) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _convert_enum(tp: type[enum.Enum], value: Any, where: str) -> enum.Enum:
    choices = [m.value for m in tp]
    if value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{where}: {value!r} is not one of {choices}{hint}")
    return tp(value)


# scalar field type -> (accepts the TOML value?, what the message says it expected, conversion)
_SCALARS: dict[type, tuple[Callable[[Any], bool], str, Callable[[Any], Any]]] = {
    bool: (lambda v: isinstance(v, bool), "true or false", lambda v: v),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", lambda v: v),
    float: (lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number", float),
    str: (lambda v: isinstance(v, str), "a string", lambda v: v),
}


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _suggest(key: str, known: Any, where: str) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.5)
    return f"; did you mean {_join(where, close[0])!r}?" if close else f"; known keys: {', '.join(sorted(known))}"


def _deep_copy(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in d.items()}
