"""What every kl command pays before it runs: parsing its arguments (a small refresh feels each
millisecond here; benches/test_refresh_fixed_costs.py measures it)."""
from __future__ import annotations

import argparse
import gettext

import pytest

from kilolock.cli import _parser_for, build_parser, main
from kilolock.cli.commands import COMMANDS


def test_argparse_looks_each_message_up_in_the_catalogues_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # gettext stats every candidate catalogue on each call: building every command's parser asked
    # ~150 times per run (10-16 ms of a 10-instance refresh), to find no catalogue each time.
    searches = []
    real_find = gettext.find

    def counting_find(*args, **kwargs):
        searches.append(args[0])
        return real_find(*args, **kwargs)

    monkeypatch.setattr(gettext, "find", counting_find)
    build_parser().parse_known_args(["refresh", "prod", "-q"])
    build_parser().parse_known_args(["state", "list"])
    assert len(searches) < 10, f"{len(searches)} catalogue searches"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_a_command_line_builds_the_parser_of_its_own_command_only() -> None:
    # One parser per command cost every run ~5 ms; a valid name first never lists the others.
    top, argv = _parser_for(["state", "list", "--format", "json"])
    assert argv == ["state", "list", "--format", "json"]
    assert list(_subcommands(top)) == ["state"]
    assert list(_subcommands(_subcommands(top)["state"])) == ["list"]
    # Help, a group without its action and an unknown name see every choice, as argparse lists them.
    assert len(_subcommands(_parser_for(["--help"])[0])) == len(COMMANDS)
    state = next(c for c in COMMANDS if c.name == "state")
    assert len(_subcommands(_subcommands(_parser_for(["state"])[0])["state"])) == len(state.actions)
    assert len(_subcommands(_parser_for(["stat", "list"])[0])) == len(COMMANDS)


def test_an_unknown_command_is_still_told_every_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["state", "lst"]) == 2  # a usage error
    err = capsys.readouterr().err
    assert "invalid choice: 'lst'" in err and "'list'" in err and "'pull'" in err, err
