import pytest

from hugerec.training.schedule import Schedule


def test_constant_by_default() -> None:
    s = Schedule()
    assert [s.factor(i) for i in (0, 1, 10**6)] == [1.0, 1.0, 1.0]


def test_warmup_then_polynomial_decay() -> None:
    s = Schedule(warmup_steps=4, decay_start=10, decay_steps=8, power=2.0, end_factor=0.0)
    assert [s.factor(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.factor(4) == s.factor(9) == 1.0
    assert s.factor(10) == 1.0
    assert s.factor(14) == pytest.approx((4 / 8) ** 2)
    assert s.factor(18) == 0.0
    assert s.factor(1000) == 0.0


def test_end_factor_is_a_floor() -> None:
    s = Schedule(decay_start=0, decay_steps=10, power=1.0, end_factor=0.3)
    assert s.factor(5) == pytest.approx(0.5)
    assert s.factor(8) == pytest.approx(0.3)
    assert s.factor(50) == pytest.approx(0.3)


def test_mlperf_preset() -> None:
    s = Schedule.mlperf_dlrm()
    assert (s.warmup_steps, s.decay_start, s.decay_steps, s.power) == (2750, 49315, 27772, 2.0)
    assert s.factor(0) == pytest.approx(1 / 2750)
    assert s.factor(2749) == 1.0
    assert s.factor(49315 + 27772) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"warmup_steps": 10, "decay_start": 5, "decay_steps": 3}, "decay_start"),
        ({"power": 0.0}, "power"),
        ({"end_factor": 1.5}, "end_factor"),
    ],
)
def test_validation(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Schedule(**kwargs)  # type: ignore[arg-type]


def test_decay_epochs_becomes_decay_steps() -> None:
    s = Schedule(decay_epochs=2.0, power=1.0).in_steps(5)
    assert (s.decay_steps, s.decay_epochs) == (10, 0.0)
    assert s.factor(5) == pytest.approx(0.5) and s.factor(10) == 0.0
    assert Schedule(decay_epochs=0.01).in_steps(5).decay_steps == 1  # never a zero-length decay
    assert Schedule(decay_steps=7).in_steps(None) == Schedule(decay_steps=7)  # nothing to convert
    with pytest.raises(ValueError, match="needs training data with a length"):
        Schedule(decay_epochs=1.0).in_steps(None)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"decay_epochs": -1.0}, "decay_epochs"), ({"decay_epochs": 1.0, "decay_steps": 5}, "not both")],
)
def test_decay_epochs_validation(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Schedule(**kwargs)  # type: ignore[arg-type]


def test_sparse_is_off_by_default_and_on_in_the_mlperf_policy() -> None:
    assert not Schedule().sparse and not Schedule(decay_epochs=1.0, power=1.0).sparse
    assert Schedule.mlperf_dlrm().sparse  # the MLPerf reference decays the embeddings' lr too
    with pytest.raises(ValueError, match="sparse must be true or false, got 1"):
        Schedule(sparse=1)  # type: ignore[arg-type]
