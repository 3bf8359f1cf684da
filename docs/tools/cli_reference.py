"""The command-line reference, generated from the `hugerec` argparse parser: every command, its
description (the `--help` text) and every argument with its default."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def commands(parser: argparse.ArgumentParser, prefix: str = "hugerec") -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(`hugerec train`, its one-line help, its parser) for every command and nested command
    (`hugerec pipeline build`), in the parser's order."""
    helps = {
        c.dest: c.help or ""
        for a in parser._actions
        if isinstance(a, argparse._SubParsersAction)
        for c in a._choices_actions
    }
    for name, sub in _subcommands(parser).items():
        full = f"{prefix} {name}"
        yield full, helps.get(name, ""), sub
        yield from commands(sub, full)


def _flags(action: argparse.Action) -> str:
    if action.option_strings:
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        return ", ".join(f"{o}{metavar}" for o in action.option_strings)
    return str(action.metavar or action.dest)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def arguments(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(flags, default, help) of each documented argument; hidden ones (help=SUPPRESS) and -h left out."""
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction | argparse._SubParsersAction) or a.help == argparse.SUPPRESS:
            continue
        default = "" if a.default in (None, False, [], argparse.SUPPRESS) or a.nargs == 0 else str(a.default)
        required = " (required)" if a.required and a.option_strings else ""
        out.append((_flags(a), default, (a.help or "") + required))
    return out


def anchor(command: str) -> str:
    return command.replace(" ", "-")


def render(parser: argparse.ArgumentParser) -> str:
    """The Markdown of the CLI reference: a summary table, then a section per command."""
    cmds = list(commands(parser))
    out = ["| command | what it does |", "|---|---|"]
    for full, short, _ in cmds:
        out.append(f"| [`{full}`](#{anchor(full)}) | {_cell(short)} |")
    out.append("")
    for full, short, sub in cmds:
        out += [f"## `{full}` {{#{anchor(full)}}}", "", "```text", sub.format_usage().strip(), "```", ""]
        if sub.description:
            out += ["```text", sub.description.strip(), "```", ""]
        elif short:
            out += [short[0].upper() + short[1:] + ".", ""]
        args = arguments(sub)
        if args:
            out += ["| argument | default | meaning |", "|---|---|---|"]
            out += [f"| `{_cell(flags)}` | {f'`{d}`' if d else ''} | {_cell(h)} |" for flags, d, h in args]
            out.append("")
    out += ["## Config files and overrides {#config-files-and-overrides}", "", "```text", (parser.epilog or "").strip(), "```", ""]
    return "\n".join(out)
