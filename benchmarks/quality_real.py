"""Real-data quality: the default config's deep models against a one-hot logistic regression (`quality.py`).

Protocol, the same for every method within a seed:
  - rows: the Criteo sample (10,000 rows of the Kaggle set) and MovieLens-100K as CTR data
    (label = rating >= 4; user id, item id, age, gender, occupation, zip prefix as categoricals;
    the 19 genre flags and the release year as dense).
  - split: a random 80/10/10 train/valid/test permutation of the rows, drawn from the seed.
  - features: one Workflow fitted on train only (missing dense -> 0, log1p for Criteo's counts,
    standardised; categoricals -> ids by frequency, values seen < MIN_FREQUENCY times in train share
    the out-of-vocabulary id). Every method reads these same ids and dense values.
  - logistic-regression: scikit-learn L2 LogisticRegression on the one-hot ids + the dense values,
    C picked from C_GRID by valid AUC, scored on test.
  - hugerec-<model>: `hugerec train` with the library's default config (only the data paths, the
    model type and the seed set), evaluating on valid each epoch with early stopping on valid AUC;
    the best checkpoint (best.pt, what `hugerec evaluate` reads by default) scored on test.
  - the figure: test AUC, mean over the seeds; the gap = best deep model - logistic regression.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pyarrow.dataset as pads
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from hugerec.cli.commands import evaluate_model, train
from hugerec.cli.gbm_commands import evaluate_trees_cmd, train_trees
from hugerec.cli.run_config import load_run_config
from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.numeric import FillMissing, LogOp, Normalize
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema

MIN_FREQUENCY = 2
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
MAX_EPOCHS = 20  # an upper bound: early stopping (the default patience) ends every run long before it
SPLIT = (0.8, 0.1, 0.1)


@dataclass(frozen=True)
class RealData:
    name: str  # the config is f"real {name} auc"
    frame: pl.DataFrame  # label, dense..., sparse... (sparse as strings)
    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    log_dense: bool


def data_folder() -> Path | None:
    """$HUGEREC_DATA, else ../shared/data beside the repository; None when neither exists."""
    env = os.environ.get("HUGEREC_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parent.parent.parent / "shared" / "data")
    return next((c for c in candidates if c.is_dir()), None)


def criteo(folder: Path) -> RealData:
    dense = tuple(f"I{i}" for i in range(1, 14))
    sparse = tuple(f"C{i}" for i in range(1, 27))
    frame = pd.read_csv(
        folder / "criteo" / "train_examples.txt.gz",
        sep="\t",
        header=None,
        names=["label", *dense, *sparse],
        dtype={**{c: "float64" for c in dense}, **{c: "string" for c in sparse}},
    )
    return RealData("criteo", pl.from_pandas(frame), dense, sparse, log_dense=True)


GENRES = tuple(
    [
        "unknown",
        "action",
        "adventure",
        "animation",
        "children",
        "comedy",
        "crime",
        "documentary",
        "drama",
        "fantasy",
        "film_noir",
        "horror",
        "musical",
        "mystery",
        "romance",
        "sci_fi",
        "thriller",
        "war",
        "western",
    ]
)


def movielens(folder: Path) -> RealData:
    """MovieLens-100K as CTR: one row per rating, label = rating >= 4, with the user's and the item's features."""
    root = folder / "movielens" / "ml-100k"
    ratings = pd.read_csv(root / "u.data.gz", sep="\t", header=None, names=["user_id", "item_id", "rating", "ts"])
    users = pd.read_csv(root / "u.user", sep="|", header=None, names=["user_id", "age", "gender", "occupation", "zip"])
    items = pd.read_csv(
        root / "u.item.gz",
        sep="|",
        header=None,
        encoding="latin-1",
        names=["item_id", "title", "release", "video", "url", *GENRES],
    )
    items["year"] = pd.to_datetime(items["release"], format="%d-%b-%Y").dt.year.astype("float64")
    users["zip3"] = users["zip"].astype(str).str[:3]
    rows = ratings.merge(users, on="user_id").merge(items, on="item_id")
    sparse = ("user_id", "item_id", "age", "gender", "occupation", "zip3")
    dense = (*GENRES, "year")
    frame = pd.DataFrame({"label": (rows["rating"] >= 4).astype("int64")})
    for c in dense:
        frame[c] = rows[c].astype("float64")
    for c in sparse:
        frame[c] = rows[c].astype(str)
    return RealData("movielens", pl.from_pandas(frame), dense, sparse, log_dense=False)


LOADERS: dict[str, Callable[[Path], RealData]] = {"criteo": criteo, "movielens": movielens}


def prepare(data: RealData, seed: int, out: Path) -> Schema:
    """Split `data` 80/10/10 with `seed`, fit the workflow on train, write out/{train,valid,test}/ + schema.json."""
    n = data.frame.height
    order = np.random.default_rng(seed).permutation(n)
    cut1, cut2 = int(SPLIT[0] * n), int((SPLIT[0] + SPLIT[1]) * n)
    parts = {"train": order[:cut1], "valid": order[cut1:cut2], "test": order[cut2:]}
    dense, sparse = tuple(data.dense), tuple(data.sparse)
    ops: list[Any] = [FillMissing(dense, 0.0)]
    if data.log_dense:
        ops.append(LogOp(dense))
    ops += [Normalize(dense), Categorify(sparse, freq_threshold=MIN_FREQUENCY)]
    workflow = Workflow(ops, output_columns=("label", *dense, *sparse))
    workflow.fit(data.frame[parts["train"]])
    for name, rows in parts.items():
        workflow.transform(data.frame[rows], out / name, overwrite=True)
    cards = workflow.cardinalities()
    schema = Schema.build(["label"], dense, {c: cards[c] for c in sparse})
    schema.save(out / "schema.json")
    workflow.save(out / "workflow")  # beside schema.json, where `hugerec train` finds it (e.g. for vector tables)
    return schema


def logistic_regression(schema: Schema, folder: Path) -> tuple[float, float]:
    """(test AUC, the C chosen on valid) of L2 logistic regression on one-hot ids + the dense values."""
    tables = {p: pads.dataset(folder / p).to_table() for p in ("train", "valid", "test")}
    widths = [c.cardinality or 0 for c in schema.sparse]
    offsets = np.cumsum([0, *widths])

    def features(part: str) -> sp.csr_matrix:
        t = tables[part]
        ids = np.stack([t[c].to_numpy().astype(np.int64) for c in schema.sparse_names], 1) + offsets[:-1]  # [R, F]
        r, f = ids.shape
        one_hot = sp.csr_matrix((np.ones(r * f), ids.ravel(), np.arange(0, r * f + 1, f)), (r, offsets[-1]))
        dense = np.stack([t[c].to_numpy() for c in schema.dense_names], 1).astype(np.float64)  # [R, Dd]
        return sp.hstack([one_hot, sp.csr_matrix(dense)], format="csr")

    x = {p: features(p) for p in tables}
    y = {p: tables[p]["label"].to_numpy() for p in tables}
    best: tuple[float, float, Any] = (-1.0, 0.0, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for c in C_GRID:
            fitted = LogisticRegression(C=c, max_iter=1000).fit(x["train"], y["train"])
            valid_auc = float(roc_auc_score(y["valid"], fitted.predict_proba(x["valid"])[:, 1]))
            if valid_auc > best[0]:
                best = (valid_auc, c, fitted)
    test_auc = float(roc_auc_score(y["test"], best[2].predict_proba(x["test"])[:, 1]))
    return test_auc, best[1]


def deep_model(
    model: str, folder: Path, seed: int, overrides: list[str], extra_toml: str = "", name: str = ""
) -> dict[str, float]:
    """`hugerec train` with the default config on train (early stopping on valid), then test AUC of best.pt.
    `extra_toml` is appended to the config (e.g. [[model.vectors]] tables); `name` names the run (default: model)."""
    name = name or model
    config = folder / f"{name}.toml"
    # no [model] section is the default model (DLRM); another type takes that model's default fields
    section = "" if model == "dlrm" else f'[model]\ntype = "{model}"\n'
    config.write_text(
        f'[data]\ntrain = "{folder / "train"}"\neval = "{folder / "valid"}"\n{section}'
        f'[train]\nepochs = {MAX_EPOCHS}\nout_dir = "{folder / name}"\nseed = {seed}\n'
        f"progress = false\ntensorboard = false\nplot = false\n{extra_toml}"
    )
    cfg = load_run_config(config, [f"data.seed={seed}", *overrides])
    t0 = time.perf_counter()
    if model in ("lightgbm", "xgboost"):  # gradient-boosted trees: the same split, test AUC of the best round
        trees = train_trees(cfg)
        seconds = time.perf_counter() - t0
        test = evaluate_trees_cmd(load_run_config(config, [f"data.eval={folder / 'test'}", *overrides]))
        valid = (trees.final_eval or {}).get("auc", float("nan"))
        return {
            "auc": test["auc"],
            "logloss": test["logloss"],
            "valid_auc": valid,
            "best_epoch": float(trees.best_round),
            "steps": float(trees.rounds),
            "train_seconds": seconds,
        }
    history = train(cfg)
    seconds = time.perf_counter() - t0
    test = evaluate_model(load_run_config(config, [f"data.eval={folder / 'test'}", *overrides]))
    best = history.best_eval or {}
    return {
        "auc": test["auc"],
        "logloss": test["logloss"],
        "valid_auc": best.get("auc", float("nan")),
        "best_epoch": best.get("epoch", float("nan")),
        "steps": float(history.steps),
        "train_seconds": seconds,
    }


def run_real(
    names: list[str], models: list[str], seeds: list[int], workdir: Path, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    folder = data_folder()
    if folder is None:
        print("real data: skipped, no data folder ($HUGEREC_DATA or ../shared/data beside the repository)")
        return []
    records: list[dict[str, Any]] = []
    for name in names:
        data = LOADERS[name](folder)
        config = f"real {name} auc"
        per_method: dict[str, list[float]] = {}
        print(f"{config}: {data.frame.height:,} rows, split 80/10/10 by seed, seeds {seeds}", flush=True)
        for seed in seeds:
            out = workdir / name / f"seed{seed}"
            shutil.rmtree(out, ignore_errors=True)
            schema = prepare(data, seed, out)
            t0 = time.perf_counter()
            lr_auc, c = logistic_regression(schema, out)
            per_method.setdefault("logistic-regression", []).append(lr_auc)
            print(
                f"  seed {seed} logistic-regression   test AUC {lr_auc:.4f} (C={c}, {time.perf_counter() - t0:.0f} s)"
            )
            for model in models:
                r = deep_model(model, out, seed, list(overrides))
                per_method.setdefault(f"hugerec-{model}", []).append(r["auc"])
                print(
                    f"  seed {seed} hugerec-{model:14s} test AUC {r['auc']:.4f} (valid {r['valid_auc']:.4f} at "
                    f"{'round' if f'hugerec-{model}' in GBM_METHODS else 'epoch'} {r['best_epoch']:.0f}, "
                    f"{r['steps']:.0f} {'rounds' if f'hugerec-{model}' in GBM_METHODS else 'steps'}, "
                    f"{r['train_seconds']:.0f} s)",
                    flush=True,
                )
        for method, values in per_method.items():
            records.append(
                {
                    "config": config,
                    "method": method,
                    "value": float(np.mean(values)),
                    "unit": "AUC",
                    "higher_is_better": True,
                    "per_seed": values,
                }
            )
    return records


VECTOR_DIM = 32
VECTOR_METHODS = {  # method -> the [[model.vectors]] keys that differ (no entry: no vector feature)
    "hugerec-no-vectors": None,
    "hugerec-vectors-raw": {"normalize": "none", "layer_norm": False},
    "hugerec-vectors-l2ln": {"normalize": "l2", "layer_norm": True},
}


def movielens_item_vectors(folder: Path, out: Path) -> Path:
    """Item text vectors for MovieLens-100K, built offline as a pretrained encoder would: TF-IDF of the
    title words and genre names, reduced to VECTOR_DIM by truncated SVD (scikit-learn). Unsupervised
    (no label is read), so fitting it on every item leaks nothing. Written as Parquet (item_id, vector)."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    items = pd.read_csv(
        folder / "movielens" / "ml-100k" / "u.item.gz",
        sep="|",
        header=None,
        encoding="latin-1",
        names=["item_id", "title", "release", "video", "url", *GENRES],
    )
    genres = items[list(GENRES)].to_numpy()
    text = [
        f"{title} " + " ".join(f"genre_{g}" for g, on in zip(GENRES, flags, strict=True) if on)
        for title, flags in zip(items["title"].fillna(""), genres, strict=True)
    ]
    tfidf = TfidfVectorizer(min_df=2, token_pattern=r"(?u)\b\w+\b").fit_transform(text)
    vectors = TruncatedSVD(VECTOR_DIM, random_state=0).fit_transform(tfidf).astype(np.float32)
    path = out / "item_vectors.parquet"
    pl.DataFrame({"item_id": items["item_id"].astype(str).tolist(), "vector": vectors.tolist()}).write_parquet(path)
    return path


def run_vectors(seeds: list[int], workdir: Path) -> list[dict[str, Any]]:
    """`real movielens vectors auc`: DLRM on MovieLens-100K CTR, without item vectors, with raw vectors,
    and with L2-normalised vectors + LayerNorm, on the same split per seed (test AUC, mean of seeds)."""
    folder = data_folder()
    if folder is None:
        print("real movielens vectors: skipped, no data folder")
        return []
    data = movielens(folder)
    config = "real movielens vectors auc"
    per_method: dict[str, list[float]] = {}
    print(f"{config}: {data.frame.height:,} rows, item vectors TF-IDF + SVD({VECTOR_DIM}), seeds {seeds}", flush=True)
    for seed in seeds:
        out = workdir / "movielens-vectors" / f"seed{seed}"
        shutil.rmtree(out, ignore_errors=True)
        prepare(data, seed, out)
        vectors = movielens_item_vectors(folder, out)
        for method, keys in VECTOR_METHODS.items():
            extra = ""
            if keys is not None:
                extra = (
                    f'[[model.vectors]]\nname = "item_text"\nfeature = "item_id"\ndim = {VECTOR_DIM}\n'
                    f'path = "{vectors}"\nid_column = "item_id"\nvector_column = "vector"\n'
                    f'normalize = "{keys["normalize"]}"\nlayer_norm = {str(keys["layer_norm"]).lower()}\n'
                )
            r = deep_model("dlrm", out, seed, [], extra_toml=extra, name=method)
            per_method.setdefault(method, []).append(r["auc"])
            print(
                f"  seed {seed} {method:22s} test AUC {r['auc']:.4f} (valid {r['valid_auc']:.4f} at epoch "
                f"{r['best_epoch']:.0f}, {r['train_seconds']:.0f} s)",
                flush=True,
            )
    records: list[dict[str, Any]] = [
        {
            "config": config,
            "method": method,
            "value": float(np.mean(values)),
            "unit": "AUC",
            "higher_is_better": True,
            "per_seed": values,
        }
        for method, values in per_method.items()
    ]
    base = float(np.mean(per_method["hugerec-no-vectors"]))
    for r in records:
        print(f"  {r['method']:22s} mean test AUC {r['value']:.4f} ({r['value'] - base:+.4f} vs no vectors)")
    return records


GBM_METHODS = ("hugerec-lightgbm", "hugerec-xgboost")  # trees: reported beside the deep models, not one of them
TARGET_GAP = 0.005  # the best deep model's mean test AUC may trail the logistic regression's by at most this


def print_real(records: list[dict[str, Any]]) -> None:
    """Per config: each method's mean and per-seed test AUC, its gap to logistic-regression, the verdict."""
    for config in dict.fromkeys(r["config"] for r in records):
        rows = [r for r in records if r["config"] == config]
        lr = next(r for r in rows if r["method"] == "logistic-regression")
        print(f"\n{config}: test AUC, mean of {len(lr['per_seed'])} seed(s) (80/10/10 split per seed)")
        print(f"{'method':24s} {'mean':>7s} {'- logreg':>9s}  per seed")
        for r in rows:
            seeds = " ".join(f"{v:.4f}" for v in r["per_seed"])
            print(f"{r['method']:24s} {r['value']:7.4f} {r['value'] - lr['value']:+9.4f}  {seeds}")
        deep = [r for r in rows if r["method"].startswith("hugerec") and r["method"] not in GBM_METHODS]
        if deep:
            best = max(deep, key=lambda r: r["value"])
            gap = best["value"] - lr["value"]
            verdict = "met" if gap >= -TARGET_GAP else "NOT met"
            print(
                f"best deep model {best['method']}: {gap:+.4f} AUC against logistic-regression "
                f"(target >= -{TARGET_GAP}): {verdict}"
            )
