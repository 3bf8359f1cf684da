"""The sparse optimizers as data and as one step: each round-trips through JSON, declares its per-row state
width, refuses bad hyper-parameters naming them; one step on one looked-up row follows the formula of its
docstring (computed here by hand in float64), weight decay included, and a row no id touched keeps its
weights and state (lazy semantics)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import (
    SGD,
    Adagrad,
    Adam,
    Ftrl,
    Optimizer,
    RowWiseAdagrad,
    optimizer_from_dict,
    optimizer_name,
    optimizer_to_dict,
    state_width,
)
from hugerec.embedding.table_config import TableConfig
from hugerec.sparse.features import SparseFeatures

ALL: list[Optimizer] = [
    SGD(lr=0.1, weight_decay=0.01),
    Adagrad(lr=0.2, initial_accumulator_value=0.1),
    RowWiseAdagrad(lr=0.3, eps=1e-6),
    Adam(lr=0.05, beta1=0.8, beta2=0.9),
    Ftrl(lr=0.5, l1=0.01, l2=0.1, beta=1.0),
]


@pytest.mark.parametrize("opt", ALL, ids=optimizer_name)
def test_json_round_trip(opt: Optimizer) -> None:
    data = json.loads(json.dumps(optimizer_to_dict(opt)))
    assert data["type"] == optimizer_name(opt) and optimizer_from_dict(data) == opt


def test_state_width() -> None:
    assert [state_width(o, 8) for o in ALL] == [0, 8, 1, 16, 16]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SGD(lr=-1.0), "SGD: lr must be >= 0, got -1.0"),
        (lambda: SGD(lr=math.nan), "SGD: lr must be >= 0, got nan"),
        (lambda: Adagrad(eps=-1e-9), "Adagrad: eps must be >= 0"),
        (lambda: RowWiseAdagrad(weight_decay=-0.1), "RowWiseAdagrad: weight_decay must be >= 0, got -0.1"),
        (lambda: Adam(beta1=1.0), r"Adam: beta1 must be in \[0, 1\), got 1.0"),
        (lambda: Adam(beta2=-0.5), r"Adam: beta2 must be in \[0, 1\), got -0.5"),
        (lambda: Ftrl(lr=0.0), "Ftrl: lr must be > 0, got 0.0"),
        (lambda: Ftrl(lr_power=0.5), "Ftrl: lr_power must be <= 0, got 0.5"),
        (lambda: Ftrl(initial_accumulator_value=0.0), "Ftrl: initial_accumulator_value must be > 0, got 0.0"),
        (lambda: optimizer_from_dict({"type": "lamb"}), r"unknown optimizer type 'lamb'; expected one of \['adagrad'"),
        (lambda: optimizer_from_dict({"lr": 1.0}), "unknown optimizer type None"),
        (lambda: optimizer_from_dict({"type": "sgd", "momentum": 0.9}), "optimizer 'sgd': .*momentum"),
    ],
)
def test_bad_hyper_parameters_are_refused(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def _expected(opt: Optimizer, w: np.ndarray, g: np.ndarray) -> np.ndarray:
    """One step from fresh state, in float64, as each optimizer's docstring writes it."""
    g = g + opt.weight_decay * w
    match opt:
        case SGD():
            return w - opt.lr * g
        case Adagrad():
            s = opt.initial_accumulator_value + g * g
            return w - opt.lr * g / (np.sqrt(s) + opt.eps)
        case RowWiseAdagrad():
            s = opt.initial_accumulator_value + np.mean(g * g)
            return w - opt.lr * g / (np.sqrt(s) + opt.eps)
        case Adam():
            m, v = (1 - opt.beta1) * g, (1 - opt.beta2) * g * g
            return w - opt.lr * math.sqrt(1 - opt.beta2) / (1 - opt.beta1) * m / (np.sqrt(v) + opt.eps)
        case Ftrl():
            n = opt.initial_accumulator_value
            n_new = n + g * g
            sigma = (n_new ** (-opt.lr_power) - n ** (-opt.lr_power)) / opt.lr
            z = g - sigma * w
            new = (np.sign(z) * opt.l1 - z) / ((opt.beta + n_new ** (-opt.lr_power)) / opt.lr + 2 * opt.l2)
            return np.where(np.abs(z) <= opt.l1, 0.0, new)


@pytest.mark.parametrize("opt", [*ALL, Adam(lr=0.05, weight_decay=0.5)], ids=lambda o: optimizer_name(o))
def test_one_step_follows_the_formula_and_leaves_untouched_rows(opt: Optimizer) -> None:
    emb = EmbeddingCollection([TableConfig("t", 4, 3)], opt)
    start = torch.tensor([[0.5, -0.25, 1.0], [0.1, 0.2, -0.3], [2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    emb.write_rows("t", torch.arange(4), start)
    before_state = {k: v.clone() for k, v in emb.read_rows("t", torch.tensor([0, 3]))[1].items()}
    coeff = torch.tensor([[1.0, -2.0, 0.5]])
    (emb(SparseFeatures.from_lists({"t": [[1]]}))["t"] * coeff).sum().backward()  # g of row 1 = coeff
    after = emb.table_weight("t").detach().double().numpy()
    want = _expected(opt, start[1].double().numpy(), coeff[0].double().numpy())
    np.testing.assert_allclose(after[1], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(after[[0, 2, 3]], start[[0, 2, 3]].double().numpy())  # no id touched them
    for name, value in emb.read_rows("t", torch.tensor([0, 3]))[1].items():
        torch.testing.assert_close(value, before_state[name])
