"""``kl drift``: the drift records (open ones, or all with --all), for people and tools."""
from __future__ import annotations

import argparse
from typing import Any

from kilolock.cli import args as cli_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("state", type=cli_args.state_name)
    parser.add_argument("--limit", type=cli_args.positive)
    parser.add_argument("--all", action="store_true", help="resolved drift too, with when and how it was resolved")
    cli_args.add_format(parser)


def load_document(state: str, limit: int | None, include_resolved: bool) -> dict[str, Any]:
    """The drift document of STATE (kilolock.drift.document), as `--format json` prints it."""
    from kilolock import drift
    from kilolock.store import db
    from kilolock.store import drift as drift_store

    with db.open_store() as conn, conn.transaction():  # one snapshot: the rows and both counts agree
        rows = drift_store.list_drift(conn, state, limit, include_resolved=include_resolved)
        open_count = drift_store.count_drift(conn, state)
        total = drift_store.count_drift(conn, state, include_resolved=True) if include_resolved else open_count
    return drift.document(state, rows, total=total, open_count=open_count, include_resolved=include_resolved)


def _print_table(doc: dict[str, Any]) -> None:
    from kilolock import drift
    from kilolock.cli.render import when

    items = doc["drift"]
    if not items:
        print(f"{doc['state']}: no drift" if not doc["all"] else f"{doc['state']}: no drift, open or resolved")
        return
    for e in items:
        deposed = f" (deposed {e['deposed']})" if e["deposed"] else ""
        first = e["first_detected"]
        since = f"first detected v{first['serial']}, {when(first['at'])}"
        if e["resolved"] is None:
            print(f"{e['address']}{deposed}: {e['kind']} at v{e['detected_serial']} ({since}, open {drift.duration(e['open_for_s'])})")
        else:
            r = e["resolved"]
            print(f"{e['address']}{deposed}: {e['kind']} at v{e['detected_serial']} ({since}), "
                  f"resolved at v{r['serial']} by {r['how']}, {when(r['at'])} (was open {drift.duration(e['open_for_s'])})")
        if e["kind"] == "deleted":
            print("  the object no longer exists" if e["resolved"] is None else "  the object was gone")
        for c in e["changes"]:
            print(f"  {c['path']}: {drift.show(c['before'])} → {drift.show(c['after'])}")
    if doc["total"] > len(items):
        print(f"... and {doc['total'] - len(items)} more (--limit)")


def run(args: argparse.Namespace) -> int:
    from kilolock.cli import render

    doc = load_document(args.state, args.limit, args.all)
    if args.format == "json":
        render.emit_json(doc)
        return 0
    _print_table(doc)
    return 0
