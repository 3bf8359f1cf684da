"""The checkpoint directory: save on N ranks, load on M ranks or in one process; never unpickled on load.

hugerec.training.checkpoint.save_checkpoint / load_checkpoint (the public calls, which the trainer uses) keep a
run's checkpoints in directories of this format; `save_checkpoint_dir` / `load_checkpoint_dir` write
and read one directory for any model, sharded or not.

A checkpoint is a directory:

    step-0000001000/
      index.json          format, version, the tables, the pieces, the caller's `extra` (JSON), and per
                          file its sha256 and the keys it holds
      rank-00000.pt       torch.save of {key: tensor} written by rank 0 (dense weights, dense optimizer, the
      rank-00001.pt       pieces it owns), ... one file per rank; read back with weights_only=True

Keys, in global coordinates, so that any other layout can find what it needs:

    dense/<name>                       dense parameters and buffers (replicated: rank 0 writes them)
    rank_state/<r>                     optional, what rank r alone knows (RNG states, loader position)
    optimizer                          the dense optimizer (torch's get_optimizer_state_dict; rank 0)
    emb/<table>/<r0>-<r1>/<c0>-<c1>/<field>
                                       static tables: rows [r0, r1) x columns [c0, c1) of the weights
                                       and of each optimizer-state field (row-wise state: [n], a column
                                       piece keeps its own), and "step" (Adam)
    emb/<table>/keys<i>of<k>/<c0>-<c1>/<field>
                                       dynamic tables, one piece per saved shard: keys [n], the rows'
                                       weights and optimizer state, last_step and count; the unknown row
                                       ("unknown.<field>"), the table's step ("table_step"), the
                                       admission sketch ("sketch")

A replicated piece is written once, by the lowest rank holding it. Writing is atomic: the ranks write
into `.<name>.tmp/`, rank 0 adds index.json last and renames the directory into place, so a crash
leaves the previous checkpoints and at most a temporary directory, never a partial checkpoint under
a checkpoint's name. Loading reads index.json as JSON, checks each file's sha256 before opening it
and opens it with torch.load(weights_only=True, mmap=True): nothing in a checkpoint can run code, a
damaged file is named, and a rank pages in only the pieces it needs.

Loading cuts the pieces to the loader's layout. A static shard reads the pieces overlapping its rows
and columns; row-wise state merged from column pieces is their width-weighted mean (exact for
RowWiseAdagrad's mean of squares). A dynamic shard reads every piece of its table, one piece at a
time, and keeps the keys it owns (hash(key) % k for row-wise shards, all of them otherwise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict

from hugerec.distributed.routing import key_shard
from hugerec.distributed.sharded import Placed, ShardedEmbeddingCollection, table_state
from hugerec.distributed.sharding_plan import Shard, ShardingKind
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.hash_table import HashTableContents
from hugerec.embedding.layers import Embedding, EmbeddingBag
from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import Missing, TableConfig

FORMAT = "hugerec-checkpoint"
FORMAT_VERSION = 2
INDEX = "index.json"
OPTIMIZER_KEY = "optimizer"
RANK_STATE_PREFIX = "rank_state/"


@dataclass(frozen=True)
class Piece:
    """One saved block: rows [r0, r1) x columns [c0, c1) of a static table, or saved shard `keys` of a dynamic one."""

    table: str
    prefix: str
    r0: int = 0
    r1: int = 0
    c0: int = 0
    c1: int = 0
    keys: int = -1  # dynamic tables: index of the saved shard among num_shards (hash(key) % num_shards)
    num_shards: int = 0
    capacity: int = 0


# -- plumbing --------------------------------------------------------------------------------------
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank_and_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if _distributed() else (0, 1)


def _all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj` (JSON-able metadata only), in rank order."""
    if not _distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def holdings(model: nn.Module) -> tuple[list[str], list[Placed]]:
    """The module names of `model`'s embedding collections, and every table or shard this process holds."""
    names: list[str] = []
    placed: list[Placed] = []
    for name, m in _unwrap(model).named_modules():
        if any(n == "" or name.startswith(n + ".") for n in names):
            continue  # the shard and replica collections inside a sharded one
        if isinstance(m, ShardedEmbeddingCollection):
            names.append(name)
            placed.extend(m.placed)
        elif isinstance(m, EmbeddingCollection):
            names.append(name)
            for t in m.tables:
                whole = Shard(t.name, 0, 0, 0, t.num_rows, 0, t.dim)
                resolved = dataclasses.replace(t, optimizer=t.optimizer or m.optimizer)
                placed.append(Placed(resolved, whole, ShardingKind.TABLE_WISE, m))
    return names, placed


def _dense_state(model: nn.Module, collections: list[str]) -> dict[str, torch.Tensor]:
    inner = _unwrap(model)
    return {
        f"dense/{k}": v
        for k, v in inner.state_dict().items()
        if not any(c == "" or k.startswith(c + ".") for c in collections)
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a complete checkpoint directory (its index written), not whether it is intact."""
    return (Path(path) / INDEX).is_file()


class _Reader:
    """The files of one checkpoint: index.json parsed, each data file checked against its sha256 when
    first opened, and opened with weights_only (never unpickles code) and mmap (pages read on use)."""

    def __init__(self, path: Path, verified: bool = False) -> None:
        self.path = path
        self.verified = verified  # every file's sha256 already checked (verify_checkpoint): not again
        index_path = path / INDEX
        if not index_path.is_file():
            raise FileNotFoundError(f"load_checkpoint: {path} is not a checkpoint (no {INDEX})")
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"load_checkpoint: {index_path} is damaged (not valid JSON: {e})") from None
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise ValueError(f"load_checkpoint: {index_path} is not a hugerec checkpoint index")
        if index.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"load_checkpoint: {path} has checkpoint format {index.get('version')}, this hugerec reads {FORMAT_VERSION}"
            )
        try:
            self.tables = {n: TableConfig.from_dict(d) for n, d in index["tables"].items()}
            self.pieces = [Piece(**d) for d in index["pieces"]]
            self.files: dict[str, str] = {str(k): str(v) for k, v in index["files"].items()}
            self.where: dict[str, str] = {str(k): str(v) for k, v in index["keys"].items()}
            self.extra = index["extra"]
            self.world_size = int(index["world_size"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"load_checkpoint: {index_path} is damaged (missing or mistyped {e})") from None
        for name in (*self.files, *self.where.values()):
            if name not in self.files or "/" in name or "\\" in name or name.startswith("."):
                raise ValueError(f"load_checkpoint: {index_path} names file {name!r}, not one of its own files")
        self._open: dict[str, dict[str, Any]] = {}

    def with_prefix(self, prefix: str) -> list[str]:
        return [k for k in self.where if k.startswith(prefix)]

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def __getitem__(self, key: str) -> Any:
        name = self.where[key]
        if name not in self._open:
            self._open[name] = self._load(name)
        try:
            return self._open[name][key]
        except KeyError:
            raise ValueError(f"load_checkpoint: {self.path / name} lacks {key!r} that {INDEX} places there") from None

    def check(self, name: str) -> None:
        p = self.path / name
        if not p.is_file():
            raise ValueError(f"load_checkpoint: {p} is missing")
        got = _sha256(p)
        if got != self.files[name]:
            raise ValueError(
                f"load_checkpoint: {p} is damaged (sha256 {got[:16]}..., {INDEX} says {self.files[name][:16]}...)"
            )

    def _load(self, name: str) -> dict[str, Any]:
        if not self.verified:
            self.check(name)
        p = self.path / name
        try:
            data = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # torch raises many types for foreign files; weights_only refuses code
            raise ValueError(f"load_checkpoint: cannot read {p}: {type(e).__name__}: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"load_checkpoint: {p} holds a {type(data).__name__}, not a dict of tensors")
        return data


# -- save ------------------------------------------------------------------------------------------
def save_checkpoint_dir(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: Any = None,
    rank_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write `model` (sharded or not), the dense `optimizer` and a JSON-able `extra` to directory `path`.

    rank_state: what only this rank knows (its RNG states, its loader's position), tensors and plain
    containers of primitives; `load_rank_state` gives it back to the same rank of a group of the same size.
    Collective: every rank of the group calls it with the same path (one shared file system). Atomic: a
    crash leaves `path` as it was (absent, or the previous checkpoint), never half written.
    """
    final = Path(path)
    rank, world = _rank_and_world()
    try:
        extra_json = json.dumps(extra)
    except (TypeError, ValueError) as e:
        raise ValueError(f"save_checkpoint: extra must be JSON-able (numbers, strings, lists, dicts): {e}") from None
    collections, placed = holdings(model)
    state: dict[str, Any] = _dense_state(model, collections) if rank == 0 else {}
    if optimizer is not None:
        opt_state = get_optimizer_state_dict(model, optimizer)  # collective under some wrappers: every rank
        if rank == 0:
            state[OPTIMIZER_KEY] = opt_state
    pieces: list[Piece] = []
    tensors: dict[str, Any] = {}
    for p in placed:
        pieces.append(_save_static(p, tensors) if p.table.dynamic is None else _save_dynamic(p, tensors))
    everyone: list[list[dict[str, Any]]] = _all_gather([dataclasses.asdict(x) for x in pieces])
    owner: dict[str, int] = {}
    for r, rank_pieces in enumerate(everyone):
        for d in rank_pieces:
            owner.setdefault(d["prefix"], r)  # a replicated piece: the lowest rank holding it writes it
    mine = {x.prefix for x in pieces if owner[x.prefix] == rank}
    state.update({k: v for k, v in tensors.items() if k.rsplit("/", 1)[0] in mine})
    if rank_state is not None:
        state[f"{RANK_STATE_PREFIX}{rank}"] = dict(rank_state)
    tables: dict[str, Any] = {}
    for d in _all_gather({p.table.name: p.table.to_dict() for p in placed}):
        tables.update(d)

    tmp = final.parent / f".{final.name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crash mid-write
        tmp.mkdir(parents=True)
    _barrier()
    name = f"rank-{rank:05d}.pt"
    with open(tmp / name, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    written = _all_gather((name, _sha256(tmp / name), sorted(state)))
    if rank == 0:
        unique = {d["prefix"]: d for rank_pieces in everyone for d in rank_pieces}
        index = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "world_size": world,
            "tables": tables,
            "pieces": [unique[k] for k in sorted(unique)],
            "files": {n: digest for n, digest, _ in written},
            "keys": {k: n for n, _, keys in written for k in keys},
            "extra": json.loads(extra_json),
        }
        with open(tmp / INDEX, "w", encoding="utf-8") as f:
            json.dump(index, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync(tmp)
        old = final.parent / f".{final.name}.old"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    for p in placed:  # the disk tables' snapshots this checkpoint names live as long as it does
        key = f"{_piece_prefix(p)}/disk_snapshot"
        if key in tensors:
            p.local.pin_disk_snapshot(p.table.name, int(tensors[key]), final)
    return final


def _piece_prefix(p: Placed) -> str:
    s = p.shard
    return f"emb/{p.table.name}/{s.row_start}-{s.row_start + s.num_rows}/{s.col_start}-{s.col_start + s.dim}"


def _save_static(p: Placed, state: dict[str, Any]) -> Piece:
    s = p.shard
    piece = Piece(p.table.name, "", s.row_start, s.row_start + s.num_rows, s.col_start, s.col_start + s.dim)
    piece = dataclasses.replace(piece, prefix=_piece_prefix(p))
    for field, v in table_state(p.local, p.table.name).items():
        state[f"{piece.prefix}/{field}"] = v
    return piece


def _save_dynamic(p: Placed, state: dict[str, Any]) -> Piece:
    """A dynamic shard as it is: its hash table's whole state and every row (free ones too), so that
    the same layout resumes exactly; other layouts pick the held keys out of it."""
    name, s = p.table.name, p.shard
    table = p.local.hash_tables[name]
    index, k = (s.index, p.num_shards) if p.kind is ShardingKind.ROW_WISE else (0, 1)
    prefix = f"emb/{name}/keys{index}of{k}/{s.col_start}-{s.col_start + s.dim}"
    fields = dict(table_state(p.local, name))
    fields["table_step"] = torch.tensor(table.step, dtype=torch.int64)
    fields.update({f"hash_table.{key}": v for key, v in table.state_dict().items()})
    for field, v in fields.items():
        state[f"{prefix}/{field}"] = v
    return Piece(name, prefix, 0, 0, s.col_start, s.col_start + s.dim, index, k, table.capacity)


# -- load ------------------------------------------------------------------------------------------
def verify_checkpoint(path: str | Path) -> None:
    """Check every file of the checkpoint at `path` against its sha256 in index.json (ValueError naming
    the first damaged or missing one; FileNotFoundError when `path` is not a checkpoint)."""
    reader = _Reader(Path(path))
    for name in reader.files:
        reader.check(name)


def read_extra(path: str | Path) -> Any:
    """The `extra` saved in the checkpoint at `path`, from its index (no data file is read)."""
    return _Reader(Path(path)).extra


def load_rank_state(path: str | Path) -> dict[str, Any] | None:
    """The `rank_state` this rank saved, when the checkpoint was written by a group of this size (None
    otherwise, or when none was saved)."""
    reader = _Reader(Path(path))
    rank, world = _rank_and_world()
    key = f"{RANK_STATE_PREFIX}{rank}"
    if reader.world_size != world or key not in reader:
        return None
    state = reader[key]
    if not isinstance(state, dict):
        raise ValueError(f"load_checkpoint: {path}: {key} is a {type(state).__name__}, not a dict")
    return state


def load_checkpoint_dir(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, verified: bool = False
) -> Any:
    """Read a checkpoint written by `save_checkpoint_dir` (with any number of ranks) into `model` (sharded any way, or
    not at all) and the dense `optimizer`; returns the saved `extra`. Not collective: each rank reads what it holds.

    verified: the caller has just run verify_checkpoint on it (the files' sha256 are not computed again).
    Raises ValueError when a file is damaged (named), or the checkpoint's tables differ from the model's
    (rows, dim, optimizer) or lack part of a table; FileNotFoundError when `path` is not a checkpoint.
    """
    reader = _Reader(Path(path), verified)
    where = str(path)
    collections, placed = holdings(model)
    for p in placed:
        _check_table(p.table, reader.tables.get(p.table.name), where)
    _restore_disk_tiers(reader, placed)  # first: reading the model's state snapshots its disk tiers
    dense = _dense_state(model, collections)
    absent = sorted(k for k in dense if k not in reader)
    if absent:
        raise ValueError(f"load_checkpoint: {where} lacks the dense weights {[k[6:] for k in absent[:5]]}")
    if optimizer is not None and OPTIMIZER_KEY not in reader:
        raise ValueError(f"load_checkpoint: {where} holds no dense optimizer state")
    with torch.no_grad():
        for k, v in dense.items():
            saved = reader[k]
            if not isinstance(saved, torch.Tensor) or saved.shape != v.shape:
                raise ValueError(
                    f"load_checkpoint: {where}: {k[6:]} has shape {getattr(saved, 'shape', None)}, the model {tuple(v.shape)}"
                )
            v.copy_(saved)
    _load_layer_steps(model, reader)
    for p in placed:
        if p.table.dynamic is None:
            mine = [x for x in reader.pieces if x.table == p.table.name and _overlap(x, p.shard)]
            _install_static(p, mine, reader, where)
    _load_dynamic(reader, placed)
    if optimizer is not None:
        # strict=False: a parameter that never had a gradient (a head the run's loss does not train, as
        # HSTU's ranking head under the next-item loss) has no saved state, and gets none: as in the run
        set_optimizer_state_dict(model, optimizer, reader[OPTIMIZER_KEY], options=StateDictOptions(strict=False))
    return reader.extra


def _load_layer_steps(model: nn.Module, reader: _Reader) -> None:
    """The Adam step of a drop-in Embedding / EmbeddingBag is an int of its fused tables: its state dict shows
    it as a fresh tensor, which the copy of the dense state cannot reach, so each layer loads it itself (a
    resumed run's bias correction goes on from the saved step instead of restarting)."""
    for name, m in _unwrap(model).named_modules():
        if isinstance(m, Embedding | EmbeddingBag) and isinstance(m.optimizer, Adam):
            key = f"dense/{name}.optimizer.step" if name else "dense/optimizer.step"
            if key in reader:
                m.load_state_dict({"optimizer.step": reader[key]}, strict=False)


def _restore_disk_tiers(reader: _Reader, placed: list[Placed]) -> None:
    """Every disk-tier table's live file becomes a clone of the checkpoint's snapshot before anything reads
    the model's state: `state_dict()` snapshots each tier, which a tier left unclean by a crash (kill -9
    during a step or a write-back) refuses until exactly this restore has happened."""
    for p in placed:
        if p.table.dynamic is not None:
            continue
        for x in reader.pieces:
            key = f"{x.prefix}/disk_snapshot"
            if x.table == p.table.name and _overlap(x, p.shard) and key in reader:
                _load_scalars(p.local, p.table.name, {"disk_snapshot": reader[key]})
                break


def _check_table(t: TableConfig, saved: TableConfig | None, path: str) -> None:
    if saved is None:
        raise ValueError(f"load_checkpoint: {path} holds no table {t.name!r}")
    for attr in ("num_rows", "dim", "dynamic", "optimizer", "dtype"):
        if getattr(saved, attr) != getattr(t, attr):
            raise ValueError(
                f"load_checkpoint: table {t.name!r} has {attr}={getattr(t, attr)!r} but {path} saved {getattr(saved, attr)!r}"
            )


def _overlap(x: Piece, s: Shard) -> bool:
    rows = max(x.r0, s.row_start) < min(x.r1, s.row_start + s.num_rows)
    cols = max(x.c0, s.col_start) < min(x.c1, s.col_start + s.dim)
    return rows and cols


def _fields(x: Piece, reader: _Reader) -> dict[str, str]:
    """field name -> checkpoint key of every field saved under piece x."""
    return {k[len(x.prefix) + 1 :]: k for k in reader.with_prefix(x.prefix + "/")}


def _install_static(p: Placed, pieces: list[Piece], state: _Reader, path: str) -> None:
    """Assemble this shard's rows x columns of every field from the overlapping pieces and load them."""
    s = p.shard
    r0, r1, c0, c1 = s.row_start, s.row_start + s.num_rows, s.col_start, s.col_start + s.dim
    current = table_state(p.local, p.table.name)
    out = {k: torch.zeros_like(v) for k, v in current.items()}
    covered = torch.zeros(s.num_rows, s.dim, dtype=torch.bool)
    row_weight = torch.zeros(s.num_rows, device=p.local.device)  # column width merged into each row-wise value
    for x in pieces:
        a, b = max(x.r0, r0), min(x.r1, r1)
        lo, hi = max(x.c0, c0), min(x.c1, c1)
        for field, target in out.items():
            key = f"{x.prefix}/{field}"
            if key not in state:
                raise ValueError(
                    f"load_checkpoint: {path} lacks {key!r} (is the optimizer of table {p.table.name!r} the same?)"
                )
            saved = state[key].to(target.device)
            if field in _SCALARS:
                target.copy_(saved)
            elif target.dim() == 2:
                target[a - r0 : b - r0, lo - c0 : hi - c0] = saved[a - x.r0 : b - x.r0, lo - x.c0 : hi - x.c0]
            else:  # row-wise state: width-weighted mean over the column pieces
                target[a - r0 : b - r0] += saved[a - x.r0 : b - x.r0] * (hi - lo)
        covered[a - r0 : b - r0, lo - c0 : hi - c0] = True
        row_weight[a - r0 : b - r0] += hi - lo
    if not bool(covered.all()):
        missing = torch.nonzero(~covered)[0].tolist()
        raise ValueError(
            f"load_checkpoint: {path} lacks row {missing[0] + r0}, column {missing[1] + c0} of table {p.table.name!r}"
        )
    for field, target in out.items():
        if field not in _SCALARS and target.dim() == 1:
            target /= row_weight
    with torch.no_grad():
        for field, target in out.items():
            if field not in _SCALARS:
                current[field].copy_(target)
    _load_scalars(p.local, p.table.name, out)


def _load_dynamic(reader: _Reader, placed: list[Placed]) -> None:
    """Dynamic tables, one saved piece at a time. A shard whose layout was saved as it is (same shard of
    the same number, same columns and capacity) restores it verbatim; any other collects its keys from
    every piece."""
    path = str(reader.path)
    for p in placed:
        if p.table.dynamic is None:
            continue
        name = p.table.name
        saved = sorted((x for x in reader.pieces if x.table == name), key=lambda x: (x.c0, x.keys))
        same = next((x for x in saved if _same_layout(x, p)), None)
        by_columns: dict[tuple[int, int], list[dict[str, torch.Tensor]]] = {}
        for x in [same] if same is not None else saved:
            fields = {f: reader[k] for f, k in _fields(x, reader).items()}
            if same is not None:
                _restore_dynamic(p, fields)
            else:
                by_columns.setdefault((x.c0, x.c1), []).append(_held(fields, p))
        if same is None:
            _install_dynamic(p, by_columns, path)


def _same_layout(x: Piece, p: Placed) -> bool:
    index, k = (p.shard.index, p.num_shards) if p.kind is ShardingKind.ROW_WISE else (0, 1)
    capacity = p.local.hash_tables[p.table.name].capacity
    cols = (p.shard.col_start, p.shard.col_start + p.shard.dim)
    return (x.keys, x.num_shards, x.capacity, (x.c0, x.c1)) == (index, k, capacity, cols)


def _restore_dynamic(p: Placed, fields: dict[str, torch.Tensor]) -> None:
    name = p.table.name
    table = p.local.hash_tables[name]
    table.load_state_dict({k[len("hash_table.") :]: v for k, v in fields.items() if k.startswith("hash_table.")})
    current = table_state(p.local, name)
    with torch.no_grad():
        for field, view in current.items():
            if field not in _SCALARS:
                view.copy_(fields[field])
    _load_scalars(p.local, name, {f: fields[f] for f in current})


# per-table scalars of a table's state: Adam's step, a disk-tier table's snapshot number (its rows stay
# in the snapshot file beside the table's file: hugerec.embedding.disk)
_SCALARS = ("step", "disk_snapshot")


def _load_scalars(local: nn.Module, table: str, fields: dict[str, torch.Tensor]) -> None:
    scalars = {f"tables.{table}.{f}": fields[f] for f in _SCALARS if f in fields}
    if scalars:
        local.load_state_dict(scalars, strict=False)


def _held(fields: dict[str, torch.Tensor], p: Placed) -> dict[str, torch.Tensor]:
    """The saved keys that shard p owns, with their rows' fields; per-table fields kept as they are."""
    keys, rows = fields["hash_table.keys"], fields["hash_table.rows"]
    keep = _owned(keys, p)
    out = {
        "keys": keys[keep],
        "last_step": fields["hash_table.last_step"][keep],
        "count": fields["hash_table.count"][keep],
    }
    capacity = int(fields["weight"].shape[0])
    for f, v in fields.items():
        if f.startswith("hash_table.") or f in ("table_step", "step"):
            continue
        out[f] = v[rows[keep]]
        if p.table.dynamic is not None and p.table.dynamic.missing is Missing.UNKNOWN_ROW:
            out[f"unknown.{f}"] = v[capacity - 1 : capacity]  # the last row is the shared unknown row
    out["table_step"] = fields["table_step"]
    out["sketch"] = fields["hash_table.sketch"]
    if "step" in fields:
        out["step"] = fields["step"]
    return out


def _owned(keys: torch.Tensor, p: Placed) -> torch.Tensor:
    """Which of these keys the shard p holds: all, or those hashing to its index (row-wise)."""
    if p.kind is not ShardingKind.ROW_WISE or p.num_shards == 1:
        return torch.ones_like(keys, dtype=torch.bool)
    return key_shard(keys, p.num_shards) == p.shard.index


PER_TABLE_FIELDS = ("table_step", "sketch", "step")  # collected dynamic fields that are not one value per key


def _merge_columns(parts: list[torch.Tensor], widths: list[int]) -> torch.Tensor:
    """Column pieces of one field -> all columns ([n, D_i] side by side); row-wise state ([n]): the
    width-weighted mean, exact for RowWiseAdagrad's mean of squares."""
    if parts[0].dim() == 2:
        return torch.cat(parts, dim=1)
    return torch.stack([x * w for x, w in zip(parts, widths, strict=True)]).sum(dim=0) / sum(widths)


def _join_columns(
    by_columns: dict[tuple[int, int], list[dict[str, torch.Tensor]]], p: Placed, path: str
) -> dict[str, torch.Tensor]:
    """Collected column groups (each: the held keys of every saved key shard) -> one set of fields over
    all columns, sorted by key. Steps: the largest saved; sketches: the element-wise max (an upper
    bound of every key's count, as each key lived in one shard)."""
    groups = sorted(by_columns.items())
    widths = [c1 - c0 for (c0, c1), _ in groups]
    if sum(widths) != p.table.dim or groups[0][0][0] != 0:
        raise ValueError(
            f"load_checkpoint: {path} lacks columns of dynamic table {p.table.name!r} (has {sorted(by_columns)})"
        )
    joined: list[dict[str, torch.Tensor]] = []
    for _, pieces in groups:
        per_key = [f for f in pieces[0] if f not in PER_TABLE_FIELDS and not f.startswith("unknown.")]
        fields = {f: torch.cat([x[f] for x in pieces]) for f in per_key}
        order = torch.argsort(fields["keys"])
        joined.append({f: v[order] for f, v in fields.items()})
    keys = joined[0]["keys"]
    if any(not torch.equal(g["keys"], keys) for g in joined):
        raise ValueError(
            f"load_checkpoint: {path}: the column pieces of dynamic table {p.table.name!r} hold different keys"
        )
    out = {"keys": keys, "last_step": joined[0]["last_step"], "count": joined[0]["count"]}
    for f in joined[0]:
        if f not in out:
            out[f] = _merge_columns([g[f] for g in joined], widths)
    firsts = [pieces[0] for _, pieces in groups]
    for f in firsts[0]:
        if f.startswith("unknown."):
            out[f] = _merge_columns([x[f] for x in firsts], widths)
    every = [x for _, pieces in groups for x in pieces]
    out["table_step"] = torch.stack([x["table_step"] for x in every]).max()
    # uint16 counters travel as int16 bit patterns (see HashTable.state_dict)
    sketches = np.stack([x["sketch"].numpy().view(np.uint16) for x in every])
    out["sketch"] = torch.from_numpy(sketches.max(axis=0).view(np.int16).copy())
    if "step" in firsts[0]:
        out["step"] = torch.stack([x["step"] for x in every]).max()
    return out


def _install_dynamic(p: Placed, by_columns: dict[tuple[int, int], list[dict[str, torch.Tensor]]], path: str) -> None:
    """Give the collected keys rows 0..n-1 of shard p, with their weights, state and scores."""
    name, s = p.table.name, p.shard
    if not by_columns:
        raise ValueError(f"load_checkpoint: {path} holds no piece of dynamic table {name!r}")
    fields = _join_columns(by_columns, p, path)
    table = p.local.hash_tables[name]
    n = int(fields["keys"].numel())
    if n > table.key_capacity:
        raise ValueError(
            f"load_checkpoint: {path} holds {n} keys of dynamic table {name!r} for a shard of capacity {table.key_capacity}"
        )
    rows = torch.arange(n, dtype=torch.int64)
    table.load(HashTableContents(fields["keys"], rows, fields["last_step"], fields["count"]), sketch=fields["sketch"])
    table.advance_to(max(int(fields["table_step"]), 0))
    cols = slice(s.col_start, s.col_start + s.dim)
    per_row = [f for f in fields if f not in ("keys", "last_step", "count", "weight", *PER_TABLE_FIELDS)]
    opt = {
        f: fields[f][:, cols] if fields[f].dim() == 2 else fields[f] for f in per_row if not f.startswith("unknown.")
    }
    p.local.write_rows(name, rows, fields["weight"][:, cols], opt)
    if table.unknown_row is not None and "unknown.weight" in fields:
        unknown = {f[len("unknown.") :]: fields[f] for f in per_row if f.startswith("unknown.")}
        unknown = {f: v[:, cols] if v.dim() == 2 else v for f, v in unknown.items()}
        p.local.write_rows(name, torch.tensor([table.unknown_row]), fields["unknown.weight"][:, cols], unknown)
    if "step" in fields:
        p.local.load_state_dict({f"tables.{name}.step": fields["step"]}, strict=False)
