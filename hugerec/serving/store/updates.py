"""Live updates: the training side publishes new rows and dense weights; a watcher applies them.

Sources (each remembers what it applied in the persistent tier, so a restart does not replay):

  DirectorySource(path)   entries applied in natural name order (step-9 before step-10):
      <name>.parquet        a delta of dynamic tables (hugerec.embedding.delta format)
      <name>.pt             dense weights: a state dict of tensors (torch.load weights_only)
      <name>/               one atomic update: delta.parquet and/or dense.pt inside
    names starting with "." or ending in ".tmp" are in-progress writes and are skipped; use
    `publish_to_directory`, which writes under a temporary name and renames.
  RedisStreamSource(url, stream)   one stream entry per update (see `publish_to_stream`).

UpdateWatcher polls a source in a thread and applies each update with the model's `update` (an
`Updatable`: InferenceModel is one): new
rows and dense weights switch together, requests in flight keep their version. An update that
cannot be applied (unknown table, wrong width, damaged file) is refused as a whole: it is logged,
counted and listed in `watcher.errors`, and the watcher moves on.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from hugerec.embedding.delta import TableDelta, read_delta, write_delta
from hugerec.serving.store.parameter_server import TableUpdate
from hugerec.serving.store.persistent import PersistentStore

log = logging.getLogger(__name__)

DELTA_FILE = "delta.parquet"
DENSE_FILE = "dense.pt"
DENSE_STATE_META = "dense_state"  # meta entry: file in the state dir with the last applied dense weights
_UNSETTLED_SECONDS = 30.0  # an unreadable entry younger than this may still be being written: retry it


@dataclass(eq=False)
class Update:
    """One atomic update: table rows and/or dense weights, with the source's id for it.

    error: why the source could not read it (the watcher then refuses it).
    """

    id: str
    tables: list[TableUpdate] = field(default_factory=list)
    dense: dict[str, torch.Tensor] | None = None
    error: str | None = None


class UpdateSource(Protocol):
    """Where updates come from; `poll(after)` returns the updates newer than the id `after` (None: all)."""

    key: str  # names this source in the persistent tier's metadata

    def poll(self, after: str | None) -> list[Update]: ...

    def close(self) -> None: ...


def updates_from_deltas(deltas: Sequence[TableDelta]) -> list[TableUpdate]:
    return [
        TableUpdate(
            d.table,
            d.keys.numpy(),
            d.vectors.numpy(),
            default=None if d.unknown is None else d.unknown.vector.numpy(),
        )
        for d in deltas
    ]


def load_dense(data: bytes | Path, where: str) -> dict[str, torch.Tensor]:
    """A dense-weights state dict, read with weights_only (never runs code)."""
    try:
        state = torch.load(io.BytesIO(data) if isinstance(data, bytes) else data, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many types for damaged or foreign files
        raise ValueError(f"{where}: not a dense-weights file: {e}") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ValueError(f"{where}: dense weights must be a dict of name -> tensor")
    return state


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


class DirectorySource:
    """Updates as files in `path` (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.key = f"dir:{self.path.resolve()}"

    def _entries(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        found = [
            p
            for p in self.path.iterdir()
            if not p.name.startswith(".")
            and not p.name.endswith(".tmp")
            and (p.is_dir() or p.suffix in (".parquet", ".pt"))
        ]
        return sorted(found, key=lambda p: _natural(p.name))

    def poll(self, after: str | None) -> list[Update]:
        out = []
        for p in self._entries():
            if after is not None and _natural(p.name) <= _natural(after):
                continue
            try:
                out.append(self._read(p))
            except (ValueError, OSError) as e:
                if time.time() - p.stat().st_mtime < _UNSETTLED_SECONDS:
                    break  # maybe still being written without a temporary name: try again on the next poll
                out.append(Update(p.name, error=f"cannot read {p}: {e}"))
        return out

    def _read(self, p: Path) -> Update:
        if p.is_dir():
            delta, dense = p / DELTA_FILE, p / DENSE_FILE
            if not delta.is_file() and not dense.is_file():
                raise ValueError(f"update {p} holds neither {DELTA_FILE} nor {DENSE_FILE}")
            tables = updates_from_deltas(read_delta(delta)) if delta.is_file() else []
            return Update(p.name, tables, load_dense(dense, str(dense)) if dense.is_file() else None)
        if p.suffix == ".parquet":
            return Update(p.name, updates_from_deltas(read_delta(p)))
        return Update(p.name, [], load_dense(p, str(p)))

    def close(self) -> None:
        """Nothing to release."""


def publish_to_directory(
    directory: str | Path, name: str, deltas: Sequence[TableDelta] = (), dense: Mapping[str, torch.Tensor] | None = None
) -> Path:
    """Publish one atomic update as `directory/name/` (written under a temporary name, then renamed)."""
    if not deltas and dense is None:
        raise ValueError("publish_to_directory: nothing to publish (no deltas, no dense weights)")
    if not name or name.startswith(".") or "/" in name or name.endswith(".tmp"):
        raise ValueError(f"publish_to_directory: bad update name {name!r}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    if final.exists():
        raise FileExistsError(f"publish_to_directory: {final} exists")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        if deltas:
            write_delta(deltas, tmp / DELTA_FILE)
        if dense is not None:
            torch.save({k: v.detach().cpu() for k, v in dense.items()}, tmp / DENSE_FILE)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


class RedisStreamSource:
    """Updates as entries of the Redis stream `stream` (see `publish_to_stream`)."""

    def __init__(self, url: str, stream: str, block_ms: int = 0) -> None:
        import redis

        self.url = url
        self.stream = stream
        self.key = f"redis:{stream}"
        self.block_ms = block_ms
        self._client: Any = redis.Redis.from_url(url)

    def poll(self, after: str | None) -> list[Update]:
        start = "0-0" if after is None else after
        if self.block_ms:
            got = self._client.xread({self.stream: start}, count=64, block=self.block_ms)
            entries = got[0][1] if got else []
        else:
            entries = self._client.xrange(self.stream, min=f"({start}" if after is not None else "-", count=64)
        out = []
        for raw_id, fields in entries:
            entry_id = raw_id.decode()
            try:
                out.append(self._decode(entry_id, fields))
            except ValueError as e:
                out.append(Update(entry_id, error=str(e)))
        return out

    def _decode(self, entry_id: str, fields: Mapping[bytes, bytes]) -> Update:
        where = f"stream {self.stream!r} entry {entry_id}"
        try:
            tables_meta = json.loads(fields[b"tables"])
            tables = []
            for t in tables_meta:
                name, dim = str(t["table"]), int(t["dim"])
                keys = np.frombuffer(fields[f"keys:{name}".encode()], dtype="<i8")
                rows = np.frombuffer(fields[f"rows:{name}".encode()], dtype="<f4").reshape(-1, dim)
                raw_default = fields.get(f"default:{name}".encode())
                default = None if raw_default is None else np.frombuffer(raw_default, dtype="<f4")
                tables.append(TableUpdate(name, keys, rows, default=default))
        except (KeyError, ValueError, TypeError, RecursionError) as e:  # RecursionError: JSON nested too deeply
            raise ValueError(f"{where}: malformed update: {type(e).__name__}: {e}") from None
        raw_dense = fields.get(b"dense")
        return Update(entry_id, tables, None if raw_dense is None else load_dense(raw_dense, where))

    def close(self) -> None:
        self._client.close()


def publish_to_stream(
    url: str, stream: str, updates: Sequence[TableUpdate] = (), dense: Mapping[str, torch.Tensor] | None = None
) -> str:
    """Publish one atomic update as one entry of the Redis stream `stream`; returns the entry id."""
    import redis

    if not updates and dense is None:
        raise ValueError("publish_to_stream: nothing to publish")
    fields: dict[str, bytes | str] = {
        "tables": json.dumps([{"table": u.table, "dim": int(u.rows.shape[1])} for u in updates])
    }
    for u in updates:
        if u.deleted.shape[0]:
            raise ValueError(f"publish_to_stream: table {u.table!r}: deletions are not carried by streams")
        fields[f"keys:{u.table}"] = u.keys.astype("<i8").tobytes()
        fields[f"rows:{u.table}"] = u.rows.astype("<f4").tobytes()
        if u.default is not None:
            fields[f"default:{u.table}"] = u.default.astype("<f4").tobytes()
    if dense is not None:
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in dense.items()}, buf)
        fields["dense"] = buf.getvalue()
    client: Any = redis.Redis.from_url(url)
    try:
        entry_id = client.xadd(stream, fields)
    finally:
        client.close()
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


class Updatable(Protocol):
    """What a watcher updates (hugerec.serving.runtime.inference_model.InferenceModel): rows and dense weights
    switch together; `dense_keys` are the names of the dense weights it keeps."""

    @property
    def dense_keys(self) -> tuple[str, ...]: ...

    def update(
        self,
        tables: Sequence[TableUpdate],
        dense_state: Mapping[str, torch.Tensor] | None = None,
        meta: Mapping[str, str] | None = None,
    ) -> object: ...


class UpdateWatcher:
    """Applies a source's updates to `model` from a thread, every `interval` seconds.

    state        the persistent tier: remembers the last applied id (meta "applied:<source key>")
    state_dir    where the last dense weights are kept for restarts (None: not kept)
    on_result    called with "applied" or "refused" after each update (metrics)
    """

    def __init__(
        self,
        model: Updatable,
        source: UpdateSource,
        state: PersistentStore | None,
        state_dir: Path | None = None,
        interval: float = 1.0,
        on_result: Callable[[str], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"UpdateWatcher: interval must be > 0, got {interval}")
        self.model = model
        self.source = source
        self.state = state
        self.state_dir = state_dir
        self.interval = interval
        self.on_result = on_result
        self.meta_key = f"applied:{source.key}"
        self.last = None if state is None else state.get_meta(self.meta_key)
        self.applied = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> UpdateWatcher:
        self._thread = threading.Thread(target=self._run, name=f"updates:{self.source.key}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    def poll_once(self) -> int:
        """Apply every pending update now; returns how many were applied."""
        try:
            pending = self.source.poll(self.last)
        except Exception as e:  # a damaged entry or an unreachable source: report, retry next poll
            self._refuse(f"{self.source.key}: cannot read updates after {self.last!r}: {e}", None)
            return 0
        done = 0
        for update in pending:
            if update.error is not None:
                self._refuse(f"{self.source.key}: update {update.id!r} refused: {update.error}", update.id)
                continue
            meta = {self.meta_key: update.id}
            try:
                if update.dense is not None and self.state_dir is not None:
                    meta[DENSE_STATE_META] = self._keep_dense(update.id, update.dense)
                self.model.update(update.tables, update.dense, meta)
            except ValueError as e:
                self._refuse(f"{self.source.key}: update {update.id!r} refused: {e}", update.id)
                continue
            if DENSE_STATE_META in meta:
                self._drop_old_dense(meta[DENSE_STATE_META])
            self.last = update.id
            self.applied += 1
            done += 1
            if self.on_result is not None:
                self.on_result("applied")
        return done

    def _refuse(self, message: str, update_id: str | None) -> None:
        log.error("%s", message)
        self.errors = [*self.errors[-99:], message]
        if update_id is not None:  # skip it from now on (it stays listed in `errors`)
            self.last = update_id
            if self.state is not None:
                self.state.set_meta(self.meta_key, update_id)
        if self.on_result is not None:
            self.on_result("refused")

    def _keep_dense(self, update_id: str, dense: Mapping[str, torch.Tensor]) -> str:
        """Save the update's dense weights for restarts; the persistent tier points at them once applied."""
        assert self.state_dir is not None
        name = f"dense-{re.sub(r'[^A-Za-z0-9_.-]', '_', update_id)}.pt"
        keep = {k: dense[k] for k in self.model.dense_keys if k in dense}
        tmp = self.state_dir / f".{name}.tmp"
        torch.save(keep, tmp)
        os.replace(tmp, self.state_dir / name)
        return name

    def _drop_old_dense(self, current: str) -> None:
        assert self.state_dir is not None
        for p in self.state_dir.glob("dense-*.pt"):
            if p.name != current:
                p.unlink(missing_ok=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.source.close()
