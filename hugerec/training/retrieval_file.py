"""A trained retrieval model (two-tower or matrix factorization) on disk, with its raw ids and training history.

    save_retrieval_model(path, model, users_raw, items_raw, item_counts, (offsets, items), optimizer, extra={...})
    saved = load_retrieval_model(path)     # saved.model, saved.users_raw, saved.items_raw, saved.train_csr

model.pt   torch.save of {"spec": JSON text, "state": state dict, "users_raw": [U] int64, "items_raw": [I] int64,
                          "item_counts": [I] int64, "train_offsets": [U + 1] int64, "train_items": [n] int64}
  spec = {"format": 2, "task": "retrieval", "model_type": "two_tower" | "mf",
          "config": TwoTowerConfig's fields | {"dim", "temperature"}, "num_users": U, "num_items": I,
          "optimizer": the tables' sparse optimizer, ...extra}

Dense user u is raw id users_raw[u], dense item i is items_raw[i]; item_counts[i] is item i's count
in the training data; train_offsets / train_items are each user's training items (CSR), what
recommendations leave out. Only tensors and JSON are stored, read back with weights_only=True after
the zip CRCs are checked; written atomically. Side features and dynamic user tables are not kept in
this format (saving such a model is refused).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hugerec.embedding.optimizers import Optimizer, optimizer_from_dict, optimizer_to_dict
from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.training.checkpoint import atomic_save, read_weights

RETRIEVAL_FORMAT = 2  # 1: the CLI's own file, before the format moved into the library


@dataclass(frozen=True)
class SavedRetrievalModel:
    model: TwoTower | MatrixFactorization  # in eval mode
    model_type: str  # "two_tower" | "mf"
    users_raw: np.ndarray  # [U] raw id of dense user u
    items_raw: np.ndarray  # [I] raw id of dense item i
    item_counts: np.ndarray  # [I] training count per dense item
    train_csr: tuple[np.ndarray, np.ndarray]  # (offsets [U + 1], items): each user's training items
    spec: dict[str, Any]


def _config(model: nn.Module) -> tuple[str, dict[str, Any]]:
    if isinstance(model, TwoTower):
        if model.config.user_features or model.config.item_features:
            raise ValueError("save_retrieval_model: a two-tower model with side features is not saved in this format")
        config = dataclasses.asdict(model.config)
        config["similarity"] = model.config.similarity.value
        return "two_tower", config
    if isinstance(model, MatrixFactorization):
        return "mf", {"dim": model.dim, "temperature": model.temperature}
    raise ValueError(f"save_retrieval_model: need a TwoTower or a MatrixFactorization, got {type(model).__name__}")


def save_retrieval_model(
    path: str | Path,
    model: TwoTower | MatrixFactorization,
    users_raw: np.ndarray,
    items_raw: np.ndarray,
    item_counts: np.ndarray,
    train_csr: tuple[np.ndarray, np.ndarray],
    optimizer: Optimizer,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write `model` with its raw ids, item counts and training items to `path`; `extra`: JSON kept in the spec."""
    model_type, config = _config(model)
    if any(t.dynamic is not None for t in model.user_embedding.tables):
        raise ValueError("save_retrieval_model: a model with a dynamic user table is not saved in this format")
    offsets, items = train_csr
    if len(users_raw) != model.num_users or len(items_raw) != model.num_items or len(item_counts) != model.num_items:
        raise ValueError(
            f"save_retrieval_model: {len(users_raw)} raw user ids, {len(items_raw)} raw item ids and {len(item_counts)} "
            f"counts for {model.num_users} users and {model.num_items} items"
        )
    if len(offsets) != model.num_users + 1 or int(offsets[-1]) != len(items):
        raise ValueError(f"save_retrieval_model: train_csr is not {model.num_users} users' item lists (offsets, items)")
    spec = {
        **dict(extra or {}),
        "format": RETRIEVAL_FORMAT,
        "task": "retrieval",
        "model_type": model_type,
        "config": config,
        "num_users": model.num_users,
        "num_items": model.num_items,
        "optimizer": optimizer_to_dict(optimizer),
    }

    def ints(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, dtype=np.int64))

    obj = {
        "spec": json.dumps(spec),
        "state": model.state_dict(),
        "users_raw": ints(users_raw),
        "items_raw": ints(items_raw),
        "item_counts": ints(item_counts),
        "train_offsets": ints(offsets),
        "train_items": ints(items),
    }
    return atomic_save(obj, path)


def load_retrieval_model(path: str | Path) -> SavedRetrievalModel:
    """ValueError (one line naming the file) when it is damaged or not a retrieval model file."""
    p = Path(path)
    saved = read_weights(p, "load_retrieval_model", "retrieval model file")
    try:
        spec = json.loads(saved["spec"])
        if not isinstance(spec, dict) or spec.get("format") != RETRIEVAL_FORMAT or spec.get("task") != "retrieval":
            raise ValueError(f"its spec is not a retrieval model's (format {RETRIEVAL_FORMAT}, task 'retrieval')")
        users, items, optimizer = int(spec["num_users"]), int(spec["num_items"]), optimizer_from_dict(spec["optimizer"])
        config = spec["config"]
        model: TwoTower | MatrixFactorization
        match spec["model_type"]:
            case "two_tower":
                model = TwoTower(TwoTowerConfig(**config), users, items, optimizer)
            case "mf":
                model = MatrixFactorization(users, items, int(config["dim"]), optimizer, float(config["temperature"]))
            case other:
                raise ValueError(f"model_type {other!r} is not two_tower or mf")
        model.load_state_dict(saved["state"])
        arrays = {k: saved[k].numpy() for k in ("users_raw", "items_raw", "item_counts", "train_offsets", "train_items")}
        if len(arrays["users_raw"]) != users or len(arrays["items_raw"]) != items or len(arrays["train_offsets"]) != users + 1:
            raise ValueError(f"raw ids or training items do not match {users} users and {items} items")
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"load_retrieval_model: {p} is not a hugerec retrieval model file: {' '.join(str(e).split())[:300]}") from None
    model.eval()
    csr = (arrays["train_offsets"], arrays["train_items"])
    return SavedRetrievalModel(
        model, str(spec["model_type"]), arrays["users_raw"], arrays["items_raw"], arrays["item_counts"], csr, spec
    )
