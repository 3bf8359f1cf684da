"""The Triton kernels' tests: compiled on a CUDA device, else under Triton's interpreter on the CPU
(tests/conftest.py sets TRITON_INTERPRET=1). Each kernel is also compiled for an H100 (sm_90) in a
process without the interpreter: the interpreter accepts code that the compiler rejects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

_COMPILE = """
import json, sys, importlib
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
for module, kernel, signature, constexprs in json.loads(sys.argv[1]):
    fn = getattr(importlib.import_module(module), kernel)
    # as launched: arguments of no known divisibility, and (the usual case) every pointer and integer a
    # multiple of 16, which Triton specialises on and which takes other compiler paths
    sixteen = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t[0] in "*i"}
    for attrs in ({}, sixteen):
        done = triton.compile(
            ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs), target=GPUTarget("cuda", 90, 32)
        )
        assert done.asm["cubin"], kernel
print("compiled", len(json.loads(sys.argv[1])))
"""

Spec = tuple[str, str, dict[str, str], dict[str, Any]]


def compile_for_hopper(specs: Sequence[Spec]) -> None:
    """Compile each (module, kernel, signature, constexprs) to an sm_90 cubin; raises with the compiler's message."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps(list(specs))], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="session")
def hopper() -> Callable[[Sequence[Spec]], None]:
    return compile_for_hopper
