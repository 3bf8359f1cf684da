"""NVTabular-style preprocessing: a Workflow of fit/transform ops over partitioned datasets."""

from typing import TYPE_CHECKING

from hugerec.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (hugerec.lazy_exports)
    from hugerec.data.preprocess.categorical import Categorify, HashBucket, HashedCross
    from hugerec.data.preprocess.dataset import CsvOptions, Dataset, Format
    from hugerec.data.preprocess.encoding import CountEncoding, TargetEncoding
    from hugerec.data.preprocess.errors import BadInputError, OnError, RowError, SkipReport
    from hugerec.data.preprocess.grouping import Agg, Groupby
    from hugerec.data.preprocess.lists import ListSlice, SplitList
    from hugerec.data.preprocess.numeric import Binarize, Bucketize, Clip, FillMissing, FillStrategy, LogOp, Normalize
    from hugerec.data.preprocess.shuffle import repartition
    from hugerec.data.preprocess.temporal import CyclicTime, DifferenceLag, ParseTime, TimeFeature, TimeUnit
    from hugerec.data.preprocess.workflow import TransformResult, Workflow

__all__ = [
    "Agg",
    "BadInputError",
    "Binarize",
    "Bucketize",
    "Categorify",
    "Clip",
    "CountEncoding",
    "CsvOptions",
    "CyclicTime",
    "Dataset",
    "DifferenceLag",
    "FillMissing",
    "FillStrategy",
    "Format",
    "Groupby",
    "HashBucket",
    "HashedCross",
    "ListSlice",
    "LogOp",
    "Normalize",
    "OnError",
    "ParseTime",
    "RowError",
    "SkipReport",
    "SplitList",
    "TargetEncoding",
    "TimeFeature",
    "TimeUnit",
    "TransformResult",
    "Workflow",
    "repartition",
]

lazy_exports(__name__)
