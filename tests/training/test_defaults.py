import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hugerec.training.defaults import MAX_BATCH, MIN_BATCH, auto_batch_size


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
