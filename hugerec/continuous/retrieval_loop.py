"""The continuous loop of a retrieval model (a two-tower or a matrix factorisation): per window, warm-start, train, gate on Recall@K, publish a pipeline bundle
with a refreshed ANN index as the canary, then promote or roll it back.

Window k's iteration (each finished phase a record of the decision log, as in loop.py: a loop started again
redoes only the unfinished phase):

    1. decide   with a server: the canary pipeline against the stable one on window k's events (the items each
                user met that day, which neither model was trained on): its Recall@K at least the stable's
                minus `recall_margin` -> promote, else roll back (the server then serves the stable pipeline
                and its index again)
    2. train    warm-start from the checkpoint of the last published version not rolled back (its sparse optimizer
                state reset with `warm_start_reset_optimizer`), `warm_start_epochs` over window k's events and,
                with `warm_start_replay` r > 0, round(r x their count) events of windows 0..k-1 drawn uniformly
                without replacement (seeded by the loop's seed and k; at most every earlier event), shuffled
                together (while nothing is published: a fresh model on every window so far, `epochs`)
    3. gate     candidate and serving model on window k + 1's events: Recall@K of each user's items of that
                day among the items the user had not met up to window k (exact top-K over every item), over
                the gate's users (`gate_user_share` of the users, a fixed draw; the canary decision reads the
                same ones, and the others are left to judge the served model on, unselected by the gate): the
                candidate passes with at least `min_users` users and a Recall@K at least the serving model's
                minus `recall_margin`
    4. publish  a pipeline bundle (bundles/w<k>: the towers, an ANN index built afresh over the candidate's
                item vectors, the items each user met up to window k for exclude-seen, the popularity list)
                -> the server as the canary at `canary_share` (its first version: the stable one). Without a
                server the candidate serves at once.
    5. retire   after each canary decision and each publish (the ranking loop's retention, loop.py): versions
                this loop published that are neither the stable version, nor the canary, nor among the
                `keep_versions` newest previous stables are unloaded from the server (an `unload` record each,
                written after the server's answer) and their bundles deleted; offline the last published
                version is the stable one and the versions published before it the previous stables, and a
                dropped version's bundle is deleted with an `unload` record. Then only the checkpoints a later
                step or a kept version reads stay (the warm-start base, stable, canary, the kept previous
                stables, whatever the server has loaded), unless `keep_all_checkpoints`.

Ids are dense: users 0..num_users-1, items 0..num_items-1 (hugerec.data.interactions.Interactions).

What the phases read is computed once per window and kept while a later phase may read it again: the events
of windows 0..k (training counts, the gate, the export), each measured window's users and CSR rows (the gate
at window k and the decision at window k + 1 measure the same window), and the Recall@K of each (version,
window) pair (the gate's candidate and serving model are the next decision's canary and stable). The source
must give the same events for a window on every call.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from hugerec.continuous.decision_log import DecisionLog, LiveRoles, Record, live_roles
from hugerec.continuous.publish import Publisher
from hugerec.data.interactions import Interactions, held_out_csr, iter_examples
from hugerec.data.windows import holdout_mask
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad, Optimizer
from hugerec.index.vector_index import IndexConfig, IndexKind
from hugerec.models.mf import MFConfig
from hugerec.models.registry import build_model
from hugerec.models.two_tower import TwoTowerConfig
from hugerec.serving.bundles.pipeline_bundle import export_pipeline
from hugerec.serving.pipeline.declaration import declaration_from_dict
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.checkpoint import atomic_save, read_weights
from hugerec.training.declared_loss import retrieval_loss
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.ranking_metrics import CSR, recall_at_k, subset_csr
from hugerec.training.retrieval import RetrievalFamily, RetrievalModel, all_item_vectors, user_vectors
from hugerec.training.trainer import TrainConfig, fit

EventSource = Callable[[int], Interactions]  # k -> the events of window k (dense ids)


def _default_tower() -> TwoTowerConfig:
    return TwoTowerConfig(dim=32, embedding_dim=32, user_layers=(), max_history=0, recent=())


@dataclass(frozen=True)
class RetrievalLoopConfig:
    """work_dir holds decisions.jsonl, checkpoints/ and bundles/; `model` the retrieval model trained: a two-tower
    (user ids only: max_history = 0 and recent = (), what a pipeline serves from the user id) or a matrix
    factorisation; `k` the K of the gate's
    Recall@K and of the pipeline's answers; `ann_k` the candidates the pipeline's ANN source takes before
    exclude-seen; `keep_versions`: how many previous stable versions stay (loaded on the server, their bundles
    and checkpoints kept) for a manual rollback; `keep_all_checkpoints`: keep every window's checkpoint."""

    work_dir: str
    num_users: int
    num_items: int
    model: TwoTowerConfig | MFConfig = field(default_factory=_default_tower)
    optimizer: Optimizer = field(default_factory=lambda: Adagrad(lr=0.1))  # the towers' sparse optimizer
    epochs: int = 2  # epochs of a model trained from scratch (the first one, on every window so far)
    # passes of a warm start over its one window (None: `epochs`); a fraction trains that share of the window's
    # batches in the last pass (1.5: one pass, then the first half of a second shuffle)
    warm_start_epochs: float | None = None
    # a warm start resets the towers' sparse optimizer state (Adagrad's sums back to their initial value, the rows'
    # weights kept): rows trained for days otherwise take ever smaller steps on the new window
    warm_start_reset_optimizer: bool = False
    # experience replay: a warm start also trains on round(warm_start_replay x the window's events) events of the
    # earlier windows (a uniform draw without replacement, capped at what exists), so that what a day's events
    # do not show (the users' older tastes, the older items) is not forgotten; `warm_start_epochs` counts passes
    # over the window and the replayed events together. 0: the window alone
    warm_start_replay: float = 0.0
    lr: float = 3e-3  # the dense learning rate (Adam)
    batch_size: int = 512
    k: int = 50
    ann_k: int = 200
    recall_margin: float = 0.01
    min_users: int = 50
    gate_user_share: float = 1.0
    canary_share: float = 0.1
    index: IndexConfig = field(default_factory=lambda: IndexConfig(IndexKind.HNSW))
    name: str = "recs"
    seed: int = 0
    keep_versions: int = 1
    keep_all_checkpoints: bool = False

    def __post_init__(self) -> None:
        if self.keep_versions < 0:
            raise ValueError(f"RetrievalLoopConfig: keep_versions must be >= 0, got {self.keep_versions}")
        if self.num_users < 1 or self.num_items < 1:
            raise ValueError(f"RetrievalLoopConfig: num_users and num_items must be >= 1, got {self.num_users}, {self.num_items}")
        w = self.warm_start_epochs
        if w is not None and not (w > 0 and math.isfinite(w)):
            raise ValueError(f"RetrievalLoopConfig: warm_start_epochs must be a number > 0 or None, got {w}")
        r = self.warm_start_replay
        if isinstance(r, bool) or not isinstance(r, int | float) or not (r >= 0 and math.isfinite(r)):
            raise ValueError(f"RetrievalLoopConfig: warm_start_replay must be a number >= 0, got {r!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.min_users < 1:
            raise ValueError(
                f"RetrievalLoopConfig: epochs, batch_size and min_users must be >= 1, got {self.epochs}, {self.batch_size}, {self.min_users}"
            )
        if not 1 <= self.k <= self.ann_k:
            raise ValueError(f"RetrievalLoopConfig: need 1 <= k <= ann_k, got k={self.k}, ann_k={self.ann_k}")
        m = self.model
        if isinstance(m, TwoTowerConfig) and (m.max_history or m.recent or m.user_features or m.item_features or not m.use_user_id):
            raise ValueError(
                "RetrievalLoopConfig: a two-tower must embed user ids only (max_history = 0, recent = [], no side "
                f"features, use_user_id), got max_history={m.max_history}, recent={list(m.recent)}"
            )
        if not 0 < self.gate_user_share <= 1:
            raise ValueError(f"RetrievalLoopConfig: gate_user_share must be in (0, 1], got {self.gate_user_share}")
        if not self.recall_margin >= 0 or not 0 < self.canary_share <= 1 or not self.lr > 0:
            raise ValueError(
                f"RetrievalLoopConfig: need recall_margin >= 0, canary_share in (0, 1], lr > 0, got "
                f"{self.recall_margin}, {self.canary_share}, {self.lr}"
            )

    @property
    def log_path(self) -> Path:
        return Path(self.work_dir) / "decisions.jsonl"


def version_of(window: int) -> str:
    return f"w{window}"


def _seen_csr(events: Interactions) -> tuple[np.ndarray, np.ndarray]:
    """Each user's distinct items of `events` as CSR (offsets [U + 1], items [N])."""
    return held_out_csr(events)


class RetrievalLoop:
    """Runs the two-tower loop over windows of `source`; `publisher` None: offline (published = serving)."""

    def __init__(self, config: RetrievalLoopConfig, source: EventSource, publisher: Publisher | None = None) -> None:
        self.config = config
        self.source = source
        self.publisher = publisher
        self.work = Path(config.work_dir)
        self.log = DecisionLog(config.log_path)
        self.seconds: dict[str, float] = {}  # the phases of the last step: train, gate, publish (wall, for the benchmark)
        self.cpu_seconds: dict[str, float] = {}  # the same phases in this process's CPU seconds
        self._histories: dict[int, Interactions] = {}  # k -> the events of windows 0..k (the newest two kept)
        self._targets: dict[tuple[int, bool], tuple[np.ndarray, CSR, CSR]] = {}  # (k, gate) -> users, held, excluded
        # the users the gate and the canary decision measure (a fixed draw); the others measure the served model
        share = self.config.gate_user_share
        self.gate_users = np.ones(self.config.num_users, bool) if share == 1 else holdout_mask(self.config.num_users, share, self.config.seed)
        self._seen: dict[int, CSR] = {}  # k -> each user's items of windows 0..k (the newest two kept, `seen`)
        self._held: dict[int, CSR] = {}  # k -> each user's distinct items of window k (the newest three kept, `held`)
        self._recalls: dict[tuple[str, int, int], tuple[float, int]] = {}  # (version, checkpoint mtime, k) -> recall
        self._models: dict[tuple[str, int], RetrievalModel] = {}  # (version, checkpoint mtime) -> the model (`load`)

    # -- state, read back from the decision log --------------------------------------------------
    def checkpoint(self, version: str) -> Path:
        return self.work / "checkpoints" / f"{version}.pt"

    def bundle(self, version: str) -> Path:
        return self.work / "bundles" / version

    def base_version(self) -> str | None:
        """Where the next candidate warm-starts: the last published version not rolled back since."""
        return self.log.warm_start_version()

    def serving_version(self) -> str | None:
        """The server's stable pipeline; offline the last published version."""
        if self.publisher is not None:
            status = self.publisher.status()
            return None if status is None else status["stable"]
        return self.log.last_published()

    def build(self) -> RetrievalModel:
        torch.manual_seed(self.config.seed)
        c = self.config
        model = build_model(c.model, optimizer=c.optimizer, num_users=c.num_users, num_items=c.num_items)
        return model  # type: ignore[return-value]  # a retrieval config builds a retrieval model

    def load(self, version: str) -> RetrievalModel:
        """The model of `version`'s checkpoint, in eval mode, kept in memory per (version, the checkpoint's mtime)
        for the phases that read it again (the gate, the export, the next decision; the candidate is kept as
        trained): read only, never trained (a warm start trains a model of its own, `_read`)."""
        key = (version, self.checkpoint(version).stat().st_mtime_ns)
        if key not in self._models:
            self._keep(key, self._read(version))
        return self._models[key]

    def _read(self, version: str) -> RetrievalModel:
        """A model of its own with `version`'s weights (eval mode): copied from the model `load` keeps for the
        checkpoint (the one it was written from, same mtime) when there is one, else read from the checkpoint."""
        model = self.build()
        path = self.checkpoint(version)
        kept = self._models.get((version, path.stat().st_mtime_ns))
        if kept is not None:
            model.load_state_dict({name: t.clone() for name, t in kept.state_dict().items()})
        else:
            model.load_state_dict(read_weights(path, "RetrievalLoop", "model checkpoint"))
        return model.eval()

    def _keep(self, key: tuple[str, int], model: RetrievalModel) -> None:
        """Keep `model` as `load`'s answer for `key`, with the three models used last (a window reads at most the
        candidate, the serving model and the canary)."""
        self._models.pop(key, None)
        self._models[key] = model
        while len(self._models) > 3:
            del self._models[next(iter(self._models))]

    def history(self, k: int) -> Interactions:
        """Every event of windows 0..k in one log (window k - 1's log and window k's events, when that is kept)."""
        if k not in self._histories:
            before = self._histories.get(k - 1)
            frames = [before.frame, self.source(k).frame] if before is not None else [self.source(j).frame for j in range(k + 1)]
            frame = pl.concat(frames).sort(["user", "timestamp"], maintain_order=True)
            self._histories = {j: h for j, h in self._histories.items() if j >= k - 1}
            self._histories[k] = Interactions(frame, self.config.num_users, self.config.num_items)
        return self._histories[k]

    def restore_server(self) -> LiveRoles:
        """Give an empty server (one restarted with the loop) the stable pipeline, the canary and its share that the
        decision log says were live, each from its bundle (exported anew from its checkpoint when the bundle is
        gone), with a `restore` record each; a server that serves anything is left alone. Returns the log's roles."""
        if self.publisher is None:
            raise ValueError("RetrievalLoop.restore_server: the loop has no server to restore")
        live = live_roles(self.log.records, self.config.canary_share)
        if live.stable is None or self.publisher.status() is not None:
            return live
        for version, share in ((live.stable, 1.0), (live.canary, live.share)):
            if version is None or share is None:
                continue
            published = [r for r in self.log.records if r.action == "publish" and r.version == version][-1]
            how = "replayed its bundle"
            if not (self.bundle(version) / "manifest.json").is_file():
                self.export(version, published.window)
                how = "its pipeline bundle exported anew from its checkpoint"
            self.publisher.publish(self.bundle(version), version, share)
            role = "stable" if version == live.stable else f"canary at share {share}"
            window = max(r.window for r in self.log.records)
            self.log.append(Record(window, "restore", f"server restarted: {role} again; {how}", None, version, {"role": role}))
        return live

    # -- the iteration ---------------------------------------------------------------------------
    def run(self, first: int, last: int) -> list[Record]:
        for k in range(first, last):
            self.step(k)
        return self.log.records

    def step(self, k: int) -> None:
        done = {r.action for r in self.log.of_window(k)}
        if done & {"publish", "refuse", "skip"}:
            return
        if self.publisher is not None and not done & {"promote", "rollback", "wait"}:
            self._decide(k)
        version = version_of(k)
        events = self.source(k)
        if events.num_events == 0:
            self.log.append(Record(k, "skip", f"window {k} has no events"))
            return
        t0, c0 = time.perf_counter(), time.process_time()
        if "trained" not in done or not self.checkpoint(version).is_file():
            base = self.base_version()
            first = min((r.window for r in self.log.records if r.action == "trained"), default=k)
            epochs: float = self.config.epochs
            if base is None:  # nothing published yet: a fresh model on every window so far
                rows, how = self.history(k) if first < k else events, f"a fresh model on windows {first}..{k}"
                model = self.build()
            else:
                rows, how, model = events, f"warm start from {base}", self._read(base)
                if self.config.warm_start_reset_optimizer:
                    for collection in (m for m in model.modules() if isinstance(m, EmbeddingCollection)):
                        collection.reset_optimizer_state()
                    how += " (sparse optimizer state reset)"
                w = self.config.warm_start_epochs
                if w is not None:
                    epochs = int(w) if float(w).is_integer() else w  # 2.0 from a file: 2 passes, logged as 2
                replayed = self.replay(k, events)
                if replayed.num_events:
                    how += f" with {replayed.num_events} replayed events of windows 0..{k - 1}"
                    rows = Interactions(pl.concat([events.frame, replayed.frame]), self.config.num_users, self.config.num_items)
            counts = np.bincount(self.history(k).items(), minlength=self.config.num_items)
            steps = self.train(model, rows, counts, k, epochs)
            atomic_save(model.state_dict(), self.checkpoint(version))
            self._keep((version, self.checkpoint(version).stat().st_mtime_ns), model)  # the gate and the export read it
            extra: dict[str, Any] = {"events": rows.num_events, "base": base, "epochs": epochs, "steps": steps}
            if base is not None:
                extra["replayed"] = rows.num_events - events.num_events  # of `events`: those drawn from earlier windows
            self.log.append(Record(k, "trained", how, extra=extra))
        t1, c1 = time.perf_counter(), time.process_time()
        passed, reason, figures = self._gate(k, version)
        t2, c2 = time.perf_counter(), time.process_time()
        if not passed:
            self.log.append(Record(k, "refuse", reason, figures, version))
        else:
            self._publish(k, version, reason, figures)
        self._retire(k)
        self.seconds = {"train": t1 - t0, "gate": t2 - t1, "publish": time.perf_counter() - t2}
        self.cpu_seconds = {"train": c1 - c0, "gate": c2 - c1, "publish": time.process_time() - c2}

    def replay(self, k: int, events: Interactions) -> Interactions:
        """The events a warm start at window k replays beside window k's `events`: round(warm_start_replay x their
        count) of the events of windows 0..k-1 (at most all of them), a uniform draw without replacement seeded by
        (the loop's seed, k), so that a restarted loop draws the same ones; no events with warm_start_replay 0."""
        c = self.config
        want = round(c.warm_start_replay * events.num_events)
        earlier = self.history(k - 1) if want and k > 0 else None
        if earlier is None or earlier.num_events == 0:
            return events.with_frame(events.frame.clear())
        n = min(want, earlier.num_events)
        rng = np.random.default_rng([c.seed, k, 0x5EED])  # its own stream: the training's shuffles use other seeds
        drawn = np.sort(rng.choice(earlier.num_events, size=n, replace=False))  # [n] rows of the events so far
        return earlier.with_frame(earlier.frame[drawn].select(events.frame.columns))

    def train(self, model: RetrievalModel, rows: Interactions, counts: np.ndarray, k: int, epochs: float | None = None) -> int:
        """`epochs` (None: the config's) passes over `rows` (events; `counts`: every item's events so far, the
        negatives' distribution and log-Q), through the one trainer (RetrievalFamily), seeded by window k. A
        fractional `epochs` ends with that share of a pass: ceil(epochs) shuffles, round(epochs x batches) steps
        (at least one). Returns the steps taken."""
        c = self.config
        epochs = c.epochs if epochs is None else epochs
        n = -(-rows.num_events // c.batch_size)
        batches = EpochBatches(lambda e: iter_examples(rows, c.batch_size, 0, seed=c.seed + 1000 * k + e), length=n)
        whole = float(epochs).is_integer()
        config = TrainConfig(
            epochs=math.ceil(epochs),
            max_steps=None if whole else max(1, round(epochs * n)),
            lr=c.lr,
            progress=False,
            tensorboard=False,
            plot=False,
            device="cpu",
            pipeline=False,
            seed=c.seed + k,
        )
        result = fit(model, batches, None, config, family=RetrievalFamily(counts, retrieval_loss(c.model), ks=(c.k,)))
        model.eval()
        return result.steps

    def recall(self, model: RetrievalModel, k: int, gate: bool = True) -> tuple[float, int]:
        """(Recall@K of `model` on window k's events, the users it is measured on): each user's items of window k
        among the items the user had not met in windows 0..k-1 (exact top-K over every item); over the gate's
        users (`gate_users`), or with gate=False over the others (those a served model is judged on)."""
        users, held, seen = self._target(k, gate)
        if not users.size:
            return float("nan"), 0
        empty = JaggedTensor(torch.zeros(0, dtype=torch.int64), torch.zeros(users.size, dtype=torch.int64))
        q, v = user_vectors(model, torch.from_numpy(users), empty), all_item_vectors(model)  # [U', D], [I, D]
        # the value list_recall(top_items(..., csr_minus(seen, held), ...)) gives, to the bit (the same scores),
        # without the top-K lists and the exclusion minus the held items (recall_at_k keeps those rankable)
        return recall_at_k(lambda u0, u1, i0, i1: q[u0:u1] @ v[i0:i1].T, held, seen, self.config.num_items, self.config.k), int(users.size)

    def recall_of(self, version: str, k: int) -> tuple[float, int]:
        """`recall` of the checkpoint of `version`, kept per (version, the checkpoint's mtime, k)."""
        key = (version, self.checkpoint(version).stat().st_mtime_ns, k)
        if key not in self._recalls:
            self._recalls = {x: r for x, r in self._recalls.items() if x[2] >= k - 1}
            self._recalls[key] = self.recall(self.load(version), k)
        return self._recalls[key]

    def _target(self, k: int, gate: bool = True) -> tuple[np.ndarray, CSR, CSR]:
        """Window k's measured users [U'] (those with events, among the gate's users or the others), their items of
        window k, and their items of windows 0..k-1 (which are not recommended unless met again in window k:
        `retrieval_metrics`'s exclusion, `recall_at_k`'s), as CSR over those users only; computed once for every
        model measured on window k."""
        if (k, gate) not in self._targets:
            held = self.held(k)
            users = np.flatnonzero((np.diff(held[0]) > 0) & (self.gate_users == gate))
            self._targets = {j: t for j, t in self._targets.items() if j[0] >= k - 1}
            self._targets[(k, gate)] = (users, subset_csr(held, users), subset_csr(self.seen(k - 1), users))
        return self._targets[(k, gate)]

    def held(self, k: int) -> CSR:
        """Each user's distinct items of window k as CSR over every user: what the gate measures on window k (step
        k - 1) and what `seen` adds for it (step k), computed once for both."""
        if k not in self._held:
            self._held = {j: r for j, r in self._held.items() if j >= k - 2}
            self._held[k] = _seen_csr(self.source(k))
        return self._held[k]

    def seen(self, k: int) -> CSR:
        """Each user's items of windows 0..k as CSR over every user (offsets [U + 1], items [N]; k < 0: none): window
        k - 1's rows and window k's distinct items side by side, row by row, when window k - 1's are kept (an item
        met in two windows is then listed twice: the exclusion reads the rows as sets), else from the events so far."""
        if k < 0:
            return np.zeros(self.config.num_users + 1, np.int64), np.zeros(0, np.int64)
        if k not in self._seen:
            before = self._seen.get(k - 1)
            rows = _seen_csr(self.history(k)) if before is None else _side_by_side(before, self.held(k))
            self._seen = {j: r for j, r in self._seen.items() if j >= k - 1}
            self._seen[k] = rows
        return self._seen[k]

    def _gate(self, k: int, version: str) -> tuple[bool, str, dict[str, float]]:
        c = self.config
        ours, users = self.recall_of(version, k + 1)
        figures = {"candidate_recall": ours, "users": float(users)}
        if users < c.min_users:
            return False, f"window {k + 1} has {users} users with events, fewer than min_users = {c.min_users}", figures
        serving = self.serving_version()
        if serving is None:
            return True, f"Recall@{c.k} {ours:.4f} (nothing serves yet)", figures
        theirs, _ = self.recall_of(serving, k + 1)
        figures["serving_recall"] = theirs
        if ours < theirs - c.recall_margin:
            return False, f"Recall@{c.k} {ours:.4f} below the serving {serving}'s {theirs:.4f} - {c.recall_margin}", figures
        return True, f"Recall@{c.k} {ours:.4f} vs the serving {serving}'s {theirs:.4f}", figures

    def export(self, version: str, k: int) -> Path:
        """The pipeline bundle of `version` (trained on windows up to k): towers, a fresh ANN index over its item
        vectors, each user's items up to window k (exclude-seen), the items by popularity."""
        c = self.config
        history = self.history(k)
        store = FeatureStore.in_memory({"user": ("known",), "item": ("known",)})
        store.write("user", np.arange(c.num_users), {"known": np.ones(c.num_users, np.int64)})
        store.write("item", np.arange(c.num_items), {"known": np.ones(c.num_items, np.int64)})
        # the events grouped by user, each user's in time order (an Interactions frame is sorted by (user, timestamp)):
        # each user's row is what a time-ordered log gives, without sorting every event so far by time first
        seen = InteractionStore.from_pairs(history.users(), history.items())
        popular = np.argsort(-np.bincount(history.items(), minlength=c.num_items), kind="stable")
        declaration = declaration_from_dict(
            {
                "pipeline": {"name": c.name, "version": version},
                "retrieve": {"sources": [{"kind": "ann", "k": c.ann_k}, {"kind": "popular", "k": c.k}]},
                "filter": {"exclude_seen": True},
                "order": {"max_k": c.k},
            },
            "the retrieval loop's pipeline",
        )
        encoder = UserEncoder(self.load(version))
        return export_pipeline(self.bundle(version), declaration, store, seen, popular, encoder, c.index)

    def _publish(self, k: int, version: str, reason: str, figures: dict[str, float]) -> None:
        path = self.export(version, k)
        if self.publisher is None:
            self.log.append(Record(k, "publish", f"gate passed: {reason} (offline: serving now)", figures, version))
            return
        after = self.publisher.publish(path, version, self.config.canary_share)
        role = "stable" if after.get("stable") == version else f"canary at share {self.config.canary_share}"
        extra: dict[str, Any] = {"stable": after.get("stable")}
        self.log.append(Record(k, "publish", f"gate passed: {reason}; {role}; pipeline bundle with a new index", figures, version, extra=extra))

    def _retire(self, k: int) -> None:
        """The retention of the ranking loop (Loop._retire): versions this loop published that are neither stable, nor
        canary, nor among the `keep_versions` newest previous stables are unloaded from the server, each with an
        `unload` record once the server let it go (a version found already gone is logged as such), and their bundles
        deleted; offline (no server) the last published version is the stable one, the versions published before it
        the previous stables, and a dropped version's bundle is deleted with an `unload` record. Then the
        checkpoints no later step and no kept version reads go (unless keep_all_checkpoints). Idempotent: a
        restart finishes the job."""
        n = self.config.keep_versions
        published = list(dict.fromkeys(r.version for r in self.log.records if r.action == "publish" and r.version))
        rolled_back = {r.version: r.window for r in self.log.records if r.action == "rollback"}
        if self.publisher is None:
            stable, canary, loaded = self.log.last_published(), None, set()
            history = [v for v in published if v not in rolled_back]
        else:
            status = self.publisher.status()
            if status is None:
                return  # the server's versions unknown: drop nothing this time
            stable, canary, loaded = status["stable"], status["canary"], set(status["versions"])
            history = list(status["history"])
        previous = [v for v in dict.fromkeys(reversed(history)) if v not in (stable, canary)][:n]
        keep = {stable, canary, *previous}
        unloaded = {r.version for r in self.log.records if r.action == "unload"}
        for version in published:
            if version in keep or version in unloaded:
                continue
            if version in rolled_back:
                why = f"canary rolled back in window {rolled_back[version]}"
            else:
                why = f"retention: neither stable ({stable}), canary ({canary}) nor among the keep_versions={n} previous stables kept {previous}"
            if self.publisher is None:
                done, reason = False, f"{why} (offline: its bundle deleted)"
            else:
                done = self.publisher.unload(version)
                reason = why if done else f"{why}; already not loaded on the server (unloaded before a restart?)"
            self.log.append(Record(k, "unload", reason, None, version, extra={"stable": stable, "unloaded": done}))
        for r in self.log.records:
            if r.action == "unload" and r.version is not None and r.version not in loaded | keep:
                shutil.rmtree(self.bundle(r.version), ignore_errors=True)
        if not self.config.keep_all_checkpoints:
            keep |= loaded | {self.base_version()}
            for path in (self.work / "checkpoints").glob("*.pt"):
                if path.stem not in keep:
                    path.unlink()

    def _decide(self, k: int) -> None:
        """The canary pipeline against the stable one on window k's events (Recall@K of the models they serve)."""
        assert self.publisher is not None
        status = self.publisher.status()
        if status is None or status["canary"] is None or status["stable"] is None:
            return
        stable, canary = status["stable"], status["canary"]
        theirs, users = self.recall_of(stable, k)
        ours, _ = self.recall_of(canary, k)
        figures = {"stable_recall": theirs, "canary_recall": ours, "users": float(users)}
        margin = self.config.recall_margin
        if users < self.config.min_users:
            self.log.append(Record(k, "wait", f"window {k} has {users} users with events", figures, canary, extra={"stable": stable}))
            return
        if ours >= theirs - margin:
            self.publisher.promote(canary)
            action, why = "promote", f"canary Recall@{self.config.k} {ours:.4f} >= stable {stable}'s {theirs:.4f} - {margin}"
        else:
            self.publisher.rollback(canary)
            action, why = "rollback", f"canary Recall@{self.config.k} {ours:.4f} below stable {stable}'s {theirs:.4f} - {margin}"
        self.log.append(Record(k, action, why, figures, canary, extra={"stable": stable}))
        self._retire(k)


def _side_by_side(a: CSR, b: CSR) -> CSR:
    """Row r of the result: a's row r, then b's row r (two CSRs over the same rows), without a sort."""
    (a_off, a_items), (b_off, b_items) = a, b
    a_len, b_len = np.diff(a_off), np.diff(b_off)  # [R] each
    offsets = np.concatenate([[0], np.cumsum(a_len + b_len)]).astype(np.int64)
    items = np.empty(int(offsets[-1]), np.int64)
    items[np.repeat(offsets[:-1] - a_off[:-1], a_len) + np.arange(len(a_items))] = a_items  # each row's first part
    items[np.repeat(offsets[:-1] + a_len - b_off[:-1], b_len) + np.arange(len(b_items))] = b_items  # after it
    return offsets, items
