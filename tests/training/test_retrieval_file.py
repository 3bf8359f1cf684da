"""The retrieval model file: two-tower and MF round trips, what it refuses, damage named in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.embedding import Adam
from hugerec.models import MatrixFactorization, Similarity, TwoTower, TwoTowerConfig
from hugerec.training import load_model, load_retrieval_model, model_file_task, save_retrieval_model

USERS, ITEMS = 5, 7
OPT = Adam(lr=0.01)
USERS_RAW = np.array([10, 20, 30, 40, 50])
ITEMS_RAW = np.arange(100, 107)
COUNTS = np.array([3, 0, 1, 2, 5, 1, 1])
CSR = (np.array([0, 2, 2, 3, 5, 6]), np.array([0, 4, 1, 2, 6, 3]))


def _models() -> list[TwoTower | MatrixFactorization]:
    torch.manual_seed(0)
    config = TwoTowerConfig(dim=8, embedding_dim=6, user_layers=(12,), recent=(1, 2), max_history=4, similarity=Similarity.COSINE)
    return [TwoTower(config, USERS, ITEMS, OPT), MatrixFactorization(USERS, ITEMS, 4, OPT, temperature=0.5)]


@pytest.mark.parametrize("index", [0, 1])
def test_round_trip(tmp_path: Path, index: int) -> None:
    model = _models()[index]
    path = save_retrieval_model(tmp_path / "model.pt", model, USERS_RAW, ITEMS_RAW, COUNTS, CSR, OPT, {"model": {"type": "x"}})
    assert model_file_task(path) == "retrieval"
    back = load_retrieval_model(path)
    assert type(back.model) is type(model) and back.model_type == ("two_tower" if index == 0 else "mf")
    assert back.spec["model"] == {"type": "x"}
    want, got = model.state_dict(), back.model.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(v, got[k]) for k, v in want.items())
    for a, b in ((back.users_raw, USERS_RAW), (back.items_raw, ITEMS_RAW), (back.item_counts, COUNTS), *zip(back.train_csr, CSR, strict=True)):
        np.testing.assert_array_equal(a, b)
    if isinstance(model, TwoTower):
        assert isinstance(back.model, TwoTower) and back.model.config == model.config
    else:
        assert isinstance(back.model, MatrixFactorization) and back.model.temperature == 0.5


def test_refusals_and_damage(tmp_path: Path) -> None:
    two_tower, mf = _models()
    with pytest.raises(ValueError, match="raw user ids"):
        save_retrieval_model(tmp_path / "a.pt", mf, USERS_RAW[:3], ITEMS_RAW, COUNTS, CSR, OPT)
    with pytest.raises(ValueError, match="train_csr is not 5 users"):
        save_retrieval_model(tmp_path / "a.pt", mf, USERS_RAW, ITEMS_RAW, COUNTS, (CSR[0][:3], CSR[1]), OPT)
    with pytest.raises(ValueError, match="need a TwoTower or a MatrixFactorization"):
        save_retrieval_model(tmp_path / "a.pt", torch.nn.Linear(2, 2), USERS_RAW, ITEMS_RAW, COUNTS, CSR, OPT)  # type: ignore[arg-type]
    path = save_retrieval_model(tmp_path / "m.pt", two_tower, USERS_RAW, ITEMS_RAW, COUNTS, CSR, OPT)
    with pytest.raises(ValueError, match=r"load_model: .*m\.pt is not a hugerec model file"):
        load_model(path)  # a retrieval file is not a ranking model file, and says so
    raw = bytearray(path.read_bytes())
    at = raw.find(USERS_RAW.astype(np.int64).tobytes())  # inside a stored tensor, not the zip's padding
    raw[at : at + 40] = bytes(40)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"m\.pt is damaged") as e:
        load_retrieval_model(path)
    assert "\n" not in str(e.value)
