"""The continuous-training loop: per window, warm-start, train, gate, publish as a canary, decide.

Window k's iteration (each finished phase is a record of the decision log, so a loop killed at any
point and started again redoes only the unfinished phase: it never publishes twice, never skips a
window):

    1. decide   with a server and a monitor: the canary gets promoted / rolled back / waits
                (decisions.decide_canary) and drift or a stable KPI below its baseline asks for a full
                retraining (decisions.retrain_reason)
    2. train    warm-start from the checkpoint of the last published version that was not rolled back
                (its dynamic tables admit the window's new ids and evict stale ones), train on window
                k's training rows -> checkpoints/w<k>.pt (while nothing is published, a fresh model on
                every window since the loop's first: short windows are too small for a first model to pass
                the gate); a full retraining instead starts from scratch on windows
                k - retrain_windows + 1 .. k; after a concept drift, the recovery (Recovery): the model
                serving before it, its sparse optimizer state reset, on every window since the drift, again
                whenever those have grown 1.5 times (growth), for `hours`. An empty window is skipped
                (logged).
    3. gate     candidate and serving model on window k + 1's holdout (gate.check); the serving model
                below its baseline there is a concept drift: window k + 1 starts the recovery (no server
                needed)
    4. publish  to the server as the canary (publish.Publisher): when the server's stable version was
                published by this loop with the same columns, schema and model config, a version delta
                (model_diff: changed and new rows, evicted ids, default rows, dense weights) -> updates/w<k>,
                which the server applies to a copy of the stable version; otherwise (a schema change, the
                first version, `deltas` off) a whole bundle -> bundles/w<k>. The record says which and why.
                Without a server the candidate becomes the serving model directly.
    5. retire   after each canary decision and each publish, versions this loop published that are neither
                the stable version, nor the canary, nor among the `keep_versions` newest previous stables (kept
                for a manual rollback) are unloaded from the server, a rolled-back canary right after its
                rollback record; each unload is a record, written after the server unloaded it, and a version
                found already gone (a loop killed between the two) is logged as such, not unloaded twice.

A window whose columns differ from the configured schema is trained on the adapted schema
(window_schema.adapt_schema: missing columns dropped, new integer / float columns added as sparse /
dense); a candidate whose trained schema differs from its warm-start base's is trained from scratch.

The serving model is the server's stable version (or, offline, the last published one).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from hugerec.continuous.decision_log import DecisionLog, Record
from hugerec.continuous.decisions import (
    Action,
    DecisionConfig,
    Observation,
    auc_standard_error,
    below_baseline,
    decide_canary,
    retrain_reason,
)
from hugerec.continuous.gate import GateConfig, GateResult, check
from hugerec.continuous.model_diff import write_model_delta
from hugerec.continuous.publish import Publisher
from hugerec.continuous.window_schema import adapt_schema, describe_change, window_columns
from hugerec.data.schema import Schema
from hugerec.data.windows import Windows, holdout_mask, table_batches
from hugerec.embedding.optimizers import Adagrad, Optimizer, optimizer_to_dict
from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing, TableConfig
from hugerec.models.model import RecModel
from hugerec.models.model_config import DLRMConfig
from hugerec.models.registry import REGISTRY, Family, ModelConfig, build_model, config_to_dict, type_of
from hugerec.serving.bundles.bundle_files import MANIFEST, sha256_file
from hugerec.serving.bundles.export import export
from hugerec.training.checkpoint import atomic_save, read_weights
from hugerec.training.trainer import TrainConfig, evaluate, fit

WindowSource = Callable[[int], pa.Table]  # k -> rows of window k (possibly none)
Observer = Callable[[int, pa.Table | None], Observation]  # (k, training rows of the stable version) -> what was seen


def trainable_types() -> list[str]:
    """The model types the loop trains: every ranking type of the registry."""
    return [name for name, t in REGISTRY.items() if t.family is Family.RANKING]


@dataclass(frozen=True)
class ModelSpec:
    """The model the loop trains: `model`, a registry config of the ranking family (`hugerec loop`'s [model],
    the dialect of every command: dlrm, dcn_v2, deepfm, wide_and_deep), built by the registry over one
    dynamic table per sparse column of `dim` wide rows ([embedding]: raw keys, `capacity` rows each, admitted
    after `min_count` sightings, `eviction` when full), trained by the sparse `optimizer` (a wide part's
    dim-1 twins of those tables share their admission and eviction, with the config's `wide_optimizer`)."""

    model: ModelConfig = field(default_factory=lambda: DLRMConfig(bottom=(32, 8), top=(32, 1)))  # [model]: the registry config trained (a ranking type)
    dim: int = 8  # embedding width of every table
    optimizer: Optimizer = field(default_factory=lambda: Adagrad(lr=0.05))  # the tables' sparse optimizer
    capacity: int = 50_000  # rows of each dynamic table (beyond it, `eviction` frees rows)
    min_count: int = 1  # an id gets a row once seen this many times (count-min admission; before: zeros)
    eviction: Eviction = Eviction.LRU  # which rows a full table frees: "lru", "lfu" or "ttl"

    def __post_init__(self) -> None:
        if isinstance(self.eviction, str):
            object.__setattr__(self, "eviction", Eviction(self.eviction))
        kind = type_of(self.model)
        if kind.family is not Family.RANKING:
            raise ValueError(
                f"ModelSpec: model.type = {kind.name!r} ({kind.family.value}) cannot be trained by the loop; "
                f"it trains the ranking types {trainable_types()}, and the retrieval types "
                f"{[n for n, t in REGISTRY.items() if t.family is Family.RETRIEVAL]} in the retrieval loop (continuous.retrieval_loop)"
            )
        if self.dim < 1 or self.capacity < 1 or self.min_count < 1:
            raise ValueError(
                f"ModelSpec: dim, capacity and min_count must be >= 1, got {self.dim}, {self.capacity}, {self.min_count}"
            )
        if isinstance(self.model, DLRMConfig) and (not self.model.bottom or self.model.bottom[-1] != self.dim):
            raise ValueError(f"ModelSpec: model.bottom must end with dim ({self.dim}), got {list(self.model.bottom)}")

    def build(self, schema: Schema, seed: int) -> RecModel:
        torch.manual_seed(seed)
        policy = DynamicConfig(eviction=self.eviction, min_count=self.min_count, missing=Missing.ZEROS)
        tables = [TableConfig(n, self.capacity, self.dim, dynamic=policy) for n in schema.sparse_names]
        model = build_model(self.model, tables, len(schema.dense), self.optimizer)
        assert isinstance(model, RecModel)  # a ranking config (checked above)
        return model


    def to_dict(self) -> dict[str, Any]:
        """JSON: what the loop's `trained` records keep (a change between windows means a whole bundle)."""
        return {
            "model": config_to_dict(self.model),
            "dim": self.dim,
            "optimizer": optimizer_to_dict(self.optimizer),
            "capacity": self.capacity,
            "min_count": self.min_count,
            "eviction": self.eviction.value,
        }


@dataclass(frozen=True)
class Recovery:
    """How the loop relearns after a concept drift (the serving model's AUC fell below its baseline while no
    feature drifted, so the hidden relation changed). From the window the drift is seen in, it retrains the
    model serving before the drift on every window since then, with `epochs` at `lr` and its sparse
    optimizer state reset (rows trained for days have large Adagrad sums, so the ids whose effect changed
    would relearn at a crawl; the ids whose effect did not change keep what they know, which a fresh model
    would have to learn again); it does so again each time the windows since the drift have grown `growth`
    times (1, 2, 3, 5, 8, ... windows at 1.5: the retraining costs at most about growth / (growth - 1) times
    the rows seen since the drift), while they span at most `hours`; between those retrains and after them it
    warm-starts as usual. Long windows (a day) make this one retrain on the drift window."""

    epochs: int = 2  # epochs of each recovery retrain
    lr: float = 1e-2  # the dense learning rate of the recovery retrains
    # retrain again each time the windows since the drift have grown this many times (growth and hours
    # chosen on another stream: benchmarks/README.md, continuous)
    growth: float = 1.5
    hours: float = 24.0  # the recovery lasts while the windows since the drift span at most this many hours

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"Recovery: epochs must be >= 1, got {self.epochs}")
        if not (self.lr > 0 and self.growth > 1 and self.hours > 0):
            raise ValueError(
                f"Recovery: lr, growth - 1 and hours must be > 0, got {self.lr}, {self.growth}, {self.hours}"
            )


@dataclass(frozen=True)
class LoopConfig:
    """work_dir holds decisions.jsonl, checkpoints/, bundles/ and updates/; `schema` names the columns trained
    on; `deltas`: publish version deltas when the stable version allows (else always whole bundles);
    `keep_versions`: how many previous stable versions stay loaded on the server for a manual rollback (the
    server then holds at most the stable, the canary and these; older ones and rolled-back canaries are
    unloaded); `keep_all_checkpoints`: keep every window's checkpoint (else only those a later step reads)."""

    work_dir: str
    schema: Schema
    windows: Windows = field(default_factory=Windows)
    model: ModelSpec = field(default_factory=ModelSpec)
    gate: GateConfig = field(default_factory=GateConfig)
    decisions: DecisionConfig = field(default_factory=DecisionConfig)
    name: str = "model"
    holdout_share: float = 0.1
    batch_size: int = 512
    lr: float = 3e-3
    epochs: int = 1
    canary_share: float = 0.1
    retrain_windows: int = 3
    seed: int = 0
    deltas: bool = True
    keep_versions: int = 1
    recovery: Recovery = field(default_factory=Recovery)
    keep_all_checkpoints: bool = False

    def __post_init__(self) -> None:
        if self.keep_versions < 0:
            raise ValueError(f"LoopConfig: keep_versions must be >= 0, got {self.keep_versions}")
        if not 0 < self.holdout_share < 1:
            raise ValueError(f"LoopConfig: holdout_share must be in (0, 1), got {self.holdout_share}")
        if self.batch_size < 1 or self.epochs < 1 or self.retrain_windows < 1:
            raise ValueError(
                f"LoopConfig: batch_size, epochs and retrain_windows must be >= 1, got "
                f"{self.batch_size}, {self.epochs}, {self.retrain_windows}"
            )
        if not 0 < self.canary_share <= 1:
            raise ValueError(f"LoopConfig: canary_share must be in (0, 1], got {self.canary_share}")
        if not self.lr > 0:
            raise ValueError(f"LoopConfig: lr must be > 0, got {self.lr}")
        if not self.schema.sparse:
            raise ValueError("LoopConfig: the schema needs at least one sparse column")

    @property
    def log_path(self) -> Path:
        return Path(self.work_dir) / "decisions.jsonl"


def _auc_se(figures: Mapping[str, float], key: str) -> float:
    """The standard error of figures[key], an AUC on the gate's holdout (0 for records without its counts)."""
    if "positives" not in figures or "rows" not in figures:
        return 0.0
    positives = int(figures["positives"])
    return auc_standard_error(float(figures[key]), positives, int(figures["rows"]) - positives)


def version_of(window: int) -> str:
    return f"w{window}"


def _size(path: Path) -> int:
    """Bytes of the files under `path` (what publishing hands the server)."""
    return sum(
        p.stat().st_size
        for p in path.rglob("*")
        if p.is_file() and not p.relative_to(path).parts[0].startswith("state")
    )


class Loop:
    """Runs the loop over windows of `source`; `publisher` None: offline (published = serving at once);
    `observe` None: no canary decisions and no drift-triggered retraining."""

    def __init__(
        self,
        config: LoopConfig,
        source: WindowSource,
        publisher: Publisher | None = None,
        observe: Observer | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.publisher = publisher
        self.observe = observe
        self.work = Path(config.work_dir)
        self.log = DecisionLog(config.log_path)
        self._train_config = TrainConfig(
            epochs=config.epochs,
            lr=config.lr,
            progress=False,
            tensorboard=False,
            plot=False,
            device="cpu",
            pipeline=False,
            seed=config.seed,
        )

    # -- state, all of it read back from the decision log ---------------------------------------
    def checkpoint(self, version: str) -> Path:
        return self.work / "checkpoints" / f"{version}.pt"

    def bundle(self, version: str) -> Path:
        return self.work / "bundles" / version

    def update(self, version: str) -> Path:
        """Where the version delta of `version` is written."""
        return self.work / "updates" / version

    def trained(self, version: str) -> Record | None:
        """The last `trained` record of `version` (its rows, schema, columns and model config)."""
        found = [r for r in self.log.records if r.action == "trained" and version_of(r.window) == version]
        return found[-1] if found else None

    def schema_of(self, version: str) -> Schema:
        """The schema `version` was trained on (the configured one for records that do not say)."""
        record = self.trained(version)
        saved = None if record is None else record.extra.get("schema")
        return self.config.schema if saved is None else Schema.from_dict(saved)

    def base_version(self) -> str | None:
        """Where the next candidate warm-starts: the last published version not rolled back since."""
        return self.log.warm_start_version()

    def serving_version(self) -> str | None:
        """The version answering (most) requests: the server's stable one; offline the last published."""
        if self.publisher is not None:
            status = self.publisher.status()
            return None if status is None else status["stable"]
        return self.log.last_published()

    def baseline_auc(self, version: str) -> float | None:
        found = self.baseline(version)
        return None if found is None else found[0]

    def baseline(self, version: str) -> tuple[float, float] | None:
        """(AUC, its standard error) of `version` on the holdout its gate read when it was published."""
        for r in self.log.records:
            if r.action == "publish" and r.version == version and r.gate is not None and "candidate_auc" in r.gate:
                return float(r.gate["candidate_auc"]), _auc_se(r.gate, "candidate_auc")
        return None

    def load(self, version: str) -> RecModel:
        model = self.config.model.build(self.schema_of(version), self.config.seed)
        model.load_state_dict(read_weights(self.checkpoint(version), "Loop", "model checkpoint"))
        return model

    # -- the iteration ---------------------------------------------------------------------------
    def run(self, first: int, last: int) -> list[Record]:
        """Windows first..last-1 (window last gives the final holdout); returns the whole log."""
        for k in range(first, last):
            self.step(k)
        return self.log.records

    def step(self, k: int) -> None:
        done = {r.action for r in self.log.of_window(k)}
        if done & {"publish", "refuse", "skip"}:
            return  # finished before (a restart): nothing to redo
        if self.observe is not None and self.publisher is not None and not done & {"promote", "rollback", "wait"}:
            self._decide(k)
        retrains = [r for r in self.log.of_window(k) if r.action == "retrain"]
        retrain = int(retrains[-1].extra.get("windows", self.config.retrain_windows)) if retrains else 0
        version = version_of(k)
        if "trained" not in done or not self.checkpoint(version).is_file():
            rows = self.source(k)
            if rows.num_rows == 0:
                self.log.append(Record(k, "skip", f"window {k} has no rows"))
                return
            schema = adapt_schema(self.config.schema, rows, self.config.windows.time_column, f"window {k}")
            base = self.base_version()
            recovery = None if retrain and not retrains[-1].extra.get("concept") else self._recovery(k)
            start = None if retrain else base  # where training starts (None: a fresh model)
            first = min((r.window for r in self.log.records if r.action == "trained"), default=k)
            bootstrap = base is None and not retrain and recovery is None and first < k
            if bootstrap:  # nothing published yet: the first model learns from every window the loop has seen
                retrain = k - first + 1
            if recovery is not None:
                retrain, start = int(recovery["windows"]), recovery["base"]
            changed = None if start is None else self._schema_change(start, schema)
            if changed is not None:  # another shape: a fresh model (a recovery goes on from it)
                retrain, start = retrain or 1, None
                recovery = None if recovery is None else recovery | {"base": None}
            model, skipped = self._train(k, rows, max(retrain, 1), schema, start, reset=recovery is not None)
            atomic_save(model.state_dict(), self.checkpoint(version))
            span = f"{max(retrain, 1) - len(skipped)} window(s)"
            if recovery is not None:
                rc = self.config.recovery
                how = (
                    f"concept-drift recovery: {start or 'a fresh model'} with its sparse optimizer state reset, on the "
                    f"{span} since window {recovery['since']}, {rc.epochs} epoch(s) at lr {rc.lr}"
                )
            elif bootstrap:
                how = f"from scratch on {span} (nothing published yet: every window since {first})"
            elif retrain:
                how = f"from scratch on {span}"
            else:
                how = "warm start" if start else "a fresh model (nothing published yet)"
            if skipped:
                how += f" (windows {skipped} lack columns of window {k}: left out)"
            self.log.append(
                Record(
                    k,
                    "trained",
                    how + ("" if changed is None else f": the schema changed since {base} ({changed})"),
                    extra=json.loads(  # plain JSON values: the record equals itself read back from the log
                        json.dumps(
                            {
                                "rows": rows.num_rows,
                                "base": start,
                                "schema": schema.to_dict(),
                                "columns": window_columns(rows, self.config.windows.time_column),
                                "model": self.config.model.to_dict(),
                            }
                            | ({} if recovery is None else {"recovery": recovery})
                        )
                    ),
                )
            )
        result = self._gate(k, self.load(version))
        self._check_serving(k, result)
        if not result.passed:
            self.log.append(Record(k, "refuse", result.reason, result.figures, version))
        else:
            self._publish(k, version, result)
        self._prune()

    def _prune(self) -> None:
        """Delete the checkpoints no later step reads (unless keep_all_checkpoints): every one but the warm-start
        base, the serving version, the versions loaded on the server and the base of the last recovery (a loop
        on 5-minute windows writes 288 a day). Runs after a window's last record: a restarted loop never needs
        the checkpoint of a finished window."""
        if self.config.keep_all_checkpoints:
            return
        keep = {self.base_version()}
        if self.publisher is None:
            keep.add(self.serving_version())
        else:  # one status call: the serving version is the server's stable one
            status = self.publisher.status()
            if status is None:
                return  # the server's versions unknown: delete nothing this time
            keep |= {status["stable"], status["canary"], *status["versions"]}
        recoveries = [r.extra["recovery"]["base"] for r in self.log.records if "recovery" in r.extra]
        keep |= set(recoveries[-1:])
        for path in (self.work / "checkpoints").glob("w*.pt"):
            if path.stem not in keep:
                path.unlink()

    def _schema_change(self, base: str, schema: Schema) -> str | None:
        """How `schema` differs from the one `base` was trained on (None: the same)."""
        old = self.schema_of(base)
        if old == schema:
            return None
        return describe_change(
            {c.name: c.kind.value for c in old.columns}, {c.name: c.kind.value for c in schema.columns}
        )

    def _train_rows(self, rows: pa.Table) -> pa.Table:
        mask = holdout_mask(rows.num_rows, self.config.holdout_share, self.config.seed)
        return rows.filter(pa.array(~mask))

    def _train(
        self, k: int, rows: pa.Table, span: int, schema: Schema, start: str | None, reset: bool
    ) -> tuple[RecModel, list[int]]:
        """Train on the last `span` windows up to k (`rows`: window k's), from the checkpoint of `start` (None: a
        fresh model); `reset`: a concept-drift recovery (its sparse optimizer state reset, Recovery's epochs and
        lr). Returns the model and the earlier windows left out because they lack a column of window k (a
        schema change inside the span: their rows cannot feed the new schema's features)."""
        cfg = self.config
        skipped: list[int] = []
        if span > 1:
            columns = rows.column_names
            older = []
            for j in range(max(0, k - span + 1), k):
                window = self.source(j)
                if set(columns) <= set(window.column_names):
                    older.append(window.select(columns))
                else:
                    skipped.append(j)
            rows = pa.concat_tables([*older, rows], promote_options="permissive")
            rows = rows.sort_by(cfg.windows.time_column)
        model = self.load(start) if start is not None else cfg.model.build(schema, cfg.seed)
        train_config = self._train_config
        if reset:
            for collection in model.embedding_collections():  # the embeddings and a wide part's weights
                collection.reset_optimizer_state()
            train_config = dataclasses.replace(train_config, epochs=cfg.recovery.epochs, lr=cfg.recovery.lr)
        model.train()
        data = table_batches(self._train_rows(rows), schema, cfg.batch_size, shuffle=True, seed=cfg.seed + k)
        fit(model, data, config=train_config)
        return model.eval(), skipped

    def _recovery(self, k: int) -> dict[str, Any] | None:
        """The concept-drift recovery retrain of window k ({"since", "windows", "base"}; Recovery), or None: the
        last retrain decision up to window k was a concept drift at window `since`, and window k is the first
        trained since then or the windows since then have grown `growth` times since the last recovery retrain
        (and span at most `hours`). The first one starts from the version warm starts would use (the last one
        published before the drift), later ones from that same version."""
        rc = self.config.recovery
        drift = None
        for r in self.log.records:
            if r.action == "retrain" and r.window <= k:
                drift = r if r.extra.get("concept") else None
        if drift is None:
            return None
        since, n = drift.window, k - drift.window + 1
        done = [
            r.extra["recovery"]
            for r in self.log.records
            if r.action == "trained" and since <= r.window < k and r.extra.get("recovery", {}).get("since") == since
        ]
        if not done:
            return {"since": since, "windows": n, "base": self.base_version()}
        if n < rc.growth * int(done[-1]["windows"]) or n * self.config.windows.seconds > rc.hours * 3600:
            return None
        return {"since": since, "windows": n, "base": done[-1]["base"]}

    def holdout(self, k: int) -> pa.Table:
        """Window k's holdout rows."""
        rows = self.source(k)
        mask = holdout_mask(rows.num_rows, self.config.holdout_share, self.config.seed)
        return rows.filter(pa.array(mask))

    def _gate(self, k: int, candidate: RecModel) -> GateResult:
        cfg = self.config
        holdout = self.holdout(k + 1)
        if holdout.num_rows == 0:
            nan = float("nan")
            return check({"auc": nan, "logloss": nan, "calibration": nan, "count": 0}, None, cfg.gate)
        gone = [c for c in self.schema_of(version_of(k)).names if c not in holdout.column_names]
        if gone:  # the next window dropped a column the candidate was trained on: it could not serve those rows
            reason = f"the candidate cannot read window {k + 1}: its columns {gone} are gone there"
            return GateResult(False, reason, {"rows": float(holdout.num_rows)})
        figures = evaluate(candidate, table_batches(holdout, self.schema_of(version_of(k)), 4096), device="cpu")
        serving = self.serving_version()
        if serving is None:
            return check(figures, None, cfg.gate)
        lacks = [c for c in self.schema_of(serving).names if c not in holdout.column_names]
        if lacks:  # a schema change: the serving model cannot read the next window
            result = check(figures, None, cfg.gate)
            note = f"serving {serving} not compared (window {k + 1} lacks its columns {lacks})"
            return GateResult(result.passed, f"{result.reason}; {note}", result.figures)
        data = table_batches(holdout, self.schema_of(serving), 4096)
        return check(figures, evaluate(self.load(serving), data, device="cpu"), cfg.gate)

    def _check_serving(self, k: int, result: GateResult) -> None:
        """The serving model on window k + 1's holdout (a gate figure) below its own baseline: a concept drift
        seen without a server; window k + 1 then starts the recovery (Recovery)."""
        serving = self.serving_version()
        now = result.figures.get("serving_auc")
        found = None if serving is None else self.baseline(serving)
        dc = self.config.decisions
        if now is None or found is None:
            return
        (base, base_se), now_se = found, _auc_se(result.figures, "serving_auc")
        if not below_baseline(now, now_se, base, base_se, dc):
            return
        if any(r.action == "retrain" for r in self.log.of_window(k + 1)) or self._recovering_from(serving):
            return  # already decided before a restart, or this version's drop already started a recovery
        reason = (
            f"serving {serving} AUC {now:.4f} on window {k + 1}'s holdout below its baseline {base:.4f} - "
            f"{dc.baseline_margin} by more than {dc.confidence_z} x the difference's standard error "
            f"{math.hypot(now_se, base_se):.4f}"
        )
        self.log.append(
            Record(
                k + 1,
                "retrain",
                reason,
                {"serving_auc": now, "baseline_auc": base},
                serving,
                extra={"windows": 1, "concept": True},
            )
        )

    def _recovering_from(self, version: str | None) -> bool:
        """Whether `version` was trained before the last concept drift the loop saw (a recovery is under way): it
        stays below its baseline until a recovered model replaces it, and that is no new drift."""
        drifts = [r.window for r in self.log.records if r.action == "retrain" and r.extra.get("concept")]
        trained = None if version is None else self.trained(version)
        return bool(drifts) and trained is not None and trained.window < drifts[-1]

    def _publish(self, k: int, version: str, result: GateResult) -> None:
        if self.publisher is None:
            self.log.append(Record(k, "publish", "gate passed (offline: serving now)", result.figures, version))
            return
        status = self.publisher.status()
        loaded = status is not None and version in status["versions"]
        stable = None if status is None else status["stable"]
        why = self._whole_bundle_reason(version, stable)
        share = self.config.canary_share
        if why is None:
            assert stable is not None
            path = self.update(version)
            if not loaded or not (path / MANIFEST).is_file():
                write_model_delta(self.load(stable), self.load(version), path, stable, self._content_id(stable))
            after = self.publisher.publish_delta(path, stable, version, share)
            how = f"version delta on {stable}"
            extra = {"mode": "delta", "base": stable}
        else:
            path = self.bundle(version)
            if not loaded or not (path / MANIFEST).is_file():
                export(
                    self.load(version),
                    path,
                    name=self.config.name,
                    version=version,
                    schema=self.schema_of(version),
                    overwrite=True,
                )
            after = self.publisher.publish(path, version, share)
            how = f"whole bundle ({why})"
            extra = {"mode": "bundle"}
        extra |= {"id": sha256_file(path / MANIFEST), "bytes": _size(path), "stable": after.get("stable")}
        extra["share"] = share  # a restarted embedded server gives the canary this share again (server_restore.py)
        role = "stable" if after.get("stable") == version else f"canary at share {share}"
        self.log.append(Record(k, "publish", f"gate passed; {role}; {how}", result.figures, version, extra=extra))
        self._retire(k)

    def _retire(self, k: int) -> None:
        """Unload (and log) what the retention policy drops: versions this loop published that are neither the
        stable version, nor the canary, nor among the `keep_versions` newest previous stables."""
        assert self.publisher is not None
        status = self.publisher.status()
        if status is None:
            return
        stable, canary, n = status["stable"], status["canary"], self.config.keep_versions
        previous = [v for v in dict.fromkeys(reversed(status["history"])) if v not in (stable, canary)][:n]
        keep = {stable, canary, *previous}
        unloaded = {r.version for r in self.log.records if r.action == "unload"}
        rolled_back = {r.version: r.window for r in self.log.records if r.action == "rollback"}
        for version in dict.fromkeys(r.version for r in self.log.records if r.action == "publish"):
            if version is None or version in keep or version in unloaded:
                continue
            if version in rolled_back:
                why = f"canary rolled back in window {rolled_back[version]}"
            else:
                why = f"retention: neither stable ({stable}), canary ({canary}) nor among the keep_versions={n} previous stables kept {previous}"
            done = self.publisher.unload(version)
            reason = why if done else f"{why}; already not loaded on the server (unloaded before a restart?)"
            self.log.append(Record(k, "unload", reason, None, version, extra={"stable": stable, "unloaded": done}))
        self._drop_publish_folders(set(status["versions"]) | {stable, canary})

    def _drop_publish_folders(self, loaded: set[str | None]) -> None:
        """Delete what was handed to the server for versions it has unloaded (their unload is logged): the
        version delta in updates/<v> (its working state went with the unload), and the whole bundle in
        bundles/<v> once no loaded version is built on it (a version delta's version keeps reading the table
        layout of the bundle its chain of deltas started from). Idempotent: a restart finishes the job."""
        root: dict[str, str] = {}  # version -> the whole-bundle version its chain of deltas starts from
        for r in self.log.records:
            if r.version is not None and (r.action == "publish" or (r.action == "restore" and "id" in r.extra)):
                base = r.extra.get("base")
                root[r.version] = root.get(base, base) if r.extra.get("mode") == "delta" and base else r.version
        needed = {root.get(v, v) for v in loaded if v is not None}
        for r in self.log.records:
            if r.action != "unload" or r.version is None or r.version in loaded:
                continue
            shutil.rmtree(self.update(r.version), ignore_errors=True)
            if r.version not in needed:
                shutil.rmtree(self.bundle(r.version), ignore_errors=True)

    def _content_id(self, version: str) -> str:
        """The id of what the server serves as `version` (publish.py / version_delta.py), from the log."""
        found = [
            r
            for r in self.log.records
            if r.version == version and (r.action == "publish" or (r.action == "restore" and "id" in r.extra))
        ]  # a `restore` with an id: a restarted server was given a bundle exported anew (server_restore.py)
        return str(found[-1].extra.get("id", "")) if found else ""

    def _whole_bundle_reason(self, version: str, stable: str | None) -> str | None:
        """Why `version` must go out as a whole bundle, or None when a version delta on `stable` will do."""
        if not self.config.deltas:
            return "loop.deltas is off"
        if stable is None:
            return "nothing serves yet"
        if not self._content_id(stable) or not self.checkpoint(stable).is_file():
            return f"the stable version {stable} was not published by this loop"
        old, new = self.trained(stable), self.trained(version)
        if old is None or new is None:
            return f"no training record of {stable if old is None else version}"
        changed = describe_change(old.extra.get("columns", {}), new.extra.get("columns", {}))
        if changed is not None:
            return f"schema changed since {stable}: {changed}"
        if old.extra.get("schema") != new.extra.get("schema"):
            return f"the trained schema changed since {stable}"
        if old.extra.get("model") != new.extra.get("model"):
            return f"the model config changed since {stable}"
        return None

    def _decide(self, k: int) -> None:
        """Canary decision and retrain check for window k (a retrain is a record of window k)."""
        assert self.publisher is not None and self.observe is not None
        status = self.publisher.status()
        if status is None:
            return
        stable, canary = status["stable"], status["canary"]
        reference = None
        trained = [r for r in self.log.records if r.action == "trained" and version_of(r.window) == stable]
        if trained:
            reference = self._train_rows(self.source(trained[-1].window))
        obs = self.observe(k, reference)
        if canary is not None:
            columns = self.source(k).column_names
            gone = {v: [c for c in self.schema_of(v).names if c not in columns] for v in (stable, canary) if v}
            if gone.get(stable) and not gone.get(canary):
                # the stable cannot read this window's requests (they fall back to the canary): it gets no feedback
                # to compare with, and the canary that passed the gate on such rows is the only one that serves them
                action, reason = (
                    Action.PROMOTE,
                    f"the stable {stable} cannot read window {k}: its columns {gone[stable]} are gone; the canary "
                    f"{canary} reads them and passed the gate",
                )
            else:
                action, reason = decide_canary(obs, self.config.decisions)
            figures = {
                f"{role}_{key}": float(getattr(kp, key))
                for role, kp in obs.kpis.items()
                for key in ("count", "auc", "ctr")
            }
            match action:
                case Action.PROMOTE:
                    self.publisher.promote(canary)
                case Action.ROLLBACK:
                    self.publisher.rollback(canary)
                case Action.WAIT:
                    pass
            self.log.append(Record(k, action.value, reason, figures, canary, extra={"stable": stable}))
            self._retire(k)
        found = None if stable is None else self.baseline(stable)
        why = retrain_reason(
            obs, None if found is None else found[0], self.config.decisions, 0.0 if found is None else found[1]
        )
        if why is not None and not (why.concept and self._recovering_from(stable)):
            windows = 1 if why.concept else self.config.retrain_windows
            drift = {name: float(v) for name, v in obs.drift.items()}
            self.log.append(
                Record(k, "retrain", why.reason, drift, stable, extra={"windows": windows, "concept": why.concept})
            )
