"""Drop-in replacements for torch.nn.Embedding and torch.nn.EmbeddingBag with a fused sparse optimizer.

    - self.emb = torch.nn.EmbeddingBag(1_000_000, 64, mode="sum", sparse=True)
    + self.emb = hugerec.EmbeddingBag(1_000_000, 64, mode="sum", optimizer=hugerec.RowWiseAdagrad(lr=0.05))

Same constructor and forward signatures, same outputs for the same weights, a `.weight` Parameter
and `from_pretrained` as torch's. The difference: each backward updates the looked-up rows in place
with `optimizer` (default `SGD(lr=0.01)`), so the weight never gets a `.grad` and a dense torch
optimizer over `model.parameters()` leaves it alone. Rows are updated only in training mode, with
grad enabled and `weight.requires_grad` (False after `from_pretrained(..., freeze=True)`).

Not supported (ValueError): max_norm, scale_grad_by_freq, EmbeddingBag mode="max". `sparse` is accepted
and ignored (the update is always sparse). The state dict holds `weight` (so a torch layer's state
dict loads) plus the optimizer state as `optimizer.<name>` (absent keys keep the current state).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from hugerec.embedding.fused import FusedTables
from hugerec.embedding.fused_lookup import GroupPlan, pooled_lookup, sequence_lookup
from hugerec.embedding.optimizers import SGD, Adam, Optimizer
from hugerec.embedding.table_config import Normal, Pooling, StorageDtype, TableConfig

_DTYPES = {torch.float32: StorageDtype.FP32, torch.bfloat16: StorageDtype.BF16, torch.float16: StorageDtype.FP16}


class _SparseLayer(nn.Module):
    """What Embedding and EmbeddingBag share: one fused table named "weight" and its optimizer state."""

    def __init__(
        self,
        kind: str,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None,
        max_norm: float | None,
        scale_grad_by_freq: bool,
        weight: torch.Tensor | None,
        freeze: bool,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        pooling: Pooling,
        optimizer: Optimizer,
    ) -> None:
        super().__init__()
        if max_norm is not None:
            raise ValueError(f"{kind}: max_norm={max_norm} is not supported by hugerec (use max_norm=None)")
        if scale_grad_by_freq:
            raise ValueError(f"{kind}: scale_grad_by_freq=True is not supported by hugerec")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"{kind}: padding_idx {padding_idx} must be within num_embeddings {num_embeddings}")
            padding_idx = padding_idx % num_embeddings
        dtype = dtype or (weight.dtype if weight is not None else torch.float32)
        if dtype not in _DTYPES:
            raise ValueError(f"{kind}: dtype {dtype} is not supported; use one of {list(_DTYPES)}")
        config = TableConfig("weight", num_embeddings, embedding_dim, ("input",), pooling, Normal(), _DTYPES[dtype])
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.scale_grad_by_freq = max_norm, scale_grad_by_freq
        self.optimizer = optimizer
        self._kind = kind
        self._fused = FusedTables([config], optimizer, device)
        self.weight = nn.Parameter(self._fused.table_weight("weight"), requires_grad=not freeze)
        if weight is None:
            self._zero_padding()
        else:
            if tuple(weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"{kind}: _weight shape {tuple(weight.shape)} != ({num_embeddings}, {embedding_dim})")
            with torch.no_grad():
                self.weight.copy_(weight)

    def reset_parameters(self) -> None:
        """N(0, 1) rows, zero padding row, fresh optimizer state (as torch's reset_parameters)."""
        self._fused.reset_rows("weight", None)
        self._zero_padding()

    def _zero_padding(self) -> None:
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()

    def _updates(self) -> bool:
        return self.training and torch.is_grad_enabled() and self.weight.requires_grad

    def _rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
        """ids [N] int64 -> (rows with the padding index as -1, MISSING_OK flag)."""
        if self.padding_idx is None:
            return ids, 0
        if ids.numel() and int(ids.min()) < 0:
            raise ValueError(f"{self._kind}: negative id {int(ids.min())} in input")
        return torch.where(ids == self.padding_idx, -1, ids), 1

    @property
    def fused_tables(self) -> FusedTables:
        """The layer's fused storage and optimizer state (what a learning-rate schedule scales: `sparse_tables`)."""
        return self._fused

    def extra_repr(self) -> str:
        s = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s + f", optimizer={self.optimizer}"

    # -- optimizer state in the state dict -------------------------------------------------------
    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, view in self._fused.table_state("weight").items():
            destination[f"{prefix}optimizer.{name}"] = view
        if isinstance(self.optimizer, Adam):
            destination[f"{prefix}optimizer.step"] = torch.tensor(self._fused.steps["weight"], dtype=torch.int64)

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        ours = {f"{prefix}optimizer.{name}": view for name, view in self._fused.table_state("weight").items()}
        step_key = f"{prefix}optimizer.step" if isinstance(self.optimizer, Adam) else None
        others = {k: v for k, v in state_dict.items() if k not in ours and k != step_key}
        super()._load_from_state_dict(others, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        for key, view in ours.items():
            if key in state_dict:
                if tuple(state_dict[key].shape) != tuple(view.shape):
                    error_msgs.append(f"size mismatch for {key}: {tuple(state_dict[key].shape)} != {tuple(view.shape)}")
                else:
                    with torch.no_grad():
                        view.copy_(state_dict[key])
        if step_key is not None and step_key in state_dict:
            self._fused.steps["weight"] = int(state_dict[step_key])

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> _SparseLayer:
        super()._apply(fn, recurse)
        self._fused.apply(fn)
        self.weight.data = self._fused.table_weight("weight")  # back onto the fused storage, storage dtype kept
        return self


class Embedding(_SparseLayer):
    """torch.nn.Embedding with a fused sparse optimizer: input [*] int -> [*, embedding_dim]."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        _freeze: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        optimizer: Optimizer = SGD(lr=0.01),  # noqa: B008  # frozen dataclass: immutable default
    ) -> None:
        super().__init__(
            "Embedding",
            num_embeddings,
            embedding_dim,
            padding_idx,
            max_norm,
            scale_grad_by_freq,
            _weight,
            _freeze,
            device,
            dtype,
            Pooling.NONE,
            optimizer,
        )
        self.norm_type, self.sparse = norm_type, sparse

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # torch's argument name
        if input.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"Embedding: input must be int32 or int64 ids, got {input.dtype}")
        ids = input.reshape(-1).to(torch.int64).contiguous()  # [*] -> [N]
        rows, missing_ok = self._rows(ids)
        plan = torch.tensor([[0, 0, 0, self.num_embeddings, 0, 0, missing_ok]], dtype=torch.int64)
        offsets = torch.tensor([0, ids.numel()], dtype=torch.int64, device=ids.device)  # one bag: B = 1
        out = sequence_lookup(
            self._fused, [GroupPlan(0, plan, ("input",))], rows, offsets, 1, [ids.numel()], self._updates()
        )[0]
        if (
            self.padding_idx is not None
        ):  # torch returns the padding row as it is (zero unless overwritten); it gets no update
            pad = self._fused.table_weight("weight")[self.padding_idx].detach().float()
            out = torch.where((ids == self.padding_idx)[:, None], pad, out)
        return out.to(self.weight.dtype).view(*input.shape, self.embedding_dim)  # [N, D] -> [*, D]

    @classmethod
    def from_pretrained(
        cls,
        embeddings: torch.Tensor,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        *,
        optimizer: Optimizer = SGD(lr=0.01),  # noqa: B008  # frozen dataclass: immutable default
    ) -> Embedding:
        if embeddings.dim() != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-D, got shape {tuple(embeddings.shape)}")
        rows, dim = embeddings.shape
        return cls(
            rows,
            dim,
            padding_idx,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            sparse,
            embeddings,
            freeze,
            device=embeddings.device,
            optimizer=optimizer,
        )


class EmbeddingBag(_SparseLayer):
    """torch.nn.EmbeddingBag (modes "sum" and "mean") with a fused sparse optimizer: -> [B, embedding_dim]."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        optimizer: Optimizer = SGD(lr=0.01),  # noqa: B008  # frozen dataclass: immutable default
    ) -> None:
        if mode not in ("sum", "mean"):
            raise ValueError(f"EmbeddingBag: mode {mode!r} is not supported by hugerec; use 'sum' or 'mean'")
        super().__init__(
            "EmbeddingBag",
            num_embeddings,
            embedding_dim,
            padding_idx,
            max_norm,
            scale_grad_by_freq,
            _weight,
            False,
            device,
            dtype,
            Pooling.SUM if mode == "sum" else Pooling.MEAN,
            optimizer,
        )
        self.norm_type, self.mode, self.sparse, self.include_last_offset = norm_type, mode, sparse, include_last_offset

    def forward(
        self,
        input: torch.Tensor,  # torch's argument name
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        ids, bag_offsets = self._bags(input, offsets)
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ValueError(f"EmbeddingBag: per_sample_weights needs mode='sum', got mode={self.mode!r}")
            if per_sample_weights.shape != input.shape:
                raise ValueError(
                    f"EmbeddingBag: per_sample_weights shape {tuple(per_sample_weights.shape)} != input shape "
                    f"{tuple(input.shape)}"
                )
            per_sample_weights = per_sample_weights.reshape(-1).to(torch.float32)
        rows, missing_ok = self._rows(ids)
        plan = torch.tensor(
            [[0, 0, 0, self.num_embeddings, 0, int(self.mode == "mean"), missing_ok]], dtype=torch.int64
        )
        batch = bag_offsets.numel() - 1
        out = pooled_lookup(
            self._fused,
            [GroupPlan(0, plan, ("input",))],
            rows,
            bag_offsets,
            per_sample_weights,
            batch,
            self.embedding_dim,
            self._updates(),
        )
        return out.to(self.weight.dtype)

    def _bags(self, input: torch.Tensor, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (ids [N] int64, bag offsets [B + 1] int64 ending at N)."""
        if input.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"EmbeddingBag: input must be int32 or int64 ids, got {input.dtype}")
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError("EmbeddingBag: offsets must be None when input is 2-D [B, L]")
            batch, length = input.shape
            ids = input.reshape(-1).to(torch.int64).contiguous()  # [B, L] -> [B*L]
            return ids, torch.arange(batch + 1, device=input.device) * length
        if input.dim() != 1 or offsets is None or offsets.dim() != 1:
            raise ValueError(
                f"EmbeddingBag: expected 2-D input, or 1-D input with 1-D offsets; got input {tuple(input.shape)}, "
                f"offsets {None if offsets is None else tuple(offsets.shape)}"
            )
        ids = input.to(torch.int64).contiguous()
        bag_offsets = offsets.to(torch.int64)
        if not self.include_last_offset:
            bag_offsets = torch.cat([bag_offsets, bag_offsets.new_tensor([ids.numel()])])
        if bag_offsets.numel() == 0 or int(bag_offsets[0]) != 0:
            raise ValueError(f"EmbeddingBag: offsets must start at 0, got {bag_offsets[:1].tolist()}")
        if int(bag_offsets[-1]) != ids.numel() or bool((bag_offsets.diff() < 0).any()):
            raise ValueError(
                f"EmbeddingBag: offsets must be non-decreasing and end at the {ids.numel()} ids, got "
                f"{offsets.tolist() if offsets.numel() <= 10 else offsets}"
            )
        return ids, bag_offsets.contiguous()

    @classmethod
    def from_pretrained(
        cls,
        embeddings: torch.Tensor,
        freeze: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        *,
        optimizer: Optimizer = SGD(lr=0.01),  # noqa: B008  # frozen dataclass: immutable default
    ) -> EmbeddingBag:
        if embeddings.dim() != 2:
            raise ValueError(
                f"EmbeddingBag.from_pretrained: embeddings must be 2-D, got shape {tuple(embeddings.shape)}"
            )
        rows, dim = embeddings.shape
        layer = cls(
            rows,
            dim,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            mode,
            sparse,
            embeddings,
            include_last_offset,
            padding_idx,
            device=embeddings.device,
            optimizer=optimizer,
        )
        layer.weight.requires_grad_(not freeze)
        return layer
