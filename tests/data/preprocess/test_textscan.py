import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.textscan import keep_lines, scan_lines, scan_lines_reference


def _scan(block: bytes, sep: int, quote: int) -> tuple[list[int], list[int]]:
    starts, counts = scan_lines(np.frombuffer(block, dtype=np.uint8), sep, quote)
    return starts.tolist(), counts.tolist()


def test_example_from_docstring():
    assert _scan(b"1\ta\n2\n3\tc\n", ord("\t"), 0) == ([0, 4, 6, 10], [2, 1, 2])
    assert _scan(b"", ord("\t"), 0) == ([0], [])
    assert _scan(b"x\ty", ord("\t"), 0) == ([0, 3], [2])  # last line without newline


def test_quoted_separators_and_newlines_do_not_count():
    block = b'a,"b,c",d\n"x\ny",z\n'
    assert _scan(block, ord(","), ord('"')) == scan_lines_reference(block, ord(","), ord('"'))
    assert _scan(block, ord(","), ord('"'))[1] == [3, 2]


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_matches_reference(block, quoted):
    quote = ord('"') if quoted else 0
    assert _scan(block, ord("\t"), quote) == scan_lines_reference(block, ord("\t"), quote)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet="ab\t", max_size=6), max_size=12), st.data())
def test_keep_lines_keeps_exactly_the_chosen_lines(lines, data):
    block = "".join(line + "\n" for line in lines).encode()
    starts, _ = scan_lines(np.frombuffer(block, dtype=np.uint8), ord("\t"), 0)
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=len(lines), max_size=len(lines))), dtype=bool)
    got = keep_lines(np.frombuffer(block, dtype=np.uint8), starts, keep).tobytes()
    assert got == "".join(line + "\n" for line, k in zip(lines, keep, strict=True) if k).encode()
