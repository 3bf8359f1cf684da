from __future__ import annotations

import math

import pytest

from hugerec.ops.update_rule import RuleKind, UpdateRule


@pytest.mark.parametrize(
    ("kind", "width"),
    [(RuleKind.SGD, 0), (RuleKind.ADAGRAD, 8), (RuleKind.ROWWISE_ADAGRAD, 1), (RuleKind.ADAM, 16), (RuleKind.FTRL, 16)],
)
def test_state_width(kind: RuleKind, width: int) -> None:
    assert UpdateRule(kind, 0.1).state_width(8) == width


def test_adam_step_lr_is_bias_corrected() -> None:
    rule = UpdateRule(RuleKind.ADAM, 0.01, beta1=0.9, beta2=0.999)
    assert rule.step_lr(1) == pytest.approx(0.01 * math.sqrt(0.001) / 0.1)
    assert rule.step_lr(10_000) == pytest.approx(0.01, rel=1e-3)
    assert UpdateRule(RuleKind.SGD, 0.3).step_lr(5) == 0.3


def test_hparams_order() -> None:
    rule = UpdateRule(RuleKind.FTRL, 0.1, eps=1, beta1=2, beta2=3, weight_decay=4, l1=5, l2=6, beta=7, lr_power=-0.5)
    assert rule.hparams().tolist() == [1, 2, 3, 4, 5, 6, 7, -0.5]
