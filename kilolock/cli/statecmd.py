"""``kl state import|list|versions|pull`` and ``kl status``."""
from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from kilolock import tfstate
from kilolock.cli import render
from kilolock.errors import KlError
from kilolock.store import db, summary, versions


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = "unknown"
    return f"{user}@cli"


def _read_input(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise KlError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise KlError(f"{path}: is a directory, expected a state file") from None
    except PermissionError:
        raise KlError(f"{path}: permission denied") from None
    except OSError as exc:  # a name too long, a loop of symlinks, an I/O error: not a bug in kl
        raise KlError(f"{path}: cannot read: {exc.strerror or exc}") from None


def cmd_import(args: argparse.Namespace) -> int:
    raw = _read_input(args.file)
    origin = "<stdin>" if args.file == "-" else args.file
    state = tfstate.parse_state(raw, origin)  # every input error surfaces before the database is touched
    with db.open_store() as conn:
        result = versions.write_version(
            conn, args.name, state, raw, source=args.source, actor=args.actor or default_actor(), force=args.force
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


def cmd_list(args: argparse.Namespace) -> int:
    with db.open_store() as conn:
        rows = summary.list_states(conn)
    if args.format == "json":
        render.emit_json({"version": 1, "states": rows})
        return 0
    render.table(
        ["name", "serial", "versions", "resources", "updated"],
        [(r["name"], r["serial"], r["versions"], r["resources"], r["updated_at"]) for r in rows],
    )
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
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


def cmd_pull(args: argparse.Namespace) -> int:
    with db.open_store() as conn:
        text = versions.raw_state_text(conn, args.name, args.serial)
    sys.stdout.write(tfstate.pretty_state(text))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with db.open_store() as conn:
        s = summary.state_status(conn, args.name)
    if args.format == "json":
        render.emit_json({"version": 1, **s})
        return 0
    last: Any = "never"
    if s["last_refresh"]:
        r = s["last_refresh"]
        to = f"v{r['to_serial']}" if r["to_serial"] is not None else "(nothing committed)"
        last = f"v{r['from_serial']} → {to}, {r['status']}, {r['started_at']:%Y-%m-%d %H:%M:%S}"
    render.key_values(
        [
            ("state", s["state"]),
            ("serial", f"v{s['serial']}" if s["serial"] is not None else "-"),
            ("lineage", s["lineage"]),
            ("terraform", s["terraform_version"]),
            ("versions", s["versions"]),
            ("managed", s["managed"]),
            ("data", s["data"]),
            ("last refresh", last),
            ("open drift", s["open_drift"]),
            ("locked", s["locked_by"] or "no"),
        ]
    )
    return 0
