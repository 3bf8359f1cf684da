"""What every bundle folder shares: manifest paths refused unless inside the bundle, sha256 checksums of every
file but the manifest, the manifest's declared kind, and a folder written all or nothing."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from hugerec.serving.bundles.bundle_files import (
    MANIFEST,
    bundle_kind,
    checksums,
    inside_bundle,
    sha256_file,
    staged_folder,
)


@pytest.mark.parametrize("rel", ["dense.pt", "tables/user.npy", "a/b/c.bin", "..x", "x.."])
def test_plain_relative_paths_are_kept(rel: str) -> None:
    assert inside_bundle(rel, "manifest") == rel


@pytest.mark.parametrize("rel", ["", "../x", "a/../../x", "/etc/hostname", "a//b", "a/", "a\\b", "C:x", "./.."])
def test_paths_leaving_the_bundle_are_refused_naming_them(rel: str) -> None:
    with pytest.raises(
        ValueError, match=re.escape(f"bundle/manifest.json: file {rel!r} is not a relative path inside the bundle")
    ):
        inside_bundle(rel, "bundle/manifest.json")


def test_checksums_cover_every_file_but_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rows.bin").write_bytes(b"\x00" * 3_000_000)  # more than one read block
    (tmp_path / "dense.pt").write_bytes(b"abc")
    (tmp_path / MANIFEST).write_text("{}")
    assert checksums(tmp_path) == {
        "dense.pt": hashlib.sha256(b"abc").hexdigest(),
        "sub/rows.bin": hashlib.sha256(b"\x00" * 3_000_000).hexdigest(),
    }
    assert sha256_file(tmp_path / "dense.pt") == hashlib.sha256(b"abc").hexdigest()
    assert checksums(tmp_path / "sub") == {"rows.bin": hashlib.sha256(b"\x00" * 3_000_000).hexdigest()}


@pytest.mark.parametrize(
    ("manifest", "kind"),
    [
        ('{"kind": "gbm"}', "gbm"),
        ('{"format": 1}', None),  # a model bundle's manifest has no kind
        ('{"kind": 3}', None),
        ("[1, 2]", None),
        ("{not json", None),
        (b"\xff\xfe", None),
        (None, None),  # no manifest
    ],
)
def test_bundle_kind(tmp_path: Path, manifest: str | bytes | None, kind: str | None) -> None:
    if isinstance(manifest, str):
        (tmp_path / MANIFEST).write_text(manifest)
    elif isinstance(manifest, bytes):
        (tmp_path / MANIFEST).write_bytes(manifest)
    assert bundle_kind(tmp_path) == kind


def test_staged_folder_replaces_the_target_whole(tmp_path: Path) -> None:
    target = tmp_path / "out" / "bundle"
    with staged_folder(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".bundle.") and not any(tmp.iterdir())
        (tmp / "a").write_text("1")
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    with staged_folder(target) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"]  # the old folder's files are gone, not mixed in
    assert sorted(p.name for p in target.parent.iterdir()) == ["bundle"]  # no staging or aside folder left


def test_a_failed_staging_leaves_the_old_folder_untouched(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    target.mkdir()
    (target / MANIFEST).write_text(json.dumps({"kind": "gbm"}))
    with pytest.raises(RuntimeError, match="disk full"), staged_folder(target) as tmp:
        (tmp / MANIFEST).write_text("{}")
        raise RuntimeError("disk full")
    assert bundle_kind(target) == "gbm"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
