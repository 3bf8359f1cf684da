"""ModelInputs: slicing rows and concatenating requests give the same examples as building them at once, for
the jagged layout and the one-id block (kept as one block when every part has it); inline vectors missing in
a part become NaN rows; a misshapen one-id block is refused naming its shape."""

from __future__ import annotations

import numpy as np
import pytest

from hugerec.serving.runtime.model_inputs import ModelInputs


def _jagged(b: int, seed: int) -> ModelInputs:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 3, b).astype(np.int32)  # empty bags included
    values = rng.integers(0, 100, int(lengths.sum())).astype(np.int64)
    return ModelInputs(rng.standard_normal((b, 2)).astype(np.float32), {"item": (values, lengths)})


def _examples(inputs: ModelInputs) -> list[tuple[list[float], dict[str, list[int]]]]:
    """Each example's dense row and id lists: the reference every layout must give."""
    out = []
    offsets = {f: np.concatenate([[0], np.cumsum(inputs.ids[f][1])]) for f in inputs.ids}
    for b in range(inputs.batch_size):
        ids = {f: inputs.ids[f][0][offsets[f][b] : offsets[f][b + 1]].tolist() for f in inputs.ids}
        out.append((inputs.dense[b].tolist(), ids))
    return out


def test_rows_and_concat_of_jagged_inputs() -> None:
    parts = [_jagged(3, 0), _jagged(1, 1), _jagged(4, 2)]
    merged = ModelInputs.concat(parts)
    assert merged.batch_size == 8 and merged.one_id is None
    assert _examples(merged) == [e for p in parts for e in _examples(p)]
    assert _examples(merged.rows(2, 5)) == _examples(merged)[2:5]
    assert merged.rows(4, 4).batch_size == 0
    assert ModelInputs.concat([parts[0]]) is parts[0]


def test_one_id_blocks_stay_one_block() -> None:
    one = np.array([[1, 2, 3], [10, 20, 30]], np.int64)  # [F=2, B=3]
    a = ModelInputs.from_one_id(np.zeros((3, 1), np.float32), ("user", "item"), one)
    assert list(a.ids) == ["user", "item"] and len(a.ids) == 2
    values, lengths = a.ids["item"]
    assert values.tolist() == [10, 20, 30] and lengths.tolist() == [1, 1, 1]
    b = ModelInputs.from_one_id(np.ones((2, 1), np.float32), ("user", "item"), np.array([[4, 5], [40, 50]], np.int64))
    merged = ModelInputs.concat([a, b])
    assert merged.one_id is not None
    np.testing.assert_array_equal(merged.one_id, [[1, 2, 3, 4, 5], [10, 20, 30, 40, 50]])
    part = merged.rows(1, 4)
    assert part.one_id is not None and part.one_id.tolist() == [[2, 3, 4], [20, 30, 40]]
    assert _examples(part) == _examples(merged)[1:4]


def test_mixed_layouts_concatenate_as_jagged() -> None:
    block = ModelInputs.from_one_id(np.zeros((2, 2), np.float32), ("item",), np.array([[7, 8]], np.int64))
    jagged = _jagged(3, 5)
    merged = ModelInputs.concat([block, jagged])
    assert merged.one_id is None
    assert _examples(merged) == _examples(block) + _examples(jagged)


def test_a_part_without_an_inline_vector_gets_nan_rows() -> None:
    a = ModelInputs(np.zeros((2, 1), np.float32), {}, vectors={"emb": np.ones((2, 3), np.float32)})
    b = ModelInputs(np.zeros((1, 1), np.float32), {})
    merged = ModelInputs.concat([b, a])
    vec = merged.vectors["emb"]
    assert vec.shape == (3, 3) and np.isnan(vec[0]).all() and (vec[1:] == 1).all()
    assert merged.rows(1, 2).vectors["emb"].tolist() == [[1.0, 1.0, 1.0]]


@pytest.mark.parametrize(
    ("one_id", "message"),
    [
        (np.zeros((2, 3), np.int32), r"need int64 ids \[2, 3\], got int32 \[2, 3\]"),
        (np.zeros((2, 4), np.int64), r"need int64 ids \[2, 3\], got int64 \[2, 4\]"),
        (np.zeros(6, np.int64), r"need int64 ids \[2, 3\], got int64 \[6\]"),
    ],
)
def test_a_misshapen_one_id_block_is_refused(one_id: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelInputs.from_one_id(np.zeros((3, 1), np.float32), ("a", "b"), one_id)
