"""Serving: export a trained model to a bundle, serve it over HTTP (KServe v2 / Triton protocol), update it live.

    hr.serving.export_bundle(model, "bundle/", schema=schema, workflow=workflow)
    hr.serving.serve("bundle/", port=8000, options=hr.serving.ServeOptions(updates_dir="updates/"))
    hr.serving.publish_to_directory("updates/", "step-1000", deltas, dense=model.state_dict())

Embedding rows live in a hierarchical parameter server: cache (bounded, GPU when present) ->
memory (in process, or Redis) -> RocksDB (survives restarts).
"""

from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.export import export_bundle, export_checkpoint
from hugerec.serving.bundles.gbm_bundle import export_gbm_bundle, load_gbm_bundle
from hugerec.serving.bundles.model_bundle import Bundle
from hugerec.serving.bundles.next_items_bundle import export_next_items
from hugerec.serving.bundles.pipeline_bundle import export_pipeline, load_pipeline
from hugerec.serving.bundles.version_delta import read_version_delta, write_version_delta
from hugerec.serving.http.limits import RequestLimits, limits_from_overrides
from hugerec.serving.http.request_log import RequestLogConfig
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig, serve
from hugerec.serving.pipeline.declaration import declaration_from_dict, declaration_to_dict
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.runtime.gbm_model import GBMModel
from hugerec.serving.runtime.inference_model import InferenceModel
from hugerec.serving.runtime.inference_protocol import RequestError
from hugerec.serving.store.cache import CacheConfig, CachePolicy
from hugerec.serving.store.parameter_server import ParameterServer, TableSpec, TableUpdate
from hugerec.serving.store.updates import publish_to_directory, publish_to_stream

__all__ = [
    "BackgroundServer",
    "BatchingConfig",
    "Bundle",
    "CacheConfig",
    "CachePolicy",
    "FeatureStore",
    "GBMModel",
    "InferenceModel",
    "InferenceServer",
    "ParameterServer",
    "RequestError",
    "RequestLimits",
    "RequestLogConfig",
    "ServeOptions",
    "ServerConfig",
    "TableSpec",
    "TableUpdate",
    "declaration_from_dict",
    "declaration_to_dict",
    "export_bundle",
    "export_checkpoint",
    "export_gbm_bundle",
    "export_next_items",
    "export_pipeline",
    "limits_from_overrides",
    "load_bundle",
    "load_gbm_bundle",
    "load_pipeline",
    "publish_to_directory",
    "publish_to_stream",
    "read_version_delta",
    "serve",
    "write_version_delta",
]
