"""Data: schema, readers, synthetic generator, Parquet shards and the loader that yields `Batch`es."""

from hugerec.data.loader import Loader, load
from hugerec.data.schema import Column, ColumnKind, DimRule, Schema, ValueType
from hugerec.data.shards import ShardWriter, prebatch
from hugerec.data.synthetic import (
    Hotness,
    IdDistribution,
    SyntheticConfig,
    SyntheticReport,
    generate,
    iter_tables,
    preset,
)

__all__ = [
    "Column",
    "ColumnKind",
    "DimRule",
    "Hotness",
    "IdDistribution",
    "Loader",
    "Schema",
    "ShardWriter",
    "SyntheticConfig",
    "SyntheticReport",
    "ValueType",
    "generate",
    "iter_tables",
    "load",
    "prebatch",
    "preset",
]
