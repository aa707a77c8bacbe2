"""``kl resources``: every open instance across the fleet, or the objects claimed twice
(``--duplicates``), as a table, stable JSON or CSV."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kilolock import globs
from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--states", metavar="GLOB", type=cli_args.state_glob, default="**",
                        help="the states to list (default: every state)")
    parser.add_argument("--type", metavar="GLOB", type=cli_args.type_glob, help="resource types, e.g. aws_s3_* ")
    parser.add_argument("--provider", metavar="SOURCE", type=cli_args.provider_source,
                        help="a provider: HOST/NAMESPACE/TYPE, NAMESPACE/TYPE or TYPE (hashicorp's)")
    parser.add_argument("--address", metavar="GLOB", type=cli_args.address_glob, help="addresses, e.g. module.net.**")
    parser.add_argument("--where", metavar="PATH=VALUE", action="append", type=cli_args.where, default=[],
                        help='an attribute\'s value, e.g. tags.env=prod or port=80 (repeatable: all must match)')
    parser.add_argument("--drifted", action="store_true", help="only instances with open drift")
    parser.add_argument("--duplicates", action="store_true",
                        help="objects claimed by more than one instance (certain: one identity; likely: one id)")
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table",
                        help="output: table, json or csv (default table; json and csv are stable for tools)")


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import inventory, states, summary, ui_queries

    if args.duplicates and (args.type or args.provider or args.address or args.where or args.drifted):
        args._parser.error("--duplicates takes --states only")  # with the usage line, as argparse's own
    with context.open_store() as conn:
        all_names = [r["name"] for r in summary.list_states(conn)]
        names = globs.select(args.states, all_names)
        if not names and args.states != "**":
            raise KlError(states.no_state_matches(conn, args.states))
        ids = None if len(names) == len(all_names) else ui_queries.state_ids(conn, names)
        if args.duplicates:
            return _show_duplicates(inventory.duplicates(conn, ids), args.format)
        # Streamed: printed as the server-side cursor yields them, within the store's connection.
        rows = inventory.stream_instances(conn, inventory.filters(conn, ids, args.type, args.provider, args.address,
                                                                  args.where, args.drifted))
        _show(rows, args.format)
    return 0


def _cell(v: Any) -> str:

    return "" if v is None else json.dumps(v, sort_keys=True, separators=(",", ":")) if isinstance(v, (dict, list)) else str(v)


def _show(rows: Iterable[Mapping[str, Any]], fmt: str) -> None:
    from kilolock.store.inventory import COLUMNS

    if fmt == "json":
        render.emit_json_list({k: r[k] for k in COLUMNS} for r in rows)
    elif fmt == "csv":
        import csv

        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(COLUMNS)
        for r in rows:
            out.writerow([_cell(r[k]) for k in COLUMNS])
    else:
        # Aligned columns need every row's width first: the table keeps its cells (not the rows).
        cells = [[r["state"], r["address"] + (f" (deposed {r['deposed']})" if r["deposed"] else ""), r["type"],
                  r["provider"] + (f".{r['provider_alias']}" if r["provider_alias"] else ""),
                  _cell(r["identity"]) if r["evidence"] == "identity" else r["id"], r["status"], r["drift"]]
                 for r in rows]
        render.table(["state", "address", "type", "provider", "identity / id", "status", "drift"], cells)
        print(f"{len(cells)} instance(s)")


def _show_duplicates(groups: Sequence[Mapping[str, Any]], fmt: str) -> int:
    if fmt == "json":
        render.emit_json(groups)
    elif fmt == "csv":
        import csv

        out = csv.writer(sys.stdout, lineterminator="\n")
        out.writerow(("confidence", "evidence", "provider", "type", "key", "state", "address", "deposed", "id", "identity"))
        for g in groups:
            for c in g["claims"]:
                out.writerow((g["confidence"], g["evidence"], g["provider"], g["type"], g["key"], c["state"], c["address"],
                              c["deposed"] or "", c["id"] or "", _cell(c["identity"])))
    else:
        for g in groups:
            what = _cell(g["claims"][0]["identity"]) if g["evidence"] == "identity" else f"id {g['key']}"
            print(f"{g['confidence']}: {g['type']} {what} ({g['provider']}), claimed {len(g['claims'])} times:")
            for c in g["claims"]:
                print(f"  {c['state']}  {c['address']}" + (f" (deposed {c['deposed']})" if c["deposed"] else ""))
        print(f"{len(groups)} object(s) claimed more than once")
    return 0
