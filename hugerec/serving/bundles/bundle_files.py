"""What every bundle-like folder shares (model, GBM, next-items and pipeline bundles, version deltas):
the manifest's name, sha256 checksums, paths a manifest may name, the `kind` a manifest declares, and
writing a folder all or nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath, PureWindowsPath

MANIFEST = "manifest.json"


def inside_bundle(rel: str, where: str) -> str:
    """A manifest's file name, refused unless it is a plain relative path inside the bundle (a crafted
    manifest naming ../../etc/passwd or /etc/hostname would otherwise be opened and hashed)."""
    p = PurePosixPath(rel)
    if (
        not rel
        or "\\" in rel
        or p.is_absolute()
        or PureWindowsPath(rel).drive
        or any(part in ("..", "") for part in rel.split("/"))
    ):
        raise ValueError(f"{where}: file {rel!r} is not a relative path inside the bundle; refusing it")
    return rel


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def bundle_kind(path: str | Path) -> str | None:
    """The `kind` that the manifest of the bundle folder `path` declares ("gbm", "pipeline", ...), or None
    when it has no readable manifest or no kind (a model bundle's manifest has none)."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return None
    try:
        kind = json.loads(manifest.read_text()).get("kind")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """Write the folder `target` all or nothing: yields an empty hidden sibling folder to fill. If the block
    raises, that folder is removed and `target` is untouched; if it ends normally, the folder is renamed to
    `target`. An existing `target` is first renamed aside and deleted only once the new folder is in its
    place, so a crash at any point leaves the old folder or the new one on disk, never a mix of the two."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    aside = None
    if target.exists():
        aside = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:12]}")
        os.replace(target, aside)
    os.replace(tmp, target)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` except the manifest, by relative path."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }

