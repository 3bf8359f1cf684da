"""The code blocks of the documentation pages, and what the docs tests do with each.

Every fenced block of a page under docs/ is one of:
  - `bash`: each command runs in order, in one scratch folder per page (`hugerec ...` in process, through
    `hugerec.cli.main`; anything else through bash); `hugerec serve` is parsed and its bundles must exist;
  - `python`: executed, the page's blocks sharing one namespace, in the same folder;
  - `toml` / `json`: parsed; a toml block with a `title="NAME"` is written to NAME for the commands after it;
  - `text`: output shown to the reader (a command's output, a usage line), never code.
A comment on the line(s) right above a fence changes that:
  <!-- docs: not run: REASON -->          the block is shown, not run (the reason is required)
  <!-- docs: print-config: REASON -->     its `hugerec` commands are only loaded (`--print-config`), not run
  <!-- docs: append KEY=VALUE ... -->     these overrides are appended to each `hugerec` command (to shrink a
                                           run for CI); the reader runs the command as shown
A page whose commands read the real data samples (`$HUGEREC_DATA/...` in a command or in a config it
names) is skipped where they are absent, as the tests that read them are.

`python docs/tools/doc_blocks.py` prints the figures: pages, and blocks by what the tests do with them.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[A-Za-z0-9_+-]*)(?P<attrs>[^\n`]*)$")
DIRECTIVE = re.compile(r"^\s*<!--\s*docs:\s*(?P<body>.*?)\s*-->\s*$")
CODE_LANGS = ("bash", "python", "toml", "json")
OUTPUT_LANGS = ("text",)


@dataclass(frozen=True)
class Block:
    page: str  # path relative to docs/
    line: int  # 1-based line of the opening fence
    lang: str
    title: str | None
    code: str
    not_run: str | None = None  # the reason, when the block is shown only
    print_config: str | None = None  # the reason, when its hugerec commands are only loaded
    append: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    @property
    def action(self) -> str:
        """What the tests do with the block: run, load, parse, skip (shown only) or output."""
        if self.lang in OUTPUT_LANGS:
            return "output"
        if self.not_run is not None:
            return "not run"
        if self.lang in ("bash", "python"):
            return "loaded" if self.print_config is not None else "run"
        return "parsed"


@dataclass
class Page:
    path: str
    blocks: list[Block] = field(default_factory=list)


def pages() -> list[str]:
    """Every Markdown page under docs/, as paths relative to it, sorted."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "tools" not in p.relative_to(DOCS).parts)


def read_page(rel: str) -> Page:
    """The page's fenced blocks with their directives; a malformed directive or fence raises ValueError."""
    lines = (DOCS / rel).read_text().splitlines()
    page = Page(rel)
    i = 0
    directives: list[str] = []
    while i < len(lines):
        d = DIRECTIVE.match(lines[i])
        if d:
            directives.append(d.group("body"))
            i += 1
            continue
        m = FENCE.match(lines[i])
        if m is None or (not m.group("lang") and not m.group("attrs").strip()):
            if m is not None:
                raise ValueError(f"docs/{rel}:{i + 1}: a code fence without a language (bash, python, toml, json, text)")
            if lines[i].strip():
                directives = []
            i += 1
            continue
        lang = m.group("lang")
        if lang not in CODE_LANGS + OUTPUT_LANGS:
            raise ValueError(f"docs/{rel}:{i + 1}: code fence language {lang!r}; use one of {CODE_LANGS + OUTPUT_LANGS}")
        title = re.search(r'title="([^"]+)"', m.group("attrs"))
        indent = len(m.group("indent"))
        start = i + 1
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        if i == len(lines):
            raise ValueError(f"docs/{rel}:{start}: unclosed code fence")
        page.blocks.append(_block(rel, start, lang, title.group(1) if title else None, "\n".join(body) + "\n", directives))
        directives = []
        i += 1
    return page


def _block(rel: str, line: int, lang: str, title: str | None, code: str, directives: list[str]) -> Block:
    not_run = print_config = None
    append: tuple[str, ...] = ()
    for d in directives:
        key, _, rest = d.partition(":") if not d.startswith("append ") else ("append", "", d[len("append ") :])
        rest = rest.strip()
        match key.strip():
            case "not run":
                not_run = rest
            case "print-config":
                print_config = rest
            case "append":
                append = tuple(shlex.split(rest))
            case _:
                raise ValueError(f"docs/{rel}:{line}: unknown directive <!-- docs: {d} -->")
        if key.strip() in ("not run", "print-config") and len(rest) < 10:
            raise ValueError(f"docs/{rel}:{line}: <!-- docs: {key.strip()}: REASON --> needs a reason, got {rest!r}")
    return Block(rel, line, lang, title, code, not_run, print_config, append)


def commands(block: Block) -> list[str]:
    """The shell commands of a bash block: continuation lines joined, comments and blank lines left out."""
    text = re.sub(r"\\\n\s*", " ", block.code)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def block_samples(block: Block) -> tuple[str, ...]:
    """The real data samples a block reads: `$HUGEREC_DATA/...` in its code and in the configs it names."""
    text = block.code
    for config in re.findall(r"\bconfigs/[\w.-]+\.toml\b", block.code):
        if (ROOT / config).is_file():
            text += "\n" + (ROOT / config).read_text()
    return tuple(sorted(set(re.findall(r"\$\{?HUGEREC_DATA\}?/([^\s\"']+)", text))))


def samples_read(page: Page) -> tuple[str, ...]:
    """The samples the page's run blocks read: without them the page is skipped. A block that is only loaded
    (print-config) and reads samples is skipped on its own instead (nothing after it depends on it)."""
    return tuple(sorted({s for b in page.blocks if b.action == "run" for s in block_samples(b)}))


def figures() -> dict[str, int]:
    """Pages and blocks by action: the documentation's figures."""
    counts: Counter[str] = Counter()
    all_pages = pages()
    for rel in all_pages:
        for b in read_page(rel).blocks:
            counts[b.action] += 1
    return {"pages": len(all_pages), **dict(sorted(counts.items()))}


if __name__ == "__main__":
    for k, v in figures().items():
        print(f"{k:10} {v}")
    sys.exit(0)
