"""``kl``: the command line. Parsing lives here, built from the command table (commands.py); a
command's module is imported only when that command is chosen, so ``kl --help`` and ``kl version``
start without loading psycopg or grpc.

Imports in kilolock/cli, the one rule: a module imports at its top whatever costs nothing a
command would feel: the standard library kl's start loads anyway, kilolock's light model modules
(errors, durations, globs, cron, names, redact, jsondoc) and the cli's own helpers. An import
stays inside the function that needs it only when it measurably costs a command that does not:

- the store, provider, refresh, fleet, server and notify packages and psycopg: the database
  driver, grpc and protobuf, the HTTP stack; a tenth of a second and more, which ``kl --help``,
  ``kl version`` and ``kl COMMAND --help`` never load (tests/cli/test_commands.py);
- what loads dataclasses and inspect (kilolock.schema, drift, codec, the state diff; ~6 ms), and
  a standard-library module only one action needs (difflib, ssl, secrets, pathlib, shlex);
- in what ``kl version`` and ``kl refresh STATE`` import before they run (this module,
  commands, args, exitcodes, render, versioncmd, refreshcmd), anything not loaded already: a
  refresh starts its providers early, and each millisecond before that is on its critical path;
- an import that is itself the check (``try: import ... except ImportError``).

tests/cli/test_commands.py holds the modules to it."""
from __future__ import annotations

import argparse
import atexit
import functools
import logging
import os
import re
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from kilolock.cli.commands import COMMANDS, DRIFT_ACCEPT, DRIFT_IGNORE, Command, CommandContext
from kilolock.cli.exitcodes import DETAILED_EXITCODE, exit_code
from kilolock.errors import KlError, UsageError, one_line


def _translate_each_message_once() -> None:
    """argparse passes every message through gettext (``argparse._``), and gettext looks for a
    catalogue on every call: a stat of each candidate file under each locale directory. Building
    kl's parsers asks about 150 times, 10-16 ms of a small refresh spent finding the same nothing.
    Within one process the answer for a message cannot change (the environment and the installed
    catalogues are read as they are at the first call), so each is asked once."""
    translate = getattr(argparse, "_", None)
    if callable(translate) and not hasattr(translate, "cache_info"):
        argparse._ = functools.lru_cache(maxsize=None)(translate)  # type: ignore[attr-defined]


_translate_each_message_once()


class _Parser(argparse.ArgumentParser):
    """Usage errors as UsageError, and a command's arguments added only once it is chosen."""

    pending: Command | None = None  # the command whose arguments this parser has not added yet

    def error(self, message: str) -> NoReturn:  # argparse would exit 2 itself; we keep control
        # main() prints "kl: " once: the command's name follows it, not a second "kl".
        command = self.prog.removeprefix("kl").strip()
        hint = _did_you_mean(self, message)
        raise ParserUsageError((f"{command}: " if command else "") + message + hint,
                               " ".join(self.format_usage().split()))

    def add_pending_arguments(self) -> None:
        command, self.pending = self.pending, None
        if command is not None:
            command.add_arguments(self)


class ParserUsageError(UsageError):
    """A usage error found by the parser, with the one-line usage of the command it is about."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """" (did you mean --dry-run?)" for an unrecognized option close to one the command has, and
    " (did you mean refresh?)" for a command, action or choice close to one it offers."""
    import difflib

    if message.startswith("unrecognized arguments:"):
        options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        for word in message.split(":", 1)[1].split():
            flag = word.split("=", 1)[0]
            if flag.startswith("-"):
                close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""
    typed = re.search(r"invalid choice: '([^']*)'", message)  # argparse's "invalid choice: %(value)r"
    if typed is None:
        return ""
    offered = [str(c) for a in parser._actions if a.choices for c in a.choices]
    close = difflib.get_close_matches(typed.group(1), offered, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class _Subcommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """COMMAND / ACTION: the chosen command's module adds its arguments, just before they are parsed."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        # nargs=PARSER: the command's name, then everything after it; argparse has already
        # refused a name that is not in the table.
        chosen = self._name_parser_map.get(values[0]) if values else None
        if isinstance(chosen, _Parser):
            chosen.add_pending_arguments()
        super().__call__(parser, namespace, values, option_string)


def _add_commands(parser: argparse.ArgumentParser, commands: Sequence[Command], dest: str, metavar: str,
                  chosen: Sequence[str] = ()) -> None:
    """The commands' parsers. When ``chosen`` (the command line's first words) names one of
    COMMANDS, only that one's parser is built: one per command cost a small refresh ~5 ms, and
    with a valid name first argparse never lists the others (their names and summaries appear in
    the help of this level only, which ``kl --help`` or an unknown name builds in full)."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=_Parser, action=_Subcommands)
    wanted = chosen[0] if chosen and any(c.name == chosen[0] for c in commands) else None
    for command in commands:
        if wanted is not None and command.name != wanted:
            continue
        # Raw: the examples below keep their lines. A command may add more in add_arguments.
        p = sub.add_parser(command.name, help=command.summary, description=command.summary,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=f"example:\n  {command.example}" if command.example else None)
        assert isinstance(p, _Parser)  # parser_class
        if command.actions:
            p.set_defaults(_command=None, _parser=p)  # no ACTION: kl prints the group's help
            _add_commands(p, command.actions, f"{command.name}_command", "ACTION", chosen[1:] if wanted else ())
        else:
            p.set_defaults(_command=command, _parser=p)
            p.pending = command


def build_parser(chosen: Sequence[str] = ()) -> argparse.ArgumentParser:
    """kl's parser; ``chosen``: the command line, when only the command it names is needed."""
    parser = _Parser(prog="kl", description="Terraform state in PostgreSQL: queryable, versioned, refreshed.")
    _add_commands(parser, COMMANDS, "command", "COMMAND", chosen)
    return parser


def _drift_ignore_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=f"kl drift {DRIFT_IGNORE.name}", description=DRIFT_IGNORE.summary)
    parser.set_defaults(_command=None, _parser=parser)  # no ACTION: kl prints the group's help
    _add_commands(parser, DRIFT_IGNORE.actions, "ignore_command", "ACTION")
    return parser


def _drift_accept_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=f"kl drift {DRIFT_ACCEPT.name}", description=DRIFT_ACCEPT.summary,
                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=f"example:\n  {DRIFT_ACCEPT.example}")
    parser.set_defaults(_command=DRIFT_ACCEPT, _parser=parser)
    DRIFT_ACCEPT.add_arguments(parser)
    return parser


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser for ARGV and what it parses: `kl drift ignore ...` goes to the ignore group
    (`kl drift STATE` would take `ignore` for a state name)."""
    if argv[:2] == ["drift", DRIFT_IGNORE.name]:
        return _drift_ignore_parser(), argv[2:]
    if argv[:2] == ["drift", DRIFT_ACCEPT.name]:
        return _drift_accept_parser(), argv[2:]
    return build_parser(argv[:2]), argv


_TRACE = 5  # the level kilolock.provider.logbridge registers as TRACE (provider hclog trace lines)
_LEVELS = {"trace": _TRACE, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
           "warning": logging.WARNING, "error": logging.ERROR}


def _configure_logging() -> None:
    """KL_LOG / TF_LOG set kl's level (as in Terraform, a value that is not a level means TRACE).
    Provider log lines stay off the terminal unless TF_LOG_PROVIDER, TF_LOG or KL_LOG asks."""
    asked = (os.environ.get("KL_LOG") or os.environ.get("TF_LOG") or "").strip().lower()
    level = _LEVELS.get(asked, _TRACE) if asked and asked != "off" else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    provider_asked = (os.environ.get("TF_LOG_PROVIDER") or "").strip().lower()
    if provider_asked and provider_asked != "off":
        logging.getLogger("kilolock.provider").setLevel(_LEVELS.get(provider_asked, _TRACE))
    elif not asked or asked == "off":
        logging.getLogger("kilolock.provider").setLevel(logging.ERROR)


def _send_notifications(context: CommandContext) -> None:
    """Notifications this process committed, or found due, are sent before it exits (bounded).
    A command that never opened the store has nothing to send, and pays nothing for it."""
    if isinstance(sys.exc_info()[1], KeyboardInterrupt):
        return  # asked to stop now
    if context.store_url is None:
        return
    # Loaded by opening the store. Most runs wrote nothing and found nothing due: the sender
    # (http.client, urllib) is not even imported then, which a small refresh would feel (~10 ms).
    from kilolock.store import notify as outbox

    if not any(outbox.work_hint()):
        return
    from kilolock.notify.deliver import after_command

    after_command(context.store_url)


def _with_close_state(exc: KlError, context: CommandContext) -> str:
    """EXC's message; for a state name that does not exist, the stored name closest to it, if one
    is close (a mistyped name). Looked up here, on the error's way out, so the store's own callers
    (the HTTP backend's first GET of a new state) never pay for it."""
    if context.store_url is None:  # no store opened: no state was looked up
        return str(exc)
    from kilolock.store import errors

    if not isinstance(exc, errors.StateNotFound):
        return str(exc)
    from kilolock.store import db, states

    try:
        with db.connect(context.store_url) as conn:
            close = states.closest_name(conn, exc.name)
    except Exception:  # noqa: BLE001 - a hint only: the error itself is what matters
        close = None
    return str(exc.suggesting(close))


def _from_psycopg(exc: Exception) -> bool:
    """Whether EXC is the database driver's: then the driver is loaded, and only then is it imported here."""
    return any(cls.__module__.partition(".")[0] == "psycopg" for cls in type(exc).__mro__)


def exit_process(code: int) -> NoReturn:
    """End kl with CODE, skipping the interpreter's teardown once kl's own work is done: freeing
    every module and object (grpc and psycopg hold thousands) costs a small refresh about a tenth
    of its time and changes nothing a user sees. What teardown would do that matters is done here:
    exit handlers run (providers are killed, logging flushes) and stdout/stderr are flushed. With a
    non-daemon thread still running, or an output that cannot be flushed (a closed pipe: Python
    reports that its usual way), kl exits the usual way."""
    main_thread = threading.main_thread()
    if threading.current_thread() is main_thread and all(t.daemon for t in threading.enumerate() if t is not main_thread):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        else:
            atexit._run_exitfuncs()
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os._exit(code)
    sys.exit(code)


def run_process(argv: Sequence[str] | None = None) -> NoReturn:
    """kl as a process of its own: each way of starting kl ends here (the `kl` command pip installs,
    `python -m kilolock`, kl.pyz), so each gets the same collector policy (kilolock.gcpolicy) and the
    same quick exit (exit_process)."""
    from kilolock import gcpolicy

    gcpolicy.own_process()
    exit_process(main(argv))


def _parse_intermixed(args: argparse.Namespace, argv: list[str],
                      extra: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """ARGV read again by its command's own parser with options and positionals intermixed: argparse
    settles a command's optional positionals at the first option, so `kl state diff prod --observed
    7` leaves 7 over where the command has a place for it (and a message when it does not fit)."""
    command_parser = getattr(args, "_parser", None)
    if command_parser is None:
        return args, extra
    words = command_parser.prog.split()[1:]
    start = next((i for i in range(len(argv) - len(words) + 1) if argv[i:i + len(words)] == words), None)
    if start is None:
        return args, extra
    try:
        again, rest = command_parser.parse_known_intermixed_args(argv[start + len(words):])
    except (TypeError, KlError):  # a parser intermixing cannot read: the first reading's error stands
        return args, extra
    merged = argparse.Namespace(**{**vars(args), **vars(again)})
    return merged, rest


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, argv = _parser_for(argv)
    # Read before parsing: a usage error must exit 1 under it too, and parsing is what failed.
    detailed = DETAILED_EXITCODE in argv[: argv.index("--")] if "--" in argv else DETAILED_EXITCODE in argv
    context = CommandContext()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            args, extra = _parse_intermixed(args, argv, extra)
        if extra:  # said by the command they were given to: its usage, its flags to suggest
            (getattr(args, "_parser", None) or parser).error("unrecognized arguments: " + " ".join(extra))
        command: Command | None = getattr(args, "_command", None)
        if command is None:
            (getattr(args, "_parser", None) or parser).print_help(sys.stderr)
            return exit_code(error=True, detailed=detailed, code=2)
        _configure_logging()
        try:
            return int(command.run(args, context) or 0)
        finally:
            _send_notifications(context)
    except KlError as exc:
        # One line whatever the message quotes: argparse echoes unrecognized arguments raw, and an
        # argument may hold a newline. A parser's usage error adds the command's usage line.
        print("kl: " + one_line(_with_close_state(exc, context)), file=sys.stderr)
        if isinstance(exc, ParserUsageError):
            print(one_line(exc.usage), file=sys.stderr)
        return exit_code(error=True, detailed=detailed, code=exc.exit_code)
    except KeyboardInterrupt:
        print("kl: interrupted", file=sys.stderr)
        return exit_code(error=True, detailed=detailed, code=130)
    except BrokenPipeError:
        # `kl state pull x | head`: the reader went away; not an error worth a message.
        sys.stderr.close()
        return 1
    except Exception as exc:  # a bug, not a user mistake: one line, the traceback on request
        if _from_psycopg(exc):
            import psycopg

            from kilolock.store import db

            # A server restart or a cut connection in any command's own queries is a fault of the
            # environment, reported as such (a refresh run reports and records its own); behind
            # PgBouncer it can surface as an InternalError without SQLSTATE (db.lost).
            if db.lost_in_process(exc):
                # Cut in COMMIT, the write may have landed before its answer was lost.
                unknown = ("; whether the write was committed is unknown: check with `kl state versions` or `kl runs`"
                           if db.commit_outcome_unknown(exc) else "")
                print(f"kl: lost the database connection: {db.first_line(exc)}{unknown}", file=sys.stderr)
                return 1
            if isinstance(exc, (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)):
                # A prepared statement that vanished or collided: transactions land on other server
                # connections than the one that prepared it, which is what a transaction pooler does.
                print(f"kl: {db.first_line(exc)}: the database connection goes through a transaction pooler (PgBouncer "
                      f"pool_mode = transaction?); add {db.POOLER_PARAM}=transaction to KL_DATABASE_URL "
                      f"(or set {db.POOLER_ENV}=transaction)", file=sys.stderr)
                return 1
        if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] != "kilolock":
            # Not a bug: a Python kl was not installed into (the system python3 run in a checkout
            # finds the kilolock package there, but none of its dependencies).
            print(f"kl: {exc.name.split('.')[0]} is not installed for {sys.executable}: run kl with the Python it was "
                  "installed into (`source .venv/bin/activate`, or .venv/bin/kl), or as one file: python3 kl.pyz",
                  file=sys.stderr)
            return 1
        if os.environ.get("KL_DEBUG"):
            raise
        print(f"kl: internal error: {type(exc).__name__}: {exc} (run with KL_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
