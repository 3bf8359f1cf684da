"""A trained sequential model (SASRec, masked transformer, GRU4Rec, HSTU) on disk, with its raw item ids.

    save_sequence_model(path, model, "sasrec", items_raw, item_counts, optimizer, extra={"model": {...}})
    saved = load_sequence_model(path)      # saved.model, saved.items_raw, saved.lookup(raw ids) -> dense ids

model.pt   torch.save of {"spec": JSON text, "state": state dict, "items_raw": [I] int64, "item_counts": [I + 1] int64}
  spec = {"format": 1, "task": "sequential", "model_type": "sasrec" | "mlm" | "gru4rec" | "hstu",
          "sequence_config": SequenceConfig's fields, "optimizer": the item table's sparse optimizer,
          "hstu_options": HSTUOptions' fields (HSTU only), ...extra}

Dense item id i (1..I) is raw id items_raw[i - 1]; item_counts[i] is its count in the training data
(index 0, the padding id, is 0): the popularity fallback for a history with no known item. Only
tensors and JSON are stored, read back with weights_only=True after the zip CRCs are checked; written
atomically.
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
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, HSTUOptions
from hugerec.models.masked import MaskedTransformer
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import PAD, SequenceConfig
from hugerec.training.checkpoint import atomic_save, read_weights

SEQUENCE_FORMAT = 1
SEQUENCE_MODELS: dict[str, type[SASRec] | type[MaskedTransformer] | type[GRU4Rec] | type[HSTU]] = {
    "sasrec": SASRec,
    "mlm": MaskedTransformer,
    "gru4rec": GRU4Rec,
    "hstu": HSTU,
}


def build_sequence_model(model_type: str, cfg: SequenceConfig, optimizer: Optimizer, hstu_options: HSTUOptions | None = None) -> nn.Module:
    cls = SEQUENCE_MODELS.get(model_type)
    if cls is None:
        raise ValueError(f"sequential model type must be one of {list(SEQUENCE_MODELS)}, got {model_type!r}")
    if cls is HSTU:
        return HSTU(cfg, optimizer, hstu_options)
    return cls(cfg, optimizer)


@dataclass(frozen=True)
class SavedSequenceModel:
    model: nn.Module  # SASRec | MaskedTransformer | GRU4Rec, in eval mode
    model_type: str
    items_raw: np.ndarray  # [I] raw id of dense item i at i - 1, sorted
    item_counts: np.ndarray  # [I + 1] training count per dense id (0 at PAD)
    spec: dict[str, Any]

    @property
    def num_items(self) -> int:
        return len(self.items_raw)

    @property
    def max_len(self) -> int:
        """The longest history the model reads (longer ones keep their last max_len items)."""
        return int(self.spec["sequence_config"]["max_len"])

    def lookup(self, raw: np.ndarray) -> np.ndarray:
        """[N] raw item ids -> [N] dense ids, PAD (0) where the model does not know the id."""
        raw = np.asarray(raw, dtype=np.int64)
        if not len(self.items_raw):
            return np.zeros(len(raw), dtype=np.int64)
        pos = np.clip(np.searchsorted(self.items_raw, raw), 0, len(self.items_raw) - 1)
        return np.where(self.items_raw[pos] == raw, pos + 1, PAD).astype(np.int64)


def save_sequence_model(
    path: str | Path,
    model: nn.Module,
    model_type: str,
    items_raw: np.ndarray,
    item_counts: np.ndarray,
    optimizer: Optimizer,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, SequenceConfig) or model_type not in SEQUENCE_MODELS:
        raise ValueError(f"save_sequence_model: need a SASRec / MaskedTransformer / GRU4Rec / HSTU and its type, got {type(model).__name__}, {model_type!r}")
    if cfg.dynamic is not None:
        raise ValueError("save_sequence_model: models with a dynamic item table are not saved in this format")
    if len(items_raw) != cfg.num_items or len(item_counts) != cfg.num_items + 1:
        raise ValueError(
            f"save_sequence_model: {len(items_raw)} raw ids and {len(item_counts)} counts for {cfg.num_items} items (need I and I + 1)"
        )
    spec = {
        **dict(extra or {}),
        "format": SEQUENCE_FORMAT,
        "task": "sequential",
        "model_type": model_type,
        "sequence_config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "dynamic"},
        "optimizer": optimizer_to_dict(optimizer),
        **({"hstu_options": dataclasses.asdict(model.options)} if isinstance(model, HSTU) else {}),
    }
    return atomic_save(
        {
            "spec": json.dumps(spec),
            "state": model.state_dict(),
            "items_raw": torch.from_numpy(np.array(items_raw, dtype=np.int64)),
            "item_counts": torch.from_numpy(np.array(item_counts, dtype=np.int64)),
        },
        path,
    )


def load_sequence_model(path: str | Path) -> SavedSequenceModel:
    """ValueError (one line naming the file) when it is damaged or not a sequential model file."""
    p = Path(path)
    saved = read_weights(p, "load_sequence_model", "sequential model file")
    try:
        spec = json.loads(saved["spec"])
        if not isinstance(spec, dict) or spec.get("format") != SEQUENCE_FORMAT or spec.get("task") != "sequential":
            raise ValueError("its spec is not a sequential model's (format 1, task 'sequential')")
        cfg = SequenceConfig(**spec["sequence_config"])
        options = HSTUOptions(**spec["hstu_options"]) if spec["model_type"] == "hstu" else None
        model = build_sequence_model(str(spec["model_type"]), cfg, optimizer_from_dict(spec["optimizer"]), options)
        model.load_state_dict(saved["state"])
        items_raw, counts = saved["items_raw"].numpy(), saved["item_counts"].numpy()
        if len(items_raw) != cfg.num_items or len(counts) != cfg.num_items + 1:
            raise ValueError(f"{len(items_raw)} raw ids and {len(counts)} counts for {cfg.num_items} items")
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"load_sequence_model: {p} is not a hugerec sequential model file: {' '.join(str(e).split())[:300]}") from None
    model.eval()
    return SavedSequenceModel(model, str(spec["model_type"]), items_raw, counts, spec)
