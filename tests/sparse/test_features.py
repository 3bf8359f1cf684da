from __future__ import annotations

import pytest
import torch

from hugerec.sparse.features import SparseFeatures


def example() -> SparseFeatures:
    return SparseFeatures.from_lists({"user": [[7, 3], []], "item": [[1], [4, 5, 9]]})


def test_layout_is_feature_major() -> None:
    f = example()
    assert f.keys == ("user", "item")
    assert f.values.tolist() == [7, 3, 1, 4, 5, 9]
    assert f.lengths.tolist() == [2, 0, 1, 3]
    assert f.offsets().tolist() == [0, 2, 2, 3, 6]
    assert f.batch_size == 2
    assert f.value_ranges() == {"user": (0, 2), "item": (2, 6)}
    assert f["item"].to_lists() == [[1], [4, 5, 9]]
    assert list(f.to_dict()) == ["user", "item"]


def test_constructors_agree() -> None:
    f = example()
    g = SparseFeatures.from_offsets(("user", "item"), f.values, torch.tensor([0, 2, 2, 3, 6]))
    assert torch.equal(g.values, f.values) and torch.equal(g.lengths, f.lengths)
    dense = SparseFeatures.from_dense(
        {
            "user": torch.tensor([[7, 3, -1], [-1, -1, -1]]),
            "item": torch.tensor([[1, -1, -1], [4, 5, 9]]),
        }
    )
    assert torch.equal(dense.values, f.values) and dense.lengths.tolist() == f.lengths.tolist()
    one_hot = SparseFeatures.from_dense({"a": torch.tensor([3, 4])})  # [B] = one id each
    assert one_hot["a"].to_lists() == [[3], [4]]


def test_weights_and_select() -> None:
    f = SparseFeatures.from_lists({"a": [[1, 2], [3]], "b": [[4], []]}, weights={"a": [[0.5, 1], [2]], "b": [[3], []]})
    assert f.weights is not None and f.weights.tolist() == [0.5, 1, 2, 3]
    s = f.select(["b", "a"])
    assert s.keys == ("b", "a") and s.values.tolist() == [4, 1, 2, 3]
    assert s.weights is not None and s.weights.tolist() == [3, 0.5, 1, 2]
    assert s.lengths.tolist() == [1, 0, 2, 1]


def test_empty_features() -> None:
    f = SparseFeatures.from_lists({})
    assert f.keys == () and f.batch_size == 0
    empty_bags = SparseFeatures.from_lists({"a": [[], []]})
    assert empty_bags.values.numel() == 0 and empty_bags.batch_size == 2


def test_errors() -> None:
    v, n = torch.tensor([1, 2]), torch.tensor([1, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"duplicate feature names \['a'\]"):
        SparseFeatures(("a", "a"), v, n)
    with pytest.raises(ValueError, match="values must be int64"):
        SparseFeatures(("a",), v.to(torch.int32), n)
    with pytest.raises(ValueError, match="lengths sum to 3 but there are 2 values"):
        SparseFeatures(("a",), v, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="negative length -1 for feature 'b', example 0"):
        SparseFeatures(("a", "b"), v, torch.tensor([2, 1, -1, 0]))
    with pytest.raises(ValueError, match="not a multiple of the 2 features"):
        SparseFeatures(("a", "b"), v, torch.tensor([1, 1, 0]))
    with pytest.raises(ValueError, match="weights shape"):
        SparseFeatures(("a",), v, n, torch.ones(3))
    with pytest.raises(ValueError, match="different batch sizes"):
        SparseFeatures.from_lists({"a": [[1]], "b": [[1], [2]]})
    with pytest.raises(ValueError, match="offsets must start at 0"):
        SparseFeatures.from_offsets(("a",), v, torch.tensor([1, 2]))
    with pytest.raises(KeyError, match="unknown feature 'c'"):
        example()["c"]
