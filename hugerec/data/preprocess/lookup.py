"""ValueIndex: exact value -> row lookup into a fitted statistics frame (vocabularies, counts).

A Polars join against a vocabulary re-hashes the whole vocabulary on every call (about 0.2 s for a
million strings, even for a one-row request), so each vocabulary gets an open-addressing hash table
once, keyed by the stable 64-bit hash of its values; a probe compares the actual values (string bytes
or integer bits) on a hash match, so lookups are exact, never approximate.

    values = ["b", "a", "c"]   table slots (S = 8): hash -> row, -1 empty
    lookup(["a", None, "z"]) -> [1, null_row, -1]
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt
import polars as pl
from numba import njit

from hugerec.data.preprocess.hashing import hash_series, is_string_like, string_buffers, value_bits

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]


@njit(cache=True)
def _build_kernel(hashes: U64, valid: npt.NDArray[np.bool_], num_slots: int) -> tuple[U64, I64]:
    keys = np.zeros(num_slots, dtype=np.uint64)
    rows = np.full(num_slots, -1, dtype=np.int64)
    mask = np.uint64(num_slots - 1)
    for r in range(hashes.shape[0]):
        if not valid[r]:
            continue
        slot = hashes[r] & mask
        while rows[slot] != -1:
            slot = (slot + np.uint64(1)) & mask
        keys[slot] = hashes[r]
        rows[slot] = r
    return keys, rows


@njit(cache=True)
def _lookup_bits_kernel(
    query: U64, query_hash: U64, valid: npt.NDArray[np.bool_], keys: U64, rows: I64, values: U64, null_row: int
) -> I64:
    mask = np.uint64(keys.shape[0] - 1)
    out = np.empty(query.shape[0], dtype=np.int64)
    for i in range(query.shape[0]):
        if not valid[i]:
            out[i] = null_row
            continue
        slot = query_hash[i] & mask
        found = -1
        while rows[slot] != -1:
            if keys[slot] == query_hash[i] and values[rows[slot]] == query[i]:
                found = rows[slot]
                break
            slot = (slot + np.uint64(1)) & mask
        out[i] = found
    return out


@njit(cache=True)
def _lookup_strings_kernel(
    q_offsets: I64,
    q_data: U8,
    query_hash: U64,
    valid: npt.NDArray[np.bool_],
    keys: U64,
    rows: I64,
    v_offsets: I64,
    v_data: U8,
    null_row: int,
) -> I64:
    mask = np.uint64(keys.shape[0] - 1)
    out = np.empty(query_hash.shape[0], dtype=np.int64)
    for i in range(query_hash.shape[0]):
        if not valid[i]:
            out[i] = null_row
            continue
        q_start = q_offsets[i]
        q_len = q_offsets[i + 1] - q_start
        slot = query_hash[i] & mask
        found = -1
        while rows[slot] != -1:
            r = rows[slot]
            if keys[slot] == query_hash[i] and v_offsets[r + 1] - v_offsets[r] == q_len:
                same = True
                v_start = v_offsets[r]
                for b in range(q_len):
                    if q_data[q_start + b] != v_data[v_start + b]:
                        same = False
                        break
                if same:
                    found = r
                    break
            slot = (slot + np.uint64(1)) & mask
        out[i] = found
    return out


@dataclass(frozen=True)
class ValueIndex:
    dtype: pl.DataType  # of the indexed values
    keys: U64  # [S] slot hashes, S a power of two >= 2 V
    rows: I64  # [S] row of the value in each slot, -1 = empty
    null_row: int  # row of the null value, -1 if absent
    offsets: I64  # [V + 1] string values' byte offsets (empty for non-strings)
    data: U8  # string values' UTF-8 bytes
    bits: U64  # [V] non-string values' integer bits (empty for strings)

    @classmethod
    def build(cls, values: pl.Series) -> ValueIndex:
        """Index V distinct values (at most one null)."""
        valid = values.is_not_null().to_numpy()
        nulls = np.flatnonzero(~valid)
        num_slots = 1 << max(3, int(2 * max(values.len(), 1) - 1).bit_length())
        keys, rows = _build_kernel(hash_series(values), valid, num_slots)
        null_row = int(nulls[0]) if nulls.size else -1
        if is_string_like(values.dtype):
            offsets, data = string_buffers(values)
            return cls(values.dtype, keys, rows, null_row, offsets, data, np.zeros(0, dtype=np.uint64))
        empty = np.zeros(0, dtype=np.int64)
        return cls(values.dtype, keys, rows, null_row, empty, np.zeros(0, dtype=np.uint8), value_bits(values))

    def lookup(self, query: pl.Series) -> I64:
        """[R] row of each query value; -1 where absent (null -> `null_row`)."""
        if query.dtype != self.dtype:
            try:
                query = query.cast(self.dtype, strict=True)
            except pl.exceptions.PolarsError as e:
                raise ValueError(
                    f"column {query.name!r}: dtype {query.dtype} does not match the fitted dtype {self.dtype}"
                ) from e
        valid = query.is_not_null().to_numpy()
        query_hash = hash_series(query)
        if is_string_like(self.dtype):
            q_offsets, q_data = string_buffers(query)
            return _lookup_strings_kernel(
                q_offsets, q_data, query_hash, valid, self.keys, self.rows, self.offsets, self.data, self.null_row
            )
        return _lookup_bits_kernel(value_bits(query), query_hash, valid, self.keys, self.rows, self.bits, self.null_row)


T = TypeVar("T")
_CACHE: dict[int, tuple[weakref.ref[pl.DataFrame], dict[str, object]]] = {}


def cached(frame: pl.DataFrame, name: str, build: Callable[[pl.DataFrame], T]) -> T:
    """`build(frame)`, computed once per statistics frame object (fitted stats are never mutated)."""
    key = id(frame)
    hit = _CACHE.get(key)
    if hit is None or hit[0]() is not frame:
        hit = (weakref.ref(frame, lambda _ref, key=key: _CACHE.pop(key, None)), {})  # type: ignore[misc]  # default-arg binding of the key
        _CACHE[key] = hit
    if name not in hit[1]:
        hit[1][name] = build(frame)
    return cast(T, hit[1][name])


def index_of(frame: pl.DataFrame, column: str = "value") -> ValueIndex:
    """The ValueIndex of a statistics frame's value column."""
    return cached(frame, f"index:{column}", lambda f: ValueIndex.build(f[column]))
