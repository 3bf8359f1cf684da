"""ServedProgram: the dense program plus the fastest equivalent way to call it.

    module  (dense [B, Dd], pooled_1 [B, W_1], ...) -> logits    the loaded program; dense updates go here
    run     the same function as a TorchScript trace of `module`, or `module` itself

torch.export's unlifted module runs every aten op through Python (OpOverload calls, pytree
flattening, input guards), slower than the eager model at batch 1. A frozen TorchScript trace of the
same graph runs in torch's C++ interpreter instead. A trace records
one execution, at one batch size. An exported graph has no data-dependent control flow, so the
trace is the same program at every batch size unless a shape or value was baked in as a constant:
tracing refuses a value taken out of a tensor by the model's code (TracerWarning as an error; the
export's input guards, which only check, are left out of the trace), and the trace must reproduce
the program on fresh inputs at batch sizes other than the traced one. Otherwise `run` is the module.
The trace is built in this process from the module already loaded with `weights_only`: no code is
read from the bundle.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

TRACE_BATCH = 3  # traced at this batch size; checked at the others below
CHECK_BATCHES = (1, 2, 7)


@dataclass(frozen=True, eq=False)
class ServedProgram:
    """`module` (the state-holding program) and `run` (what requests call); `traced` says which `run` is."""

    module: torch.nn.Module
    run: Callable[..., torch.Tensor]
    traced: bool


def compile_program(module: torch.nn.Module, widths: Sequence[int], device: torch.device) -> ServedProgram:
    """A ServedProgram for `module`, which takes one float32 [B, w] input per entry of `widths`
    (dense first, then one pooled block per embedding collection)."""
    try:
        traced = _trace(module, widths, device)
    except Exception as e:  # tracing fails in many ways (unsupported ops, baked shapes): serve the module itself
        log.info("dense program served untraced: %s: %s", type(e).__name__, e)
        return ServedProgram(module, module, traced=False)
    return ServedProgram(module, traced, traced=True)


def _trace(module: torch.nn.Module, widths: Sequence[int], device: torch.device) -> Callable[..., torch.Tensor]:
    gen = torch.Generator().manual_seed(0)

    def example(b: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(b, w, generator=gen).to(device) for w in widths)

    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace is deprecated, not yet removed
        warnings.simplefilter("error", torch.jit.TracerWarning)
        # the exported program's own input guards read shapes as Python values: checks, not computation
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch(\.|$)")
        # frozen: the weights become constants of the graph (10% faster at small batches); `module`
        # keeps them as state, and a dense update compiles a new program
        traced = torch.jit.freeze(torch.jit.trace(module, example(TRACE_BATCH), check_trace=False).eval())
    with torch.inference_mode():
        for b in CHECK_BATCHES:
            inputs = example(b)
            want, got = module(*inputs), traced(*inputs)
            if want.shape != got.shape or not torch.allclose(want, got, rtol=1e-6, atol=1e-7):
                raise ValueError(f"the trace differs from the program at batch size {b}")
    return traced  # a ScriptModule, callable like the module
