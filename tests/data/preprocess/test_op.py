"""The ops' shared contract: InPlaceOp reads and writes its own columns and fits nothing; column selections are
normalised to distinct non-empty names; numeric and scalar columns are required with the op and column named."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pytest

from hugerec.data.preprocess.op import InPlaceOp, as_columns, require_numeric, require_scalar


@dataclass(frozen=True)
class Twice(InPlaceOp):
    columns: tuple[str, ...]


def test_an_in_place_op_reads_and_writes_its_columns() -> None:
    op = Twice(("a", "b"))
    assert op.reads() == op.writes() == ("a", "b") and not op.stateful


def test_as_columns_normalises_one_name_or_several() -> None:
    assert as_columns("a", "Clip") == ("a",)
    assert as_columns(["a", "b"], "Clip") == ("a", "b")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "Clip: columns must name at least one column"),
        ("", "Clip: columns must be non-empty strings, got \\(''\\,\\)"),
        (["a", 3], "Clip: columns must be non-empty strings, got \\('a', 3\\)"),
        (["a", "a"], "Clip: columns has duplicates: \\('a', 'a'\\)"),
    ],
)
def test_bad_selections_are_refused_naming_the_op(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        as_columns(value, "Clip")  # type: ignore[arg-type]


def test_required_kinds_of_columns() -> None:
    frame = pl.DataFrame({"x": [1.0], "flag": [True], "n": [2], "s": ["a"], "ids": [[1, 2]]})
    require_numeric(frame, ["x", "flag", "n"], "Normalize")
    require_scalar(frame, ["x", "s"], "Normalize")
    with pytest.raises(ValueError, match="Normalize: column 's' has dtype String, expected a numeric column"):
        require_numeric(frame, ["x", "s"], "Normalize")
    with pytest.raises(
        ValueError, match=r"Normalize: column 'ids' is a list column \(List\(Int64\)\); Normalize takes scalar columns"
    ):
        require_scalar(frame, ["ids"], "Normalize")
