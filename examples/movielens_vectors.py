"""MovieLens-100K as CTR data with item text vectors: a DLRM reads each movie's title+genre vector.

    HUGEREC_DATA=../shared/data python examples/movielens_vectors.py [--epochs 5]

No pretrained network can be downloaded here, so the item vectors are built offline the way a text
encoder's would be used: TF-IDF of the title words and genre names, reduced to 32 dimensions by
truncated SVD (scikit-learn). They are then an input like any pretrained vector: a side table keyed
by the raw item id, L2-normalised, encoded by the fitted workflow into the item feature's rows, and
looked up as a frozen table; the model puts it through its own LayerNorm before it meets the other
features. The script trains the same DLRM with and without the vectors on one 80/10/10 split and
prints both test AUCs (`benchmarks/quality.py --vectors` does this over several seeds).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer

from hugerec import data, models, training
from hugerec.data.preprocess import Workflow
from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.vector_tables import load_vectors
from hugerec.embedding import RowWiseAdagrad
from hugerec.models.vector_features import VectorFeature

GENRES = [
    "unknown", "action", "adventure", "animation", "children", "comedy", "crime", "documentary", "drama",
    "fantasy", "film_noir", "horror", "musical", "mystery", "romance", "sci_fi", "thriller", "war", "western",
]  # fmt: skip
SPARSE = ["user_id", "item_id", "age", "gender", "occupation"]


def read_movielens(root: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(rows: label = rating >= 4 with user and item features, items: item_id, title, genre flags)."""
    ratings = pl.read_csv(root / "u.data.gz", separator="\t", has_header=False,
                          new_columns=["user_id", "item_id", "rating", "ts"])  # fmt: skip
    users = pl.read_csv(root / "u.user", separator="|", has_header=False,
                        new_columns=["user_id", "age", "gender", "occupation", "zip"])  # fmt: skip
    items = pl.read_csv(root / "u.item.gz", separator="|", has_header=False, encoding="utf8-lossy",
                        new_columns=["item_id", "title", "release", "video", "url", *GENRES])  # fmt: skip
    rows = ratings.join(users, on="user_id").join(items, on="item_id")
    frame = rows.select(
        (pl.col("rating") >= 4).cast(pl.Int64).alias("label"),
        *[pl.col(g).cast(pl.Float64) for g in GENRES],
        *[pl.col(c).cast(pl.String) for c in SPARSE],
    )
    return frame, items


def item_vectors(items: pl.DataFrame, out: Path, dim: int = 32) -> Path:
    """TF-IDF of title + genre names -> truncated SVD -> Parquet (item_id as a string, vector)."""
    flags = items.select(GENRES).to_numpy()
    text = [
        f"{title} " + " ".join(f"genre_{g}" for g, on in zip(GENRES, row, strict=True) if on)
        for title, row in zip(items["title"].fill_null("").to_list(), flags, strict=True)
    ]
    tfidf = TfidfVectorizer(min_df=2, token_pattern=r"(?u)\b\w+\b").fit_transform(text)
    vectors = TruncatedSVD(dim, random_state=0).fit_transform(tfidf).astype(np.float32)
    path = out / "item_vectors.parquet"
    pl.DataFrame({"item_id": items["item_id"].cast(pl.String), "vector": vectors.tolist()}).write_parquet(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = Path(os.environ.get("HUGEREC_DATA", "../shared/data")) / "movielens" / "ml-100k"
    if not root.is_dir():
        raise SystemExit(f"no MovieLens-100K at {root}: set HUGEREC_DATA to the folder holding movielens/")
    frame, items = read_movielens(root)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        order = np.random.default_rng(args.seed).permutation(frame.height)
        cut1, cut2 = int(0.8 * frame.height), int(0.9 * frame.height)
        parts = {"train": order[:cut1], "valid": order[cut1:cut2], "test": order[cut2:]}
        workflow = Workflow([Categorify(SPARSE, freq_threshold=2)])
        workflow.fit(frame[parts["train"]])  # the vocabulary from train only
        for name, rows in parts.items():
            workflow.transform(frame[rows], out / name, overwrite=True)
        cards = workflow.cardinalities()
        schema = data.Schema.build(["label"], GENRES, {c: cards[c] for c in SPARSE})
        vectors = item_vectors(items, out)
        feature = VectorFeature(
            "item_text", feature="item_id", dim=32, path=str(vectors), id_column="item_id", vector_column="vector"
        )
        for with_vectors in (False, True):
            config = models.DLRMConfig(bottom=(64, 16), top=(64, 32, 1), vectors=(feature,) if with_vectors else ())
            model = models.build_model(config, schema.table_configs(dim=16), len(GENRES), RowWiseAdagrad(lr=0.05))
            for line in load_vectors(model, workflow):
                print(line)
            history = training.fit(
                model,
                data.load(str(out / "train" / "*.parquet"), schema, batch_size=1024, shuffle=True),
                data.load(str(out / "valid" / "*.parquet"), schema, batch_size=8192),
                training.TrainConfig(
                    epochs=args.epochs, lr=0.002, out_dir=str(out / f"run{int(with_vectors)}"), progress=False
                ),
            )
            test = training.evaluate(model, data.load(str(out / "test" / "*.parquet"), schema, batch_size=8192))
            best = history.best_eval or {}
            print(
                f"{'with' if with_vectors else 'without'} item vectors: test AUC {test['auc']:.4f} "
                f"(valid AUC {best.get('auc', float('nan')):.4f})"
            )


if __name__ == "__main__":
    main()
