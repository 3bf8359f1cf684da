"""The four-stage recommendation pipeline: retrieve, filter, score, order (stages as data, one runner).

    stages.py        Retrieve (Ann, ItemToItem, Popular, Sequential), Filter, Score, Order: frozen dataclasses
    runner.py        Pipeline: runs the stages for one user in process; Resources, Query, Recommendation
    encoder.py       UserEncoder: the retrieval model's user tower, online
    interactions.py  InteractionStore: what each user has seen, updatable online
    config.py        a pipeline declared in TOML
    bundle.py        the pipeline bundle: export everything with a manifest and checksums, load verified
    served.py        the pipeline behind HTTP: POST /recommend and a KServe v2 model
"""

from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.interactions import InteractionStore
from hugerec.serving.pipeline.runner import Pipeline, Query, Ranker, Recommendation, Resources, StageError
from hugerec.serving.pipeline.stages import (
    Ann,
    Boost,
    Condition,
    Filter,
    ItemToItem,
    Order,
    PipelineSpec,
    Popular,
    Retrieve,
    Score,
    Sequential,
)

__all__ = [
    "Ann",
    "Boost",
    "Condition",
    "Filter",
    "InteractionStore",
    "ItemToItem",
    "Order",
    "Pipeline",
    "PipelineSpec",
    "Popular",
    "Query",
    "Ranker",
    "Recommendation",
    "Resources",
    "Retrieve",
    "Score",
    "Sequential",
    "StageError",
    "UserEncoder",
]
