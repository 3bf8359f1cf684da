"""Serving: export a trained model to a bundle, serve it over HTTP (KServe v2 / Triton protocol), update it live.

    hr.serving.export_bundle(model, "bundle/", schema=schema, workflow=workflow)
    hr.serving.serve("bundle/", port=8000, options=hr.serving.ServeOptions(updates_dir="updates/"))
    hr.serving.publish_to_directory("updates/", "step-1000", deltas, dense=model.state_dict())

Embedding rows live in a hierarchical parameter server: cache (bounded, GPU when present) ->
memory (in process, or Redis) -> RocksDB (survives restarts).
"""

from hugerec.serving.batching import BatchingConfig
from hugerec.serving.bundle import Bundle
from hugerec.serving.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.cache import CacheConfig, CachePolicy
from hugerec.serving.export import export_bundle, export_checkpoint
from hugerec.serving.inference_model import InferenceModel
from hugerec.serving.parameter_server import ParameterServer, TableSpec, TableUpdate
from hugerec.serving.server import InferenceServer, ServerConfig, serve
from hugerec.serving.updates import publish_to_directory, publish_to_stream

__all__ = [
    "BatchingConfig",
    "Bundle",
    "CacheConfig",
    "CachePolicy",
    "InferenceModel",
    "InferenceServer",
    "ParameterServer",
    "ServeOptions",
    "ServerConfig",
    "TableSpec",
    "TableUpdate",
    "export_bundle",
    "export_checkpoint",
    "load_bundle",
    "publish_to_directory",
    "publish_to_stream",
    "serve",
]
