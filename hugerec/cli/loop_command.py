"""`hugerec loop CONFIG.toml [KEY=VALUE ...]`: the continuous-training loop from a TOML config.

    [loop]       work_dir, first, last (windows first..last-1 are trained; window `last` is the final
                 holdout), batch_size, lr, epochs, holdout_share, canary_share, retrain_windows, seed, name,
                 deltas (publish version deltas when the stable version allows; false: whole bundles),
                 keep_versions (previous stables kept loaded on the server for a manual rollback)
    [data]       paths (Parquet with the time column) + label, dense, sparse column names;
                 or, instead of paths, [data.stream]: a synthetic drifting stream (StreamConfig)
    [windows]    time_column, unit ("day" | "hour" | "minute"), size
    [model]      the [model] of every command (hugerec.models.registry): any ranking type ("dlrm",
                 "dcn_v2", "deepfm", "wide_and_deep") with its keys (dlrm: bottom, top, ...; dcn_v2:
                 num_cross_layers, deep, ...); `model.type=X` on the command line starts [model] from X's defaults.
                 A retrieval type ("two_tower", "mf") runs the retrieval loop instead, whose file has sections of
                 its own (cli/retrieval_loop_command.py, configs/loop_two_tower.toml); a key of one loop given to
                 the other is refused in one line naming it
    [embedding]  dim, optimizer (the tables' sparse optimizer), capacity (rows of each dynamic table),
                 min_count (sightings before a key gets a row), eviction ("lru" | "lfu")
    [gate] [decisions] [monitor] [recovery]   GateConfig, DecisionConfig, MonitorConfig, Recovery (how the
                 loop relearns after a concept drift)
    [server]     mode: "offline" (no server: a published candidate serves at once), "embedded" (a
                 server in this process on 127.0.0.1, with simulated traffic: `replay_rows` rows of
                 each next window sent to /predict in that window's own columns, dense features by
                 name, with their labels as feedback; its status page at / shows the decisions, the
                 details open with the token in `token_env` when it is set), "remote" (url,
                 model, the admin token from the environment variable `token_env`, and `log_dir`: the
                 folder of that server's `hugerec serve --request-log DIR`, for the canary decisions);
                 `ingest_token_env`: the environment variable of the token the simulated clients post their
                 feedback with (the embedded server's ingest token; a fresh one when it is not set)

The decision log (work_dir/decisions.jsonl) is printed as a table at the end; `--log` prints it
without running. A loop stopped at any point (Ctrl-C, kill -9) continues where it stopped when the
same command runs again. Its first start writes the config's settings (the keys of --print-config, flat)
to work_dir/settings.json; a later start in that work_dir with a changed config is refused in one line
naming the changed keys (training.run_settings, as `train.resume`), except the keys a continued run may
change (CONTINUE_MAY_CHANGE: how far it runs, its retention, the simulated traffic, where the tokens are).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugerec.cli.config_file import ConfigError, apply_overrides, from_dict, read_toml, section_keys, to_dict
from hugerec.cli.retrieval_loop_command import (
    RetrievalLoopFile,
    check_server_mode,
    read_retrieval_loop_file,
    run_retrieval_loop,
)
from hugerec.continuous.decision_log import Record, read_log
from hugerec.continuous.decisions import DecisionConfig
from hugerec.continuous.gate import GateConfig
from hugerec.continuous.loop import Loop, LoopConfig, ModelSpec, Recovery
from hugerec.continuous.monitor import MonitorConfig
from hugerec.continuous.server_restore import remove_interrupted_loads, restore_server
from hugerec.continuous.window_schema import window_schemas
from hugerec.data.schema import Schema
from hugerec.data.synthetic_stream import Stream, StreamConfig
from hugerec.data.windows import Windows
from hugerec.embedding.optimizers import Adagrad, Optimizer, optimizer_from_dict
from hugerec.embedding.table_config import Eviction
from hugerec.models.mf import MFConfig
from hugerec.models.registry import Family, config_to_dict, type_of
from hugerec.models.two_tower import TwoTowerConfig

if TYPE_CHECKING:
    from hugerec.continuous.traffic import Replay


@dataclass(frozen=True)
class LoopSection:
    """The loop itself: where it keeps its state, which windows it trains, how it trains and publishes."""

    work_dir: str = "runs/loop"  # decisions.jsonl, checkpoints/, bundles/, updates/, reports/ go here
    first: int = 0  # the first window trained
    last: int | None = None  # default: the stream's last day, or the last window present in the data
    name: str = "model"  # the model's name on the server
    batch_size: int = 512  # rows per training step
    lr: float = 3e-3  # the dense learning rate (Adam)
    epochs: int = 1  # epochs over each window
    holdout_share: float = 0.1  # the share of each window's rows held out (for the gate), never trained on
    canary_share: float = 0.1  # the share of the traffic a published canary gets
    retrain_windows: int = 3  # a retraining from scratch (a feature drifted) trains on this many last windows
    seed: int = 0  # the holdout draw's and the training's seed
    deltas: bool = True  # publish version deltas onto the stable version when the schema and model are unchanged
    keep_versions: int = 1  # previous stables kept loaded; older ones and rolled-back canaries are unloaded


@dataclass(frozen=True)
class LoopDataSection:
    """Where the windows' rows come from: Parquet files with a time column, or a synthetic drifting stream."""

    paths: str | None = None  # Parquet files (a folder, a file or a glob) with the windows' time column
    label: str = "label"  # the 0/1 label column
    dense: tuple[str, ...] = ()  # the dense (numeric) feature columns
    sparse: tuple[str, ...] = ()  # the sparse (raw int64 id) feature columns, one dynamic table each
    stream: StreamConfig | None = None  # [data.stream]: a synthetic drifting stream instead of paths

    def __post_init__(self) -> None:
        if (self.paths is None) == (self.stream is None):
            raise ValueError("give exactly one of data.paths (Parquet files) and [data.stream] (a synthetic stream)")
        if self.paths is not None and not self.sparse:
            raise ValueError("data.sparse must name the sparse columns of data.paths")


@dataclass(frozen=True)
class ServerSection:
    """The server the loop publishes to (see the module docstring)."""

    mode: str = "offline"  # "offline" (no server), "embedded" (one in this process, simulated traffic) or "remote"
    url: str = ""  # remote: the server's http://host:port
    model: str = "model"  # remote: the model's name on that server
    token_env: str = "HUGEREC_ADMIN_TOKEN"  # the environment variable of the admin token (remote: the server's; embedded: opens its status page's details)
    ingest_token_env: str = "HUGEREC_INGEST_TOKEN"  # embedded: the environment variable of the token its simulated clients post feedback with (a fresh one when unset)
    log_dir: str = ""  # remote: the folder of the server's `hugerec serve --request-log` (same machine)
    replay_rows: int = 2000  # embedded: rows of each next window sent as traffic, with their labels as feedback

    def __post_init__(self) -> None:
        check_server_mode(self.mode, self.url)
        if self.replay_rows < 0:
            raise ValueError(f"server.replay_rows must be >= 0, got {self.replay_rows}")


@dataclass(frozen=True)
class LoopEmbedding:
    """[embedding] of a loop: the dynamic tables of the model's sparse columns (ModelSpec's fields)."""

    dim: int = 8  # embedding width of every table
    optimizer: Optimizer = field(default_factory=lambda: Adagrad(lr=0.05))  # the tables' sparse optimizer
    capacity: int = 50_000  # rows of each dynamic table (beyond it, `eviction` frees rows)
    min_count: int = 1  # an id gets a row once seen this many times (count-min admission; before: zeros)
    eviction: Eviction = Eviction.LRU  # which rows a full table frees: "lru", "lfu" or "ttl"


@dataclass(frozen=True)
class LoopFile:
    loop: LoopSection = field(default_factory=LoopSection)
    data: LoopDataSection = field(default_factory=lambda: LoopDataSection(stream=StreamConfig()))
    windows: Windows = field(default_factory=Windows)
    model: ModelSpec = field(default_factory=ModelSpec)
    embedding: LoopEmbedding = field(default_factory=LoopEmbedding)
    gate: GateConfig = field(default_factory=GateConfig)
    decisions: DecisionConfig = field(default_factory=DecisionConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    recovery: Recovery = field(default_factory=Recovery)
    server: ServerSection = field(default_factory=ServerSection)


def load_loop_file(path: str | None, overrides: Sequence[str]) -> tuple[LoopFile | RetrievalLoopFile, Path]:
    """The config (defaults without a file), with overrides; relative paths resolve against the current
    directory, then the config file's folder. A retrieval model.type gives the retrieval loop's file."""
    from hugerec.cli.run_config import find_config, read_model, switch_model_type

    data: dict[str, Any] = {}
    base = Path.cwd()
    if path is not None:
        found = find_config(path)
        data = read_toml(found)
        base = found.parent
    data = _upgrade_old_model(apply_overrides(switch_model_type(data, overrides), overrides))
    model = read_model(data.pop("model", {"type": "dlrm", "bottom": [32, 8], "top": [32, 1]}))
    kind = type_of(model)
    if kind.family is Family.RETRIEVAL:
        assert isinstance(model, TwoTowerConfig | MFConfig)
        refuse_other_family(data, RetrievalLoopFile, LoopFile, kind.name, "the ranking loop's")
        return read_retrieval_loop_file(data, model, base), base
    if kind.family is Family.RANKING:
        refuse_other_family(data, LoopFile, RetrievalLoopFile, kind.name, "the retrieval loop's (model.type = two_tower, mf)")
    cfg = from_dict(LoopFile, data, "", {Optimizer: optimizer_from_dict})
    e = cfg.embedding
    try:
        spec = ModelSpec(model, e.dim, e.optimizer, e.capacity, e.min_count, e.eviction)
    except ValueError as err:
        raise ConfigError(f"model: {err}") from None
    cfg = dataclasses.replace(cfg, model=spec)
    if cfg.data.paths is not None and not Path(cfg.data.paths).is_absolute() and not any(Path().glob(cfg.data.paths)):
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, paths=str(base / cfg.data.paths)))
    return cfg, base


def refuse_other_family(data: dict[str, Any], ours: type, theirs: type, model_type: str, whose: str) -> None:
    """ConfigError naming the first key of `data` (a loop file's sections, [model] left out) that file class `ours`
    lacks and `theirs` (the other family's loop file) has: an option of the other loop, which this one would not
    read. Keys of neither are left to from_dict (an unknown key, with the closest known one suggested)."""
    mine, other = section_keys(ours), section_keys(theirs)

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if dotted == "model":
                continue
            if dotted not in mine and dotted in other:
                raise ConfigError(
                    f"{dotted}: {whose} key, which model.type = {model_type!r} does not read; remove it (or choose a "
                    f"model.type of that loop)"
                )
            if isinstance(value, dict) and dotted in mine:
                walk(value, dotted + ".")

    walk(data, "")


# Keys a loop continued in its work_dir may change: how far it runs (its last window; the synthetic stream's day d
# does not depend on its number of days), how many versions it keeps, its simulated traffic, where its tokens are.
# Every other key shapes the models or the decisions: a change is refused, naming it.
CONTINUE_MAY_CHANGE = frozenset(
    {
        "loop.work_dir",
        "loop.first",
        "loop.last",
        "loop.keep_versions",
        "data.stream.days",
        "server.replay_rows",
        "server.token_env",
        "server.ingest_token_env",
    }
)


def keep_loop_settings(
    work_dir: Path, settings: dict[str, Any], may_change: frozenset[str], defaults: dict[str, Any]
) -> None:
    """Either loop's settings (its --print-config dict) kept in work_dir/settings.json by its first start; a later
    start with other settings outside `may_change` -> ConfigError naming the changed keys (training.run_settings).
    `defaults`: the settings of the loop's file with nothing set; a key that settings.json lacks (one a later
    hugerec added) compares as its default."""
    from hugerec.training.run_settings import flat_settings, keep_settings

    path = work_dir / "settings.json"
    try:
        keep_settings(path, flat_settings(settings), may_change, flat_settings(defaults))
    except ValueError as e:
        raise ConfigError(f"{e}: continue it with its settings ({path}) or give another loop.work_dir") from None


def loop_settings(cfg: LoopFile) -> dict[str, Any]:
    """The ranking loop's file as --print-config shows it: [model] in the registry's dialect, [embedding] the
    ModelSpec's tables and optimizer."""
    out = to_dict(cfg, keep_none=True)
    out["model"], out["embedding"] = config_to_dict(cfg.model.model), cfg.model.to_dict()
    del out["embedding"]["model"]
    return dict(out)


OLD_MODEL_KEYS = {"dim": "embedding.dim", "capacity": "embedding.capacity", "sparse_lr": "embedding.optimizer",
                  "min_count": "embedding.min_count", "eviction": "embedding.eviction"}


def _upgrade_old_model(data: dict[str, Any]) -> dict[str, Any]:
    """The loop's old [model] (no type; dim, capacity, sparse_lr, min_count, eviction beside bottom / top) as
    the dialect of every command ([model] type = "dlrm" + [embedding]), with a one-line note naming the new keys.
    ConfigError when a config mixes both (a typed [model] or an [embedding] with the old keys)."""
    model = data.get("model")
    if not isinstance(model, dict):
        return data
    own: set[str] = set()
    if "type" in model:  # a key the declared type has itself (a two-tower's dim) is not the old dialect's
        from hugerec.models.registry import model_type

        try:
            own = set(model_type(model["type"]).fields())
        except ValueError as e:
            raise ConfigError(str(e)) from None
    old = [k for k in OLD_MODEL_KEYS if k in model and k not in own]
    if not old:
        return data
    if "type" in model or "embedding" in data:
        new = "model.type" if "type" in model else "[embedding]"
        raise ConfigError(
            f"model.{old[0]} and {new}: the config mixes the loop's old [model] with the dialect of every command; "
            f"move model.{old[0]} to {OLD_MODEL_KEYS[old[0]]}"
        )
    embedding: dict[str, Any] = {k: model[k] for k in ("dim", "capacity", "min_count", "eviction") if k in model}
    if "sparse_lr" in model:
        embedding["optimizer"] = {"type": "adagrad", "lr": model["sparse_lr"]}
    moved = ", ".join(f"model.{k} -> {OLD_MODEL_KEYS[k]}" for k in old)
    print(f'note: the loop\'s old [model] is read for one more release: {moved} (adagrad), and model.type = "dlrm"', file=sys.stderr)
    rest = {k: v for k, v in model.items() if k not in OLD_MODEL_KEYS}
    return {**data, "model": {"type": "dlrm", **rest}, "embedding": embedding}


def _schema(cfg: LoopFile) -> Schema:
    if cfg.data.stream is not None:
        return cfg.data.stream.schema
    return Schema.build(labels=(cfg.data.label,), dense=cfg.data.dense, sparse=dict.fromkeys(cfg.data.sparse))


def loop_config(cfg: LoopFile) -> LoopConfig:
    """The loop's own config from the file's sections (what `hugerec loop` runs)."""
    lc = cfg.loop
    return LoopConfig(
        lc.work_dir,
        _schema(cfg),
        cfg.windows,
        cfg.model,
        cfg.gate,
        cfg.decisions,
        lc.name,
        lc.holdout_share,
        lc.batch_size,
        lc.lr,
        lc.epochs,
        lc.canary_share,
        lc.retrain_windows,
        lc.seed,
        deltas=lc.deltas,
        keep_versions=lc.keep_versions,
        recovery=cfg.recovery,
    )


def log_table(records: Sequence[Record]) -> str:
    """The decision log as a fixed-width table: window, action, version, the gate's figures (AUC of a ranking loop,
    Recall@K of a retrieval loop), reason."""
    recall = any(r.gate and ("candidate_recall" in r.gate or "canary_recall" in r.gate) for r in records)
    metric = "recall" if recall else "auc"
    rows = [("window", "action", "version", f"cand {metric if recall else 'AUC'}", f"serving {metric if recall else 'AUC'}", "reason")]
    for r in records:
        g = r.gate or {}
        cand = g.get(f"candidate_{metric}", g.get(f"canary_{metric}"))
        serv = g.get(f"serving_{metric}", g.get(f"stable_{metric}"))
        rows.append(
            (
                str(r.window),
                r.action,
                r.version or "-",
                "-" if cand is None else f"{cand:.4f}",
                "-" if serv is None else f"{serv:.4f}",
                r.reason,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:5], widths, strict=True)) + "  " + row[5] for row in rows
    )


def run_loop(config_path: str | None, overrides: Sequence[str], print_config: bool, only_log: bool) -> int:
    cfg, _ = load_loop_file(config_path, overrides)
    if isinstance(cfg, RetrievalLoopFile):
        return run_retrieval_loop(cfg, print_config, only_log)
    if print_config:
        print(json.dumps(loop_settings(cfg), indent=1, default=str))
        return 0
    work = Path(cfg.loop.work_dir)
    if only_log:
        print(log_table(read_log(work / "decisions.jsonl")))
        return 0
    lc = cfg.loop
    config = loop_config(cfg)
    if cfg.data.stream is not None:
        stream = Stream(cfg.data.stream)
        days = cfg.data.stream.days

        def source(k: int) -> Any:
            return stream.day(k).table if 0 <= k < days else stream.day(0).table.slice(0, 0)

        last = days - 1 if lc.last is None else lc.last
    else:
        paths = cfg.data.paths
        assert paths is not None

        def source(k: int) -> Any:
            return cfg.windows.read(paths, k)

        present = cfg.windows.present(paths)
        if not present:
            raise ValueError(f"data.paths {paths}: no rows")
        last = present[-1] if lc.last is None else lc.last
    if last <= lc.first:
        raise ValueError(f"loop.last ({last}) must be > loop.first ({lc.first}): window last is the final holdout")
    keep_loop_settings(work, loop_settings(cfg), CONTINUE_MAY_CHANGE, loop_settings(LoopFile()))
    with ExitStack() as stack:
        loop, url, ingest = _make_loop(cfg, config, source, stack)
        swept = remove_interrupted_loads(loop)  # before any load: what killed loads and publishes left behind
        if swept:
            print(f"hugerec loop: removed {len(swept)} folders left by interrupted loads: {swept[:3]}", file=sys.stderr)
        finished = {"publish", "refuse", "skip"}
        pending = [k for k in range(lc.first, last) if not finished & {r.action for r in loop.log.of_window(k)}]
        if url is not None and pending:
            restart_embedded_server(loop)  # windows to go: the new server first serves what the log says was live
        for k in range(lc.first, last):
            loop.step(k)
            if url is not None and cfg.server.replay_rows:
                seen = simulate(url, loop, source(k + 1).slice(0, cfg.server.replay_rows), k + 1, ingest)
                if seen.failed:
                    print(f"hugerec loop: {seen.failed} simulated requests failed: {seen.errors[:3]}", file=sys.stderr)
    print(log_table(read_log(work / "decisions.jsonl")))
    return 0


def simulate(url: str, loop: Loop, rows: Any, k: int, token: str | None = None) -> Replay:
    """Window k's rows as simulated users of the embedded server: requests, then their labels as feedback. The rows
    carry window k's own columns that a live version takes (traffic.sent_schema), dense features by name: while a
    stable and a canary trained on different schemas share the traffic, both answer them."""
    from hugerec.continuous.traffic import Replay, replay, sent_schema

    if not rows.num_rows:
        return Replay()
    status = loop.publisher.status() if loop.publisher is not None else None
    live = [loop.schema_of(status[role]) for role in ("stable", "canary") if status and status.get(role)]
    sent = sent_schema(loop.config.schema, rows, live, loop.config.windows.time_column, f"window {k}")
    return replay(url, loop.config.name, rows, sent, token=token)


def _make_loop(cfg: LoopFile, config: LoopConfig, source: Any, stack: ExitStack) -> tuple[Loop, str | None, str | None]:
    """The loop, the URL of its embedded server (None: none) and the ingest token of that server's clients."""
    from hugerec.continuous.observer import ServerObserver
    from hugerec.continuous.publish import Publisher, ServerTarget

    schema = config.schema
    match cfg.server.mode:
        case "offline":
            return Loop(config, source), None, None
        case "remote":
            token = os.environ.get(cfg.server.token_env)
            if not token:
                raise ConfigError(f"server.mode = 'remote': the environment variable {cfg.server.token_env} is not set")
            publisher = Publisher(ServerTarget(cfg.server.url, cfg.server.model, token))
            if not cfg.server.log_dir:  # no request log to read: the gate decides, nothing watches the canary
                return Loop(config, source, publisher), None, None
            observer = ServerObserver(
                publisher,
                cfg.server.log_dir,
                config.work_dir,
                schema.dense_names,
                schema.sparse_names,
                cfg.monitor,
                window_schema=window_schemas(schema, source, cfg.windows.time_column),
            )
            return Loop(config, source, publisher, observer), None, None
        case _:
            ingest = os.environ.get(cfg.server.ingest_token_env) or secrets.token_hex(16)
            url, token = embedded_server(
                Path(config.work_dir), config.log_path, config.seed, cfg.server.token_env, ingest, stack
            )
            logs = Path(config.work_dir) / "requests"
            publisher = Publisher(ServerTarget(url, config.name, token))
            observer = ServerObserver(
                publisher,
                logs,
                config.work_dir,
                schema.dense_names,
                schema.sparse_names,
                cfg.monitor,
                window_schema=window_schemas(schema, source, cfg.windows.time_column),
            )
            return Loop(config, source, publisher, observer), url, ingest


def restart_embedded_server(loop: Loop) -> None:
    """A loop started again on its work_dir with windows to go (after a kill, or a run extended): its new embedded server
    gets the stable version, canary and canary share the decision log says were live (server_restore.py), before
    the next window decides on that canary. A first run (an empty log) starts with an empty server."""
    started = time.perf_counter()
    live = restore_server(loop)
    if live.stable is not None:
        canary = "no canary" if live.canary is None else f"canary {live.canary} at share {live.share}"
        print(
            f"hugerec loop: embedded server restored from the decision log: stable {live.stable}, {canary} "
            f"({time.perf_counter() - started:.1f} s)",
            file=sys.stderr,
        )


def embedded_server(
    work_dir: Path, decision_log: Path, seed: int | None, token_env: str, ingest_token: str, stack: ExitStack
) -> tuple[str, str]:
    """Start the loop's embedded server on 127.0.0.1 (closed by `stack`) -> (its URL, its admin token).

    It logs requests to work_dir/requests and its status page shows the loop's `decision_log`. Its admin token
    is the one in the environment variable `token_env` when set, so that the operator can open the page's
    details; else a random one that only this process knows. `ingest_token` is the token its clients post
    feedback with."""
    from hugerec.serving.http.request_log import RequestLogConfig
    from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig

    given = os.environ.get(token_env)
    token = given or secrets.token_hex(16)
    if len(token) < 16:
        raise ConfigError(f"${token_env}: the admin token must have at least 16 characters")
    server = InferenceServer(ServerConfig(admin_token=token, ingest_token=ingest_token, seed=seed))
    server.enable_request_log(RequestLogConfig(str(work_dir / "requests"), seed=seed))
    server.status.show_decision_log(decision_log)
    stack.callback(server.close)
    url: str = stack.enter_context(BackgroundServer(server))
    details = (
        f"details with the token in ${token_env}"
        if given
        else f"set ${token_env} before `hugerec loop` to open its details"
    )
    print(f"hugerec loop: embedded server {url}, status page {url}/ ({details})", file=sys.stderr)
    return url, token
