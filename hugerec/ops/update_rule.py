"""The sparse optimizer update rules as plain numbers the kernels understand.

`hugerec.embedding` turns its optimizer dataclasses into an `UpdateRule` (ops sits left of
embedding in the layering, so it cannot see them). The kernels pick the rule once per row, by
`kind`, outside the loop over D.

Optimizer state per row, fp32, in this column order (S = state width):
    SGD              none                                      S = 0
    ADAGRAD          sum of squared gradients    [0:D]         S = D
    ROWWISE_ADAGRAD  mean over D of squared grads [0]          S = 1
    ADAM             exp_avg [0:D], exp_avg_sq [D:2D]          S = 2D
    FTRL             z [0:D], n [D:2D]                         S = 2D

Per step every table gets its own learning rate (`lrs` in the kernels): `lr` for every rule but
Adam, whose bias correction `lr * sqrt(1 - beta2^t) / (1 - beta1^t)` depends on the table's step t.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class RuleKind(enum.IntEnum):
    SGD = 0
    ADAGRAD = 1
    ROWWISE_ADAGRAD = 2
    ADAM = 3
    FTRL = 4


@dataclass(frozen=True)
class UpdateRule:
    """One sparse update rule and its hyper-parameters (unused ones stay 0)."""

    kind: RuleKind
    lr: float
    eps: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    weight_decay: float = 0.0
    l1: float = 0.0
    l2: float = 0.0
    beta: float = 0.0
    lr_power: float = 0.0

    def state_width(self, dim: int) -> int:
        match self.kind:
            case RuleKind.SGD:
                return 0
            case RuleKind.ADAGRAD:
                return dim
            case RuleKind.ROWWISE_ADAGRAD:
                return 1
            case RuleKind.ADAM | RuleKind.FTRL:
                return 2 * dim

    def step_lr(self, step: int) -> float:
        """Learning rate of a table's `step`-th update (1-based)."""
        if self.kind is RuleKind.ADAM:
            return self.lr * math.sqrt(1.0 - self.beta2**step) / (1.0 - self.beta1**step)
        return self.lr

    def hparams(self) -> np.ndarray:
        """[8] float64 in the order the Numba kernels read: eps, beta1, beta2, weight_decay, l1, l2, beta, lr_power."""
        return np.array(
            [self.eps, self.beta1, self.beta2, self.weight_decay, self.l1, self.l2, self.beta, self.lr_power],
            dtype=np.float64,
        )
