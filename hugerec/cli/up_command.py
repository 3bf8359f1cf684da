"""`hugerec up`: one command from an interaction log (or the synthetic interaction world) to a live recommender.

    hugerec up [LOG | FOLDER | CONFIG.toml] [KEY=VALUE ...] [--out DIR] [--user-column C] [--item-column C]
               [--time-column C] [--label-column C] [--ranker | --no-ranker] [--port 8000] [--host 127.0.0.1]
               [--no-serve] [--print-config] [--loop [--loop-every SECONDS]] [--world-users U] [--world-items I]

Each step is the entry point of the command a user would run by hand, on the config files `up` writes
to --out (default runs/up), so that the next step is editing them:

    1. schema    LOG -> hugerec.data.input_spec.infer_spec (what `hugerec schema` prints), the user, item
                 and time columns given their roles (by --*-column or by name), a 0/1 label column
                 (--label-column or by name) role label, every other column role "none" ->
                 OUT/retriever.toml: [preprocess] (leave-last-out split) + a two-tower; OUT/up.toml:
                 [ranker], how the ranking stage is built (up_ranker.RankerSection)
    2. train     `hugerec train OUT/retriever.toml` (task_commands.train_retrieval)
    3. ranker    labelled rows of the retriever's training part (up_ranker: the log's 0/1 labels; or
                 positives = interactions, sampled negatives) -> OUT/ranker.toml -> `hugerec preprocess`,
                 `hugerec train` (a DCN-v2, early stopping on the latest rows), `hugerec export`.
                 ranker.enabled = "auto" (the default) builds it for a labelled log only, with one line
                 saying so for an implicit log; --ranker / ranker.enabled = true builds it on either,
                 --no-ranker / ranker.enabled = false on neither
    4. pipeline  OUT/pipeline.toml (retrieve from the two-tower's index, popular items for unknown users,
                 drop what the user has seen, score with the ranker) -> `hugerec pipeline build`
                 (pipeline_commands.build)
    5. serve     `hugerec serve OUT/pipeline` (serving.http.server.serve) on 127.0.0.1 until Ctrl-C

Without LOG the events come from the synthetic interaction world (hugerec.data.synthetic_interactions:
the generating model is known, so the Bayes-optimal ranking is too), written to OUT/events.csv and
then read like any log; before serving, `up` reports the served pipeline's hit rate@20 on each user's
held-out last event, with --ranker beside the retrieval stage's alone (the pipeline without [score],
built for this as OUT/pipeline-retrieval), and the oracle's (the generator's true logits over the items the user has
not seen). With CONFIG.toml (e.g. an edited OUT/retriever.toml) steps 2-5 run on it; its pipeline
config is the pipeline.toml beside it when there is one (written there when not), its up.toml likewise.

A FOLDER is a log in several files of one layout (preprocess.input is its glob). With --loop a thread
watches it: once its files changed and then stayed unchanged for one look, steps 2 and 3 run again
(the bundle as OUT/pipeline-vN) and the new version is published through the server's admin API, as
`hugerec loop` publishes (continuous.publish: load, promote, unload the previous version), with an admin
token only this process knows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugerec.cli.config_file import ConfigError

if TYPE_CHECKING:  # the data, training and serving stacks load when the command runs: `hugerec --help` stays instant
    from hugerec.cli.run_config import RunConfig
    from hugerec.cli.up_ranker import RankerSection
    from hugerec.continuous.publish import Publisher
    from hugerec.data.input_spec import InputSpec
    from hugerec.data.synthetic_interactions import SyntheticInteractions

UP_HELP = """\
One command from an interaction log to a live recommender on 127.0.0.1: guesses the log's columns
(as `hugerec schema`; the user, item and time columns by name, or --user-column / --item-column /
--time-column), trains a two-tower retriever (`hugerec train`), then, when the log has a 0/1 label
column (named label, click, ... or --label-column), a ranker on its labelled rows (an implicit log of
user, item and time gets none: there a ranker on sampled negatives ranks worse than the retriever
alone; --ranker adds one anyway, each interaction a positive and sampled items the user has not
interacted with the negatives; --no-ranker leaves it out always), builds the index and a pipeline
(`hugerec pipeline build`: retrieve, drop seen items, popular items for unknown users, rank) and
serves POST /recommend {"user": ID, "k": 10} (`hugerec serve`) until Ctrl-C, printing a curl to try.
Every step is written out as the config files you would otherwise write (OUT/retriever.toml,
OUT/ranker.toml, OUT/pipeline.toml, OUT/up.toml; OUT is --out, default runs/up), with the commands
that run them by hand: edit them and run `hugerec up OUT/retriever.toml`. KEY=VALUE overrides apply
to the retriever's config (e.g. train.epochs=2), ranker.KEY=VALUE to up.toml's [ranker] (e.g.
ranker.negatives=8). Without a LOG it uses the synthetic interaction world (no download) and
reports the served pipeline's hit rate@20 beside the oracle's (the best any model can do there; with
--ranker also the retrieval stage's alone). The log needs integer user and item ids and a time column (epoch
seconds or a date); it may be a folder of files of one layout, and with --loop `up` keeps watching
that folder: when new files land it retrains on all of them and serves the new pipeline version in
place of the old one.
example: hugerec up
example: hugerec up events.csv --port 8000
example: hugerec up --no-serve --world-users 300 --world-items 200 train.epochs=1
example: hugerec up --no-serve --ranker --world-users 300 --world-items 200 train.epochs=1 ranker.epochs=1"""

# Column names read as the user / item (lower case, without "_" and "-"); others need --user-column / --item-column
USER_NAMES = ("user", "userid", "uid", "customer", "customerid", "visitor", "visitorid", "member", "memberid", "account", "accountid")
ITEM_NAMES = (
    "item", "itemid", "iid", "movie", "movieid", "product", "productid", "article", "articleid", "sku",
    "track", "trackid", "song", "songid", "video", "videoid", "book", "bookid", "business", "businessid",
)  # fmt: skip
TIME_NAME = re.compile(r"(time|date|^ts$|_ts$)", re.I)
# Column names read as a 0/1 label (the log is then labelled: the ranker trains on its rows, nothing is sampled)
LABEL_NAMES = ("label", "click", "clicked", "isclick", "target", "converted", "conversion", "purchased")
HIT_K = 20  # the hit rate's K, on the synthetic world
# Step 3's line when ranker.enabled = "auto" meets an implicit log (the comparison: benchmarks/README.md, `hugerec up`)
NO_LABELS = (
    "no ranker: the log has no label column, and on interactions + sampled negatives a ranker ranked the retriever's "
    "candidates worse than the retriever alone (validation split, benchmarks/README.md); add one with --ranker or ranker.enabled = true"
)


@dataclass(frozen=True)
class World:
    """The synthetic interaction world `up` uses without a log (sizes chosen to train in a minute or two)."""

    users: int = 2000
    items: int = 500
    seed: int = 0

    def __post_init__(self) -> None:
        if self.users < 2 or self.items < 50:
            raise ValueError(f"--world-users must be >= 2 and --world-items >= 50, got {self.users}, {self.items}")


# The two-tower's settings written into retriever.toml, each set chosen on a validation split (benchmarks/README.md,
# "Retrieval"): for a log, configs/movielens_two_tower.toml's (MovieLens-1M), with fewer sampled negatives for
# small catalogues; for the synthetic world, the synthetic benchmark's (its draws carry no order, so the whole
# history is pooled as a set: dot product, no recent-item windows).
LOG_TOWERS = {"max_history": 50, "recent": "[1, 5]", "similarity": "cosine", "temperature": 0.05, "epochs": 4}
WORLD_TOWERS = {"max_history": 100, "recent": "[]", "similarity": "dot", "temperature": 1.0, "epochs": 5}
RETRIEVER = """\
[interactions]                 # the retrieval view of [preprocess]'s events: one history per user
batch_size = 1024
ks = [10, 20]

[embedding]
optimizer = {{ type = "adam", lr = 0.01 }}

[model]
type = "two_tower"
dim = 64
embedding_dim = 64
user_layers = [256]
max_history = {max_history}              # the user tower pools the last max_history items ...
recent = {recent}                # ... and, apart, each window of the last N
similarity = "{similarity}"
temperature = {temperature}
loss = "sampled_softmax"       # in-batch + sampled negatives with logQ correction
negatives = "mixed"
num_negatives = 256
mask_history = true            # a user's history items are not taught as their negatives

[train]
epochs = {epochs}
lr = 0.001
seed = 0
out_dir = {out_dir}
"""

PIPELINE = """\
# Written by `hugerec up`: the pipeline over the two-tower of retriever.toml{and_ranker}. By hand:
#   hugerec pipeline build {self}
#   hugerec serve {out}
# Retrieve from the index (the user vector from the user id and recent history); popular items for a
# user the model never saw (cold_k; k = 1 for known users); drop what the user has seen; {score_note}

[inputs]
retrieval_model = {model}
index = "{index}"{ranker_inputs}
out = {out_q}

[pipeline]
name = "up"
version = "1"

[retrieve]
sources = [
  {{ kind = "ann", k = {ann_k} }},
  {{ kind = "popular", k = 1, cold_k = 100 }},
]

[filter]
exclude_seen = true
{score}
[order]
max_k = 100
"""
SCORE = """
[score]                        # the ranker on each candidate, its inputs read from the feature tables: the
sparse = [["user", "user.ranker_user"], ["item", "item.ranker_item"]]   # ids' Categorify codes in the ranker
dense = {dense}
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "up",
        help="an interaction log (or the synthetic world) -> a live recommender on 127.0.0.1, in one command",
        description=UP_HELP,
        usage="hugerec up [LOG | FOLDER | CONFIG.toml] [KEY=VALUE ...] [options]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("args", nargs="*", metavar="LOG | FOLDER | CONFIG.toml | KEY=VALUE", help="an event log (a file or a folder of files) or a retriever config, and overrides")
    p.add_argument("--out", type=Path, default=Path("runs/up"), help="folder for the configs, models and bundle (default: runs/up)")
    p.add_argument("--user-column", help="the log's user id column (default: a column named user, user_id, ...)")
    p.add_argument("--item-column", help="the log's item id column (default: a column named item, item_id, movie_id, ...)")
    p.add_argument("--time-column", help="the log's time column (default: the first timestamp column, or one named like a time)")
    p.add_argument("--label-column", help="the log's 0/1 label column, used by the ranker instead of sampled negatives (default: a column named label, click, ...)")
    p.add_argument("--ranker", action="store_true", help="a ranking stage even for a log without a label column (up.toml: ranker.enabled = true; the default \"auto\" builds one for a labelled log only)")
    p.add_argument("--no-ranker", action="store_true", help="no ranking stage: the pipeline ranks by the retriever alone (up.toml: ranker.enabled = false)")
    p.add_argument("--world-users", type=int, default=World.users, help=f"users of the synthetic world (default: {World.users})")
    p.add_argument("--world-items", type=int, default=World.items, help=f"items of the synthetic world (default: {World.items})")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--no-serve", action="store_true", help="stop after building the pipeline (print the serve command)")
    p.add_argument("--print-config", action="store_true", help="print the configs it would write and exit (nothing is trained)")
    p.add_argument("--loop", action="store_true", help="LOG is a folder: retrain and serve the new version whenever new files land in it")
    p.add_argument("--loop-every", type=float, default=30.0, help="seconds between looks at the folder (default: 30)")


# -- step 1: the log's columns -> retriever.toml ------------------------------------------------------
def _key(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def _pick(spec: InputSpec, given: str | None, names: tuple[str, ...], what: str, flag: str, log: Path) -> str:
    columns = [c.name for c in spec.columns]
    if given is not None:
        if given not in columns:
            raise ConfigError(f"{flag} {given!r}: {log} has no such column (columns {columns})")
        return given
    found = [c for c in columns if _key(c) in names]
    if not found:
        raise ConfigError(f"{log} has no {what} column (columns {columns}); name it with {flag} COLUMN")
    return found[0]


def log_spec(log: Path, user: str | None, item: str | None, when: str | None, label: str | None = None) -> InputSpec:
    """The log's guessed spec (`hugerec schema`'s) with roles user, item and timestamp, a number column given
    as the label (or named like one) role label; other columns "none"."""
    from hugerec.data.input_spec import ColumnSpec, ColumnType, Role, infer_spec

    if not log.is_file():
        raise ConfigError(f"{log}: no such file" if not log.exists() else f"{log} is not a file; give an event log (CSV, TSV, Parquet)")
    try:
        spec = infer_spec(log)
    except (ValueError, OSError) as e:  # unreadable, empty, not delimited text
        raise ConfigError(f"cannot read {log} as an event log: {' '.join(str(e).split())}") from None
    user_col = _pick(spec, user, USER_NAMES, "user", "--user-column", log)
    item_col = _pick(spec, item, ITEM_NAMES, "item", "--item-column", log)
    if user_col == item_col:
        raise ConfigError(f"{log}: column {user_col!r} cannot be both the user and the item")
    names = [c.name for c in spec.columns]
    if when is not None and when not in names:
        raise ConfigError(f"--time-column {when!r}: {log} has no such column (columns {names})")
    if when is None:
        stamped = [c.name for c in spec.columns if c.type is ColumnType.TIMESTAMP]
        named = [c.name for c in spec.columns if TIME_NAME.search(c.name) and c.type in (ColumnType.INT, ColumnType.FLOAT)]
        candidates = [n for n in (*stamped, *named) if n not in (user_col, item_col)]
        if not candidates:
            raise ConfigError(
                f"{log} has no time column (columns {names}); the held-out events are each user's last: name it with --time-column COLUMN"
            )
        when = candidates[0]
    if label is not None and label not in names:
        raise ConfigError(f"--label-column {label!r}: {log} has no such column (columns {names})")
    if label is None:
        named = [c.name for c in spec.columns if _key(c.name) in LABEL_NAMES and c.name not in (user_col, item_col, when)]
        label = named[0] if named else None
    if label in (user_col, item_col, when):
        raise ConfigError(f"{log}: column {label!r} cannot be both the label and the {'user' if label == user_col else 'item' if label == item_col else 'time'}")
    columns = []
    for c in spec.columns:
        if c.name in (user_col, item_col):
            if c.type is not ColumnType.INT:
                raise ConfigError(f"column {c.name!r} of {log} holds {c.type.value} values; the {'user' if c.name == user_col else 'item'} ids must be integers")
            columns.append(ColumnSpec(c.name, ColumnType.INT, Role.USER if c.name == user_col else Role.ITEM))
        elif c.name == when:
            if c.type is ColumnType.TIMESTAMP:
                columns.append(replace(c, role=Role.TIMESTAMP))
            elif c.type in (ColumnType.INT, ColumnType.FLOAT):  # numbers: epoch seconds
                columns.append(ColumnSpec(c.name, ColumnType.TIMESTAMP, Role.TIMESTAMP, format="unix"))
            else:
                raise ConfigError(f"column {when!r} of {log} holds {c.type.value} values, not times (epoch seconds or dates)")
        elif c.name == label:
            if c.type not in (ColumnType.INT, ColumnType.FLOAT):
                raise ConfigError(f"column {label!r} of {log} holds {c.type.value} values; a label is 0 or 1 (or leave it out: --label-column names another)")
            columns.append(ColumnSpec(c.name, c.type, Role.LABEL))
        else:
            columns.append(replace(c, role=Role.NONE))
    return replace(spec, columns=tuple(columns))


def _q(text: str) -> str:
    return json.dumps(text)  # a TOML basic string: JSON's escapes are TOML's


def retriever_toml(spec: InputSpec, files: str, out: Path, note: str, towers: dict[str, object]) -> str:
    """retriever.toml: the log's [preprocess] section (`hugerec schema`'s, roles set) and the two-tower."""
    from hugerec.data.input_spec import spec_to_toml

    section = spec_to_toml(spec, files)
    section = section.replace("# Written by `hugerec schema`: check each column's type and role, then run `hugerec preprocess`.\n", "")
    head = (
        f"# Written by `hugerec up`{note}: a two-tower retriever on the event log. By hand:\n"
        f"#   hugerec train {out / 'retriever.toml'}\n"
        f"#   hugerec pipeline build {out / 'pipeline.toml'}\n"
        f"#   hugerec serve {out / 'pipeline'}\n"
    )
    split = 'split = "leave_last_out"       # each user\'s last event (by time) is held out for the metrics\nholdout = 1\n'
    return head + section + split + "\n" + RETRIEVER.format(**towers, out_dir=_q(str((out / "retriever").resolve())))


def pipeline_toml(path: Path, model: Path, out: Path, num_items: int, ranker: RankerFiles | None = None) -> str:
    """pipeline.toml: retrieve, filter, (score with the ranker,) order."""
    index = "exact" if num_items <= 50_000 else "hnsw"  # exact top-k is cheap for small catalogues
    inputs = "" if ranker is None else (
        f"\nranker_bundle = {_q(str(ranker.bundle.resolve()))}"
        f"\nuser_features = {_q(str(ranker.users.resolve()))}     # user, ranker_user (its code in the ranker)"
        f"\nitem_features = {_q(str(ranker.items.resolve()))}     # item, ranker_item"
    )
    return PIPELINE.format(
        self=path, out=out, model=_q(str(model.resolve())), index=index, out_q=_q(str(out.resolve())), ann_k=min(300, num_items),
        and_ranker="" if ranker is None else " and the ranker of ranker.toml",
        score_note="no ranker (a [score] section would add one)." if ranker is None else "score the rest with the ranker.",
        ranker_inputs=inputs, score="" if ranker is None else SCORE.format(dense=json.dumps(list(ranker.dense))),
    )  # fmt: skip


@dataclass(frozen=True)
class RankerFiles:
    """What the pipeline's Score stage reads: the ranker's bundle and its id-code feature tables."""

    bundle: Path
    users: Path
    items: Path
    dense: tuple[str, ...] = ()  # the ranker's dense inputs as feature references ("user.u0", "item.i0", ...)


# -- the synthetic world ----------------------------------------------------------------------------------
def make_world(world: World, path: Path) -> SyntheticInteractions:
    """Generate the world and write its events as a CSV log (user, item, timestamp)."""
    from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions

    synth = generate_interactions(
        InteractionConfig(num_users=world.users, num_items=world.items, rank=8, min_events=20, max_events=40, seed=world.seed)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    synth.data.frame.write_csv(tmp)
    tmp.replace(path)
    return synth


def world_spec() -> InputSpec:
    """The columns of the world's log as make_world writes it: user, item, timestamp (int seconds), no label."""
    from hugerec.data.input_spec import ColumnSpec, ColumnType, InputSpec, Role

    return InputSpec(columns=(
        ColumnSpec("user", ColumnType.INT, Role.USER),
        ColumnSpec("item", ColumnType.INT, Role.ITEM),
        ColumnSpec("timestamp", ColumnType.TIMESTAMP, Role.TIMESTAMP, format="unix"),
    ))  # fmt: skip


def hit_rates(synth: SyntheticInteractions, bundles: dict[str, Path], k: int = HIT_K) -> dict[str, float]:
    """Hit rate@k on each user's last event: each pipeline bundle's answers (by name), and the oracle's
    ("oracle": true logits, seen items excluded)."""
    import numpy as np

    from hugerec.ops.kernel_threads import kernel_threads
    from hugerec.serving.bundles.any_bundle import load
    from hugerec.serving.pipeline.runner import Query
    from hugerec.serving.pipeline.served_pipeline import ServedPipeline

    frame = synth.data.frame.sort(["user", "timestamp"])
    users, items = frame["user"].to_numpy(), frame["item"].to_numpy()
    last = np.r_[users[1:] != users[:-1], True]  # each user's last event: the held-out target
    starts = np.r_[0, np.flatnonzero(last)[:-1] + 1]
    hits = dict.fromkeys([*bundles, "oracle"], 0)
    loaded: dict[str, ServedPipeline] = {}
    # one query at a time: parallel regions cost more than they save on one row (on a loaded 2-core
    # machine 33 ms instead of 2 ms per query of the retrieval pipeline, with Numba's threads alone)
    with kernel_threads(1), contextlib.ExitStack() as stack:
        for name, bundle in bundles.items():
            one = load(bundle)
            assert isinstance(one, ServedPipeline), one.kind  # hugerec up built it as a pipeline bundle
            stack.callback(one.close)
            loaded[name] = one
        for lo in range(0, len(starts), 512):
            block = np.arange(lo, min(lo + 512, len(starts)))
            true = synth.true_scores(users[starts[block]])  # [b, I]
            for row, j in enumerate(block):
                end = starts[j + 1] - 1 if j + 1 < len(starts) else len(users) - 1
                user, seen, target = int(users[starts[j]]), items[starts[j] : end], int(items[end])
                s = true[row].copy()
                s[seen] = -np.inf
                hits["oracle"] += int(target in np.argpartition(-s, k)[:k])
                for name, one in loaded.items():
                    hits[name] += int(target in one.pipeline.recommend(Query(user, k)).items)
    return {name: h / len(starts) for name, h in hits.items()}


# -- the command ------------------------------------------------------------------------------------------
def _step(n: int, text: str, quiet: bool = False) -> float:
    if not quiet:  # --print-config prints the configs alone
        print(f"[{n}/5] {text}", flush=True)
    return time.perf_counter()


def _split(words: list[str]) -> tuple[Path | None, list[str], list[str]]:
    """(the log or config, the retriever's KEY=VALUE overrides, up.toml's ranker.KEY=VALUE ones)."""
    sources = [w for w in words if "=" not in w]
    if len(sources) > 1:
        raise ConfigError(f"expected one event log or config file, got {sources}; overrides are KEY=VALUE")
    overrides = [w for w in words if "=" in w]
    ranker = [w for w in overrides if w.startswith("ranker.")]
    return (Path(sources[0]) if sources else None), [w for w in overrides if w not in ranker], ranker


def run(args: argparse.Namespace) -> int:
    """`hugerec up ...`: mistakes are one line on stderr and exit 2; Ctrl-C stops the server and exits 0."""
    try:
        return _up(args)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        if os.environ.get("HUGEREC_DEBUG"):
            raise
        print(f"hugerec up: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hugerec up: stopped", file=sys.stderr)
        return 0


def _up(args: argparse.Namespace) -> int:
    from hugerec.cli.up_ranker import read_up_toml, up_toml

    source, overrides, ranker_overrides = _split(list(args.args))
    out: Path = args.out
    if args.loop and (source is None or not source.is_dir()):
        raise ConfigError("--loop watches a folder of log files for new ones: give the folder (e.g. hugerec up logs/ --loop)")
    if not 0 < args.loop_every <= 86400:
        raise ConfigError(f"--loop-every must be in (0, 86400] seconds, got {args.loop_every}")
    columns_given = any(getattr(args, f) is not None for f in ("user_column", "item_column", "time_column", "label_column"))
    if columns_given and (source is None or source.suffix == ".toml"):
        raise ConfigError("--user-column / --item-column / --time-column / --label-column name a log's columns; " + ("give the log" if source is None else f"{source} declares its columns"))
    synth = None
    t_start = time.perf_counter()
    if args.ranker and args.no_ranker:
        raise ConfigError("--ranker and --no-ranker contradict each other; give one (or neither: a ranker for a log with a label column only)")
    if args.ranker or args.no_ranker:
        ranker_overrides = [*ranker_overrides, f"ranker.enabled={'true' if args.ranker else 'false'}"]
    if source is not None and source.suffix == ".toml":
        if not source.is_file():
            raise ConfigError(f"config file not found: {source}")
        config_path = source
        pipeline_path, up_path = source.with_name("pipeline.toml"), source.with_name("up.toml")
        section = read_up_toml(up_path, ranker_overrides)
        _step(1, f"config {config_path} (the log's columns as it declares them)", args.print_config)
    else:
        config_path, pipeline_path, up_path = out / "retriever.toml", out / "pipeline.toml", out / "up.toml"
        section = read_up_toml(None, ranker_overrides)
        if source is None:
            world = World(args.world_users, args.world_items)
            log = out / "events.csv"
            t0 = _step(1, f"synthetic interaction world: {world.users:,} users x {world.items:,} items -> {log}", args.print_config)
            if not args.print_config:
                synth = make_world(world, log)
                print(f"      {synth.data.num_events:,} events ({time.perf_counter() - t0:.1f} s)", flush=True)
            spec = world_spec()
            text = retriever_toml(spec, str(log.resolve()), out, " for the synthetic interaction world", WORLD_TOWERS)
        else:
            first, files = log_files(source)
            t0 = _step(1, f"schema of {first}", args.print_config)
            spec = log_spec(first, args.user_column, args.item_column, args.time_column, args.label_column)
            text = retriever_toml(spec, files, out, "", LOG_TOWERS)
        if args.print_config:  # checked as `hugerec train` would read it (overrides included), written nowhere
            import tempfile

            from hugerec.cli.run_config import load_run_config

            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "retriever.toml").write_text(text)
                load_run_config(Path(tmp) / "retriever.toml", overrides)
            print(f"# {config_path}\n{text}")
            print(f"# {up_path}\n{up_toml(section, config_path)}")
            if section.trains(any(c.role_value == "label" for c in spec.columns)):
                print(f"# {out / 'ranker.toml'}: written once the labelled rows are (their validation split is by time)")
            return 0
        roles = ", ".join(f"{c.name} = {c.role_value}" for c in spec.columns)
        out.mkdir(parents=True, exist_ok=True)
        config_path.write_text(text)
        up_path.write_text(up_toml(section, config_path))
        print(f"      columns: {roles} -> {config_path}, {up_path}", flush=True)

    cfg = _load(config_path, overrides)
    if args.print_config:
        print(f"# {config_path}\n{config_path.read_text()}")
        print(f"# {up_path}\n{up_toml(section, config_path)}")
        return 0
    t0 = _step(2, f"train {cfg.model_type} (hugerec train {config_path}{''.join(' ' + o for o in overrides)})")
    _train(cfg, t0)
    model = cfg.out_dir / "model.pt"
    num_items, user = _model_facts(model)
    ranker = _rank(cfg, model, config_path.parent, section)
    if not pipeline_path.is_file() or source is None or source.suffix != ".toml":
        pipeline_path.write_text(pipeline_toml(pipeline_path, model, pipeline_path.parent / "pipeline", num_items, ranker))
    elif ranker is not None and "ranker_bundle" not in pipeline_path.read_text():
        print(f"      note: {pipeline_path} has no ranker ([inputs] ranker_bundle, [score]); remove it to have `up` write one with the ranker", flush=True)
    t0 = _step(4, f"pipeline (hugerec pipeline build {pipeline_path})")
    bundle, name, version = _build(pipeline_path, None, t0)
    if synth is not None:
        t0 = time.perf_counter()
        bundles = {"pipeline": bundle}
        if ranker is not None:  # the same pipeline without [score], for the comparison
            alone = pipeline_path.with_name("pipeline-retrieval.toml")
            alone.write_text(pipeline_toml(alone, model, pipeline_path.parent / "pipeline-retrieval", num_items))
            bundles["retrieval"], _, _ = _build(alone, None, t0)
        rates = hit_rates(synth, bundles)
        share = rates["pipeline"] / rates["oracle"] if rates["oracle"] else float("nan")
        alone_text = ""
        if "retrieval" in rates:
            alone_share = rates["retrieval"] / rates["oracle"] if rates["oracle"] else float("nan")
            alone_text = f", retrieval alone {rates['retrieval']:.4f} = {alone_share:.3f}x"
        print(
            f"      hit rate@{HIT_K} on each user's held-out last event: pipeline {rates['pipeline']:.4f}, oracle {rates['oracle']:.4f} "
            f"(the best any model can do on this world) = {share:.3f}x{alone_text} ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    print(f"      ready {time.perf_counter() - t_start:.0f} s after the start")
    train_words = " ".join([str(config_path), *overrides])
    ranker_words = "" if ranker is None else f" && hugerec preprocess {config_path.parent / 'ranker.toml'} && hugerec train {config_path.parent / 'ranker.toml'} && hugerec export {config_path.parent / 'ranker.toml'}"
    print(f"      by hand: hugerec train {train_words}{ranker_words} && hugerec pipeline build {pipeline_path} && hugerec serve {bundle}")
    if args.no_serve:
        print(f"[5/5] not serving (--no-serve): hugerec serve {bundle} --port {args.port}")
        return 0
    loop = None
    if args.loop:
        assert source is not None  # checked above: a folder
        loop = FolderLoop(source, config_path, tuple(overrides), pipeline_path, name, version, args.loop_every, section)
    _serve(bundle, args.host, args.port, user, loop)
    return 0


def _rank(cfg: RunConfig, model: Path, out: Path, section: RankerSection, step: bool = True) -> RankerFiles | None:
    """Step 3: the ranker (up_ranker.build_ranker) on the retriever's training part, or None when it is not
    built (ranker.enabled false, or "auto" on a log without a label column)."""
    from hugerec.cli.up_ranker import build_ranker

    labels = [c.name for c in cfg.preprocess.columns if c.role_value == "label"]
    if not section.trains(bool(labels)):
        if step and section.enabled == "auto":
            _step(3, NO_LABELS)
        elif step:
            _step(3, "no ranker (--no-ranker / ranker.enabled = false): the pipeline ranks by the retriever")
        return None
    if step:
        how = f"the log's labels ({labels[0]})" if labels else f"each interaction + {section.negatives} sampled negatives"
        _step(3, f"ranker on {how} (hugerec train {out / 'ranker.toml'})")
    result = build_ranker(cfg, model, out, section, labels[0] if labels else None)
    print(f"      {result.summary}", flush=True)
    return RankerFiles(result.bundle, result.users, result.items, result.dense)


def log_files(source: Path) -> tuple[Path, str]:
    """A log file, or a folder of log files of one layout: (the file whose columns are read, the preprocess.input)."""
    if not source.is_dir():
        return source, str(source.resolve())
    files = sorted(p for p in source.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ConfigError(f"{source}: no log files in this folder")
    suffix = "".join(files[0].suffixes)
    return files[0], str(source.resolve() / f"*{suffix}")


def _load(config_path: Path, overrides: list[str] | tuple[str, ...]) -> RunConfig:
    from hugerec.cli.run_config import load_run_config
    from hugerec.cli.task_commands import is_retrieval

    cfg = load_run_config(config_path, overrides)
    if not is_retrieval(cfg):
        raise ConfigError(f"{config_path}: model.type = {cfg.model_type!r}; `hugerec up` trains a retriever (two_tower or mf)")
    return cfg


def _train(cfg: RunConfig, t0: float) -> None:
    from hugerec.cli.task_commands import train_retrieval

    metrics = train_retrieval(cfg)
    shown = {k: round(v, 4) for k, v in metrics.items() if "@" in k}
    print(f"      {time.perf_counter() - t0:.1f} s; held-out {json.dumps(shown)} -> {cfg.out_dir / 'model.pt'}", flush=True)


def _build(pipeline_path: Path, out: Path | None, t0: float) -> tuple[Path, str, str]:
    from hugerec.cli.pipeline_commands import build

    bundle, declaration = build(str(pipeline_path), None if out is None else str(out))
    print(f"      {declaration.name} version {declaration.version} -> {bundle} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return bundle, declaration.name, declaration.version


def _model_facts(model: Path) -> tuple[int, int]:
    """The trained model's catalogue size and a user it knows (for the curl example), from its file."""
    from hugerec.training.model_file import load_model

    saved = load_model(model)
    users = saved.ids.users if saved.ids is not None else None
    return len(saved.items_raw), int(users[0]) if users is not None and len(users) else 1


# -- --loop: retrain as new files land ------------------------------------------------------------------
@dataclass(frozen=True)
class FolderLoop:
    """What --loop watches and redoes: the folder's files; the retriever config (its input is the folder's
    files), the pipeline config, the served pipeline's name and version, seconds between looks."""

    folder: Path
    config: Path
    overrides: tuple[str, ...]
    pipeline: Path
    name: str
    version: str
    every_s: float
    ranker: RankerSection | None = None  # up.toml's [ranker] (None: the defaults)

    def __post_init__(self) -> None:
        if not 0 < self.every_s <= 86400:
            raise ValueError(f"--loop-every must be in (0, 86400] seconds, got {self.every_s}")


def _default_section() -> RankerSection:
    from hugerec.cli.up_ranker import RankerSection

    return RankerSection()


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def watch(loop: FolderLoop, publisher: Publisher) -> None:
    """Forever: when the folder's files change and then stay unchanged for one look (a file may still be
    being written), retrain on all of them (`hugerec train`), build the pipeline as the next version
    (`hugerec pipeline build --out OUT/pipeline-vN`) and publish it over the server's admin API as the loop
    does (continuous.publish: load, promote, unload the previous version). A failed round is one line;
    the server keeps serving the version it served."""
    seen, pending = _snapshot(loop.folder), None
    served = loop.version
    number = int(served) if served.isdigit() else 1
    while True:
        time.sleep(loop.every_s)
        now = _snapshot(loop.folder)
        if now == seen or now != pending:
            pending = None if now == seen else now
            continue
        seen, pending, number = now, None, number + 1
        version = str(number)
        t0 = time.perf_counter()
        try:
            print(f"[loop] {len(now)} files in {loop.folder}: retraining (hugerec train {loop.config})", flush=True)
            cfg = _load(loop.config, loop.overrides)
            _train(cfg, t0)
            section = loop.ranker if loop.ranker is not None else _default_section()
            model = cfg.out_dir / "model.pt"
            _rank(cfg, model, loop.config.parent, section, step=False)  # the same files: pipeline.toml reads them
            bundle, _, _ = _build(loop.pipeline, loop.pipeline.parent / f"pipeline-v{version}", t0)
            publisher.publish(bundle, version, 0.0)
            publisher.promote(version)
            publisher.unload(served)
            print(f"[loop] {loop.name} version {version} serving, version {served} unloaded ({time.perf_counter() - t0:.1f} s)", flush=True)
            served = version
        except Exception as e:  # a bad new file or a refused load: said in one line, the served version stays
            if os.environ.get("HUGEREC_DEBUG"):
                import traceback

                traceback.print_exc()
            print(f"hugerec up: loop: error: {' '.join(str(e).split())}; still serving version {served}", file=sys.stderr, flush=True)


def _serve(bundle: Path, host: str, port: int, user: int, loop: FolderLoop | None) -> None:
    from hugerec.serving.http.server import ServerConfig, serve

    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    body = json.dumps({"user": user, "k": 10})
    config = None
    if loop is not None:  # the loop publishes through the admin API, with a token only this process knows
        import secrets
        import threading

        from hugerec.continuous.publish import Publisher, ServerTarget

        token = secrets.token_urlsafe(32)
        config = ServerConfig(admin_token=token)
        publisher = Publisher(ServerTarget(f"http://{shown}:{port}", loop.name, token))  # imported here: not inside the thread
        threading.Thread(target=watch, args=(loop, publisher), name="up-loop", daemon=True).start()
        print(f"[loop] watching {loop.folder} every {loop.every_s:g} s for new log files", flush=True)
    print(f"[5/5] serving {bundle} on http://{shown}:{port} (Ctrl-C stops it); try:", flush=True)
    print(f"      curl -s http://{shown}:{port}/recommend -H 'Content-Type: application/json' -d '{body}'", flush=True)
    print(f"      or open http://{shown}:{port}/ (the status page, with a form to try it)", flush=True)
    serve(bundle, host=host, port=port, config=config, threads=1)  # `hugerec serve`'s default: idle torch threads cost CPU per request
