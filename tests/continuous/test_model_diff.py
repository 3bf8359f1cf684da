"""model_diff: diff_rows carries exactly the new and changed rows (bit for bit: -0.0 vs 0.0 counts, NaN equal
to itself), the lost keys and a changed default row, so applying it to the stable rows gives the candidate's;
table_rows lists a model's rows as its bundle holds them; dense_weights leaves the embedding collections out;
write_model_delta writes a delta that reads back to the same updates. Mismatched tables are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.continuous.model_diff import dense_weights, diff_rows, table_rows, write_model_delta
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.serving.bundles.version_delta import read_version_delta


def _rows(
    keys: list[int], values: list[list[float]], default: list[float] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return (
        np.array(keys, np.int64),
        np.array(values, np.float32).reshape(len(keys), -1) if keys else np.zeros((0, 1), np.float32),
        None if default is None else np.array(default, np.float32),
    )


def _apply(stable: tuple[np.ndarray, np.ndarray, np.ndarray | None], update: object) -> dict[int, list[float]]:
    keys, rows, _ = stable
    out = {int(k): r.tolist() for k, r in zip(keys, rows, strict=True)}
    for k in update.deleted:  # type: ignore[attr-defined]
        out.pop(int(k))
    out.update({int(k): r.tolist() for k, r in zip(update.keys, update.rows, strict=True)})  # type: ignore[attr-defined]
    return out


def test_only_new_changed_and_lost_rows_are_carried() -> None:
    stable = {"t": _rows([1, 2, 3, 4], [[1, 1], [2, 2], [0.0, 3], [np.nan, 4]], [0, 0])}
    candidate = {"t": _rows([2, 3, 4, 9], [[2, 2], [-0.0, 3], [np.nan, 4], [9, 9]], [0.5, 0])}
    (update,) = diff_rows(stable, candidate)
    assert update.table == "t"
    assert update.keys.tolist() == [3, 9]  # 3: 0.0 -> -0.0 differs in its bits; 4's NaN is unchanged
    assert update.deleted.tolist() == [1]
    assert update.default is not None and update.default.tolist() == [0.5, 0]
    expected = {int(k): r.tolist() for k, r in zip(candidate["t"][0], candidate["t"][1], strict=True)}
    got = _apply(stable["t"], update)
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])


def test_an_unchanged_model_and_an_empty_stable_table() -> None:
    same = {"t": _rows([5], [[1.0]], [2.0])}
    (update,) = diff_rows(same, same)
    assert update.keys.shape == (0,) and update.deleted.shape == (0,) and update.default is None
    (fresh,) = diff_rows({"t": _rows([], [])}, {"t": _rows([7, 8], [[1.0], [2.0]])})
    assert fresh.keys.tolist() == [7, 8] and fresh.deleted.shape == (0,)


def test_mismatched_tables_are_refused() -> None:
    with pytest.raises(ValueError, match=r"the models have other tables: \['a'\] vs \['b'\]"):
        diff_rows({"a": _rows([1], [[1.0]])}, {"b": _rows([1], [[1.0]])})
    with pytest.raises(ValueError, match="table 'a' has dim 1 in the stable model, 2 now"):
        diff_rows({"a": _rows([1], [[1.0]])}, {"a": _rows([1], [[1.0, 2.0]])})


def _dlrm(seed: int) -> DLRM:
    torch.manual_seed(seed)
    return DLRM(EmbeddingCollection([TableConfig("user", 6, 4), TableConfig("item", 5, 4)]), 2, [8, 4], [8, 1])


def test_table_rows_and_dense_weights_of_a_model() -> None:
    model = _dlrm(0)
    rows = table_rows(model)
    assert sorted(rows) == ["item", "user"]
    keys, values, default = rows["user"]
    assert keys.tolist() == list(range(6)) and values.shape == (6, 4) and default is None
    weights = dense_weights(model)
    collection = {
        f"{name}.{k}" for name, m in model.named_modules() if isinstance(m, EmbeddingCollection) for k in m.state_dict()
    }
    assert collection and set(weights) == set(model.state_dict()) - collection  # everything but the collection's
    for name, value in weights.items():
        assert value is model.state_dict()[name] or torch.equal(value, model.state_dict()[name])


def test_write_model_delta_reads_back_to_the_candidates_rows(tmp_path: Path) -> None:
    stable, candidate = _dlrm(0), _dlrm(0)
    with torch.no_grad():
        candidate.embedding_collections()[0].table_weight("item")[2].add_(1.0)
        for p in candidate.dense_parameters():
            p.mul_(2.0)
    delta = read_version_delta(write_model_delta(stable, candidate, tmp_path / "delta", "1", "id-1"))
    assert (delta.base_version, delta.base_id) == ("1", "id-1")
    by_table = {u.table: u for u in delta.updates}
    assert by_table["item"].keys.tolist() == [2] and by_table["user"].keys.shape == (0,)
    np.testing.assert_array_equal(by_table["item"].rows[0], table_rows(candidate)["item"][1][2])
    for name, value in dense_weights(candidate).items():
        torch.testing.assert_close(delta.dense[name], value)
