import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hugerec.models.model_config import DCNv2Config, DeepFMConfig, DLRMConfig, WideAndDeepConfig
from hugerec.training.defaults import MAX_BATCH, MIN_BATCH, auto_batch_size, auto_width, fitted_to_data


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
