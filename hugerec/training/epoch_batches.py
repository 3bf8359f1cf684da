"""EpochBatches: a function of the epoch turned into the resumable training data `fit` takes.

    data = EpochBatches(lambda epoch: iter_examples(train, 1024, 50, seed=seed + epoch), length=n_batches)
    fit(model, data, ...)          # one pass per epoch; checkpoints keep (epoch, position)

Each pass calls make(epoch) for the epoch's batches (a new shuffle per epoch, decided by the epoch
alone) and counts the batches it hands out; `state_dict` is that (epoch, position), and a resumed pass
skips the position's batches of make(epoch) (they are made again, not used), so a run killed
mid-epoch continues with the very batch it would have taken next.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class EpochBatches(Generic[T]):
    """make(epoch) -> that epoch's batches; `length` batches per epoch (len() of it; None: unsized)."""

    def __init__(self, make: Callable[[int], Iterable[T]], length: int | None = None) -> None:
        if length is not None and length < 1:
            raise ValueError(f"EpochBatches: length must be >= 1 or None, got {length}")
        self.make, self.length = make, length
        self.epoch = self.position = 0

    def __iter__(self) -> Iterator[T]:
        if self.length is not None and self.position >= self.length:  # a finished epoch moves on to the next
            self.epoch, self.position = self.epoch + 1, 0
        for batch in itertools.islice(self.make(self.epoch), self.position, None):
            self.position += 1
            yield batch
        self.epoch, self.position = self.epoch + 1, 0

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("EpochBatches: built without a length")
        return self.length

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
