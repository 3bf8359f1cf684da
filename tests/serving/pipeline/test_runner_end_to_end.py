"""End to end on synthetic interactions with a known generating model (the oracle):
hit rate@20 of retrieval alone, of the four-stage pipeline (a DLRM ranks what retrieval found), and of
the oracle, on each user's held-out last event.

Protocol: leave-last-out (each user's last event is the target, the rest is training and is excluded
at recommendation time). Retrieval: PureSVD (rank-16 truncated SVD of the training matrix) as a
matrix factorisation, exact index. Ranker: a DCN-v2 on user and item ids plus dense features the
retrieval index does not have: the item's content (the generator's hidden item factors and its log
training popularity) and the user's profile (the mean content of their training items), trained
with BCE on training events against 4 uniform negatives each. Oracle: the generator's true logits over the items the user has not seen.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import TableConfig
from hugerec.index.vector_index import IndexConfig, IndexKind, build_index
from hugerec.models.dcn import DCNv2
from hugerec.models.mf import MatrixFactorization
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.export import export
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.serving.pipeline.runner import PipelineRunner, Query, Resources
from hugerec.serving.pipeline.stages import Ann, Filter, Order, PipelineSpec, Retrieve, Score
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures

K, RETRIEVE = 20, 150
EPOCHS = 8


def split(seed: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    synth = generate_interactions(InteractionConfig(num_users=500, num_items=400, min_events=20, max_events=40, seed=seed))
    df = synth.data.frame.sort(["user", "timestamp"])
    users, items = df["user"].to_numpy(), df["item"].to_numpy()
    last = np.r_[users[1:] != users[:-1], True]  # each user's last event
    return synth, users[~last], items[~last], items[last]


def train_mf(users: np.ndarray, items: np.ndarray, num_users: int, num_items: int) -> MatrixFactorization:
    """PureSVD: the rank-16 truncated SVD of the user x item matrix, written into an MF's tables."""
    matrix = np.zeros((num_users, num_items), np.float32)
    matrix[users, items] = 1.0
    u, s, vt = np.linalg.svd(matrix, full_matrices=False)
    model = MatrixFactorization(num_users, num_items, 16)
    with torch.no_grad():
        model.user_embedding.table_weight("user_id").copy_(torch.from_numpy(u[:, :16] * np.sqrt(s[:16])))
        model.item_embedding.table_weight("item_id").copy_(torch.from_numpy(vt[:16].T * np.sqrt(s[:16])))
    return model.eval()


def train_ranker(users: np.ndarray, items: np.ndarray, dense: Any, num_users: int, num_items: int) -> DCNv2:
    """DCN-v2 on [user profile, item content] (its cross layers learn their products) and the two ids."""
    torch.manual_seed(0)
    tables = [TableConfig("user", num_users, 8), TableConfig("item", num_items, 8)]
    model = DCNv2(EmbeddingCollection(tables, Adam(lr=0.01)), dense(users[:1], items[:1]).shape[1], 2, deep=(32,))
    opt = torch.optim.Adam(model.dense_parameters(), lr=1e-2)
    rng = np.random.default_rng(1)
    for _ in range(EPOCHS):
        order = rng.permutation(len(users))
        for lo in range(0, len(order), 512):
            b = order[lo : lo + 512]
            u = np.tile(users[b], 5)
            i = np.concatenate([items[b], rng.integers(0, num_items, 4 * len(b))])
            labels = torch.cat([torch.ones(len(b)), torch.zeros(4 * len(b))])
            sparse = SparseFeatures(("user", "item"), torch.from_numpy(np.concatenate([u, i])), torch.ones(2 * len(u), dtype=torch.int32))
            loss = nn.functional.binary_cross_entropy_with_logits(model(Batch(torch.from_numpy(dense(u, i)), sparse, labels)), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model.eval()


@pytest.mark.slow
def test_ranking_improves_on_retrieval_alone_and_stays_below_the_oracle(tmp_path: Any) -> None:
    synth, users, items, targets = split(0)
    num_users, num_items = synth.config.num_users, synth.config.num_items
    mf = train_mf(users, items, num_users, num_items)
    counts = np.bincount(items, minlength=num_items)
    content = np.concatenate([synth.item_factors, np.log1p(counts)[:, None].astype(np.float32)], axis=1)  # [I, rank + 1]
    profile = np.zeros((num_users, synth.item_factors.shape[1]), np.float32)  # [U, rank] mean content of the training items
    np.add.at(profile, users, synth.item_factors[items])
    profile /= np.maximum(np.bincount(users, minlength=num_users), 1)[:, None]

    def dense(u: np.ndarray, i: np.ndarray) -> np.ndarray:
        return np.concatenate([profile[u], content[i]], axis=1)

    ranker = load_bundle(export(train_ranker(users, items, dense, num_users, num_items), tmp_path / "ranker"), ServeOptions(state_dir=str(tmp_path / "state")))
    try:
        user_cols, columns = tuple(f"p{j}" for j in range(profile.shape[1])), tuple(f"c{j}" for j in range(content.shape[1]))
        store = FeatureStore.in_memory({"user": user_cols, "item": columns})
        store.write("user", np.arange(num_users), profile)
        store.write("item", np.arange(num_items), content)
        encoder = UserEncoder(mf)
        vectors = encoder.item_vectors()
        res = Resources(store, InteractionStore.from_pairs(users, items), build_index(vectors, config=IndexConfig(IndexKind.EXACT)), encoder, vectors, ranker=ranker.model)
        retrieve, keep_new = Retrieve((Ann(RETRIEVE),)), Filter(exclude_seen=True)
        alone = PipelineRunner(PipelineSpec((retrieve, keep_new, Order())), res)
        score = Score(dense=(*(f"user.{c}" for c in user_cols), *(f"item.{c}" for c in columns)), sparse=(("user", "user.id"), ("item", "item.id")))
        full = PipelineRunner(PipelineSpec((retrieve, keep_new, score, Order())), res)
        hits = {"retrieval": 0, "pipeline": 0, "oracle": 0}
        true = synth.true_scores(np.arange(num_users))
        for u in range(num_users):
            for name, p in (("retrieval", alone), ("pipeline", full)):
                rec = p.recommend(Query(u, K))
                assert len(rec.items) == K
                hits[name] += int(targets[u] in rec.items)
            s = true[u].copy()
            s[items[users == u]] = -np.inf
            hits["oracle"] += int(targets[u] in np.argsort(-s, kind="stable")[:K])
        rate = {n: h / num_users for n, h in hits.items()}
        print(f"hit rate@{K}: {rate}")
        assert rate["pipeline"] > rate["retrieval"] + 0.02, rate
        assert rate["pipeline"] <= rate["oracle"] + 0.03, rate
    finally:
        ranker.close()
