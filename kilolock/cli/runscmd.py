"""``kl runs``: a state's refresh runs (the audit trail)."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext

if TYPE_CHECKING:
    from kilolock.store.refresh_runs import RunRow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("state", type=cli_args.state_name, help="the state")
    parser.add_argument("--stale", action="store_true",
                        help="first mark as failed the runs left 'running' by a process that died")
    parser.add_argument("--limit", type=cli_args.positive, default=50, help="the newest N runs (default 50)")
    cli_args.add_format(parser)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import refresh_runs, states

    with context.open_store() as conn:
        sid = states.state_id(conn, args.state)
        if args.stale:
            marked = refresh_runs.finish_stale(conn, sid, cli_args.default_actor())
            print(f"{args.state}: {len(marked)} stale run(s) marked failed" + (": " + ", ".join(marked) if marked else ""),
                  file=sys.stderr)
        rows = refresh_runs.list_runs(conn, sid, args.limit)
    if args.format == "json":
        render.emit_json({"version": 1, "state": args.state, "runs": [
            {"id": r.id, "status": r.status, "from_serial": r.from_serial, "to_serial": r.to_serial,
             "observation": r.observation, "started_at": r.started_at, "finished_at": r.finished_at, "resources_checked": r.resources_checked,
             "resources_changed": r.resources_changed, "resources_failed": r.resources_failed,
             "error_summary": r.error_summary, "actor": r.actor, "concurrency": r.concurrency,
             "dry_run": _dry_run(r)} for r in rows]})
        return 0
    from kilolock.refresh.whyfailed import headline

    # The error last: it is the widest column, and the run's cause (with its fix) must not need --format json.
    render.table(
        ["started", "status", "serial", "checked", "changed", "failed", "in flight", "actor", "id", "error"],
        [(r.started_at, r.status, _serials(r),
          r.resources_checked, r.resources_changed, r.resources_failed, in_flight(r.concurrency), r.actor, r.id,
          headline(r.error_summary) if r.error_summary else None)
         for r in rows],
    )
    return 0


def _dry_run(run: RunRow) -> bool:
    # The audit row has no flag for it: every other refresh that succeeds records an observation or a version.
    return run.status == "succeeded" and run.to_serial is None and run.observation is None


def _serials(run: RunRow) -> str:
    to = (f"v{run.to_serial}" if run.to_serial is not None else f"{run.observation} (observed)" if run.observation
          else "(dry run)" if _dry_run(run) else "-")
    return f"v{run.from_serial} → {to}"


def in_flight(concurrency: list[dict[str, Any]] | None) -> str:
    """Requests in flight per provider: the most and the last (auto), or N (fixed); the provider
    named when there are several."""
    if not concurrency:
        return "-"
    parts = []
    for c in concurrency:
        text = f"auto, max {c['max']}, final {c['final']}" if c["mode"] == "auto" else f"{c['final']} fixed"
        if c.get("throttled"):
            text += f" ({c['throttled']} throttled)"
        if len(concurrency) > 1:
            text = c["provider"].rsplit("/", 1)[-1] + (f".{c['alias']}" if c.get("alias") else "") + " " + text
        parts.append(text)
    return ", ".join(parts)
