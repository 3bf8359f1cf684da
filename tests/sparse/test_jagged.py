from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from hugerec.sparse.jagged import JaggedTensor, lengths_to_offsets, offsets_to_lengths


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**62), 2**62), max_size=4), max_size=5))
def test_round_trips(lists: list[list[int]]) -> None:
    j = JaggedTensor.from_lists(lists)
    assert j.to_lists() == lists and j.batch_size == len(lists)
    assert JaggedTensor.from_offsets(j.values, j.offsets()).to_lists() == lists
    assert offsets_to_lengths(lengths_to_offsets(j.lengths)).tolist() == [len(x) for x in lists]


def test_padded_and_dense() -> None:
    j = JaggedTensor.from_lists([[7, 3], [], [5]])
    assert j.offsets().tolist() == [0, 2, 2, 3]
    assert j.to_padded(padding_value=-1).tolist() == [[7, 3], [-1, -1], [5, -1]]
    assert j.to_padded(max_len=1).tolist() == [[7], [0], [5]]
    assert JaggedTensor.from_dense(torch.tensor([[7, 3], [-1, -1], [5, -1]])).to_lists() == [[7, 3], [], [5]]
    vectors = JaggedTensor(torch.arange(6.0).view(3, 2), torch.tensor([2, 0, 1]))
    assert vectors.to_padded().shape == (3, 2, 2)


def test_errors() -> None:
    with pytest.raises(ValueError, match="lengths sum to 2 but there are 3 values"):
        JaggedTensor(torch.tensor([1, 2, 3]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="2 weights for 3 values"):
        JaggedTensor(torch.tensor([1, 2, 3]), torch.tensor([3]), torch.ones(2))
    with pytest.raises(ValueError, match=r"offsets decrease at position 1 \(3 -> 2\)"):
        offsets_to_lengths(torch.tensor([0, 3, 2]))
    with pytest.raises(ValueError, match="expected \\[B, L\\] ids"):
        JaggedTensor.from_dense(torch.tensor([1, 2]))
