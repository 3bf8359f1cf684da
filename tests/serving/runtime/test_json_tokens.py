"""The big-integer token scan of JSON bodies: the Numba kernel against the bytes.translate reference."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.serving.runtime.json_tokens import may_hold_big_integers, may_hold_big_integers_reference

# the characters that decide a token's start and end, and digits in long runs
_ALPHABET = st.sampled_from(list("0123456789" * 6 + '.eE+-,[]{}: \n"ax'))


@settings(max_examples=400, deadline=None)
@given(st.text(_ALPHABET, max_size=80))
def test_the_kernel_agrees_with_the_reference_on_any_text(text: str) -> None:
    raw = text.encode()
    assert may_hold_big_integers(raw) == may_hold_big_integers_reference(raw), raw


# long texts of digit runs of every length around 19 and 20 behind every kind of character, at any offset:
# the kernel reads one byte in 19 until it meets a digit
_PIECES = st.tuples(st.text(_ALPHABET, max_size=3), st.integers(0, 45), st.sampled_from("0123456789"))


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 40), st.lists(_PIECES, max_size=30))
def test_the_kernel_agrees_with_the_reference_on_long_texts_of_runs(offset: int, pieces: list[tuple[str, int, str]]) -> None:
    raw = (" " * offset + "".join(before + digit * run for before, run, digit in pieces)).encode()
    assert may_hold_big_integers(raw) == may_hold_big_integers_reference(raw), raw


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False)), max_size=30))
def test_json_numbers_are_flagged_exactly_when_an_integer_needs_more_than_64_bits_of_digits(
    values: list[object],
) -> None:
    """Every integer outside -(10**18 - 1) .. 10**19 - 1 (a minus and 19 digits, or 20) is flagged (each one beyond 64 bits is); floats never
    are unless their integer part has 20 digits (json.dumps writes those with an exponent: never)."""
    raw = json.dumps({"data": values}).encode()
    long = any(isinstance(v, int) and not -(10**18) < v < 10**19 for v in values)
    assert may_hold_big_integers(raw) == long == may_hold_big_integers_reference(raw)
    assert not any(isinstance(v, int) and not -(2**63) <= v < 2**64 for v in values) or long


def test_edge_tokens() -> None:
    cases = {
        b"": False,
        b"18446744073709551616": True,  # 2**64: 20 digits at the text's start
        b"-9223372036854775809": True,  # -2**63 - 1: a minus and 19
        b"9223372036854775807": False,  # 19 digits: int64's largest
        b"[--9223372036854775809]": False,  # no number token (a minus after a minus)
        b"[1e-00000000000000000005]": False,  # an exponent's digits
        b"[-0.0058760265819728374]": False,  # a fraction's
        b'{"a": "123456789012345678901"}': True,  # a string of digits (only costs the standard parser)
    }
    for raw, flagged in cases.items():
        assert may_hold_big_integers(raw) == flagged == may_hold_big_integers_reference(raw), raw
    assert may_hold_big_integers(bytearray(b"[12345678901234567890]"))  # a writable buffer too
    assert may_hold_big_integers(memoryview(b"x,12345678901234567890")[1:])
    assert not may_hold_big_integers(np.full(1 << 16, ord("1"), np.uint8).tobytes()[:19])
