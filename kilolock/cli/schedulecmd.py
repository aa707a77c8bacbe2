"""``kl schedule set|list|pause|resume|remove|run-now``: when the fleet's workers refresh which states."""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any

from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.cron import CronError, parse
from kilolock.durations import format_duration
from kilolock.errors import KlError


def _schedule_id(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a schedule ID (kl schedule list shows them)") from None
    if not 1 <= n < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a schedule ID (kl schedule list shows them)")
    return n


def add_set_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--states", required=True, type=cli_args.state_glob, metavar="GLOB",
                        help="the states to refresh (* within a /-segment, ** across); states added later count too")
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


def run_set(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import fleet

    now = datetime.now(timezone.utc)
    first = now if args.every else parse(args.cron).next_after(now)
    assert first is not None  # _cron refused expressions that never match
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


def _schedule_json(s: Any) -> dict[str, Any]:
    return {"id": s.id, "states": s.states_glob, "matching_states": s.states, "every_s": s.every_s, "cron": s.cron,
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
                 [(s.id, s.states_glob, s.states, _when(s), format_duration(s.jitter_s) if s.jitter_s else "-",
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
    print(f"removed schedule {s.id}: --states {s.states_glob!r}, {_when(s)}; "
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
