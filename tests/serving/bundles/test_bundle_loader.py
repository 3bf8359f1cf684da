"""load_bundle: the state directory belongs to one bundle; tier 2 in process or in Redis; lazy promotion."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.export import export
from hugerec.serving.runtime.inference_protocol import Signature, to_model_inputs
from hugerec.serving.store.cache import CacheConfig


def scores(loaded: Any, toy: Any, batch: Any) -> np.ndarray:
    logits = loaded.model.predict(to_model_inputs(toy.tensors(batch), Signature(4, toy.features)))
    return torch.sigmoid(torch.from_numpy(logits)).numpy()


def test_state_directory_belongs_to_one_bundle(toy: Any, tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    load_bundle(toy.bundle, ServeOptions(state_dir=state)).close()
    other = export(copy.deepcopy(toy.model), tmp_path / "other", version="2")
    with pytest.raises(ValueError, match="belongs to another bundle"):
        load_bundle(other, ServeOptions(state_dir=state))


@pytest.mark.parametrize("tier2", ["memory", "redis"])
def test_tier2_choice_and_lazy_promotion(toy: Any, tmp_path: Path, tier2: str, request: pytest.FixtureRequest) -> None:
    redis_url = request.getfixturevalue("redis_url") if tier2 == "redis" else None
    options = ServeOptions(state_dir=str(tmp_path / "state"), redis_url=redis_url, preload=False)
    loaded = load_bundle(toy.bundle, options)
    try:
        ps = loaded.model.ps
        assert ps.memory.name == tier2
        assert bool(ps.caches) == (tier2 == "redis")  # the cache tier is on by default in front of Redis only
        batch = toy.batch(16, seed=7)
        np.testing.assert_allclose(scores(loaded, toy, batch), toy.offline(batch), rtol=1e-5, atol=1e-6)
        first = ps.stats()
        np.testing.assert_allclose(scores(loaded, toy, batch), toy.offline(batch), rtol=1e-5, atol=1e-6)
        second = ps.stats()
        fell_through = second.keys[3].sum() - first.keys[3].sum()  # tier 3 (RocksDB)
        assert first.hits[3].sum() > 0 and fell_through == 0  # rows came up from RocksDB once, then stayed above
    finally:
        loaded.close()


def test_explicit_cache_config_and_option_checks(toy: Any, tmp_path: Path) -> None:
    loaded = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "s"), cache=CacheConfig(rows=16)))
    try:
        assert set(loaded.model.ps.caches) == {"user", "item"}
    finally:
        loaded.close()
    with pytest.raises(ValueError, match="updates_stream needs"):
        ServeOptions(updates_stream=f"s{uuid.uuid4().hex}")
