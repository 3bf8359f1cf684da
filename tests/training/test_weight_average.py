from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import DynamicConfig, StorageDtype, TableConfig
from hugerec.training.weight_average import EpochAverage, mean_into, trainable_tensors


class Tiny(nn.Module):
    """Two in-memory tables (fp32 and bf16 rows) and a dense layer; a frozen parameter and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = EmbeddingCollection(
            [TableConfig("a", 7, 4), TableConfig("b", 5, 3, dtype=StorageDtype.BF16)], Adam(lr=0.01)
        )
        self.top = nn.Linear(4, 2)
        self.frozen = nn.Parameter(torch.ones(3), requires_grad=False)
        self.register_buffer("count", torch.zeros(1))


def numbers(model: Tiny) -> dict[str, np.ndarray]:
    """What the average covers, as float64 arrays: the tables' rows and the trainable dense parameters."""
    return {
        "a": model.emb.table_weight("a").double().numpy().copy(),
        "b": model.emb.table_weight("b").double().numpy().copy(),
        "w": model.top.weight.detach().double().numpy().copy(),
        "bias": model.top.bias.detach().double().numpy().copy(),
    }


def scramble(model: Tiny, seed: int) -> None:
    """New values in every tensor: as if an epoch of training had moved them (the optimizer state and buffer too)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("a", "b"):
            w = model.emb.table_weight(name)
            w.copy_(torch.randn(w.shape, generator=g) * 3)
            for state in model.emb.fused_tables.table_state(name).values():
                state.copy_(torch.rand(state.shape, generator=g))
        for p in (model.top.weight, model.top.bias, model.count):
            p.copy_(torch.randn(p.shape, generator=g))


def expected_mean(snapshots: list[dict[str, np.ndarray]], dtypes: dict[str, torch.dtype]) -> dict[str, np.ndarray]:
    """The plain NumPy mean of the snapshots, rounded to each tensor's dtype as the model stores it."""
    out = {}
    for key in snapshots[0]:
        mean = np.mean(np.stack([s[key] for s in snapshots]), axis=0)
        out[key] = torch.from_numpy(mean).to(dtypes[key]).double().numpy()
    return out


DTYPES = {"a": torch.float32, "b": torch.bfloat16, "w": torch.float32, "bias": torch.float32}


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 5), epochs=st.integers(1, 8), mid=st.booleans())
def test_the_average_is_the_numpy_mean_of_the_last_k_epoch_ends(k: int, epochs: int, mid: bool) -> None:
    """K larger than the epochs so far: the mean of those there are. Between epoch ends (mid) the weights as
    they are count as the newest. The raw weights come back after `averaged`, bit for bit; the optimizer
    state, the buffer and the frozen parameter are never touched."""
    model = Tiny()
    tail = EpochAverage(model, k)
    saved = []
    for e in range(epochs):
        scramble(model, e)
        tail.push(e)
        saved.append(numbers(model))
    step = epochs - 1
    if mid:
        scramble(model, 100)
        saved.append(numbers(model))
        step = epochs
    raw = numbers(model)
    state = {n: {f: v.clone() for f, v in model.emb.fused_tables.table_state(n).items()} for n in ("a", "b")}
    count = model.count.clone()
    want = expected_mean(saved[-k:], DTYPES)
    with tail.averaged(step):
        got = numbers(model)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)
    for key, value in numbers(model).items():
        assert np.array_equal(value, raw[key]), key
    for n in ("a", "b"):
        for f, v in model.emb.fused_tables.table_state(n).items():
            assert torch.equal(v, state[n][f])
    assert torch.equal(model.count, count) and torch.equal(model.frozen, torch.ones(3))
    # any k <= K from the same ring
    for smaller in range(1, k + 1):
        with tail.averaged(step, smaller):
            for key, value in expected_mean(saved[-smaller:], DTYPES).items():
                np.testing.assert_allclose(numbers(model)[key], value, rtol=1e-6, atol=1e-7, err_msg=f"{key} k={smaller}")
    tail.load_average(step)  # the end of training: the mean stays in the model
    for key, value in numbers(model).items():
        np.testing.assert_allclose(value, want[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_the_ring_round_trips_through_its_state_dict_and_refuses_another_k_or_model() -> None:
    model = Tiny()
    tail = EpochAverage(model, 3)
    for e in range(4):
        scramble(model, e)
        tail.push(e)
    state = tail.state_dict()
    assert state["steps"] == [1, 2, 3] and len(state["weights"]) == 3
    other = EpochAverage(Tiny(), 3)
    other.load_state_dict(state)
    assert other.steps == tail.steps
    for a, b in zip(other.ring, tail.ring, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match=r"average_epochs: the checkpoint's ring averages 3 epochs, this run 4"):
        EpochAverage(Tiny(), 4).load_state_dict(state)
    bigger = nn.Module()
    bigger.lin = nn.Linear(5, 5)
    with pytest.raises(ValueError, match=r"ring holds tensors of another model"):
        EpochAverage(bigger, 3).load_state_dict(state)


def test_a_push_at_the_same_step_is_taken_once() -> None:
    model = Tiny()
    tail = EpochAverage(model, 2)
    tail.push(5)
    scramble(model, 1)
    tail.push(5)
    assert tail.steps == [5] and len(tail.ring) == 1


def test_disk_and_dynamic_tables_and_bad_k_are_refused_naming_the_key(tmp_path: Path) -> None:
    disk = EmbeddingCollection(
        [TableConfig("d", 10, 4, storage="disk", cache_rows=4, path=str(tmp_path / "d.rows"))], Adam(lr=0.01)
    )
    with pytest.raises(ValueError, match=r"^average_epochs: table 'd' lives on disk"):
        EpochAverage(disk, 2)
    dynamic = EmbeddingCollection([TableConfig("h", 10, 4, dynamic=DynamicConfig())], Adam(lr=0.01))
    with pytest.raises(ValueError, match=r"^average_epochs: table 'h' is dynamic"):
        EpochAverage(dynamic, 2)
    for bad in (1, 0, True, 2.0):
        with pytest.raises(ValueError, match=r"^average_epochs: the epochs to average must be an int >= 2"):
            EpochAverage(Tiny(), bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"a mean of 3 epochs from a ring of 2"):
        EpochAverage(Tiny(), 2).members(0, 3)


def test_a_parameter_over_table_rows_is_averaged_once() -> None:
    """A drop-in layer's Parameter is a view of its fused table: averaged as the table, not twice."""
    from hugerec.embedding.layers import Embedding

    layer = Embedding(6, 4)
    tensors = trainable_tensors(layer)
    assert len(tensors) == 1 and tensors[0].data_ptr() == layer.weight.untyped_storage().data_ptr()


def test_mean_into_chunks_and_non_contiguous_tensors_agree_with_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    import hugerec.training.weight_average as module

    monkeypatch.setattr(module, "CHUNK", 7)  # several chunks, the last one short
    g = torch.Generator().manual_seed(0)
    sources = [torch.randn(5, 6, generator=g) for _ in range(3)]
    target = sources[0].clone()
    mean_into(target, [target, *sources[1:]])
    np.testing.assert_allclose(target.numpy(), np.mean(np.stack([s.double().numpy() for s in sources]), 0), rtol=1e-6, atol=1e-7)
    strided = torch.zeros(6, 5).T  # [5, 6], not contiguous
    mean_into(strided, sources)
    np.testing.assert_allclose(strided.numpy(), np.mean(np.stack([s.double().numpy() for s in sources]), 0), rtol=1e-6, atol=1e-7)
