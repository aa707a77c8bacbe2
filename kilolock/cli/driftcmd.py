"""``kl drift``: the current_resource_drift view, for people and tools.

Gathering (``drift_document``) and rendering (``render_table``, ``render_markdown``) are apart: the
renderers take the JSON document, so a field the document gains reaches every format."""
from __future__ import annotations

import argparse
from typing import Any

from kilolock import drift
from kilolock.cli import args as cli_args
from kilolock.cli import exitcodes, render

EXAMPLE = """examples:
  kl drift prod
  kl drift --states 'team/**' --detailed-exitcode -q     # CI gate: exit 2 when any state has drift
  kl drift prod --format markdown >> "$GITHUB_STEP_SUMMARY\""""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLE
    parser.add_argument("state", nargs="?", type=cli_args.state_name, help="the state (or use --states)")
    parser.add_argument("--states", metavar="GLOB", type=cli_args.state_glob,
                        help="every state whose name matches: * within one /-separated segment, ** across")
    parser.add_argument("--limit", type=cli_args.positive, help="show at most N drifted instances per state")
    cli_args.add_format(parser, markdown=True)
    exitcodes.add_gate_arguments(parser, "now")


def drift_document(conn: Any, name: str, limit: int | None) -> dict[str, Any]:
    from kilolock.store import drift as drift_store

    rows = drift_store.list_drift(conn, name, limit)
    total = drift_store.count_drift(conn, name)
    return {
        "version": 1,
        "state": name,
        "total": total,
        "drift": [
            {"address": r["address"], "deposed": r["deposed"] or None, "kind": r["drift_kind"], "type": r["type"],
             "detected_serial": r["detected_serial"], "detected_at": r["detected_at"],
             "refresh_run_id": str(r["refresh_run_id"]) if r["refresh_run_id"] else None,
             "changes": _changes(r)}
            for r in rows
        ],
    }


def _changes(r: dict[str, Any]) -> list[dict[str, Any]]:
    if r["drift_kind"] == "deleted":  # every attribute "→ null" says nothing more than "deleted"
        return []
    return [{"path": c.path, "before": c.before, "after": c.after}
            for c in drift.changes(r["previous_attributes"], r["current_attributes"],
                                   r["previous_sensitive_attributes"], r["current_sensitive_attributes"])]


def render_table(doc: dict[str, Any]) -> None:
    items = doc["drift"]
    if not items:
        print(f"{doc['state']}: no drift")
        return
    for item in items:
        deposed = f" (deposed {item['deposed']})" if item["deposed"] else ""
        print(f"{item['address']}{deposed}: {item['kind']} at v{item['detected_serial']}")
        if item["kind"] == "deleted":
            print("  the object no longer exists")
        for c in item["changes"]:
            print(f"  {c['path']}: {drift.show(c['before'])} → {drift.show(c['after'])}")
    if doc["total"] > len(items):
        print(f"... and {doc['total'] - len(items)} more (--limit)")


def render_markdown(doc: dict[str, Any], heading: str = "###") -> None:
    """For CI step summaries and pull-request comments: one section per state, a table per instance."""
    total = doc["total"]
    print(f"{heading} Drift in `{doc['state']}`: " + (f"{total} instance(s)" if total else "none"))
    for item in doc["drift"]:
        deposed = f" (deposed `{item['deposed']}`)" if item["deposed"] else ""
        print()
        print(f"**`{item['address']}`**{deposed}: {item['kind']} at v{item['detected_serial']}")
        if item["kind"] == "deleted":
            print("\nThe object no longer exists.")
        if item["changes"]:
            print()
            print(render.markdown_changes(item["changes"]))
    if total > len(doc["drift"]):
        print(f"\n… and {total - len(doc['drift'])} more (--limit)")


def run(args: argparse.Namespace) -> int:
    from kilolock import globs
    from kilolock.store import db, summary

    if (args.state is None) == (args.states is None):
        args._parser.error("name one state, or --states GLOB")  # with the usage line, as argparse's own
    with db.open_store() as conn:
        if args.states is None:
            docs = [drift_document(conn, args.state, args.limit)]
        else:
            names = globs.select(args.states, [r["name"] for r in summary.list_states(conn)])
            docs = [drift_document(conn, n, args.limit) for n in names]
    open_drift = sum(d["total"] for d in docs)
    if args.format == "json":
        if args.states is None:
            render.emit_json(docs[0])
        else:
            render.emit_json({"version": 1, "states_glob": args.states, "total": open_drift, "states": docs})
    elif not args.quiet:
        if args.states is not None and not docs:
            print(f"no state matches {args.states!r}")
        for i, doc in enumerate(docs):
            if args.format == "markdown":
                if i:
                    print()
                render_markdown(doc)
            else:
                if args.states is not None and doc["drift"]:
                    print(f"{doc['state']}:")
                render_table(doc)
    return exitcodes.exit_code(detailed=args.detailed_exitcode, open_drift=open_drift)
