"""Data: schema, readers, synthetic generator, Parquet shards and the loader that yields `Batch`es."""

from hugerec.data import preprocess
from hugerec.data.criteo import criteo_to_parquet, read_criteo
from hugerec.data.loader import Loader, load
from hugerec.data.preprocess import Dataset, Workflow
from hugerec.data.readers import ConvertReport, read, to_parquet
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
    "ConvertReport",
    "Dataset",
    "DimRule",
    "Hotness",
    "IdDistribution",
    "Loader",
    "Schema",
    "ShardWriter",
    "SyntheticConfig",
    "SyntheticReport",
    "ValueType",
    "Workflow",
    "criteo_to_parquet",
    "generate",
    "iter_tables",
    "load",
    "prebatch",
    "preprocess",
    "preset",
    "read",
    "read_criteo",
    "to_parquet",
]
