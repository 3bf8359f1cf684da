"""check_objective: the objective fields of a retrieval or sequential config accepted as plain data (a Negatives
member stored as its string) and each bad value refused naming the config and the value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from hugerec.models.objectives import RETRIEVAL_LOSSES, SEQUENCE_LOSSES, Negatives, check_objective


@dataclass(frozen=True)
class Objective:
    loss: str = "sampled_softmax"
    negatives: Any = "mixed"
    num_negatives: Any = 16
    alpha: Any = 0.5
    logq: Any = True


def test_good_fields_pass_and_members_become_strings() -> None:
    config = Objective(negatives=Negatives.POPULARITY)
    check_objective(config, "TwoTowerConfig", RETRIEVAL_LOSSES)
    assert config.negatives == "popularity"
    check_objective(
        Objective(loss="full_softmax", negatives="in_batch", num_negatives=0, alpha=1), "SASRecConfig", SEQUENCE_LOSSES
    )


@pytest.mark.parametrize(
    ("fields", "losses", "message"),
    [
        (
            {"loss": "bpr"},
            SEQUENCE_LOSSES,
            r"loss must be one of \['sampled_softmax', 'full_softmax', 'bce'\], got 'bpr'",
        ),
        (
            {"negatives": "hard"},
            RETRIEVAL_LOSSES,
            "C: negatives must be one of \\['in_batch', 'uniform', 'popularity', 'mixed'\\], got 'hard'",
        ),
        ({"num_negatives": 0}, RETRIEVAL_LOSSES, "C: num_negatives must be an integer >= 1, got 0"),
        ({"num_negatives": True}, RETRIEVAL_LOSSES, "C: num_negatives must be an integer >= 1, got True"),
        ({"num_negatives": 8.0}, RETRIEVAL_LOSSES, "C: num_negatives must be an integer >= 1, got 8.0"),
        ({"alpha": 1.5}, RETRIEVAL_LOSSES, r"C: alpha must be in \[0, 1\], got 1.5"),
        ({"alpha": False}, RETRIEVAL_LOSSES, r"C: alpha must be in \[0, 1\], got False"),
        ({"alpha": "0.5"}, RETRIEVAL_LOSSES, r"C: alpha must be in \[0, 1\], got '0.5'"),
        ({"logq": 1}, RETRIEVAL_LOSSES, "C: logq must be true or false, got 1"),
    ],
)
def test_bad_fields_are_refused(fields: dict[str, Any], losses: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_objective(Objective(**fields), "C", losses)
