"""The four-stage recommendation pipeline: retrieve, filter, score, order (stages as data, one runner).

    stages.py           Retrieve (Ann, ItemToItem, Popular, Sequential), Filter, Score, Order: frozen dataclasses
    runner.py           PipelineRunner: runs the stages for one user in process; Resources, Query, Recommendation
    encoder.py          UserEncoder: the retrieval model's user tower, online
    feature_store.py    FeatureStore: user and item features on the parameter server's tiers
    interaction_store.py InteractionStore: what each user has seen (the seen-items store), updatable online
    declaration.py      a pipeline declared in TOML (or a bundle manifest's JSON)
    served_pipeline.py  ServedPipeline: the pipeline behind HTTP, POST /recommend and a KServe v2 model

Its bundle is hugerec.serving.bundles.pipeline_bundle. Imports store/ and runtime/, never bundles/ or http/.
"""

from hugerec.serving.pipeline.runner import PipelineRunner, Query, Resources
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
    "ItemToItem",
    "Order",
    "PipelineRunner",
    "PipelineSpec",
    "Popular",
    "Query",
    "Resources",
    "Retrieve",
    "Score",
    "Sequential",
]
