"""The 16-bit storage conversions of the Numba kernels are bit-exact with torch's (NaN payloads aside)."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from hugerec.ops.cpu.rows import bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16


@njit(cache=True)
def _convert(bits: np.ndarray, floats: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from_bf16 = np.empty(bits.shape[0], np.float32)
    from_f16 = np.empty(bits.shape[0], np.float32)
    for i in range(bits.shape[0]):
        from_bf16[i] = bf16_to_f32(np.int16(bits[i]))
        from_f16[i] = f16_to_f32(np.uint16(bits[i]))
    to_bf16 = np.empty(floats.shape[0], np.int16)
    to_f16 = np.empty(floats.shape[0], np.uint16)
    for i in range(floats.shape[0]):
        to_bf16[i] = f32_to_bf16(floats[i])
        to_f16[i] = f32_to_f16(floats[i])
    return from_bf16, from_f16, to_bf16, to_f16


def test_conversions_match_torch() -> None:
    bits = np.arange(65536, dtype=np.uint16)  # every 16-bit pattern
    as_f16 = torch.from_numpy(bits.view(np.int16).copy()).view(torch.float16).float()
    rng = np.random.default_rng(0)
    floats = np.concatenate(
        [
            (rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000)).astype(np.float32),
            rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32),  # any bit pattern
            as_f16.numpy(),
            (as_f16.double() * (1 + 2**-11)).float().numpy(),  # exactly half-way between fp16 neighbours
            np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.99, 65520, 2.9802322e-08, 1e-45], np.float32),
        ]
    )
    from_bf16, from_f16, to_bf16, to_f16 = _convert(bits, floats)
    t_bits = torch.from_numpy(bits.view(np.int16).copy())
    assert np.array_equal(from_bf16.view(np.uint32), t_bits.view(torch.bfloat16).float().numpy().view(np.uint32))
    assert np.array_equal(from_f16.view(np.uint32), as_f16.numpy().view(np.uint32))
    t_floats = torch.from_numpy(floats)
    keep = ~np.isnan(floats)  # torch keeps NaN payloads; ours are plain quiet NaNs
    assert np.array_equal(to_bf16[keep], t_floats.to(torch.bfloat16).view(torch.int16).numpy()[keep])
    assert np.array_equal(to_f16[keep], t_floats.to(torch.float16).view(torch.int16).numpy().view(np.uint16)[keep])
    assert np.isnan(torch.from_numpy(to_f16[~keep].view(np.int16).copy()).view(torch.float16).float().numpy()).all()
    assert np.isnan(torch.from_numpy(to_bf16[~keep].copy()).view(torch.bfloat16).float().numpy()).all()
