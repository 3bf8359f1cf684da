"""Data: schema, readers, synthetic generator, Parquet shards and the loader that yields `Batch`es."""

from hugerec.data import preprocess
from hugerec.data.criteo import criteo_to_parquet, read_criteo
from hugerec.data.loader import Loader, load
from hugerec.data.preprocess import Dataset, Workflow
from hugerec.data.readers import ConvertReport, read, to_parquet
from hugerec.data.schema import Column, ColumnKind, DimRule, Schema, ValueType
from hugerec.data.sessions import ItemVocabulary, Sequences, group_sequences, last_n, read_movielens, read_yoochoose
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
    "ItemVocabulary",
    "Loader",
    "Schema",
    "Sequences",
    "ShardWriter",
    "SyntheticConfig",
    "SyntheticReport",
    "ValueType",
    "Workflow",
    "criteo_to_parquet",
    "generate",
    "group_sequences",
    "iter_tables",
    "last_n",
    "load",
    "prebatch",
    "preprocess",
    "preset",
    "read",
    "read_criteo",
    "read_movielens",
    "read_yoochoose",
    "to_parquet",
]
