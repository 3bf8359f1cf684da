"""`hugerec loop` of a retrieval model (`model.type = "two_tower"` or `"mf"`): continuous.retrieval_loop from a TOML file.

    [loop]       work_dir, first, last (windows first..last-1 are trained; window `last` is the final holdout), name
                 (the pipeline's name on the server), batch_size, lr, epochs (the first model's, from scratch),
                 warm_start_epochs (each warm start's passes over its window; may be fractional),
                 warm_start_reset_optimizer (a warm start resets the sparse optimizer state), warm_start_replay (a
                 warm start also trains on that many times its window's event count of earlier events, drawn
                 uniformly: experience replay; 0 = none), canary_share, seed, k
                 (the gate's Recall@K and the pipeline's answers), ann_k (the ANN source's candidates before
                 exclude-seen), keep_versions (previous stables kept, loaded on the server with their bundles, for a
                 manual rollback)
    [data]       [data.interactions] + [data.drift]: a synthetic drifting interaction stream, one window a day
                 (data.synthetic_interactions.generate_interaction_days)
    [preprocess] instead of [data]: your interaction log, declared as `hugerec train` reads it (input, format,
                 separator, header, encoding, quote, null_values, columns with roles user, item, timestamp,
                 schema, on_error), split into windows by its timestamp:
    [windows]    unit ("day", "hour", "minute") and size of the log's windows, numbered from the one holding its
                 earliest event (aligned to the epoch); ids are the log's (its users and items when the loop
                 first starts, dense in sorted raw order; work_dir/users.parquet and items.parquet give each
                 dense id's raw one, which the published pipelines take)
    [model]      the [model] of every command: "two_tower" (user ids only: max_history = 0, recent = []) or "mf"
    [embedding]  optimizer: the towers' sparse optimizer
    [gate]       recall_margin, min_rows (users; the gate and the canary decision on Recall@K), user_share (the
                 share of the users they measure, a fixed draw: the others are left to judge the served model)
    [index]      the ANN index built afresh for every published pipeline (kind "hnsw" or "exact", HNSW's settings)
    [server]     mode "offline" (a published candidate serves at once), "embedded" (a server in this process on
                 127.0.0.1; its status page shows the decisions) or "remote" (url, model, the admin token from the
                 environment variable `token_env`)

A later start in the same work_dir with a changed config is refused in one line naming the changed keys
(loop_command.keep_loop_settings), except CONTINUE_MAY_CHANGE: loop.first, loop.last, loop.keep_versions, the
simulated traffic and the token's variable (data.drift.days is not among them: the drifting stream's days
depend on their number). Over a log, its users, items and a digest of their raw ids are kept too: a log grown by
events of the same users and items continues (new windows to run), one with new users or items is refused.

The ranking loop's keys (loop.holdout_share, [windows], [embedding] dim, [gate] auc_margin, [decisions], [monitor],
[recovery], server.replay_rows, ...) are refused with a retrieval model, and these with a ranking model, in one
line naming the key (loop_command.refuse_other_family).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import secrets
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hugerec.cli.config_file import ConfigError, from_dict, to_dict
from hugerec.cli.run_config import PreprocessSection, declared_input, find_input
from hugerec.continuous.decision_log import read_log
from hugerec.continuous.publish import Publisher, ServerTarget
from hugerec.continuous.retrieval_loop import EventSource, RetrievalLoop, RetrievalLoopConfig
from hugerec.data.events import interaction_log
from hugerec.data.interactions import Interactions, Vocabulary, held_out_csr, time_windows
from hugerec.data.synthetic_interactions import DriftConfig, InteractionConfig, generate_interaction_days
from hugerec.data.windows import Windows, WindowUnit
from hugerec.embedding.optimizers import Adagrad, Optimizer, optimizer_from_dict, optimizer_to_dict
from hugerec.index.vector_index import IndexConfig, IndexKind
from hugerec.models.mf import MFConfig
from hugerec.models.registry import config_to_dict
from hugerec.models.two_tower import TwoTowerConfig


def _loop_tower() -> TwoTowerConfig:
    return TwoTowerConfig(dim=32, embedding_dim=32, user_layers=(), max_history=0, recent=())


def check_server_mode(mode: str, url: str) -> None:
    """[server] mode and url of either loop: offline, embedded, or remote with a url (ValueError naming the key)."""
    if mode not in ("offline", "embedded", "remote"):
        raise ValueError(f"server.mode must be 'offline', 'embedded' or 'remote', got {mode!r}")
    if mode == "remote" and not url:
        raise ValueError("server.mode = 'remote' needs server.url (http://host:port)")


@dataclass(frozen=True)
class RetrievalLoopSection:
    """The retrieval loop itself: where it keeps its state, which windows it trains, how it trains and publishes."""

    work_dir: str = "runs/loop_two_tower"  # decisions.jsonl, checkpoints/, bundles/ go here
    first: int = 0  # the first window trained
    last: int | None = None  # default: the stream's last day (window `last` is the final holdout)
    name: str = "recs"  # the pipeline's name on the server
    batch_size: int = 512  # events per training step
    lr: float = 3e-3  # the dense learning rate (Adam)
    epochs: int = 2  # epochs of a model trained from scratch (the first one, over every window so far)
    warm_start_epochs: float | None = None  # passes of a warm start over its window (none: `epochs`; 1.5: one and a half)
    warm_start_reset_optimizer: bool = False  # a warm start resets the towers' sparse optimizer state (weights kept)
    warm_start_replay: float = 0.0  # a warm start also trains on round(this x its window's events) earlier events (0: none)
    canary_share: float = 0.1  # the share of the traffic a published canary gets
    seed: int = 0  # the training's seed
    k: int = 50  # the K of the gate's Recall@K and of the pipeline's answers
    ann_k: int = 200  # candidates the pipeline's ANN source takes before exclude-seen
    keep_versions: int = 1  # previous stables kept (loaded, bundles and checkpoints); older ones and rolled-back canaries go

    def __post_init__(self) -> None:
        w = self.warm_start_epochs
        if w is not None and not (w > 0 and math.isfinite(w)):
            raise ValueError(f"loop.warm_start_epochs must be a number > 0, got {w}")
        r = self.warm_start_replay
        if not (r >= 0 and math.isfinite(r)):
            raise ValueError(f"loop.warm_start_replay must be a number >= 0, got {r}")


@dataclass(frozen=True)
class InteractionStreamSection:
    """[data] of a retrieval loop: a synthetic drifting interaction stream, one window a day."""

    interactions: InteractionConfig = field(default_factory=lambda: InteractionConfig(num_users=3000, num_items=1500))  # users, items, taste model
    drift: DriftConfig = field(default_factory=DriftConfig)  # days, drift, new items, events per user and day


@dataclass(frozen=True)
class LogWindows:
    """[windows] of a retrieval loop over an interaction log ([preprocess]): windows of `size` units of the
    timestamp role's column, numbered from the one holding the log's earliest event (aligned to the epoch, as
    the ranking loop's windows)."""

    unit: WindowUnit = WindowUnit.DAY  # "day", "hour" or "minute"
    size: int = 1  # units per window (unit = "day", size = 7: weeks)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"windows.size must be >= 1, got {self.size}")

    @property
    def seconds(self) -> int:
        return Windows(unit=self.unit, size=self.size).seconds

    def describe(self) -> str:
        return f"{self.size} {self.unit.value}{'s' if self.size > 1 else ''}"


# The [preprocess] keys the retrieval loop reads: how the log is laid out. The others (split, ops, join, out, ...)
# prepare `hugerec train`'s shards, which the loop does not write: its windows split the log by time.
LOG_KEYS = ("input", "format", "schema", "separator", "header", "encoding", "quote", "null_values", "columns", "on_error")


@dataclass(frozen=True)
class RetrievalEmbedding:
    """[embedding] of a retrieval loop: the towers' tables are sized by the stream's users and items."""

    optimizer: Optimizer = field(default_factory=lambda: Adagrad(lr=0.1))  # the towers' sparse optimizer


@dataclass(frozen=True)
class RecallGate:
    """[gate] of a retrieval loop (the ranking loop's keys of the same meaning): a candidate (and, on the next window,
    a canary) passes with a Recall@K (loop.k) at least the serving (stable) model's minus `recall_margin`, measured
    on at least `min_rows` users."""

    recall_margin: float = 0.01  # how far below the serving model's Recall@K a candidate may be
    min_rows: int = 50  # users with events in the window needed to judge (fewer: refuse at the gate, wait with a canary)
    user_share: float = 1.0  # the share of the users (a fixed draw) the gate and the decision measure; the rest judge the served model

    def __post_init__(self) -> None:
        if not 0 < self.user_share <= 1:
            raise ValueError(f"gate.user_share must be in (0, 1], got {self.user_share}")


@dataclass(frozen=True)
class LoopIndexSection:
    """[index] of a retrieval loop: the item index every published pipeline gets, built afresh."""

    kind: IndexKind = IndexKind.HNSW  # "hnsw" (usearch, approximate) or "exact"
    connectivity: int = 32  # HNSW: graph degree (M)
    expansion_add: int = 128  # HNSW: efConstruction
    expansion_search: int = 512  # HNSW: ef of a query
    dtype: str = "f32"  # HNSW: how the graph stores the vectors, "f32" or "f16"
    build_threads: int = 0  # HNSW: threads of a build (0: every core; 1: the same graph from the same vectors)

    def __post_init__(self) -> None:
        self.index_config()  # its own checks, now

    def index_config(self) -> IndexConfig:
        return IndexConfig(self.kind, self.connectivity, self.expansion_add, self.expansion_search, dtype=self.dtype, build_threads=self.build_threads)


@dataclass(frozen=True)
class RetrievalServerSection:
    """[server] of a retrieval loop (the canary is decided on the loop's own Recall@K: no request log is read)."""

    mode: str = "offline"  # "offline" (no server), "embedded" (one in this process) or "remote"
    url: str = ""  # remote: the server's http://host:port
    model: str = "recs"  # remote: the pipeline's name on that server
    token_env: str = "HUGEREC_ADMIN_TOKEN"  # the environment variable of the admin token (remote: the server's; embedded: opens its status page's details)
    replay_users: int = 300  # embedded: users of each next window sent to POST /recommend as simulated traffic

    def __post_init__(self) -> None:
        check_server_mode(self.mode, self.url)
        if self.replay_users < 0:
            raise ValueError(f"server.replay_users must be >= 0, got {self.replay_users}")


@dataclass(frozen=True)
class RetrievalLoopFile:
    """The retrieval loop's file: a loop section, the stream, the registry's [model], the sparse optimizer, the gate,
    the index and the server."""

    loop: RetrievalLoopSection = field(default_factory=RetrievalLoopSection)
    data: InteractionStreamSection = field(default_factory=InteractionStreamSection)
    preprocess: PreprocessSection | None = None  # your interaction log instead of [data]'s synthetic stream
    windows: LogWindows = field(default_factory=LogWindows)  # the log's windows (with [preprocess])
    model: TwoTowerConfig | MFConfig = field(default_factory=_loop_tower)  # [model]: read by the registry
    embedding: RetrievalEmbedding = field(default_factory=RetrievalEmbedding)
    gate: RecallGate = field(default_factory=RecallGate)
    index: LoopIndexSection = field(default_factory=LoopIndexSection)
    server: RetrievalServerSection = field(default_factory=RetrievalServerSection)


def read_retrieval_loop_file(data: dict[str, Any], model: TwoTowerConfig | MFConfig, base: Path | None = None) -> RetrievalLoopFile:
    """The file's sections (without [model]) and its registry model -> RetrievalLoopFile; the loop's own checks
    (a two-tower of user ids only, k <= ann_k, a synthetic stream or a log, ...) as one ConfigError. `base`: the
    config file's folder, where a relative preprocess.input (or $HUGEREC_DATA) is looked for."""
    log = data.get("preprocess")
    if log is not None:
        if "data" in data:
            raise ConfigError(
                "data and preprocess: the retrieval loop reads a synthetic stream ([data.interactions], [data.drift]) "
                "or your interaction log ([preprocess] with roles user, item, timestamp), not both"
            )
        for key in log if isinstance(log, dict) else ():
            if key not in LOG_KEYS:
                raise ConfigError(
                    f"preprocess.{key}: the retrieval loop reads the log's layout ({', '.join(LOG_KEYS)}) and splits it "
                    "into windows by its timestamp ([windows] unit, size); remove preprocess." + key
                )
    elif "windows" in data:
        raise ConfigError("windows: the windows of an interaction log ([preprocess]); the synthetic stream has one window a day")
    cfg = from_dict(RetrievalLoopFile, data, "", {Optimizer: optimizer_from_dict})
    cfg = dataclasses.replace(cfg, model=model)
    if cfg.preprocess is not None:
        where = base or Path.cwd()
        p = cfg.preprocess
        found = dataclasses.replace(p, input=find_input(p.input, where) or p.input, schema=find_input(p.schema, where))
        cfg = dataclasses.replace(cfg, preprocess=found)
    if isinstance(model, TwoTowerConfig):
        for key, value, ok in (
            ("max_history", model.max_history, model.max_history == 0),
            ("recent", list(model.recent), not model.recent),
            ("use_user_id", model.use_user_id, model.use_user_id),
            ("user_features", list(model.user_features), not model.user_features),
            ("item_features", list(model.item_features), not model.item_features),
        ):
            if not ok:
                raise ConfigError(
                    f"model.{key} = {value!r}: the loop's two-tower embeds user ids only (a pipeline serves it from the "
                    "user id): set model.max_history = 0, model.recent = [], model.use_user_id = true, no side features"
                )
    try:
        loop_config(cfg, 1, 1)  # its checks now (the log's users and items are counted when it runs)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg


# Keys a retrieval loop continued in its work_dir may change (the ranking loop's CONTINUE_MAY_CHANGE): how far it
# runs, how many versions it keeps, its simulated traffic, where its token is. Every other key shapes the models,
# the events or the decisions: a change is refused, naming it.
CONTINUE_MAY_CHANGE = frozenset(
    {"loop.work_dir", "loop.first", "loop.last", "loop.keep_versions", "server.replay_users", "server.token_env"}
)


def retrieval_loop_settings(cfg: RetrievalLoopFile) -> dict[str, Any]:
    """The file as --print-config shows it: [model] in the registry's dialect, the optimizer with its type."""
    out = to_dict(cfg, keep_none=True)
    out["model"] = config_to_dict(cfg.model)
    out["embedding"]["optimizer"] = optimizer_to_dict(cfg.embedding.optimizer)
    return dict(out)


def loop_config(cfg: RetrievalLoopFile, num_users: int | None = None, num_items: int | None = None) -> RetrievalLoopConfig:
    """The retrieval loop's own config from the file's sections; `num_users`, `num_items`: those of the events
    (default: the synthetic stream's)."""
    lc, users = cfg.loop, cfg.data.interactions
    return RetrievalLoopConfig(
        lc.work_dir,
        users.num_users if num_users is None else num_users,
        users.num_items if num_items is None else num_items,
        model=cfg.model,
        optimizer=cfg.embedding.optimizer,
        epochs=lc.epochs,
        warm_start_epochs=lc.warm_start_epochs,
        warm_start_reset_optimizer=lc.warm_start_reset_optimizer,
        warm_start_replay=lc.warm_start_replay,
        lr=lc.lr,
        batch_size=lc.batch_size,
        k=lc.k,
        ann_k=lc.ann_k,
        recall_margin=cfg.gate.recall_margin,
        min_users=cfg.gate.min_rows,
        gate_user_share=cfg.gate.user_share,
        canary_share=lc.canary_share,
        index=cfg.index.index_config(),
        name=lc.name,
        seed=lc.seed,
        keep_versions=lc.keep_versions,
    )


def run_retrieval_loop(cfg: RetrievalLoopFile, print_config: bool, only_log: bool) -> int:
    from hugerec.cli.loop_command import embedded_server, keep_loop_settings, log_table

    if print_config:
        print(json.dumps(retrieval_loop_settings(cfg), indent=1, default=str))
        return 0
    work = Path(cfg.loop.work_dir)
    if only_log:
        print(log_table(read_log(work / "decisions.jsonl")))
        return 0
    settings = retrieval_loop_settings(cfg)
    if cfg.preprocess is None:
        days = cfg.data.drift.days
        last = days - 1 if cfg.loop.last is None else cfg.loop.last
        if not cfg.loop.first < last <= days - 1:
            raise ConfigError(
                f"loop.last = {last}: need loop.first ({cfg.loop.first}) < loop.last <= data.drift.days - 1 ({days - 1}); "
                "window last is the final holdout"
            )
        config = loop_config(cfg)
        keep_loop_settings(work, settings, CONTINUE_MAY_CHANGE, retrieval_loop_settings(RetrievalLoopFile()))
        day: EventSource = generate_interaction_days(cfg.data.interactions, cfg.data.drift).day
    else:
        log = read_log_windows(cfg.preprocess, cfg.windows)
        last = log.check_span(cfg.loop.first, cfg.loop.last)
        config = loop_config(cfg, log.num_users, log.num_items)
        settings["log"] = log.identity()  # a log whose users or items changed cannot continue: other ids, other tables
        keep_loop_settings(work, settings, CONTINUE_MAY_CHANGE, retrieval_loop_settings(RetrievalLoopFile()))
        log.write_ids(work)
        day = log.day
    with ExitStack() as stack:
        publisher = None
        match cfg.server.mode:
            case "remote":
                token = os.environ.get(cfg.server.token_env)
                if not token:
                    raise ConfigError(f"server.mode = 'remote': the environment variable {cfg.server.token_env} is not set")
                publisher = Publisher(ServerTarget(cfg.server.url, cfg.server.model, token))
            case "embedded":
                url, token = embedded_server(
                    work, config.log_path, config.seed, cfg.server.token_env, secrets.token_hex(16), stack
                )
                publisher = Publisher(ServerTarget(url, config.name, token))
            case _:
                pass
        loop = RetrievalLoop(config, day, publisher)
        finished = {"publish", "refuse", "skip"}
        pending = [k for k in range(cfg.loop.first, last) if not finished & {r.action for r in loop.log.of_window(k)}]
        if cfg.server.mode == "embedded" and pending:
            started = time.perf_counter()
            live = loop.restore_server()  # a restarted loop: the new server first serves what the log says was live
            if live.stable is not None:
                canary = "no canary" if live.canary is None else f"canary {live.canary} at share {live.share}"
                print(
                    f"hugerec loop: embedded server restored from the decision log: stable {live.stable}, {canary} "
                    f"({time.perf_counter() - started:.1f} s)",
                    file=sys.stderr,
                )
        for k in pending:
            loop.step(k)
            if cfg.server.mode == "embedded" and cfg.server.replay_users:
                print(f"hugerec loop: {replay(url, config.name, k + 1, day(k + 1), cfg.server.replay_users, config.k)}", file=sys.stderr)
    print(log_table(read_log(work / "decisions.jsonl")))
    return 0


@dataclass(frozen=True)
class LogWindowEvents:
    """An interaction log ([preprocess]) read once and split into windows ([windows]): window k's events with the
    log's dense ids (`day`), the raw id of each dense one, and where it came from (for messages)."""

    windows: tuple[Interactions, ...]
    vocabulary: Vocabulary
    num_users: int
    num_items: int
    path: str  # preprocess.input
    span: LogWindows
    start: int  # epoch seconds where window 0 starts

    def day(self, k: int) -> Interactions:
        """Window k's events (none outside the log's windows)."""
        if 0 <= k < len(self.windows):
            return self.windows[k]
        return self.windows[0].with_frame(self.windows[0].frame.clear())

    def check_span(self, first: int, last: int | None) -> int:
        """loop.last (default: the log's last window) once loop.first < loop.last lie in the log's windows and both
        hold events (window first is the first trained, window last the final holdout); else one ConfigError
        naming the key, the file and the windows that hold events. Empty windows between them are skipped by the
        loop, each with a `skip` record."""
        n = len(self.windows)
        last = n - 1 if last is None else last
        began = time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.start))
        where = f"preprocess.input {self.path} ({n} windows of {self.span.describe()} from {began} UTC)"
        if not 0 <= first < last <= n - 1:
            raise ConfigError(
                f"loop.last = {last}: need 0 <= loop.first ({first}) < loop.last <= {n - 1}, the last window of {where}; "
                "window last is the final holdout"
            )
        for key, k in (("loop.first", first), ("loop.last", last)):
            if self.windows[k].num_events == 0:
                held = [j for j, w in enumerate(self.windows) if w.num_events]
                raise ConfigError(
                    f"{key} = {k}: window {k} of {where} holds no events; windows with events: {_spans(held)}"
                )
        return last

    def identity(self) -> dict[str, Any]:
        """What a continued run must find again: the counts and a digest of the raw ids behind the dense ones."""
        digest = hashlib.sha256()
        for ids in (self.vocabulary.users, self.vocabulary.items):
            digest.update(np.ascontiguousarray(ids, dtype=np.int64).tobytes())
            digest.update(b"|")
        return {"users": self.num_users, "items": self.num_items, "ids_sha256": digest.hexdigest()}

    def write_ids(self, work: Path) -> None:
        """work/users.parquet and work/items.parquet: row i holds the raw id of dense id i (`raw`), what a client
        of the published pipelines maps its ids with."""
        import polars as pl

        work.mkdir(parents=True, exist_ok=True)
        for name, ids in (("users", self.vocabulary.users), ("items", self.vocabulary.items)):
            path, tmp = work / f"{name}.parquet", work / f".{name}.parquet.tmp"
            pl.DataFrame({"raw": np.asarray(ids, dtype=np.int64)}).write_parquet(tmp)
            os.replace(tmp, path)


def _spans(ks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0..2, 5, 7..8"."""
    out: list[str] = []
    for k in ks:
        if out and int(out[-1].split("..")[-1]) == k - 1:
            out[-1] = f"{out[-1].split('..')[0]}..{k}"
        else:
            out.append(str(k))
    return ", ".join(out)


def read_log_windows(p: PreprocessSection, span: LogWindows) -> LogWindowEvents:
    """The declared log's events (the roles user, item, timestamp, as `hugerec train` reads them; dense ids over the
    whole log) in windows of `span`; bad input (a missing role, an unparsable timestamp, no events) as one
    ConfigError naming the key or the file, line and value."""
    spec = declared_input(p)
    try:
        data, vocabulary = interaction_log(spec, p.input, "the retrieval loop", p.on_error)
    except FileNotFoundError as e:
        raise ConfigError(f"preprocess.input: {e}") from None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    windows = time_windows(data, span.seconds)
    start = int(data.frame["timestamp"].min()) // span.seconds * span.seconds  # type: ignore[arg-type]
    return LogWindowEvents(tuple(windows), vocabulary, data.num_users, data.num_items, p.input, span, start)


@dataclass
class Served:
    """What one version of the pipeline answered in a replay: requests, and the Recall@K of those answers."""

    requests: int = 0
    recall_sum: float = 0.0


def replay(url: str, name: str, window: int, events: Interactions, users: int, k: int) -> str:
    """The first `users` users with events in `window` (its `events`) ask POST /recommend for k items, as simulated users of
    the embedded server; one line: which version answered how many of them, and with what Recall@K on the items
    each user then met (the window's events: a user meets no item twice)."""
    import httpx

    offsets, items = held_out_csr(events)
    asked = np.flatnonzero(np.diff(offsets) > 0)[:users]
    by_version: dict[str, Served] = {}
    failed = 0
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for u in asked.tolist():
            answer = client.post("/recommend", json={"pipeline": name, "user": u, "k": k})
            if answer.status_code != 200:
                failed += 1
                continue
            body = answer.json()
            met = set(items[offsets[u] : offsets[u + 1]].tolist())
            served = by_version.setdefault(str(body["version"]), Served())
            served.requests += 1
            served.recall_sum += len(met & set(body["items"])) / len(met)
    parts = [f"{v} answered {s.requests} (Recall@{k} {s.recall_sum / s.requests:.4f})" for v, s in sorted(by_version.items())]
    return f"window {window} traffic: {len(asked)} users asked /recommend; " + (", ".join(parts) or "none answered") + (
        f"; {failed} failed" if failed else ""
    )
