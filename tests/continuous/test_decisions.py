import math

import numpy as np
import pytest

from hugerec.continuous.decisions import Action, DecisionConfig, Kpis, Observation, auc_standard_error, decide_canary
from hugerec.continuous.monitor import kpis


def _feedback(rng: np.random.Generator, n: int, separation: float) -> Kpis:
    """n labelled requests of a version whose scores separate clicks from non-clicks by `separation`
    (scores ~ N(separation * label, 1), so its true AUC is Phi(separation / sqrt(2)))."""
    labels = (rng.random(n) < 0.3).astype(np.float64)
    scores = rng.normal(separation * labels, 1.0)
    return kpis(1 / (1 + np.exp(-scores)), labels)


def test_auc_standard_error_matches_the_spread_of_measured_aucs():
    """Hanley-McNeil's standard error against the standard deviation of AUCs measured on many draws."""
    rng = np.random.default_rng(0)
    draws = [_feedback(rng, 600, 1.0) for _ in range(400)]
    measured = np.std([d.auc for d in draws])
    first = draws[0]
    predicted = auc_standard_error(first.auc, first.positives, first.count - first.positives)
    assert predicted == pytest.approx(measured, rel=0.2)


def test_auc_standard_error_edge_cases():
    assert auc_standard_error(0.7, 0, 10) == math.inf
    assert auc_standard_error(0.7, 10, 0) == math.inf
    assert auc_standard_error(1.0, 5, 5) == 0.0
    assert auc_standard_error(0.5, 100, 100) > auc_standard_error(0.5, 1000, 1000)


def test_equally_good_canaries_are_rarely_rolled_back_on_small_feedback():
    """Two versions of the same quality, 400 labelled requests each: the point estimates differ by up to
    ~0.1 from noise alone; the decision rolls back only what is worse beyond that noise."""
    rng = np.random.default_rng(1)
    config = DecisionConfig(min_feedback=200)
    noisy = DecisionConfig(min_feedback=200, confidence_z=0.0)
    decisions = []
    by_point_estimate = []
    for _ in range(300):
        obs = Observation({"stable": _feedback(rng, 400, 1.0), "canary": _feedback(rng, 400, 1.0)})
        decisions.append(decide_canary(obs, config)[0])
        by_point_estimate.append(decide_canary(obs, noisy)[0])
    assert decisions.count(Action.ROLLBACK) / len(decisions) < 0.08  # one-sided z = 1.645: about 5%
    assert by_point_estimate.count(Action.ROLLBACK) / len(by_point_estimate) > 0.3  # the old rule: about half


def test_a_worse_canary_is_rolled_back_and_says_why():
    rng = np.random.default_rng(2)
    rollbacks = 0
    for _ in range(100):
        obs = Observation({"stable": _feedback(rng, 2000, 1.2), "canary": _feedback(rng, 2000, 0.6)})
        action, reason = decide_canary(obs, DecisionConfig())
        rollbacks += action is Action.ROLLBACK
    assert rollbacks >= 95
    assert "standard error" in reason or action is Action.PROMOTE


def test_a_broken_canary_is_rolled_back_even_on_the_minimum_feedback():
    rng = np.random.default_rng(3)
    obs = Observation({"stable": _feedback(rng, 200, 1.2), "canary": _feedback(rng, 200, -1.2)})
    action, reason = decide_canary(obs, DecisionConfig(min_feedback=200))
    assert action is Action.ROLLBACK
    assert reason.startswith("canary worse: AUC")


def test_too_little_feedback_waits():
    rng = np.random.default_rng(4)
    obs = Observation({"stable": _feedback(rng, 100, 1.0), "canary": _feedback(rng, 500, 1.0)})
    action, reason = decide_canary(obs, DecisionConfig(min_feedback=200))
    assert action is Action.WAIT
    assert "stable 100" in reason


def test_confidence_z_is_validated():
    with pytest.raises(ValueError, match="confidence_z must be a finite number >= 0, got -1"):
        DecisionConfig(confidence_z=-1.0)
