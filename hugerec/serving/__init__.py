"""Serving: export a trained model to a bundle, load or serve it over HTTP (KServe v2 / Triton protocol), update it live.

    hr.serving.export(model, "bundle/", schema=schema, workflow=workflow)   # or a model file of any family
    served = hr.serving.load("bundle/")           # any bundle kind, as the server serves it; served.close()
    hr.serving.serve("bundle/", port=8000, options=hr.serving.ServeOptions(updates_dir="updates/"))
    since = hr.serving.export_delta(model.sparse_arch, "updates/step-1000.parquet", since)   # changed rows
    hr.serving.publish_to_directory("updates/", "step-1000", dense=model.state_dict())

Embedding rows live in a hierarchical parameter server: cache (bounded, GPU when present) ->
memory (in process, or Redis) -> RocksDB (survives restarts).
"""

from hugerec.embedding.delta import export_delta
from hugerec.serving.bundles.any_bundle import load
from hugerec.serving.bundles.bundle_loader import ServeOptions
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.pipeline_bundle import PipelineOptions
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
    "PipelineOptions",
    "RequestLimits",
    "RequestLogConfig",
    "ServeOptions",
    "ServerConfig",
    "export",
    "export_delta",
    "load",
    "publish_to_directory",
    "publish_to_stream",
    "serve",
]
