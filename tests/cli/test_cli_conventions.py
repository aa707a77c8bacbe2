"""What every kl command shares: usage errors, --help, exit codes for CI, markdown, progress."""
from __future__ import annotations

import argparse
import io
import re
from contextlib import redirect_stderr, redirect_stdout

import pytest

from kilolock.cli import build_parser, main
from kilolock.cli.commands import COMMANDS, DRIFT_IGNORE, Command
from kilolock.cli.exitcodes import exit_code


def _kl(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _leaves(commands: tuple[Command, ...] = COMMANDS, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for c in commands:
        out += _leaves(c.actions, (*path, c.name)) if c.actions else [(*path, c.name)]
    return out


def test_a_usage_error_has_one_kl_prefix_the_usage_line_and_a_suggestion():
    code, out, err = _kl("refresh", "prod", "--dryrun")
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 2, err
    assert lines[0] == "kl: refresh: unrecognized arguments: --dryrun (did you mean --dry-run?)", err
    assert lines[1].startswith("usage: kl refresh [-h] [--dry-run]"), err


def test_a_usage_error_of_kl_itself_and_of_a_bad_value():
    code, _, err = _kl("drfit")
    assert code == 2 and err.startswith("kl: argument COMMAND: invalid choice: 'drfit'") and "kl: kl" not in err
    assert err.splitlines()[0].endswith(" (did you mean drift?)"), err
    code, _, err = _kl("state", "imprt", "x")
    assert code == 2 and err.splitlines()[0].endswith(" (did you mean import?)"), err
    code, _, err = _kl("xyzzy")  # nothing close: no guess
    assert code == 2 and "did you mean" not in err, err
    code, _, err = _kl("drift", "prod", "--limit", "0")
    assert code == 2 and err.splitlines()[0] == "kl: drift: argument --limit: '0' must be at least 1", err


def test_usage_errors_exit_1_under_detailed_exitcode():
    code, _, err = _kl("drift", "prod", "--detailed-exitcode", "--limt", "3")
    assert code == 1 and "(did you mean --limit?)" in err
    code, _, err = _kl("drift", "--detailed-exitcode")  # neither a state nor --states
    assert code == 1 and err.startswith("kl: drift: name one state, or --states GLOB"), err


def test_exit_codes_are_decided_in_one_place():
    assert [exit_code(detailed=False, open_drift=n) for n in (0, 3)] == [0, 0]  # today's codes stand
    assert [exit_code(detailed=True, open_drift=n) for n in (0, 3)] == [0, 2]
    assert exit_code(detailed=True, error=True, code=2) == 1 and exit_code(detailed=False, error=True, code=2) == 2
    assert exit_code(detailed=False, error=True, code=130) == 130


@pytest.mark.parametrize("path", _leaves(), ids=" ".join)
def test_every_option_has_a_help_line_and_every_command_an_example(path):
    parser = build_parser()
    sub: argparse.ArgumentParser = parser
    for name in path:
        action = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
        sub = action.choices[name]
        sub.add_pending_arguments()  # type: ignore[attr-defined]
    for a in sub._actions:
        if not isinstance(a, argparse._HelpAction):
            assert a.help and a.help.strip(), f"kl {' '.join(path)}: {a.option_strings or a.dest} has no help"
    text = sub.format_help()
    assert re.search(r"^examples?:\n  \S", text, re.MULTILINE) and "kl " + path[0] in text.split("example")[-1], text


@pytest.mark.parametrize("action", [c.name for c in DRIFT_IGNORE.actions])
def test_drift_ignore_actions_have_help_lines_and_examples(action):
    # `kl drift ignore ACTION` is parsed by its own group parser (kl drift takes a STATE)
    from kilolock.cli import _parser_for

    parser, rest = _parser_for(["drift", "ignore", action])
    assert rest == [action]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[action]
    sub.add_pending_arguments()
    for a in sub._actions:
        if not isinstance(a, argparse._HelpAction):
            assert a.help and a.help.strip(), f"kl drift ignore {action}: {a.option_strings or a.dest} has no help"
    text = sub.format_help()
    assert text.startswith(f"usage: kl drift ignore {action} ") and "example:\n  kl drift ignore " + action in text, text


def test_durations_accept_days():
    from kilolock.durations import parse_duration

    assert parse_duration("1d") == 86400 and parse_duration("1d12h") == 86400 * 1.5


@pytest.mark.parametrize(("value", "seconds"), [("", 7.0), ("90s", 90.0), ("1m30s", 90.0), ("2.5", 2.5), ("0", 0.0)])
def test_a_duration_setting_takes_the_flags_forms_or_bare_seconds(monkeypatch, value, seconds):
    from kilolock.durations import from_env

    monkeypatch.setenv("KL_SOME_WAIT", value)
    assert from_env("KL_SOME_WAIT", 7.0) == seconds


@pytest.mark.parametrize(("value", "allow_zero", "said"), [
    ("soon", True, "KL_SOME_WAIT: invalid duration 'soon': use forms like"),
    ("-1", True, "KL_SOME_WAIT: invalid duration '-1': must be zero or more"),
    ("0", False, "KL_SOME_WAIT: invalid duration '0': must be greater than zero"),
    ("0s", False, "KL_SOME_WAIT: invalid duration '0s': must be greater than zero"),
    ("nan", True, "KL_SOME_WAIT: invalid duration 'nan'"),
])
def test_a_mistyped_duration_setting_is_refused_naming_the_variable(monkeypatch, value, allow_zero, said):
    from kilolock.durations import from_env
    from kilolock.errors import UsageError

    monkeypatch.setenv("KL_SOME_WAIT", value)
    with pytest.raises(UsageError) as caught:
        from_env("KL_SOME_WAIT", 7.0, allow_zero=allow_zero)
    assert str(caught.value).startswith(said), caught.value


def test_a_mistyped_worker_poll_is_one_line_before_the_worker_starts(run_kl):
    r = run_kl("worker", "--once", env={"KL_WORKER_POLL": "2 secs"})
    err = r.stderr.decode()
    assert r.returncode == 2 and err.strip() == "kl: KL_WORKER_POLL: invalid duration '2 secs': use forms like 30s, 5m, 1h, 1d or 1m30s", err


def test_positionals_after_an_option_reach_the_command(capsys):
    from kilolock.cli import _parse_intermixed

    argv = ["state", "diff", "prod", "--format", "json", "3", "4.2"]
    first, extra = build_parser(argv[:2]).parse_known_args(argv)
    args, extra = _parse_intermixed(first, argv, extra)
    assert extra == [] and (args.name, args.serial_from, args.serial_to, args.format) == ("prod", (3, None), (4, 2), "json")

    assert main(["state", "diff", "prod", "--observed", "7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kl: kl state diff: --observed compares Terraform's current version"), err
    assert main(["state", "diff", "prod", "--observed", "1", "2", "3"]) == 2
    assert "unrecognized arguments: 3" in capsys.readouterr().err


def test_progress_redraws_at_most_ten_times_a_second(monkeypatch):
    from kilolock.cli.refreshcmd import _Progress

    now = [0.0]
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    progress = _Progress(clock=lambda: now[0])
    for i in range(1, 1001):  # 1,000 reads in 0.5 s
        now[0] = i * 0.0005
        progress("registry.terraform.io/hashicorp/null", i, 1000)
    draws = err.getvalue().count("\r\x1b[Krefreshing:")
    assert 5 <= draws <= 7 and err.getvalue().endswith("null 1000/1000"), draws  # the last one is always drawn


def test_markdown_changes_escape_what_would_break_a_table():
    from kilolock.cli.render import markdown_changes

    md = markdown_changes([{"path": 'tags["a|b"]', "before": "x`y", "after": "(sensitive)"}])
    assert md.splitlines() == ["| attribute | before | after |", "|---|---|---|",
                               '| `tags["a\\|b"]` | `` "x`y" `` | `(sensitive)` |']


@pytest.mark.parametrize("argv,used", [
    (["refresh", "s", "-q"], False),  # CI's plain `kl refresh STATE -q`: nothing shows the counts
    (["refresh", "s", "-q", "--format", "markdown"], False),
    (["refresh", "s", "-q", "--detailed-exitcode"], True),  # exit 2 on open drift needs them
    (["refresh", "s", "-q", "--format", "json"], True),  # "open" and "ignored" in the JSON
    (["refresh", "s"], True),  # the table's "open drift now" line
])
def test_refresh_counts_drift_only_when_something_uses_the_counts(argv, used):
    from kilolock.cli import build_parser
    from kilolock.cli.refreshcmd import counts_used

    args = build_parser().parse_args(argv)
    assert counts_used(args) is used
