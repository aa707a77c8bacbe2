"""``kl``: the command line. Parsing lives here; each command's work is imported only when run,
so ``kl --help`` and ``kl version`` start without loading psycopg or grpc."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Callable, Sequence

from kilolock.errors import KlError, UsageError, one_line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit 2 itself; we keep control
        raise UsageError(f"{self.prog}: {message}")


def _add(sub: argparse._SubParsersAction, name: str, handler: str, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help)
    p.set_defaults(_handler=handler, _parser=p)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kl", description="Terraform state in PostgreSQL: queryable, versioned, refreshed.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    _add(sub, "version", "kilolock.cli.info:cmd_version", "print versions, codec backend and paths")

    db = _add(sub, "db", "", "manage the database").add_subparsers(dest="db_command", metavar="ACTION", parser_class=_Parser)
    _add(db, "migrate", "kilolock.cli.dbcmd:cmd_migrate", "apply pending migrations")
    _add(db, "status", "kilolock.cli.dbcmd:cmd_status", "show which database is used and its migrations")
    _add(db, "stop", "kilolock.cli.dbcmd:cmd_stop", "stop the embedded PostgreSQL server")

    state = _add(sub, "state", "", "import, list and read state versions").add_subparsers(
        dest="state_command", metavar="ACTION", parser_class=_Parser
    )
    p = _add(state, "import", "kilolock.cli.statecmd:cmd_import", "store a Terraform state file as a new version")
    p.add_argument("name", type=_new_state_name, help="state name: letters, digits and . _ @ + = - in '/'-separated segments")
    p.add_argument("file", help="state file, or - for standard input")
    p.add_argument("--source", choices=("import", "apply", "refresh"), default="import")
    p.add_argument("--actor", type=_text, help="who wrote it (default: $USER@cli)")
    p.add_argument("--force", action="store_true", help="accept a different lineage")
    p = _add(state, "list", "kilolock.cli.statecmd:cmd_list", "list states")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p = _add(state, "versions", "kilolock.cli.statecmd:cmd_versions", "list the versions of a state")
    p.add_argument("name", type=_state_name)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p = _add(state, "pull", "kilolock.cli.statecmd:cmd_pull", "print a state version as Terraform state JSON")
    p.add_argument("name", type=_state_name)
    p.add_argument("--serial", type=_serial, help="a past version (default: the current one)")

    p = _add(sub, "status", "kilolock.cli.statecmd:cmd_status", "summary of a state: serial, counts, refresh, drift")
    p.add_argument("name", type=_state_name)
    p.add_argument("--format", choices=("table", "json"), default="table")

    p = _add(sub, "refresh", "kilolock.cli.refreshcmd:cmd_refresh",
             "ask every managed resource's provider what it looks like now; commit a new version")
    p.add_argument("state", type=_state_name)
    p.add_argument("--dry-run", action="store_true", help="read everything, commit nothing")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failing resource")
    p.add_argument("--concurrency", type=_positive, help="provider groups at once (default: CPU count)")
    p.add_argument("--provider-parallelism", type=_positive, default=10,
                   help="requests in flight per provider process (default 10, as Terraform; 1 = serial)")
    p.add_argument("--actor", type=_text, help="who runs it (default: $USER@cli)")
    p.add_argument("--provider-search-path", action="append", metavar="DIR",
                   help="where provider binaries are (repeatable; before $KL_PROVIDER_PATH and the defaults)")
    p.add_argument("--timeout", metavar="DURATION", help="cancel after this long: 30s, 5m, 1h")
    p.add_argument("--rpc-timeout", metavar="DURATION", default="10m",
                   help="fail a resource whose provider call takes longer than this (default 10m)")
    p.add_argument("--always-upgrade", action="store_true", help="UpgradeResourceState before every read, as Terraform")
    p.add_argument("--allow-mass-removal", action="store_true",
                   help="commit even when most of a provider's objects come back deleted")
    p.add_argument("--format", choices=("table", "json"), default="table")

    p = _add(sub, "drift", "kilolock.cli.driftcmd:cmd_drift", "what refresh found changed or deleted, until the next apply")
    p.add_argument("state", type=_state_name)
    p.add_argument("--limit", type=_positive)
    p.add_argument("--format", choices=("table", "json"), default="table")

    p = _add(sub, "runs", "kilolock.cli.driftcmd:cmd_runs", "refresh runs of a state (the audit trail)")
    p.add_argument("state", type=_state_name)
    p.add_argument("--stale", action="store_true",
                   help="first mark as failed the runs left 'running' by a process that died")
    p.add_argument("--limit", type=_positive, default=50)
    p.add_argument("--format", choices=("table", "json"), default="table")

    p = _add(sub, "serve", "kilolock.server.cmd:cmd_serve", 'serve Terraform\'s backend "http" (state and locking) from the store')
    importlib.import_module("kilolock.server.options").add_arguments(p)

    prov = _add(sub, "provider", "", "provider configuration and version pins").add_subparsers(
        dest="provider_command", metavar="ACTION", parser_class=_Parser
    )
    p = _add(prov, "configure", "kilolock.cli.providercmd:cmd_configure",
             'store a provider\'s config (JSON; values may be {"env": "NAME"}, resolved at run time)')
    p.add_argument("source", type=_text, help="NAMESPACE/TYPE or HOST/NAMESPACE/TYPE")
    p.add_argument("--alias", type=_text, default="")
    p.add_argument("--state", type=_state_name, help="only for this state (default: every state)")
    p.add_argument("--config", required=True, metavar="FILE", help="JSON file, or - for standard input")
    p = _add(prov, "pin", "kilolock.cli.providercmd:cmd_pin", "use this provider version instead of the highest found")
    p.add_argument("source", type=_text)
    p.add_argument("version", type=_text)
    p.add_argument("--alias", type=_text, default="")
    p.add_argument("--state", type=_state_name)
    p = _add(prov, "list", "kilolock.cli.providercmd:cmd_list", "stored provider configs, pins and cached schemas")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return parser


def _text(text: str) -> str:
    # An argument that is not UTF-8 reaches Python with surrogate escapes, which psycopg cannot
    # send: without this it surfaced as an internal UnicodeEncodeError.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid UTF-8 text") from None
    return text


def _state_name(text: str) -> str:
    """What the states table accepts (its CHECK constraint), said before the database is asked."""
    _text(text)
    if not text:
        raise argparse.ArgumentTypeError("a state name must not be empty")
    if len(text) > 255:
        raise argparse.ArgumentTypeError(f"a state name has at most 255 characters, this one {len(text)}")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text):
        raise argparse.ArgumentTypeError(f"state name {text!r} contains a control character")
    return text


def _new_state_name(text: str) -> str:
    """A name for a state kl may create: also what ``kl serve`` accepts in a URL."""
    from kilolock.names import BadName, check_state_name

    _state_name(text)
    try:
        return check_state_name(text)
    except BadName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    if n > _MAX_COUNT:  # limits reach SQL as bigint: a larger one was an internal error there
        raise argparse.ArgumentTypeError(f"{text!r} is too large (at most {_MAX_COUNT})")
    return n


_MAX_COUNT = 2**31 - 1


def _serial(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= n < 2**63:  # serials are bigint, never negative
        raise argparse.ArgumentTypeError(f"{text!r} is not a state serial (0 or more, below 2^63)")
    return n


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


def _resolve(spec: str) -> Callable[[argparse.Namespace], int]:
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        handler = getattr(args, "_handler", "")
        if not handler:
            (getattr(args, "_parser", None) or parser).print_help(sys.stderr)
            return 2
        _configure_logging()
        return int(_resolve(handler)(args) or 0)
    except KlError as exc:
        # One line whatever the message quotes: argparse echoes unrecognized arguments raw, and an
        # argument may hold a newline.
        print("kl: " + one_line(str(exc)), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `kl state pull x | head`: the reader went away; not an error worth a message.
        sys.stderr.close()
        return 1
    except Exception as exc:  # a bug, not a user mistake: one line, the traceback on request
        psycopg = sys.modules.get("psycopg")  # only loaded by commands that use the database
        if psycopg is not None and isinstance(exc, psycopg.OperationalError):
            # A server restart or a cut connection in any command's own queries is a fault of the
            # environment, reported as such (a refresh run reports and records its own).
            from kilolock.store.db import first_line

            print(f"kl: lost the database connection: {first_line(exc)}", file=sys.stderr)
            return 1
        if os.environ.get("KL_DEBUG"):
            raise
        print(f"kl: internal error: {type(exc).__name__}: {exc} (run with KL_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
