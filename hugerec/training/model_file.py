"""A trained model on disk: `save_model(path, ...)` and `load_model(path)`, the one model format.

    model.pt   torch.save of {"spec": JSON text, "state": the model's state dict (embedding rows included)}
      spec = {"format": 1, "model": ModelConfig as a dict ({"type": "dlrm", ...}), "tables": [TableConfig],
              "num_dense": Dd, "optimizer": the embedding tables' sparse optimizer,
              "schema": the data's schema as JSON (hugerec.data.Schema.to_dict()) or null}

The schema is kept as the JSON it is given (training sits beside data in the layers and does not
read it; `hugerec.data.Schema.from_dict` does). Everything that rebuilds the model is plain JSON; the tensors load with weights_only=True after the
file's zip CRCs are checked, so loading a model file cannot run code and a damaged one is named in a
one-line ValueError. Written atomically (a crash leaves the old file or the new one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hugerec.embedding.optimizers import Optimizer, optimizer_from_dict, optimizer_to_dict
from hugerec.embedding.table_config import TableConfig
from hugerec.models.model import RecModel
from hugerec.models.model_config import ModelConfig, build_model, model_config_from_dict, model_config_to_dict
from hugerec.training.checkpoint import atomic_save, read_weights

MODEL_FORMAT = 1


@dataclass(frozen=True)
class SavedModel:
    """A model read back by `load_model`, with what built it."""

    model: RecModel
    config: ModelConfig
    tables: tuple[TableConfig, ...]
    optimizer: Optimizer
    schema: dict[str, Any] | None  # as saved: hugerec.data.Schema.from_dict(schema) rebuilds it


def save_model(
    path: str | Path,
    model: RecModel,
    config: ModelConfig,
    tables: Sequence[TableConfig],
    optimizer: Optimizer,
    schema: Mapping[str, Any] | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write `model` (built by `hugerec.models.build_model(config, tables, model.num_dense, optimizer)`)
    and, optionally, the schema of its data (`Schema.to_dict()`, any JSON object) to `path`.

    state: the weights to write instead of the model's own (e.g. an earlier evaluation's best), with
    the keys of `model.state_dict()`."""
    spec = {
        "format": MODEL_FORMAT,
        "model": model_config_to_dict(config),
        "tables": [t.to_dict() for t in tables],
        "num_dense": model.num_dense,
        "optimizer": optimizer_to_dict(optimizer),
        "schema": None if schema is None else dict(schema),
    }
    weights = model.state_dict() if state is None else dict(state)
    if weights.keys() != model.state_dict().keys():
        raise ValueError("save_model: state must have the keys of the model's state_dict")
    return atomic_save({"spec": json.dumps(spec), "state": weights}, path)


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> SavedModel:
    """Rebuild the model saved at `path` and load its weights.

    FileNotFoundError when there is no file; ValueError, one line naming the file, when it is damaged,
    not a model file, of another format, or its weights do not fit the model its spec describes.
    """
    p = Path(path)
    saved = read_weights(p, "load_model", "model file", map_location)
    try:
        spec = json.loads(saved["spec"])
        if not isinstance(spec, dict):
            raise TypeError(f"spec is a {type(spec).__name__}")
        if spec.get("format") != MODEL_FORMAT:
            raise ValueError(f"model format {spec.get('format')!r}, this hugerec reads {MODEL_FORMAT}")
        config = model_config_from_dict(spec["model"])
        tables = tuple(TableConfig.from_dict(t) for t in spec["tables"])
        optimizer = optimizer_from_dict(spec["optimizer"])
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise TypeError(f"schema is a {type(schema).__name__}")
        model = build_model(config, tables, int(spec["num_dense"]), optimizer)
        state: Any = saved["state"]
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise ValueError(f"load_model: {p} is not a hugerec model file: {' '.join(str(e).split())}") from None
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as e:
        first = str(e).strip().splitlines()
        raise ValueError(
            f"load_model: the weights in {p} do not fit the model its spec describes: {first[0] if first else e}"
        ) from None
    return SavedModel(model, config, tables, optimizer, schema)
