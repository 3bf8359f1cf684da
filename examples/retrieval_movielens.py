"""Two-tower retrieval on MovieLens-1M with the public API: read, split, train with early stopping on a
validation split, evaluate, index, recommend.

    python examples/retrieval_movielens.py [--data PATH/TO/ml-1m] [--epochs 10] [--users N]

--data defaults to $HUGEREC_DATA/movielens/ml-1m (or ../shared/data/movielens/ml-1m beside the repo);
--users keeps only the first N users (a quick look). --epochs is the most it trains: each user's
second-to-last event is the validation split, and training stops once recall@10 on it stops rising
(the best epoch's weights are kept); the last event is the test split, scored once at the end.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import polars as pl
import torch

import hugerec as hr
from hugerec.data.interactions import (
    categorify,
    held_out_csr,
    histories,
    iter_examples,
    last_items,
    leave_last_out,
    read_interactions,
)
from hugerec.training.retrieval import all_item_vectors, user_vectors

REPO = Path(__file__).resolve().parents[1]
DEFAULT = Path(os.environ.get("HUGEREC_DATA", REPO / ".." / "shared" / "data")) / "movielens" / "ml-1m"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--users", type=int, default=None)
    args = parser.parse_args()

    raw = read_interactions(args.data / "ratings.dat.gz", ("user", "item", "rating", "timestamp"), separator="::")
    if args.users:
        raw = raw.filter(pl.col("user") <= args.users)
    data, vocab = categorify(raw)
    train, test = leave_last_out(data)
    fit_part, valid = leave_last_out(train)  # the validation split: each user's last training event
    print(f"{data.num_users} users, {data.num_items} items, {train.num_events} training events")

    config = hr.models.TwoTowerConfig(dim=64, recent=(1, 5), similarity="cosine", temperature=0.05)
    model = hr.models.TwoTower(config, data.num_users, data.num_items, hr.Adam(lr=1e-2))
    users = torch.arange(train.num_users)
    seen = histories(fit_part)
    validation = hr.training.RetrievalValidation(
        users, last_items(*seen, users.numpy(), config.max_history), held_out_csr(valid), seen
    )
    batches = hr.training.EpochBatches(
        lambda epoch: iter_examples(fit_part, batch_size=1024, max_history=config.max_history, seed=epoch),
        length=-(-fit_part.num_events // 1024),
    )
    es = hr.training.EarlyStopping(metric="recall@10", patience=2, restore_best=True)
    hr.training.fit(
        model,
        batches,
        validation,
        hr.training.TrainConfig(epochs=args.epochs, lr=1e-3, early_stopping=es, tensorboard=False),
        family=hr.training.RetrievalFamily(fit_part.item_counts()),
    )

    offsets, items = histories(train)
    history = last_items(offsets, items, users.numpy(), config.max_history)
    test_split = hr.training.RetrievalValidation(users, history, held_out_csr(test), (offsets, items))
    metrics = hr.training.evaluate(model, test_split, ks=(10, 50))  # read once, at the end
    print({k: round(v, 4) for k, v in metrics.items()})

    index = hr.index.build_index(all_item_vectors(model), config=hr.index.IndexConfig("hnsw"))
    first = hr.training.recommend(
        model, users[:1], last_items(offsets, items, np.array([0]), 50), k=5, exclude=(offsets, items)
    )
    print(f"user {vocab.users[0]}: exact top-5 movies {vocab.items[first.items[0].numpy()].tolist()}")
    _, ann = index.query(user_vectors(model, users[:1], last_items(offsets, items, np.array([0]), 50)), 5)
    print(f"user {vocab.users[0]}: HNSW top-5 before excluding seen movies {vocab.items[ann[0].numpy()].tolist()}")


if __name__ == "__main__":
    main()
