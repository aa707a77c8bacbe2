"""``kl``: the command line. Parsing lives here; each command's work is imported only when run,
so ``kl --help`` and ``kl version`` start without loading psycopg or grpc."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Callable, Sequence

from kilolock.errors import KlError, UsageError


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
    p.add_argument("name", help="state name")
    p.add_argument("file", help="state file, or - for standard input")
    p.add_argument("--source", choices=("import", "apply", "refresh"), default="import")
    p.add_argument("--actor", help="who wrote it (default: $USER@cli)")
    p.add_argument("--force", action="store_true", help="accept a different lineage")
    p = _add(state, "list", "kilolock.cli.statecmd:cmd_list", "list states")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p = _add(state, "versions", "kilolock.cli.statecmd:cmd_versions", "list the versions of a state")
    p.add_argument("name")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p = _add(state, "pull", "kilolock.cli.statecmd:cmd_pull", "print a state version as Terraform state JSON")
    p.add_argument("name")
    p.add_argument("--serial", type=int, help="a past version (default: the current one)")

    p = _add(sub, "status", "kilolock.cli.statecmd:cmd_status", "summary of a state: serial, counts, refresh, drift")
    p.add_argument("name")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return parser


def _configure_logging() -> None:
    level_name = (os.environ.get("KL_LOG") or os.environ.get("TF_LOG") or "warn").upper()
    level = {"TRACE": logging.DEBUG, "WARN": logging.WARNING}.get(level_name, getattr(logging, level_name, logging.WARNING))
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


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
        print(f"kl: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `kl state pull x | head`: the reader went away; not an error worth a message.
        sys.stderr.close()
        return 1
    except Exception as exc:  # a bug, not a user mistake: one line, the traceback on request
        if os.environ.get("KL_DEBUG"):
            raise
        print(f"kl: internal error: {type(exc).__name__}: {exc} (run with KL_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
