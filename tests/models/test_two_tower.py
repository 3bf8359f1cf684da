"""TwoTower: forward and one SGD step == a plain-torch model (nn.EmbeddingBag + the same MLPs); config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hugerec as hr
from hugerec.embedding.table_config import DynamicConfig
from hugerec.models.two_tower import Similarity, TwoTower, TwoTowerConfig, recent_tail
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.losses import sampled_softmax


def _bag(weight: torch.Tensor, mode: str) -> nn.EmbeddingBag:
    bag = nn.EmbeddingBag(weight.shape[0], weight.shape[1], mode=mode, sparse=True)
    bag.weight.data.copy_(weight)
    return bag


def _jagged(lists: list[list[int]]) -> JaggedTensor:
    return JaggedTensor(
        torch.tensor([i for x in lists for i in x], dtype=torch.int64), torch.tensor([len(x) for x in lists], dtype=torch.int64)
    )


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)[:-1]])


@pytest.mark.parametrize("similarity", list(Similarity))
def test_forward_and_sgd_step_match_plain_torch(similarity: Similarity) -> None:
    torch.manual_seed(0)
    lr = 0.5
    cfg = TwoTowerConfig(dim=4, embedding_dim=3, user_layers=(5,), max_history=3, recent=(1,), similarity=similarity,
                         temperature=0.7, user_features=(("age", 4),), item_features=(("genre", 6),))
    ages = _jagged([[1], [3], [0], [2], [1]])
    genres = _jagged([[0, 1], [2], [], [5, 4, 3], [1], [0], [2]])
    model = TwoTower(cfg, num_users=5, num_items=7, optimizer=hr.SGD(lr=lr), user_features={"age": ages},
                     item_features={"genre": genres})
    ue, ie = model.user_embedding, model.item_embedding
    ref = {name: _bag(c.table_weight(name).clone(), "mean" if name not in ("user_id", "item_id") else "sum")
           for c, names in ((ue, ("user_id", "history", "age")), (ie, ("item_id", "genre"))) for name in names}
    users = torch.tensor([0, 3, 4])
    history = _jagged([[1, 2, 6, 5], [], [0]])
    items = torch.tensor([2, 6, 2, 1])  # 3 positives (2 repeated as an accidental hit) + 1 negative
    q = model.user_vectors(users, history)
    v = model.item_vectors(items)
    loss = sampled_softmax(q, v[:3], items[:3], v[3:], items[3:], None, True, cfg.temperature)
    loss.backward()

    # plain torch: the same computation from nn.EmbeddingBag and the model's own MLP weights (copied)
    user_mlp, item_mlp = [m for m in (model.user_mlp, model.item_mlp)]
    assert item_mlp is not None
    long_v, long_l = recent_tail(history, 3)
    rec_v, rec_l = recent_tail(history, 1)
    age_rows = [ages.values[ages.lengths.cumsum(0)[u] - 1] for u in users]
    x_user = torch.cat([
        ref["user_id"](users, torch.arange(3)),
        ref["history"](long_v, _offsets(long_l)),
        ref["history"](rec_v, _offsets(rec_l)),  # recent1
        ref["age"](torch.stack(age_rows), torch.arange(3)),
    ], dim=1)
    g_off = torch.cat([torch.zeros(1, dtype=torch.int64), genres.lengths.cumsum(0)])
    g_vals = torch.cat([genres.values[g_off[i]:g_off[i + 1]] for i in items])
    x_item = torch.cat([ref["item_id"](items, torch.arange(4)), ref["genre"](g_vals, _offsets(genres.lengths[items]))], dim=1)
    ref_q, ref_v = user_mlp.layers(x_user), item_mlp.layers(x_item)
    if similarity is Similarity.COSINE:
        ref_q, ref_v = F.normalize(ref_q, dim=1), F.normalize(ref_v, dim=1)
    torch.testing.assert_close(q.detach(), ref_q.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v.detach(), ref_v.detach(), rtol=1e-5, atol=1e-6)
    ref_loss = sampled_softmax(ref_q, ref_v[:3], items[:3], ref_v[3:], items[3:], None, True, cfg.temperature)
    torch.testing.assert_close(loss.detach(), ref_loss.detach())
    bags = list(ref.values())
    grads = torch.autograd.grad(ref_loss, [b.weight for b in bags])
    for (name, bag), g in zip(ref.items(), grads, strict=True):
        coll = ue if name in ("user_id", "history", "age") else ie
        want = bag.weight.detach() - lr * g.to_dense()
        torch.testing.assert_close(coll.table_weight(name), want, rtol=1e-5, atol=1e-6, msg=name)


def test_empty_history_and_mlp_less_item_tower() -> None:
    model = TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, user_layers=()), num_users=3, num_items=4)
    assert model.item_mlp is None
    q = model.user_vectors(torch.tensor([0, 1]), _jagged([[], []]))
    assert q.shape == (2, 8) and torch.isfinite(q).all()
    with pytest.raises(ValueError, match="2 users but 1 histories"):
        model.user_vectors(torch.tensor([0, 1]), _jagged([[1]]))


def test_dynamic_user_table_takes_raw_ids() -> None:
    model = TwoTower(TwoTowerConfig(dim=4, embedding_dim=4), num_users=16, num_items=5, dynamic_users=DynamicConfig())
    q = model.user_vectors(torch.tensor([10**12, 7]), _jagged([[1], [2, 3]]))
    assert q.shape == (2, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"similarity": "euclid"}, "similarity must be one of"),
        ({"recent": (10,), "max_history": 5}, "recent <= max_history"),
        ({"recent": (2, 2)}, "distinct windows"),
        ({"temperature": 0.0}, "temperature"),
        ({"user_features": (("history", 3),)}, "side feature names"),
        ({"use_user_id": False, "max_history": 0, "recent": ()}, "no input"),
    ],
)
def test_config_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TwoTowerConfig(**kwargs)  # type: ignore[arg-type]  # wrong values on purpose


def test_side_feature_rows_checked() -> None:
    with pytest.raises(ValueError, match="has 2 rows, expected 3"):
        TwoTower(TwoTowerConfig(user_features=(("age", 3),)), num_users=3, num_items=2, user_features={"age": _jagged([[0], [1]])})


def test_item_tower_vector_features_match_plain_torch() -> None:
    """Item vectors (frozen rows, item 2 without one: zeros + flag) -> a LayerNorm written out by hand
    -> Linear, beside the item-id embedding -> the item MLP; a training step moves the LayerNorm and the
    projection, never the frozen rows; the config takes the dicts of a TOML file."""
    torch.manual_seed(0)
    cfg = TwoTowerConfig(dim=4, embedding_dim=3, user_layers=(), max_history=2, recent=(),
                         vectors=({"name": "text", "feature": "item_id", "dim": 5},))  # type: ignore[arg-type]
    model = TwoTower(cfg, num_users=3, num_items=6, optimizer=hr.SGD(lr=0.5))
    assert model.vector_arch is not None and model.item_mlp is not None
    rows = torch.randn(6, 6)
    rows[:, 5] = 0.0
    rows[2] = 0.0
    rows[2, 5] = 1.0  # the missing flag
    model.vector_arch.load_rows("text", rows)
    items = torch.tensor([2, 0, 5, 0])
    v = model.item_vectors(items)
    norm, proj = model.vector_arch.norms[0], model.vector_arch.projections[0]
    x = rows[items, :5]
    mean, var = x.mean(1, keepdim=True), x.var(1, unbiased=False, keepdim=True)
    normed = (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias
    projected = torch.cat([normed, rows[items, 5:]], dim=1) @ proj.weight.T + proj.bias
    item_emb = model.item_embedding.table_weight("item_id")[items]
    want = model.item_mlp.layers(torch.cat([item_emb, projected], dim=1))
    torch.testing.assert_close(v, want, rtol=1e-5, atol=1e-6)
    before = (norm.weight.detach().clone(), proj.weight.detach().clone())
    q = model.user_vectors(torch.tensor([0, 1, 2, 0]), _jagged([[1], [], [3, 4], [5]]))
    (q * v).sum().backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
    assert not torch.equal(norm.weight, before[0]) and not torch.equal(proj.weight, before[1])
    frozen = model.vector_arch.collection.table_weight("vector_text")
    assert torch.equal(frozen, rows)
    with pytest.raises(ValueError, match="keyed by 'item_id', got \\['user_id'\\]"):
        TwoTowerConfig(vectors=({"name": "t", "feature": "user_id", "dim": 5},))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"TwoTowerConfig: vectors\[0\]: unknown keys \['size'\]"):
        TwoTowerConfig(vectors=({"name": "t", "feature": "item_id", "size": 5},))  # type: ignore[arg-type]
