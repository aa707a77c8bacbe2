"""``kl schedule set|list|pause|resume|remove|run-now``: when the fleet's workers refresh which states,
and which discoveries (``kl schedule set --discover SOURCE --type TYPE``) they run how often."""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.cron import CronError, parse
from kilolock.durations import format_duration
from kilolock.errors import KlError, UsageError


def _schedule_id(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a schedule ID (kl schedule list shows them)") from None
    if not 1 <= n < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a schedule ID (kl schedule list shows them)")
    return n


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--states", type=cli_args.state_glob, metavar="GLOB",
                        help="the states to refresh (* within a /-segment, ** across); states added later count too")
    discover = parser.add_argument_group("a scheduled discovery (as kl discover runs it) instead of a refresh")
    discover.add_argument("--discover", metavar="SOURCE", type=cli_args.utf8_text,
                          help="the provider whose objects to list: NAMESPACE/TYPE or HOST/NAMESPACE/TYPE")
    discover.add_argument("--type", dest="type_", metavar="TYPE", type=cli_args.utf8_text,
                          help="with --discover: the resource type to list")
    discover.add_argument("--list-config", metavar="JSON", type=cli_args.utf8_text,
                          help="with --discover: the list block's own configuration, a JSON object (default: {})")
    discover.add_argument("--state", type=cli_args.state_name,
                          help="with --discover: configure the provider as this state's refresh does")
    discover.add_argument("--alias", type=cli_args.utf8_text, help="with --discover: the provider configuration's alias")
    discover.add_argument("--limit", type=cli_args.positive, metavar="N", help="with --discover: ask for at most N objects")
    discover.add_argument("--provider-search-path", action="append", metavar="DIR",
                          help="with --discover: where the workers look for provider binaries first (repeatable)")
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", type=cli_args.duration, metavar="DURATION",
                      help="refresh this often, first now: 30s, 15m, 6h, 1d")
    when.add_argument("--cron", type=_cron, metavar="EXPR",
                      help='five cron fields in UTC, e.g. "0 */4 * * *", or @hourly/@daily/@weekly')
    parser.add_argument("--jitter", type=cli_args.duration, metavar="DURATION",
                        help="spread the states' runs over this long after each time (each state keeps its own offset)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who sets it (default $USER@cli)")


def _cron(text: str) -> str:
    cli_args.utf8_text(text)

    try:
        parse(text)
    except CronError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


_DISCOVERY_FLAGS = (("type_", "--type"), ("list_config", "--list-config"), ("state", "--state"), ("alias", "--alias"),
                    ("limit", "--limit"), ("provider_search_path", "--provider-search-path"))


def _discovery(args: argparse.Namespace) -> dict[str, Any] | None:
    """The discovery a schedule runs (None: it refreshes --states); UsageError for flags that do not go together."""
    if args.discover is None:
        if args.states is None:
            raise UsageError("kl schedule set needs --states GLOB (to refresh) or --discover SOURCE --type TYPE (to discover)")
        given = [flag for attr, flag in _DISCOVERY_FLAGS if getattr(args, attr) is not None]
        if given:
            raise UsageError(f"{given[0]} goes with --discover SOURCE, not with --states (a refresh schedule)")
        return None
    if args.states is not None:
        raise UsageError("--states and --discover do not go together: a schedule refreshes states or runs one discovery")
    if not args.type_:
        raise UsageError("--discover needs --type TYPE (the resource type to list)")
    from kilolock.cli.discovercmd import _list_config
    from kilolock.cli.providercmd import normalize_source

    return {"source": normalize_source(args.discover), "alias": args.alias or "", "state": args.state, "type": args.type_,
            "list_config": _list_config(args.list_config or "{}"), "limit": args.limit,
            "search_paths": [os.path.abspath(p) for p in args.provider_search_path or ()]}


def run_set(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import fleet

    discovery = _discovery(args)
    now = datetime.now(timezone.utc)
    first = now if args.every else parse(args.cron).next_after(now)
    assert first is not None  # _cron refused expressions that never match
    if discovery is not None:
        with context.open_store() as conn:
            if discovery["state"] is not None:
                from kilolock.store import states

                states.state_id(conn, discovery["state"])  # StateNotFound: one line naming it
            schedule_id = fleet.add_discovery_schedule(conn, discovery, every_s=args.every, cron=args.cron,
                                                       jitter_s=args.jitter or 0.0, first_run_at=first,
                                                       actor=args.actor or cli_args.default_actor())
        print(schedule_id)
        return 0
    with context.open_store() as conn:
        schedule_id = fleet.add_schedule(conn, args.states, every_s=args.every, cron=args.cron, jitter_s=args.jitter or 0.0,
                                         first_run_at=first, actor=args.actor or cli_args.default_actor())
        matched = len(fleet.refreshable_states(conn, args.states))
    if not matched:
        print(f"kl: note: --states {args.states!r} matches no refreshable state now; schedule {schedule_id} "
              "will refresh those that appear", file=sys.stderr)
    print(schedule_id)
    return 0


def _when(s: Any) -> str:
    if s.cron:
        return f"cron {s.cron} (UTC)"
    return f"every {format_duration(s.every_s)}"


def _what(s: Any) -> str:
    """What a schedule runs, as `kl schedule set` was told it."""
    if s.discovery is None:
        return f"--states {s.states_glob!r}"
    d = s.discovery
    return (f"--discover {d['source']} --type {d['type']}" + (f" --alias {d['alias']}" if d.get("alias") else "")
            + (f" --state {d['state']}" if d.get("state") else "")
            + (f" --list-config '{json.dumps(d['list_config'], sort_keys=True)}'" if d.get("list_config") else "")
            + (f" --limit {d['limit']}" if d.get("limit") else ""))


def _schedule_json(s: Any) -> dict[str, Any]:
    return {"id": s.id, "kind": s.kind, "states": s.states_glob,
            "matching_states": s.states if s.discovery is None else None, "discovery": s.discovery,
            "every_s": s.every_s, "cron": s.cron,
            "cron_time_zone": "UTC" if s.cron else None, "jitter_s": s.jitter_s, "paused": s.paused,
            "next_run_at": s.next_run_at, "last_run_at": s.last_run_at, "created_at": s.created_at,
            "created_by": s.created_by}


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import fleet

    with context.open_store() as conn:
        schedules, live, now = fleet.schedules_now(conn)
    if args.format == "json":
        render.emit_json({"version": 1, "live_workers": live, "schedules": [
            {**_schedule_json(s), "overdue": not s.paused and s.next_run_at < now} for s in schedules]})
        return 0
    if not schedules:
        print("no schedules (kl schedule set --states GLOB --every DURATION adds one)")
        return 0
    render.table(["id", "states", "matching", "when", "jitter", "next run", "last run", "paused"],
                 [(s.id, s.states_glob if s.discovery is None else _what(s), s.states if s.discovery is None else "-", _when(s), format_duration(s.jitter_s) if s.jitter_s else "-",
                   _next_run(s, now), s.last_run_at, "yes" if s.paused else "no")
                  for s in schedules])
    if not live and any(not s.paused for s in schedules):
        print("no live worker: schedules fire only while one runs (start one: kl worker; kl fleet status shows them)")
    return 0


def _next_run(s: Any, now: Any) -> str:
    """A time already past is overdue: a worker fires it at its next poll, so none has polled since."""
    if s.paused:
        return "(paused)"
    return render.when(s.next_run_at) + (" (overdue)" if s.next_run_at < now else "")


def add_pause_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", type=_schedule_id, help="the schedule (kl schedule list)")


add_resume_arguments = add_remove_arguments = add_pause_arguments


def _pause(args: argparse.Namespace, context: CommandContext, paused: bool) -> int:
    from kilolock.store import fleet

    with context.open_store() as conn:
        found = fleet.set_paused(conn, args.id, paused)
    if not found:
        raise KlError(f"no schedule {args.id} (kl schedule list shows them)")
    return 0


def run_pause(args: argparse.Namespace, context: CommandContext) -> int:
    return _pause(args, context, True)


def run_resume(args: argparse.Namespace, context: CommandContext) -> int:
    """A resumed schedule that missed its times fires once, at the next worker poll."""
    return _pause(args, context, False)


def run_remove(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import fleet

    with context.open_store() as conn:
        removed = fleet.remove_schedule(conn, args.id)
    if removed is None:
        raise KlError(f"no schedule {args.id} (kl schedule list shows them)")
    s, dropped = removed
    print(f"removed schedule {s.id}: {_what(s)}, {_when(s)}; "
          f"{dropped} queued job(s) dropped (running ones finish)")
    return 0


def add_run_now_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--states", required=True, type=cli_args.state_glob, metavar="GLOB",
                        help="the states to queue for the workers now")


def run_run_now(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import fleet

    with context.open_store() as conn:
        matched, queued = fleet.enqueue_now(conn, args.states)
    if not matched:
        raise KlError(f"no refreshable state matches {args.states!r} (kl state list shows the states)")
    print(f"{queued} of {matched} state(s) queued for now ({matched - queued} already queued or running)")
    return 0
