"""Version deltas: a new version of a served model made from a loaded version plus what changed.

What the continuous loop publishes when the schema and the model config are unchanged: the embedding
rows that changed or are new, the keys that lost their row (evicted ids), the tables' default rows
and the dense weights, instead of a whole bundle.

    delta/
      manifest.json     format "hugerec-version-delta", base {version, id}, per table: rows, deleted,
                        default row (or null); files -> sha256
      rows.parquet      changed and new rows (hugerec.embedding.delta format, without optimizer state)
      deleted.parquet   table string, key int64: the keys that lost their row
      dense.pt          the dense weights: a state dict of tensors (read with weights_only)

`derive_version` builds the new version beside its base and never writes to the base:

    base's RocksDB  --checkpoint (hard links)-->  delta/state-<version>.<random>/rocksdb  (owned_dirs.OwnedDir)
    base's tier 2   --copied (when preloading)-->  the new version's tier 2 (both while the base applies
                                                   no update: ParameterServer.updates_paused)
                    + the delta's rows, deletions, default rows (ParameterServer.apply: one WriteBatch)
    a copy of the base's dense program + the delta's dense weights; the base's request preprocessing

A version's content id is its bundle's id (sha256 of manifest.json) or, for a derived version, its
delta's id (sha256 of the delta's manifest.json). A delta names the id of the base it was computed
against and is refused on a base with any other content, so rows are never applied to the wrong state.
Every file is checked against its sha256 before anything is built; a failure leaves no version and
removes the new state directory. A state directory lives exactly as long as its version: it is locked
(owned_dirs) while the version is loaded and removed when the version is unloaded (DerivedModel.close);
one left behind by a server that died is removed at the next derive_version from the same delta or from a
version delta beside it, never one another live server (or another loaded version) still holds. The
delta's own files are never touched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hugerec.embedding.delta import TableDelta, read_delta, write_delta
from hugerec.serving.bundles.bundle_files import MANIFEST, inside_bundle, sha256_file, staged_folder
from hugerec.serving.bundles.bundle_loader import ServeOptions, cache_config
from hugerec.serving.bundles.model_bundle import Bundle
from hugerec.serving.runtime.inference_model import InferenceModel
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
from hugerec.serving.store.memory_store import MemoryStore
from hugerec.serving.store.owned_dirs import OwnedDir, remove_stale
from hugerec.serving.store.parameter_server import ParameterServer, TableUpdate
from hugerec.serving.store.persistent import PersistentStore
from hugerec.serving.store.tiers import Store
from hugerec.serving.store.updates import load_dense

FORMAT = "hugerec-version-delta"
FORMAT_VERSION = 1
ROWS = "rows.parquet"
DELETED = "deleted.parquet"
DENSE = "dense.pt"
STATE_PREFIX = "state-"  # the state directories of versions built from a delta, inside the delta
_DELETED_SCHEMA = pa.schema([("table", pa.string()), ("key", pa.int64())])


def is_version_delta(path: str | Path) -> bool:
    p = Path(path) / MANIFEST
    if not p.is_file():
        return False
    try:
        return bool(json.loads(p.read_text()).get("format") == FORMAT)
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, RecursionError):
        return False


@dataclass(frozen=True, eq=False)
class VersionDelta:
    """A verified version delta: updates per table (rows, deleted keys, default row) and dense weights."""

    path: Path
    id: str  # sha256 of manifest.json
    base_version: str
    base_id: str
    updates: tuple[TableUpdate, ...]
    dense: dict[str, torch.Tensor]


def write_version_delta(
    path: str | Path,
    base_version: str,
    base_id: str,
    updates: Sequence[TableUpdate],
    dense: Mapping[str, torch.Tensor],
) -> Path:
    """Write a version delta to `path` (under a temporary name, renamed into place; an existing one is
    replaced); returns the path."""
    target = Path(path)
    with staged_folder(target) as tmp:
        deltas = [
            TableDelta(
                table=u.table,
                dim=int(u.rows.shape[1]),
                dtype="fp32",
                optimizer={},
                since_step=-1,
                keys=torch.from_numpy(u.keys),
                vectors=torch.from_numpy(u.rows),
                state={},
                steps=torch.zeros(u.keys.shape[0], dtype=torch.int64),
            )
            for u in updates
        ]
        write_delta(deltas, tmp / ROWS)
        deleted = pa.table(
            {
                "table": pa.array([u.table for u in updates for _ in range(u.deleted.shape[0])], type=pa.string()),
                "key": pa.array(np.concatenate([u.deleted for u in updates] or [np.zeros(0, np.int64)])),
            },
            schema=_DELETED_SCHEMA,
        )
        pq.write_table(deleted, tmp / DELETED)
        torch.save({k: v.detach().cpu().contiguous() for k, v in dense.items()}, tmp / DENSE)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "base": {"version": base_version, "id": base_id},
            "tables": {
                u.table: {
                    "rows": int(u.keys.shape[0]),
                    "deleted": int(u.deleted.shape[0]),
                    "default": None if u.default is None else [float(x) for x in u.default],
                }
                for u in updates
            },
            "files": {name: sha256_file(tmp / name) for name in (ROWS, DELETED, DENSE)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return target


def read_version_delta(path: str | Path) -> VersionDelta:
    """Open and verify a version delta (ValueError naming the file and what is wrong)."""
    root = Path(path)
    where = root / MANIFEST
    if not where.is_file():
        raise FileNotFoundError(f"version delta {root} has no {MANIFEST}")
    try:
        meta = json.loads(where.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{where} is not valid JSON: {type(e).__name__}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{where}: not a version delta (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{where}: format version {meta.get('format_version')!r}, this hugerec reads {FORMAT_VERSION}")
    try:
        files = {inside_bundle(str(k), str(where)): str(v) for k, v in meta["files"].items()}
        base_version, base_id = str(meta["base"]["version"]), str(meta["base"]["id"])
        tables = {str(name): dict(t) for name, t in meta["tables"].items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: manifest is missing or mistypes {e}") from None
    if set(files) != {ROWS, DELETED, DENSE}:
        raise ValueError(f"{where}: files must be {[ROWS, DELETED, DENSE]}, got {sorted(files)}")
    for name, expected in files.items():
        p = root / name
        if not p.is_file():
            raise ValueError(f"version delta {root}: file {name} listed in the manifest is missing")
        got = sha256_file(p)
        if got != expected:
            raise ValueError(
                f"version delta {root}: checksum mismatch for {name}: manifest {expected[:16]}..., file {got[:16]}..."
            )
    rows = {d.table: d for d in read_delta(root / ROWS)}
    deleted = pq.read_table(root / DELETED)
    if deleted.schema.remove_metadata() != _DELETED_SCHEMA:
        raise ValueError(f"version delta {root}: {DELETED} must have columns table string, key int64")
    del_tables = np.asarray(deleted.column("table").to_pylist(), dtype=object)
    del_keys = deleted.column("key").to_numpy()
    unknown = (set(rows) | set(del_tables.tolist())) - set(tables)
    if unknown:
        raise ValueError(f"version delta {root}: tables {sorted(unknown)} are not in the manifest")
    updates = []
    for name, t in tables.items():
        d = rows.get(name)
        gone = del_keys[del_tables == name]
        if (0 if d is None else len(d)) != t.get("rows") or gone.shape[0] != t.get("deleted"):
            raise ValueError(f"version delta {root}: table {name!r} holds other row counts than its manifest says")
        default = t.get("default")
        dim = d.dim if d is not None else (len(default) if default is not None else 1)
        updates.append(
            TableUpdate(
                name,
                np.zeros(0, np.int64) if d is None else d.keys.numpy(),
                np.zeros((0, dim), np.float32) if d is None else d.vectors.numpy(),
                gone,
                None if default is None else np.asarray(default, dtype=np.float32),
            )
        )
    dense = load_dense(root / DENSE, str(root / DENSE))
    return VersionDelta(root, sha256_file(where), base_version, base_id, tuple(updates), dense)


@dataclass(eq=False)
class DerivedModel:
    """A version built by `derive_version`: its model, request preprocessing, and `close` (frees the
    parameter server and removes the version's state directory)."""

    model: InferenceModel
    preprocess: RequestPreprocessor
    state: OwnedDir
    info: dict[str, Any]

    @property
    def state_dir(self) -> Path:
        return self.state.path

    def close(self) -> None:
        try:
            self.model.ps.close()
        finally:
            self.state.close()


def derive_version(
    base: InferenceModel,
    base_preprocess: RequestPreprocessor,
    base_info: Mapping[str, Any],
    delta: VersionDelta,
    version: str,
    options: ServeOptions | None = None,
) -> DerivedModel:
    """The base version plus `delta` as a new model (the base is read, never written).

    base_info: the base version's info (its `bundle` path and `bundle_id`, the id of its content).
    The new version has the base's request signature and preprocessing (a version delta never changes
    the schema: the loop publishes a whole bundle then)."""
    options = options or ServeOptions()
    if base_info.get("bundle_id") != delta.base_id:
        raise ValueError(
            f"version delta {delta.path} was made against base content {delta.base_id[:12]}..., but version "
            f"{delta.base_version!r} serves {str(base_info.get('bundle_id'))[:12]}...: publish a whole bundle"
        )
    if base.ps.persistent is None:
        raise ValueError(f"version {delta.base_version!r} has no persistent tier to derive a version from")
    bundle = Bundle.open(str(base_info["bundle"]), verify=False)  # for the table layout: the files are not read
    m = bundle.manifest
    dims = {t.name: t.dim for t in m.tables}
    for u in delta.updates:
        if u.table not in dims or u.rows.shape[1] != dims[u.table]:
            raise ValueError(
                f"version delta {delta.path}: table {u.table!r} (width {u.rows.shape[1]}) is not a table of "
                f"{m.name!r} (tables {dims})"
            )
    # left by servers that died while serving a version of this delta or of another one beside it (a loop's
    # updates/w<k>: a restarted server may never load w<k> again); only version-delta folders are swept
    for folder in (delta.path, *sorted(p for p in delta.path.parent.iterdir() if p != delta.path and is_version_delta(p))):
        remove_stale(folder, STATE_PREFIX)
    state = OwnedDir(delta.path, f"{STATE_PREFIX}{version}.")
    state_dir = state.path
    ps: ParameterServer | None = None
    try:
        memory: Store
        if options.redis_url is not None:
            from hugerec.serving.store.redis_store import RedisStore

            memory = RedisStore(options.redis_url, dims, namespace=f"hugerec:{m.name}:{version}:{delta.id[:12]}")
        else:
            memory = MemoryStore(dims, {t.name: t.num_rows for t in m.tables})
        with base.ps.updates_paused():  # tier 3 and tier 2 of the base at one version
            base.ps.persistent.checkpoint(state_dir / "rocksdb")
            if options.preload:  # the base's tier 2 then holds every row (loaded with these options): copy it
                for table in dims:
                    for keys, rows in base.ps.memory.scan(table, 1 << 20):
                        memory.put(table, keys, rows)
        persistent = PersistentStore(state_dir / "rocksdb", dims)
        ps = ParameterServer(m.tables, memory, persistent, cache_config(options), options.device)
        ps.apply(list(delta.updates), {"bundle_id": delta.id})
        program = base.program_with(delta.dense)  # a copy: the base keeps serving its own
        model = InferenceModel(
            program, base.layouts, ps, base.num_dense, base.dense_keys, base.program_prefix, vectors=base.vectors
        )
    except BaseException:
        try:
            if ps is not None:
                ps.close()
        finally:
            state.close()
        raise
    info = {**m.info, "bundle": str(bundle.path), "bundle_id": delta.id, "delta": str(delta.path), "base": delta.base_version}
    return DerivedModel(model, base_preprocess, state, info)
