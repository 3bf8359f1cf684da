"""Serving: export a trained model to a bundle, serve it over HTTP (KServe v2 / Triton protocol), update it live.

    hr.serving.export(model, "bundle/", schema=schema, workflow=workflow)   # or a model file of any family
    hr.serving.serve("bundle/", port=8000, options=hr.serving.ServeOptions(updates_dir="updates/"))
    hr.serving.publish_to_directory("updates/", "step-1000", deltas, dense=model.state_dict())

Embedding rows live in a hierarchical parameter server: cache (bounded, GPU when present) ->
memory (in process, or Redis) -> RocksDB (survives restarts).
"""

from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.export import export
from hugerec.serving.http.limits import RequestLimits
from hugerec.serving.http.request_log import RequestLogConfig
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig, serve
from hugerec.serving.runtime.batching import BatchingConfig
from hugerec.serving.store.cache import CacheConfig
from hugerec.serving.store.updates import publish_to_directory, publish_to_stream

__all__ = [
    "BackgroundServer",
    "BatchingConfig",
    "CacheConfig",
    "InferenceServer",
    "RequestLimits",
    "RequestLogConfig",
    "ServeOptions",
    "ServerConfig",
    "export",
    "publish_to_directory",
    "publish_to_stream",
    "serve",
]
