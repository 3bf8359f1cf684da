"""RedisStore's own contract beside the Store one (tests/serving/store/test_tiers.py): namespaces keep replicas'
tables apart, get_group is one round trip over several tables, clear drops only its namespace; a bad namespace
and an unreachable server are refused with the value named. Needs a redis-server binary (skipped without)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from hugerec.serving.store.redis_store import RedisStore
from tests.serving.conftest import free_port


@pytest.mark.parametrize("namespace", ["", "bundle:"])
def test_bad_namespace_is_refused(namespace: str) -> None:
    with pytest.raises(
        ValueError, match=f"namespace must be a non-empty name without a trailing ':', got {namespace!r}"
    ):
        RedisStore("redis://127.0.0.1:1/0", {"a": 1}, namespace=namespace)


def test_unreachable_server_is_named() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(ConnectionError, match=f"cannot reach Redis at {url}"):
        RedisStore(url, {"a": 1})


def test_namespaces_are_apart_and_clear_drops_only_its_own(redis_url: str) -> None:
    ns = uuid.uuid4().hex
    one = RedisStore(redis_url, {"a": 2, "b": 2}, namespace=f"{ns}-one")
    two = RedisStore(redis_url, {"a": 2}, namespace=f"{ns}-two")
    one.put("a", np.array([1, 2], np.int64), np.array([[1, 1], [2, 2]], np.float32))
    one.put("b", np.array([1], np.int64), np.array([[5, 5]], np.float32))
    two.put("a", np.array([1], np.int64), np.array([[9, 9]], np.float32))
    rows, found = one.get_group(["a", "b"], np.array([1, 0, 1, 0]), np.array([1, 1, 2, 3], np.int64))
    np.testing.assert_array_equal(found, [True, True, False, False])
    np.testing.assert_array_equal(rows, [[5, 5], [1, 1], [0, 0], [0, 0]])
    one.clear()
    assert one.count("a") == 0 and one.count("b") == 0
    np.testing.assert_array_equal(two.get("a", np.array([1], np.int64))[0], [[9, 9]])
    two.clear()
    one.close()
    two.close()


def test_empty_put_and_get_and_scan(redis_url: str) -> None:
    store = RedisStore(redis_url, {"a": 3}, namespace=uuid.uuid4().hex)
    store.put("a", np.zeros(0, np.int64), np.zeros((0, 3), np.float32))
    rows, found = store.get("a", np.zeros(0, np.int64))
    assert rows.shape == (0, 3) and found.shape == (0,) and list(store.scan("a")) == []
    keys = np.arange(-5, 5, dtype=np.int64)
    store.put("a", keys, np.repeat(keys[:, None], 3, axis=1).astype(np.float32))
    got = {int(k): r.tolist() for ks, rs in store.scan("a", chunk_rows=3) for k, r in zip(ks, rs, strict=True)}
    assert got == {int(k): [float(k)] * 3 for k in keys}
    store.clear()
    store.close()
