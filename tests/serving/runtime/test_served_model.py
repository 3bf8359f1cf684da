"""ServedModel: the sigmoid outputs over the whole float32 range (its KServe v2 and /predict answers are
tested over HTTP in tests/serving/http/test_server.py)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from hugerec.serving.runtime.served_model import outputs


def test_scores_are_the_sigmoid_of_the_logits_over_the_whole_float32_range() -> None:
    logits = np.array([-np.inf, -3e38, -100, -88, -20, -1, 0, 1e-3, 1, 20, 88, 3e38, np.inf], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        out = outputs(logits)
    assert out["scores"].dtype == np.float32 and out["logits"] is logits
    np.testing.assert_allclose(out["scores"], torch.sigmoid(torch.from_numpy(logits)).numpy(), rtol=1e-6, atol=1e-38)
    assert list(outputs(logits, ("scores",))) == ["scores"]
