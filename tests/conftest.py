"""Session-wide test setup.

Without a CUDA device the Triton kernels (hugerec/ops/gpu) run under Triton's interpreter on the CPU.
Triton decides interpreted or compiled when a kernel is defined, so the variable is set here, before any
test module imports them; with a CUDA device they are compiled and run on it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
