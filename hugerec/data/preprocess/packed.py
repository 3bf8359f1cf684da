"""Short strings as integers: a string of at most 8 bytes, none of them NUL, packed little-endian into one
uint64 (zero-padded) is the same value in 8 bytes, so counting and looking it up can run on integers.

    "ab"        -> 0x6261              (b"a" = 0x61 in the lowest byte)
    "68fd1e64"  -> 0x3436653164663836  (Criteo's hashed categoricals: always 8 hex digits)
    ""          -> 0
    "a\\0", 9+ bytes  -> not packable (the padding would make "a\\0" equal to "a")

Hashing 8 bytes one at a time costs more than the rest of a lookup, and Polars counts integers faster
than strings.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
from numba import njit

from hugerec.data.preprocess.hashing import Flat, hash_bits

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]
NOT_PACKABLE = np.uint64(0xFFFFFFFFFFFFFFFF)  # never a packed value: its top byte would be 0xFF, not UTF-8


@njit(cache=True, inline="always")
def pack_one(data: U8, start: int, length: int) -> np.uint64:
    """The packed value of data[start:start + length], or NOT_PACKABLE."""
    if length > 8:
        return NOT_PACKABLE
    word = np.uint64(0)
    for b in range(length):
        byte = data[start + b]
        if byte == 0:
            return NOT_PACKABLE
        word |= np.uint64(byte) << np.uint64(8 * b)
    return word


@njit(cache=True)
def _pack_kernel(offsets: I64, data: U8, valid: Mask) -> tuple[U64, bool]:
    n = offsets.shape[0] - 1
    out = np.zeros(n, dtype=np.uint64)  # nulls pack to 0
    for i in range(n):
        if valid[i]:
            out[i] = pack_one(data, offsets[i], offsets[i + 1] - offsets[i])
            if out[i] == NOT_PACKABLE:
                return out, False
    return out, True


def pack(flat: Flat) -> U64 | None:
    """[R] packed values of a string column (0 for nulls), or None if any non-null value is not packable."""
    if not flat.is_string:
        raise ValueError("pack: needs a string column")
    words, ok = _pack_kernel(flat.offsets, flat.data, flat.valid)
    return words if ok else None


def unpack(words: U64, name: str) -> pl.Series:
    """Packed values -> a String column, built as Arrow buffers: no byte of a packed string is zero but
    the padding, so the nonzero bytes in order are the strings' bytes."""
    raw = np.ascontiguousarray(words, dtype="<u8").view(np.uint8).reshape(-1, 8)  # [V, 8]
    keep = raw != 0
    offsets = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    strings = pa.LargeStringArray.from_buffers(len(words), pa.py_buffer(offsets), pa.py_buffer(raw[keep]))
    return pl.Series(name, strings, dtype=pl.String)


@njit(cache=True)
def _count_kernel(words: U64, valid: Mask, weights: I64, key: np.uint64) -> tuple[U64, I64]:
    n = words.shape[0]
    num_slots = 8
    while num_slots < 2 * n:
        num_slots *= 2
    mask = np.uint64(num_slots - 1)
    slot_words = np.empty(num_slots, dtype=np.uint64)
    slot_counts = np.zeros(num_slots, dtype=np.int64)  # 0 = empty slot
    order = np.empty(n, dtype=np.int64)  # slots in first-seen order
    distinct = 0
    for i in range(n):
        if not valid[i]:
            continue
        w = words[i]
        slot = hash_bits(w, key) & mask
        while slot_counts[slot] != 0 and slot_words[slot] != w:
            slot = (slot + np.uint64(1)) & mask
        if slot_counts[slot] == 0:
            slot_words[slot] = w
            order[distinct] = slot
            distinct += 1
        slot_counts[slot] += weights[i] if weights.shape[0] else 1
    return slot_words[order[:distinct]], slot_counts[order[:distinct]]


_NO_WEIGHTS = np.zeros(0, dtype=np.int64)


def count(words: U64, valid: Mask, weights: I64 | None = None) -> tuple[U64, I64]:
    """(distinct packed values of the valid rows in first-seen order, how often each occurs); with
    `weights` [R] (positive), the sum of their weights instead (merging partial counts)."""
    return _count_kernel(words, valid, _NO_WEIGHTS if weights is None else weights, np.uint64(0x9E3779B97F4A7C15))
