import numpy as np
import pyarrow as pa
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.columns import _NO_ORDER, _NO_ROWS, _gather_ids, assemble, decode
from hugerec.data.schema import Schema
from hugerec.sparse.features import SparseFeatures

SCHEMA = Schema.build(dense=["x"], sparse={"a": 1 << 40, "m": 100}, multi_hot=["m"])


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_gather_ids_matches_numpy(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    ids = np.array(data.draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)), np.int64)
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    has_valid = data.draw(st.booleans())
    order = np.array(data.draw(st.permutations(range(n))), np.int64)
    has_order = data.draw(st.booleans())
    start = data.draw(st.integers(0, n))
    end = data.draw(st.integers(start, n))
    out = np.full(n, -7, np.int64)
    lengths = np.full(end - start, -7, np.int32)
    k = _gather_ids(
        ids, valid if has_valid else _NO_ROWS, has_valid, order if has_order else _NO_ORDER, has_order,
        start, end, out, lengths,
    )  # fmt: skip
    rows = order[start:end] if has_order else np.arange(start, end)
    keep = valid[rows] if has_valid else np.ones(len(rows), bool)
    assert k == keep.sum()
    np.testing.assert_array_equal(out[:k], ids[rows][keep])
    np.testing.assert_array_equal(lengths, keep.astype(np.int32))


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
    """Pieces from two decoded windows (a batch spanning them), file order or permuted."""
    t1, t2 = _table(n), _table(n + 3)
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
