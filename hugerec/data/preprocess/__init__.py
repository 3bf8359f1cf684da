"""NVTabular-style preprocessing: a Workflow of fit/transform ops over partitioned datasets."""

from typing import TYPE_CHECKING

from hugerec.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (hugerec.lazy_exports)
    from hugerec.data.preprocess.categorical import Categorify, HashBucket, HashedCross
    from hugerec.data.preprocess.dataset import Dataset
    from hugerec.data.preprocess.encoding import CountEncoding, TargetEncoding
    from hugerec.data.preprocess.grouping import Groupby
    from hugerec.data.preprocess.lists import ListSlice, SplitList
    from hugerec.data.preprocess.numeric import Binarize, Bucketize, Clip, FillMissing, LogOp, Normalize
    from hugerec.data.preprocess.temporal import CyclicTime, DifferenceLag, ParseTime, TimeFeature
    from hugerec.data.preprocess.workflow import Workflow

__all__ = [
    "Binarize",
    "Bucketize",
    "Categorify",
    "Clip",
    "CountEncoding",
    "CyclicTime",
    "Dataset",
    "DifferenceLag",
    "FillMissing",
    "Groupby",
    "HashBucket",
    "HashedCross",
    "ListSlice",
    "LogOp",
    "Normalize",
    "ParseTime",
    "SplitList",
    "TargetEncoding",
    "TimeFeature",
    "Workflow",
]

lazy_exports(__name__)
