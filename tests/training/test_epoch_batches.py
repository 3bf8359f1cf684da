"""EpochBatches: each pass is make(epoch), the epoch counting up; its (epoch, position) state resumes a pass
mid-epoch at the very batch it would have taken next; a finished sized epoch moves on; bad lengths refused."""

from __future__ import annotations

import pytest

from hugerec.training.epoch_batches import EpochBatches


def _make(epoch: int) -> list[tuple[int, int]]:
    return [(epoch, i) for i in range(3)]


def test_each_pass_is_the_next_epoch() -> None:
    data = EpochBatches(_make, length=3)
    assert list(data) == _make(0) and list(data) == _make(1)
    assert data.state_dict() == {"epoch": 2, "position": 0} and len(data) == 3


def test_a_pass_resumes_at_the_next_batch() -> None:
    data = EpochBatches(_make, length=3)
    it = iter(data)
    assert next(it) == (0, 0) and next(it) == (0, 1)
    state = data.state_dict()
    assert state == {"epoch": 0, "position": 2}
    resumed = EpochBatches(_make, length=3)
    resumed.load_state_dict(state)
    assert list(resumed) == [(0, 2)] and list(resumed) == _make(1)


def test_a_finished_sized_epoch_moves_on() -> None:
    data = EpochBatches(_make, length=3)
    data.load_state_dict({"epoch": 4, "position": 3})  # saved after the last batch of epoch 4
    assert list(data) == _make(5)


def test_unsized_and_empty_epochs() -> None:
    data: EpochBatches[int] = EpochBatches(lambda epoch: range(epoch))
    assert list(data) == [] and list(data) == [0] and list(data) == [0, 1]
    with pytest.raises(TypeError, match="built without a length"):
        len(data)
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"length must be >= 1 or None, got {bad}"):
            EpochBatches(_make, length=bad)
