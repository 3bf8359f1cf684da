import numpy as np
import pyarrow as pa
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.columns import _compact_ids, _scatter_ids, assemble, decode
from hugerec.data.schema import Schema
from hugerec.sparse.features import SparseFeatures

SCHEMA = Schema.build(dense=["x"], sparse={"a": 1 << 40, "m": 100}, multi_hot=["m"])


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_compact_ids_matches_numpy(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 40))
    ids = np.array(data.draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)), np.int64)
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), np.bool_)
    start = data.draw(st.integers(0, n))
    end = data.draw(st.integers(start, n))
    out = np.full(n, -7, np.int64)
    lengths = np.full(end - start, -7, np.int32)
    k = _compact_ids(ids, valid, start, end, out, lengths)
    keep = valid[start:end]
    assert k == keep.sum()
    np.testing.assert_array_equal(out[:k], ids[start:end][keep])
    np.testing.assert_array_equal(lengths, keep.astype(np.int32))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_scatter_ids_matches_numpy(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 40))
    ids = data.draw(st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), min_size=n, max_size=n))
    start = data.draw(st.integers(0, n))  # a sliced Arrow array: its bitmap starts at bit `start`
    arr = pa.array(ids, pa.int64()).slice(start)
    m = len(arr)
    positions = np.array(data.draw(st.permutations(range(m))), np.int64)
    bitmap = arr.buffers()[0]
    has_bitmap = arr.null_count > 0 and bitmap is not None
    bits = np.frombuffer(bitmap, np.uint8) if has_bitmap else np.zeros(0, np.uint8)
    track = data.draw(st.booleans())
    raw = np.frombuffer(arr.buffers()[1], np.int64, count=arr.offset + m)[arr.offset :]
    out = np.full(m, -7, np.int64)
    valid = np.zeros(m if track else 0, np.bool_)
    _scatter_ids(raw, bits, arr.offset, has_bitmap, positions, out, valid)
    np.testing.assert_array_equal(out[positions], raw)
    if track:
        np.testing.assert_array_equal(valid[positions], [x is not None for x in arr.to_pylist()])


def _table(n: int) -> pa.Table:
    return pa.table(
        {
            "label": pa.array(np.arange(n) % 2, pa.int8()),
            "x": pa.array(np.arange(n, dtype=np.float64)),
            "a": pa.array([None if i % 3 == 0 else i * 2**33 for i in range(n)], pa.int64()),
            "m": pa.array([[i % 100] * (i % 4) if i % 5 else None for i in range(n)], pa.list_(pa.int32())),
        }
    )


def _reference(table: pa.Table, rows: list[int]) -> tuple[list[float], SparseFeatures]:
    a = table["a"].to_pylist()
    m = table["m"].to_pylist()
    sparse = SparseFeatures.from_lists(
        {"a": [[] if a[r] is None else [a[r]] for r in rows], "m": [m[r] or [] for r in rows]}
    )
    return [float(r) for r in rows], sparse


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 30), st.booleans(), st.data())
def test_assemble_matches_reference(n: int, shuffled: bool, data: st.DataObject) -> None:
    """Pieces from two decoded windows (a batch spanning them), file order or permuted; the first window
    is made of two row groups (two Arrow chunks, the second one a slice with nonzero offsets)."""
    split = data.draw(st.integers(0, n))
    t1, t2 = pa.concat_tables([_table(n).slice(0, split), _table(n).slice(split)]), _table(n + 3)
    o1 = np.array(data.draw(st.permutations(range(n))), np.int64) if shuffled else None
    o2 = np.array(data.draw(st.permutations(range(n + 3))), np.int64) if shuffled else None
    c1, c2 = decode(t1, SCHEMA, o1), decode(t2, SCHEMA, o2)
    s1 = data.draw(st.integers(0, n))
    e2 = data.draw(st.integers(0, n + 3))
    batch = assemble([(c1, s1, n), (c2, 0, e2)], SCHEMA.sparse_names)
    r1 = (o1 if o1 is not None else np.arange(n))[s1:n].tolist()
    r2 = (o2 if o2 is not None else np.arange(n + 3))[0:e2].tolist()
    x1, ref1 = _reference(t1, r1)
    x2, ref2 = _reference(t2, r2)
    assert batch.dense[:, 0].tolist() == x1 + x2
    assert batch.labels.tolist() == [float(r % 2) for r in r1 + r2]
    for key in SCHEMA.sparse_names:
        got = batch.sparse[key].to_lists()
        assert got == ref1[key].to_lists() + ref2[key].to_lists()
    SparseFeatures(batch.sparse.keys, batch.sparse.values, batch.sparse.lengths)  # consistent
    assert batch.sparse.values.dtype == torch.int64
