"""``kl drift``: the current_resource_drift view, for people and tools."""
from __future__ import annotations

import argparse
from typing import Any

from kilolock import drift
from kilolock.cli import args as cli_args
from kilolock.cli import render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("state", type=cli_args.state_name)
    parser.add_argument("--limit", type=cli_args.positive)
    cli_args.add_format(parser)


def run(args: argparse.Namespace) -> int:
    from kilolock.store import db
    from kilolock.store import drift as drift_store

    with db.open_store() as conn:
        rows = drift_store.list_drift(conn, args.state, args.limit)
        total = drift_store.count_drift(conn, args.state)
    items: list[tuple[dict[str, Any], list[drift.Change]]] = []
    for r in rows:
        if r["drift_kind"] == "deleted":  # every attribute "→ null" says nothing more than "deleted"
            items.append((r, []))
            continue
        ch = drift.changes(r["previous_attributes"], r["current_attributes"],
                           r["previous_sensitive_attributes"], r["current_sensitive_attributes"])
        items.append((r, ch))
    if args.format == "json":
        render.emit_json({
            "version": 1,
            "state": args.state,
            "total": total,
            "drift": [
                {"address": r["address"], "deposed": r["deposed"] or None, "kind": r["drift_kind"], "type": r["type"],
                 "detected_serial": r["detected_serial"], "detected_at": r["detected_at"],
                 "refresh_run_id": str(r["refresh_run_id"]) if r["refresh_run_id"] else None,
                 "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in ch]}
                for r, ch in items
            ],
        })
        return 0
    if not items:
        print(f"{args.state}: no drift")
        return 0
    for r, ch in items:
        deposed = f" (deposed {r['deposed']})" if r["deposed"] else ""
        print(f"{r['address']}{deposed}: {r['drift_kind']} at v{r['detected_serial']}")
        if r["drift_kind"] == "deleted":
            print("  the object no longer exists")
        for c in ch:
            print(f"  {c.path}: {drift.show(c.before)} → {drift.show(c.after)}")
    if total > len(items):
        print(f"... and {total - len(items)} more (--limit)")
    return 0
