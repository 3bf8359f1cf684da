"""A JSON text's integer tokens too long for 64 bits, found by reading one byte in 19 until a digit, then that
digit run (serving's JSON bodies: serving/runtime/json_tokens.py holds the caller and the bytes.translate
reference the tests compare with).

A token is a run of 20 digits or more, or a minus and 19, that follows the text's start or a character other
than a digit, ".", "e", "E", "+" or "-": a fraction's or an exponent's digits follow "." or "e", a second minus
starts no number. Every 64-bit integer is shorter (2**64 has 20 digits, -2**63 - 1 a minus and 19).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

# the bytes of a request are a read-only buffer (np.frombuffer of bytes), a bytearray's a writable one: both
# signatures compiled when the module loads (from Numba's cache after the first time), none on a request
_TEXT = types.Array(types.uint8, 1, "C")


_SPAN = 19  # the shortest digit run of a token (after a minus)


@njit(inline="always")
def _digit(c: int) -> bool:
    return 48 <= c <= 57


@njit(inline="always")
def _separator(c: int) -> bool:
    """Not a digit, "-", ".", "e", "E" or "+": what a token's first character (a digit or a minus) may follow."""
    return not (48 <= c <= 57 or c == 45 or c == 46 or c == 101 or c == 69 or c == 43)


@njit(inline="always")
def _token_run(text: np.ndarray, start: int, run: int) -> bool:
    """Whether the whole digit run text[start : start + run] is a token too long for 64 bits: 20 digits after
    the start or a separator, 19 after a minus that itself follows the start or a separator (a fraction's or an
    exponent's digits follow ".", "e", "E" or "+"; a minus after anything else starts no number)."""
    if start == 0:
        return run >= 20
    before = text[start - 1]
    if before == 45:  # "-"
        return run >= 19 and (start == 1 or _separator(text[start - 2]))
    return _separator(before) and run >= 20


@njit([types.boolean(_TEXT), types.boolean(_TEXT.copy(readonly=True))], cache=True, nogil=True)
def big_integer_token(text: np.ndarray) -> bool:
    """Whether text [n] uint8 has an integer token of 20 digits or more, or a minus and 19.

    Such a token holds a run of at least 19 digits, and every run of 19 holds one of the positions 18, 37,
    56, ... (19 apart, counted again after each run looked at): only the bytes there are read until one is a
    digit; then its whole run is measured and the characters before it decide whether it starts a token. A
    JSON header with no long digit runs is read at one byte in 19."""
    n = text.shape[0]
    p = _SPAN - 1
    while p < n:
        if not _digit(text[p]):
            p += _SPAN
            continue
        start, end = p, p + 1
        while start > 0 and _digit(text[start - 1]):
            start -= 1
        while end < n and _digit(text[end]):
            end += 1
        if end - start >= _SPAN and _token_run(text, start, end - start):
            return True
        p = end + _SPAN  # the next run starts after `end`; every 19 positions from there hold one sample
    return False
