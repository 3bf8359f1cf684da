"""Sparse optimizers, applied to the touched rows inside the backward pass.

Each is a frozen dataclass: plain data, JSON round-trip, consumed by one `match` in the
kernels' dispatch. Semantics are *lazy* (as torch's SparseAdam / sparse Adagrad): a row that no
id touched in a step keeps its weights and its optimizer state unchanged.

`weight_decay` (every optimizer): row-wise L2, `g += weight_decay * w`, applied to the touched
rows only (a row pays decay only in the steps it is used, like FBGEMM's L2 mode).

State per row (stored beside the weights, fp32):
    SGD             none
    Adagrad         sum of squared gradients           [D]
    RowWiseAdagrad  mean over D of squared gradients   [1]
    Adam            first and second moments           [2D]   (+ one step counter per table)
    Ftrl            z and n accumulators               [2D]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


def _check(name: str, **values: float) -> None:
    for key, v in values.items():
        if not v >= 0:  # also catches NaN
            raise ValueError(f"{name}: {key} must be >= 0, got {v}")


@dataclass(frozen=True)
class SGD:
    """w -= lr * g"""

    lr: float = 0.01  # learning rate of the rows
    weight_decay: float = 0.0  # L2 penalty added to the gradient of each touched row (w * weight_decay)

    def __post_init__(self) -> None:
        _check("SGD", lr=self.lr, weight_decay=self.weight_decay)


@dataclass(frozen=True)
class Adagrad:
    """s += g*g;  w -= lr * g / (sqrt(s) + eps)   (torch.optim.Adagrad's sparse path)."""

    lr: float = 0.01  # learning rate of the rows
    eps: float = 1e-10  # added to sqrt(s) in the denominator
    initial_accumulator_value: float = 0.0  # the sums s start at this value (and return to it on a reset)
    weight_decay: float = 0.0  # L2 penalty added to the gradient of each touched row (w * weight_decay)

    def __post_init__(self) -> None:
        _check(
            "Adagrad",
            lr=self.lr,
            eps=self.eps,
            initial_accumulator_value=self.initial_accumulator_value,
            weight_decay=self.weight_decay,
        )


@dataclass(frozen=True)
class RowWiseAdagrad:
    """s += mean(g*g) over the row;  w -= lr * g / (sqrt(s) + eps)   (FBGEMM's EXACT_ROWWISE_ADAGRAD)."""

    lr: float = 0.01  # learning rate of the rows
    eps: float = 1e-8  # added to sqrt(s) in the denominator
    initial_accumulator_value: float = 0.0  # each row's sum s starts at this value (and returns to it on a reset)
    weight_decay: float = 0.0  # L2 penalty added to the gradient of each touched row (w * weight_decay)

    def __post_init__(self) -> None:
        _check(
            "RowWiseAdagrad",
            lr=self.lr,
            eps=self.eps,
            initial_accumulator_value=self.initial_accumulator_value,
            weight_decay=self.weight_decay,
        )


@dataclass(frozen=True)
class Adam:
    """Lazy Adam, exactly torch.optim.SparseAdam on the touched rows.

    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  t = steps taken by the table
    w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
    """

    lr: float = 0.001  # learning rate of the rows
    beta1: float = 0.9  # decay of the first moment m
    beta2: float = 0.999  # decay of the second moment v
    eps: float = 1e-8  # added to sqrt(v) in the denominator
    weight_decay: float = 0.0  # L2 penalty added to the gradient of each touched row (w * weight_decay)

    def __post_init__(self) -> None:
        _check("Adam", lr=self.lr, eps=self.eps, weight_decay=self.weight_decay)
        for key, b in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Adam: {key} must be in [0, 1), got {b}")


@dataclass(frozen=True)
class Ftrl:
    """FTRL-Proximal (McMahan et al. 2013; TensorFlow's / HugeCTR's), per coordinate.

    n' = n + g^2;  sigma = (n'^(-lr_power) - n^(-lr_power)) / lr;  z += g - sigma * w;  n = n'
    w = 0 if |z| <= l1 else (sign(z) * l1 - z) / ((beta + n^(-lr_power)) / lr + 2 * l2)
    """

    lr: float = 0.05  # learning rate (alpha in McMahan et al.)
    lr_power: float = -0.5  # the exponent of the accumulated squared gradients n (-0.5: 1 / sqrt(n)); <= 0
    l1: float = 0.0  # L1 strength: a coordinate with |z| <= l1 is exactly 0 (sparse weights)
    l2: float = 0.0  # L2 strength
    beta: float = 0.0  # added to n^(-lr_power) in the denominator (beta in McMahan et al.)
    initial_accumulator_value: float = 0.1  # n starts at this value (> 0: n^(-lr_power) is finite)
    weight_decay: float = 0.0  # L2 penalty added to the gradient of each touched row (w * weight_decay)

    def __post_init__(self) -> None:
        _check("Ftrl", lr=self.lr, l1=self.l1, l2=self.l2, beta=self.beta, weight_decay=self.weight_decay)
        if self.lr <= 0:
            raise ValueError(f"Ftrl: lr must be > 0, got {self.lr}")
        if self.lr_power > 0:
            raise ValueError(f"Ftrl: lr_power must be <= 0, got {self.lr_power}")
        if self.initial_accumulator_value <= 0 and self.lr_power != 0:
            raise ValueError(f"Ftrl: initial_accumulator_value must be > 0, got {self.initial_accumulator_value}")


Optimizer = SGD | Adagrad | RowWiseAdagrad | Adam | Ftrl
_BY_NAME: dict[str, type] = {
    "sgd": SGD,
    "adagrad": Adagrad,
    "rowwise_adagrad": RowWiseAdagrad,
    "adam": Adam,
    "ftrl": Ftrl,
}


def optimizer_name(opt: Optimizer) -> str:
    match opt:
        case SGD():
            return "sgd"
        case Adagrad():
            return "adagrad"
        case RowWiseAdagrad():
            return "rowwise_adagrad"
        case Adam():
            return "adam"
        case Ftrl():
            return "ftrl"


def state_width(opt: Optimizer, dim: int) -> int:
    """fp32 optimizer-state values stored per row."""
    match opt:
        case SGD():
            return 0
        case Adagrad():
            return dim
        case RowWiseAdagrad():
            return 1
        case Adam() | Ftrl():
            return 2 * dim


def optimizer_to_dict(opt: Optimizer) -> dict[str, Any]:
    return {"type": optimizer_name(opt), **asdict(opt)}


def optimizer_from_dict(d: dict[str, Any]) -> Optimizer:
    d = dict(d)
    kind = d.pop("type", None)
    if kind not in _BY_NAME:
        raise ValueError(f"unknown optimizer type {kind!r}; expected one of {sorted(_BY_NAME)}")
    try:
        opt: Optimizer = _BY_NAME[kind](**d)
    except TypeError as e:
        raise ValueError(f"optimizer {kind!r}: {e}") from None
    return opt
