"""FeatureStore: whole-row writes and column updates read back in table order, save/load through every tier
that needs no server (memory, RocksDB), and refusals naming the table, column and value: an integer float32
cannot hold exactly, NaN, a missing column, an update of an absent row, repeated ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hugerec.serving.pipeline.feature_store import SCHEMA_FILE, FeatureStore
from hugerec.serving.store.memory_store import MemoryStore

TABLES = {"item": ("price", "category", "available"), "user": ("age",)}


def _store() -> FeatureStore:
    store = FeatureStore.in_memory(TABLES)
    store.write(
        "item",
        np.array([10, 20, 30]),
        {"price": np.array([1.5, 2.5, 3.5]), "category": np.array([4, 5, 4]), "available": np.array([1, 0, 1])},
    )
    return store


def test_write_read_in_column_order_and_absent_ids() -> None:
    store = _store()
    values, found = store.read("item", np.array([30, 99, 10]))
    np.testing.assert_array_equal(found, [True, False, True])
    np.testing.assert_array_equal(values, [[3.5, 4, 1], [0, 0, 0], [1.5, 4, 1]])
    assert store.column("item", "category") == 1 and store.count("item") == 3 and store.count("user") == 0


def test_update_changes_only_the_columns_given() -> None:
    store = _store()
    store.update("item", np.array([20]), {"available": np.array([1])})
    np.testing.assert_array_equal(store.read("item", np.array([20]))[0], [[2.5, 5, 1]])
    with pytest.raises(ValueError, match="table 'item' has no row for id 77 \\(write whole rows first\\)"):
        store.update("item", np.array([20, 77]), {"price": np.array([1.0, 2.0])})


def test_rows_as_an_array_and_delete() -> None:
    store = FeatureStore.in_memory({"user": ("age", "region")})
    store.write("user", np.array([1, 2], np.int32), np.array([[30, 7], [40, 8]], np.float32))
    store.delete("user", np.array([1]))
    values, found = store.read("user", np.array([1, 2]))
    np.testing.assert_array_equal(found, [False, True])
    np.testing.assert_array_equal(values[1], [40, 8])


@pytest.mark.parametrize("tier", ["memory", "rocksdb"])
def test_save_and_load_on_a_tier(tmp_path: Path, tier: str) -> None:
    saved = _store().save(tmp_path / "features")
    assert sorted(p.name for p in saved.iterdir()) == ["features.json", "item.npz", "user.npz"]
    location = str(tmp_path / "db") if tier == "rocksdb" else None
    loaded = FeatureStore.load(saved, tier=tier, location=location)
    assert loaded.tables == TABLES
    values, found = loaded.read("item", np.array([10, 20, 30]))
    assert found.all()
    np.testing.assert_array_equal(values[:, 0], [1.5, 2.5, 3.5])
    assert loaded.count("user") == 0
    loaded.close()


def test_load_refuses_a_missing_schema_and_a_misshapen_table(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{tmp_path / SCHEMA_FILE} is missing or not a feature schema"):
        FeatureStore.load(tmp_path)
    folder = _store().save(tmp_path / "f")
    np.savez(folder / "user.npz", ids=np.array([1, 2]), values=np.zeros((2, 3), np.float32))
    with pytest.raises(
        ValueError, match=r"user\.npz holds ids \(2,\) / values \(2, 3\) float32, expected \[N\] / \[N, 1\]"
    ):
        FeatureStore.load(folder)


@pytest.mark.parametrize(
    ("tier", "location", "message"),
    [
        ("redis", None, "tier 'redis' needs the server's URL"),
        ("rocksdb", "", "tier 'rocksdb' needs a folder"),
        ("disk", None, "tier must be 'memory', 'redis' or 'rocksdb', got 'disk'"),
    ],
)
def test_bad_tiers_are_refused(tier: str, location: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FeatureStore.on_tier(TABLES, tier, location)


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ValueError, match=r"table 'item' needs distinct column names, got \['a', 'a'\]"):
        FeatureStore.in_memory({"item": ("a", "a")})
    with pytest.raises(ValueError, match="the memory store holds table 'item' with dim 2, its columns are 3"):
        FeatureStore(MemoryStore({"item": 2}), {"item": ("a", "b", "c")})


def test_bad_writes_name_the_column_and_value() -> None:
    store = _store()
    ok = {"price": np.array([1.0]), "category": np.array([1]), "available": np.array([1])}
    with pytest.raises(ValueError, match=r"column item\.category value 16777216 is not exact in float32"):
        store.write("item", np.array([1]), {**ok, "category": np.array([1 << 24])})
    with pytest.raises(ValueError, match=r"column item\.price holds NaN or infinite values"):
        store.write("item", np.array([1]), {**ok, "price": np.array([np.nan])})
    with pytest.raises(ValueError, match=r"a write to table 'item' lacks columns \['available'\]"):
        store.write("item", np.array([1]), {"price": np.array([1.0]), "category": np.array([1])})
    with pytest.raises(ValueError, match=r"column item.price has shape \(2,\), expected \(1,\)"):
        store.write("item", np.array([1]), {**ok, "price": np.array([1.0, 2.0])})
    with pytest.raises(
        ValueError, match=r"table 'item' has no column 'colour'; it has \['price', 'category', 'available'\]"
    ):
        store.update("item", np.array([10]), {"colour": np.array([1.0])})
    with pytest.raises(ValueError, match="ids of table 'item' must be unique in one write"):
        store.write("item", np.array([1, 1]), np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"ids of table 'item' must be \[N\] integers, got \(1,\) float64"):
        store.delete("item", np.array([1.0]))
    with pytest.raises(ValueError, match=r"rows of table 'item' must be \[1, 3\], got \(1, 2\)"):
        store.write("item", np.array([1]), np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"unknown table 'shop'; have \['item', 'user'\]"):
        store.read("shop", np.array([1]))
    assert store.count("item") == 3  # nothing of the refused writes landed
