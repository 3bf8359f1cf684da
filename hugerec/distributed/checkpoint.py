"""Checkpoints with torch.distributed.checkpoint: save on N ranks, load on M (or in one process).

Every rank writes what it holds, as pieces in global coordinates, so that any other layout can
find what it needs:

    dense/<name>                             dense parameters and buffers (replicated: written once)
    optimizer/...                            the dense optimizer (get_optimizer_state_dict)
    emb/<table>/<r0>-<r1>/<c0>-<c1>/<field>  static tables: rows [r0, r1) x columns [c0, c1) of the
                                             weights and of each optimizer-state field (row-wise state
                                             [n]; a column piece keeps its own), "step" (Adam)
    emb/<table>/keys<i>/<field>              dynamic tables, one piece per saved shard: keys [n], their
                                             rows' weights and state, last_step and count, the unknown
                                             row ("unknown/<field>") and the table's step
    hugerec/index                            JSON: format version, the pieces, the saving plan, `extra`

Loading cuts the pieces to the loader's layout: a static shard reads the pieces overlapping its rows
and columns (row-wise state merged from column pieces is their width-weighted mean, exact for
RowWiseAdagrad's mean of squares); a dynamic shard reads every piece of its table, one at a time,
and keeps the keys it owns (hash(key) % k, or all of them).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from hugerec.distributed.plan import Shard, ShardingKind
from hugerec.distributed.routing import key_shard
from hugerec.distributed.sharded import Placed, ShardedEmbeddingCollection, table_state
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.config import TableConfig
from hugerec.embedding.hash_table import HashTableContents

FORMAT_VERSION = 1
INDEX_KEY = "hugerec/index"


@dataclass(frozen=True)
class Piece:
    """One saved block of a table: rows [r0, r1) x columns [c0, c1) (static) or the keys of shard `keys`."""

    table: str
    prefix: str
    r0: int = 0
    r1: int = 0
    c0: int = 0
    c1: int = 0
    keys: int = -1  # dynamic: index of the saved shard; -1 for static pieces

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _quiet() -> warnings.catch_warnings[None]:
    """DCP warns that it saves in a single process when no group is up: that is the intent there."""
    w = warnings.catch_warnings()
    return w


def _save(state: dict[str, Any], path: str) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=path, no_dist=not _dist())


def _load(state: dict[str, Any], path: str) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=path, no_dist=not _dist())


def _unwrap(model: nn.Module) -> nn.Module:
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) and isinstance(model, nn.parallel.DistributedDataParallel) else model


def _collections(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[Placed]]:
    """(the collections with their module names, every table or shard this process holds)."""
    found: list[tuple[str, nn.Module]] = []
    placed: list[Placed] = []
    for name, m in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix, _ in found):
            continue  # the shard and replica collections inside a sharded one
        if isinstance(m, ShardedEmbeddingCollection):
            found.append((name, m))
            placed.extend(m.placed)
        elif isinstance(m, EmbeddingCollection):
            found.append((name, m))
            for t in m.tables:
                resolved = TableConfig.from_dict({**t.to_dict(), "optimizer": None})
                resolved = _with_optimizer(t, m)
                placed.append(
                    Placed(resolved, Shard(t.name, 0, 0, 0, t.num_rows, 0, t.dim), ShardingKind.TABLE_WISE, m)
                )
    names = [p.table.name for p in placed]
    return found, placed


def _with_optimizer(t: TableConfig, c: EmbeddingCollection) -> TableConfig:
    from dataclasses import replace

    return replace(t, optimizer=t.optimizer or c.optimizer)
