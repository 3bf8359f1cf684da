"""Stable 64-bit hashing of column values: the same id on every process, platform and library version.

Hashed ids end up inside trained embedding tables and must be reproduced at serving time, so neither
Python's `hash()` (salted per process) nor Polars' `hash` (free to change between releases) will do.
The definition, in uint64 arithmetic that wraps:

    mix(z)   = splitmix64 finalizer:  z += 0x9E3779B97F4A7C15
                                      z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9
                                      z = (z ^ z >> 27) * 0x94D049BB133111EB
                                      z ^ z >> 31
    key      = mix(seed)
    integer  h = mix(uint64(x) ^ key)                 (two's complement for negatives; booleans as 0/1)
    float    the integer hash of the IEEE-754 bits of float64(x), with -0.0 -> 0.0 and every NaN -> one NaN
    string   h = mix(len(utf8) ^ key ^ STRING_TAG); for each little-endian 8-byte word w of the UTF-8
             bytes (the last one zero-padded): h = mix(h ^ w)
    null     h = mix(key ^ NULL_TAG)
    combine  (for feature crosses) h = mix(key ^ CROSS_TAG); for each column hash c: h = mix(h ^ c)

The value's dtype is part of its identity: the integer 5 and the string "5" hash differently (the
workflow pins every column's dtype at fit time, so training and serving agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
from numba import njit

GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_MASK = (1 << 64) - 1
STRING_TAG = 0x5354524E47000000  # "STRNG"
NULL_TAG = 0x4E554C4C00000000  # "NULL"
CROSS_TAG = 0x43524F5353000000  # "CROSS"

U64 = npt.NDArray[np.uint64]


# -- reference (pure Python integers): the spec the kernels are tested against ----------------------
def mix_reference(z: int) -> int:
    z = (z + GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * _C1) & _MASK
    z = ((z ^ (z >> 27)) * _C2) & _MASK
    return z ^ (z >> 31)


def hash_value_reference(value: object, seed: int = 0) -> int:
    """Hash of one Python value (None, bool, int, float or str) by the definition above."""
    key = mix_reference(seed & _MASK)
    if value is None:
        return mix_reference(key ^ NULL_TAG)
    if isinstance(value, str):
        data = value.encode("utf-8")
        h = mix_reference(len(data) ^ key ^ STRING_TAG)
        for start in range(0, len(data), 8):
            h = mix_reference(h ^ int.from_bytes(data[start : start + 8].ljust(8, b"\0"), "little"))
        return h
    if isinstance(value, float):
        value = 0.0 if value == 0.0 else value
        bits = np.array([np.nan if value != value else value], dtype=np.float64).view(np.uint64)[0]
        return mix_reference(int(bits) ^ key)
    if isinstance(value, bool | int):
        return mix_reference((int(value) & _MASK) ^ key)
    raise TypeError(f"hash_value_reference: cannot hash {type(value).__name__} value {value!r}")


def combine_reference(hashes: list[int], seed: int = 0) -> int:
    h = mix_reference(mix_reference(seed & _MASK) ^ CROSS_TAG)
    for c in hashes:
        h = mix_reference(h ^ c)
    return h


# -- kernels -----------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _mix(z: np.uint64) -> np.uint64:
    z = z + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_C1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_C2)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _hash_u64_kernel(bits: U64, valid: npt.NDArray[np.bool_], key: np.uint64, null_hash: np.uint64) -> U64:
    out = np.empty(bits.shape[0], dtype=np.uint64)
    for i in range(bits.shape[0]):
        out[i] = hash_bits(bits[i], key) if valid[i] else null_hash
    return out


@njit(cache=True, inline="always")
def hash_bytes(data: npt.NDArray[np.uint8], start: int, length: int, key: np.uint64) -> np.uint64:
    """The string hash of data[start:start + length] (for kernels that hash as they go)."""
    h = _mix(np.uint64(length) ^ key ^ np.uint64(STRING_TAG))
    for w in range(0, length, 8):
        word = np.uint64(0)
        for b in range(min(8, length - w)):
            word |= np.uint64(data[start + w + b]) << np.uint64(8 * b)
        h = _mix(h ^ word)
    return h


@njit(cache=True, inline="always")
def hash_bits(bits: np.uint64, key: np.uint64) -> np.uint64:
    """The integer hash of uint64 value bits."""
    return _mix(bits ^ key)


@njit(cache=True)
def _hash_strings_kernel(
    offsets: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    valid: npt.NDArray[np.bool_],
    key: np.uint64,
    null_hash: np.uint64,
) -> U64:
    n = offsets.shape[0] - 1
    out = np.empty(n, dtype=np.uint64)
    for i in range(n):
        out[i] = hash_bytes(data, offsets[i], offsets[i + 1] - offsets[i], key) if valid[i] else null_hash
    return out


@njit(cache=True)
def _combine_kernel(columns: U64, start: np.uint64) -> U64:
    # columns: [C, R] hashes of C columns over R rows -> [R]
    out = np.empty(columns.shape[1], dtype=np.uint64)
    for r in range(columns.shape[1]):
        h = start
        for c in range(columns.shape[0]):
            h = _mix(h ^ columns[c, r])
        out[r] = h
    return out


def is_string_like(dtype: pl.DataType) -> bool:
    return dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum)


@dataclass(frozen=True)
class Flat:
    """A column as NumPy arrays for the kernels: validity and either string buffers or value bits.

    valid   [R] bool
    offsets [R + 1] int64 byte offsets into `data` (strings; null rows are empty), else empty
    data    UTF-8 bytes (strings), else empty
    bits    [R] uint64 integer / boolean values, or canonical IEEE-754 bits of floats (-0.0 -> 0.0,
            one NaN); 0 for nulls; empty for strings
    """

    is_string: bool
    valid: npt.NDArray[np.bool_]
    offsets: npt.NDArray[np.int64]
    data: npt.NDArray[np.uint8]
    bits: U64


_NO_OFFSETS = np.zeros(0, dtype=np.int64)
_NO_DATA = np.zeros(0, dtype=np.uint8)
_NO_BITS = np.zeros(0, dtype=np.uint64)


def flatten(series: pl.Series) -> Flat:
    """The column's kernel arrays, converted through Arrow in one step (cheap for one-row requests too)."""
    dtype = series.dtype
    array = series.to_arrow()
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    valid = np.ones(n, dtype=bool) if array.null_count == 0 else array.is_valid().to_numpy(zero_copy_only=False)
    if is_string_like(dtype):
        strings = array.cast(pa.large_string())
        _, offsets_buf, data_buf = strings.buffers()
        if offsets_buf is None:  # an empty array may come without buffers
            return Flat(True, valid, np.zeros(1, dtype=np.int64), _NO_DATA, _NO_BITS)
        offsets = np.frombuffer(offsets_buf, dtype=np.int64)[strings.offset : strings.offset + n + 1]
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else _NO_DATA
        return Flat(True, valid, offsets, data, _NO_BITS)
    if dtype.is_integer() or dtype == pl.Boolean:
        ints = array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return Flat(False, valid, _NO_OFFSETS, _NO_DATA, np.ascontiguousarray(ints).view(np.uint64))
    if dtype.is_float():
        floats = array.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False).copy()
        floats[floats == 0.0] = 0.0  # -0.0 and 0.0 compare equal, so this folds -0.0 onto +0.0
        floats[np.isnan(floats)] = np.nan  # one canonical NaN bit pattern
        return Flat(False, valid, _NO_OFFSETS, _NO_DATA, floats.view(np.uint64))
    raise ValueError(f"column {series.name!r}: cannot hash or index values of dtype {dtype}")


def hash_key(seed: int) -> np.uint64:
    """The per-seed key of the definition above."""
    return np.uint64(mix_reference(seed & _MASK))


def hash_flat(flat: Flat, seed: int = 0) -> U64:
    key = hash_key(seed)
    null_hash = np.uint64(mix_reference(int(key) ^ NULL_TAG))
    if flat.is_string:
        return _hash_strings_kernel(flat.offsets, flat.data, flat.valid, key, null_hash)
    return _hash_u64_kernel(flat.bits, flat.valid, key, null_hash)


def hash_series(series: pl.Series, seed: int = 0) -> U64:
    """[R] uint64 stable hashes of a Polars column of integers, booleans, floats, strings or categoricals."""
    return hash_flat(flatten(series), seed)


def combine_hashes(hashes: list[U64], seed: int = 0) -> U64:
    """Order-sensitive combination of C columns' [R] hashes into one [R] hash (feature crosses)."""
    start = np.uint64(mix_reference(mix_reference(seed & _MASK) ^ CROSS_TAG))
    return _combine_kernel(np.ascontiguousarray(np.stack(hashes)), start)
