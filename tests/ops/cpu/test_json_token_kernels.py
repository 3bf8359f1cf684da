"""big_integer_token against a regular expression of its definition (a run of 20 digits, or a minus and 19,
after the start or a character other than a digit, ".", "e", "E", "+" or "-"): random texts of the characters
that matter, the 19/20-digit edges at every offset of the one-byte-in-19 sampling, and read-only and writable
buffers alike."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.ops.cpu.json_token_kernels import big_integer_token

TOKEN = re.compile(r"(?<![0-9.eE+\-])(?:[0-9]{20}|-[0-9]{19})")


def _reference(text: str) -> bool:
    return TOKEN.search(text) is not None


def _kernel(text: str, writable: bool = False) -> bool:
    raw = text.encode()
    array = np.frombuffer(bytearray(raw) if writable else raw, dtype=np.uint8)
    return bool(big_integer_token(array))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789-.eE+ ,[]:", max_size=120))
def test_agrees_with_the_definition_on_any_text(text: str) -> None:
    assert _kernel(text) == _reference(text)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 60), st.integers(17, 22), st.sampled_from(["", "-", "[", ",", ".", "e", "E", "+", "--", "1-", " -"])
)
def test_edges_at_every_offset(offset: int, digits: int, before: str) -> None:
    text = " " * offset + before + "9" * digits + "]"
    assert _kernel(text) == _reference(text)
    assert _kernel(text, writable=True) == _reference(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", False),
        ("1" * 20, True),
        ("1" * 19, False),
        ("-" + "1" * 19, True),
        ("-" + "1" * 18, False),
        ('{"k": 18446744073709551615}', True),  # 2**64 - 1: 20 digits, too long by this count
        ('{"k": -9223372036854775808}', True),  # -2**63: a minus and 19
        ('{"k": 9223372036854775807}', False),  # 2**63 - 1: 19 digits
        ("[1." + "0" * 30 + "]", False),  # a fraction's digits
        ("[1e" + "0" * 30 + "]", False),  # an exponent's
        ("[1e+" + "0" * 30 + "]", False),
        ("[--" + "1" * 19 + "]", False),  # a second minus starts no number
    ],
)
def test_known_texts(text: str, expected: bool) -> None:
    assert _kernel(text) is expected and _reference(text) is expected
