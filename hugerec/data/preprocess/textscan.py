"""Byte-level scans of delimited text blocks: where lines start and how many fields each has.

Polars pads a line with too few fields with nulls without a word, so every text block is scanned
first; lines with the wrong field count are reported (or cut out in skip mode) before parsing.

    block = b"1\\ta\\n2\\n3\\tc\\n"   sep = "\\t"
    starts = [0, 4, 6, 10]           # [n + 1]: line i is block[starts[i]:starts[i + 1]], newline included
    counts = [2, 1, 2]               # [n] fields per line
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
NEWLINE = 10


def scan_lines_reference(block: bytes, sep: int, quote: int) -> tuple[list[int], list[int]]:
    """Plain-Python twin of `scan_lines` (quote = 0: no quoting): ([n + 1] starts, [n] field counts)."""
    starts, counts = [0], []
    fields, in_quote = 1, False
    for i, byte in enumerate(block):
        if quote and byte == quote:
            in_quote = not in_quote
        elif not in_quote and byte == sep:
            fields += 1
        elif not in_quote and byte == NEWLINE:
            starts.append(i + 1)
            counts.append(fields)
            fields = 1
    if starts[-1] < len(block):
        starts.append(len(block))
        counts.append(fields)
    return starts, counts


@njit(cache=True)
def _scan_kernel(block: U8, sep: np.uint8, quote: np.uint8) -> tuple[I64, I32]:
    n = block.shape[0]
    lines = 0
    for i in range(n):
        lines += block[i] == NEWLINE
    # one more slot for a last line without a trailing newline
    starts = np.empty(lines + 2, dtype=np.int64)
    counts = np.empty(lines + 1, dtype=np.int32)
    starts[0] = 0
    line = 0
    fields = 1
    if quote == 0:
        # the common unquoted case (Criteo TSV) without the quote test in the byte loop
        for i in range(n):
            byte = block[i]
            fields += byte == sep
            if byte == NEWLINE:
                counts[line] = fields
                line += 1
                starts[line] = i + 1
                fields = 1
    else:
        in_quote = False
        for i in range(n):
            byte = block[i]
            if byte == quote:
                in_quote = not in_quote
            elif not in_quote and byte == sep:
                fields += 1
            elif not in_quote and byte == NEWLINE:
                counts[line] = fields
                line += 1
                starts[line] = i + 1
                fields = 1
    if starts[line] < n:
        counts[line] = fields
        line += 1
        starts[line] = n
    return starts[: line + 1], counts[:line]


def scan_lines(block: U8, sep: int, quote: int) -> tuple[I64, I32]:
    """([n + 1] int64 line starts, [n] int32 field counts) of a text block; quote = 0 disables quoting."""
    return _scan_kernel(block, np.uint8(sep), np.uint8(quote))


@njit(cache=True)
def _keep_kernel(block: U8, starts: I64, keep: npt.NDArray[np.bool_]) -> U8:
    total = 0
    for line in range(keep.shape[0]):
        if keep[line]:
            total += starts[line + 1] - starts[line]
    out = np.empty(total, dtype=np.uint8)
    pos = 0
    for line in range(keep.shape[0]):
        if keep[line]:
            length = starts[line + 1] - starts[line]
            out[pos : pos + length] = block[starts[line] : starts[line + 1]]
            pos += length
    return out


def keep_lines(block: U8, starts: I64, keep: npt.NDArray[np.bool_]) -> U8:
    """The block with only the lines where `keep` [n] is true, in order."""
    return _keep_kernel(block, starts, keep)
