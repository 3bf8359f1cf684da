"""TableConfig and the plain-data choices it is made of (pooling, initializer, storage dtype)."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from hugerec.embedding.optimizers import Optimizer, optimizer_from_dict, optimizer_to_dict

if TYPE_CHECKING:  # torch loads when a dtype is asked for: the data schema reads table configs without it
    import torch


class Pooling(enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    NONE = "none"  # sequence output: one vector per id, [N, D]


class StorageDtype(enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        match self:
            case StorageDtype.FP32:
                return torch.float32
            case StorageDtype.BF16:
                return torch.bfloat16
            case StorageDtype.FP16:
                return torch.float16

    @property
    def itemsize(self) -> int:
        return 4 if self is StorageDtype.FP32 else 2


@dataclass(frozen=True)
class Uniform:
    """U(low, high); with both None: U(-sqrt(1/num_rows), sqrt(1/num_rows)) as in DLRM."""

    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Normal:
    mean: float = 0.0
    std: float = 1.0


@dataclass(frozen=True)
class Zeros:
    pass


Initializer = Uniform | Normal | Zeros


class Eviction(enum.Enum):
    """What a full dynamic table does with a new key."""

    NONE = "none"  # raise: the table is full
    LRU = "lru"  # evict the row seen longest ago
    LFU = "lfu"  # evict the row seen least often
    TTL = "ttl"  # evict rows not seen for `ttl_steps` steps (then LRU if none has expired)


class Missing(enum.Enum):
    """What a key without a row maps to in find-only mode (eval, serving) or before admission."""

    ZEROS = "zeros"  # a zero vector, no update
    UNKNOWN_ROW = "unknown_row"  # one shared, trained row per table


@dataclass(frozen=True)
class DynamicConfig:
    """Makes a table dynamic: raw int64 keys mapped to at most `TableConfig.num_rows` rows.

    num_rows is the capacity: memory is bounded and known up front.
    """

    eviction: Eviction = Eviction.LRU
    ttl_steps: int = 0
    min_count: int = 1  # admission: a key gets a row after it was seen this many times
    missing: Missing = Missing.ZEROS
    sketch_width: int = 1 << 20  # count-min sketch columns (admission), per row of the sketch
    sketch_depth: int = 4

    def __post_init__(self) -> None:
        if self.eviction is Eviction.TTL and self.ttl_steps <= 0:
            raise ValueError(f"DynamicConfig: eviction TTL needs ttl_steps > 0, got {self.ttl_steps}")
        if self.ttl_steps < 0:
            raise ValueError(f"DynamicConfig: ttl_steps must be >= 0, got {self.ttl_steps}")
        if self.min_count < 1:
            raise ValueError(f"DynamicConfig: min_count must be >= 1, got {self.min_count}")
        if self.sketch_width < 1 or self.sketch_depth < 1:
            raise ValueError(
                f"DynamicConfig: sketch_width and sketch_depth must be >= 1, got {self.sketch_width}, {self.sketch_depth}"
            )


class Storage(enum.Enum):
    """Where a table's rows and optimizer state live."""

    MEMORY = "memory"
    DISK = "disk"  # a file at `path`, hot rows in a RAM cache of cache_rows / cache_bytes (hugerec.embedding.disk)


@dataclass(frozen=True)
class TableConfig:
    """One embedding table, looked up by one or more features that share it.

    name      unique table name
    num_rows  rows R (for dynamic tables: the capacity)
    dim       embedding width D
    features  feature names looked up in this table; default: (name,)
    pooling   SUM / MEAN per bag, or NONE for sequence outputs [N, D]
    init      Uniform / Normal / Zeros
    dtype     storage dtype of the rows (optimizer state is always fp32)
    optimizer per-table override of the collection's optimizer
    dynamic   DynamicConfig for raw-key tables, None for ids in 0..num_rows-1
    storage   MEMORY, or DISK: rows + optimizer state in the file `path`, the hot rows in an LRU cache of
              `cache_rows` rows or `cache_bytes` bytes (one of the two; rows x (padded row + state bytes))
    """

    name: str
    num_rows: int
    dim: int
    features: tuple[str, ...] = ()
    pooling: Pooling = Pooling.SUM
    init: Initializer = field(default_factory=Uniform)
    dtype: StorageDtype = StorageDtype.FP32
    optimizer: Optimizer | None = None
    dynamic: DynamicConfig | None = None
    storage: Storage = Storage.MEMORY
    cache_rows: int | None = None
    cache_bytes: int | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"TableConfig: name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.num_rows, int) or self.num_rows <= 0:
            raise ValueError(f"TableConfig {self.name!r}: num_rows must be a positive int, got {self.num_rows!r}")
        if not isinstance(self.dim, int) or self.dim <= 0:
            raise ValueError(f"TableConfig {self.name!r}: dim must be a positive int, got {self.dim!r}")
        feats = tuple(self.features) if self.features else (self.name,)
        object.__setattr__(self, "features", feats)
        if len(set(feats)) != len(feats):
            raise ValueError(f"TableConfig {self.name!r}: duplicate features {list(feats)}")
        if isinstance(self.pooling, str):
            object.__setattr__(self, "pooling", Pooling(self.pooling))
        if isinstance(self.dtype, str):
            object.__setattr__(self, "dtype", StorageDtype(self.dtype))
        if isinstance(self.storage, str):
            object.__setattr__(self, "storage", Storage(self.storage))
        self._check_storage()

    def _check_storage(self) -> None:
        where = f"TableConfig {self.name!r}"
        if self.storage is Storage.MEMORY:
            for key in ("cache_rows", "cache_bytes", "path"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{where}: {key} = {getattr(self, key)!r} needs storage = 'disk'")
            return
        if not self.path or not isinstance(self.path, str):
            raise ValueError(f"{where}: storage 'disk' needs a path (the table's file), got {self.path!r}")
        if (self.cache_rows is None) == (self.cache_bytes is None):
            raise ValueError(
                f"{where}: storage 'disk' needs exactly one of cache_rows and cache_bytes, "
                f"got cache_rows = {self.cache_rows!r}, cache_bytes = {self.cache_bytes!r}"
            )
        for key in ("cache_rows", "cache_bytes"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ValueError(f"{where}: {key} must be a positive int, got {v!r}")
        if self.cache_rows is not None and self.cache_rows > self.num_rows:
            raise ValueError(
                f"{where}: cache_rows = {self.cache_rows} is larger than the table (num_rows = {self.num_rows})"
            )

    @property
    def init_bounds(self) -> tuple[float, float]:
        """(low, high) for Uniform init, resolving the default bound."""
        assert isinstance(self.init, Uniform)
        bound = math.sqrt(1.0 / self.num_rows)
        low = -bound if self.init.low is None else self.init.low
        high = bound if self.init.high is None else self.init.high
        return low, high

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        init: dict[str, Any] = {"type": type(self.init).__name__.lower(), **asdict(self.init)}
        return {
            "name": self.name,
            "num_rows": self.num_rows,
            "dim": self.dim,
            "features": list(self.features),
            "pooling": self.pooling.value,
            "init": init,
            "dtype": self.dtype.value,
            "optimizer": None if self.optimizer is None else optimizer_to_dict(self.optimizer),
            "dynamic": None if self.dynamic is None else _dynamic_to_dict(self.dynamic),
            "storage": self.storage.value,
            "cache_rows": self.cache_rows,
            "cache_bytes": self.cache_bytes,
            "path": self.path,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TableConfig:
        """The TableConfig of `to_dict()`'s output (a model file's or a checkpoint's tables); a missing or
        unknown key, or a value of the wrong kind, is a ValueError naming the key (and the table)."""
        if not isinstance(d, dict):
            raise ValueError(f"TableConfig.from_dict: a table must be an object, got {type(d).__name__}")
        d = dict(d)
        known = {"name", "num_rows", "dim", "features", "pooling", "init", "dtype", "optimizer", "dynamic"}
        unknown = set(d) - known - {"storage", "cache_rows", "cache_bytes", "path"}
        if unknown:
            raise ValueError(f"TableConfig.from_dict: unknown keys {sorted(unknown)}")
        missing = [k for k in ("name", "num_rows", "dim") if k not in d]
        if missing:
            raise ValueError(f"TableConfig.from_dict: missing keys {missing}")
        where = f"TableConfig.from_dict: table {d['name']!r}"
        init_d = dict(d.get("init") or {"type": "uniform"})
        kind = init_d.pop("type", None)
        inits: dict[str, type] = {"uniform": Uniform, "normal": Normal, "zeros": Zeros}
        if kind not in inits:
            raise ValueError(f"{where}: unknown init type {kind!r}; expected one of {sorted(inits)}")
        names = {f.name for f in fields(inits[kind])}
        if set(init_d) - names:
            raise ValueError(f"{where}: init {kind!r} has no keys {sorted(set(init_d) - names)}; it has {sorted(names)}")
        opt = d.get("optimizer")
        dyn = d.get("dynamic")
        try:
            pooling = Pooling(d.get("pooling", "sum"))
            dtype = StorageDtype(d.get("dtype", "fp32"))
            storage = Storage(d.get("storage", "memory"))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return TableConfig(
            name=d["name"],
            num_rows=d["num_rows"],
            dim=d["dim"],
            features=tuple(d.get("features") or ()),
            pooling=pooling,
            init=inits[kind](**init_d),
            dtype=dtype,
            optimizer=None if opt is None else optimizer_from_dict(opt),
            dynamic=None if dyn is None else _dynamic_from_dict(dyn, where),
            storage=storage,
            cache_rows=d.get("cache_rows"),
            cache_bytes=d.get("cache_bytes"),
            path=d.get("path"),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @staticmethod
    def from_json(s: str) -> TableConfig:
        return TableConfig.from_dict(json.loads(s))


def _dynamic_to_dict(c: DynamicConfig) -> dict[str, Any]:
    d = asdict(c)
    d["eviction"] = c.eviction.value
    d["missing"] = c.missing.value
    return d


def _dynamic_from_dict(d: dict[str, Any], where: str) -> DynamicConfig:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: dynamic must be an object, got {type(d).__name__}")
    d = dict(d)
    names = {f.name for f in fields(DynamicConfig)}
    if set(d) - names:
        raise ValueError(f"{where}: dynamic has no keys {sorted(set(d) - names)}; it has {sorted(names)}")
    try:
        d["eviction"] = Eviction(d.get("eviction", "lru"))
        d["missing"] = Missing(d.get("missing", "zeros"))
    except ValueError as e:
        raise ValueError(f"{where}: dynamic: {e}") from None
    return DynamicConfig(**d)
