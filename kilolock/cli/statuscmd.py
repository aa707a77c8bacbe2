"""``kl status``: one state at a glance."""
from __future__ import annotations

import argparse
from typing import Any

from kilolock.cli import args as cli_args
from kilolock.cli import render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name)
    cli_args.add_format(parser)


def run(args: argparse.Namespace) -> int:
    from kilolock.drift import duration
    from kilolock.store import db, summary

    with db.open_store() as conn:
        s = summary.state_status(conn, args.name)
    oldest = s.pop("open_drift_oldest_for")
    if args.format == "json":
        render.emit_json({"version": 1, **s, "open_drift_oldest_s": None if oldest is None else int(oldest.total_seconds())})
        return 0
    last: Any = "never"
    if s["last_refresh"]:
        r = s["last_refresh"]
        to = f"v{r['to_serial']}" if r["to_serial"] is not None else "(nothing committed)"
        last = f"v{r['from_serial']} → {to}, {r['status']}, {r['started_at']:%Y-%m-%d %H:%M:%S}"
    render.key_values(
        [
            ("state", s["state"]),
            ("serial", f"v{s['serial']}" if s["serial"] is not None else "-"),
            ("lineage", s["lineage"]),
            ("terraform", s["terraform_version"]),
            ("versions", s["versions"]),
            ("managed", s["managed"]),
            ("data", s["data"]),
            ("last refresh", last),
            ("open drift", s["open_drift"] if oldest is None else
             f"{s['open_drift']} (oldest first detected v{s['open_drift_first_serial']}, open {duration(oldest.total_seconds())})"),
            ("locked", s["locked_by"] or "no"),
        ]
    )
    return 0
