"""Bundle: manifest round trip, checksum verification names the damaged file, pickled programs are refused."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from hugerec.serving.bundles.bundle_files import MANIFEST, staged_folder
from hugerec.serving.bundles.model_bundle import PROGRAM, Bundle, Manifest, load_program


def copy_bundle(toy: Any, tmp_path: Path) -> Path:
    return Path(shutil.copytree(toy.bundle, tmp_path / "bundle"))


def test_manifest_describes_the_bundle(toy: Any) -> None:
    bundle = Bundle.open(toy.bundle)
    m = bundle.manifest
    assert (m.name, m.version, m.num_dense) == ("toy", "1", 4)
    assert [t.name for t in m.tables] == ["user", "item"] and [t.dim for t in m.tables] == [8, 8]
    assert m.collections[0].features == ("user", "item", "last_item")
    assert PROGRAM in m.files and any(f.startswith("embeddings/") for f in m.files)
    assert all(len(h) == 64 for h in m.files.values())
    assert m.info["rows"] == {"user": 300, "item": 200}
    assert set(m.dense_keys) == {k for k in toy.model.state_dict() if not k.startswith("sparse_arch.")}
    assert Manifest.from_dict(m.to_dict(), "here") == m
    assert len(bundle.id) == 64 and bundle.schema() is None and bundle.workflow() is None


def test_damaged_or_missing_files_are_named(toy: Any, tmp_path: Path) -> None:
    root = copy_bundle(toy, tmp_path)
    with open(root / PROGRAM, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(ValueError, match=f"checksum mismatch for {PROGRAM}"):
        Bundle.open(root)
    Bundle.open(root, verify=False)  # opening without verification is the caller's choice
    (root / PROGRAM).unlink()
    with pytest.raises(ValueError, match=f"file {PROGRAM} listed in the manifest is missing"):
        Bundle.open(root)
    with pytest.raises(FileNotFoundError, match=r"no manifest\.json"):
        Bundle.open(tmp_path)


def test_manifest_errors(toy: Any, tmp_path: Path) -> None:
    root = copy_bundle(toy, tmp_path)
    manifest = json.loads((root / MANIFEST).read_text())
    (root / MANIFEST).write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(ValueError, match="format version 99"):
        Bundle.open(root)
    (root / MANIFEST).write_text(json.dumps({k: v for k, v in manifest.items() if k != "tables"}))
    with pytest.raises(ValueError, match="missing or mistypes 'tables'"):
        Bundle.open(root)
    (root / MANIFEST).write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        Bundle.open(root)
    (root / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)  # nested past the parser's recursion limit
    with pytest.raises(ValueError, match="not valid JSON: RecursionError"):
        Bundle.open(root)


def _rewrite(src: Path, dst: Path, edit: dict[str, bytes]) -> None:
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for item in a.infolist():
            data = a.read(item.filename)
            for suffix, new in edit.items():
                if item.filename.endswith(suffix):
                    data = new(data) if callable(new) else new
            b.writestr(item, data)


def test_programs_with_pickles_are_refused(toy: Any, tmp_path: Path) -> None:
    src = toy.bundle / PROGRAM

    def mark_pickled(data: bytes) -> bytes:
        config = json.loads(data)
        next(iter(config["config"].values()))["use_pickle"] = True
        return json.dumps(config).encode()

    flagged = tmp_path / "flagged.pt2"
    _rewrite(src, flagged, {"model_weights_config.json": mark_pickled})
    with pytest.raises(ValueError, match="as pickles; refusing"):
        load_program(flagged)
    smuggled = tmp_path / "smuggled.pt2"
    shutil.copy(src, smuggled)
    with zipfile.ZipFile(smuggled, "a") as z:
        prefix = z.namelist()[0].split("/")[0]
        z.writestr(f"{prefix}/data/constants/opaque_obj_0", b"cos\nsystem\n(S'echo pwned'\ntR.")
    with pytest.raises(ValueError, match="pickled object"):
        load_program(smuggled)
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a PT2 archive"):
        load_program(tmp_path / "junk.pt2")
    module = load_program(src)
    assert sum(p.numel() for p in module.parameters()) > 0


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "/etc/hostname", "embeddings/../../x", "a//b", "C:/x", "a\\..\\b"]
)
def test_manifests_naming_files_outside_the_bundle_are_refused_before_reading(
    toy: Any, tmp_path: Path, name: str
) -> None:
    """#20 defect 9: verification hashed whatever path the manifest named."""
    root = copy_bundle(toy, tmp_path)
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"][name] = "0" * 64
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not a relative path inside the bundle"):
        Bundle.open(root, verify=False)  # refused when the manifest is read, before any file is


def test_a_link_out_of_the_bundle_is_refused(toy: Any, tmp_path: Path) -> None:
    root = copy_bundle(toy, tmp_path)
    outside = tmp_path / "secret"
    outside.write_text("s")
    (root / "link").symlink_to(outside)
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"]["link"] = "0" * 64
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="file link listed in the manifest lies outside the bundle"):
        Bundle.open(root)


def test_staged_folder_replaces_the_target_only_when_the_block_succeeds(tmp_path: Path):
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="half written"), staged_folder(target) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("half written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no hidden folder left behind
    assert [p.name for p in target.iterdir()] == ["old.txt"]
    with staged_folder(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".bundle.")
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # the old folder, moved aside, is gone
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    with staged_folder(tmp_path / "a" / "b") as tmp:  # missing parents are made
        (tmp / "x").write_text("x")
    assert (tmp_path / "a" / "b" / "x").read_text() == "x"
