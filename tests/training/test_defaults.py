import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hugerec.models.model_config import DCNv2Config, DeepFMConfig, DLRMConfig, WideAndDeepConfig
from hugerec.training.defaults import (
    MAX_BATCH,
    MAX_EMBEDDING_DIM,
    MIN_BATCH,
    MIN_EMBEDDING_DIM,
    auto_batch_size,
    auto_embedding_dim,
    auto_embedding_dims,
    auto_width,
    fitted_to_data,
)


def test_auto_batch_size_examples() -> None:
    assert [auto_batch_size(n) for n in (1, 8_000, 80_000, 1_000_000, 10**9)] == [32, 128, 512, 2048, 2048]


@given(st.integers(min_value=1, max_value=10**12))
def test_auto_batch_size_is_a_power_of_two_in_range_near_2_sqrt_rows(rows: int) -> None:
    b = auto_batch_size(rows)
    assert MIN_BATCH <= b <= MAX_BATCH and b & (b - 1) == 0
    if MIN_BATCH < b < MAX_BATCH:
        assert abs(math.log2(b) - math.log2(2 * math.sqrt(rows))) <= 0.5


@pytest.mark.parametrize("rows", [0, -3, True, 2.5])
def test_auto_batch_size_refuses_bad_rows(rows: object) -> None:
    with pytest.raises(ValueError, match="rows must be a positive int"):
        auto_batch_size(rows)  # type: ignore[arg-type]


def test_auto_width_examples() -> None:
    assert [auto_width(r) for r in (100, 10_000, 100_000, 1_000_000, 10**9)] == [64, 256, 512, 1024, 1024]
    with pytest.raises(ValueError, match="auto_width: rows must be a positive int, got 0"):
        auto_width(0)


def test_fitted_to_data_narrows_the_defaults_on_small_data() -> None:
    """Paper cut 5: DCN-v2's deep [1024, 1024] on 10,000 rows becomes [256, 256]; a DLRM without dense
    features gets no dense arch, with dense ones a bottom ending at the embedding dim."""
    dcn, notes = fitted_to_data(DCNv2Config(), given=(), rows=10_000, num_dense=3, dim=16)
    assert isinstance(dcn, DCNv2Config) and dcn.deep == (256, 256)
    assert notes == ["model.deep = [256, 256] (default [1024, 1024]: widths <= 256 for 10,000 rows)"]
    dlrm, notes = fitted_to_data(DLRMConfig(), given=(), rows=10_000, num_dense=0, dim=16)
    assert isinstance(dlrm, DLRMConfig) and dlrm.bottom == () and dlrm.top == (256, 256, 256, 256, 1)
    assert notes[0] == "model.bottom = [] (default [512, 256, 64]: no dense features)"
    dlrm, _ = fitted_to_data(DLRMConfig(), given=(), rows=10_000, num_dense=13, dim=16)
    assert isinstance(dlrm, DLRMConfig) and dlrm.bottom == (256, 256, 16)


def test_fitted_to_data_keeps_what_the_user_set_and_large_data_keeps_the_defaults() -> None:
    mine = DCNv2Config(deep=(1024, 1024))
    assert fitted_to_data(mine, given={"deep"}, rows=10_000, num_dense=3, dim=16) == (mine, [])
    mine_dlrm = DLRMConfig(bottom=(8, 16), top=(2048, 1))
    assert fitted_to_data(mine_dlrm, given={"bottom", "top"}, rows=100, num_dense=2, dim=16) == (mine_dlrm, [])
    for config in (DCNv2Config(), DeepFMConfig(), WideAndDeepConfig()):
        assert fitted_to_data(config, given=(), rows=5_000_000, num_dense=3, dim=16) == (config, [])


def test_auto_embedding_dim_at_small_and_large_cardinalities() -> None:
    """6 * C ** 0.25 up to a multiple of 8, from 8 to 64: a flag gets 8, a 1,000-value table 40, large ones 64."""
    cases = {1: 8, 2: 8, 10: 16, 100: 24, 1_000: 40, 5_000: 56, 10_000: 64, 10**6: 64, 10**10: 64}
    assert {c: auto_embedding_dim(c) for c in cases} == cases
    for bad in (0, -1, True, 3.0):
        with pytest.raises(ValueError, match="auto_embedding_dim: cardinality must be a positive int"):
            auto_embedding_dim(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=1, max_value=10**15), st.integers(min_value=1, max_value=10**15))
def test_auto_embedding_dim_is_a_capped_multiple_of_8_growing_with_the_cardinality(a: int, b: int) -> None:
    small, large = sorted((a, b))
    d = auto_embedding_dim(small)
    assert MIN_EMBEDDING_DIM <= d <= MAX_EMBEDDING_DIM and d % 8 == 0
    assert d <= auto_embedding_dim(large)
    if MIN_EMBEDDING_DIM < d < MAX_EMBEDDING_DIM:
        assert d - 8 < 6 * small**0.25 <= d


def test_auto_embedding_dims_one_width_takes_the_largest_tables() -> None:
    cards = {"flag": 2, "city": 1_000, "user": 10**6}
    assert auto_embedding_dims(cards, one_width=False) == {"flag": 8, "city": 40, "user": 64}
    assert auto_embedding_dims(cards, one_width=True) == {"flag": 64, "city": 64, "user": 64}
    assert auto_embedding_dims({"a": 3, "b": 90}, one_width=True) == {"a": 24, "b": 24}
    assert auto_embedding_dims({}, one_width=True) == {}
