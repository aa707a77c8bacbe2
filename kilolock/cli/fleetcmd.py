"""``kl fleet status``: the workers, what each runs, the queue, lag behind schedule, last errors."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.durations import format_duration


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)
    parser.add_argument("--errors", type=cli_args.positive, default=10, metavar="N", help="last errors shown (default 10)")


def _seconds(v: Any) -> str:
    return "-" if v is None else format_duration(max(0.0, float(v)))


def _holders(holders: list[dict[str, Any]]) -> str:
    """"w1 2, w2 1 (1 waiting)": the worker (or, for another kl process, host:pid) and its slots."""
    def one(h: dict[str, Any]) -> str:
        who = h["worker"] or ":".join(h["holder"].split(":")[:2])
        waiting = h["wanted"] - h["slots"]
        return f"{who} {h['slots']}" + (f" ({waiting} waiting)" if waiting > 0 else "")

    return ", ".join(one(h) for h in holders) or "-"


def run_status(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.refresh.whyfailed import headline
    from kilolock.store import fleet

    with context.open_store() as conn:
        doc = fleet.status(conn, args.errors)
    workers: list[dict[str, Any]] = [{**w, "state": _state(w)} for w in doc["workers"]]
    if args.format == "json":
        render.emit_json({"version": 1, "now": doc["now"], "queue": doc["queue"],
                          "workers": [{k: w[k] for k in ("id", "name", "host", "pid", "state", "status", "parallel_states",
                                                         "lease_s", "started_at", "heartbeat_at", "running")}
                                      for w in workers],
                          "errors": doc["errors"],
                          "provider_limits": [{**lim, "alias": lim["alias"] or None} for lim in doc["provider_limits"]]})
        return 0
    q = doc["queue"]
    render.key_values([
        ("time", doc["now"]),
        ("workers", (f"{sum(1 for w in workers if w['state'] == 'alive')} alive, "
                    f"{sum(1 for w in workers if w['state'] == 'lost')} lost (no heartbeat within their lease)")),
        ("queue", f"{q['due']} due, {q['running']} running, {q['upcoming']} later"),
        ("lag", (f"oldest due job waiting {_seconds(q['lag_s'])}; claimed after due in the last hour: "
                f"p50 {_seconds(q['claim_lag_p50_s'])}, p99 {_seconds(q['claim_lag_p99_s'])}")),
        ("last hour", f"{q['succeeded_1h']} succeeded, {q['failed_1h']} failed"
                      + (f" ({q['taken_over_1h']} taken over from a worker that stopped heartbeating)"
                         if q["taken_over_1h"] else "")),
    ])
    if workers:
        print()
        render.table(["worker", "host", "pid", "state", "heartbeat", "running"],
                     [(w["name"], w["host"], w["pid"], "draining" if w["state"] == "alive" and w["status"] == "draining"
                       else w["state"],
                       w["heartbeat_at"], ", ".join(r["state"] for r in w["running"]) or "-") for w in workers])
    if doc["provider_limits"]:
        print()
        render.table(["provider limit", "alias", "max in flight", "leased now", "held by"],
                     [(lim["source"], lim["alias"] or "-", lim["max_in_flight"], lim["leased"], _holders(lim["holders"]))
                      for lim in doc["provider_limits"]])
    if doc["errors"]:
        print("\nlast errors:")
        for e in doc["errors"]:
            print(f"  {render.when(e['at'])}  {e['state']}  (worker {e['worker']}): {headline(e['error'] or '-')}")
    return 0


def _state(w: Mapping[str, Any]) -> str:
    """alive, lost (no heartbeat within its lease: a draining worker too) or stopped."""
    if w["status"] == "stopped":
        return "stopped"
    return "alive" if w["alive"] else "lost"


def add_prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--older-than", type=cli_args.duration, default=3600.0, metavar="DURATION",
                        help="remove workers stopped or lost (no heartbeat within their lease) whose last heartbeat "
                             "is older than this (default 1h)")


def run_prune(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import fleet

    with context.open_store() as conn:
        removed = fleet.prune_workers(conn, args.older_than)
    for w in removed:
        print(f"removed worker {w['name']} ({w['host']}, pid {w['pid']}, "
              f"{'stopped' if w['status'] == 'stopped' else 'lost'}, last heartbeat {render.when(w['heartbeat_at'])})")
    print(f"{len(removed)} worker(s) removed (stopped or lost, no heartbeat for {format_duration(args.older_than)})")
    return 0
