"""The loop's append-only decision log: one JSON object per line, fsynced before the loop acts on it.

Each record: {"window": k, "action": ..., "reason": ..., "gate": {...} | null, "version": ... | null,
"time": unix seconds}. Actions (hugerec.continuous.loop writes them):
    trained    the candidate of window k is trained and checkpointed
    publish    the candidate was published to the server as a canary (version, share)
    refuse     the gate refused it: the serving model is unchanged
    skip       window k had no usable data
    promote    the canary became the stable version (KPIs at least the stable's)
    rollback   the canary was dropped (KPIs worse)
    wait       the canary stays: not enough feedback yet
    retrain    the next candidate is trained from scratch on a longer window (drift or a KPI below baseline)
    unload     a version the retention policy drops was unloaded from the server (or was already gone: the
               reason says which)
    restore    a restarted embedded server was given a live version again (server_restore.py): its role, and
               its content id when it had to be loaded from a bundle exported anew

A kill -9 can only tear the last line: reading ignores a last line without its newline, and opening
for append cuts it off, so the log stays a sequence of whole records.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTIONS = ("trained", "publish", "refuse", "skip", "promote", "rollback", "wait", "retrain", "unload", "restore")


@dataclass(frozen=True)
class Record:
    window: int
    action: str
    reason: str
    gate: dict[str, float] | None = None
    version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    time: float = 0.0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"Record: action must be one of {ACTIONS}, got {self.action!r}")

    def to_json(self) -> str:
        d = {
            "window": self.window,
            "action": self.action,
            "reason": self.reason,
            "gate": self.gate,
            "version": self.version,
            "time": self.time,
        }
        if self.extra:
            d["extra"] = self.extra
        return json.dumps(d, sort_keys=True, allow_nan=True)


def _record(d: Mapping[str, Any], where: str) -> Record:
    try:
        return Record(
            int(d["window"]),
            str(d["action"]),
            str(d["reason"]),
            d.get("gate"),
            d.get("version"),
            dict(d.get("extra") or {}),
            float(d.get("time", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a decision record: {e}") from None


def read_log(path: str | Path) -> list[Record]:
    """Every whole record of the log ([] when it does not exist); a torn last line is ignored."""
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    lines = data.split(b"\n")
    whole = lines[:-1]  # the part after the last newline is empty, or a torn write
    out = []
    for i, line in enumerate(whole, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}, line {i}: not JSON: {e}") from None
        if not isinstance(d, dict):
            raise ValueError(f"{p}, line {i}: a record must be a JSON object")
        out.append(_record(d, f"{p}, line {i}"))
    return out


class DecisionLog:
    """Appends records to `path` (created with its folder); each append is on disk before it returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records = read_log(self.path)
        if self.path.exists():
            data = self.path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end != len(data):  # a torn last line from a kill: cut it off before appending
                with open(self.path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())

    def append(self, record: Record) -> Record:
        if record.time == 0.0:
            record = Record(
                record.window, record.action, record.reason, record.gate, record.version, record.extra, time.time()
            )
        with open(self.path, "ab") as f:
            f.write(record.to_json().encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)
        return record

    def of_window(self, window: int) -> list[Record]:
        return [r for r in self.records if r.window == window]

    def warm_start_version(self) -> str | None:
        """Where a loop's next candidate warm-starts: the last published version not rolled back since."""
        base = None
        for r in self.records:
            if r.action == "publish":
                base = r.version
            elif r.action == "rollback" and r.version == base:
                base = r.extra.get("stable")
        return base

    def last_published(self) -> str | None:
        """The last version published (what serves when there is no server to ask)."""
        published = [r.version for r in self.records if r.action == "publish"]
        return published[-1] if published else None


def live_intervals(records: list[Record]) -> dict[str, list[tuple[float, float]]]:
    """When, by the log, each version could answer requests: version -> [(start, end)] in unix seconds.

    The loop writes a record after the server acted, so an action took effect between the previous record's
    time and its own: a published version is live from the previous record's time (0 for the first), and a
    version stops at the time of the record that ends it (its rollback, the promotion of another version
    while it was stable, another canary published while it was the canary, its unload); end = inf while still
    live.
    A publish record whose extra names it as the stable version (the server's first) made it stable;
    otherwise it became the canary. Records without a server (no extra) make the published version stable.
    """
    out: dict[str, list[tuple[float, float]]] = {}
    start: dict[str, float] = {}
    stable: str | None = None
    canary: str | None = None
    before = 0.0

    def end(version: str | None, at: float) -> None:
        if version is not None and version in start:
            out.setdefault(version, []).append((start.pop(version), at))

    for r in records:
        match r.action:
            case "publish" if r.version is not None:
                if "stable" not in r.extra or r.extra["stable"] == r.version:
                    if stable != r.version:
                        end(stable, r.time)
                    stable = r.version
                else:
                    if canary != r.version:
                        end(canary, r.time)
                    canary = r.version
                start.setdefault(r.version, before)
            case "promote" if r.version is not None:
                if stable != r.version:
                    end(stable, r.time)
                stable, canary = r.version, None
            case "rollback" if r.version is not None and r.version == canary:
                end(canary, r.time)
                canary = None
            case "unload" if r.version is not None:  # never the stable or the canary: ends what is still open
                end(r.version, r.time)
                stable, canary = (None if v == r.version else v for v in (stable, canary))
            case _:
                pass
        before = r.time
    for version, t in start.items():
        out.setdefault(version, []).append((t, float("inf")))
    return out


@dataclass(frozen=True)
class LiveRoles:
    """What the log says the server serves after its last record: the stable version, the canary and its share."""

    stable: str | None
    canary: str | None
    share: float | None  # the canary's share of the traffic (None without a canary)


def live_roles(records: list[Record], default_share: float) -> LiveRoles:
    """The stable version, canary and canary share live after `records` (the roles of `live_intervals`): a
    publish whose extra names another stable version made a canary (at its extra's `share`, else
    `default_share`: records written before the share was logged), any other publish a stable version; a
    promote makes the canary stable, a rollback drops it. `restore` and `unload` records change no role."""
    stable: str | None = None
    canary: str | None = None
    share: float | None = None
    for r in records:
        match r.action:
            case "publish" if r.version is not None:
                if "stable" not in r.extra or r.extra["stable"] == r.version:
                    stable = r.version
                    canary, share = (None, None) if canary == r.version else (canary, share)
                else:
                    canary, share = r.version, float(r.extra.get("share", default_share))
            case "promote" if r.version is not None:
                stable, canary, share = r.version, None, None
            case "rollback" if r.version is not None and r.version == canary:
                canary, share = None, None
            case _:
                pass
    return LiveRoles(stable, canary, share)
