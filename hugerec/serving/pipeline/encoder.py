"""UserEncoder: the retrieval model's user tower, run online for one user and their recent history.

    encoder = UserEncoder(two_tower)                  # or a MatrixFactorization
    vec = encoder.encode(user=17, history=items)      # -> [D] float32, or None when the model cannot place the user

Ids: the model's own ids are dense (users 0..U-1, items 0..I-1); `users_raw` / `items_raw` (dense id
-> raw id, as `hugerec train` keeps them) make the encoder speak raw ids: the pipeline, its feature
tables and its index then use raw ids throughout. Without them raw ids are the dense ids.

On disk (the pipeline bundle's retrieval/encoder.pt): {"spec": JSON {"type": "two_tower", "config": ...,
"num_users", "num_items"} or {"type": "mf", ...}, "state": the state dict, "users_raw", "items_raw"}; tensors only, read back
with weights_only=True. Two-towers with static side features are refused: their feature buffers
come from the training data, not from the feature store.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hugerec.embedding.optimizers import SGD
from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.checkpoint import atomic_save, read_weights

RetrievalModel = TwoTower | MatrixFactorization


class UserEncoder:
    def __init__(self, model: RetrievalModel, users_raw: np.ndarray | None = None, items_raw: np.ndarray | None = None) -> None:
        if isinstance(model, TwoTower) and (model.config.user_features or model.config.item_features):
            raise ValueError("UserEncoder: two-towers with static side features cannot be served in a pipeline yet")
        self.model = model.eval()
        self.num_users = model.num_users
        self.num_items = model.num_items
        self.users_raw = np.arange(model.num_users, dtype=np.int64) if users_raw is None else np.asarray(users_raw, np.int64)
        self.items_raw = np.arange(model.num_items, dtype=np.int64) if items_raw is None else np.asarray(items_raw, np.int64)
        for what, raw, n in (("users_raw", self.users_raw, self.num_users), ("items_raw", self.items_raw, self.num_items)):
            if raw.shape != (n,) or np.unique(raw).shape[0] != n:
                raise ValueError(f"UserEncoder: {what} must hold {n} distinct ids (one per row of the model), got shape {raw.shape}")
        self._user_order = np.argsort(self.users_raw, kind="stable")
        self._item_order = np.argsort(self.items_raw, kind="stable")
        # the user tower's tables as plain arrays: one request pools a few rows and runs the MLP, without
        # the embedding collection's batch machinery (model.user_vectors is the reference in the tests)
        uses_id = not isinstance(model, TwoTower) or model.config.use_user_id
        names = ["user_id"] if uses_id else []
        if isinstance(model, TwoTower) and model.config.max_history:
            names.append("history")
        if any(t.dynamic is not None for t in model.user_embedding.tables if t.name in names):
            raise ValueError("UserEncoder: a user table with raw (dynamic) keys cannot be served in a pipeline yet")
        with torch.no_grad():
            self._tables = {n: model.user_embedding.table_weight(n).detach().float().numpy() for n in names}
        self.dim = model.dim
        self._uses_id = not isinstance(model, TwoTower) or model.config.use_user_id
        self._uses_history = isinstance(model, TwoTower) and model.config.max_history > 0
        # the most recent items `encode` reads: the user tower's max_history (its recent windows lie inside it; 0: none)
        self.history_read = model.config.max_history if isinstance(model, TwoTower) else 0

    @staticmethod
    def _dense(raw: np.ndarray, order: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """raw ids [N] -> dense ids [N] (-1 where the model does not know the id)."""
        ids = np.asarray(ids, np.int64)
        pos = np.minimum(np.searchsorted(raw, ids, sorter=order), len(raw) - 1)
        dense = order[pos]
        return np.where(raw[dense] == ids, dense, -1)

    def dense_items(self, items: np.ndarray) -> np.ndarray:
        return self._dense(self.items_raw, self._item_order, items)

    def encode(self, user: int | None, history: np.ndarray) -> np.ndarray | None:
        """[D] float32 for this user, raw ids (None: a user the model does not know and nothing else to go on)."""
        dense_user = -1 if user is None else int(self._dense(self.users_raw, self._user_order, np.array([user]))[0])
        known = dense_user >= 0
        history = self.dense_items(history)
        history = history[history >= 0]
        if self._uses_id and not known:
            return None
        if not self._uses_id and not len(history):
            return None
        m = self.model
        if isinstance(m, MatrixFactorization):
            return self._tables["user_id"][dense_user]
        cfg = m.config
        parts = []
        if cfg.use_user_id:
            parts.append(self._tables["user_id"][dense_user])
        if cfg.max_history:
            rows = self._tables["history"]
            for n in (cfg.max_history, *cfg.recent):
                tail = history[-n:]
                parts.append(rows[tail].mean(axis=0) if len(tail) else np.zeros(rows.shape[1], np.float32))
        with torch.inference_mode():
            out = m._finish(m.user_mlp(torch.from_numpy(np.concatenate(parts)[None, :])))
        return out[0].float().numpy()

    def reference(self, user: int, history: np.ndarray) -> np.ndarray:
        """The model's own user_vectors for one (dense) user and (dense) history: what `encode` must equal."""
        users = torch.tensor([user], dtype=torch.int64)
        jagged = JaggedTensor(torch.from_numpy(history.astype(np.int64)), torch.tensor([len(history)], dtype=torch.int32))
        with torch.inference_mode():
            return self.model.user_vectors(users, jagged)[0].float().numpy()

    def item_vectors(self) -> np.ndarray:
        """[I, D] float32: dense item i's vector in row i (the index holds them under items_raw)."""
        with torch.inference_mode():
            blocks = [self.model.item_vectors(torch.arange(i, min(i + 65536, self.num_items))) for i in range(0, self.num_items, 65536)]
        return torch.cat(blocks).float().numpy()

    def save(self, path: str | Path) -> Path:
        spec: dict[str, Any]
        m = self.model
        if isinstance(m, TwoTower):
            config = dataclasses.asdict(m.config)
            config["similarity"] = m.config.similarity.value
            spec = {"type": "two_tower", "config": config, "num_users": m.num_users, "num_items": m.num_items}
        else:
            spec = {"type": "mf", "num_users": m.num_users, "num_items": m.num_items, "dim": m.dim, "temperature": m.temperature}
        obj = {"spec": json.dumps(spec), "state": m.state_dict(), "users_raw": torch.from_numpy(self.users_raw), "items_raw": torch.from_numpy(self.items_raw)}
        return atomic_save(obj, path)

    @staticmethod
    def load(path: str | Path) -> UserEncoder:
        saved = read_weights(path, "UserEncoder.load", "pipeline user encoder")
        try:
            spec = json.loads(saved["spec"])
            model: RetrievalModel
            if spec["type"] == "two_tower":
                cfg = dict(spec["config"])
                for key in ("user_layers", "item_layers", "recent", "user_features", "item_features"):
                    cfg[key] = tuple(tuple(x) if isinstance(x, list) else x for x in cfg[key])
                model = TwoTower(TwoTowerConfig(**cfg), int(spec["num_users"]), int(spec["num_items"]), SGD())
            elif spec["type"] == "mf":
                model = MatrixFactorization(int(spec["num_users"]), int(spec["num_items"]), int(spec["dim"]), SGD(), float(spec["temperature"]))
            else:
                raise ValueError(f"unknown encoder type {spec['type']!r}")
            # built with SGD (no optimizer state): the file's optimizer state, if any, is not needed to serve
            missing, _ = model.load_state_dict(saved["state"], strict=False)
            if missing:
                raise ValueError(f"the file lacks weights {missing[:3]}")
            users_raw, items_raw = saved["users_raw"].numpy(), saved["items_raw"].numpy()
        except (KeyError, TypeError, ValueError, RuntimeError, json.JSONDecodeError) as e:
            raise ValueError(f"UserEncoder.load: {path} is not a pipeline user encoder ({' '.join(str(e).split())[:200]})") from None
        return UserEncoder(model, users_raw, items_raw)
