"""Where a JSON text may hold an integer literal beyond 64 bits, found before any parser converts one.

orjson reads an integer of 20 digits or more that a float can hold as that float, silently, so parse_json
(inference_protocol.py) sends a body with such a token to the standard parser, which refuses it with the
field's name. The token it looks for: a run of 20 digits or more, or a minus and 19, that starts a token,
i.e. follows the text's start or a character other than a digit, ".", "e", "E", "+" or "-" (a fraction's or
an exponent's digits follow "." or "e"; a string of digits may look like one, which only costs the slower
parser). Every 64-bit integer has fewer (2**64 has 20 digits, -2**63 - 1 a minus and 19), so a body without
one keeps orjson.

`may_hold_big_integers` is one pass of a Numba kernel over the bytes; `may_hold_big_integers_reference` is
the same test with bytes.translate and two substring searches, which the tests compare it against. The
searches step about one byte at a time on the digit-dense text of a tensor's floats (CPython's search skips
ahead only past characters the needle lacks), so for the bodies of batches of 1 to 64 rows they cost more
than orjson's parse itself.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

_AFTER_SEPARATOR, _AFTER_MINUS, _IN_RUN, _NOT_A_TOKEN = 0, 1, 2, 3


# the bytes of a request are a read-only buffer (np.frombuffer of bytes), a bytearray's a writable one: both
# signatures compiled when the module loads (from Numba's cache after the first time), none on a request
_TEXT = types.Array(types.uint8, 1, "C")


@njit([types.boolean(_TEXT), types.boolean(_TEXT.copy(readonly=True))], cache=True, nogil=True)
def _big_integer_token(text: np.ndarray) -> bool:
    """Whether text has a token of 20 digits or more, or a minus and 19 (see the module's docstring)."""
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


def may_hold_big_integers(raw: bytes | bytearray | memoryview) -> bool:
    """Whether the JSON text has an integer literal of 20 digits or more, or a minus and 19 (or a string of them)."""
    return bool(_big_integer_token(np.frombuffer(raw, np.uint8)))


# digits -> "0", . e E + - kept, every other character -> ","
_TOKENS = bytes(0x30 if 0x30 <= c <= 0x39 else c if c in b".eE+-" else 0x2C for c in range(256))
_TWENTY_DIGITS, _MINUS_NINETEEN = b"," + b"0" * 20, b",-" + b"0" * 19


def may_hold_big_integers_reference(raw: bytes | bytearray | memoryview) -> bool:
    """may_hold_big_integers with bytes.translate and substring searches (the reference of the tests)."""
    zeros = b"," + bytes(raw).translate(_TOKENS)
    return _TWENTY_DIGITS in zeros or _MINUS_NINETEEN in zeros
