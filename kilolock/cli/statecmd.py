"""``kl state import|list|versions|pull``."""
from __future__ import annotations

import argparse
import sys

from kilolock import tfstate
from kilolock.cli import args as cli_args
from kilolock.cli import render


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.new_state_name,
                        help="state name: letters, digits and . _ @ + = - in '/'-separated segments")
    parser.add_argument("file", help="state file, or - for standard input")
    parser.add_argument("--source", choices=("import", "apply", "refresh"), default="import",
                        help="what the version records as its origin (default import)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who wrote it (default: $USER@cli)")
    parser.add_argument("--force", action="store_true", help="accept a different lineage")


def run_import(args: argparse.Namespace) -> int:
    from kilolock.store import db, versions

    raw = cli_args.read_input(args.file)
    origin = "<stdin>" if args.file == "-" else args.file
    state = tfstate.parse_state(raw, origin)  # every input error surfaces before the database is touched
    with db.open_store() as conn:
        result = versions.write_version(
            conn, args.name, state, raw, source=args.source, actor=args.actor or cli_args.default_actor(), force=args.force
        )
    v = result.version
    if not result.created:
        print(f"{args.name}: serial {v.serial} is already the current version (identical content); nothing written")
        return 0
    print(
        f"{args.name}: stored serial {v.serial} ({args.source}), {len(state.instances)} instances: "
        f"{result.opened} lifecycles opened, {result.closed} closed, {result.unchanged} unchanged"
    )
    return 0


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--states", metavar="GLOB", type=cli_args.state_glob,
                        help="only states whose name matches: * within one /-separated segment, ** across")
    cli_args.add_format(parser)


def run_list(args: argparse.Namespace) -> int:
    from kilolock.globs import compile_glob
    from kilolock.store import db, summary

    with db.open_store() as conn:
        rows = summary.list_states(conn)
    if args.states is not None:
        pattern = compile_glob(args.states)
        rows = [r for r in rows if pattern.fullmatch(r["name"])]
    if args.format == "json":
        render.emit_json({"version": 1, "states": rows})
        return 0
    render.table(
        ["name", "serial", "versions", "resources", "updated"],
        [(r["name"], r["serial"], r["versions"], r["resources"], r["updated_at"]) for r in rows],
    )
    return 0


def add_versions_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    cli_args.add_format(parser)


def run_versions(args: argparse.Namespace) -> int:
    from kilolock.store import db, versions

    with db.open_store() as conn:
        rows = versions.list_versions(conn, args.name)
    if args.format == "json":
        render.emit_json(
            {
                "version": 1,
                "state": args.name,
                "versions": [
                    {"serial": v.serial, "lineage": v.lineage, "source": v.source, "terraform_version": v.terraform_version,
                     "actor": v.actor, "created_at": v.created_at, "content_hash": v.content_hash}
                    for v in rows
                ],
            }
        )
        return 0
    render.table(
        ["serial", "source", "actor", "terraform", "created"],
        [(f"v{v.serial}", v.source, v.actor, v.terraform_version, v.created_at) for v in rows],
    )
    return 0


def add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    parser.add_argument("--serial", type=cli_args.serial, help="a past version (default: the current one)")


def run_pull(args: argparse.Namespace) -> int:
    from kilolock.store import db, versions

    with db.open_store() as conn:
        text = versions.raw_state_text(conn, args.name, args.serial)
    sys.stdout.write(tfstate.pretty_state(text))
    return 0
