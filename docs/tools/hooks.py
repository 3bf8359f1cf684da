"""MkDocs hooks: the generated references are written into their pages at build time.

A page holding `<!-- generated: config-reference -->` gets every config key (tools/config_reference.py),
one holding `<!-- generated: cli-reference -->` every command of the `hugerec` parser
(tools/cli_reference.py). A config key without a meaning is a warning, so `mkdocs build --strict`
fails on it (as tests/test_docs_reference.py does).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cli_reference
import config_reference

log = logging.getLogger("mkdocs.hooks.reference")

MARKERS = {
    "<!-- generated: config-reference -->": "config",
    "<!-- generated: cli-reference -->": "cli",
}


def _config() -> str:
    for config, key in config_reference.all_keys():
        if key.table and not key.meaning:
            log.warning(f"config reference: {key.table}.{key.name} ({config.title}) has no meaning; "
                        f"document the field in {key.owner}")
    return config_reference.render_all()


def _cli() -> str:
    from hugerec.cli import _parser

    return cli_reference.render(_parser())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for marker, kind in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, _config() if kind == "config" else _cli())
    return markdown
