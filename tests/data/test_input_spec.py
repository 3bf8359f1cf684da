"""Schema inference (infer_spec, `hugerec schema`): ids too long for int64, integer codes, and what is left dense."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hugerec.data.input_spec import ColumnSpec, InputFormat, InputSpec, infer_spec
from hugerec.data.prepare import prepare
from hugerec.data.preprocess.dataset import TEXT_ID_FIX
from hugerec.data.preprocess.errors import BadInputError


def _click_log(path: Path, rows: int = 400, seed: int = 0) -> None:
    """A mobile-ads-like log: 20-digit ids, integer codes named and unnamed, counts, a rating, a label."""
    rng = random.Random(seed)
    lines = ["id,clicked,C1,banner_pos,device_type,C14,width,visits,stars,flag,price"]
    for _ in range(rows):
        lines.append(
            f"{10**19 + rng.randrange(10**18)},{rng.randrange(2)},{rng.choice((1005, 1002, 1010))},{rng.randrange(3)},"
            f"{rng.choice((0, 1, 4, 5))},{rng.randrange(300, 24000)},{rng.choice((120, 320, 480, 728, 1024))},"
            f"{min(int(rng.expovariate(0.1)), 200)},{rng.randrange(1, 6)},{rng.randrange(2)},{rng.random() * 10:.2f}"
        )
    path.write_text("\n".join(lines) + "\n")


def test_ids_beyond_int64_are_text_and_integer_codes_are_categorical(tmp_path: Path) -> None:
    _click_log(tmp_path / "ads.csv")
    guessed = {c.name: (c.type.value, c.role_value) for c in infer_spec(tmp_path / "ads.csv").columns}
    assert guessed == {
        "id": ("string", "categorical"),  # 20 digits: no int64 holds them
        "clicked": ("int", "label"),
        "C1": ("int", "categorical"),  # by name: C<n> codes
        "banner_pos": ("int", "categorical"),  # by name: *_pos
        "device_type": ("int", "categorical"),  # by name: *_type
        "C14": ("int", "categorical"),  # thousands of codes, named C<n>
        "width": ("int", "categorical"),  # five values scattered over 120..1024: codes, whatever the name
        "visits": ("int", "dense"),  # a count
        "stars": ("int", "dense"),  # a rating 1..5: a run, not codes
        "flag": ("int", "dense"),  # a second 0/1 column is a feature, not a label
        "price": ("float", "dense"),
    }


def test_headerless_columns_are_not_taken_for_codes_by_their_names(tmp_path: Path) -> None:
    """Headerless columns are named c0, c1...: lower-case c<n> says nothing about the values."""
    rng = random.Random(1)
    rows = [f"{rng.randrange(2)}\t{int(rng.expovariate(0.5))}\t{rng.randrange(1000)}" for _ in range(300)]
    (tmp_path / "counts.tsv").write_text("\n".join(rows) + "\n")
    spec = infer_spec(tmp_path / "counts.tsv")
    assert [(c.name, c.role_value) for c in spec.columns] == [("c0", "label"), ("c1", "dense"), ("c2", "dense")]


def test_a_too_long_integer_names_the_type_to_declare_not_skipping(tmp_path: Path) -> None:
    """Declared int, a 20-digit id fails on every row: the error says type = "string", and skipping the
    bad rows (which would drop all of them) says why nothing is left."""
    _click_log(tmp_path / "ads.csv", rows=50)
    spec = InputSpec(
        InputFormat.CSV,
        ",",
        header=True,
        columns=(ColumnSpec("id", "int", "categorical"), ColumnSpec("clicked", "int", "label")),
    )
    with pytest.raises(BadInputError) as info:
        prepare(spec, str(tmp_path / "ads.csv"), tmp_path / "out")
    message = str(info.value)
    assert "line 2, column 'id'" in message and "integer out of the range of Int64" in message
    assert TEXT_ID_FIX in message and "on_error" not in message
    with pytest.raises(ValueError, match=r"no rows to learn from .*\(50 read; all skipped as bad input, first at .*line 2") as skipped:
        prepare(spec, str(tmp_path / "ads.csv"), tmp_path / "out", on_error="skip")
    assert str(skipped.value).endswith(f"{TEXT_ID_FIX})")
    fixed = InputSpec(spec.format, ",", header=True, columns=(ColumnSpec("id", "string", "categorical"), spec.columns[1]))
    assert prepare(fixed, str(tmp_path / "ads.csv"), tmp_path / "out").skipped.rows_skipped == 0


def test_an_ordinary_bad_value_still_suggests_skipping(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("user,clicked\n" + "".join(f"{i},{i % 2}\n" for i in range(20)) + "x7,1\n")
    spec = InputSpec(
        InputFormat.CSV, ",", header=True, columns=(ColumnSpec("user", "int", "user"), ColumnSpec("clicked", "int", "label"))
    )
    with pytest.raises(BadInputError, match=r"line 22, column 'user'.*'x7'.*on_error='skip'"):
        prepare(spec, str(tmp_path / "a.csv"), tmp_path / "out")
