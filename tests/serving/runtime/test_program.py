"""ServedProgram: the trace of the exported program is used only where it computes what the program does."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hugerec.serving.bundles.model_bundle import Bundle
from hugerec.serving.runtime.program import compile_program

CPU = torch.device("cpu")


def test_the_exported_program_is_traced_and_equal_at_every_batch_size(toy: Any) -> None:
    module = Bundle.open(toy.bundle).program()
    program = compile_program(module, (4, 24), CPU)
    assert program.traced and program.module is module and program.run is not module
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for b in (1, 2, 3, 5, 64, 300):
            dense, pooled = torch.randn(b, 4, generator=gen), torch.randn(b, 24, generator=gen)
            want = toy.model.dense_forward(dense, (pooled,))
            torch.testing.assert_close(program.run(dense, pooled), want, rtol=1e-6, atol=1e-6)


class _BakesTheBatchSize(torch.nn.Module):
    """Scales by the batch size as a Python number: a trace would keep the traced batch size forever."""

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return (dense.sum(1) + pooled.sum(1)) * float(dense.shape[0])


class _ReadsAValue(torch.nn.Module):
    """Branches on a value read out of its input: a trace would keep one branch."""

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        total = dense.sum(1) + pooled.sum(1)
        return total * 2 if bool(total.sum() > 0) else total


@pytest.mark.parametrize("module", [_BakesTheBatchSize(), _ReadsAValue()])
def test_programs_a_trace_would_change_are_served_as_they_are(module: torch.nn.Module) -> None:
    program = compile_program(module, (2, 3), CPU)
    assert not program.traced and program.run is module
    for b in (1, 4):
        for sign in (1.0, -1.0):
            dense, pooled = torch.full((b, 2), sign), torch.full((b, 3), sign)
            torch.testing.assert_close(program.run(dense, pooled), module(dense, pooled))
