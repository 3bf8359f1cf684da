"""Version deltas as files: write then read gives back the same updates (rows, deleted keys, default rows)
and dense weights, with the base it was computed against; every damage is refused naming the file: a changed
file (checksum), a missing one, a foreign manifest, another format version, row counts other than the
manifest's, tables the manifest does not list. derive_version: the base plus a delta serves what the whole
candidate serves, the base keeps serving its own, the version's state goes when it closes; a delta made against
other content or naming a foreign table is refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hugerec.continuous.model_diff import write_model_delta
from hugerec.serving.bundles.bundle_files import MANIFEST, sha256_file
from hugerec.serving.bundles.bundle_loader import ServeOptions, load_bundle
from hugerec.serving.bundles.version_delta import (
    DELETED,
    DENSE,
    ROWS,
    STATE_PREFIX,
    derive_version,
    is_version_delta,
    read_version_delta,
    write_version_delta,
)
from hugerec.serving.runtime.inference_protocol import Signature, to_model_inputs
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.store.parameter_server import TableUpdate


def _write(path: Path) -> Path:
    updates = [
        TableUpdate(
            "user", np.array([5, -(1 << 62)], np.int64), np.array([[1, 2], [3, 4]], np.float32), np.array([7, 8])
        ),
        TableUpdate(
            "item", np.zeros(0, np.int64), np.zeros((0, 3), np.float32), np.array([1]), default=np.array([0.5, 0, -0.5])
        ),
    ]
    return write_version_delta(path, "3", "abc123", updates, {"top.weight": torch.arange(6.0).reshape(2, 3)})


def test_write_then_read_gives_the_same_updates(tmp_path: Path) -> None:
    path = _write(tmp_path / "delta")
    assert is_version_delta(path) and sorted(p.name for p in path.iterdir()) == sorted([MANIFEST, ROWS, DELETED, DENSE])
    delta = read_version_delta(path)
    assert (delta.base_version, delta.base_id, delta.id) == ("3", "abc123", sha256_file(path / MANIFEST))
    user, item = delta.updates
    assert user.table == "user" and user.keys.tolist() == [5, -(1 << 62)] and user.deleted.tolist() == [7, 8]
    np.testing.assert_array_equal(user.rows, [[1, 2], [3, 4]])
    assert user.default is None
    assert item.keys.shape == (0,) and item.rows.shape == (0, 3) and item.deleted.tolist() == [1]
    assert item.default is not None and item.default.tolist() == [0.5, 0, -0.5]
    torch.testing.assert_close(delta.dense["top.weight"], torch.arange(6.0).reshape(2, 3))


def test_a_rewrite_replaces_the_whole_folder(tmp_path: Path) -> None:
    path = _write(tmp_path / "delta")
    write_version_delta(path, "4", "def", [], {})
    delta = read_version_delta(path)
    assert delta.base_version == "4" and delta.updates == () and delta.dense == {}


def test_is_version_delta_reads_only_a_manifest_of_its_format(tmp_path: Path) -> None:
    assert not is_version_delta(tmp_path)
    for text in ('{"format": "hugerec-bundle"}', "[1]", "{", "[" * 100_000):
        (tmp_path / MANIFEST).write_text(text)
        assert not is_version_delta(tmp_path)


def _manifest(path: Path) -> dict[str, object]:
    meta: dict[str, object] = json.loads((path / MANIFEST).read_text())
    return meta


def _rewrite(path: Path, meta: dict[str, object]) -> None:
    (path / MANIFEST).write_text(json.dumps(meta))


def test_a_changed_file_fails_its_checksum(tmp_path: Path) -> None:
    path = _write(tmp_path / "delta")
    torch.save({"top.weight": torch.zeros(2, 3)}, path / DENSE)
    with pytest.raises(ValueError, match=f"version delta {path}: checksum mismatch for {DENSE}"):
        read_version_delta(path)


def test_a_missing_file_and_manifest_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "delta")
    (path / DELETED).unlink()
    with pytest.raises(ValueError, match=f"file {DELETED} listed in the manifest is missing"):
        read_version_delta(path)
    with pytest.raises(FileNotFoundError, match=f"version delta {tmp_path} has no {MANIFEST}"):
        read_version_delta(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "hugerec-bundle"}, "not a version delta \\(format 'hugerec-bundle'\\)"),
        ({"format_version": 2}, "format version 2, this hugerec reads 1"),
        ({"base": "3"}, "manifest is missing or mistypes"),
        ({"files": {ROWS: "0", DENSE: "0"}}, "files must be"),
        ({"files": {"../x": "0"}}, "file '../x' is not a relative path inside the bundle"),
    ],
)
def test_a_foreign_or_mistyped_manifest_is_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    path = _write(tmp_path / "delta")
    _rewrite(path, {**_manifest(path), **change})
    with pytest.raises(ValueError, match=message):
        read_version_delta(path)


def test_counts_and_tables_must_agree_with_the_manifest(tmp_path: Path) -> None:
    path = _write(tmp_path / "delta")
    meta = _manifest(path)
    tables = dict(meta["tables"])  # type: ignore[call-overload]
    _rewrite(path, {**meta, "tables": {**tables, "user": {**tables["user"], "deleted": 3}}})
    with pytest.raises(ValueError, match="table 'user' holds other row counts than its manifest says"):
        read_version_delta(path)
    _rewrite(path, {**meta, "tables": {"user": tables["user"]}})
    with pytest.raises(ValueError, match=r"tables \['item'\] are not in the manifest"):
        read_version_delta(path)


def test_a_deleted_file_of_another_schema_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "delta")
    pq.write_table(pa.table({"table": ["user"], "key": pa.array([1], pa.int32())}), path / DELETED)
    meta = _manifest(path)
    _rewrite(path, {**meta, "files": {**dict(meta["files"]), DELETED: sha256_file(path / DELETED)}})  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=f"{DELETED} must have columns table string, key int64"):
        read_version_delta(path)


def test_a_manifest_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "delta")
    (path / MANIFEST).write_text("{")
    with pytest.raises(ValueError, match=f"{path / MANIFEST} is not valid JSON"):
        read_version_delta(path)


def _inputs(toy: Any, batch: Any) -> ModelInputs:
    return to_model_inputs(toy.tensors(batch), Signature(toy.num_dense, toy.features))


def test_derive_version_serves_the_candidate_and_leaves_the_base(toy: Any, tmp_path: Path) -> None:
    candidate = copy.deepcopy(toy.model)
    with torch.no_grad():
        candidate.embedding_collections()[0].table_weight("user")[:50].add_(0.5)
        for p in candidate.dense_parameters():
            p.mul_(1.5)
    base = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "base-state")))
    base_info = {"bundle": str(base.bundle.path), "bundle_id": base.bundle.id}
    delta = read_version_delta(
        write_model_delta(toy.model, candidate, tmp_path / "updates" / "w1", "1", base.bundle.id)
    )
    assert [len(u.keys) for u in delta.updates if u.table == "user"] == [50]  # only the changed rows travel
    derived = derive_version(base.model, base.preprocess, base_info, delta, "2")
    try:
        batch = toy.batch(32, seed=4)
        got = torch.sigmoid(torch.from_numpy(derived.model.predict(_inputs(toy, batch)))).numpy()
        np.testing.assert_allclose(got, toy.offline(batch, candidate), rtol=1e-5, atol=1e-6)
        still = torch.sigmoid(torch.from_numpy(base.model.predict(_inputs(toy, batch)))).numpy()
        np.testing.assert_allclose(still, toy.offline(batch), rtol=1e-5, atol=1e-6)  # the base is never written
        assert derived.info["bundle_id"] == delta.id and derived.info["base"] == "1"
        assert derived.state_dir.parent == delta.path and derived.state_dir.is_dir()
    finally:
        derived.close()
        base.close()
    assert not derived.state_dir.exists()  # the version's state goes with it
    assert sorted(p.name for p in delta.path.iterdir()) == sorted([MANIFEST, ROWS, DELETED, DENSE])


def test_derive_version_refuses_another_base_and_foreign_tables(toy: Any, tmp_path: Path) -> None:
    base = load_bundle(toy.bundle, ServeOptions(state_dir=str(tmp_path / "base-state")))
    try:
        info = {"bundle": str(base.bundle.path), "bundle_id": base.bundle.id}
        other = read_version_delta(write_version_delta(tmp_path / "d1", "1", "f" * 64, [], {}))
        with pytest.raises(ValueError, match=r"was made against base content f{12}\.\.\., but version '1' serves"):
            derive_version(base.model, base.preprocess, info, other, "2")
        wrong = TableUpdate("user", np.array([1], np.int64), np.zeros((1, 3), np.float32))
        foreign = read_version_delta(write_version_delta(tmp_path / "d2", "1", base.bundle.id, [wrong], {}))
        with pytest.raises(ValueError, match="table 'user' \\(width 3\\) is not a table of 'toy'"):
            derive_version(base.model, base.preprocess, info, foreign, "2")
        assert not any(p.name.startswith(STATE_PREFIX) for p in (tmp_path / "d2").iterdir())  # nothing left behind
    finally:
        base.close()
