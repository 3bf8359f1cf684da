"""Two-tower retrieval on MovieLens-1M with the public API: declare the data by its roles, build the model
from the registry, train with early stopping on a validation split, evaluate, index, recommend.

    python examples/retrieval_movielens.py [--data PATH/TO/ml-1m] [--epochs 10] [--users N]

--data defaults to $HUGEREC_DATA/movielens/ml-1m (or ../shared/data/movielens/ml-1m beside the repo);
--users keeps only the N users with the smallest ids (a quick look). --epochs is the most it trains: each
user's second-to-last event is the validation split, and training stops once recall@10 on it stops
rising (the best epoch's weights are kept); the last event is the test split, scored once at the end.
The same run without code: `hugerec train configs/movielens_two_tower.toml`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

import hugerec as hr
from hugerec.sparse import JaggedTensor

REPO = Path(__file__).resolve().parents[1]
DEFAULT = Path(os.environ.get("HUGEREC_DATA", REPO / ".." / "shared" / "data")) / "movielens" / "ml-1m"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--users", type=int, default=None)
    args = parser.parse_args()

    # 1. The data, declared once by its roles (as [preprocess] does for every model): UserID::MovieID::Rating::Timestamp.
    spec = hr.data.InputSpec(
        separator="::",
        header=False,
        columns=(
            hr.data.ColumnSpec("user", "int", "user"),
            hr.data.ColumnSpec("item", "int", "item"),
            hr.data.ColumnSpec("rating", "int", "none"),
            hr.data.ColumnSpec("timestamp", "timestamp"),  # unix seconds
        ),
    )
    # its retrieval view: one time-ordered history per user, each user's last event held out for the test
    split = hr.data.SplitSpec(hr.data.SplitKind.LEAVE_LAST_OUT)
    data = hr.data.retrieval_view(spec, str(args.data / "ratings.dat.gz"), split, max_users=args.users)
    fit_part, valid = data.validation_split()  # each user's last training event, cut as the test split was
    print(f"{data.data.num_users} users, {data.data.num_items} items, {data.train.num_events} training events")

    # 2. The model, from the registry.
    config = hr.models.TwoTowerConfig(dim=64, recent=(1, 5), similarity="cosine", temperature=0.05)
    model = hr.models.build_model(
        config, optimizer=hr.Adam(lr=1e-2), num_users=data.data.num_users, num_items=data.data.num_items
    )

    # 3. Train through the one trainer, the retrieval family supplying its batches, its loss and its metric.
    family = hr.training.RetrievalFamily(fit_part.item_counts())
    batches = hr.training.EpochBatches(*hr.data.epoch_examples(fit_part, batch_size=1024, max_history=config.max_history))
    validation = hr.training.RetrievalValidation(*hr.data.full_ranking(fit_part, valid, config.max_history))
    es = hr.training.EarlyStopping(metric="recall@10", patience=2, restore_best=True)
    hr.training.fit(
        model,
        batches,
        validation,
        hr.training.TrainConfig(epochs=args.epochs, lr=1e-3, early_stopping=es, tensorboard=False, plot=False),
        family=family,
    )

    # 4. Evaluate on the test split, read once, at the end: the whole catalogue ranked, training items excluded.
    test_split = hr.training.RetrievalValidation(*hr.data.full_ranking(data.train, data.test, config.max_history))
    metrics = hr.training.evaluate(model, test_split, ks=(10, 50))
    print({k: round(v, 4) for k, v in metrics.items()})

    # 5. Recommend: exact top-5 (seen movies excluded), and the HNSW index over every item vector.
    user = test_split.users[:1]  # user 0, with the history and seen items the test split ranked from
    one = JaggedTensor(test_split.history.values[: int(test_split.history.lengths[0])], test_split.history.lengths[:1])
    first = hr.training.recommend(model, user, one, k=5, exclude=test_split.exclude)
    print(f"user {data.users_raw[0]}: exact top-5 movies {data.items_raw[first.items[0].numpy()].tolist()}")
    with torch.no_grad():
        model.eval()
        vectors = model.item_vectors(torch.arange(data.data.num_items))  # [I, D]
        query = model.user_vectors(user, one)  # [1, D]
    index = hr.index.build_index(vectors, config=hr.index.IndexConfig("hnsw"))
    _, ann = index.query(query, 5)
    print(f"user {data.users_raw[0]}: HNSW top-5 before excluding seen movies {data.items_raw[ann[0].numpy()].tolist()}")


if __name__ == "__main__":
    main()
