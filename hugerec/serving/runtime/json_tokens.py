"""Whether a JSON text may hold an integer literal beyond 64 bits, found before any parser converts one.

orjson reads an integer of 20 digits or more that a float can hold as that float, silently, so parse_json
(inference_protocol.py) sends a body with such a token to the standard parser, which refuses it with the
field's name. The token: a run of 20 digits or more, or a minus and 19, that starts a token, i.e. follows the
text's start or a character other than a digit, ".", "e", "E", "+" or "-" (a fraction's or an exponent's
digits follow "." or "e"; a string of digits may look like one, which only costs the slower parser). Every
64-bit integer is shorter, so a body without one keeps orjson.

`may_hold_big_integers` is a Numba kernel (ops/cpu/json_token_kernels.py) that reads one byte in 19 until
it meets a digit (a token holds a run of 19 digits or more) and then measures that run;
`may_hold_big_integers_reference` is the same test with bytes.translate and two substring searches, which
the tests compare it against. Those searches step about one byte at a time on the digit-dense text of a
tensor's floats (CPython's search skips ahead only past characters the needle lacks, and uses its two-way
search only above 30 KB), so for the bodies of batches of 1 to 64 rows they cost more than orjson's parse.
"""

from __future__ import annotations

import numpy as np

from hugerec.ops.cpu.json_token_kernels import big_integer_token


def may_hold_big_integers(raw: bytes | bytearray | memoryview) -> bool:
    """Whether the JSON text has an integer literal of 20 digits or more, or a minus and 19 (or a string of them)."""
    return bool(big_integer_token(np.frombuffer(raw, np.uint8)))


# digits -> "0", . e E + - kept, every other character -> ","
_TOKENS = bytes(0x30 if 0x30 <= c <= 0x39 else c if c in b".eE+-" else 0x2C for c in range(256))
_TWENTY_DIGITS, _MINUS_NINETEEN = b"," + b"0" * 20, b",-" + b"0" * 19


def may_hold_big_integers_reference(raw: bytes | bytearray | memoryview) -> bool:
    """may_hold_big_integers with bytes.translate and substring searches (the reference of the tests)."""
    zeros = b"," + bytes(raw).translate(_TOKENS)
    return _TWENTY_DIGITS in zeros or _MINUS_NINETEEN in zeros
