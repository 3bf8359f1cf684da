"""Data: schema, readers, synthetic generator, Parquet shards and the loader that yields `Batch`es."""

from hugerec.data import preprocess
from hugerec.data.criteo import criteo_to_parquet, read_criteo
from hugerec.data.input_spec import ColumnSpec, InputSpec, infer_spec, schema_toml
from hugerec.data.interactions import (
    Interactions,
    Vocabulary,
    categorify,
    held_out_csr,
    histories,
    iter_examples,
    last_items,
    leave_last_out,
    read_interactions,
    time_split,
)
from hugerec.data.loader import Loader, load
from hugerec.data.prepare import Join, PrepareReport, SplitKind, SplitSpec, prepare, transform_raw
from hugerec.data.preprocess import Dataset, Workflow
from hugerec.data.readers import ConvertReport, read, to_parquet
from hugerec.data.schema import Column, ColumnKind, DimRule, Schema, ValueType
from hugerec.data.sessions import (
    ItemVocabulary,
    Sequences,
    group_sequences,
    last_n,
    read_movielens,
    read_yoochoose,
    sliding_windows,
)
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
from hugerec.data.synthetic_interactions import InteractionConfig, SyntheticInteractions, generate_interactions

__all__ = [
    "Column",
    "ColumnKind",
    "ColumnSpec",
    "ConvertReport",
    "Dataset",
    "DimRule",
    "Hotness",
    "IdDistribution",
    "InputSpec",
    "InteractionConfig",
    "Interactions",
    "ItemVocabulary",
    "Join",
    "Loader",
    "PrepareReport",
    "Schema",
    "Sequences",
    "ShardWriter",
    "SplitKind",
    "SplitSpec",
    "SyntheticConfig",
    "SyntheticInteractions",
    "SyntheticReport",
    "ValueType",
    "Vocabulary",
    "Workflow",
    "categorify",
    "criteo_to_parquet",
    "generate",
    "generate_interactions",
    "group_sequences",
    "held_out_csr",
    "histories",
    "infer_spec",
    "iter_examples",
    "iter_tables",
    "last_items",
    "last_n",
    "leave_last_out",
    "load",
    "prebatch",
    "prepare",
    "preprocess",
    "preset",
    "read",
    "read_criteo",
    "read_interactions",
    "read_movielens",
    "read_yoochoose",
    "schema_toml",
    "sliding_windows",
    "time_split",
    "to_parquet",
    "transform_raw",
]
