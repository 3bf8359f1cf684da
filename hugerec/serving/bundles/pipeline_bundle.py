"""The pipeline bundle: everything one pipeline needs, in one folder, with a manifest and checksums.

    pipeline/
      manifest.json              {"kind": "pipeline", "format": 1, name, version, "pipeline": the declaration
                                  (pipeline/declaration.py's structure), "parts": which of the parts below exist,
                                  "sha256": {relative path: hash} of every other file}
      features/                  the feature tables (user, item): features.json + <table>.npz
      interactions.npz           what each user has interacted with (exclude-seen, history), with each event's
                                  time when the store was built with them (interaction_store.py)
      popular.npy                item ids, most popular first
      retrieval/encoder.pt       the retrieval model's towers (UserEncoder, weights only)
      retrieval/index/           the ANN index over the item vectors (hugerec.index, usearch HNSW or exact)
      retrieval/item_vectors.npy [I, D] (item-to-item queries)
      ranker/                    a model bundle (hugerec export: manifest, program, embeddings, workflow)
      sequential/                optional: a next-items bundle

Export writes a temporary folder, loads it back as a check (so a bundle that exists is one that
loads), and renames it into place. `load_pipeline` verifies every checksum before reading anything;
nothing it reads can run code (npz/npy without pickle, torch weights only, the ranker's own checks).
The interaction store is loaded with its event times when the pipeline's next-items model reads them (an
HSTU trained with times, in the sequential source or the Score stage), without them otherwise (so a
pipeline without such a model serves as it did before stores kept times); such a model beside a store
without times is refused, naming the stage and the bundle.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hugerec.index.vector_index import HnswIndex, IndexConfig, build_index, load_index
from hugerec.serving.bundles.bundle_files import MANIFEST, bundle_kind, sha256_file, staged_folder
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.next_items_bundle import load_next_items
from hugerec.serving.pipeline.declaration import PipelineDeclaration, declaration_from_dict, declaration_to_dict
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import DEFAULT_MAX_ITEMS, InteractionStore
from hugerec.serving.pipeline.runner import PipelineRunner, Resources, reads_times

KIND = "pipeline"
FORMAT = 1


def is_pipeline_bundle(path: str | Path) -> bool:
    return bundle_kind(path) == KIND


@dataclass(frozen=True)
class PipelineOptions:
    """How a pipeline bundle is served.

    feature_tier       "memory" (default), "redis" or "rocksdb": where the feature tables live
    feature_location   the Redis URL or the RocksDB folder of that tier
    ranker             how the ranker bundle is served (its parameter-server tiers, device...)
    expansion_search   HNSW search breadth (None: as built; at least the largest ANN k is used)
    verify             check the checksums before loading
    seed               exploration's generator (None: fresh entropy)
    max_interactions   the items kept per user in the seen-items store (the last ones; /recommend/interactions
                       appends): bounds the memory a client can make a user's history take
    """

    feature_tier: str = "memory"
    feature_location: str | None = None
    ranker: ServeOptions = field(default_factory=ServeOptions)
    expansion_search: int | None = None
    verify: bool = True
    seed: int | None = None
    max_interactions: int = DEFAULT_MAX_ITEMS

    def __post_init__(self) -> None:
        if isinstance(self.max_interactions, bool) or not isinstance(self.max_interactions, int) or self.max_interactions < 1:
            raise ValueError(f"PipelineOptions: max_interactions must be an integer >= 1, got {self.max_interactions!r}")
        if self.feature_tier not in ("memory", "redis", "rocksdb"):
            raise ValueError(f"PipelineOptions: feature_tier must be 'memory', 'redis' or 'rocksdb', got {self.feature_tier!r}")
        if self.feature_tier != "memory" and not self.feature_location:
            raise ValueError(f"PipelineOptions: feature_tier {self.feature_tier!r} needs feature_location (a URL or a folder)")


@dataclass(eq=False)
class LoadedPipeline:
    name: str
    version: str
    path: Path
    pipeline: PipelineRunner
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        closers, self.closers = self.closers, []
        for close in closers:
            close()


def export_pipeline(
    out: str | Path,
    declaration: PipelineDeclaration,
    features: FeatureStore,
    interactions: InteractionStore | None = None,
    popular: np.ndarray | None = None,
    encoder: UserEncoder | None = None,
    index_config: IndexConfig | None = None,
    ranker_bundle: str | Path | None = None,
    sequential_bundle: str | Path | None = None,
) -> Path:
    """Write a pipeline bundle at `out` (replaced when it is a pipeline bundle already); returns it."""
    final = Path(out)
    if final.exists() and not is_pipeline_bundle(final):
        raise ValueError(f"export_pipeline: {final} exists and is not a pipeline bundle; give a new folder")
    with staged_folder(final) as tmp:
        parts = ["features"]
        features.save(tmp / "features")
        (interactions or InteractionStore()).save(tmp / "interactions.npz")
        np.save(tmp / "popular.npy", np.asarray(popular if popular is not None else np.zeros(0), np.int64))
        if encoder is not None:
            (tmp / "retrieval").mkdir()
            encoder.save(tmp / "retrieval" / "encoder.pt")
            vectors = encoder.item_vectors()
            np.save(tmp / "retrieval" / "item_vectors.npy", vectors)
            build_index(vectors, encoder.items_raw, index_config or IndexConfig()).save(tmp / "retrieval" / "index")
            parts.append("retrieval")
        for name, src in (("ranker", ranker_bundle), ("sequential", sequential_bundle)):
            if src is not None:
                shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns("state"))  # a served bundle's state is not part of it
                parts.append(name)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {
            "kind": KIND,
            "format": FORMAT,
            "name": declaration.name,
            "version": declaration.version,
            "pipeline": declaration_to_dict(declaration),
            "parts": parts,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "sha256": {p.relative_to(tmp).as_posix(): sha256_file(p) for p in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        load_pipeline(tmp, PipelineOptions(ranker=ServeOptions(state_dir=str(tmp / ".check-state")))).close()  # it loads, or nothing is written
        shutil.rmtree(tmp / ".check-state", ignore_errors=True)
    return final


def load_pipeline(path: str | Path, options: PipelineOptions | None = None, name: str | None = None, version: str | None = None) -> LoadedPipeline:
    """Open a pipeline bundle: checksums verified, every part loaded, the pipeline checked against them."""
    options = options or PipelineOptions()
    folder = Path(path)
    if not is_pipeline_bundle(folder):
        raise ValueError(f"load_pipeline: {folder} is not a pipeline bundle (no {MANIFEST} of kind {KIND!r})")
    manifest = json.loads((folder / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"load_pipeline: {folder / MANIFEST} has format {manifest.get('format')!r}, this hugerec reads {FORMAT}")
    sums = manifest.get("sha256")
    if not isinstance(sums, dict) or not sums:
        raise ValueError(f"load_pipeline: {folder / MANIFEST} lists no checksums")
    root = folder.resolve()
    for rel, expected in sums.items():
        file = (folder / rel).resolve()
        if not file.is_relative_to(root):
            raise ValueError(f"load_pipeline: {folder / MANIFEST} names {rel!r}, outside the bundle")
        if options.verify and (not file.is_file() or sha256_file(file) != expected):
            raise ValueError(f"load_pipeline: {folder / rel} is missing or does not match its checksum in the manifest")
    declaration = declaration_from_dict(manifest["pipeline"], f"{folder / MANIFEST}")
    parts = set(manifest.get("parts", []))
    closers: list[Callable[[], None]] = []
    try:
        features = FeatureStore.load(folder / "features", options.feature_tier, options.feature_location,
                                     namespace=f"hugerec:features:{declaration.name}:{declaration.version}")
        closers.append(features.close)
        resources = Resources(features, popular=np.load(folder / "popular.npy", allow_pickle=False))
        if "retrieval" in parts:
            ks = [getattr(s, "k", 0) for s in declaration.spec.stages[0].sources]  # type: ignore[union-attr]  # stage 0 is Retrieve
            index = load_index(folder / "retrieval" / "index", options.expansion_search)
            if isinstance(index, HnswIndex) and index.config.expansion_search < max(ks):  # never narrower than a source's k
                index.set_expansion_search(max(ks))
            resources.index = index
            resources.encoder = UserEncoder.load(folder / "retrieval" / "encoder.pt")
            resources.item_vectors = np.load(folder / "retrieval" / "item_vectors.npy", allow_pickle=False)
        if "ranker" in parts:
            loaded = load_bundle(folder / "ranker", options.ranker)
            closers.append(loaded.close)
            resources.ranker = loaded.model
        if "sequential" in parts:
            resources.sequential = load_next_items(folder / "sequential")
        timed = reads_times(declaration.spec, resources.sequential)  # the store's times are read
        resources.interactions = InteractionStore.load(folder / "interactions.npz", options.max_interactions, times=timed)
        pipeline = PipelineRunner(declaration.spec, resources, options.seed)
    except BaseException:
        for close in closers:
            close()
        raise
    return LoadedPipeline(name or declaration.name, version or declaration.version, folder, pipeline, closers)
