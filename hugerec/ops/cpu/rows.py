"""Reading and writing one element of a stored row, for each storage dtype, inside Numba kernels.

Kernels are written once against `get` / `put` on a row view (weight[r]); Numba picks the body by
the array's dtype at compile time, so there is no branch in the inner loops:

    float32  fp32 storage
    int16    bf16 storage, the bit pattern (torch bf16 tensors are passed as `.view(torch.int16)`);
             math in fp32, stored with round-to-nearest-even exactly like torch's conversion
    uint16   fp16 storage, the bit pattern (`.view(torch.uint16)`); Numba has no float16 on the CPU,
             so the conversions are written out below (IEEE binary16, round-to-nearest-even)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload


@njit(cache=True, error_model="numpy")
def bf16_to_f32(bits: np.int16) -> np.float32:
    return np.uint32(np.uint32(bits & 0xFFFF) << 16).view(np.float32)


@njit(cache=True, error_model="numpy")
def f32_to_bf16(x: np.float32) -> np.int16:
    u = np.float32(x).view(np.uint32)
    if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: a quiet NaN, as torch
        return np.int16(0x7FC0)
    u = np.uint32(u + np.uint32(0x7FFF) + ((u >> 16) & 1))
    return np.uint16(u >> 16).view(np.int16)


@njit(cache=True, error_model="numpy")
def f16_to_f32(bits: np.uint16) -> np.float32:
    h = np.uint32(bits)
    sign = np.uint32((h & 0x8000) << 16)
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0x1F:  # inf, or NaN made quiet as torch does
        quiet = 0x400000 if mant else 0
        return np.uint32(sign | 0x7F800000 | quiet | (mant << 13)).view(np.float32)
    if exp == 0:  # zero / subnormal: mant * 2^-24, exact in fp32
        mag = np.float32(np.float32(mant) * np.float32(5.960464477539063e-08))
        return np.uint32(mag.view(np.uint32) | sign).view(np.float32)
    return np.uint32(sign | ((exp + 112) << 23) | (mant << 13)).view(np.float32)


@njit(cache=True, error_model="numpy")
def f32_to_f16(x: np.float32) -> np.uint16:
    u = np.float32(x).view(np.uint32)
    sign = np.uint32((u >> 16) & 0x8000)
    a = np.uint32(u & 0x7FFFFFFF)
    if a > 0x7F800000:  # NaN: a quiet NaN, as torch
        return np.uint16(sign | 0x7E00)
    if a >= 0x477FF000:  # >= 65520 rounds to inf
        return np.uint16(sign | 0x7C00)
    if a >= 0x38800000:  # normal in fp16 (>= 2^-14): rebias the exponent, round the mantissa to 10 bits
        a = np.uint32(a - np.uint32(112 << 23))
        return np.uint16(sign | (np.uint32(a + np.uint32(0xFFF) + ((a >> 13) & 1)) >> 13))
    shift = 126 - np.int64(a >> 23)  # fp16 subnormal: round(significand * 2^(exp - 126))
    if shift > 24:  # below half the smallest subnormal (or an fp32 subnormal): zero
        return np.uint16(sign)
    m = np.int64((a & 0x7FFFFF) | 0x800000)
    q = m >> shift
    rem = m & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    if rem > half or (rem == half and (q & 1) == 1):
        q += 1
    return np.uint16(sign | np.uint32(q))


def get(row: np.ndarray, k: int) -> np.float32:
    """row[k] as float32 (Numba only); `row` is a 1-D view of one stored row, e.g. weight[r]."""
    raise TypeError("hugerec.ops.cpu.rows.get is only callable from Numba kernels")


def put(row: np.ndarray, k: int, x: float | np.floating[Any]) -> None:
    """row[k] = x rounded to the storage dtype (Numba only)."""
    raise TypeError("hugerec.ops.cpu.rows.put is only callable from Numba kernels")


# Numba checks that an overload's implementations have the typing function's exact parameters,
# annotations included: hence `Any` on both sides.
@overload(get, inline="always")
def _get(row: Any, k: Any) -> Callable[..., Any] | None:
    if row.dtype == types.float32:

        def get_f32(row: Any, k: Any) -> Any:
            return row[k]

        return get_f32
    if row.dtype == types.int16:

        def get_bf16(row: Any, k: Any) -> Any:
            return bf16_to_f32(row[k])

        return get_bf16
    if row.dtype == types.uint16:

        def get_f16(row: Any, k: Any) -> Any:
            return f16_to_f32(row[k])

        return get_f16
    return None


@overload(put, inline="always")
def _put(row: Any, k: Any, x: Any) -> Callable[..., None] | None:
    if row.dtype == types.float32:

        def put_f32(row: Any, k: Any, x: Any) -> None:
            row[k] = x

        return put_f32
    if row.dtype == types.int16:

        def put_bf16(row: Any, k: Any, x: Any) -> None:
            row[k] = f32_to_bf16(x)

        return put_bf16
    if row.dtype == types.uint16:

        def put_f16(row: Any, k: Any, x: Any) -> None:
            row[k] = f32_to_f16(x)

        return put_f16
    return None


# LLVM 15 made pointers opaque, which renamed the intrinsic's pointer suffix.
_PREFETCH = "llvm.prefetch.p0" if llvm.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


@intrinsic
def _prefetch(typingctx: Any, address: Any) -> tuple[Any, Callable[..., Any]]:
    """Hint the cache to fetch the line at `address` (uintp) for reading; never faults."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), _PREFETCH
        )
        # (address, read, locality 3 = keep in all cache levels, data cache)
        builder.call(
            fn, [builder.inttoptr(args[0], i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)]
        )
        return context.get_dummy_value()

    return types.void(types.uintp), codegen


@njit(cache=True, error_model="numpy")
def prefetch(array: np.ndarray, index: int | np.integer, count: int) -> None:
    """Prefetch elements [index, index + count) of a C-contiguous array (flat indexing).

    The kernels' loop bodies between two random row loads are long, so the CPU's out-of-order window
    holds only a few rows in flight; asking for the rows a few iterations ahead restores the overlap.
    """
    address = array.ctypes.data + index * array.itemsize
    for offset in range(0, count * array.itemsize, 64):
        _prefetch(address + offset)  # type: ignore[call-arg]  # Numba supplies the typing context
