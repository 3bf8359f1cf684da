"""The ranking stage of `hugerec up`: labelled rows from an implicit log, a ranking model trained on them by
`hugerec train`, its bundle in the pipeline's Score stage (retrieve -> rank).

By default (ranker.enabled = "auto") the stage is built only for a log with a 0/1 label column; for an
implicit log it is built on request (`hugerec up --ranker`). An implicit log (user, item, time) has no
labels: every observed interaction of the retriever's training
part is a positive (label 1), and each positive gets `negatives` sampled items (label 0) of the same user
at the same time, never an item the user has interacted with in that part:

    hard      a `hard_fraction` of them drawn uniformly from the user's top `hard_pool` unseen items by
              the trained retriever (the candidates the ranker will reorder)
    catalogue the rest drawn from the whole catalogue with probability proportional to
              (training events of the item) ** popularity_power (0: uniform; 1: as popular as the item)

A BCE model trained on positives against negatives drawn from q(item | user) scores log p(item | user) -
log q(item | user) + const; uniform q (within the retriever's candidates, or over the catalogue) leaves
the order of p, which is what the Score stage needs, while popularity-weighted q (power 1) demotes
popular items. Hence power 0 by default. A log with a label column (0/1 values, e.g. clicks on shown
items) is labelled already: its rows are the ranker's rows and nothing is sampled.

The rows (raw user and item ids, time, label) go to OUT/ranker/rows.parquet; OUT/ranker.toml is a
ranking config over them (`hugerec preprocess` + `hugerec train`: Categorify on the ids, a DCN-v2 with
the widths and embedding dims fitted to the data, early stopping on the latest `valid_fraction` of the
rows by time). The Score stage looks the ranker's ids up through the pipeline's feature tables: OUT/ranker/
users.csv and items.csv map each raw id to its Categorify code (0, the unknown code, for users the
feature table does not hold), and pipeline.toml's [score] reads them as user.ranker_user / item.ranker_item.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugerec.cli.config_file import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from hugerec.cli.run_config import RunConfig

CODE_LIMIT = 2**24  # the feature store holds float32: integer codes are exact below 2 ** 24


@dataclass(frozen=True)
class RankerSection:
    """[ranker] of OUT/up.toml: whether `hugerec up` adds a ranking stage, and how it labels an implicit log.

    enabled           "auto": a ranker when the log has a 0/1 label column (its labels teach what the
                      retriever's interactions do not), none for an implicit log (user, item, time), where
                      a ranker on interactions + sampled negatives ranked the retriever's candidates worse
                      than the retriever's own order on the validation split (benchmarks/README.md);
                      true (or `hugerec up --ranker`): a ranker in either case; false (or `--no-ranker`):
                      none, the pipeline ranks by the retriever alone
    positives         "all": every interaction of the training part; "held_out": only those the
                      retriever held out for its early stopping (each user's last training events),
                      which its vectors never fit, so that the ranker sees them as at serving time
                      (on the ones it was trained on the retriever's scores are inflated), but one
                      positive per user
    negatives         sampled items (label 0) per observed interaction (label 1): the label ratio is 1 : negatives
    hard_fraction     the share of the negatives drawn from the retriever's top candidates of the user
    hard_pool         those candidates: the retriever's top this many items the user has not interacted with
    popularity_power  the other negatives are drawn with probability (item's training events) ** this
                      (0: uniform over the catalogue; 1: popularity-weighted, which teaches the ranker to
                      demote popular items)
    max_rows          at most this many labelled rows: positives are subsampled (seeded) beyond
                      max_rows / (1 + negatives), which bounds the ranker's training time (and with
                      `epochs`, the minutes `hugerec up` takes: benchmarks/README.md)
    vectors           the ranker also reads the retriever's user and item vectors (dense features u0..,
                      i0.., scaled to unit mean square; its cross layers can form their dot product),
                      beside the user and item ids; false: the ids alone (2 x the retriever's dim fewer
                      inputs per scored candidate, but all the ranker knows is then what its own
                      embeddings learn from max_rows rows)
    epochs            the ranker's epochs (an upper bound: early stopping on the validation split ends it)
    valid_fraction    the latest share of the labelled rows by time: the ranker's validation split
    seed              the sampler's seed
    """

    enabled: bool | str = "auto"
    positives: str = "all"
    negatives: int = 4
    hard_fraction: float = 0.5
    hard_pool: int = 50
    popularity_power: float = 0.0
    max_rows: int = 30_000
    epochs: int = 2
    vectors: bool = True
    valid_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool) and self.enabled != "auto":
            raise ValueError(f'ranker.enabled must be true, false or "auto", got {self.enabled!r}')
        if not isinstance(self.vectors, bool):
            raise ValueError(f"ranker.vectors must be true or false, got {self.vectors!r}")
        if self.positives not in ("held_out", "all"):
            raise ValueError(f'ranker.positives must be "held_out" or "all", got {self.positives!r}')
        if not 1 <= self.negatives <= 100:
            raise ValueError(f"ranker.negatives must be in 1..100, got {self.negatives}")
        if not 0.0 <= self.hard_fraction <= 1.0:
            raise ValueError(f"ranker.hard_fraction must be in [0, 1], got {self.hard_fraction}")
        if self.hard_pool < 1:
            raise ValueError(f"ranker.hard_pool must be >= 1, got {self.hard_pool}")
        if not 0.0 <= self.popularity_power <= 2.0:
            raise ValueError(f"ranker.popularity_power must be in [0, 2], got {self.popularity_power}")
        if self.max_rows < 1000:
            raise ValueError(f"ranker.max_rows must be >= 1000, got {self.max_rows}")
        if not 1 <= self.epochs <= 100:
            raise ValueError(f"ranker.epochs must be in 1..100, got {self.epochs}")
        if not 0.0 < self.valid_fraction < 0.5:
            raise ValueError(f"ranker.valid_fraction must be in (0, 0.5), got {self.valid_fraction}")

    def trains(self, labelled: bool) -> bool:
        """Whether `hugerec up` builds the ranker for a log with (labelled) or without a 0/1 label column."""
        return labelled if self.enabled == "auto" else bool(self.enabled)

    @property
    def hard(self) -> int:
        """Hard negatives per positive (the rest are drawn from the catalogue)."""
        return round(self.negatives * self.hard_fraction)


UP_TOML = """\
# Written by `hugerec up`: what it builds beside the configs of `hugerec train` and `hugerec pipeline build`.
# `hugerec up {retriever}` reads it (overrides: ranker.KEY=VALUE); --ranker is ranker.enabled = true,
# --no-ranker ranker.enabled = false.
#
# [ranker]: the ranking stage. enabled = "auto" builds it when the log has a 0/1 label column and leaves
# it out for an implicit log (there a ranker on sampled negatives ranked worse than the retriever alone
# on the validation split). On an implicit log (enabled = true) each interaction of the retriever's training part is a
# positive (label 1) with `negatives` sampled items (label 0) of the same user, never one the user has
# interacted with: a hard_fraction from the user's top hard_pool unseen items by the retriever, the rest
# drawn from the catalogue with probability (item's training events) ** popularity_power. A log with a
# label column is labelled already: nothing is sampled. The ranker itself is ranker.toml.

[ranker]
{body}
"""


def up_toml(section: RankerSection, retriever: Path) -> str:
    body = "\n".join(f"{f.name} = {json.dumps(getattr(section, f.name))}" for f in fields(section))
    return UP_TOML.format(retriever=retriever, body=body)


def read_up_toml(path: Path | None, overrides: list[str]) -> RankerSection:
    """[ranker] of `path` (None or absent: the defaults) with ranker.KEY=VALUE overrides applied."""
    from hugerec.cli.config_file import apply_overrides, from_dict, read_toml

    data: dict[str, Any] = read_toml(path) if path is not None and path.is_file() else {}
    unknown = sorted(set(data) - {"ranker"})
    if unknown:
        raise ConfigError(f"{path}: unknown section [{unknown[0]}]; up.toml has [ranker]")
    data = apply_overrides(data, overrides)
    section: RankerSection = from_dict(RankerSection, data.get("ranker", {}), "ranker", {})
    return section


# -- labelled rows ----------------------------------------------------------------------------------------
def _seen_keys(offsets: np.ndarray, items: np.ndarray, num_items: int) -> np.ndarray:
    """Sorted user * I + item keys of every (user, item) of the CSR histories: membership by searchsorted."""
    import numpy as np

    users = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    return np.unique(users * num_items + items.astype(np.int64))


def is_seen(seen: np.ndarray, users: np.ndarray, items: np.ndarray, num_items: int) -> np.ndarray:
    """[N] bool: (users[n], items[n]) is among the sorted `seen` keys."""
    import numpy as np

    keys = users.astype(np.int64) * num_items + items.astype(np.int64)
    at = np.minimum(np.searchsorted(seen, keys), max(len(seen) - 1, 0))
    return seen[at] == keys if len(seen) else np.zeros(len(keys), bool)


def hard_pools(user_vectors: np.ndarray, item_vectors: np.ndarray, offsets: np.ndarray, items: np.ndarray, pool: int) -> np.ndarray:
    """[U, P] each user's top P items by the retriever's score that the user has not interacted with
    (P = min(pool, I - the most items any user has seen); -1 pads a user who has seen nearly everything)."""
    import numpy as np
    import torch

    num_users, num_items = user_vectors.shape[0], item_vectors.shape[0]
    p = max(1, min(pool, num_items))
    out = np.full((num_users, p), -1, np.int64)
    block = max(1, 2**24 // max(num_items, 1))  # users per block: [block, I] float32 scores of at most 64 MiB
    iv = torch.from_numpy(item_vectors)
    for lo in range(0, num_users, block):
        hi = min(num_users, lo + block)
        scores = torch.from_numpy(user_vectors[lo:hi]) @ iv.T  # [b, D] x [D, I] -> [b, I]
        rows = np.repeat(np.arange(hi - lo), np.diff(offsets[lo : hi + 1]))
        scores[torch.from_numpy(rows), torch.from_numpy(items[offsets[lo] : offsets[hi]].astype(np.int64))] = -math.inf
        top = torch.topk(scores, p, dim=1)
        idx = top.indices.numpy()
        out[lo:hi] = np.where(np.isfinite(top.values.numpy()), idx, -1)
    return out


def sample_rows(
    users: np.ndarray,
    items: np.ndarray,
    times: np.ndarray,
    offsets: np.ndarray,
    history: np.ndarray,
    item_counts: np.ndarray,
    pools: np.ndarray,
    section: RankerSection,
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Labelled rows from positives (users, items, times: dense ids, one row per interaction) of the
    training part whose per-user items are the CSR (offsets, history): each positive with
    section.negatives sampled items (hard from `pools` [U, P], the rest from the catalogue by
    item_counts ** popularity_power), none of them in the user's history. Returns the columns (user,
    item, timestamp, label; positives first) and counts of what was done."""
    import numpy as np

    rng = np.random.default_rng(section.seed)
    num_items = len(item_counts)
    keep_positives = section.max_rows // (1 + section.negatives)
    subsampled = 0
    if len(users) > keep_positives:
        pick = np.sort(rng.choice(len(users), keep_positives, replace=False))
        subsampled = len(users) - keep_positives
        users, items, times = users[pick], items[pick], times[pick]
    seen = _seen_keys(offsets, history, num_items)
    n, hard = len(users), section.hard
    # hard: a uniform draw from the user's pool (padded with -1 past the unseen items it has)
    valid = (pools >= 0).sum(axis=1)  # [U] usable pool entries
    neg_users = np.repeat(users, section.negatives)  # [n * negatives]: positive j's negatives are rows j*neg .. j*neg + neg - 1
    neg_items = np.full(n * section.negatives, -1, np.int64)
    slot = np.tile(np.arange(section.negatives), n)
    is_hard = slot < hard
    hu = neg_users[is_hard]
    has_pool = valid[hu] > 0
    pick_at = (rng.random(len(hu)) * np.maximum(valid[hu], 1)).astype(np.int64)
    from_pool = np.flatnonzero(is_hard)[has_pool]
    neg_items[from_pool] = pools[hu[has_pool], pick_at[has_pool]]
    # catalogue: by popularity ** power, redrawn while the draw is an item the user has seen
    weights = np.maximum(item_counts.astype(np.float64), 0.0) ** section.popularity_power if section.popularity_power else np.ones(num_items)
    if weights.sum() <= 0:
        weights = np.ones(num_items)
    cdf = np.cumsum(weights / weights.sum())
    todo = np.flatnonzero(neg_items < 0)  # the catalogue's share, and hard ones whose user had no pool
    for _ in range(20):
        if not len(todo):
            break
        draw = np.minimum(np.searchsorted(cdf, rng.random(len(todo)), side="right"), num_items - 1)
        bad = is_seen(seen, neg_users[todo], draw, num_items)
        neg_items[todo[~bad]] = draw[~bad]
        todo = todo[bad]
    dropped = len(todo)  # users who have seen (nearly) every item: no unseen item found for these
    keep = neg_items >= 0
    columns = {
        "user": np.concatenate([users, neg_users[keep]]).astype(np.int64),
        "item": np.concatenate([items, neg_items[keep]]).astype(np.int64),
        "timestamp": np.concatenate([times, np.repeat(times, section.negatives)[keep]]).astype(np.int64),
        "label": np.concatenate([np.ones(n, np.int64), np.zeros(int(keep.sum()), np.int64)]),
    }
    counts = {"positives": n, "negatives": int(keep.sum()), "hard": len(from_pool), "subsampled": subsampled, "dropped": dropped}
    counts["catalogue"] = counts["negatives"] - counts["hard"]
    return columns, counts


# -- the ranker's config ------------------------------------------------------------------------------------
RANKER = """\
# Written by `hugerec up`: the ranking stage over labelled rows of the log (OUT/ranker/rows.parquet, see
# up.toml [ranker] for how they were labelled). By hand:
#   hugerec preprocess {self}
#   hugerec train {self}
#   hugerec export {self}
# The widths, embedding dims and batch size are fitted to the data by `hugerec train` (set them to choose).

[preprocess]
input = {rows}
format = "parquet"
columns = [
  {{ name = "user", type = "int", role = "categorical" }},
  {{ name = "item", type = "int", role = "categorical" }},
  {{ name = "timestamp", type = "timestamp", role = "timestamp", format = "unix" }},
  {{ name = "label", type = "int", role = "label" }},{dense}
]
# ids to codes; the dense columns (the retriever's vectors, when there are) stay as they are: the
# pipeline's feature tables (ranker/users.csv, items.csv) hold the same values for the Score stage
ops = [{{ op = "Categorify", columns = ["user", "item"] }}]
split = "time"                 # the latest rows are the validation split (early stopping)
time_cutoff = {cutoff}
out = {data}

[data]
train = {train}
eval = {eval}

[model]
type = "dcn_v2"
deep = [256, 128]              # narrow: it trains within `hugerec up`'s minutes on 2 cores

[train]
epochs = {epochs}                     # an upper bound: early stopping keeps the best evaluation
lr = 0.003
seed = 0
early_stopping = {{ metric = "auc", patience = 1 }}
out_dir = {out_dir}
"""


def _q(text: str) -> str:
    return json.dumps(text)


def ranker_toml(path: Path, folder: Path, cutoff: int, epochs: int, dense: tuple[str, ...] = ()) -> str:
    data = folder / "data"
    columns = "".join(f'\n  {{ name = "{name}", type = "float", role = "dense" }},' for name in dense)
    return RANKER.format(
        self=path,
        dense=columns,
        rows=_q(str((folder / "rows.parquet").resolve())),
        cutoff=cutoff,
        data=_q(str(data.resolve())),
        train=_q(str((data / "train").resolve())),
        eval=_q(str((data / "eval").resolve())),
        epochs=epochs,
        out_dir=_q(str(folder.resolve())),
    )


def time_cutoff(times: np.ndarray, valid_fraction: float) -> int:
    """The time at or after which the latest valid_fraction of the rows lie (at least one row each side)."""
    import numpy as np

    order = np.sort(times)
    at = min(max(1, int(len(order) * (1.0 - valid_fraction))), len(order) - 1)
    cut = int(order[at])
    if cut <= int(order[0]):  # every row at one time: the split would be empty
        raise ConfigError(f"the ranker's validation split by time needs rows at two or more times; every row is at {cut}")
    return cut


# -- the whole stage --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RankerResult:
    bundle: Path  # the ranker's model bundle (`hugerec export`)
    users: Path  # raw user id -> ranker code (the pipeline's user_features)
    items: Path  # raw item id -> ranker code (the pipeline's item_features)
    dense: tuple[str, ...]  # the Score stage's dense inputs, in the ranker's order ("user.u0", ...)
    summary: str


def build_ranker(retriever: RunConfig, model_path: Path, out: Path, section: RankerSection, label: str | None) -> RankerResult:
    """Labelled rows (sampled, or the log's own labels when `label` names its label column), OUT/ranker.toml,
    `hugerec preprocess` + `hugerec train` on it, `hugerec export`, the id-code tables for the pipeline."""
    import numpy as np
    import polars as pl

    from hugerec.cli import commands
    from hugerec.cli.run_config import load_run_config
    from hugerec.cli.task_commands import retrieval_data
    from hugerec.data.interactions import histories
    from hugerec.training.model_file import load_model

    t0 = time.perf_counter()
    folder = out / "ranker"
    folder.mkdir(parents=True, exist_ok=True)
    d = retrieval_data(retriever)
    saved = load_model(model_path)
    ids = saved.ids
    assert ids is not None and ids.users is not None
    if not (np.array_equal(ids.users, d.users_raw) and np.array_equal(ids.items, d.items_raw)):
        raise ConfigError(f"{model_path} was trained on other data than {retriever.preprocess.input}; run `hugerec up` again to retrain it")
    offsets, history = histories(d.train)
    user_vectors, item_vectors = retriever_vectors(saved.model, offsets, history)
    if label is None:
        frame = d.train.frame if section.positives == "all" else d.validation_split()[1].frame
        pools = hard_pools(user_vectors, item_vectors, offsets, history, section.hard_pool) if section.hard else np.full((d.data.num_users, 1), -1, np.int64)
        columns, counts = sample_rows(
            frame["user"].to_numpy(), frame["item"].to_numpy(), frame["timestamp"].to_numpy(),
            offsets, history, d.train.item_counts(), pools, section,
        )  # fmt: skip
        dense_users, dense_items = columns["user"], columns["item"]
        columns["user"] = d.users_raw[columns["user"]]
        columns["item"] = d.items_raw[columns["item"]]
        how = (
            f"{counts['positives']:,} interactions ({section.positives}; label 1) + {counts['negatives']:,} sampled (label 0: {counts['hard']:,} "
            f"from the retriever's top {section.hard_pool}, {counts['catalogue']:,} from the catalogue; 1 : {section.negatives})"
        )
        if counts["subsampled"]:
            how += f"; {counts['subsampled']:,} interactions left out (ranker.max_rows = {section.max_rows:,})"
        if counts["dropped"]:
            how += f"; {counts['dropped']:,} negatives not drawn (users who have seen nearly every item)"
    else:
        columns = _labelled(retriever, label, d, section)
        dense_users, dense_items = _dense_ids(d.users_raw, columns["user"]), _dense_ids(d.items_raw, columns["item"])
        positives = int(columns["label"].sum())
        how = f"the log's labels ({label}): {positives:,} label 1, {len(columns['label']) - positives:,} label 0"
    dense: tuple[str, ...] = ()
    user_table: dict[str, np.ndarray] = {}
    item_table: dict[str, np.ndarray] = {}
    if section.vectors:  # unit mean square per tower; rows of ids the retriever does not know (-1) are zeros
        uv = user_vectors / max(float(np.sqrt(np.mean(user_vectors**2))), 1e-12)
        iv = item_vectors / max(float(np.sqrt(np.mean(item_vectors**2))), 1e-12)
        for prefix, vectors, at, table in (("u", uv, dense_users, user_table), ("i", iv, dense_items, item_table)):
            for j in range(vectors.shape[1]):
                table[f"{prefix}{j}"] = vectors[:, j].astype(np.float32)
                columns[f"{prefix}{j}"] = np.where(at >= 0, vectors[np.maximum(at, 0), j], 0.0).astype(np.float32)
        dense = (*user_table, *item_table)
    rows = pl.DataFrame(columns)
    rows.write_parquet(folder / "rows.parquet")
    cutoff = time_cutoff(columns["timestamp"], section.valid_fraction)
    config = out / "ranker.toml"
    config.write_text(ranker_toml(config, folder, cutoff, section.epochs, dense))
    print(f"      labelled rows: {how} -> {folder / 'rows.parquet'} ({time.perf_counter() - t0:.1f} s)", flush=True)
    cfg = load_run_config(config)
    report = commands.preprocess(cfg)
    print(f"      preprocess: {report}", flush=True)
    history_ = commands.train(cfg)
    best = history_.best_eval
    shown = "" if best is None else f"; best validation AUC {best.get('auc', float('nan')):.4f} (step {int(best.get('step', 0))})"
    bundle = commands.export_model(cfg, out=folder / "bundle")
    users_csv, items_csv = _code_tables(cfg, folder, d.users_raw, d.items_raw, user_table, item_table)
    refs = tuple(f"{'user' if name.startswith('u') else 'item'}.{name}" for name in dense)
    return RankerResult(bundle, users_csv, items_csv, refs, f"ranker {cfg.model_type} -> {bundle}{shown} ({time.perf_counter() - t0:.1f} s)")


def _dense_ids(raw: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Raw ids -> the retriever's dense ids (-1 for an id it does not know)."""
    import numpy as np

    order = np.argsort(raw, kind="stable")
    pos = np.minimum(np.searchsorted(raw, ids, sorter=order), len(raw) - 1)
    dense = order[pos]
    return np.where(raw[dense] == ids, dense, -1)


def retriever_vectors(model: Any, offsets: np.ndarray, history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The retriever's vectors: every user's from its training history ([U, D]) and every item's ([I, D])."""
    import numpy as np
    import torch

    from hugerec.data.interactions import last_items
    from hugerec.models.two_tower import TwoTower

    num_users = len(offsets) - 1
    users = np.arange(num_users, dtype=np.int64)
    max_history = model.config.max_history if isinstance(model, TwoTower) else 0
    with torch.inference_mode():
        vectors = [
            model.user_vectors(torch.from_numpy(users[lo : lo + 8192]), last_items(offsets, history, users[lo : lo + 8192], max_history)).float().numpy()
            for lo in range(0, num_users, 8192)
        ]
        items = torch.cat(
            [model.item_vectors(torch.arange(i, min(i + 65536, model.num_items))) for i in range(0, model.num_items, 65536)]
        ).float().numpy()
    return np.concatenate(vectors), items


def _labelled(retriever: RunConfig, label: str, d: Any, section: RankerSection) -> dict[str, np.ndarray]:
    """The log's own rows with its 0/1 label, less each user's held-out events (the retriever's test part:
    a (user, item, time) of d.test), subsampled (seeded) to ranker.max_rows."""
    import polars as pl

    from hugerec.cli.commands import input_spec
    from hugerec.data.prepare import read_rows

    spec = input_spec(retriever)
    names = {c.role_value: c.name for c in spec.columns}
    rows, _ = read_rows(spec, retriever.preprocess.input, "preprocess.input", retriever.preprocess.on_error)
    values = rows[label].cast(pl.Float64)
    bad = values.is_null() | ~values.is_in([0.0, 1.0])
    if bad.any():
        row = int(bad.arg_max() or 0)
        raise ConfigError(f"{retriever.preprocess.input}: label column {label!r} holds {rows[label][row]!r} in data row {row + 1}; labels are 0 or 1")
    frame = rows.select(*(pl.col(names[r]).cast(pl.Int64).alias(r) for r in ("user", "item", "timestamp")))
    frame = frame.with_columns(values.cast(pl.Int64).alias("label"))
    test = d.test.frame.select(
        pl.Series("user", d.users_raw[d.test.frame["user"].to_numpy()]),
        pl.Series("item", d.items_raw[d.test.frame["item"].to_numpy()]),
        pl.col("timestamp"),
    ).unique()
    frame = frame.join(test, on=["user", "item", "timestamp"], how="anti")
    if frame.height > section.max_rows:
        frame = frame.sample(section.max_rows, seed=section.seed).sort("timestamp")
    if frame["label"].n_unique() < 2:
        raise ConfigError(f"label column {label!r} holds only {frame['label'][0]}s; a ranker needs both 0 and 1 labels")
    return {c: frame[c].to_numpy() for c in ("user", "item", "timestamp", "label")}


def _code_tables(
    cfg: RunConfig, folder: Path, users_raw: np.ndarray, items_raw: np.ndarray, user_table: dict[str, np.ndarray], item_table: dict[str, np.ndarray]
) -> tuple[Path, Path]:
    """users.csv (user, ranker_user, u0, ...) and items.csv (item, ranker_item, i0, ...): each raw id the
    retriever knows, its Categorify code in the ranker and its dense features (the pipeline's feature
    tables hold them for the Score stage)."""
    import numpy as np
    import polars as pl

    from hugerec.data.preprocess.workflow import Workflow

    workflow = Workflow.load(Path(cfg.preprocess.out) / "workflow")
    n = max(len(users_raw), len(items_raw))
    frame = pl.DataFrame({
        "user": np.resize(users_raw, n), "item": np.resize(items_raw, n),
        "timestamp": np.zeros(n, np.int64), "label": np.zeros(n, np.int64),
        **{name: np.zeros(n, np.float32) for name in (*user_table, *item_table)},
    })  # fmt: skip
    codes = workflow.transform_frame(frame)
    user_codes, item_codes = codes["user"].to_numpy()[: len(users_raw)], codes["item"].to_numpy()[: len(items_raw)]
    if max(int(user_codes.max()), int(item_codes.max())) >= CODE_LIMIT:
        raise ConfigError(f"the ranker's id codes reach {CODE_LIMIT:,}, more than the pipeline's feature tables hold exactly; run `hugerec up --no-ranker`")
    users_csv, items_csv = folder / "users.csv", folder / "items.csv"
    pl.DataFrame({"user": users_raw, "ranker_user": user_codes.astype(np.int64), **user_table}).write_csv(users_csv)
    pl.DataFrame({"item": items_raw, "ranker_item": item_codes.astype(np.int64), **item_table}).write_csv(items_csv)
    return users_csv, items_csv
