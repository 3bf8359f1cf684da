"""train / evaluate / index / recommend for the retrieval (two_tower, mf) and sequential (sasrec, mlm, gru4rec) models.

<train.out_dir>/model.pt                 train: the model, its raw-id vocabulary, item counts and (retrieval)
                                         the users' training histories, in one weights-only file
<train.out_dir>/metrics.jsonl, checkpoints/, curves.png, tensorboard/
                                         train: the one trainer's log, checkpoints (train.resume=true continues
                                         a run exactly) and curves, as for the ranking models
<train.out_dir>/metrics.json             train: the held-out metrics at the end of training
<train.out_dir>/index/                   index: the exact or HNSW index over the item vectors
<train.out_dir>/recommendations.parquet  recommend: one row per (user or history, rank)

Data are views of [preprocess]'s declared input (hugerec.data.events: user histories for retrieval,
sessions or user histories for sequential models, as [interactions] / [sequences] say) and are read,
id-mapped and split the same way by every command, so `evaluate` scores exactly the held-out part
`train` left out (it checks that the data still give the model's vocabulary). `train` cuts a validation
split from the training part the same way the test split was cut (each user's last training events, the
latest time fraction, or the latest tenth of the sessions) and trains with [train] through the one
trainer (`hugerec.training.fit`) on the rest: epochs is the most it trains, early stopping on the
validation metric ([train.early_stopping], recall@K by default) decides when to stop. The model is built
by the registry (`hugerec.models.build_model`); the model file is the library's
(hugerec.training.save_model / load_model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch import nn

from hugerec.cli.config_file import ConfigError
from hugerec.cli.interactions_config import RecommendSection, SequenceWindows
from hugerec.cli.run_config import RunConfig
from hugerec.data.events import RetrievalData, SequenceData, SequenceProtocol, retrieval_view, sequence_view
from hugerec.data.input_spec import InputSpec
from hugerec.data.interactions import Interactions, epoch_examples, full_ranking, histories, last_items
from hugerec.data.prepare import SplitKind, SplitSpec
from hugerec.data.sessions import ItemVocabulary, Sequences, last_n, prefixes, sliding_windows, with_reversed
from hugerec.data.sessions import leave_last_out as sequences_leave_last_out
from hugerec.distributed.launch import DistEnv, init_from_env, launched_by_torchrun
from hugerec.distributed.planner import Constraint, Workload, plan
from hugerec.distributed.shard import shard
from hugerec.distributed.sharding_plan import ShardingKind
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.index.vector_index import load_index
from hugerec.models.hstu import HSTUConfig
from hugerec.models.mf import MatrixFactorization, MFConfig
from hugerec.models.registry import Family, build_model
from hugerec.models.sequence import PAD, MLMConfig, SequenceModelConfig
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.checkpoint import load_checkpoint
from hugerec.training.declared_loss import retrieval_loss, sequence_loss
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.model_file import RawIds, SavedModel, load_model, save_model
from hugerec.training.retrieval import (
    RetrievalFamily,
    RetrievalModel,
    RetrievalValidation,
    all_item_vectors,
    recommend,
    user_vectors,
)
from hugerec.training.sequential import (
    NextItemValidation,
    SequenceModel,
    SequentialFamily,
    query_vectors,
    window_batches,
    window_width,
)
from hugerec.training.sequential import all_item_vectors as sequence_item_vectors
from hugerec.training.trainer import History, evaluate, fit, seed_everything


def is_retrieval(cfg: RunConfig) -> bool:
    return cfg.family is Family.RETRIEVAL


# -- the data: views of the declared input -------------------------------------------------------
def _declared(cfg: RunConfig) -> tuple[InputSpec, str]:
    """[preprocess]'s input spec (columns resolved) and its files."""
    from hugerec.cli.commands import input_spec

    return input_spec(cfg), cfg.preprocess.input


def _retrieval_split(cfg: RunConfig) -> SplitSpec:
    """[preprocess]'s split for retrieval (default: each user's last `holdout` events)."""
    p = cfg.preprocess
    return p.split_spec() if p.split is not None else SplitSpec(SplitKind.LEAVE_LAST_OUT, holdout=p.holdout)


def retrieval_data(cfg: RunConfig) -> RetrievalData:
    """User histories of the declared input, split by [preprocess] (default: each user's last `holdout` events)."""
    p, s = cfg.preprocess, cfg.interactions
    spec, paths = _declared(cfg)
    try:
        return retrieval_view(spec, paths, _retrieval_split(cfg), s.min_item_count, s.max_users, p.on_error)
    except FileNotFoundError as e:
        raise ConfigError(f"preprocess.input: {e}") from None


def _retrieval_validation(d: RetrievalData) -> tuple[Interactions, Interactions]:
    """The training part less a validation split, and that split (`RetrievalData.validation_split`)."""
    try:
        return d.validation_split()
    except ValueError as e:
        raise ConfigError(str(e)) from None


def build_retrieval_model(kind: TwoTowerConfig | MFConfig, num_users: int, num_items: int, cfg: RunConfig) -> RetrievalModel:
    model = build_model(kind, optimizer=cfg.embedding.optimizer, num_users=num_users, num_items=num_items)
    assert isinstance(model, TwoTower | MatrixFactorization)  # the registry's retrieval builders
    return model


def _max_history(model: RetrievalModel) -> int:
    return model.config.max_history if isinstance(model, TwoTower) else 0


def train_retrieval(cfg: RunConfig) -> dict[str, float]:
    """Read, split, train with [train] (early stopping on a validation split cut from the training part
    as the test split was from the whole), evaluate on the held-out part, save model.pt and metrics.json;
    returns the metrics.

    Under torchrun every rank trains its rows of each batch; the user and item tables are sharded row-wise
    (the plan is printed) and rank 0 writes the model."""
    kind = cfg.model
    assert isinstance(kind, TwoTowerConfig | MFConfig)  # the CLI sends retrieval models here
    d = retrieval_data(cfg)
    split = _retrieval_split(cfg)
    fit_part, valid = _retrieval_validation(d)
    s = cfg.interactions
    env = _distributed()
    rank, world = (0, 1) if env is None else (env.rank, env.world_size)
    if rank == 0:
        print(
            f"train: {d.data.num_users:,} users, {d.data.num_items:,} items, {fit_part.num_events:,} training / "
            f"{valid.num_events:,} validation / {d.test.num_events:,} test events ({split.kind.value})",
            flush=True,
        )
    try:
        seed_everything(cfg.train.seed or 0)  # every rank builds the same model
        model: nn.Module = build_retrieval_model(kind, d.data.num_users, d.data.num_items, cfg)
        max_history = _max_history(model)  # type: ignore[arg-type]
        if env is not None:
            model = _shard(model, ("user_id", "item_id"), s.batch_size // world, env.rank, world)
        validation = RetrievalValidation(*full_ranking(fit_part, valid, max_history))
        family = RetrievalFamily(fit_part.item_counts(), retrieval_loss(kind), ks=tuple(s.ks))
        batches = EpochBatches(*epoch_examples(fit_part, s.batch_size, max_history, seed=cfg.train.seed or 0, rank=rank, world=world))
        history = fit(model, batches, validation, cfg.train, family=family)
    finally:
        if env is not None:
            dist.destroy_process_group()
    if rank > 0:
        return {}
    _print_best(history)
    trained = model if env is None else _whole(history, cfg, lambda: build_retrieval_model(kind, d.data.num_users, d.data.num_items, cfg))
    metrics = held_out_metrics(trained, d, s.ks)  # type: ignore[arg-type]  # a retrieval model
    train_times = d.train.frame["timestamp"].to_numpy().astype(np.int64)  # [N] beside histories(d.train)'s items
    save_task_model(cfg, trained, d.users_raw, d.items_raw, d.train.item_counts(), histories(d.train), train_times)  # type: ignore[arg-type]
    _write_metrics(cfg, metrics)
    return metrics


def _distributed() -> DistEnv | None:
    """This rank's process group under torchrun (gloo on CPU), None in a plain process."""
    return init_from_env() if launched_by_torchrun() else None


def _shard(model: nn.Module, row_wise: tuple[str, ...], batch_size: int, rank: int, world: int) -> nn.Module:
    """`model` sharded by the planner over the torchrun ranks, the tables in `row_wise` pinned row-wise
    (the huge id tables: each rank holds 1/W of their rows); rank 0 prints the plan."""
    collections = [m for m in model.modules() if isinstance(m, EmbeddingCollection)]
    tables = [t for c in collections for t in c.tables]
    pins = {t.name: Constraint(ShardingKind.ROW_WISE) for t in tables if t.name in row_wise}
    sharding = plan(tables, world, load=Workload(batch_size=max(1, batch_size)), constraints=pins, optimizer=collections[0].optimizer)
    if rank == 0:
        print(sharding, flush=True)
    return shard(model, sharding)


def _whole(history: History, cfg: RunConfig, build: Any) -> nn.Module:
    """The trained model read whole in this process from the sharded run's checkpoints (its best when
    train.early_stopping.restore_best, else its last)."""
    whole: nn.Module = build()
    best = history.best_checkpoint if cfg.train.early_stopping.restore_best else None
    path = best or history.model_checkpoint  # the weights fit returned (averaged: train.average_epochs)
    assert path is not None  # fit writes a final checkpoint: the CLI always has an out_dir
    load_checkpoint(path, whole)
    return whole.eval()


def _print_best(history: History) -> None:
    """One line: steps, the last log window's samples/s, and the best validation epoch's metrics."""
    speed = f", {history.train[-1]['samples_per_s']:,.0f} samples/s" if history.train else ""
    line = f"  {history.steps:,} steps{speed}"
    if history.best_eval is not None:
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in history.best_eval.items() if "@" in k and not k.startswith("coverage"))
        stop = "stopped early; " if history.stopped_early else ""
        line += f"; {stop}best validation at epoch {history.best_eval['epoch']:.0f}: {metrics}"
    print(line, flush=True)


def held_out_metrics(model: RetrievalModel, d: RetrievalData, ks: tuple[int, ...]) -> dict[str, float]:
    """Full ranking over the catalogue, each user's training items excluded (their held-out items kept)."""
    return evaluate(model, RetrievalValidation(*full_ranking(d.train, d.test, _max_history(model))), ks=ks)


# -- sequential data -----------------------------------------------------------------------------
def sequence_data(cfg: RunConfig, max_len: int) -> SequenceData:
    """Sessions or user histories of the declared input, held out by [sequences].protocol."""
    p = cfg.preprocess
    split = p.split_spec() if p.split is not None else None
    spec, paths = _declared(cfg)
    try:
        return sequence_view(spec, paths, cfg.sequences.spec(), max_len, split, p.test_input, p.on_error)
    except FileNotFoundError as e:
        raise ConfigError(f"preprocess.input: {e}") from None


def train_sequential(cfg: RunConfig) -> dict[str, float]:
    """Read, split, train with [train] (early stopping on a validation split cut from the training
    sequences as the test split was from all of them), evaluate on the test queries, save model.pt and
    metrics.json. Under torchrun every rank trains its windows of each batch, the item table row-wise."""
    kind = cfg.model
    assert isinstance(kind, SequenceModelConfig)  # the CLI sends sequential models here
    d = sequence_data(cfg, kind.max_len)
    timed = uses_event_times(kind)
    fit_part, validation = _sequence_validation(cfg, d.train, kind.max_len, timed)
    env = _distributed()
    rank, world = (0, 1) if env is None else (env.rank, env.world_size)
    if rank == 0:
        print(
            f"train: {len(fit_part):,} training sequences, {d.vocab.num_items:,} items, {len(validation.targets):,} validation / "
            f"{len(d.targets):,} test queries ({cfg.sequences.protocol.value}"
            + (f"; {d.unknown_test_items:,} test items unseen in training skipped)" if d.unknown_test_items else ")"),
            flush=True,
        )

    def build() -> nn.Module:
        return build_model(kind, optimizer=cfg.embedding.optimizer, num_items=d.vocab.num_items)

    counts = np.bincount(d.train.items, minlength=d.vocab.num_items + 1)
    try:
        seed_everything(cfg.train.seed or 0)  # every rank builds the same model
        model = build()
        width = window_width(model)  # type: ignore[arg-type]  # SASRec / MaskedTransformer / GRU4Rec
        train = with_reversed(fit_part) if cfg.sequences.augment_reversed else fit_part
        match cfg.sequences.windows:  # the items' windows, and with model.times their timestamps' (the same windows)
            case SequenceWindows.LAST:
                windows, times = last_n(train, width), last_n(train, width, values=train.timestamps) if timed else None
            case SequenceWindows.SLIDING:
                windows, times = sliding_windows(train, width), sliding_windows(train, width, values=train.timestamps) if timed else None
        if env is not None:
            model = _shard(model, ("item",), cfg.sequences.batch_size // world, rank, world)
        batches: EpochBatches[Any] = (
            window_batches(windows, cfg.sequences.batch_size, cfg.train.seed or 0, rank, world)
            if times is None
            else window_batches(windows, cfg.sequences.batch_size, cfg.train.seed or 0, rank, world, times=times)
        )
        fit_counts = np.bincount(fit_part.items, minlength=d.vocab.num_items + 1)
        mask_prob = kind.mask_prob if isinstance(kind, MLMConfig) else MLMConfig.mask_prob
        ranking = (kind.ranking_weight, kind.ranking_negatives) if isinstance(kind, HSTUConfig) else (0.0, HSTUConfig.ranking_negatives)
        family = SequentialFamily(
            sequence_loss(kind), fit_counts, mask_prob, tuple(cfg.sequences.ks), times=timed, ranking_weight=ranking[0], ranking_negatives=ranking[1]
        )
        history = fit(model, batches, validation, cfg.train, family=family)
    finally:
        if env is not None:
            dist.destroy_process_group()
    if rank > 0:
        return {}
    _print_best(history)
    trained = model if env is None else _whole(history, cfg, build)
    seq_model: SequenceModel = trained  # type: ignore[assignment]
    metrics = evaluate(seq_model, NextItemValidation(d.histories, d.targets, d.exclude, d.history_times if timed else None), ks=cfg.sequences.ks)
    metrics["queries"] = float(len(d.targets))
    save_model(cfg.out_dir / "model.pt", trained, kind, cfg.embedding.optimizer, ids=RawIds(d.vocab.raw, counts))
    _write_metrics(cfg, metrics)
    return metrics


def uses_event_times(kind: object) -> bool:
    """Whether [model] asks for the events' timestamps (HSTU's `times = true`): training windows, validation and
    test histories then carry them."""
    return isinstance(kind, HSTUConfig) and kind.times


def _sequence_validation(cfg: RunConfig, train: Sequences, max_len: int, timed: bool = False) -> tuple[Sequences, NextItemValidation]:
    """The training sequences minus the validation split, and the split's queries: leave-last-out takes each
    sequence's last training item; every-prefix takes the latest tenth of the training sequences by time.
    timed: the queries carry their histories' timestamps."""
    s = cfg.sequences
    match s.protocol:
        case SequenceProtocol.LEAVE_LAST_OUT:
            fit_part, targets = sequences_leave_last_out(train)
            times = last_n(fit_part, max_len, values=fit_part.timestamps) if timed else None
            return fit_part, NextItemValidation(last_n(fit_part, max_len), targets, (fit_part.offsets, fit_part.items), times)
        case SequenceProtocol.EVERY_PREFIX:
            # the latest tenth of the training sequences by their last event (at least one)
            ends = np.where(train.lengths > 0, train.timestamps[np.maximum(train.offsets[1:] - 1, 0)], np.iinfo(np.int64).min)
            latest = np.zeros(len(train), dtype=bool)
            latest[np.argsort(ends, kind="stable")[-max(1, len(train) // 10) :]] = True
            fit_part, valid = train.select(~latest), train.select(latest)
            if not len(fit_part):
                raise ConfigError(f"sequences: {len(train)} training sequence(s) are too few to keep a validation split")
            seq, end, targets = prefixes(valid)
            times = last_n(valid, max_len, rows=seq, ends=end, values=valid.timestamps) if timed else None
            return fit_part, NextItemValidation(last_n(valid, max_len, rows=seq, ends=end), targets, None, times)


# -- the model file --------------------------------------------------------------------------------
def save_task_model(
    cfg: RunConfig,
    model: RetrievalModel,
    users_raw: np.ndarray,
    items_raw: np.ndarray,
    item_counts: np.ndarray,
    train_csr: tuple[np.ndarray, np.ndarray],
    train_times: np.ndarray | None = None,
) -> Path:
    """A retrieval model.pt in the library's format (hugerec.training.save_model) with its raw ids and the
    training events' times beside train_csr (the pipeline's interaction store keeps them)."""
    ids = RawIds(items_raw, item_counts, users_raw, train_csr, train_times)
    return save_model(cfg.out_dir / "model.pt", model, cfg.model, cfg.embedding.optimizer, ids=ids)


def load_task_model(cfg: RunConfig, path: Path | None) -> SavedModel:
    """A retrieval or sequential model file (default <train.out_dir>/model.pt); another family is one line."""
    path = path or cfg.out_dir / "model.pt"
    if not path.is_file():
        raise ConfigError(f"no model at {path}; run `hugerec train` first (or check train.out_dir)")
    saved = load_model(path)
    if saved.family not in (Family.RETRIEVAL, Family.SEQUENTIAL):
        raise ConfigError(f"{path}: holds a {saved.model_type!r} model ({saved.family.value}), not a retrieval or sequential one")
    return saved


def _users(saved: SavedModel) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """A retrieval model file's raw user ids [U] and each user's training items (CSR)."""
    ids = saved.ids
    assert ids is not None and ids.users is not None and ids.train_csr is not None  # save_model's retrieval checks
    return ids.users, ids.train_csr


def _write_metrics(cfg: RunConfig, metrics: dict[str, float]) -> None:
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")


# -- evaluate ------------------------------------------------------------------------------------
def evaluate_task(cfg: RunConfig, model_path: Path | None) -> dict[str, float]:
    """The held-out metrics of a trained model on the config's data, split as in training."""
    saved = load_task_model(cfg, model_path)
    if saved.model_type != cfg.model_type:
        raise ConfigError(f"{saved.path} holds a {saved.model_type!r} model, the config's model.type is {cfg.model_type!r}")
    if saved.family is Family.RETRIEVAL:
        d = retrieval_data(cfg)
        users_raw = _users(saved)[0]
        if not (np.array_equal(d.users_raw, users_raw) and np.array_equal(d.items_raw, saved.items_raw)):
            raise ConfigError(
                f"the declared input gives {len(d.users_raw):,} users / {len(d.items_raw):,} items, not the {len(users_raw):,} / "
                f"{len(saved.items_raw):,} {saved.path} was trained on: evaluate with the training config"
            )
        return held_out_metrics(saved.model, d, cfg.interactions.ks)  # type: ignore[arg-type]  # a retrieval model
    seq_model: SequenceModel = saved.model  # type: ignore[assignment]
    d2 = sequence_data(cfg, seq_model.cfg.max_len)
    if not np.array_equal(d2.vocab.raw, saved.items_raw):
        raise ConfigError(
            f"the declared input gives {d2.vocab.num_items:,} items, not the {len(saved.items_raw):,} {saved.path} was trained on: "
            "evaluate with the training config"
        )
    times = d2.history_times if uses_event_times(saved.config) else None
    metrics = evaluate(seq_model, NextItemValidation(d2.histories, d2.targets, d2.exclude, times), ks=cfg.sequences.ks)
    metrics["queries"] = float(len(d2.targets))
    return metrics


# -- index ---------------------------------------------------------------------------------------
def index_dir(cfg: RunConfig, out: Path | None = None) -> Path:
    return out or (Path(cfg.index.out) if cfg.index.out else cfg.out_dir / "index")


def build_item_index(cfg: RunConfig, model_path: Path | None, out: Path | None) -> tuple[Path, int, int]:
    """The index over every item vector of the model -> (folder, items, dim). Ids in the index are dense ids."""
    from hugerec.index.vector_index import build_index

    saved = load_task_model(cfg, model_path)
    vectors, ids = _item_vectors(saved)
    folder = index_dir(cfg, out)
    if folder.exists() and not (folder / "index.json").is_file() and any(folder.iterdir()):
        raise ConfigError(f"index.out: {folder} exists and is not an index folder; give an empty or new folder")
    build_index(vectors, ids, cfg.index.index_config()).save(folder)
    return folder, vectors.shape[0], vectors.shape[1]


def _item_vectors(saved: SavedModel) -> tuple[torch.Tensor, torch.Tensor]:
    if saved.family is Family.RETRIEVAL:
        v = all_item_vectors(saved.model)  # type: ignore[arg-type]
        return v, torch.arange(v.shape[0])
    v = sequence_item_vectors(saved.model).float()  # type: ignore[arg-type]
    return v, torch.arange(1, v.shape[0] + 1)


# -- export --------------------------------------------------------------------------------------


# -- recommend -----------------------------------------------------------------------------------
def _ints(text: str, where: str) -> list[int]:
    out = []
    for part in text.replace(",", " ").split():
        try:
            out.append(int(part))
        except ValueError:
            raise ConfigError(f"{where}: {part!r} is not an integer id") from None
    return out


def _read_lines(path: str, where: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{where}: no file at {p}")
    return p.read_text().splitlines()


def recommend_to_parquet(cfg: RunConfig, model_path: Path | None) -> tuple[Path, int, list[str]]:
    """Top-k per user (retrieval) or per history (sequential) -> Parquet; returns (file, rows, notes for stderr)."""
    saved = load_task_model(cfg, model_path)
    r = cfg.recommend
    num_items = len(saved.items_raw)
    if r.k > num_items:
        raise ConfigError(f"recommend.k = {r.k} is larger than the catalogue ({num_items:,} items)")
    index = None
    if r.use_index:
        folder = index_dir(cfg)
        try:
            index = load_index(folder)
        except (ValueError, OSError) as e:
            raise ConfigError(f"recommend.use_index: {e}; build it with `hugerec index`") from None
        dim = _item_vectors(saved)[0].shape[1]
        if index.dim != dim or len(index) != num_items:
            raise ConfigError(
                f"index {folder} holds {len(index):,} vectors of dim {index.dim}, the model {saved.path} has {num_items:,} items "
                f"of dim {dim}: rebuild it with `hugerec index`"
            )
    retrieval = saved.family is Family.RETRIEVAL
    table, notes = _recommend_retrieval(saved, cfg, index) if retrieval else _recommend_sequential(saved, cfg, index)
    out = Path(r.out) if r.out else cfg.out_dir / "recommendations.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)
    return out, table.num_rows, notes


def _top(
    queries: torch.Tensor, vectors: torch.Tensor, k: int, exclude: list[np.ndarray], index: Any, first_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k dense ids [Q, k] (-1 where fewer remain) and scores of queries [Q, D] over vectors (ids first_id..),
    leaving out each query's `exclude` ids; exact blocked scoring, or the index asked for k + |exclude| items."""
    from hugerec.index.topk import top_k

    q = len(exclude)
    lengths = np.array([len(e) for e in exclude], dtype=np.int64)
    if index is None:
        csr = (np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), np.concatenate([*exclude, np.empty(0, np.int64)]) - first_id)
        scores, pos = top_k(lambda u0, u1, i0, i1: queries[u0:u1] @ vectors[i0:i1].T, q, vectors.shape[0], k, csr)
        ids = pos.numpy().astype(np.int64)
        return np.where(ids >= 0, ids + first_id, -1), scores.numpy()
    want = min(k + int(lengths.max(initial=0)), len(index))
    scores, ids = index.query(queries, want)
    ids_np, s_np = ids.numpy().astype(np.int64), scores.numpy()
    out_ids, out_s = np.full((q, k), -1, dtype=np.int64), np.zeros((q, k), dtype=np.float32)
    for i in range(q):  # one vectorised mask per query (a handful of queries per call)
        keep = ~np.isin(ids_np[i], exclude[i]) & (ids_np[i] >= 0)
        got = ids_np[i][keep][:k]
        out_ids[i, : len(got)], out_s[i, : len(got)] = got, s_np[i][keep][:k]
    return out_ids, out_s


def _rows(keys: np.ndarray, key_name: str, ids: np.ndarray, scores: np.ndarray, items_raw: np.ndarray, source: np.ndarray) -> pa.Table:
    """[Q, k] dense ids (-1: none) -> long table: key, rank (1-based), item (raw id), score, source."""
    q, k = ids.shape
    valid = ids >= 0
    rank = np.broadcast_to(np.arange(1, k + 1), (q, k))[valid]
    return pa.table(
        {
            key_name: np.repeat(keys, valid.sum(axis=1)),
            "rank": rank.astype(np.int32),
            "item": items_raw[ids[valid]],
            "score": scores[valid].astype(np.float32),
            "source": np.repeat(source, valid.sum(axis=1)),
        }
    )


def _recommend_retrieval(saved: SavedModel, cfg: RunConfig, index: Any) -> tuple[pa.Table, list[str]]:
    r = cfg.recommend
    users = list(r.users) + (_ints(" ".join(_read_lines(r.users_file, "recommend.users_file")), "recommend.users_file") if r.users_file else [])
    if not users:
        raise ConfigError("recommend: no users given; pass --users 1,2,3 or set recommend.users / recommend.users_file")
    users_raw, (offsets, items) = _users(saved)
    model: RetrievalModel = saved.model  # type: ignore[assignment]
    raw = np.asarray(users, dtype=np.int64)
    pos = np.clip(np.searchsorted(users_raw, raw), 0, len(users_raw) - 1)
    known = users_raw[pos] == raw
    dense = np.where(known, pos, -1).astype(np.int64)
    seen = [items[offsets[u] : offsets[u + 1]] if u >= 0 and r.exclude_seen else np.empty(0, np.int64) for u in dense]
    notes = []
    n_cold = int((~known).sum())
    if n_cold:
        shown = ", ".join(map(str, raw[~known][:5])) + (" ..." if n_cold > 5 else "")
        notes.append(f"{n_cold} of {len(raw)} users unknown to the model ({shown}) got the most popular items (source = popularity)")
    if index is None:
        hist = last_items(offsets, items, np.where(known, dense, 0), _max_history(model))
        lengths = torch.where(torch.from_numpy(known), hist.lengths, torch.zeros_like(hist.lengths))
        keep_vals = torch.repeat_interleave(torch.from_numpy(known), hist.lengths.to(torch.int64))
        hist = JaggedTensor(hist.values[keep_vals], lengths)
        csr_lengths = np.array([len(s) for s in seen], dtype=np.int64)
        csr = (np.concatenate([[0], np.cumsum(csr_lengths)]).astype(np.int64), np.concatenate([*seen, np.empty(0, np.int64)]))
        recs = recommend(model, torch.from_numpy(dense), hist, r.k, exclude=csr, item_counts=saved.item_counts)
        ids, scores = recs.items.numpy().astype(np.int64), recs.scores.numpy()
    else:
        ids = np.full((len(raw), r.k), -1, dtype=np.int64)
        scores = np.zeros((len(raw), r.k), dtype=np.float32)
        warm = np.flatnonzero(known)
        if len(warm):
            hist = last_items(offsets, items, dense[warm], _max_history(model))
            q = user_vectors(model, torch.from_numpy(dense[warm]), hist)
            ids[warm], scores[warm] = _top(q, torch.empty(0), r.k, [seen[i] for i in warm], index, 0)
        cold = np.flatnonzero(~known)
        if len(cold):
            order = np.argsort(-saved.item_counts, kind="stable")[: r.k]
            ids[cold], scores[cold] = order, saved.item_counts[order].astype(np.float32)
    short = int(((ids < 0).any(axis=1)).sum())
    if short:
        notes.append(f"{short} users have fewer than k = {r.k} items left after excluding their training items")
    source = np.where(known, "model", "popularity")
    return _rows(raw, "user", ids, scores, saved.items_raw, source), notes


def _recommend_sequential(saved: SavedModel, cfg: RunConfig, index: Any) -> tuple[pa.Table, list[str]]:
    r = cfg.recommend
    raw_histories: list[list[int]] = [list(r.history)] if r.history else []
    if r.history_file:
        lines = _read_lines(r.history_file, "recommend.history_file")
        raw_histories += [_ints(line, f"{r.history_file}: line {n + 1}") for n, line in enumerate(lines) if line.strip()]
    if not raw_histories:
        raise ConfigError("recommend: no history given; pass --history 1,2,3 or set recommend.history / recommend.history_file")
    raw_times = _history_times(saved, r, raw_histories)
    model: SequenceModel = saved.model  # type: ignore[assignment]
    vocab = ItemVocabulary(saved.items_raw)
    max_len = model.cfg.max_len
    dense = [vocab.lookup(np.asarray(h, dtype=np.int64)) for h in raw_histories]
    unknown = np.array([int((d == PAD).sum()) for d in dense])
    times = [t[d != PAD] for d, t in zip(dense, raw_times, strict=True)]  # each kept item keeps its own time
    dense = [d[d != PAD] for d in dense]
    empty = np.array([len(d) == 0 for d in dense])
    seqs = [Sequences(np.zeros(1), np.array([0, len(d)]), d, t) for d, t in zip(dense, times, strict=True)]
    padded = np.stack([last_n(s, max_len)[0] for s in seqs])
    padded_times = np.stack([last_n(s, max_len, values=s.timestamps)[0] for s in seqs]) if uses_event_times(saved.config) else None
    seen = [np.unique(d) if r.exclude_seen else np.empty(0, np.int64) for d in dense]
    notes = []
    if unknown.sum():
        notes.append(f"{int(unknown.sum())} unknown item(s) skipped in {int((unknown > 0).sum())} of {len(dense)} histories (column unknown_items)")
    if empty.any():
        notes.append(f"{int(empty.sum())} histories have no item the model knows and got the most popular items (source = popularity)")
    ids = np.full((len(dense), r.k), -1, dtype=np.int64)
    scores = np.zeros((len(dense), r.k), dtype=np.float32)
    warm = np.flatnonzero(~empty)
    if len(warm):
        q = query_vectors(model, torch.from_numpy(padded[warm]), times=None if padded_times is None else padded_times[warm]).float()
        vectors = sequence_item_vectors(model).float() if index is None else torch.empty(0)
        ids[warm], scores[warm] = _top(q, vectors, r.k, [seen[i] for i in warm], index, 1)
    cold = np.flatnonzero(empty)
    if len(cold):
        counts = saved.item_counts[1:]
        order = np.argsort(-counts, kind="stable")[: r.k]
        ids[cold], scores[cold] = order + 1, counts[order].astype(np.float32)
    # sequential dense id i is items_raw[i - 1]: shift so _rows can index items_raw directly
    shifted = np.where(ids >= 0, ids - 1, -1)
    table = _rows(np.arange(len(dense)), "history", shifted, scores, saved.items_raw, np.where(empty, "popularity", "model"))
    per_row = np.repeat(unknown, (shifted >= 0).sum(axis=1))
    return table.append_column("unknown_items", pa.array(per_row.astype(np.int32))), notes


def _history_times(saved: SavedModel, r: RecommendSection, histories: list[list[int]]) -> list[np.ndarray]:
    """Each history's item times (int64 seconds): recommend.history_times for a model trained with times
    (HSTU, model.times = true), zeros (never read) for any other; ConfigError naming the key otherwise."""
    if not uses_event_times(saved.config):
        if r.history_times:
            raise ConfigError(f"recommend.history_times: {saved.path} was trained without timestamps (model.times = false) and takes none")
        return [np.zeros(len(h), np.int64) for h in histories]
    if r.history_file:
        raise ConfigError(
            f"recommend.history_file: {saved.path} is an HSTU trained with model.times = true, which needs each item's time and "
            "a history file carries none; give recommend.history with recommend.history_times (--history ... --history-times ...)"
        )
    if len(r.history_times) != len(r.history):
        raise ConfigError(
            f"recommend.history_times: {saved.path} is an HSTU trained with model.times = true; give one time in seconds per "
            f"recommend.history item ({len(r.history)} items, {len(r.history_times)} times; --history-times t1,t2,...)"
        )
    return [np.asarray(r.history_times, dtype=np.int64)]


def warn(notes: list[str], command: str) -> None:
    for n in notes:
        print(f"hugerec {command}: note: {n}", file=sys.stderr)
