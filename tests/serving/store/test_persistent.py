"""PersistentStore's own contract beside the Store one (tests/serving/store/test_tiers.py): rows and metadata
survive a reopen, a write batch is all or nothing, a checkpoint is a consistent copy, a read-only open of
missing tables and a locked database are refused with the path named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hugerec.serving.store.persistent import PersistentStore


def test_rows_and_metadata_survive_a_reopen(tmp_path: Path) -> None:
    store = PersistentStore(tmp_path / "db", {"a": 2, "b": 1})
    store.put("a", np.array([-(1 << 62), 7], np.int64), np.array([[1, 2], [3, 4]], np.float32))
    store.set_meta("version", "v3")
    store.close()
    again = PersistentStore(tmp_path / "db", {"a": 2, "b": 1}, read_only=True)
    rows, found = again.get("a", np.array([7, 8, -(1 << 62)], np.int64))
    np.testing.assert_array_equal(found, [True, False, True])
    np.testing.assert_array_equal(rows, [[3, 4], [0, 0], [1, 2]])
    assert again.get_meta("version") == "v3" and again.get_meta("absent") is None
    assert again.count("a") == 2 and again.count("b") == 0
    again.close()


def test_one_write_puts_deletes_and_sets_metadata_together(tmp_path: Path) -> None:
    store = PersistentStore(tmp_path / "db", {"a": 1, "b": 1})
    store.put("b", np.array([1, 2], np.int64), np.array([[1.0], [2.0]], np.float32))
    store.write(
        {"a": (np.array([5], np.int64), np.array([[5.0]], np.float32))}, {"b": np.array([1], np.int64)}, {"step": "9"}
    )
    assert store.count("a") == 1 and store.count("b") == 1 and store.get_meta("step") == "9"
    # a bad part refuses the whole batch: nothing of it is written
    with pytest.raises(ValueError, match=r"rows of table 'b' must be \[1, 1\] float32"):
        store.write(
            {
                "a": (np.array([6], np.int64), np.array([[6.0]], np.float32)),
                "b": (np.array([3], np.int64), np.zeros((1, 2), np.float32)),
            },
            {},
        )
    assert not store.get("a", np.array([6], np.int64))[1].any()
    store.close()


def test_scan_in_chunks_in_key_order(tmp_path: Path) -> None:
    store = PersistentStore(tmp_path / "db", {"a": 1})
    keys = np.array([3, -4, 10, 0, -1], np.int64)
    store.put("a", keys, keys[:, None].astype(np.float32))
    chunks = list(store.scan("a", chunk_rows=2))
    assert [k.shape[0] for k, _ in chunks] == [2, 2, 1]
    got = np.concatenate([k for k, _ in chunks])
    np.testing.assert_array_equal(got, np.sort(keys))  # byte order of the encoded keys is numeric order
    np.testing.assert_array_equal(np.concatenate([r for _, r in chunks])[:, 0], got)
    store.close()


def test_checkpoint_is_a_copy_that_later_writes_do_not_reach(tmp_path: Path) -> None:
    store = PersistentStore(tmp_path / "db", {"a": 1})
    store.put("a", np.array([1], np.int64), np.array([[1.0]], np.float32))
    store.checkpoint(tmp_path / "copy")
    store.put("a", np.array([2], np.int64), np.array([[2.0]], np.float32))
    store.close()
    copy = PersistentStore(tmp_path / "copy", {"a": 1})
    assert copy.count("a") == 1
    copy.close()


def test_read_only_open_of_missing_tables_is_refused(tmp_path: Path) -> None:
    PersistentStore(tmp_path / "db", {"a": 1}).close()
    with pytest.raises(ValueError, match=r"has no rows for tables \['b'\]"):
        PersistentStore(tmp_path / "db", {"a": 1, "b": 1}, read_only=True)


def test_a_database_open_elsewhere_is_refused_naming_the_path(tmp_path: Path) -> None:
    store = PersistentStore(tmp_path / "db", {"a": 1})
    with pytest.raises(ValueError, match=rf"cannot open RocksDB at {tmp_path / 'db'}"):
        PersistentStore(tmp_path / "db", {"a": 1})
    store.close()


def test_empty_get(tmp_path: Path) -> None:
    store = PersistentStore(tmp_path / "db", {"a": 4})
    rows, found = store.get("a", np.zeros(0, np.int64))
    assert rows.shape == (0, 4) and found.shape == (0,)
    store.close()
