"""UserEncoder: one user's vector online equals the model's own user tower (user_vectors) for a matrix
factorisation and for two-towers with and without the user id; raw ids are mapped, unknown ones skipped; the
file round-trips to the same vectors; bad raw-id maps, side features and foreign files are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.serving.pipeline.encoder import UserEncoder
from hugerec.sparse.jagged import JaggedTensor


def _two_tower(use_user_id: bool = True) -> TwoTower:
    torch.manual_seed(0)
    config = TwoTowerConfig(
        dim=8, embedding_dim=8, user_layers=(16,), max_history=4, recent=(1,), use_user_id=use_user_id
    )
    return TwoTower(config, 20, 30)


def test_matrix_factorisation_vectors_are_its_user_rows() -> None:
    torch.manual_seed(0)
    enc = UserEncoder(MatrixFactorization(10, 12, 4), users_raw=np.arange(10) + 100)
    got = enc.encode(103, np.zeros(0, np.int64))
    assert got is not None
    np.testing.assert_allclose(got, enc.reference(3, np.zeros(0, np.int64)), rtol=1e-6)
    assert enc.encode(3, np.zeros(0, np.int64)) is None  # the dense id is not a raw id here
    assert enc.item_vectors().shape == (12, 4)


def test_a_two_tower_without_the_user_id_needs_a_history() -> None:
    enc = UserEncoder(_two_tower(use_user_id=False))
    assert enc.encode(None, np.zeros(0, np.int64)) is None
    assert enc.encode(None, np.array([999])) is None  # only unknown items: nothing to go on
    history = np.array([3, 7, 7, 29, 1])
    got = enc.encode(None, history)
    assert got is not None and got.shape == (8,) and got.dtype == np.float32
    np.testing.assert_allclose(got, enc.reference(0, history), rtol=1e-5, atol=1e-6)


def test_the_file_round_trips_to_the_same_vectors(tmp_path: Path) -> None:
    for model in (_two_tower(), MatrixFactorization(20, 30, 8)):
        enc = UserEncoder(model, np.arange(20) * 2, np.arange(30) + 50)
        again = UserEncoder.load(enc.save(tmp_path / "encoder.pt"))
        np.testing.assert_array_equal(again.users_raw, enc.users_raw)
        np.testing.assert_array_equal(again.items_raw, enc.items_raw)
        for user, hist in ((0, np.array([50, 51])), (38, np.zeros(0, np.int64))):
            a, b = enc.encode(user, hist), again.encode(user, hist)
            assert a is not None and b is not None
            np.testing.assert_allclose(b, a, rtol=1e-6)
        np.testing.assert_allclose(again.item_vectors(), enc.item_vectors(), rtol=1e-6)


def test_bad_raw_id_maps_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"users_raw must hold 20 distinct ids \(one per row of the model\), got shape \(19,\)"
    ):
        UserEncoder(_two_tower(), users_raw=np.arange(19))
    with pytest.raises(ValueError, match="items_raw must hold 30 distinct ids"):
        UserEncoder(_two_tower(), items_raw=np.zeros(30, np.int64))


def test_side_features_are_refused() -> None:
    config = TwoTowerConfig(
        dim=4, embedding_dim=4, user_layers=(), max_history=0, recent=(), user_features=(("age", 5),)
    )
    with pytest.raises(ValueError, match="two-towers with static side features cannot be served in a pipeline yet"):
        UserEncoder(
            TwoTower(
                config, 5, 5, user_features={"age": JaggedTensor(torch.arange(5) % 5, torch.ones(5, dtype=torch.int32))}
            )
        )


def test_a_foreign_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    torch.save({"spec": '{"type": "knn"}', "state": {}}, path)
    with pytest.raises(ValueError, match=f"UserEncoder.load: {path} is not a pipeline user encoder"):
        UserEncoder.load(path)
