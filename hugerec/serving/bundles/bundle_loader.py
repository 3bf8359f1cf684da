"""load_bundle: a verified bundle -> a running model version (parameter server, program, updates).

    bundle/embeddings  --copied once-->  state_dir/rocksdb   (tier 3: live updates land here)
    state_dir/rocksdb  --preload------>  tier 2 (in process, or Redis)
    bundle/dense.pt2   --safe load---->  program (+ the dense weights of the last applied update)

The state directory belongs to one bundle (its manifest hash is stored inside): a restart reuses it
and serves every update applied before, a different bundle refuses it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hugerec.serving.bundles.model_bundle import EMBEDDINGS, PROGRAM_PREFIX, Bundle
from hugerec.serving.runtime.inference_model import InferenceModel, VectorInput
from hugerec.serving.runtime.inference_protocol import Signature
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
from hugerec.serving.store.cache import CacheConfig
from hugerec.serving.store.memory_store import MemoryStore
from hugerec.serving.store.parameter_server import ParameterServer
from hugerec.serving.store.persistent import PersistentStore
from hugerec.serving.store.tiers import Store
from hugerec.serving.store.updates import (
    DENSE_STATE_META,
    DirectorySource,
    RedisStreamSource,
    UpdateSource,
    UpdateWatcher,
    load_dense,
)

log = logging.getLogger(__name__)

BUNDLE_ID_META = "bundle_id"


@dataclass(frozen=True)
class ServeOptions:
    """How a bundle is served.

    state_dir        tier-3 RocksDB and kept dense weights (default: <bundle>/state)
    cache            tier-1 cache per table; None: on (CacheConfig()) when the device is a GPU or tier 2
                     is Redis, off otherwise (in process on the CPU, tier 2 is already a RAM lookup)
    redis_url        tier 2 in this Redis server instead of in process
    preload          copy every row into tier 2 at start (else rows are promoted on first use)
    device           cache and model device (default: CUDA when available)
    verify           check the bundle's checksums before loading
    updates_dir      watch this directory for updates (see updates.py)
    updates_stream   read updates from this Redis stream (of updates_redis_url, default redis_url)
    update_interval  seconds between polls
    """

    state_dir: str | None = None
    cache: CacheConfig | None = None
    redis_url: str | None = None
    preload: bool = True
    device: str | None = None
    verify: bool = True
    updates_dir: str | None = None
    updates_stream: str | None = None
    updates_redis_url: str | None = None
    update_interval: float = 1.0

    def __post_init__(self) -> None:
        if self.updates_stream is not None and (self.updates_redis_url or self.redis_url) is None:
            raise ValueError("ServeOptions: updates_stream needs updates_redis_url (or redis_url)")
        if self.update_interval <= 0:
            raise ValueError(f"ServeOptions: update_interval must be > 0, got {self.update_interval}")


@dataclass(eq=False)
class LoadedModel:
    bundle: Bundle
    model: InferenceModel
    preprocess: RequestPreprocessor
    state_dir: Path
    sources: list[UpdateSource]
    update_interval: float = 1.0
    watchers: list[UpdateWatcher] = field(default_factory=list)

    def start_updates(self, on_result: Callable[[str], None] | None = None) -> None:
        persistent = self.model.ps.persistent
        for source in self.sources:
            watcher = UpdateWatcher(self.model, source, persistent, self.state_dir, self.update_interval, on_result)
            self.watchers.append(watcher.start())

    def close(self) -> None:
        for w in self.watchers:
            w.stop()
        self.model.ps.close()


def load_bundle(path: str | Path, options: ServeOptions | None = None, max_request_rows: int = 65536) -> LoadedModel:
    """Open, verify and load the bundle at `path` (updates are not started: see LoadedModel.start_updates)."""
    options = options or ServeOptions()
    bundle = Bundle.open(path, verify=options.verify)
    m = bundle.manifest
    state_dir = Path(options.state_dir) if options.state_dir is not None else bundle.path / "state"
    dims = {t.name: t.dim for t in m.tables}
    persistent = _open_state(bundle, state_dir, dims)
    memory: Store
    if options.redis_url is not None:
        from hugerec.serving.store.redis_store import RedisStore

        memory = RedisStore(options.redis_url, dims, namespace=f"hugerec:{m.name}:{m.version}:{bundle.id[:12]}")
    else:
        memory = MemoryStore(dims, {t.name: t.num_rows for t in m.tables})
    ps = ParameterServer(m.tables, memory, persistent, cache_config(options), options.device)
    try:
        if options.preload and all(memory.count(t) == 0 for t in dims):
            ps.preload()
        vectors = [VectorInput(**v) for v in m.info.get("vectors", [])]
        model = InferenceModel(
            bundle.program(), m.collections, ps, m.num_dense, m.dense_keys, PROGRAM_PREFIX, vectors=vectors
        )
        kept = persistent.get_meta(DENSE_STATE_META)
        if kept is not None:  # dense weights of the last update applied before a restart
            model.update([], load_dense(state_dir / kept, str(state_dir / kept)))
        signature = Signature(m.num_dense, model.features, max_request_rows, vectors=model.vector_signature)
        preprocess = RequestPreprocessor(signature, bundle.schema(), bundle.workflow())
    except BaseException:
        ps.close()
        raise
    sources: list[UpdateSource] = []
    if options.updates_dir is not None:
        sources.append(DirectorySource(options.updates_dir))
    if options.updates_stream is not None:
        url = options.updates_redis_url or options.redis_url
        assert url is not None  # checked in ServeOptions
        sources.append(RedisStreamSource(url, options.updates_stream))
    return LoadedModel(bundle, model, preprocess, state_dir, sources, options.update_interval)


def cache_config(options: ServeOptions) -> CacheConfig:
    if options.cache is not None:
        return options.cache
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return (
        CacheConfig() if options.redis_url is not None or torch.device(device).type == "cuda" else CacheConfig(rows=0)
    )


def _open_state(bundle: Bundle, state_dir: Path, dims: dict[str, int]) -> PersistentStore:
    rocks = state_dir / "rocksdb"
    if not rocks.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".rocksdb.", dir=state_dir))
        shutil.copytree(bundle.path / EMBEDDINGS, tmp, dirs_exist_ok=True)
        store = PersistentStore(tmp, dims)
        store.set_meta(BUNDLE_ID_META, bundle.id)
        store.close()
        os.replace(tmp, rocks)
    store = PersistentStore(rocks, dims)
    owner = store.get_meta(BUNDLE_ID_META)
    if owner != bundle.id:
        store.close()
        raise ValueError(
            f"state directory {state_dir} belongs to another bundle (id {str(owner)[:12]}..., this one {bundle.id[:12]}...): "
            "remove it or pass another state_dir"
        )
    return store
