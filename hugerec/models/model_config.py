"""Model configs (plain data, from/to dicts for TOML) and `build_model`, one `match` over the union.

{"type": "dlrm", "bottom": [512, 256, 64], "top": [1024, 1024, 512, 256, 1]}
    -> DLRMConfig(bottom=(512, 256, 64), top=(1024, 1024, 512, 256, 1))
build_model(config, tables, num_dense=13, optimizer=RowWiseAdagrad(lr=0.01)) -> DLRM
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Ftrl, Optimizer
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dcn import CrossStructure, DCNv2
from hugerec.models.deepfm import DeepFM
from hugerec.models.dlrm import DLRM
from hugerec.models.mlp import Activation, check_dims
from hugerec.models.model import RecModel
from hugerec.models.vector_features import VectorArch, VectorFeature, vector_features
from hugerec.models.wide import wide_tables
from hugerec.models.wide_deep import WideAndDeep


def _normalize(config: Any, where: str, dims: dict[str, bool]) -> None:
    """Shared __post_init__: lists -> tuples of widths, strings -> enums, dropout in [0, 1)."""
    for name, allow_empty in dims.items():
        object.__setattr__(config, name, check_dims(f"{where} {name}", getattr(config, name), allow_empty))
    if isinstance(config.activation, str):
        try:
            object.__setattr__(config, "activation", Activation(config.activation))
        except ValueError:
            choices = [a.value for a in Activation]
            raise ValueError(f"{where}: unknown activation {config.activation!r}; expected one of {choices}") from None
    if not isinstance(config.dropout, int | float) or not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"{where}: dropout must be in [0, 1), got {config.dropout!r}")


def _vectors(config: Any, where: str) -> None:
    """vectors: a list of VectorFeature or of their dicts (TOML's [[model.vectors]]) -> a tuple."""
    object.__setattr__(config, "vectors", vector_features(config.vectors, where))


def _check_optimizer(opt: Any, where: str) -> None:
    if not isinstance(opt, Optimizer):
        raise ValueError(f"{where}: wide_optimizer must be a sparse optimizer (SGD, Adagrad, ..., Ftrl), got {opt!r}")


@dataclass(frozen=True)
class DLRMConfig:
    """DLRM: a bottom MLP over the dense features, the dot products of every pair of its output and the embeddings, a top MLP."""

    bottom: tuple[int, ...] = (512, 256, 64)  # the dense arch's widths, ending at the embedding dim ([] without dense features)
    top: tuple[int, ...] = (1024, 1024, 512, 256, 1)  # the over arch's widths, ending at 1 (the logit)
    self_interaction: bool = False  # also the dot product of each vector with itself
    activation: Activation = Activation.RELU  # of the hidden layers of both MLPs
    dropout: float = 0.0  # after each hidden layer, in [0, 1)
    vectors: tuple[VectorFeature, ...] = ()  # each projected to the embedding dim, one more interaction input

    def __post_init__(self) -> None:
        _normalize(self, "DLRMConfig", {"bottom": True, "top": False})
        _vectors(self, "DLRMConfig")
        if self.top[-1] != 1:
            raise ValueError(f"DLRMConfig: top must end at 1 (the logit), got {list(self.top)}")


@dataclass(frozen=True)
class DCNv2Config:
    """DCN-v2: cross layers (explicit feature crosses of x0 = [dense, embeddings]) beside or before a deep MLP."""

    num_cross_layers: int = 3  # cross layers x_{l+1} = x0 * (W x_l + b) + x_l
    low_rank: int | None = None  # factor each cross matrix W as U V^T of this rank (none: full D x D)
    num_experts: int = 1  # mixture of low-rank experts per cross layer (needs low_rank)
    structure: CrossStructure = CrossStructure.STACKED  # "stacked": cross then deep; "parallel": both on x0, outputs concatenated
    deep: tuple[int, ...] = (1024, 1024)  # the deep MLP's widths ([] for the cross net alone)
    activation: Activation = Activation.RELU  # of the deep MLP's hidden layers
    dropout: float = 0.0  # after each hidden layer of the deep MLP, in [0, 1)
    vectors: tuple[VectorFeature, ...] = ()  # pretrained vector features, each projected and concatenated into x0
    vector_dim: int = 16  # each vector feature's projection width in the input x0

    def __post_init__(self) -> None:
        _normalize(self, "DCNv2Config", {"deep": True})
        _vectors(self, "DCNv2Config")
        if isinstance(self.vector_dim, bool) or not isinstance(self.vector_dim, int) or self.vector_dim < 1:
            raise ValueError(f"DCNv2Config: vector_dim must be a positive int, got {self.vector_dim!r}")
        if isinstance(self.structure, str):
            try:
                object.__setattr__(self, "structure", CrossStructure(self.structure))
            except ValueError:
                choices = [s.value for s in CrossStructure]
                raise ValueError(
                    f"DCNv2Config: unknown structure {self.structure!r}; expected one of {choices}"
                ) from None
        for name in ("num_cross_layers", "num_experts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"DCNv2Config: {name} must be a positive int, got {v!r}")
        if self.low_rank is not None and (
            isinstance(self.low_rank, bool) or not isinstance(self.low_rank, int) or self.low_rank <= 0
        ):
            raise ValueError(f"DCNv2Config: low_rank must be a positive int or absent, got {self.low_rank!r}")
        if self.num_experts > 1 and self.low_rank is None:
            raise ValueError(f"DCNv2Config: num_experts={self.num_experts} needs low_rank")


@dataclass(frozen=True)
class DeepFMConfig:
    """DeepFM: a factorisation machine's pairwise term and a deep MLP over the same embeddings, summed."""

    deep: tuple[int, ...] = (400, 400, 400)  # the deep MLP's hidden widths (its output layer of 1 is added)
    first_order: bool = True  # dim-1 sparse weights (a wide collection); False: FM + deep only
    wide_optimizer: Optimizer = field(default_factory=Ftrl)  # the sparse optimizer of the first-order weights
    activation: Activation = Activation.RELU  # of the deep MLP's hidden layers
    dropout: float = 0.0  # after each hidden layer, in [0, 1)

    def __post_init__(self) -> None:
        _normalize(self, "DeepFMConfig", {"deep": False})
        _check_optimizer(self.wide_optimizer, "DeepFMConfig")


@dataclass(frozen=True)
class WideAndDeepConfig:
    """Wide & Deep: a linear model over dim-1 sparse weights plus a deep MLP over the embeddings, summed."""

    deep: tuple[int, ...] = (1024, 512, 256)  # the deep MLP's hidden widths (its output layer of 1 is added)
    wide_optimizer: Optimizer = field(default_factory=Ftrl)  # the sparse optimizer of the wide part's weights
    activation: Activation = Activation.RELU  # of the deep MLP's hidden layers
    dropout: float = 0.0  # after each hidden layer, in [0, 1)

    def __post_init__(self) -> None:
        _normalize(self, "WideAndDeepConfig", {"deep": False})
        _check_optimizer(self.wide_optimizer, "WideAndDeepConfig")


RankingConfig = DLRMConfig | DCNv2Config | DeepFMConfig | WideAndDeepConfig


def build_ranking(config: RankingConfig, tables: Sequence[TableConfig], num_dense: int, optimizer: Optimizer) -> RecModel:
    """The ranking model `config` describes, with fresh EmbeddingCollections over `tables`.

    `optimizer` is the sparse optimizer of the embedding tables (a table's own `optimizer` wins);
    wide parts get dim-1 twins of `tables` (see `wide_tables`) trained with `config.wide_optimizer`.
    """
    embedding = EmbeddingCollection(list(tables), optimizer)
    match config:
        case DLRMConfig():
            vectors = _vector_arch(config.vectors, tables, embedding.feature_dims[0] if tables else 1, optimizer)
            return DLRM(
                embedding,
                num_dense,
                config.bottom,
                config.top,
                config.activation,
                config.dropout,
                config.self_interaction,
                vectors,
            )
        case DCNv2Config():
            return DCNv2(
                embedding,
                num_dense,
                config.num_cross_layers,
                config.low_rank,
                config.num_experts,
                config.structure,
                config.deep,
                config.activation,
                config.dropout,
                _vector_arch(config.vectors, tables, config.vector_dim, optimizer),
            )
        case DeepFMConfig():
            wide = (
                EmbeddingCollection(wide_tables(tables, config.wide_optimizer), optimizer)
                if config.first_order
                else None
            )
            return DeepFM(embedding, num_dense, config.deep, wide, config.activation, config.dropout)
        case WideAndDeepConfig():
            wide = EmbeddingCollection(wide_tables(tables, config.wide_optimizer), optimizer)
            return WideAndDeep(embedding, wide, num_dense, config.deep, config.activation, config.dropout)


def _vector_arch(
    vectors: Sequence[VectorFeature], tables: Sequence[TableConfig], out_dim: int, optimizer: Optimizer
) -> VectorArch | None:
    """The model's VectorArch (zero rows until the vectors are loaded), or None without vector features."""
    if not vectors:
        return None
    num_rows = {f: t.num_rows for t in tables for f in t.features}
    return VectorArch(vectors, num_rows, out_dim, optimizer)
