"""The command-line reference holds every command and every documented argument of the `hugerec` parser."""

from __future__ import annotations

import cli_reference

from hugerec.cli import _parser


def test_every_command_and_argument_is_in_the_reference() -> None:
    parser = _parser()
    text = cli_reference.render(parser)
    commands = list(cli_reference.commands(parser))
    names = [full for full, _, _ in commands]
    assert {"hugerec train", "hugerec serve", "hugerec loop", "hugerec pipeline build", "hugerec schema"} <= set(names)
    for full, _, sub in commands:
        assert f"## `{full}` {{#{cli_reference.anchor(full)}}}" in text
        assert sub.format_usage().strip() in text
        for flags, _, _ in cli_reference.arguments(sub):
            assert flags.replace("|", "\\|") in text, f"{full}: {flags}"


def test_hidden_arguments_stay_hidden() -> None:
    """`serve --admin-token` is suppressed from --help (a token belongs in the environment); so it is here."""
    serve = dict((full, sub) for full, _, sub in cli_reference.commands(_parser()))["hugerec serve"]
    assert not any("--admin-token" in flags for flags, _, _ in cli_reference.arguments(serve))
