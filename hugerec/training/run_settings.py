"""What a continued run must keep: a config as flat settings (dotted keys), compared with the settings its run
started with, naming the keys that changed.

`fit`'s resume compares the settings kept in its checkpoints (trainer.py); both continuous loops compare those
kept in their work_dir (`keep_settings`: `hugerec loop` started again on a work_dir). Each caller leaves out the
keys a continued run may change (how far it goes, what it shows): every other key shapes the weights or the
decisions, so a change is refused in one line naming it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def flat_settings(value: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dataclasses, enums, dicts, tuples, numbers) as flat JSON with dotted keys."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if not value:
            return {prefix[:-1]: {}} if prefix else {}
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flat_settings(v, f"{prefix}{k}."))
        return out
    if isinstance(value, enum.Enum):
        value = value.value
    elif isinstance(value, tuple | list):
        value = [v.value if isinstance(v, enum.Enum) else v for v in value]
    return {prefix[:-1]: value}


def changed_settings(
    saved: Mapping[str, Any], now: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> str | None:
    """The keys whose values differ between `saved` and `now` (a key on one side only too), sorted, as
    "key: old -> new, ..." (the first six with their values, every further key by name); None when nothing
    changed. `defaults`: a key `saved` lacks (a setting added after it was written) counts as its default
    there, the value that does what the run did before the key existed."""
    saved = {**{k: v for k, v in (defaults or {}).items() if k not in saved}, **saved}
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if not changed:
        return None
    more = f"; also {', '.join(changed[6:])}" if len(changed) > 6 else ""
    return ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed[:6]) + more


def keep_settings(
    path: str | Path, settings: Mapping[str, Any], may_change: frozenset[str], defaults: Mapping[str, Any] | None = None
) -> None:
    """A run's settings file: written (atomically) by the run's first start; a later start with other settings,
    `may_change` (dotted keys) left out of the comparison, raises ValueError naming the changed keys, and nothing
    is written. A file that cannot be read as a JSON object is refused, naming it. `defaults`: every key's
    default; a key the saved file lacks (a setting a later hugerec added) counts as its default there, the value
    that does what the run did before the key existed, so adding a setting does not stop older runs."""
    p = Path(path)
    now = json.loads(json.dumps({k: v for k, v in settings.items() if k not in may_change}, default=str))  # as read back
    added = json.loads(json.dumps({k: v for k, v in (defaults or {}).items() if k not in may_change}, default=str))
    if p.exists():
        try:
            saved = json.loads(p.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{p}: not the run's settings (JSON): {e}") from None
        if not isinstance(saved, dict):
            raise ValueError(f"{p}: not the run's settings (a JSON object)")
        saved = {k: v for k, v in saved.items() if k not in may_change}
        changed = changed_settings(saved, now, added)
        if changed is not None:
            raise ValueError(f"the config changed since the run in {p.parent} started ({changed})")
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.parent / f".{p.name}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(now, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
