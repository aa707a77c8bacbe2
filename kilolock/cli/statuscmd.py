"""``kl status``: one state at a glance, or with ``--states GLOB`` a line for each state."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from kilolock import globs
from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", type=cli_args.state_name, help="the state (or use --states)")
    parser.add_argument("--states", metavar="GLOB", type=cli_args.state_glob,
                        help="a line for every state whose name matches: * within one /-separated segment, ** across")
    cli_args.add_format(parser)


def _lock_text(info: dict[str, Any]) -> str:
    # The ID is what `kl state unlock NAME --lock-id ID` (and terraform force-unlock) asks for.
    who = info.get("Who") or "someone"
    what = info.get("Operation") or "an operation"
    return f"by {who} ({what}, since {info.get('Created') or '?'}), lock ID {info.get('ID')}"


def _encryption_text(s: Mapping[str, Any]) -> str:
    if s["unindexed"]:
        # The index (resources, drift) stays at the last version kl could read.
        return f"OpenTofu-encrypted, not indexed: {s['unindexed']}"
    return "OpenTofu-encrypted, decrypted and indexed"


def _discovery_text(d: Any) -> str:
    if d.status != "succeeded":
        return f"{d.status}, {render.timestamp(d.started_at)}: {d.error} (kl discover --results --run {d.id})"
    return (f"{d.unmanaged} unmanaged ({d.new_unmanaged} new), {d.managed_twice} managed twice, {d.managed} managed, "
            f"{render.timestamp(d.started_at)} (kl discover --results --run {d.id})")


def _discovery_json(d: Any) -> dict[str, Any]:
    return {"run_id": d.id, "source": d.source, "alias": d.alias or None, "type": d.type, "list_config": d.list_config,
            "status": d.status, "started_at": d.started_at, "error": d.error,
            "counts": {"listed": d.listed, "managed": d.managed, "unmanaged": d.unmanaged,
                       "managed_twice": d.managed_twice, "new_unmanaged": d.new_unmanaged}}


def _run_many(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import states, summary

    with context.open_store() as conn:
        rows = summary.states_status(conn, globs.sql_regex(args.states))
        if not rows:
            raise KlError(states.no_state_matches(conn, args.states))
    if args.format == "json":
        render.emit_json({"version": 1, "states_glob": args.states,
                          "states": [{"state": r["state"], "serial": r["serial"], "resources": r["resources"],
                                      "open_drift": r["open_drift"], "locked_by": r["locked_by"],
                                      "last_refresh": None if r["last_refresh_status"] is None else
                                      {"status": r["last_refresh_status"], "started_at": r["last_refresh_at"]}}
                                     for r in rows]})
        return 0
    render.table(["state", "serial", "resources", "open drift", "last refresh", "locked by"],
                 [(r["state"], "-" if r["serial"] is None else f"v{r['serial']}", r["resources"], r["open_drift"],
                   "never" if r["last_refresh_status"] is None or r["last_refresh_at"] is None else
                   f"{r['last_refresh_status']}, {render.timestamp(r['last_refresh_at'])}", r["locked_by"] or "-")
                  for r in rows])
    return 0


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.drift import duration
    from kilolock.store import discovery_results, refresh_runs, states, summary

    if (args.name is None) == (args.states is None):
        args._parser.error("name one state, or --states GLOB")  # with the usage line, as argparse's own
    if args.states is not None:
        return _run_many(args, context)
    with context.open_store() as conn:
        s = summary.state_status(conn, args.name)
        dead = refresh_runs.dead_runs(conn, states.state_id(conn, args.name))
        discovered = discovery_results.scopes(conn, args.name)
    oldest = s["open_drift_oldest_for"]
    if args.format == "json":
        shown = {k: v for k, v in s.items() if k != "open_drift_oldest_for"}
        render.emit_json({"version": 1, **shown, "open_drift_oldest_s": None if oldest is None else int(oldest.total_seconds()),
                          "dead_runs": dead, "discovery": [_discovery_json(d) for d in discovered]})
        return 0
    last: Any = "never"
    if s["last_refresh"]:
        r = s["last_refresh"]
        if r["to_serial"] is not None:
            read = f"v{r['from_serial']} → v{r['to_serial']}"
        elif r.get("observation"):
            read = f"v{r['from_serial']} observed as {r['observation']}"
        else:
            read = f"v{r['from_serial']}, nothing recorded"
        last = f"{read}, {r['status']}, {render.timestamp(r['started_at'])}"
    render.key_values(
        [
            ("state", s["state"]),
            ("serial", f"v{s['serial']}" if s["serial"] is not None else "-"),
            ("lineage", s["lineage"]),
            ("terraform", s["terraform_version"]),
            *([("encrypted", _encryption_text(s))] if s["encrypted"] else []),
            ("versions", s["versions"]),
            ("managed", s["managed"]),
            ("data", s["data"]),
            ("last refresh", last),
            ("open drift", s["open_drift"] if oldest is None else
             f"{s['open_drift']} (oldest first detected {s['open_drift_first_version']}, open {duration(oldest.total_seconds())})"),
            ("locked", _lock_text(s["lock"]) if s["lock"] else "no"),
            # The discoveries run with this state's provider config (kl discover --state).
            *((f"discovered {d.type}", _discovery_text(d)) for d in discovered),
        ]
    )
    if dead:
        # A `running` row whose process is gone never finishes by itself, and may hold the lock.
        print(f"{len(dead)} refresh run(s) look dead (still 'running', their process is gone): "
              f"kl runs {args.name} --stale marks them failed and frees the lock")
    return 0
