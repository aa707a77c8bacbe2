"""``kl drift`` (the current_resource_drift view, for people and tools) and ``kl runs``."""
from __future__ import annotations

import argparse
import sys

from kilolock import drift
from kilolock.cli import render
from kilolock.store import db
from kilolock.store import drift as drift_store
from kilolock.store import refresh_runs, versions


def cmd_drift(args: argparse.Namespace) -> int:
    with db.open_store() as conn:
        rows = drift_store.list_drift(conn, args.state, args.limit)
        total = drift_store.count_drift(conn, args.state)
    items = []
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


def cmd_runs(args: argparse.Namespace) -> int:
    from kilolock.cli.statecmd import default_actor

    with db.open_store() as conn:
        sid = versions.state_id(conn, args.state)
        if args.stale:
            marked = refresh_runs.finish_stale(conn, sid, default_actor())
            print(f"{args.state}: {len(marked)} stale run(s) marked failed" + (": " + ", ".join(marked) if marked else ""),
                  file=sys.stderr)
        rows = refresh_runs.list_runs(conn, sid, args.limit)
    if args.format == "json":
        render.emit_json({"version": 1, "state": args.state, "runs": [
            {"id": r.id, "status": r.status, "from_serial": r.from_serial, "to_serial": r.to_serial,
             "started_at": r.started_at, "finished_at": r.finished_at, "resources_checked": r.resources_checked,
             "resources_changed": r.resources_changed, "resources_failed": r.resources_failed,
             "error_summary": r.error_summary, "actor": r.actor} for r in rows]})
        return 0
    render.table(
        ["started", "status", "serial", "checked", "changed", "failed", "actor", "id"],
        [(r.started_at, r.status, f"v{r.from_serial} → " + (f"v{r.to_serial}" if r.to_serial is not None else "-"),
          r.resources_checked, r.resources_changed, r.resources_failed, r.actor, r.id) for r in rows],
    )
    return 0
