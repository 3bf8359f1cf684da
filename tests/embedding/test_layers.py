"""hugerec Embedding / EmbeddingBag against torch.nn's: same outputs, same training with sparse SGD."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hugerec.embedding.layers import Embedding, EmbeddingBag
from hugerec.embedding.optimizers import SGD, Adagrad, Adam

BAG_INPUTS = [
    (torch.tensor([1, 2, 2, 3, 2, 4, 9]), torch.tensor([0, 3, 3, 5])),  # an empty bag
    (torch.tensor([[1, 2], [2, 2], [9, 0]]), None),  # 2-D: fixed bags
    (torch.tensor([5]), torch.tensor([0])),  # B = 1
]


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("case", range(len(BAG_INPUTS)))
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_matches_torch(mode: str, padding_idx: int | None, case: int, weighted: bool) -> None:
    if weighted and mode != "sum":
        pytest.skip("torch weighs sum bags only")
    torch.manual_seed(0)
    ref = nn.EmbeddingBag(10, 6, mode=mode, padding_idx=padding_idx, sparse=True)
    ours = EmbeddingBag(10, 6, mode=mode, padding_idx=padding_idx, optimizer=SGD(lr=0.5))
    ours.load_state_dict(ref.state_dict())
    inp, offsets = BAG_INPUTS[case]
    psw = torch.rand(inp.shape) if weighted else None
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for _ in range(3):
        a, b = ref(inp, offsets, psw), ours(inp, offsets, psw)
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
        opt.zero_grad()
        a.pow(2).sum().backward()
        opt.step()
        b.pow(2).sum().backward()
        torch.testing.assert_close(ours.weight, ref.weight, rtol=1e-5, atol=1e-6)
    assert ours.weight.grad is None


def test_embedding_bag_include_last_offset_and_per_sample_weight_grad() -> None:
    torch.manual_seed(0)
    ref = nn.EmbeddingBag(8, 4, mode="sum", include_last_offset=True)
    ours = EmbeddingBag.from_pretrained(ref.weight.detach(), freeze=True, mode="sum", include_last_offset=True)
    inp, offsets = torch.tensor([1, 1, 7, 3]), torch.tensor([0, 2, 2, 4])
    w_ref = torch.rand(4, requires_grad=True)
    w_ours = w_ref.detach().clone().requires_grad_()
    a, b = ref(inp, offsets, w_ref), ours(inp, offsets, w_ours)
    torch.testing.assert_close(b, a)
    grad = torch.randn_like(a)
    a.backward(grad)
    b.backward(grad)
    torch.testing.assert_close(w_ours.grad, w_ref.grad)
    assert torch.equal(ours.weight, ref.weight)  # frozen: no update


@pytest.mark.parametrize("padding_idx", [None, 3, -7])
def test_embedding_matches_torch(padding_idx: int | None) -> None:
    torch.manual_seed(0)
    ref = nn.Embedding(10, 4, padding_idx=padding_idx, sparse=True)
    if padding_idx is not None:
        with torch.no_grad():
            ref.weight[padding_idx] = 1.0  # torch returns the padding row as it is
    ours = Embedding(10, 4, padding_idx=padding_idx, optimizer=SGD(lr=0.1))
    ours.load_state_dict(ref.state_dict())
    x = torch.tensor([[1, 3, 5], [3, 3, 9]])
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        a, b = ref(x), ours(x)
        assert b.shape == (2, 3, 4)
        torch.testing.assert_close(b, a)
        opt.zero_grad()
        a.pow(2).sum().backward()
        opt.step()
        b.pow(2).sum().backward()
        torch.testing.assert_close(ours.weight, ref.weight)


def test_weight_is_a_parameter_sharing_the_rows() -> None:
    emb = Embedding(6, 3)
    assert [n for n, _ in emb.named_parameters()] == ["weight"]
    with torch.no_grad():
        emb.weight[2] = 7.0
    assert emb(torch.tensor([2])).tolist() == [[7.0, 7.0, 7.0]]
    tied = torch.randn(2, 3) @ emb.weight.T  # weight tying: a dense gradient for a torch optimizer
    tied.sum().backward()
    assert emb.weight.grad is not None and emb.weight.grad.shape == (6, 3)


def test_from_pretrained_and_freeze() -> None:
    pre = torch.randn(5, 3)
    frozen = Embedding.from_pretrained(pre)
    assert not frozen.weight.requires_grad
    out = frozen(torch.tensor([0, 4]))
    torch.testing.assert_close(out, pre[[0, 4]])
    trainable = Embedding.from_pretrained(pre, freeze=False, optimizer=Adagrad(lr=1.0))
    trainable(torch.tensor([1])).sum().backward()
    assert not torch.equal(trainable.weight[1], pre[1]) and torch.equal(trainable.weight[0], pre[0])


def test_optimizer_state_in_state_dict() -> None:
    emb = EmbeddingBag(6, 4, mode="sum", optimizer=Adam(lr=0.1))
    emb(torch.tensor([[1, 2]])).sum().backward()
    sd = emb.state_dict()
    assert set(sd) == {"weight", "optimizer.exp_avg", "optimizer.exp_avg_sq", "optimizer.step"}
    other = EmbeddingBag(6, 4, mode="sum", optimizer=Adam(lr=0.1))
    other.load_state_dict(sd)
    for k, v in other.state_dict().items():
        assert torch.equal(v, sd[k]), k
    other.load_state_dict({"weight": torch.zeros(6, 4)})  # a torch layer's state dict: state kept
    assert not other.weight.any() and int(other.state_dict()["optimizer.step"]) == 1


def test_bf16_storage_returns_bf16() -> None:
    emb = EmbeddingBag(6, 4, mode="sum", dtype=torch.bfloat16)
    assert emb.weight.dtype == torch.bfloat16
    out = emb(torch.tensor([[1, 2]]))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out[0], emb.weight[1] + emb.weight[2])


def test_unsupported_options_and_bad_input() -> None:
    with pytest.raises(ValueError, match=r"max_norm=1\.0 is not supported"):
        Embedding(5, 2, max_norm=1.0)
    with pytest.raises(ValueError, match="scale_grad_by_freq=True is not supported"):
        EmbeddingBag(5, 2, scale_grad_by_freq=True)
    with pytest.raises(ValueError, match="mode 'max' is not supported"):
        EmbeddingBag(5, 2, mode="max")
    with pytest.raises(ValueError, match="padding_idx 5 must be within"):
        Embedding(5, 2, padding_idx=5)
    bag = EmbeddingBag(5, 2)
    with pytest.raises(ValueError, match="per_sample_weights needs mode='sum'"):
        bag(torch.tensor([[1]]), per_sample_weights=torch.ones(1, 1))
    with pytest.raises(ValueError, match="offsets must start at 0"):
        bag(torch.tensor([1, 2]), torch.tensor([1]))
    with pytest.raises(ValueError, match="offsets must be None when input is 2-D"):
        bag(torch.tensor([[1, 2]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="id 5 of example 0 is outside"):
        bag(torch.tensor([[5]]))
    with pytest.raises(ValueError, match="negative id -1"):
        Embedding(5, 2, padding_idx=0)(torch.tensor([-1]))
    with pytest.raises(ValueError, match="input must be int32 or int64"):
        Embedding(5, 2)(torch.tensor([1.0]))
