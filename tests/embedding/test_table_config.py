"""TableConfig and DynamicConfig: defaults (features = the name, DLRM's uniform bound), strings taken for the
enums, a JSON round trip of every field, and each bad value refused naming the table, the key and the value."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import (
    DynamicConfig,
    Eviction,
    Missing,
    Normal,
    Pooling,
    Storage,
    StorageDtype,
    TableConfig,
    Uniform,
    Zeros,
)


def test_defaults_and_strings_for_enums() -> None:
    t = TableConfig("user", 100, 8, pooling="mean", dtype="bf16")  # type: ignore[arg-type]  # as a TOML file gives them
    assert t.features == ("user",) and t.pooling is Pooling.MEAN and t.dtype is StorageDtype.BF16
    assert t.storage is Storage.MEMORY and t.init_bounds == (-0.1, 0.1)
    assert TableConfig("x", 4, 2, init=Uniform(low=-1.0)).init_bounds == (-1.0, 0.5)
    assert [d.torch_dtype for d in StorageDtype] == [torch.float32, torch.bfloat16, torch.float16]
    assert [d.itemsize for d in StorageDtype] == [4, 2, 2]


@pytest.mark.parametrize(
    "table",
    [
        TableConfig("user", 10, 4),
        TableConfig(
            "item",
            50,
            8,
            features=("item", "last_item"),
            pooling=Pooling.NONE,
            init=Normal(0.0, 0.1),
            dtype=StorageDtype.FP16,
            optimizer=Adam(lr=0.01),
        ),
        TableConfig(
            "id",
            1000,
            16,
            init=Zeros(),
            dynamic=DynamicConfig(Eviction.TTL, ttl_steps=5, min_count=2, missing=Missing.UNKNOWN_ROW),
        ),
        TableConfig("big", 1000, 4, storage=Storage.DISK, path="big.bin", cache_rows=10),
        TableConfig("big2", 1000, 4, storage=Storage.DISK, path="big.bin", cache_bytes=1 << 20),
    ],
    ids=lambda t: t.name,
)
def test_json_round_trip(table: TableConfig) -> None:
    assert TableConfig.from_json(table.to_json()) == table


def test_from_dict_fills_defaults() -> None:
    t = TableConfig.from_dict({"name": "u", "num_rows": 3, "dim": 2, "dynamic": {}})
    assert t == TableConfig("u", 3, 2, dynamic=DynamicConfig())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "TableConfig: name must be a non-empty string, got ''"),
        ({"num_rows": 0}, "TableConfig 't': num_rows must be a positive int, got 0"),
        ({"num_rows": 2.5}, "num_rows must be a positive int, got 2.5"),
        ({"dim": -1}, "TableConfig 't': dim must be a positive int, got -1"),
        ({"features": ("a", "a")}, r"TableConfig 't': duplicate features \['a', 'a'\]"),
        ({"cache_rows": 5}, "TableConfig 't': cache_rows = 5 needs storage = 'disk'"),
        ({"storage": "disk", "cache_rows": 5}, "storage 'disk' needs a path \\(the table's file\\), got None"),
        (
            {"storage": "disk", "path": "f"},
            "needs exactly one of cache_rows and cache_bytes, got cache_rows = None, cache_bytes = None",
        ),
        (
            {"storage": "disk", "path": "f", "cache_rows": 1, "cache_bytes": 1},
            "needs exactly one of cache_rows and cache_bytes",
        ),
        ({"storage": "disk", "path": "f", "cache_bytes": 0}, "cache_bytes must be a positive int, got 0"),
        (
            {"storage": "disk", "path": "f", "cache_rows": 11},
            r"cache_rows = 11 is larger than the table \(num_rows = 10\)",
        ),
        ({"pooling": "max"}, "'max' is not a valid Pooling"),
    ],
)
def test_bad_tables_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TableConfig(**{"name": "t", "num_rows": 10, "dim": 4, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eviction": Eviction.TTL}, "eviction TTL needs ttl_steps > 0, got 0"),
        ({"ttl_steps": -1}, "ttl_steps must be >= 0, got -1"),
        ({"min_count": 0}, "min_count must be >= 1, got 0"),
        ({"sketch_depth": 0}, "sketch_width and sketch_depth must be >= 1, got 1048576, 0"),
    ],
)
def test_bad_dynamic_configs_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DynamicConfig(**kwargs)


def test_from_dict_refuses_unknown_keys_and_inits() -> None:
    base = {"name": "t", "num_rows": 4, "dim": 2}
    with pytest.raises(ValueError, match=r"TableConfig.from_dict: unknown keys \['size'\]"):
        TableConfig.from_dict({**base, "size": 3})
    with pytest.raises(
        ValueError, match=r"unknown init type 'xavier'; expected one of \['normal', 'uniform', 'zeros'\]"
    ):
        TableConfig.from_dict({**base, "init": {"type": "xavier"}})
    with pytest.raises(ValueError, match="table 't': dynamic: 'lifo' is not a valid Eviction"):
        TableConfig.from_dict({**base, "dynamic": {"eviction": "lifo"}})


@pytest.mark.parametrize(
    ("d", "message"),
    [
        ({"name": "t", "dim": 2}, r"TableConfig.from_dict: missing keys \['num_rows'\]"),
        ({"num_rows": 4, "dim": 2}, r"missing keys \['name'\]"),
        ({"name": "t", "num_rows": 4, "dim": 2, "init": {"type": "normal", "sigma": 1}}, r"table 't': init 'normal' has no keys \['sigma'\]; it has \['mean', 'std'\]"),
        ({"name": "t", "num_rows": 4, "dim": 2, "dynamic": {"capacity": 4}}, r"table 't': dynamic has no keys \['capacity'\]"),
        ({"name": "t", "num_rows": 4, "dim": 2, "dynamic": [1]}, r"table 't': dynamic must be an object, got list"),
        ({"name": "t", "num_rows": 4, "dim": 2, "pooling": "max"}, r"table 't': 'max' is not a valid Pooling"),
        ({"name": "t", "num_rows": 4, "dim": 2, "storage": "tape"}, r"table 't': 'tape' is not a valid Storage"),
        ({"name": "t", "num_rows": 4, "dim": 2, "dtype": "fp64"}, r"table 't': 'fp64' is not a valid StorageDtype"),
    ],
)
def test_from_dict_names_the_key_of_a_missing_or_bad_value(d: dict[str, Any], message: str) -> None:
    """A table read from a model file or a checkpoint: every mistake is one ValueError naming the key, never a
    TypeError or KeyError from deep inside."""
    with pytest.raises(ValueError, match=message):
        TableConfig.from_dict(d)
    with pytest.raises(ValueError, match="a table must be an object, got list"):
        TableConfig.from_dict([d])  # type: ignore[arg-type]


def test_uniform_init_bound_follows_the_rows() -> None:
    assert TableConfig("t", 10_000, 2).init_bounds == (-0.01, 0.01)
    assert math.isclose(TableConfig("t", 3, 2).init_bounds[1], math.sqrt(1 / 3))
