"""``kl drift``: the drift records (open ones, or all with --all), for people and tools.

Gathering (``drift_document``, built by ``kilolock.drift.document``) and rendering
(``render_table``, ``render_markdown``) are apart: the renderers take the JSON document, so a field
the document gains reaches every format."""
from __future__ import annotations

import argparse
from typing import Any

from kilolock import drift, globs
from kilolock.cli import args as cli_args
from kilolock.cli import exitcodes, render
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError

EXAMPLE = """examples:
  kl drift prod
  kl drift prod --all                                    # resolved drift too: when and how it ended
  kl drift --states 'team/**' --detailed-exitcode -q     # CI gate: exit 2 when any state has drift
  kl drift prod --format markdown >> "$GITHUB_STEP_SUMMARY"
  kl drift ignore add --states prod --address 'null_resource.*' --reason 'rebuilt nightly'
                                                         # ignore rules: kl drift ignore --help
  kl drift --states ignore                               # a state literally named "ignore\""""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLE
    parser.add_argument("state", nargs="?", type=cli_args.state_name, help="the state (or use --states)")
    parser.add_argument("--states", metavar="GLOB", type=cli_args.state_glob,
                        help="every state whose name matches: * within one /-separated segment, ** across")
    parser.add_argument("--limit", type=cli_args.positive, help="show at most N drifted instances per state")
    parser.add_argument("--all", action="store_true",
                        help="resolved drift too, with when and how it was resolved, and drift an ignore rule hides")
    cli_args.add_format(parser, markdown=True)
    exitcodes.add_gate_arguments(parser, "now")


def drift_document(conn: Any, name: str, limit: int | None, include_resolved: bool = False) -> dict[str, Any]:
    """The drift document of state NAME (kilolock.drift.document), as `--format json` prints it."""
    from kilolock.store import drift as drift_store

    return drift_store.document(conn, name, limit, include_resolved=include_resolved)


def ignored_by(rules: list[dict[str, Any]]) -> str:
    """``ignored by rule 3: reason``, or with rules that combine, ``ignored by rules 3 (reason), 5``."""
    if len(rules) == 1:
        return f"ignored by rule {rules[0]['rule']}" + (f": {rules[0]['reason']}" if rules[0]["reason"] else "")
    return "ignored by rules " + ", ".join(f"{r['rule']}" + (f" ({r['reason']})" if r["reason"] else "") for r in rules)


def _headline(e: dict[str, Any]) -> str:
    first = e["first_detected"]
    since = f"first detected {first.get('version') or 'v' + str(first['serial'])}, {render.when(first['at'])}"
    at = f"{e['kind']} at {e.get('detected_version') or 'v' + str(e['detected_serial'])}"
    if e["ignored_by"] is not None:
        return f"{at} ({since}, open {drift.duration(e['open_for_s'])}), {ignored_by(e['ignored_by']['rules'])}"
    if e["resolved"] is None:
        return f"{at} ({since}, open {drift.duration(e['open_for_s'])})"
    r = e["resolved"]
    return (f"{at} ({since}), resolved at v{r['serial']} by {r['how']}, "
            f"{render.when(r['at'])} (was open {drift.duration(e['open_for_s'])})")


def render_table(doc: dict[str, Any]) -> None:
    items = doc["drift"]
    if not items:
        print(f"{doc['state']}: no drift" if not doc["all"] else f"{doc['state']}: no drift, open or resolved")
    for e in items:
        deposed = f" (deposed {e['deposed']})" if e["deposed"] else ""
        print(f"{e['address']}{deposed}: {_headline(e)}")
        if e["kind"] == "deleted":
            print("  the object no longer exists" if e["resolved"] is None else "  the object was gone")
        for c in e["changes"]:
            print(f"  {c['path']}: {drift.show(c['before'])} → {drift.show(c['after'])}")
    if doc["total"] > len(items):
        print(f"... and {doc['total'] - len(items)} more (--limit)")
    if not doc["all"] and doc["ignored"]:  # hidden, not forgotten
        print(f"({doc['ignored']} more ignored by rules: kl drift {doc['state']} --all)")


def render_markdown(doc: dict[str, Any], heading: str = "###") -> None:
    """For CI step summaries and pull-request comments: one section per state, a table per instance."""
    total = doc["total"]
    what = "drift, open and resolved" if doc["all"] else "Drift"
    print(f"{heading} {what[0].upper() + what[1:]} in `{doc['state']}`: " + (f"{total} instance(s)" if total else "none"))
    for e in doc["drift"]:
        deposed = f" (deposed `{e['deposed']}`)" if e["deposed"] else ""
        print()
        print(f"**`{e['address']}`**{deposed}: {_headline(e)}")
        if e["kind"] == "deleted":
            print("\nThe object no longer exists." if e["resolved"] is None else "\nThe object was gone.")
        if e["changes"]:
            print()
            print(render.markdown_changes(e["changes"]))
    if total > len(doc["drift"]):
        print(f"\n… and {total - len(doc['drift'])} more (--limit)")


def _summary(docs: list[dict[str, Any]], include_resolved: bool, many: bool) -> str:
    """What the documents hold together: drifted instances (open, or all with --all) and, for a
    glob's states (MANY), in how many of them. Counts what exists, not what --limit shows."""
    key = "total" if include_resolved else "open"
    count = sum(d[key] for d in docs)
    what = f"{count} drifted instance(s)" + (f", {sum(d['open'] for d in docs)} open" if include_resolved else " open")
    if many:
        what += f", in {sum(1 for d in docs if d[key])} of {len(docs)} state(s)"
    ignored = sum(d["ignored"] for d in docs)
    # One state's table has just said how many rules hide (render_table): only a glob's sum is new.
    return what + (f" ({ignored} more ignored by rules)" if ignored and many and not include_resolved else "")


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import drift as drift_store
    from kilolock.store import states

    if (args.state is None) == (args.states is None):
        args._parser.error("name one state, or --states GLOB")  # with the usage line, as argparse's own
    with context.open_store() as conn:
        if args.states is None:
            docs = [drift_document(conn, args.state, args.limit, args.all)]
        else:
            ids = states.state_ids(conn)
            names = globs.select(args.states, list(ids))
            if not names:
                # A gate over nothing would pass forever: a mistyped glob must not look like "no drift".
                raise KlError(states.no_state_matches(conn, args.states))
            if args.quiet and args.format != "json":
                # Nothing is printed: the gate needs each state's open count, not its records
                # (at 10,000 states the documents were most of the command's time).
                counts = drift_store.counts_of(conn, [ids[n] for n in names])
                return exitcodes.exit_code(detailed=args.detailed_exitcode,
                                           open_drift=sum(c.open for c in counts.values()))
            docs = drift_store.documents(conn, [(n, ids[n]) for n in names], args.limit, include_resolved=args.all)
    open_drift = sum(d["open"] for d in docs)  # the gate counts open drift, --all or not
    if args.format == "json":
        if args.states is None:
            render.emit_json(docs[0])
        else:
            render.emit_json({"version": 1, "states_glob": args.states, "total": sum(d["total"] for d in docs),
                              "open": open_drift, "states": docs})
    elif not args.quiet:
        if args.format == "markdown" and args.states is not None:
            print(f"## Drift across `{args.states}`: {_summary(docs, args.all, many=True)}")
            print()
        for i, doc in enumerate(docs):
            if args.format == "markdown":
                if i:
                    print()
                render_markdown(doc)
            else:
                if args.states is not None and doc["drift"]:
                    print(f"{doc['state']}:")
                render_table(doc)
        if args.format == "table" and (args.states is not None or docs[0]["total"]):
            print(f"total: {_summary(docs, args.all, many=args.states is not None)}")
    return exitcodes.exit_code(detailed=args.detailed_exitcode, open_drift=open_drift)
