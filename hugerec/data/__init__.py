"""Data: schema, readers, synthetic generator, Parquet shards and the loader that yields `Batch`es."""

from typing import TYPE_CHECKING

from hugerec.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (hugerec.lazy_exports)
    from hugerec.data.events import retrieval_view, sequence_view
    from hugerec.data.input_spec import ColumnSpec, InputFormat, InputSpec, Role, infer_spec
    from hugerec.data.interactions import epoch_examples, full_ranking
    from hugerec.data.loader import Loader, load
    from hugerec.data.prepare import Join, SplitKind, SplitSpec, prepare
    from hugerec.data.schema import Schema, ValueType
    from hugerec.data.synthetic import SyntheticConfig, generate
    from hugerec.data.synthetic_stream import Stream, StreamConfig
    from hugerec.data.windows import Windows

__all__ = [
    "ColumnSpec",
    "InputFormat",
    "InputSpec",
    "Join",
    "Loader",
    "Role",
    "Schema",
    "SplitKind",
    "SplitSpec",
    "Stream",
    "StreamConfig",
    "SyntheticConfig",
    "ValueType",
    "Windows",
    "epoch_examples",
    "full_ranking",
    "generate",
    "infer_spec",
    "load",
    "prepare",
    "retrieval_view",
    "sequence_view",
]

lazy_exports(__name__)
