"""The site's structure: every page is in the navigation, every public package has an API page."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path

import yaml

import hugerec

ROOT = Path(__file__).resolve().parents[1]
# docs/tools is a folder of scripts (the MkDocs hook and its generators), not a package: imported from there
sys.path.insert(0, str(ROOT / "docs" / "tools"))
import doc_blocks  # noqa: E402


def nav_pages() -> set[str]:
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return set(re.findall(r"([\w./-]+\.md)", nav))


def test_every_page_is_in_the_navigation() -> None:
    assert set(doc_blocks.pages()) == nav_pages()


def test_every_public_package_has_an_api_page() -> None:
    """A (sub)package with an `__all__` is documented by a `::: hugerec.X` page of its own."""
    documented = set()
    for page in (ROOT / "docs" / "reference" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)$", page.read_text(), flags=re.M))
    public = {"hugerec"}
    for info in pkgutil.walk_packages(hugerec.__path__, "hugerec."):
        if info.ispkg and not info.name.startswith("hugerec.cli"):
            module = importlib.import_module(info.name)
            if "__all__" in vars(module):
                public.add(info.name)
    assert public <= documented, sorted(public - documented)


def test_mkdocs_config_is_strict() -> None:
    """The strict build fails on any warning; link and anchor checks warn (so they fail it)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    assert config["strict"] is True
    links = config["validation"]["links"]
    assert links["not_found"] == links["anchors"] == links["unrecognized_links"] == "warn"
    assert "docs/tools/hooks.py" in config["hooks"]


def test_aligned_docstring_paragraphs_stay_as_laid_out() -> None:
    """The API pages' griffe extension fences column-aligned and indented paragraphs, nothing else."""
    import griffe_text_blocks

    text = "Summary line.\n\nname      what it is\nother     more\n\nPlain prose\non two lines.\n\n    indented(code)\n\n```python\nx  = 1\ny  = 2\n```"
    out = griffe_text_blocks.preformat(text)
    assert out.split("\n\n") == [
        "Summary line.",
        "```text\nname      what it is\nother     more\n```",
        "Plain prose\non two lines.",
        "```text\n    indented(code)\n```",
        "```python\nx  = 1\ny  = 2\n```",
    ]
