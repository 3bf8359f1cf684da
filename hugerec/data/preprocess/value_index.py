"""ValueIndex: exact value -> row lookup into a fitted statistics frame (vocabularies, counts).

A Polars join against a vocabulary re-hashes the whole vocabulary on every call (about 0.2 s for a
million strings, even for a one-row request), so each vocabulary gets an open-addressing hash table
once, placed by the stable 64-bit hash of its values. A probe compares the actual values, so lookups
are exact, never approximate. Each 16-byte slot holds what the comparison needs, so integers and
strings of up to 8 bytes are decided inside the table (a few dozen tables of a Criteo workflow stay
cache-resident); longer strings compare their remaining bytes against the vocabulary:

    slots [S, 2] uint64, S a power of two >= 2 V, linear probing from hash & (S - 1):
      [0] head: first 8 bytes little-endian, zero-padded (strings) or the integer / float bits
      [1] (row + 1) | min(byte length, 2^24 - 1) << 40;  0 = empty
    values = ["b", "a", "c"]:  lookup(["a", None, "z"]) -> [1, null_row, -1]

When every indexed string packs into a uint64 (at most 8 bytes, no NUL: `packed`), the table holds
the packed values instead and a query string is packed as it is probed (one that does not pack
cannot be in the table), which is faster on Criteo's 8-digit hex values than hashing them as strings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl
from numba import njit

from hugerec.data.preprocess.hashing import flatten, hash_bits, hash_bytes, hash_key
from hugerec.data.preprocess.packed import NOT_PACKABLE, pack, pack_one
from hugerec.data.preprocess.stats import cached

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]


@njit(cache=True, inline="always")
def _head(data: U8, start: int, length: int) -> np.uint64:
    word = np.uint64(0)
    for b in range(min(8, length)):
        word |= np.uint64(data[start + b]) << np.uint64(8 * b)
    return word


ROW_BITS = np.uint64(40)
ROW_MASK = np.uint64((1 << 40) - 1)
MAX_LENGTH = (1 << 24) - 1  # longer strings share this length tag; their full length is checked aside


@njit(cache=True, inline="always")
def _tag(row: int, length: int) -> np.uint64:
    return np.uint64(row + 1) | (np.uint64(min(length, MAX_LENGTH)) << ROW_BITS)


@njit(cache=True, inline="always")
def _insert(slots: U64, h: np.uint64, head: np.uint64, tag: np.uint64) -> None:
    mask = np.uint64(slots.shape[0] - 1)
    slot = h & mask
    while slots[slot, 1] != 0:
        slot = (slot + np.uint64(1)) & mask
    slots[slot, 0] = head
    slots[slot, 1] = tag


@njit(cache=True)
def _build_strings_kernel(offsets: I64, data: U8, valid: Mask, key: np.uint64, num_slots: int) -> U64:
    slots = np.zeros((num_slots, 2), dtype=np.uint64)
    for r in range(offsets.shape[0] - 1):
        if valid[r]:
            start, length = offsets[r], offsets[r + 1] - offsets[r]
            _insert(slots, hash_bytes(data, start, length, key), _head(data, start, length), _tag(r, length))
    return slots


@njit(cache=True)
def _build_bits_kernel(bits: U64, valid: Mask, key: np.uint64, num_slots: int) -> U64:
    slots = np.zeros((num_slots, 2), dtype=np.uint64)
    for r in range(bits.shape[0]):
        if valid[r]:
            _insert(slots, hash_bits(bits[r], key), bits[r], _tag(r, 0))
    return slots


@njit(cache=True)
def _lookup_bits_kernel(query: U64, valid: Mask, slots: U64, key: np.uint64, null_row: int) -> I64:
    mask = np.uint64(slots.shape[0] - 1)
    out = np.empty(query.shape[0], dtype=np.int64)
    for i in range(query.shape[0]):
        if not valid[i]:
            out[i] = null_row
            continue
        slot = hash_bits(query[i], key) & mask
        found = np.int64(-1)
        while slots[slot, 1] != 0:
            if slots[slot, 0] == query[i]:
                found = np.int64(slots[slot, 1] & ROW_MASK) - 1
                break
            slot = (slot + np.uint64(1)) & mask
        out[i] = found
    return out


@njit(cache=True)
def _lookup_strings_kernel(
    q_offsets: I64, q_data: U8, valid: Mask, slots: U64, v_offsets: I64, v_data: U8, key: np.uint64, null_row: int
) -> I64:
    mask = np.uint64(slots.shape[0] - 1)
    out = np.empty(q_offsets.shape[0] - 1, dtype=np.int64)
    for i in range(q_offsets.shape[0] - 1):
        if not valid[i]:
            out[i] = null_row
            continue
        q_start = q_offsets[i]
        q_len = q_offsets[i + 1] - q_start
        head = _head(q_data, q_start, q_len)
        length_tag = np.uint64(min(q_len, MAX_LENGTH))
        slot = hash_bytes(q_data, q_start, q_len, key) & mask
        found = np.int64(-1)
        while slots[slot, 1] != 0:
            if slots[slot, 0] == head and (slots[slot, 1] >> ROW_BITS) == length_tag:
                r = np.int64(slots[slot, 1] & ROW_MASK) - 1
                same = q_len <= 8 or v_offsets[r + 1] - v_offsets[r] == q_len
                v_start = v_offsets[r]
                for b in range(8, q_len if same else 8):  # the first 8 bytes matched in `head`
                    if q_data[q_start + b] != v_data[v_start + b]:
                        same = False
                        break
                if same:
                    found = r
                    break
            slot = (slot + np.uint64(1)) & mask
        out[i] = found
    return out


@njit(cache=True)
def _lookup_packed_kernel(q_offsets: I64, q_data: U8, valid: Mask, slots: U64, key: np.uint64, null_row: int) -> I64:
    mask = np.uint64(slots.shape[0] - 1)
    out = np.empty(q_offsets.shape[0] - 1, dtype=np.int64)
    for i in range(q_offsets.shape[0] - 1):
        if not valid[i]:
            out[i] = null_row
            continue
        word = pack_one(q_data, q_offsets[i], q_offsets[i + 1] - q_offsets[i])
        found = np.int64(-1)
        if word != NOT_PACKABLE:
            slot = hash_bits(word, key) & mask
            while slots[slot, 1] != 0:
                if slots[slot, 0] == word:
                    found = np.int64(slots[slot, 1] & ROW_MASK) - 1
                    break
                slot = (slot + np.uint64(1)) & mask
        out[i] = found
    return out


@dataclass(frozen=True)
class ValueIndex:
    dtype: pl.DataType  # of the indexed values
    slots: U64  # [S, 2] the hash table (module docstring)
    null_row: int  # row of the null value, -1 if absent
    offsets: I64  # [V + 1] string values' byte offsets (empty for non-strings and packed strings)
    data: U8  # string values' UTF-8 bytes (empty for packed strings)
    packed: bool = False  # strings indexed by their packed values

    @classmethod
    def build(cls, values: pl.Series) -> ValueIndex:
        """Index V distinct values (at most one null)."""
        flat = flatten(values)
        nulls = np.flatnonzero(~flat.valid)
        null_row = int(nulls[0]) if nulls.size else -1
        num_slots = 1 << max(3, int(2 * max(values.len(), 1) - 1).bit_length())
        key = hash_key(0)
        if flat.is_string:
            words = pack(flat)
            if words is not None:
                slots = _build_bits_kernel(words, flat.valid, key, num_slots)
                return cls(values.dtype, slots, null_row, flat.offsets[:0], flat.data[:0], packed=True)
            slots = _build_strings_kernel(flat.offsets, flat.data, flat.valid, key, num_slots)
        else:
            slots = _build_bits_kernel(flat.bits, flat.valid, key, num_slots)
        return cls(values.dtype, slots, null_row, flat.offsets, flat.data)

    def lookup(self, query: pl.Series, null_row: int | None = None) -> I64:
        """[R] row of each query value; -1 where absent; nulls -> `null_row` (default: the indexed
        null's row, or -1)."""
        if query.dtype != self.dtype:
            try:
                query = query.cast(self.dtype, strict=True)
            except pl.exceptions.PolarsError as e:
                raise ValueError(
                    f"column {query.name!r}: dtype {query.dtype} does not match the fitted dtype {self.dtype}"
                ) from e
        flat = flatten(query)
        key = hash_key(0)
        null = self.null_row if null_row is None else null_row
        if flat.is_string and self.packed:
            return _lookup_packed_kernel(flat.offsets, flat.data, flat.valid, self.slots, key, null)
        if flat.is_string:
            return _lookup_strings_kernel(
                flat.offsets, flat.data, flat.valid, self.slots, self.offsets, self.data, key, null
            )
        return _lookup_bits_kernel(flat.bits, flat.valid, self.slots, key, null)


def index_of(frame: pl.DataFrame, column: str = "value") -> ValueIndex:
    """The ValueIndex of a statistics frame's value column."""
    return cached(frame, f"index:{column}", lambda f: ValueIndex.build(f[column]))
