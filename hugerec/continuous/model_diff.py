"""What changed between the serving model and a candidate of the same shape: the rows a version delta carries.

    stable rows (keys [R_s], rows [R_s, D]) vs candidate rows (keys [R_c], rows [R_c, D]), per table, as export
    writes them (dynamic tables: every key holding a row; static tables: row ids 0..R-1):
        rows     candidate keys that are new, or whose row differs bit for bit     -> TableUpdate.keys / rows
        deleted  stable keys the candidate no longer holds (evicted ids)           -> TableUpdate.deleted
        default  the candidate's shared unknown row, when it differs               -> TableUpdate.default
    dense weights: the candidate's state dict without its embedding collections (what the dense program reads)

Applied to the stable version's rows, the delta gives exactly the rows a whole bundle of the candidate holds
(tests/continuous/test_publish_delta.py checks the answers of both versions against each other).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.delta import collect_delta
from hugerec.models.model import RecModel
from hugerec.serving.bundles.version_delta import write_version_delta
from hugerec.serving.store.parameter_server import TableUpdate

TableRows = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # keys [R] sorted, rows [R, D] fp32, default [D] | None


def table_rows(model: RecModel) -> dict[str, TableRows]:
    """Every table's rows as a bundle of `model` would hold them, keys sorted."""
    out: dict[str, TableRows] = {}
    for c in model.embedding_collections():
        for d in collect_delta(c, since=-1):
            keys, rows = d.keys.numpy(), d.vectors.to(torch.float32).numpy()
            order = np.argsort(keys, kind="stable")
            out[d.table] = (keys[order], rows[order], None if d.unknown is None else d.unknown.vector.numpy())
        for t in c.tables:
            if t.dynamic is None:
                rows = c.table_weight(t.name).detach().float().cpu().numpy()
                out[t.name] = (np.arange(t.num_rows, dtype=np.int64), rows, None)
    return out


def _bits(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows, dtype=np.float32).view(np.int32)


def diff_rows(stable: dict[str, TableRows], candidate: dict[str, TableRows]) -> list[TableUpdate]:
    """One TableUpdate per table: the candidate's new and changed rows, the stable keys it lost, its default."""
    if set(stable) != set(candidate):
        raise ValueError(f"diff_rows: the models have other tables: {sorted(stable)} vs {sorted(candidate)}")
    updates = []
    for name, (kc, rc, dc) in candidate.items():
        ks, rs, ds = stable[name]
        if rs.shape[1] != rc.shape[1]:
            raise ValueError(f"diff_rows: table {name!r} has dim {rs.shape[1]} in the stable model, {rc.shape[1]} now")
        pos = np.minimum(np.searchsorted(ks, kc), max(ks.shape[0] - 1, 0))
        found = ks[pos] == kc if ks.shape[0] else np.zeros(kc.shape[0], dtype=bool)
        same = found.copy()
        if ks.shape[0]:
            same[found] = (_bits(rs[pos[found]]) == _bits(rc[found])).all(axis=1)
        changed = ~same
        deleted = ks[~np.isin(ks, kc, assume_unique=True)]
        default = dc if dc is not None and (ds is None or not np.array_equal(_bits(dc), _bits(ds))) else None
        updates.append(TableUpdate(name, kc[changed], rc[changed], deleted, default))
    return updates


def dense_weights(model: RecModel) -> dict[str, torch.Tensor]:
    """The model's state dict without its embedding collections' entries (rows, optimizer state, hash tables)."""
    prefixes = tuple(f"{n}." for n, m in model.named_modules() if isinstance(m, EmbeddingCollection) and n)
    return {k: v for k, v in model.state_dict().items() if not k.startswith(prefixes)}


def write_model_delta(stable: RecModel, candidate: RecModel, path: str | Path, base_version: str, base_id: str) -> Path:
    """The version delta that turns the served `stable` (content id `base_id`) into `candidate` (version_delta.py)."""
    updates = diff_rows(table_rows(stable), table_rows(candidate))
    return write_version_delta(path, base_version, base_id, updates, dense_weights(candidate))
