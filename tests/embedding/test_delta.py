"""Delta export / import: exactly the touched keys, documented Parquet schema, bit-exact round trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.delta import apply_delta, collect_delta, export_delta, import_delta, read_delta, write_delta
from hugerec.embedding.optimizers import SGD, Adam, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing, StorageDtype, TableConfig
from hugerec.sparse.features import SparseFeatures


def _tables(dtype: StorageDtype = StorageDtype.FP32) -> list[TableConfig]:
    return [
        TableConfig("user", num_rows=64, dim=4, dtype=dtype, dynamic=DynamicConfig(eviction=Eviction.LRU)),
        TableConfig(
            "item",
            num_rows=64,
            dim=3,
            features=("item", "last"),
            dtype=dtype,
            optimizer=Adam(lr=0.01),
            dynamic=DynamicConfig(missing=Missing.UNKNOWN_ROW),
        ),
        TableConfig("slot", num_rows=5, dim=4),  # static: not in deltas
    ]


def _batch(rng: np.random.Generator) -> SparseFeatures:
    big = 2**63 - 1
    return SparseFeatures.from_lists(
        {
            "user": [[big - int(rng.integers(0, 20))] for _ in range(8)],
            "item": [[int(rng.integers(-20, 20)) for _ in range(rng.integers(0, 3))] for _ in range(8)],
            "last": [[int(rng.integers(-20, 20))] for _ in range(8)],
            "slot": [[int(rng.integers(0, 5))] for _ in range(8)],
        }
    )


def _train(emb: EmbeddingCollection, batches: list[SparseFeatures]) -> None:
    for b in batches:
        emb(b).values.square().sum().backward()


def test_delta_since_a_step_holds_exactly_the_touched_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    emb = EmbeddingCollection(_tables(), optimizer=RowWiseAdagrad(lr=0.1))
    batches = [_batch(rng) for _ in range(6)]
    _train(emb, batches[:3])
    mark = export_delta(emb, tmp_path / "d0.parquet")
    assert mark == {"user": 3, "item": 3}
    _train(emb, batches[3:])
    export_delta(emb, tmp_path / "d1.parquet", since=mark)
    deltas = {d.table: d for d in read_delta(tmp_path / "d1.parquet")}
    assert set(deltas) == {"user", "item"}
    later = batches[3:]
    assert set(deltas["user"].keys.tolist()) == {k for b in later for k in b["user"].values.tolist()}
    item_keys = {k for b in later for f in ("item", "last") for k in b[f].values.tolist()}
    assert set(deltas["item"].keys.tolist()) == item_keys
    assert deltas["item"].since_step == 3 and int(deltas["item"].steps.min()) >= 4
    first = {d.table: set(d.keys.tolist()) for d in read_delta(tmp_path / "d0.parquet")}
    assert first["user"] == {k for b in batches[:3] for k in b["user"].values.tolist()}


@pytest.mark.parametrize(
    ("dtype", "optimizer"),
    [(StorageDtype.FP32, RowWiseAdagrad(lr=0.1)), (StorageDtype.BF16, SGD(lr=0.1)), (StorageDtype.FP16, Adam())],
)
def test_export_import_round_trips_bit_for_bit(tmp_path: Path, dtype: StorageDtype, optimizer: Optimizer) -> None:
    rng = np.random.default_rng(1)
    src = EmbeddingCollection(_tables(dtype), optimizer=optimizer)
    _train(src, [_batch(rng) for _ in range(4)])
    export_delta(src, tmp_path / "all.parquet")
    dst = EmbeddingCollection(_tables(dtype), optimizer=optimizer)
    import_delta(dst, tmp_path / "all.parquet")
    for name in ("user", "item"):
        keys = src.hash_tables[name].export().keys
        src_rows, dst_rows = src.hash_tables[name].find(keys), dst.hash_tables[name].find(keys)
        assert bool((dst_rows >= 0).all())
        w_src, s_src = src.read_rows(name, src_rows)
        w_dst, s_dst = dst.read_rows(name, dst_rows)
        assert torch.equal(
            w_src.view(torch.int16 if dtype is not StorageDtype.FP32 else torch.int32),
            w_dst.view(torch.int16 if dtype is not StorageDtype.FP32 else torch.int32),
        )
        assert s_src.keys() == s_dst.keys() and all(torch.equal(s_src[k], s_dst[k]) for k in s_src)
    unknown = src.hash_tables["item"].unknown_row
    assert unknown is not None
    assert torch.equal(src.table_weight("item")[unknown], dst.table_weight("item")[unknown])
    # and the re-export of the imported tables carries the same rows
    a = {d.table: d for d in collect_delta(src)}
    b = {d.table: d for d in collect_delta(dst)}
    for name in a:
        order_a, order_b = torch.argsort(a[name].keys), torch.argsort(b[name].keys)
        assert torch.equal(a[name].keys[order_a], b[name].keys[order_b])
        assert torch.equal(a[name].vectors[order_a], b[name].vectors[order_b])
        assert all(torch.equal(a[name].state[k][order_a], b[name].state[k][order_b]) for k in a[name].state)


def test_file_schema_is_the_documented_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    emb = EmbeddingCollection(_tables(), optimizer=RowWiseAdagrad(lr=0.1))
    _train(emb, [_batch(rng)])
    export_delta(emb, tmp_path / "d.parquet")
    table = pq.read_table(tmp_path / "d.parquet")
    assert table.schema.names == ["table", "key", "vector", "state", "step"]
    assert [table.schema.field(n).type for n in table.schema.names] == [
        pa.string(),
        pa.int64(),
        pa.list_(pa.float32()),
        pa.list_(pa.float32()),
        pa.int64(),
    ]
    rows = table.to_pylist()
    unknown = [r for r in rows if r["key"] is None]
    assert [r["table"] for r in unknown] == ["item"]  # the unknown row: a null key
    user = [r for r in rows if r["table"] == "user"]
    assert all(len(r["vector"]) == 4 and len(r["state"]) == 1 for r in user)  # row-wise Adagrad: one sum
    item = [r for r in rows if r["table"] == "item" and r["key"] is not None]
    assert all(len(r["state"]) == 6 for r in item)  # Adam: exp_avg [3] + exp_avg_sq [3]
    d = {x.table: x for x in read_delta(tmp_path / "d.parquet")}
    assert set(d["item"].state) == {"exp_avg", "exp_avg_sq"} and d["item"].state["exp_avg"].shape[1] == 3
    assert d["user"].state["sum"].dim() == 1


def test_empty_delta_and_bad_files(tmp_path: Path) -> None:
    emb = EmbeddingCollection(_tables(), optimizer=RowWiseAdagrad(lr=0.1))
    write_delta([], tmp_path / "empty.parquet")
    assert read_delta(tmp_path / "empty.parquet") == []
    deltas = collect_delta(emb)
    assert [len(d) for d in deltas] == [0, 0]
    with pytest.raises(ValueError, match="more than one delta for a table"):
        write_delta(deltas + deltas, tmp_path / "twice.parquet")
    write_delta(deltas, tmp_path / "nothing.parquet")
    assert [len(d) for d in read_delta(tmp_path / "nothing.parquet")] == [0, 0]
    pq.write_table(pa.table({"key": [1, 2]}), tmp_path / "foreign.parquet")
    with pytest.raises(ValueError, match="not a hugerec delta file"):
        read_delta(tmp_path / "foreign.parquet")
    other = EmbeddingCollection([TableConfig("user", num_rows=8, dim=5, dynamic=DynamicConfig())])
    rng = np.random.default_rng(3)
    _train(emb, [_batch(rng)])
    with pytest.raises(ValueError, match="table 'user' has dim 5, the delta 4"):
        apply_delta(other, [d for d in collect_delta(emb) if d.table == "user"])
    with pytest.raises(ValueError, match="'item' is not a dynamic table"):
        apply_delta(other, [d for d in collect_delta(emb) if d.table == "item"])
