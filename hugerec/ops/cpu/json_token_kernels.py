"""A JSON text's integer tokens too long for 64 bits, found in one pass over its bytes (serving's JSON bodies:
serving/runtime/json_tokens.py holds the caller and the bytes.translate reference the tests compare with).

A token is a run of 20 digits or more, or a minus and 19, that follows the text's start or a character other
than a digit, ".", "e", "E", "+" or "-": a fraction's or an exponent's digits follow "." or "e", a second minus
starts no number. Every 64-bit integer is shorter (2**64 has 20 digits, -2**63 - 1 a minus and 19).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

_AFTER_SEPARATOR, _AFTER_MINUS, _IN_RUN, _NOT_A_TOKEN = 0, 1, 2, 3

# the bytes of a request are a read-only buffer (np.frombuffer of bytes), a bytearray's a writable one: both
# signatures compiled when the module loads (from Numba's cache after the first time), none on a request
_TEXT = types.Array(types.uint8, 1, "C")


@njit([types.boolean(_TEXT), types.boolean(_TEXT.copy(readonly=True))], cache=True, nogil=True)
def big_integer_token(text: np.ndarray) -> bool:
    """Whether text [n] uint8 has an integer token of 20 digits or more, or a minus and 19."""
    state, run, need = _AFTER_SEPARATOR, 0, 20
    for c in text:
        if 48 <= c <= 57:  # a digit
            if state == _IN_RUN:
                run += 1
            elif state == _AFTER_SEPARATOR:
                state, run, need = _IN_RUN, 1, 20
            elif state == _AFTER_MINUS:
                state, run, need = _IN_RUN, 1, 19
            else:
                continue
            if run >= need:
                return True
        elif c == 45:  # "-": starts a token only right after a separator
            state = _AFTER_MINUS if state == _AFTER_SEPARATOR else _NOT_A_TOKEN
        elif c == 46 or c == 101 or c == 69 or c == 43:  # . e E +: a fraction or an exponent follows
            state = _NOT_A_TOKEN
        else:
            state = _AFTER_SEPARATOR
    return False
