"""A griffe extension for the API pages: docstring paragraphs laid out in aligned columns stay as laid out.

The package's docstrings are plain text, with `name    meaning` blocks and aligned diagrams
(`raw logs -> data.preprocess -> ...`). Read as Markdown, such a paragraph's lines run into one line. A
paragraph of two or more lines in which some line has a run of two spaces between words, or which is
indented, is shown as a preformatted text block instead; other paragraphs stay Markdown.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ALIGNED = re.compile(r"\S {2,}\S")


def preformat(text: str) -> str:
    """The docstring with its column-aligned or indented paragraphs fenced as text (fenced code left alone)."""
    out: list[str] = []
    fenced = False
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if any(line.lstrip().startswith("```") for line in lines):
            fenced = not fenced if sum(line.lstrip().startswith("```") for line in lines) % 2 else fenced
            out.append(paragraph)
            continue
        aligned = any(ALIGNED.search(line) for line in lines) or any(line.startswith("  ") for line in lines)
        indented_line = len(lines) == 1 and lines[0].startswith("    ")
        if not fenced and ((len(lines) >= 2 and aligned) or indented_line):
            out.append("```text\n" + paragraph + "\n```")
        else:
            out.append(paragraph)
    return "\n\n".join(out)


class TextBlocks(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = preformat(obj.docstring.value)
