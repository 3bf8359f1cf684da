"""load: any bundle this project writes -> the served object the server serves (runtime/served_object.py).

    served = load("runs/ranker/bundle")                     # a model bundle   -> ServedModel (kind "model")
    served = load("runs/gbm/bundle")                        # a GBM bundle     -> ServedModel (kind "gbm")
    served = load("runs/sasrec/bundle")                     # next-items       -> NextItemsModel
    served = load("runs/pipeline", pipeline=PipelineOptions(seed=0))   # pipeline  -> ServedPipeline
    served.close()

The bundle's own manifest says what it holds (`bundle_kind`: "gbm", "next_items", "pipeline"; a model
bundle's manifest has no kind but the format "hugerec-bundle"); the file names are never looked at. A
folder that is no bundle, a kind this hugerec does not know, or a manifest of a newer format is refused
in one line naming the path and what is wrong, before any part is read. The per-kind loaders
(bundle_loader, gbm_bundle, next_items_bundle, pipeline_bundle) then check and load their own files.

`load` is what a user calls; `open_served` is the one path under it and under the server (`InferenceServer.
add_bundle`: `hugerec serve` and the admin load route), which lends every load its metrics, its pipeline
threads and its request limits through `LoadSettings`. `load` refuses an option that does not apply to
the bundle's kind (naming the option and the kind); the server's settings are server-wide and apply to
the kinds they concern.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hugerec.serving.bundles import gbm_bundle, model_bundle, next_items_bundle, pipeline_bundle, version_delta
from hugerec.serving.bundles.bundle_files import MANIFEST
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.gbm_bundle import load_gbm_bundle
from hugerec.serving.bundles.isolated_load import DEFAULT_LOAD_DEADLINE_S, current_deadline
from hugerec.serving.bundles.next_items_bundle import load_next_items
from hugerec.serving.bundles.pipeline_bundle import PipelineOptions, load_pipeline
from hugerec.serving.pipeline.served_pipeline import PipelineMetrics, QueryLimits, ServedPipeline
from hugerec.serving.runtime.batching import BatchingConfig, DynamicBatcher
from hugerec.serving.runtime.inference_model import InferenceModel
from hugerec.serving.runtime.next_items_model import NextItemsModel
from hugerec.serving.runtime.request_preprocessor import RequestPreprocessor
from hugerec.serving.runtime.served_model import Scorer, ServedModel

MODEL = "model"  # the kind of a model bundle (its manifest names no kind)
KINDS = (MODEL, gbm_bundle.KIND, next_items_bundle.KIND, pipeline_bundle.KIND)
_FORMATS = {gbm_bundle.KIND: gbm_bundle.FORMAT, next_items_bundle.KIND: next_items_bundle.FORMAT, pipeline_bundle.KIND: pipeline_bundle.FORMAT}
DEFAULT_REQUEST_ROWS = 65536

BatchObserver = Callable[[int, int, float], None]  # DynamicBatcher's on_batch(rows, requests, seconds)
Served = ServedModel | NextItemsModel | ServedPipeline  # the served objects (ServedObject) a bundle loads as


@dataclass(frozen=True)
class LoadSettings:
    """How `open_served` loads each kind: what `load`'s caller gave, or what a server lends every load.

    options           a model bundle's serving (tiers, state dir, updates); a GBM bundle reads its `verify`
    pipeline          a pipeline bundle's serving (feature tier, its ranker's options, ...)
    batching          the dynamic batcher of a scoring version (model, gbm)
    max_request_rows  rows (model, gbm) or histories (next_items) one request may carry
    deadline_s        a GBM model file's check by its library in a child process (an admin load's own
                      deadline wins when the load runs under one: isolated_load.current_deadline)
    query_limits      users, history and k of one pipeline request
    pipeline_metrics  / pipeline_work: the server's per-stage metrics and the threads that run pipelines
    batch_observer    (name, version) -> the batcher's on_batch callback (the server's batch metrics)
    on_update         (name, version) -> called with "applied" / "refused" for each live update of a model bundle
    """

    options: ServeOptions = field(default_factory=ServeOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    max_request_rows: int = DEFAULT_REQUEST_ROWS
    deadline_s: float = DEFAULT_LOAD_DEADLINE_S
    query_limits: QueryLimits = field(default_factory=QueryLimits)
    pipeline_metrics: PipelineMetrics | None = None
    pipeline_work: Executor | None = None
    batch_observer: Callable[[str, str], BatchObserver] | None = None
    on_update: Callable[[str, str], Callable[[str], None]] | None = None


def load(
    path: str | Path,
    options: ServeOptions | None = None,
    *,
    pipeline: PipelineOptions | None = None,
    name: str | None = None,
    version: str | None = None,
    batching: BatchingConfig | None = None,
    max_request_rows: int | None = None,
    deadline_s: float | None = None,
) -> Served:
    """Open any bundle hugerec writes, verified, as the object the server serves; `close()` it when done.

    The bundle's manifest says its kind and what comes back:
        model       ServedModel: `served.model.predict(served.preprocess(rows))` -> logits [B] of raw rows
                    (dicts of the schema's columns, through the fitted workflow when the bundle has one)
        gbm         ServedModel over the checked trees, the same calls
        next_items  NextItemsModel: `served.next_items(values, lengths)` -> top-k raw item ids per history
        pipeline    ServedPipeline: `served.recommend({"user": 17, "k": 10})`
    name / version default to the manifest's. Options of some kinds only (a ValueError naming the option
    and the bundle's kind when given for another):
        options           ServeOptions: model (a GBM bundle takes only its `verify`)
        pipeline          PipelineOptions: pipeline (its `ranker` serves the pipeline's ranker bundle)
        batching          BatchingConfig: model, gbm
        max_request_rows  model, gbm, next_items (default 65536)
        deadline_s        gbm: the library's check of the model file in a child process (default 120 s)
    A model bundle's live updates (options.updates_dir / updates_stream) start at once.
    """
    kind = bundle_kind_of(path)
    given = {
        "options": (options is not None, (MODEL, gbm_bundle.KIND)),
        "pipeline": (pipeline is not None, (pipeline_bundle.KIND,)),
        "batching": (batching is not None, (MODEL, gbm_bundle.KIND)),
        "max_request_rows": (max_request_rows is not None, (MODEL, gbm_bundle.KIND, next_items_bundle.KIND)),
        "deadline_s": (deadline_s is not None, (gbm_bundle.KIND,)),
    }
    for option, (present, kinds) in given.items():
        if present and kind not in kinds:
            raise ValueError(f"load: {path} is a {kind} bundle; {option} applies to {_kinds(kinds)} bundles only")
    if kind == gbm_bundle.KIND and options is not None:
        other = [f.name for f in fields(ServeOptions) if f.name != "verify" and getattr(options, f.name) != getattr(ServeOptions(), f.name)]
        if other:
            raise ValueError(f"load: {path} is a gbm bundle; options.{other[0]} applies to model bundles only (a gbm bundle takes options.verify)")
    settings = LoadSettings(
        options=options or ServeOptions(),
        pipeline=pipeline or PipelineOptions(),
        batching=batching or BatchingConfig(),
        max_request_rows=DEFAULT_REQUEST_ROWS if max_request_rows is None else max_request_rows,
        deadline_s=DEFAULT_LOAD_DEADLINE_S if deadline_s is None else deadline_s,
    )
    return open_served(path, settings, name, version, kind)


def open_served(
    path: str | Path, settings: LoadSettings, name: str | None = None, version: str | None = None, kind: str | None = None
) -> Served:
    """The bundle at `path` as a served object, loaded with `settings` (kind: `bundle_kind_of(path)`, when the
    caller has read it already)."""
    kind = kind or bundle_kind_of(path)
    if isinstance(settings.max_request_rows, bool) or not isinstance(settings.max_request_rows, int) or settings.max_request_rows < 1:
        raise ValueError(f"load: max_request_rows must be an integer >= 1, got {settings.max_request_rows!r}")
    if kind == MODEL:
        return _model(path, settings, name, version)
    if kind == gbm_bundle.KIND:
        deadline = current_deadline()  # an admin load's; else the one configured
        seconds = settings.deadline_s if deadline is None else deadline.remaining()
        gbm = load_gbm_bundle(path, settings.max_request_rows, verify=settings.options.verify, deadline_s=seconds)
        info = {"bundle": str(gbm.path), "bundle_id": gbm.bundle_id, "kind": gbm_bundle.KIND, **gbm.manifest["info"]}
        return _scoring(name or gbm.name, version or gbm.version, gbm.model, gbm.preprocess, [], info, None, settings)
    if kind == next_items_bundle.KIND:
        model = load_next_items(path, name, version, settings.max_request_rows)
        return replace(model, info={"bundle": str(path)})
    assert kind == pipeline_bundle.KIND, kind  # bundle_kind_of names no other
    p = load_pipeline(path, settings.pipeline, name, version)
    return ServedPipeline(
        p.name, p.version, p.pipeline, settings.pipeline_metrics, {"bundle": str(path)}, [p.close], settings.query_limits, settings.pipeline_work
    )


def bundle_kind_of(path: str | Path) -> str:
    """The kind the manifest of the bundle folder `path` declares ("model", "gbm", "next_items", "pipeline");
    ValueError in one line naming the path when it is no bundle, of an unknown kind, or of a newer format."""
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"load: {folder} is not a folder (a bundle is a folder that hugerec export or pipeline build wrote)")
    where = folder / MANIFEST
    if not where.is_file():
        raise ValueError(f"load: {folder} is not a bundle: it has no {MANIFEST}")
    try:
        manifest: Any = json.loads(where.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"load: {where} is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"load: {where} must hold a JSON object, got {type(manifest).__name__}")
    kind = manifest.get("kind")
    if kind is None:
        fmt = manifest.get("format")
        if fmt == version_delta.FORMAT:
            raise ValueError(f"load: {folder} is a version delta, not a bundle: load it onto a served version (the admin load_delta route)")
        if fmt != model_bundle.FORMAT:
            raise ValueError(f"load: {where} declares no bundle kind (kind {kind!r}, format {fmt!r}); not a hugerec bundle")
        _check_format(where, MODEL, manifest.get("format_version"), model_bundle.FORMAT_VERSION)
        return MODEL
    if kind not in _FORMATS:
        raise ValueError(f"load: {where} declares kind {kind!r}; this hugerec loads {_kinds(KINDS)} bundles")
    _check_format(where, kind, manifest.get("format"), _FORMATS[kind])
    return str(kind)


SERVE_OPTIONS, BATCHING = "options", "batching"


def server_settings_read(path: str | Path) -> tuple[str, frozenset[str]]:
    """(the kind of the bundle at `path`, which of a server's settings for every load it reads): SERVE_OPTIONS,
    the ServeOptions beyond `verify` (tiers, state dir, live updates: a model bundle's, and a pipeline's ranker's
    when it has one), BATCHING (model and gbm). The server lends every load the same settings, so a setting that
    no bundle served reads is one its caller should hear about (`hugerec serve` refuses it). ValueError as
    bundle_kind_of."""
    kind = bundle_kind_of(path)
    match kind:
        case "model":
            return kind, frozenset({SERVE_OPTIONS, BATCHING})
        case gbm_bundle.KIND:
            return kind, frozenset({BATCHING})
        case pipeline_bundle.KIND:
            parts = json.loads((Path(path) / MANIFEST).read_text()).get("parts")
            return kind, frozenset({SERVE_OPTIONS} if isinstance(parts, list) and "ranker" in parts else ())
        case _:
            return kind, frozenset()


def _check_format(where: Path, kind: str, got: object, reads: int) -> None:
    if isinstance(got, int) and not isinstance(got, bool) and got > reads:
        raise ValueError(f"load: {where}: a {kind} bundle of format {got}, newer than this hugerec reads ({reads}); upgrade hugerec")
    if got != reads:
        raise ValueError(f"load: {where}: a {kind} bundle of format {got!r}; this hugerec reads format {reads}")


def _kinds(kinds: tuple[str, ...]) -> str:
    return kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " and " + kinds[-1]


def _model(path: str | Path, settings: LoadSettings, name: str | None, version: str | None) -> ServedModel:
    loaded = load_bundle(path, settings.options, settings.max_request_rows)
    m = loaded.bundle.manifest
    name, version = name or m.name, version or m.version
    info = {"bundle": str(loaded.bundle.path), "bundle_id": loaded.bundle.id, **m.info}
    try:
        served = _scoring(name, version, loaded.model, loaded.preprocess, [loaded.close], info, loaded.model, settings)
    except BaseException:
        loaded.close()
        raise
    try:
        loaded.start_updates(None if settings.on_update is None else settings.on_update(name, version))
    except BaseException:
        served.close()  # the batcher, the watchers started, the parameter server
        raise
    served.info["watchers"] = loaded.watchers
    return served


def _scoring(
    name: str,
    version: str,
    model: Scorer,
    preprocess: RequestPreprocessor,
    closers: list[Callable[[], None]],
    info: dict[str, Any],
    bundle_model: InferenceModel | None,
    settings: LoadSettings,
) -> ServedModel:
    """A scoring version behind its dynamic batcher (closed first on close, then what the loader opened)."""
    signature = model.signature(settings.max_request_rows)
    observer = None if settings.batch_observer is None else settings.batch_observer(name, version)
    batcher = DynamicBatcher(model.predict, settings.batching, observer, name=f"{name}:{version}")
    return ServedModel(name, version, model, batcher, signature, preprocess, info, [batcher.close, *closers], bundle_model)
