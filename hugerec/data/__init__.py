"""Data: schema, readers, synthetic generator, Parquet shards and the loader that yields `Batch`es."""

from typing import TYPE_CHECKING

from hugerec.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (hugerec.lazy_exports)
    from hugerec.data import preprocess
    from hugerec.data.criteo import criteo_to_parquet, read_criteo
    from hugerec.data.events import (
        RetrievalData,
        SequenceData,
        SequenceProtocol,
        SequenceSpec,
        retrieval_view,
        sequence_view,
    )
    from hugerec.data.input_spec import ColumnSpec, InputFormat, InputSpec, Role, infer_spec, schema_toml
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
    from hugerec.data.matrix import read_matrix
    from hugerec.data.prepare import (
        Join,
        PrepareReport,
        SplitKind,
        SplitSpec,
        lacks_labels,
        prepare,
        transform_raw,
        with_joins,
    )
    from hugerec.data.preprocess import Dataset, Workflow
    from hugerec.data.readers import ConvertReport, read, to_parquet
    from hugerec.data.schema import Column, ColumnKind, DimRule, Schema, ValueType
    from hugerec.data.sessions import (
        ItemVocabulary,
        Sequences,
        group_sequences,
        last_n,
        prefixes,
        read_movielens,
        read_yoochoose,
        sliding_windows,
        split_by_day,
        with_reversed,
    )
    from hugerec.data.shards import ShardWriter, count_rows, expand_paths, prebatch, split_shards
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
    from hugerec.data.synthetic_stream import Stream, StreamConfig
    from hugerec.data.vector_tables import load_vectors
    from hugerec.data.windows import Windows

__all__ = [
    "Column",
    "ColumnKind",
    "ColumnSpec",
    "ConvertReport",
    "Dataset",
    "DimRule",
    "Hotness",
    "IdDistribution",
    "InputFormat",
    "InputSpec",
    "InteractionConfig",
    "Interactions",
    "ItemVocabulary",
    "Join",
    "Loader",
    "PrepareReport",
    "RetrievalData",
    "Role",
    "Schema",
    "SequenceData",
    "SequenceProtocol",
    "SequenceSpec",
    "Sequences",
    "ShardWriter",
    "SplitKind",
    "SplitSpec",
    "Stream",
    "StreamConfig",
    "SyntheticConfig",
    "SyntheticInteractions",
    "SyntheticReport",
    "ValueType",
    "Vocabulary",
    "Windows",
    "Workflow",
    "categorify",
    "count_rows",
    "criteo_to_parquet",
    "expand_paths",
    "generate",
    "generate_interactions",
    "group_sequences",
    "held_out_csr",
    "histories",
    "infer_spec",
    "iter_examples",
    "iter_tables",
    "lacks_labels",
    "last_items",
    "last_n",
    "leave_last_out",
    "load",
    "load_vectors",
    "prebatch",
    "prefixes",
    "prepare",
    "preprocess",
    "preset",
    "read",
    "read_criteo",
    "read_interactions",
    "read_matrix",
    "read_movielens",
    "read_yoochoose",
    "retrieval_view",
    "schema_toml",
    "sequence_view",
    "sliding_windows",
    "split_by_day",
    "split_shards",
    "time_split",
    "to_parquet",
    "transform_raw",
    "with_joins",
    "with_reversed",
]

lazy_exports(__name__)
