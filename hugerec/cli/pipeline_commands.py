"""`hugerec pipeline build` and `hugerec pipeline query`: a pipeline bundle from trained models and a config.

    hugerec pipeline build configs/movielens_pipeline.toml [--out DIR] [--print-config]
    hugerec pipeline query runs/movielens_pipeline --user 1 --k 10 [--history 3,4 [--history-times T1,T2]] [--context hour=9] [--debug]

The config is a pipeline declaration (hugerec.serving.pipeline.declaration: [pipeline], [retrieve],
[filter], [score], [order]) plus [inputs]:

    [inputs]
    retrieval_model = "runs/movielens_two_tower/model.pt"   # `hugerec train` of a two_tower / mf model
    ranker_bundle = "runs/ranker/bundle"                     # optional (needed by [score]): `hugerec export`
    sequential_bundle = "runs/sasrec/bundle"                 # optional: a next-items bundle
    user_features = "users.parquet"                          # optional: column "user" + numeric columns
    item_features = "items.csv"                              # optional: column "item" + numeric columns
    index = "hnsw"                                           # or "exact"
    index_options = { expansion_search = 1000, dtype = "f16" }  # optional: HNSW's connectivity,
                                                             # expansion_add, expansion_search, dtype
    out = "runs/movielens_pipeline"

Ids are the raw ids of the interaction log. The feature tables always hold "events" (training events
of the user) and "count" (training events of the item) beside the columns given; the interaction store
holds the retrieval model's training interactions, with their times (the data's timestamp column) when
the model file carries them (a retrieval model trained by this hugerec does), which a sequential bundle
trained with times (an HSTU with model.times = true) needs; "popular" ranks items by their count.
"""

from __future__ import annotations

import argparse
import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugerec.cli.config_file import ConfigError

if TYPE_CHECKING:  # numpy and the serving stack load when a command runs: `hugerec --help` stays instant
    import numpy as np

PIPELINE_HELP = """\
Build a recommendation pipeline bundle (retrieve, filter, score, order) from trained models and a
config, and query it. The config declares the stages ([retrieve], [filter], [score], [order]) and
names its inputs in [inputs] (see configs/movielens_pipeline.toml). `hugerec serve BUNDLE` serves
the bundle: POST /recommend {"user": 1, "k": 10} and the KServe v2 model of the pipeline's name.
example: hugerec pipeline build configs/movielens_pipeline.toml
example: hugerec pipeline query runs/movielens_pipeline --user 1 --k 10 --debug"""

INPUT_KEYS = ("retrieval_model", "ranker_bundle", "sequential_bundle", "user_features", "item_features", "index", "index_options", "out")
INDEX_OPTIONS = ("connectivity", "expansion_add", "expansion_search", "dtype", "max_norm")
ROOT = Path(__file__).resolve().parents[2]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pipeline", help="build and query a recommendation pipeline bundle", description=PIPELINE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="trained models + a pipeline config -> a pipeline bundle")
    build.add_argument("config", help="the pipeline config (TOML)")
    build.add_argument("--out", help="bundle folder (default: inputs.out)")
    build.add_argument("--print-config", action="store_true", help="print the resolved declaration and inputs and exit")
    query = actions.add_parser("query", help="recommendations from a pipeline bundle, printed as JSON")
    query.add_argument("bundle", help="a pipeline bundle folder")
    query.add_argument("--user", type=int, required=True, help="the raw user id")
    query.add_argument("--k", type=int, default=10, help="items to return (default: 10)")
    query.add_argument("--history", help="comma-separated raw item ids, oldest first, added to the stored history")
    query.add_argument("--history-times", help="comma-separated seconds, one per --history item (needed when the pipeline's "
                       "sequential bundle is an HSTU trained with model.times = true)")
    query.add_argument("--context", action="append", default=[], metavar="KEY=NUMBER", help="a context value (repeatable)")
    query.add_argument("--debug", action="store_true", help="also print every stage's candidates")
    query.add_argument("--seed", type=int, help="seed of the exploration draw")


@dataclass(frozen=True)
class Inputs:
    retrieval_model: Path | None
    ranker_bundle: Path | None
    sequential_bundle: Path | None
    user_features: Path | None
    item_features: Path | None
    index: str
    out: Path
    index_options: tuple[tuple[str, Any], ...] = ()  # IndexConfig's HNSW settings, checked when read


def _config_path(text: str) -> Path:
    p = Path(text)
    if not p.exists() and not p.is_absolute() and (ROOT / p).is_file():
        return ROOT / p  # configs/NAME.toml from any directory
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    return p


def _input(where: Path, key: str, value: object) -> Path:
    """A path of [inputs]: as given when it exists (relative to the current directory), else next to the config."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} [inputs] {key}: must be a path, got {value!r}")
    p = Path(value)
    if not p.exists() and not p.is_absolute() and (where.parent / p).exists():
        return where.parent / p
    return p


def read_config(path_text: str, out: str | None) -> tuple[Any, Inputs]:
    from hugerec.serving.pipeline.declaration import declaration_from_dict

    path = _config_path(path_text)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    unknown = sorted(set(data) - {"inputs", "pipeline", "retrieve", "filter", "score", "order"})
    if unknown:
        raise ConfigError(f"{path}: unknown section [{unknown[0]}]; a pipeline config has [inputs], [pipeline], [retrieve], [filter], [score], [order]")
    raw = data.pop("inputs", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} [inputs]: must be a table")
    bad = sorted(set(raw) - set(INPUT_KEYS))
    if bad:
        raise ConfigError(f"{path} [inputs]: unknown key {bad[0]!r}; known keys are {list(INPUT_KEYS)}")
    try:
        declaration = declaration_from_dict(data, str(path))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    index = raw.get("index", "hnsw")
    if index not in ("hnsw", "exact"):
        raise ConfigError(f"{path} [inputs] index: must be 'hnsw' or 'exact', got {index!r}")
    options = raw.get("index_options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{path} [inputs] index_options: must be a table such as {{ expansion_search = 1000 }}, got {options!r}")
    for key in options:
        if key not in INDEX_OPTIONS:
            raise ConfigError(f"{path} [inputs] index_options: unknown key {key!r}; known keys are {list(INDEX_OPTIONS)}")
    _index_config(index, options, f"{path} [inputs] index_options")  # its checks, now
    if out is None and "out" not in raw:
        raise ConfigError(f"{path} [inputs] out: missing (or give --out)")
    opt = {k: (None if raw.get(k) is None else _input(path, k, raw[k])) for k in INPUT_KEYS[:5]}
    target = Path(out) if out is not None else Path(str(raw["out"]))
    return declaration, Inputs(opt["retrieval_model"], opt["ranker_bundle"], opt["sequential_bundle"], opt["user_features"],
                               opt["item_features"], index, target, tuple(sorted(options.items())))


def _index_config(index: str, options: dict[str, Any], where: str) -> Any:
    """The IndexConfig of [inputs] index and index_options; a bad value is a ConfigError naming it."""
    from hugerec.index.vector_index import IndexConfig, IndexKind

    for key, value in options.items():
        wanted = str if key == "dtype" else (int, float) if key == "max_norm" else int
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise ConfigError(f"{where} {key}: got {value!r}, expected {'a string' if wanted is str else 'a number'}")
    try:
        return IndexConfig(IndexKind.HNSW if index == "hnsw" else IndexKind.EXACT, **options)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def _table(path: Path, id_column: str, where: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    import numpy as np
    import polars as pl

    if not path.is_file():
        raise ConfigError(f"{where}: file not found: {path}")
    try:
        frame = pl.read_parquet(path) if path.suffix == ".parquet" else pl.read_csv(path)
    except Exception as e:  # polars raises several error types for malformed files
        raise ConfigError(f"{where}: cannot read {path}: {' '.join(str(e).split())[:200]}") from None
    if id_column not in frame.columns:
        raise ConfigError(f"{where}: {path} has no column {id_column!r} (columns {frame.columns})")
    columns = {}
    for name in frame.columns:
        if name == id_column:
            continue
        if not frame[name].dtype.is_numeric():
            raise ConfigError(f"{where}: column {name!r} of {path} is {frame[name].dtype}, features must be numbers")
        if frame[name].null_count():
            row = int(frame[name].is_null().arg_max() or 0)
            raise ConfigError(f"{where}: column {name!r} of {path} is empty in data row {row + 1}")
        columns[name] = frame[name].to_numpy()
    ids = frame[id_column].to_numpy()
    if not np.issubdtype(ids.dtype, np.integer):
        raise ConfigError(f"{where}: column {id_column!r} of {path} must hold integer ids, got {frame[id_column].dtype}")
    return ids.astype(np.int64), columns


def _merge(ids: np.ndarray, base_name: str, base: np.ndarray, given: tuple[np.ndarray, dict[str, np.ndarray]] | None, where: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The model's ids with their counts, plus the given table's ids and columns (zeros where one side lacks a row)."""
    import numpy as np

    if given is None:
        return ids, {base_name: base}
    gids, cols = given
    if base_name in cols:
        raise ConfigError(f"{where}: column {base_name!r} is made by the build (training counts); rename it")
    all_ids = np.union1d(ids, gids)
    out = {base_name: np.zeros(len(all_ids), np.float64)}
    out[base_name][np.searchsorted(all_ids, ids)] = base
    at = np.searchsorted(all_ids, gids)
    for name, values in cols.items():
        col = np.zeros(len(all_ids), np.float64)
        col[at] = values
        out[name] = col
    return all_ids, out


def build(config: str, out: str | None) -> tuple[Path, Any]:
    import numpy as np

    from hugerec.models.registry import Family
    from hugerec.serving.bundles.pipeline_bundle import export_pipeline
    from hugerec.serving.pipeline.encoder import UserEncoder
    from hugerec.serving.pipeline.feature_store import FeatureStore
    from hugerec.serving.pipeline.interaction_store import InteractionStore
    from hugerec.training.model_file import load_model

    declaration, inputs = read_config(config, out)
    if inputs.retrieval_model is None:
        raise ConfigError(f"{config} [inputs] retrieval_model: missing (the model `hugerec train` wrote for a two_tower or mf config)")
    if not inputs.retrieval_model.is_file():
        raise ConfigError(f"{config} [inputs] retrieval_model: no model at {inputs.retrieval_model}; run `hugerec train` first")
    try:
        saved = load_model(inputs.retrieval_model, Family.RETRIEVAL)
    except ValueError as e:
        raise ConfigError(f"{config} [inputs] retrieval_model: {e}") from None
    ids = saved.ids
    assert ids is not None and ids.users is not None and ids.train_csr is not None  # save_model's retrieval checks
    encoder = UserEncoder(saved.model, ids.users, ids.items)  # type: ignore[arg-type]  # a retrieval model
    offsets, dense_items = ids.train_csr
    users_raw, items_raw = ids.users, ids.items
    per_user = np.diff(offsets)
    events_users = np.repeat(users_raw, per_user)
    events_items = items_raw[dense_items]
    where = f"{config} [inputs]"
    user_given = None if inputs.user_features is None else _table(inputs.user_features, "user", f"{where} user_features")
    item_given = None if inputs.item_features is None else _table(inputs.item_features, "item", f"{where} item_features")
    uids, ucols = _merge(users_raw, "events", per_user.astype(np.float64), user_given, f"{where} user_features")
    counts = np.bincount(dense_items, minlength=len(items_raw)).astype(np.float64)
    iids, icols = _merge(items_raw, "count", counts, item_given, f"{where} item_features")
    store = FeatureStore.in_memory({"user": tuple(ucols), "item": tuple(icols)})
    try:
        store.write("user", uids, ucols)
        store.write("item", iids, icols)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
    popular = items_raw[np.lexsort((items_raw, -counts))]
    index_config = _index_config(inputs.index, dict(inputs.index_options), f"{config} [inputs] index_options")
    try:
        seen = InteractionStore.from_pairs(events_users, events_items, times=ids.train_times)  # times: None in older model files
        path = export_pipeline(inputs.out, declaration, store, seen, popular, encoder,
                               index_config, inputs.ranker_bundle, inputs.sequential_bundle)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"{config}: {' '.join(str(e).split())}") from None
    return path, declaration


def query(args: argparse.Namespace) -> dict[str, Any]:
    from hugerec.serving.bundles.any_bundle import bundle_kind_of, load
    from hugerec.serving.pipeline.runner import Query, StageError
    from hugerec.serving.pipeline.served_pipeline import ServedPipeline
    from hugerec.serving.runtime.inference_protocol import RequestError

    history = _integers(args.history, "--history", "ids, e.g. 1,2,3")
    times = None if args.history_times is None else tuple(_integers(args.history_times, "--history-times", "seconds, e.g. 978300760,978301968"))
    context: dict[str, float] = {}
    for item in args.context:
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not key or not math.isfinite(number):
            raise ConfigError(f"--context {item!r}: expected KEY=NUMBER, e.g. hour=9")
        context[key] = number
    kind = bundle_kind_of(args.bundle)  # refused before anything is loaded
    if kind != "pipeline":
        raise ConfigError(f"{args.bundle} is a {kind} bundle; pipeline query needs a pipeline bundle (hugerec pipeline build)")
    loaded = load(args.bundle)
    try:
        assert isinstance(loaded, ServedPipeline)  # the manifest's kind said so
        rec = loaded.pipeline.recommend(Query(args.user, args.k, tuple(history), context, args.seed, times), args.debug)
    except (RequestError, StageError) as e:
        raise ConfigError(str(e)) from None
    finally:
        loaded.close()
    return {"pipeline": loaded.name, "version": loaded.version, "user": args.user, **rec.to_json()}


def _integers(text: str | None, flag: str, example: str) -> list[int]:
    """Comma-separated integers of a flag (within int64); a bad one is a ConfigError naming the flag."""
    out: list[int] = []
    for v in (v.strip() for v in (text or "").split(",") if text):
        if not v.lstrip("-").isdigit() or len(v) > 20 or not -(1 << 63) <= int(v) < 1 << 63:
            raise ConfigError(f"{flag}: {v[:40]!r} is not an integer within int64 (give comma-separated {example})")
        out.append(int(v))
    return out


def run(args: argparse.Namespace) -> int:
    """`hugerec pipeline ...`; mistakes are one line on stderr and exit 2."""
    import os
    import sys

    try:
        if args.action == "build":
            if args.print_config:
                from hugerec.serving.pipeline.declaration import declaration_to_dict

                declaration, inputs = read_config(args.config, args.out)
                shown: dict[str, Any] = {k: (None if v is None else str(v)) for k, v in vars(inputs).items()}
                shown["index_options"] = dict(inputs.index_options)
                print(json.dumps({**declaration_to_dict(declaration), "inputs": shown}, indent=1))
                return 0
            path, declaration = build(args.config, args.out)
            print(f"pipeline build: {declaration.name} version {declaration.version} -> {path}")
            print(f"  query it: hugerec pipeline query {path} --user ID --k 10   serve it: hugerec serve {path}")
            return 0
        print(json.dumps(query(args), indent=1))
        return 0
    except (ConfigError, ValueError, FileNotFoundError) as e:
        if os.environ.get("HUGEREC_DEBUG"):
            raise
        print(f"hugerec pipeline {args.action}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
