"""A trained model on disk, every family: `save_model(path, ...)` and `load_model(path)`, the one model format.

    save_model("model.pt", model, DLRMConfig(...), optimizer, tables=tables, schema=schema.to_dict())   # ranking
    save_model("model.pt", two_tower, config, optimizer, ids=RawIds(items_raw, counts, users_raw, csr))  # retrieval
    save_model("model.pt", sasrec, SASRecConfig(...), optimizer, ids=RawIds(items_raw, counts))       # sequential (HSTU too)
    save_model("model.txt", trees, LightGBMConfig(...), schema=..., extra={"best_round": 120})        # trees
    saved = load_model(path)      # saved.model, saved.config, saved.family, saved.ids, saved.schema, ...

Deep models (ranking, retrieval, sequential): `model.pt`, a torch.save of
    {"spec": JSON text, "state": the state dict (embedding rows included), "ids.<name>": int64 tensors}
    spec = {"format": 3, "family": "ranking" | "retrieval" | "sequential",
            "model": the registry config as a dict ({"type": "dlrm", ...}), "optimizer": the tables' sparse
            optimizer, "tables": [TableConfig] (ranking), "num_dense": Dd, "num_users": U, "num_items": I,
            "schema": the data's schema as JSON (hugerec.data.Schema.to_dict()) or null, "extra": JSON}
    ids (retrieval and sequential): items [I] (the raw id of each dense item: retrieval's dense item i is
    items[i], sequential's is items[i - 1], 0 being the padding id), item_counts (training events per dense
    id: [I], or [I + 1] with 0 at the padding id), and for retrieval users [U] and each user's training
    items as CSR (train_offsets [U + 1], train_items), what recommendations leave out.
A sequential model's item table is always rebuilt in memory (`item_table`): one trained with its item
table on disk (storage = "disk") is written with that table's rows and optimizer state in the file, not
the snapshot number a ranking model's disk tables keep (their files then stay beside the model file).
Trees: the library's own file (LightGBM's text model `model.txt`, XGBoost's JSON `model.json`: what
serving's forest reads) and beside it `model.meta.json`: {"format": 3, "family": "trees", "model": the
config, "library_version", "schema", "extra"}.

The schema is kept as the JSON it is given (training sits beside data in the layers and does not read
it; `hugerec.data.Schema.from_dict` does). Everything that rebuilds a model is plain JSON; the tensors
load with weights_only=True after the file's zip CRCs are checked, so loading a model file cannot run
code. A damaged file, a file of another kind, a model of another family than asked for, or weights that
do not fit the model the spec describes are one-line ValueErrors naming the file. Written atomically (a
crash leaves the old file or the new one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Optimizer, optimizer_from_dict, optimizer_to_dict
from hugerec.embedding.table_config import TableConfig
from hugerec.models.gbm import TreeModel, library_of, require
from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.mf import MatrixFactorization, MFConfig
from hugerec.models.registry import (
    Family,
    ModelConfig,
    build_model,
    check_built_from,
    config_from_dict,
    config_to_dict,
    type_of,
)
from hugerec.models.sequence import PAD, SequenceConfig, SequenceModelConfig
from hugerec.models.two_tower import TwoTower
from hugerec.training.checkpoint import atomic_save, read_weights

MODEL_FORMAT = 3  # 1: ranking only (still read); 2: the separate retrieval / sequential files (refused)
TREE_SUFFIXES = (".txt", ".json")  # the libraries' own model files; the description sits beside them
META_SUFFIX = ".meta.json"


@dataclass(frozen=True, eq=False)
class RawIds:
    """The raw ids behind a retrieval or sequential model's dense ones, and what its training data held.

    items        [I] raw id of each dense item (retrieval: dense i -> items[i]; sequential: i -> items[i - 1])
    item_counts  training events per dense id: retrieval [I]; sequential [I + 1] (0 at the padding id)
    users        retrieval: [U] raw id of each dense user
    train_csr    retrieval: each user's training items (offsets [U + 1], dense items), what recommend excludes
    train_times  retrieval, optional: the event time (int64 seconds) of each item of train_csr, beside it
                 (each user's times in order): the pipeline's interaction store keeps them for a next-items
                 model trained with times. Files written before it have none (None).
    """

    items: np.ndarray
    item_counts: np.ndarray
    users: np.ndarray | None = None
    train_csr: tuple[np.ndarray, np.ndarray] | None = None
    train_times: np.ndarray | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"items": self.items, "item_counts": self.item_counts}
        if self.users is not None:
            out["users"] = self.users
        if self.train_csr is not None:
            out["train_offsets"], out["train_items"] = self.train_csr
        if self.train_times is not None:
            out["train_times"] = self.train_times
        return {f"ids.{k}": torch.from_numpy(np.array(v, dtype=np.int64)) for k, v in out.items()}

    @staticmethod
    def from_tensors(saved: Mapping[str, Any]) -> RawIds | None:
        if "ids.items" not in saved:
            return None
        arrays = {k[4:]: v.numpy() for k, v in saved.items() if k.startswith("ids.")}
        csr = (arrays["train_offsets"], arrays["train_items"]) if "train_offsets" in arrays else None
        times = arrays.get("train_times")
        if times is not None and (csr is None or times.shape != csr[1].shape):
            raise ValueError(f"ids.train_times holds {times.shape[0]} times for {0 if csr is None else len(csr[1])} training items")
        return RawIds(arrays["items"], arrays["item_counts"], arrays.get("users"), csr, times)


@dataclass(frozen=True)
class SavedModel:
    """A model read back by `load_model`, with what built it."""

    path: Path
    model: nn.Module | TreeModel  # deep models in eval mode
    config: ModelConfig
    optimizer: Optimizer | None  # the tables' sparse optimizer (None: trees)
    tables: tuple[TableConfig, ...] = ()  # ranking: the tables build_model took
    schema: dict[str, Any] | None = None  # as saved: hugerec.data.Schema.from_dict(schema) rebuilds it
    ids: RawIds | None = None  # retrieval and sequential
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> Family:
        return type_of(self.config).family

    @property
    def model_type(self) -> str:
        return type_of(self.config).name

    @property
    def num_items(self) -> int:
        """The catalogue's size (retrieval and sequential models)."""
        return len(self._ids().items)

    @property
    def items_raw(self) -> np.ndarray:
        """ids.items: the raw id of each dense item (retrieval and sequential models)."""
        return self._ids().items

    @property
    def item_counts(self) -> np.ndarray:
        """ids.item_counts: training events per dense id (retrieval and sequential models)."""
        return self._ids().item_counts

    @property
    def max_len(self) -> int:
        """The longest history a sequential model reads (longer ones keep their last max_len items)."""
        return int(self._sequence_config().max_len)

    def lookup(self, raw: np.ndarray) -> np.ndarray:
        """[N] raw item ids -> [N] dense ids of a sequential model, PAD (0) where it does not know the id."""
        self._sequence_config()
        items = self._ids().items
        raw = np.asarray(raw, dtype=np.int64)
        if not len(items):
            return np.zeros(len(raw), dtype=np.int64)
        pos = np.clip(np.searchsorted(items, raw), 0, len(items) - 1)
        return np.where(items[pos] == raw, pos + 1, PAD).astype(np.int64)

    def _ids(self) -> RawIds:
        if self.ids is None:
            raise ValueError(f"{self.path} holds a {self.model_type!r} model ({self.family.value}): it has no item catalogue")
        return self.ids

    def _sequence_config(self) -> SequenceConfig:
        cfg = getattr(self.model, "cfg", None)
        if self.family is not Family.SEQUENTIAL or not isinstance(cfg, SequenceConfig):
            raise ValueError(f"{self.path} holds a {self.model_type!r} model ({self.family.value}), not a sequential one")
        return cfg


def save_model(
    path: str | Path,
    model: nn.Module | TreeModel,
    config: ModelConfig,
    optimizer: Optimizer | None = None,
    *,
    tables: Sequence[TableConfig] = (),
    schema: Mapping[str, Any] | None = None,
    ids: RawIds | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write `model` (built by `hugerec.models.build_model(config, ...)`, or trees of `config`'s library)
    to `path`. Ranking: `tables` as build_model took them; retrieval and sequential: `ids`; `schema`: the
    data's schema (`Schema.to_dict()`, any JSON object), optional; `extra`: JSON kept beside."""
    family = type_of(config).family
    meta: dict[str, Any] = {
        "format": MODEL_FORMAT,
        "family": family.value,
        "model": config_to_dict(config),
        "schema": None if schema is None else dict(schema),
        "extra": dict(extra or {}),
    }
    if family is Family.TREES:
        if not isinstance(model, TreeModel) or model.library is not library_of(config):  # type: ignore[arg-type]
            raise ValueError(f"save_model: a {type_of(config).name!r} config needs its library's trees, got {type(model).__name__}")
        return _save_trees(Path(path), model, meta)
    try:
        check_built_from(model, config)
    except ValueError as e:
        raise ValueError(f"save_model: {e}") from None
    assert isinstance(model, nn.Module)  # the class of a deep family's type
    if optimizer is None:
        raise ValueError("save_model: give the sparse optimizer the model's tables were built with")
    meta["optimizer"] = optimizer_to_dict(optimizer)
    obj: dict[str, Any] = {"state": model.state_dict()}
    match family:
        case Family.RANKING:
            meta |= {"tables": [t.to_dict() for t in tables], "num_dense": int(model.num_dense)}  # type: ignore[arg-type]
        case Family.RETRIEVAL:
            meta |= _retrieval_sizes(model, config, ids)
            obj |= ids.tensors()  # type: ignore[union-attr]  # checked by _retrieval_sizes
        case Family.SEQUENTIAL:
            meta |= _sequential_sizes(model, config, ids)
            _disk_rows_into_state(model, obj["state"])
            obj |= ids.tensors()  # type: ignore[union-attr]  # checked by _sequential_sizes
    obj["spec"] = json.dumps(meta)
    written = atomic_save(obj, path)
    _pin_disk_snapshots(model, obj["state"], written)
    return written


def _pin_disk_snapshots(model: nn.Module, state: Mapping[str, Any], holder: Path) -> None:
    """A disk-tier table's rows stay in its snapshot, which the state names: keep it while the file exists."""
    for name, m in model.named_modules():
        if isinstance(m, EmbeddingCollection) and m.has_disk_tables:
            prefix = f"{name}." if name else ""
            for t in m.tables:
                key = f"{prefix}tables.{t.name}.disk_snapshot"
                if key in state:
                    m.pin_disk_snapshot(t.name, int(state[key]), holder)


def _disk_rows_into_state(model: nn.Module, state: dict[str, Any]) -> None:
    """A sequential model loads rebuilt from its config, with the item table in memory (`item_table`): a
    disk-tier item table's rows and optimizer state go into `state` as that in-memory table's tensors, in
    place of the snapshot number a checkpoint keeps, so the file holds the whole model on its own (the
    catalogue is read into memory once, as serving holds it)."""
    for name, m in model.named_modules():
        if isinstance(m, EmbeddingCollection) and m.has_disk_tables:
            prefix = f"{name}." if name else ""
            for t in m.tables:
                if state.pop(f"{prefix}tables.{t.name}.disk_snapshot", None) is None:
                    continue
                weight, optimizer_state = m.read_rows(t.name, torch.arange(t.num_rows))  # [R, D], {name: [R, ...]}
                state[f"{prefix}tables.{t.name}.weight"] = weight
                state.update({f"{prefix}tables.{t.name}.{k}": v for k, v in optimizer_state.items()})


def _retrieval_sizes(model: nn.Module, config: ModelConfig, ids: RawIds | None) -> dict[str, int]:
    if not isinstance(model, TwoTower | MatrixFactorization):
        raise ValueError(f"save_model: a retrieval config needs a TwoTower or a MatrixFactorization, got {type(model).__name__}")
    if isinstance(model, TwoTower) and (model.config.user_features or model.config.item_features):
        raise ValueError("save_model: a two-tower model with side features is not saved yet (the features are not in the file)")
    if any(t.dynamic is not None for t in model.user_embedding.tables):
        raise ValueError("save_model: a model with a dynamic user table is not saved yet")
    built = model.config if isinstance(model, TwoTower) else MFConfig(model.dim, model.temperature)
    mine = config if isinstance(model, TwoTower) else MFConfig(config.dim, config.temperature)  # type: ignore[union-attr]
    if built != mine:
        raise ValueError(f"save_model: the model was built from another config than {type(config).__name__}: {built}")
    users, items = model.num_users, model.num_items
    if ids is None or ids.users is None or ids.train_csr is None:
        raise ValueError("save_model: a retrieval model needs ids=RawIds(items, item_counts, users, train_csr)")
    offsets, train_items = ids.train_csr
    if len(ids.users) != users or len(ids.items) != items or len(ids.item_counts) != items:
        raise ValueError(
            f"save_model: {len(ids.users)} raw user ids, {len(ids.items)} raw item ids and {len(ids.item_counts)} "
            f"counts for {users} users and {items} items"
        )
    if len(offsets) != users + 1 or int(offsets[-1]) != len(train_items):
        raise ValueError(f"save_model: train_csr is not {users} users' item lists (offsets, items)")
    times = ids.train_times
    if times is not None and (np.shape(times) != np.shape(train_items) or np.asarray(times).dtype.kind not in "iu"):
        raise ValueError(f"save_model: train_times must be integer seconds, one per item of train_csr ({len(train_items)}), got {np.asarray(times).dtype} {list(np.shape(times))}")
    return {"num_users": users, "num_items": items}


def _sequential_sizes(model: nn.Module, config: ModelConfig, ids: RawIds | None) -> dict[str, int]:
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, SequenceConfig) or not isinstance(config, SequenceModelConfig):
        raise ValueError(f"save_model: a sequential config needs a SASRec / MaskedTransformer / GRU4Rec / HSTU, got {type(model).__name__}")
    if config.sequence_config(cfg.num_items, cfg.dynamic) != cfg:
        raise ValueError(f"save_model: the model's {cfg} was not built from {config}")
    if isinstance(model, HSTU) and isinstance(config, HSTUConfig) and model.options != config.options():
        raise ValueError(f"save_model: the HSTU's {model.options} was not built from {config}")
    if cfg.dynamic is not None:
        raise ValueError("save_model: a sequential model with a dynamic item table is not saved yet")
    if ids is None or len(ids.items) != cfg.num_items or len(ids.item_counts) != cfg.num_items + 1:
        got = "none" if ids is None else f"{len(ids.items)} raw ids and {len(ids.item_counts)} counts"
        raise ValueError(f"save_model: a sequential model of {cfg.num_items} items needs ids with I raw ids and I + 1 counts, got {got}")
    return {"num_items": cfg.num_items}


def _save_trees(path: Path, model: TreeModel, meta: dict[str, Any]) -> Path:
    if path.suffix not in TREE_SUFFIXES:
        raise ValueError(f"save_model: trees are saved in their library's format: {path} must end in .txt or .json")
    meta["library_version"] = str(require(model.library).__version__)
    tmp = path.parent / f".{path.stem}.tmp{path.suffix}"  # XGBoost picks its format by the suffix
    model.save(tmp)
    os.replace(tmp, path)
    meta_path = path.with_suffix(META_SUFFIX)
    tmp_meta = meta_path.parent / f".{meta_path.name}.tmp"
    tmp_meta.write_text(json.dumps(meta, indent=1, default=str) + "\n")
    os.replace(tmp_meta, meta_path)
    return path


def load_model(path: str | Path, family: Family | None = None, map_location: str | torch.device = "cpu") -> SavedModel:
    """Rebuild the model saved at `path` and load its weights (trees: the library reads its file).

    FileNotFoundError when there is no file; ValueError, one line naming the file, when it is damaged, not
    a model file, of another format, of another family than `family`, or its weights do not fit the model
    its spec describes."""
    p = Path(path)
    saved = _load_trees(p) if p.suffix in TREE_SUFFIXES else _load_deep(p, map_location)
    if family is not None and saved.family is not family:
        raise ValueError(f"load_model: {p} holds a {saved.model_type!r} model ({saved.family.value}), not a {family.value} one")
    return saved


def _load_deep(p: Path, map_location: str | torch.device) -> SavedModel:
    saved = read_weights(p, "load_model", "model file", map_location)
    try:
        spec = json.loads(saved["spec"])
        if not isinstance(spec, dict):
            raise TypeError(f"spec is a {type(spec).__name__}")
        if spec.get("format") == 1 and "task" not in spec:  # the ranking-only format before every family shared it
            spec = {**spec, "family": Family.RANKING.value, "extra": {}}
        elif spec.get("format") != MODEL_FORMAT:
            task = f" {spec['task']}" if "task" in spec else ""
            raise ValueError(f"model format {spec.get('format')!r}{task}, this hugerec reads {MODEL_FORMAT}: train it again")
        config = config_from_dict(spec["model"])
        family = type_of(config).family
        if family.value != spec.get("family") or family is Family.TREES:
            raise ValueError(f"family {spec.get('family')!r} does not fit model type {type_of(config).name!r}")
        optimizer = optimizer_from_dict(spec["optimizer"])
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise TypeError(f"schema is a {type(schema).__name__}")
        tables = tuple(TableConfig.from_dict(t) for t in spec.get("tables", ()))
        model = build_model(
            config,
            tables,
            int(spec.get("num_dense", 0)),
            optimizer,
            num_users=int(spec.get("num_users", 0)),
            num_items=int(spec.get("num_items", 0)),
        )
        ids = RawIds.from_tensors(saved)
        state: Any = saved["state"]
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise ValueError(f"load_model: {p} is not a hugerec model file: {' '.join(str(e).split())[:300]}") from None
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as e:
        first = str(e).strip().splitlines()
        raise ValueError(
            f"load_model: the weights in {p} do not fit the model its spec describes: {first[0] if first else e}"
        ) from None
    model.eval()
    return SavedModel(p, model, config, optimizer, tables, schema, ids, dict(spec.get("extra") or {}))


def _load_trees(p: Path) -> SavedModel:
    meta_path = p.with_suffix(META_SUFFIX)
    if not p.is_file():
        raise FileNotFoundError(f"load_model: no model at {p}")
    if not meta_path.is_file():
        raise ValueError(f"load_model: {p} has no {meta_path.name} beside it (the description `save_model` writes)")
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT or meta.get("family") != Family.TREES.value:
            raise ValueError(f"not a format-{MODEL_FORMAT} description of trees")
        config = config_from_dict(meta["model"])
        if type_of(config).family is not Family.TREES:
            raise ValueError(f"model type {type_of(config).name!r} is not trees")
        schema = meta.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise TypeError(f"schema is a {type(schema).__name__}")
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise ValueError(f"load_model: {meta_path} is not a hugerec model description: {' '.join(str(e).split())[:300]}") from None
    trees = TreeModel.load(p, library_of(config), threads=0)  # type: ignore[arg-type]  # a trees config
    return SavedModel(p, trees, config, None, (), schema, None, dict(meta.get("extra") or {}))
