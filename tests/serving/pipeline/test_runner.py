"""Each pipeline stage against a slow NumPy/pandas twin on random inputs: same items, same order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from hugerec.embedding.optimizers import Adam
from hugerec.index.vector_index import IndexConfig, IndexKind, build_index
from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.mf import MatrixFactorization
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SASRecConfig
from hugerec.serving.bundles.bundle_loader import load_bundle
from hugerec.serving.bundles.next_items_bundle import load_next_items, write_next_items_bundle
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.serving.pipeline.feature_store import FeatureStore
from hugerec.serving.pipeline.interaction_store import InteractionStore
from hugerec.serving.pipeline.runner import PipelineRunner, Query, Resources, StageError
from hugerec.serving.pipeline.stages import (
    Ann,
    Boost,
    Condition,
    Filter,
    ItemToItem,
    Order,
    PipelineSpec,
    Popular,
    Retrieve,
    Score,
    Sequential,
)
from hugerec.serving.runtime.inference_protocol import RequestError
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.training.model_file import RawIds, save_model

USERS, ITEMS, DIM = 300, 200, 8  # the toy DLRM's tables: user 300 rows, item 200 rows
USER_COLS = ("age", "region")
ITEM_COLS = ("available", "region", "min_age", "category", "price", "promoted")


def make_world(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    users = pd.DataFrame({"user": np.arange(USERS - 20), "age": rng.integers(10, 70, USERS - 20), "region": rng.integers(0, 3, USERS - 20)})
    items = pd.DataFrame(
        {
            "item": np.arange(ITEMS),
            "available": (rng.random(ITEMS) < 0.8).astype(np.int64),
            "region": rng.integers(0, 3, ITEMS),
            "min_age": rng.choice([0, 0, 0, 18], ITEMS),
            "category": rng.integers(0, 6, ITEMS),
            "price": rng.random(ITEMS).round(3),
            "promoted": (rng.random(ITEMS) < 0.1).astype(np.int64),
        }
    )
    store = FeatureStore.in_memory({"user": USER_COLS, "item": ITEM_COLS})
    store.write("user", users["user"].to_numpy(), {c: users[c].to_numpy() for c in USER_COLS})
    store.write("item", items["item"].to_numpy(), {c: items[c].to_numpy() for c in ITEM_COLS})
    torch.manual_seed(seed)
    mf = MatrixFactorization(USERS, ITEMS, DIM)
    encoder = UserEncoder(mf)
    vectors = encoder.item_vectors()
    index = build_index(vectors, config=IndexConfig(IndexKind.EXACT))
    events_u = rng.integers(0, USERS, 3000)
    events_i = rng.integers(0, ITEMS, 3000)
    popular = np.lexsort((np.arange(ITEMS), -np.bincount(events_i, minlength=ITEMS)))
    interactions = InteractionStore.from_pairs(events_u, events_i)
    return {"users": users, "items": items, "store": store, "encoder": encoder, "vectors": vectors, "index": index,
            "popular": popular, "interactions": interactions, "events": pd.DataFrame({"user": events_u, "item": events_i})}


# -- the slow twin -----------------------------------------------------------------------------------
def ref_retrieve(w: dict[str, Any], user: int, history: list[int], k_ann: int, k_i2i: int, last: int, k_pop: int) -> pd.DataFrame:
    seen = [*w["events"].query("user == @user")["item"].tolist(), *history]
    known = user in set(w["users"]["user"])
    frames = []
    if known:
        u = w["encoder"].model.user_vectors(torch.tensor([user])).detach().numpy()[0]
        s = w["vectors"] @ u
        top = sorted(range(ITEMS), key=lambda i: (-s[i], i))[:k_ann]
        frames.append(pd.DataFrame({"item": top, "source": "ann", "score": s[top]}))
    if seen:
        q = w["vectors"][seen[-last:]].mean(axis=0)
        s = w["vectors"] @ q
        top = sorted(range(ITEMS), key=lambda i: (-s[i], i))[:k_i2i]
        frames.append(pd.DataFrame({"item": top, "source": "item_to_item", "score": s[top]}))
    pop = list(w["popular"][:k_pop])
    frames.append(pd.DataFrame({"item": pop, "source": "popular", "score": -np.arange(len(pop), dtype=float)}))
    return pd.concat(frames).drop_duplicates("item", keep="first").reset_index(drop=True)


def ref_filter(w: dict[str, Any], cands: pd.DataFrame, user: int, history: list[int], deny: list[int]) -> pd.DataFrame:
    seen = set(w["events"].query("user == @user")["item"]) | set(history)
    urow = w["users"].set_index("user").loc[user]
    df = cands.merge(w["items"], on="item", how="left", sort=False)
    df = df[~df["item"].isin(seen) & ~df["item"].isin(deny)]
    df = df[(df["available"] == 1) & (df["region"] == urow["region"]) & (df["min_age"] <= urow["age"])]
    return df.reset_index(drop=True)


def ref_order(df: pd.DataFrame, k: int, per_category: int, boost: float) -> pd.DataFrame:
    df = df.copy()
    df.loc[df["promoted"] == 1, "score"] = df.loc[df["promoted"] == 1, "score"] * boost
    df = df.sort_values(["score", "item"], ascending=[False, True], kind="mergesort")
    df = df[df.groupby("category").cumcount() < per_category]
    return df.head(k)


def spec(k_ann: int = 40, k_i2i: int = 20, k_pop: int = 20, per_category: int = 2, boost: float = 1.5, deny: tuple[int, ...] = (), score: Score | None = None) -> PipelineSpec:
    stages: list[Any] = [
        Retrieve((Ann(k_ann), ItemToItem(k_i2i, last=3), Popular(k_pop))),
        Filter(True, (Condition("available", "==", 1.0), Condition("region", "==", "user.region"), Condition("min_age", "<=", "user.age")), deny=deny),
    ]
    if score is not None:
        stages.append(score)
    stages.append(Order((Boost(Condition("promoted", "==", 1), multiply=boost),), "category", per_category))
    return PipelineSpec(tuple(stages), context=(("hour", 12.0),))


def resources(w: dict[str, Any], ranker: Any = None) -> Resources:
    return Resources(w["store"], w["interactions"], w["index"], w["encoder"], w["vectors"], w["popular"], ranker)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_retrieve_filter_order_match_the_slow_twin(seed: int) -> None:
    w = make_world(seed)
    rng = np.random.default_rng(100 + seed)
    deny = tuple(int(i) for i in rng.integers(0, ITEMS, 10))
    p = PipelineRunner(spec(deny=deny), resources(w))
    for user in rng.integers(0, USERS - 20, 8).tolist():
        history = rng.integers(0, ITEMS, 2).tolist()
        rec = p.recommend(Query(user, 10, tuple(history)), debug=True)
        assert rec.stages is not None
        cands = ref_retrieve(w, user, history, 40, 20, 3, 20)
        assert rec.stages["retrieve"]["items"] == cands["item"].tolist()
        assert rec.stages["retrieve"]["sources"] == cands["source"].tolist()
        np.testing.assert_allclose(rec.stages["retrieve"]["scores"], cands["score"], rtol=1e-4, atol=1e-5)
        kept = ref_filter(w, cands, user, history, list(deny))
        assert rec.stages["filter"]["items"] == kept["item"].tolist()
        top = ref_order(kept, 10, 2, 1.5)
        assert rec.items.tolist() == top["item"].tolist()
        np.testing.assert_allclose(rec.scores, top["score"], rtol=1e-4, atol=1e-5)
        if len(top) < 10:
            assert any("only" in n for n in rec.notes)


def test_score_is_one_batched_call_matching_the_model_row_by_row(toy: Any) -> None:
    w = make_world(3)
    loaded = load_bundle(toy.bundle)
    try:
        calls: list[int] = []
        model = loaded.model

        class Counting:
            num_dense, features = model.num_dense, model.features

            def predict(self, inputs: Any) -> np.ndarray:
                calls.append(inputs.batch_size)
                return model.predict(inputs)

        score = Score(dense=("user.age", "item.price", "context.hour", "item.category"),
                      sparse=(("user", "user.id"), ("item", "item.id"), ("last_item", "item.category")))
        p = PipelineRunner(spec(per_category=100, boost=1.0, score=score), resources(w, Counting()))
        user = 5
        rec = p.recommend(Query(user, 20, context={"hour": 9.0}), debug=True)
        assert rec.stages is not None
        assert len(calls) == 1 and calls[0] == len(rec.stages["filter"]["items"])
        items = np.array(rec.stages["filter"]["items"])
        urow = w["users"].set_index("user").loc[user]
        irows = w["items"].set_index("item").loc[items]
        expected = []
        for i, item in enumerate(items.tolist()):  # the slow twin: the trained model, one row at a time
            dense = torch.tensor([[urow["age"], irows["price"].iloc[i], 9.0, irows["category"].iloc[i]]], dtype=torch.float32)
            sparse = SparseFeatures.from_lists({"user": [[user]], "item": [[item]], "last_item": [[int(irows["category"].iloc[i])]]})
            expected.append(float(toy.offline(Batch(dense, sparse, torch.zeros(1)))[0]))
        np.testing.assert_allclose(rec.stages["score"]["scores"], expected, rtol=1e-4, atol=1e-6)
        ref = pd.DataFrame({"item": items, "score": np.float32(expected)}).merge(w["items"], on="item")
        top = ref_order(ref, 20, 100, 1.0)
        assert rec.items.tolist() == top["item"].tolist()
    finally:
        loaded.close()


def test_exploration_samples_from_the_softmax_with_a_true_temperature() -> None:
    w = make_world(4)
    store = w["store"]
    scores = np.array([2.0, 1.0, 0.5, 0.0, -1.0])
    items = np.arange(5)

    class Fixed:
        num_dense, features = 0, ("item",)

        def predict(self, inputs: Any) -> np.ndarray:
            return scores[inputs.one_id[0]] * 4  # logits: the pipeline's scores are their sigmoid

    stages = (Retrieve((Popular(5),)), Score(sparse=(("item", "item.id"),)), Order(temperature=0.5))
    p = PipelineRunner(PipelineSpec(stages), Resources(store, popular=items, ranker=Fixed()), seed=0)
    n = 4000
    first = np.zeros(5)
    second_given_first0 = np.zeros(5)
    for _ in range(n):
        rec = p.recommend(Query(0, 2))
        first[rec.items[0]] += 1
        if rec.items[0] == 0:
            second_given_first0[rec.items[1]] += 1
    served = p.recommend(Query(0, 5), debug=True)
    assert served.stages is not None
    s = np.array(served.stages["score"]["scores"])[np.argsort(served.stages["score"]["items"])]  # score per item id
    prob = np.exp(s / 0.5) / np.exp(s / 0.5).sum()
    assert stats.chisquare(first, prob * n).pvalue > 1e-3
    rest = prob.copy()
    rest[0] = 0
    rest /= rest.sum()  # without replacement: the second draw is the softmax over the others
    m = second_given_first0.sum()
    assert stats.chisquare(second_given_first0[1:], rest[1:] * m).pvalue > 1e-3
    # a lower temperature is greedier: the best item comes first more often
    cold = PipelineRunner(PipelineSpec((stages[0], stages[1], Order(temperature=0.05))), Resources(store, popular=items, ranker=Fixed()), seed=1)
    greedy = sum(int(cold.recommend(Query(0, 1)).items[0] == 0) for _ in range(500))
    assert greedy / 500 > first[0] / n + 0.1
    # the same seed, the same draw
    assert p.recommend(Query(0, 5, seed=7)).items.tolist() == p.recommend(Query(0, 5, seed=7)).items.tolist()


def test_cold_start_and_shortfall_are_said() -> None:
    w = make_world(5)
    p = PipelineRunner(spec(), resources(w))
    rec = p.recommend(Query(USERS + 50, 10))
    assert rec.cold_start and set(rec.sources) == {"popular"} and "cold start" in rec.notes[0]
    rec = p.recommend(Query(USERS + 50, 10, history=(1, 2)))
    assert "item_to_item" in rec.sources
    small = PipelineRunner(spec(k_ann=3, k_i2i=1, k_pop=1), resources(w))
    rec = small.recommend(Query(1, 50))
    assert len(rec.items) < 50 and any(n.startswith("only") for n in rec.notes)


def test_bad_queries_name_the_field_and_failing_stages_say_which() -> None:
    w = make_world(6)
    p = PipelineRunner(spec(), resources(w))
    for k in (0, -1, 101, True):
        with pytest.raises(RequestError, match="'k'"):
            p.recommend(Query(1, k))
    with pytest.raises(RequestError, match=r"context.*'nope'"):
        p.recommend(Query(1, 5, context={"nope": 1.0}))

    class Down:
        num_dense, features = 0, ("item",)

        def predict(self, inputs: Any) -> np.ndarray:
            raise ConnectionError("feature store unreachable")

    down = PipelineRunner(spec(score=Score(sparse=(("item", "item.id"),))), resources(w, Down()))
    with pytest.raises(StageError, match="'score' failed: ConnectionError"):
        down.recommend(Query(1, 5))


def test_specs_are_checked_against_the_resources() -> None:
    w = make_world(7)
    with pytest.raises(ValueError, match="no column 'colour'"):
        PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Filter(keep=(Condition("colour", "==", 1),)), Order())), resources(w))
    with pytest.raises(ValueError, match="context key 'day'"):
        PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Order(boosts=(Boost(Condition("price", ">", "context.day"), add=1),)))), resources(w))
    with pytest.raises(ValueError, match="Retrieve, \\[Filter\\], \\[Score\\], Order"):
        PipelineSpec((Order(), Retrieve((Popular(5),))))
    with pytest.raises(ValueError, match="op must be one of"):
        Condition("price", "~", 1)
    with pytest.raises(ValueError, match="temperature must be a number > 0"):
        Order(temperature=0)
    with pytest.raises(ValueError, match="ranker takes"):
        PipelineRunner(spec(score=Score(sparse=(("user", "user.id"),))), resources(w, type("R", (), {"num_dense": 0, "features": ("item",), "predict": None})()))


def test_feature_store_refuses_inexact_values_and_updates_online() -> None:
    store = FeatureStore.in_memory({"item": ("a", "b")})
    store.write("item", np.array([3, 1]), {"a": np.array([1, 2]), "b": np.array([0.5, 0.25])})
    store.update("item", np.array([1]), {"b": np.array([9.0])})
    values, found = store.read("item", np.array([1, 3, 7]))
    assert found.tolist() == [True, True, False]
    assert values.tolist() == [[2.0, 9.0], [1.0, 0.5], [0.0, 0.0]]
    with pytest.raises(ValueError, match="not exact in float32"):
        store.write("item", np.array([5]), {"a": np.array([1 << 25]), "b": np.array([0.0])})
    with pytest.raises(ValueError, match="lacks columns \\['b'\\]"):
        store.write("item", np.array([5]), {"a": np.array([1])})
    with pytest.raises(ValueError, match="no row for id 8"):
        store.update("item", np.array([8]), {"a": np.array([1])})


@pytest.mark.parametrize("recent", [(1, 3), ()])
def test_user_encoder_matches_the_two_tower_and_maps_raw_ids(recent: tuple[int, ...]) -> None:
    from hugerec.models.two_tower import TwoTower, TwoTowerConfig

    torch.manual_seed(0)
    model = TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, user_layers=(16,), max_history=6, recent=recent), 30, 50)
    users_raw, items_raw = np.arange(30) * 10 + 7, np.arange(50) * 3 + 1000
    enc = UserEncoder(model, users_raw, items_raw)
    rng = np.random.default_rng(0)
    for n in (0, 1, 4, 9):
        user, hist = int(rng.integers(0, 30)), rng.integers(0, 50, n)
        got = enc.encode(int(users_raw[user]), np.r_[items_raw[hist], 5])  # 5: an unknown raw item, skipped
        np.testing.assert_allclose(got, enc.reference(user, hist), rtol=1e-5, atol=1e-6)
    assert enc.encode(8, np.zeros(0, np.int64)) is None  # a raw user id the model does not know
    assert enc.dense_items(np.array([1003, 999, 1147])).tolist() == [1, -1, 49]


@pytest.mark.parametrize("tier", ["rocksdb", "redis"])
def test_feature_store_on_the_other_tiers(tier: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    location = str(tmp_path / "rocks") if tier == "rocksdb" else request.getfixturevalue("redis_url")
    store = FeatureStore.on_tier({"item": ("a", "b")}, tier, location, namespace=f"test:{tmp_path.name}")
    try:
        store.write("item", np.array([10, -3]), np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
        store.update("item", np.array([-3]), {"a": np.array([7])})
        values, found = store.read("item", np.array([-3, 10, 11]))
        assert found.tolist() == [True, True, False] and values.tolist() == [[7.0, 4.0], [1.0, 2.0], [0.0, 0.0]]
        saved = store.save(tmp_path / "saved")
        again = FeatureStore.load(saved)
        assert again.read("item", np.array([10, -3]))[0].tolist() == [[1.0, 2.0], [7.0, 4.0]]
    finally:
        store.close()


def _sequential(tmp_path: Any, model_type: str, times: bool = False, head: bool = True) -> Any:
    """A next-items model over the toy catalogue (raw item id i = dense id i + 1), untrained; times: an HSTU
    trained with model.times = true; an HSTU's config says its ranking head was trained (ranking_weight 1), as
    the Score stage takes no other (its values do not matter to these tests)."""
    torch.manual_seed(0)
    config = HSTUConfig(max_len=6, dim=8, num_layers=1, num_heads=2, times=times, ranking_weight=1.0 if head else 0.0) if model_type == "hstu" else SASRecConfig(max_len=6, dim=8, num_layers=1, num_heads=2)
    cfg = config.sequence_config(ITEMS)
    model = HSTU(cfg) if model_type == "hstu" else SASRec(cfg)
    counts = np.concatenate([[0], np.ones(ITEMS)]).astype(np.int64)
    save_model(tmp_path / f"{model_type}.pt", model, config, Adam(lr=0.01), ids=RawIds(np.arange(ITEMS), counts))
    return load_next_items(write_next_items_bundle(tmp_path / f"{model_type}.pt", tmp_path / model_type))


def test_score_with_the_sequential_model_ranks_by_its_cached_candidate_scores(tmp_path: Any) -> None:
    w = make_world(8)
    seq = _sequential(tmp_path, "hstu")
    res = resources(w)
    res.sequential = seq
    history = (5, 17, 3, 9, 11, 40, 2, 8)  # longer than the model reads before the candidate: said in the notes
    p = PipelineRunner(PipelineSpec((Retrieve((Popular(60),)), Score(sequential=True), Order())), res)
    rec = p.recommend(Query(USERS + 1, 10, history=history))
    cands = w["popular"][:60]
    logits, truncated = seq.candidate_scores(np.array(history), cands)
    want = cands[np.lexsort((cands, -logits))][:10]
    np.testing.assert_array_equal(rec.items, want)
    assert truncated == len(history) - 5 and any("oldest items were left out" in n for n in rec.notes)
    with pytest.raises(ValueError, match=r"needs an HSTU next-items model .* it has a sasrec \(sequential = 'next_item' ranks with any"):
        res.sequential = _sequential(tmp_path, "sasrec")
        PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Score(sequential=True), Order())), res)
    with pytest.raises(ValueError, match="sequential = 'ranking_head' takes no dense or sparse inputs"):
        Score(sparse=(("item", "item.id"),), sequential=True)


def test_a_score_stage_over_an_untrained_ranking_head_is_refused_and_the_source_keeps_working(tmp_path: Any) -> None:
    """An HSTU trained with model.ranking_weight = 0 (every HSTU before the key) has a random ranking head: a
    Score with sequential = true over it is refused in one line naming the stage, the bundle and the key; its
    next items still serve the sequential source."""
    w = make_world(8)
    res = resources(w)
    res.sequential = _sequential(tmp_path, "hstu", head=False)
    assert not res.sequential.ranking_head_trained
    with pytest.raises(ValueError, match=r"^Pipeline: Score with sequential = 'ranking_head' uses next-items bundle 'model', an HSTU whose ranking "
                       r"head was never trained; train it with model.ranking_weight > 0 \(e.g. 0.1\) and export it again, or rank with "
                       r"sequential = 'next_item' \(the model's next-item score\)$"):
        PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Score(sequential=True), Order())), res)
    rec = PipelineRunner(PipelineSpec((Retrieve((Sequential(5),)), Order())), res).recommend(Query(USERS + 1, 5, history=(5, 17, 3)))
    assert len(rec.items) == 5
    rec = PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Score(sequential="next_item"), Order())), res).recommend(Query(USERS + 1, 5, history=(5, 17, 3)))
    assert len(rec.items) == 5  # the next-item score needs no head


@pytest.mark.parametrize("model_type", ["sasrec", "hstu"])
def test_score_with_the_next_item_score_ranks_as_the_model_ranks_its_next_items(model_type: str, tmp_path: Any) -> None:
    """sequential = "next_item": each candidate's score is the model's next-item probability among the candidates
    (the softmax of its query . item vector logits), so the candidates come in the order `next_items` gives the
    catalogue; any next-items model (SASRec too), an unknown candidate last with 0, a history longer than the
    model reads cut to its last max_len ids (said in the notes), no known history: popularity."""
    w = make_world(8)
    res = resources(w)
    res.sequential = seq = _sequential(tmp_path, model_type, head=False)
    history = (5, 17, 3, 9, 11, 40, 2, 8)  # 8 known ids, max_len 6
    # max_history declared above max_len: the model is handed all 8 and reads its last 6
    p = PipelineRunner(PipelineSpec((Retrieve((Popular(60),)), Filter(exclude_seen=False), Score(sequential="next_item"), Order(max_k=60)), max_history=50), res)
    rec = p.recommend(Query(USERS + 1, 60, history=history))
    cands = w["popular"][:60]
    # the whole catalogue, best first (the bundle leaves the history's own items out of it)
    full = seq.next_items(np.array(history), np.array([len(history)]), ITEMS - len(set(history)))
    rank = {int(i): r for r, i in enumerate(full["items"][0])}
    unseen = [i for i in rec.items.tolist() if i not in history]
    assert sorted(unseen, key=lambda i: rank[i]) == unseen and len(unseen) == len(set(cands.tolist()) - set(history))
    assert sorted(rec.items.tolist()) == sorted(cands.tolist())
    logits, truncated = seq.next_item_scores(np.array(history), cands)
    assert truncated == 2 and any("oldest items were left out (the model reads 6)" in n for n in rec.notes)
    by_item = dict(zip(full["items"][0].tolist(), full["scores"][0].tolist(), strict=True))
    fresh = np.array([c not in history for c in cands.tolist()])
    np.testing.assert_allclose(logits[fresh], [by_item[int(c)] for c in cands[fresh]], rtol=1e-5, atol=1e-5)
    want = np.exp(logits.astype(np.float64) - logits.max())
    np.testing.assert_allclose(np.sort(rec.scores)[::-1], np.sort(want / want.sum())[::-1].astype(np.float32), rtol=1e-5)
    with_unknown = seq.next_item_scores(np.array(history), np.array([int(cands[0]), 10**9]))[0]
    assert with_unknown[1] == -np.inf and np.isfinite(with_unknown[0])
    cold, _ = seq.next_item_scores(np.array([10**9]), cands[:3])  # nothing known: log(1 + training count)
    np.testing.assert_allclose(cold, np.log1p(seq.saved.item_counts[seq.saved.lookup(cands[:3])]))


def test_a_next_items_model_trained_with_times_beside_a_store_without_times_is_refused(tmp_path: Any) -> None:
    """An HSTU trained on timestamps reads each event's time: a store keeping none is refused when the pipeline
    is built, in one line naming the stage and the bundle; a timed store is taken."""
    w = make_world(8)
    res = resources(w)
    res.sequential = _sequential(tmp_path, "hstu", times=True)
    with pytest.raises(ValueError, match=r"^Pipeline: Score with sequential = 'ranking_head' uses next-items bundle 'model', an HSTU trained with model.times = true, but the interaction store keeps no event times"):
        PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Score(sequential=True), Order())), res)
    with pytest.raises(ValueError, match=r"^Pipeline: source 'sequential' uses next-items bundle 'model', an HSTU trained with model.times = true, but the interaction store keeps no event times"):
        PipelineRunner(PipelineSpec((Retrieve((Sequential(5),)), Order())), res)
    assert not PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Order())), res).needs_times  # the model unused: no times read
    res.interactions = _timed_store(w)
    assert PipelineRunner(PipelineSpec((Retrieve((Sequential(5),)), Order())), res).needs_times


# -- a next-items model trained with times: the stored history's times reach it ------------------------------
def _timed_sequential(tmp_path: Any, max_len: int = 6) -> Any:
    """An HSTU trained with model.times = true whose time biases are not zero (untrained ones are, and times
    would change nothing), as a next-items bundle."""
    torch.manual_seed(1)
    config = HSTUConfig(max_len=max_len, dim=8, num_layers=2, num_heads=2, times=True, ranking_weight=1.0)
    model = HSTU(config.sequence_config(ITEMS))
    with torch.no_grad():
        for layer in model.blocks:
            layer.time_bias.normal_(0.0, 2.0)
    counts = np.concatenate([[0], np.ones(ITEMS)]).astype(np.int64)
    save_model(tmp_path / "timed.pt", model, config, Adam(lr=0.01), ids=RawIds(np.arange(ITEMS), counts))
    return load_next_items(write_next_items_bundle(tmp_path / "timed.pt", tmp_path / "timed"))


def _timed_store(w: dict[str, Any]) -> InteractionStore:
    """The world's events with times: event e at 1.7e9 + 37 e**1.5 seconds (gaps from seconds to days)."""
    events = w["events"]
    times = (1_700_000_000 + 37 * np.arange(len(events)) ** 1.5).astype(np.int64)
    return InteractionStore.from_pairs(events["user"].to_numpy(), events["item"].to_numpy(), times=times)


def test_the_sequential_source_answers_what_the_next_items_bundle_gives_with_the_stored_times(tmp_path: Any) -> None:
    """The sequential source gives the model the stored history with each item's own time: the answer is what the
    next-items bundle (and recommend_next) gives for that history and those times; other times change it."""
    from hugerec.training.sequential import recommend_next

    w = make_world(8)
    res = resources(w)
    res.sequential = seq = _timed_sequential(tmp_path)
    res.interactions = store = _timed_store(w)
    p = PipelineRunner(PipelineSpec((Retrieve((Sequential(15),)), Order(max_k=15))), res)
    users = [u for u in range(USERS) if len(store.items(u)) >= 8][:6]  # longer than max_len: the last 6 keep their times
    for user in users:
        items, times = store.history(user)
        assert times is not None
        rec = p.recommend(Query(user, 15))
        want = seq.next_items(items, np.array([len(items)]), 15, times)
        assert rec.items.tolist() == want["items"][0].tolist()
        np.testing.assert_array_equal(rec.scores, want["scores"][0])
        got, scores = recommend_next(seq.saved.model, [items + 1], k=15, exclude_history=True, times=[times])  # raw i = dense i - 1
        assert rec.items.tolist() == (got[0] - 1).tolist()
        np.testing.assert_allclose(rec.scores, scores[0], rtol=1e-5, atol=1e-6)
    changed = 0
    for user in users:  # the times are read: the same items at other times rank otherwise
        items, times = store.history(user)
        shifted = seq.next_items(items, np.array([len(items)]), 15, times * 0 + np.arange(len(items)) * 10**7)
        changed += shifted["items"][0].tolist() != p.recommend(Query(user, 15)).items.tolist()
    assert changed > 0


def test_a_requests_history_comes_with_its_times_after_the_stored_ones(tmp_path: Any) -> None:
    """A request's history goes after the stored one with its own times: the model reads both; without times, with
    another number of them, or with times going back, the request is refused naming 'history.times'."""
    w = make_world(8)
    res = resources(w)
    res.sequential = seq = _timed_sequential(tmp_path)
    res.interactions = store = _timed_store(w)
    p = PipelineRunner(PipelineSpec((Retrieve((Sequential(10),)), Order(max_k=10))), res)
    user = next(u for u in range(USERS) if len(store.items(u)) >= 3)
    items, times = store.history(user)
    assert times is not None
    latest = int(times[-1])
    given, given_t = (7, 9), (latest, latest + 86_400)
    rec = p.recommend(Query(user, 10, given, history_times=given_t))
    want = seq.next_items(np.r_[items, given], np.array([len(items) + 2]), 10, np.r_[times, given_t])
    assert rec.items.tolist() == want["items"][0].tolist()
    for query, message in [
        (Query(user, 10, given), "field 'history.times' is required with a history: next-items bundle 'model' reads the events' times"),
        (Query(user, 10, given, history_times=(latest,)), "field 'history.times' has 1 times for the 2 history items"),
        (Query(user, 10, given, history_times=(latest - 1, latest)), f"field 'history.times\\[0\\]' = {latest - 1} is earlier than user {user}'s latest stored event time {latest}"),
        (Query(user, 10, given, history_times=(latest + 5, latest + 4)), f"field 'history.times\\[1\\]' = {latest + 4} is earlier than history.times\\[0\\]"),
    ]:
        with pytest.raises(RequestError, match=f"^{message}"):
            p.recommend(query)
    cold = p.recommend(Query(USERS + 5, 10, (3, 4), history_times=(-5, 0)))  # an unknown user: any times, negative too
    assert cold.items.tolist() == seq.next_items(np.array([3, 4]), np.array([2]), 10, np.array([-5, 0]))["items"][0].tolist()
    plain = PipelineRunner(PipelineSpec((Retrieve((Popular(10),)), Order(max_k=10))), resources(w))
    assert plain.recommend(Query(user, 5, given, history_times=(0, 1))).items.tolist() == plain.recommend(Query(user, 5, given)).items.tolist()


def test_score_with_a_timed_model_reads_the_histories_times(tmp_path: Any) -> None:
    """Score with sequential = true: the candidates are scored against the stored history with its times, the
    candidates at the time of the user's latest event: as NextItemsModel.candidate_scores with those times."""
    w = make_world(8)
    res = resources(w)
    res.sequential = seq = _timed_sequential(tmp_path)
    res.interactions = store = _timed_store(w)
    p = PipelineRunner(PipelineSpec((Retrieve((Popular(60),)), Filter(exclude_seen=False), Score(sequential=True), Order(max_k=20))), res)
    cands = w["popular"][:60]
    for user in [u for u in range(USERS) if len(store.items(u)) >= 2][:4]:
        items, times = store.history(user)
        rec = p.recommend(Query(user, 20))
        logits, _ = seq.candidate_scores(items, cands, times=times)
        order = np.lexsort((cands, -logits))[:20]
        assert rec.items.tolist() == cands[order].tolist()
        np.testing.assert_allclose(rec.scores, 1 / (1 + np.exp(-logits[order].astype(np.float64))), rtol=1e-6)
    nxt = PipelineRunner(PipelineSpec((Retrieve((Popular(60),)), Filter(exclude_seen=False), Score(sequential="next_item"), Order(max_k=20))), res)
    for user in [u for u in range(USERS) if len(store.items(u)) >= 2][:4]:  # the next-item score reads the times too
        items, times = store.history(user)
        logits, _ = seq.next_item_scores(items, cands, times=times)
        assert nxt.recommend(Query(user, 20)).items.tolist() == cands[np.lexsort((cands, -logits))[:20]].tolist()
        assert not np.array_equal(logits, seq.next_item_scores(items, cands, times=times * 0 + times[-1])[0])


# -- the history the models are handed: their own length unless declared ----------------------------------
def _long_sequential(tmp_path: Any, model_type: str, max_len: int) -> Any:
    """An untrained next-items model reading max_len > 50 items, over the toy catalogue (raw i = dense i + 1)."""
    torch.manual_seed(2)
    config = HSTUConfig(max_len=max_len, dim=8, num_layers=1, num_heads=2) if model_type == "hstu" else SASRecConfig(max_len=max_len, dim=8, num_layers=1, num_heads=2)
    model = HSTU(config.sequence_config(ITEMS)) if model_type == "hstu" else SASRec(config.sequence_config(ITEMS))
    counts = np.concatenate([[0], np.ones(ITEMS)]).astype(np.int64)
    save_model(tmp_path / f"long_{model_type}.pt", model, config, Adam(lr=0.01), ids=RawIds(np.arange(ITEMS), counts))
    return load_next_items(write_next_items_bundle(tmp_path / f"long_{model_type}.pt", tmp_path / f"long_{model_type}"))


@pytest.mark.parametrize("model_type", ["sasrec", "hstu"])
def test_a_sequential_model_reading_more_than_50_items_answers_in_the_pipeline_as_in_its_bundle(model_type: str, tmp_path: Any) -> None:
    """A next-items model with max_len 64 is handed the user's last 64 items (stored, then the request's), as its
    own next-items bundle reads them: the same items and scores for a history of 90; a declared max_history is
    honoured (the model then reads the last 20)."""
    w = make_world(8)
    res = resources(w)
    res.sequential = seq = _long_sequential(tmp_path, model_type, 64)
    rng = np.random.default_rng(5)
    stored = rng.integers(0, ITEMS, 70)
    res.interactions = InteractionStore.from_pairs(np.full(70, 3), stored)
    given = tuple(rng.integers(0, ITEMS, 20).tolist())
    history = np.r_[stored, given]  # 90 items, oldest first
    # every item the bundle may name, the seen ones dropped by the filter (the bundle leaves the whole history out)
    stages = (Retrieve((Sequential(ITEMS),)), Filter(exclude_seen=True), Order(max_k=15))
    p = PipelineRunner(PipelineSpec(stages), res)
    assert (p.max_history, p.history_from) == (64, "models")
    rec = p.recommend(Query(3, 15, given))
    want = seq.next_items(history, np.array([len(history)]), 15)
    assert rec.items.tolist() == want["items"][0].tolist() and want["truncated_items"][0] == 90 - 64
    np.testing.assert_array_equal(rec.scores, want["scores"][0])
    fifty = seq.next_items(history[-50:], np.array([50]), 15)  # what the pipeline's fixed 50 used to hand it
    assert not np.array_equal(fifty["scores"][0], want["scores"][0])
    declared = PipelineRunner(PipelineSpec(stages, max_history=20), res)
    assert (declared.max_history, declared.history_from) == (20, "declared")
    short = seq.next_items(history[-20:], np.array([20]), ITEMS - 20)["scores"][0]  # the last 20 read, 90 seen
    unseen = ~np.isin(seq.next_items(history[-20:], np.array([20]), ITEMS - 20)["items"][0], history)
    np.testing.assert_array_equal(declared.recommend(Query(3, 15, given)).scores, short[unseen][:15])
    # the Score stage reads as much: next-item scores of the candidates for the last 64 items
    scored = PipelineRunner(PipelineSpec((Retrieve((Popular(40),)), Filter(exclude_seen=False), Score(sequential="next_item"), Order(max_k=40))), res)
    cands = w["popular"][:40]
    logits, truncated = seq.next_item_scores(history, cands)
    assert truncated == 90 - 64
    assert scored.recommend(Query(3, 40, given)).items.tolist() == cands[np.lexsort((cands, -logits))].tolist()


def test_item_to_item_reads_the_last_known_ids_as_the_other_models_do() -> None:
    """Item-to-item's `last` counts the ids its index knows (like the two-tower's max_history and the
    sequential model's max_len): a history ending in unknown ids queries the mean of the same last known
    items as the history without them, for a stored history and a request's."""
    w = make_world(9)
    res = resources(w)
    p = PipelineRunner(PipelineSpec((Retrieve((ItemToItem(8, last=3),)), Order(max_k=8))), res)
    known, unknown = (5, 1, 2, 3, 4), (ITEMS + 7, 10**12, ITEMS)
    got = p.recommend(Query(USERS + 5, 8, (*known, *unknown))).items
    assert got.tolist() == p.recommend(Query(USERS + 5, 8, known)).items.tolist()
    _, ids = w["index"].query(torch.from_numpy(w["vectors"][[2, 3, 4]].mean(axis=0)[None]), 8)
    assert got.tolist() == ids[0].numpy().tolist()
    # the same ids stored for a user the interaction store keeps
    res.interactions = InteractionStore.from_pairs(np.full(8, 4), np.array([*known, *unknown]))
    stored = PipelineRunner(PipelineSpec((Retrieve((ItemToItem(8, last=3),)), Order(max_k=8))), res)
    assert stored.recommend(Query(4, 8)).items.tolist() == got.tolist()


def test_the_history_length_follows_the_models_and_a_declared_one_is_honoured() -> None:
    """max_history left out: the longest history a model of the pipeline reads (the two-tower's max_history,
    item-to-item's `last`, the sequential model's max_len; 0 when none reads one), each model handed the whole
    history; declared: every model is handed that many; a declared value that is not an integer >= 1 is
    refused naming the key."""
    from hugerec.models.two_tower import TwoTower, TwoTowerConfig
    from hugerec.serving.pipeline.declaration import declaration_from_dict, declaration_to_dict

    w = make_world(8)
    res = resources(w)
    assert PipelineRunner(PipelineSpec((Retrieve((Ann(5),)), Order())), res).max_history == 0  # a matrix factorisation reads none
    assert PipelineRunner(PipelineSpec((Retrieve((Ann(5), ItemToItem(5, last=7))), Order())), res).max_history == 7
    assert PipelineRunner(PipelineSpec((Retrieve((Popular(5),)), Order())), res).max_history == 0
    torch.manual_seed(0)
    towers = TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, user_layers=(), max_history=120, recent=(1, 5)), USERS, ITEMS)
    res.encoder = UserEncoder(towers)
    res.index = build_index(res.encoder.item_vectors(), config=IndexConfig(IndexKind.EXACT))
    p = PipelineRunner(PipelineSpec((Retrieve((Ann(30), ItemToItem(5, last=7))), Order(max_k=30))), res)
    assert (p.max_history, p.history_from) == (120, "models")
    history = np.random.default_rng(1).integers(0, ITEMS, 150)
    res.interactions = InteractionStore.from_pairs(np.full(150, 4), history)
    user_vector = res.encoder.encode(4, history)  # the tower reads its last 120
    assert user_vector is not None and not np.array_equal(user_vector, res.encoder.encode(4, history[-50:]))
    _, ids = res.index.query(torch.from_numpy(user_vector[None]), 30)
    ann = PipelineRunner(PipelineSpec((Retrieve((Ann(30),)), Order(max_k=30))), res)
    assert ann.recommend(Query(4, 30)).items.tolist() == ids[0].numpy().tolist()
    declared = PipelineRunner(PipelineSpec((Retrieve((Ann(5),)), Order()), max_history=300), res)
    assert (declared.max_history, declared.history_from) == (300, "declared")
    head = {"retrieve": {"sources": [{"kind": "popular", "k": 5}]}}
    decl = declaration_from_dict({**head, "pipeline": {"max_history": 30}}, "p.toml")
    assert decl.spec.max_history == 30 and declaration_to_dict(decl)["pipeline"]["max_history"] == 30
    assert "max_history" not in declaration_to_dict(declaration_from_dict(head, "p.toml"))["pipeline"]
    for bad in (0, -3, True, 1.5, "50", [50]):
        with pytest.raises(ValueError, match=r"^p.toml \[pipeline\] max_history: must be an integer >= 1 .*, got "):
            declaration_from_dict({**head, "pipeline": {"max_history": bad}}, "p.toml")
    with pytest.raises(ValueError, match=r"^PipelineSpec: max_history must be an integer >= 1, got 0$"):
        PipelineSpec((Retrieve((Popular(5),)), Order()), max_history=0)
