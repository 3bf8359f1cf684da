from collections import Counter

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.categorical import PACKED, Categorify, _as_values, value_counts
from hugerec.data.preprocess.hashing import flatten
from hugerec.data.preprocess.packed import count, pack, unpack

SHORT = st.text(st.characters(exclude_characters="\0", exclude_categories=["Cs"]), max_size=8).filter(
    lambda s: len(s.encode()) <= 8
)


def _pack_reference(value: str) -> int | None:
    data = value.encode()
    return None if len(data) > 8 or b"\0" in data else int.from_bytes(data.ljust(8, b"\0"), "little")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), SHORT, st.text(max_size=12)), max_size=40))
def test_pack_unpack_match_the_bytes(values: list[str | None]) -> None:
    words = pack(flatten(pl.Series(values, dtype=pl.String)))
    packed = [None if v is None else _pack_reference(v) for v in values]
    if any(v is not None and p is None for v, p in zip(values, packed, strict=True)):
        assert words is None
        return
    assert words is not None
    assert words.tolist() == [0 if p is None else p for p in packed]
    valid = np.array([v is not None for v in values], dtype=bool)
    assert unpack(words[valid], "v").to_list() == [v for v in values if v is not None]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), SHORT), max_size=60))
def test_count_matches_counter(values: list[str | None]) -> None:
    flat = flatten(pl.Series(values, dtype=pl.String))
    words = pack(flat)
    assert words is not None
    distinct, counts = count(words, flat.valid)
    got = dict(zip(unpack(distinct, "v").to_list(), counts.tolist(), strict=True))
    assert got == Counter(v for v in values if v is not None)
    first_seen = list(dict.fromkeys(v for v in values if v is not None))
    assert unpack(distinct, "v").to_list() == first_seen


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.none(), SHORT, st.text(max_size=12)), max_size=40))
def test_categorify_value_counts_packed_or_not_equal_polars(values: list[str | None]) -> None:
    series = pl.Series(values, dtype=pl.String)
    want = series.drop_nulls().alias("value").value_counts(name="count").cast({"count": pl.Int64}).sort("value")
    got = value_counts(series)
    packable = all(v is None or _pack_reference(v) is not None for v in values)
    assert (PACKED in got.columns) == packable
    assert _as_values(got).sort("value").equals(want)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), SHORT, st.text(max_size=12)), max_size=20), min_size=1, max_size=4))
def test_categorify_merge_sums_counts_packed_or_not(chunks: list[list[str | None]]) -> None:
    op = Categorify(("c",))
    parts = [op.fit(pl.DataFrame({"c": pl.Series(chunk, dtype=pl.String)})) for chunk in chunks]
    merged = _as_values(op.merge(parts)["c"])
    want = Counter(v for chunk in chunks for v in chunk if v is not None)
    assert merged.schema == {"value": pl.String, "count": pl.Int64}
    assert dict(zip(merged["value"].to_list(), merged["count"].to_list(), strict=True)) == want
    assert merged.height == len(want)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.one_of(st.none(), SHORT, st.text(max_size=12)), max_size=20), min_size=1, max_size=4),
    st.integers(1, 3),
    st.one_of(st.none(), st.integers(0, 5)),
)
def test_categorify_vocabulary_orders_by_count_then_bytes(
    chunks: list[list[str | None]], threshold: int, max_size: int | None
) -> None:
    op = Categorify(("c",), freq_threshold=threshold, max_size=max_size)
    vocab = op.finalize(op.merge([op.fit(pl.DataFrame({"c": pl.Series(c, dtype=pl.String)})) for c in chunks]))["c"]
    counts = Counter(v for chunk in chunks for v in chunk if v is not None)
    want = sorted(((v, n) for v, n in counts.items() if n >= threshold), key=lambda vn: (-vn[1], vn[0].encode()))
    assert list(vocab.iter_rows()) == want[:max_size]
