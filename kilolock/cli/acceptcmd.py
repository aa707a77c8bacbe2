"""``kl drift accept STATE``: the latest observation, whole or the objects named, as Terraform's next
version (kilolock.refresh.accept). kl routes ``kl drift accept ...`` here before ``kl drift STATE``
parses (kilolock.cli.main), as it does ``kl drift ignore``."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.durations import parse_duration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=cli_args.state_name, help="the state")
    parser.add_argument("--address", metavar="GLOB", action="append", type=cli_args.address_glob,
                        help="accept only the objects whose address matches (repeatable; * within one .-separated "
                             "segment, ** across); default: everything the observation found different")
    parser.add_argument("--dry-run", action="store_true", help="say what would be accepted; write nothing")
    parser.add_argument("--lock-timeout", metavar="DURATION", default="0s",
                        help="wait this long for a lock someone else holds, as Terraform's -lock-timeout (default 0s)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who accepts it (default: $USER@cli)")
    cli_args.add_format(parser)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.refresh import accept

    lock_timeout = parse_duration(args.lock_timeout, allow_zero=True)
    with context.open_store() as conn:
        accepting = accept.plan(conn, args.name, args.address or ())
        written = None if args.dry_run else accept.accept(conn, accepting, args.actor or cli_args.default_actor(),
                                                           lock_timeout=lock_timeout)
    hidden = [d for d in accepting.accepted if d.ignored]
    if args.format == "json":
        render.emit_json({"version": 1, "state": args.name, "dry_run": args.dry_run,
                          "observation": accepting.observation.label, "base_serial": accepting.base.serial,
                          "to_serial": written.serial if written else None,
                          "accepted": [_difference_json(d) for d in accepting.accepted]})
        return 0
    what = accepting.observation.label
    if not accepting.writes:
        print(f"{args.name}: {what} found nothing different from v{accepting.base.serial}; nothing to accept")
        return 0
    if accepting.metadata_only:
        head = f"would accept {what} as v{accepting.to_serial}" if args.dry_run else f"accepted {what} as v{written.serial if written else accepting.to_serial}"
        print(f"{args.name}: {head}: no object differs; what differs is not drift (legacy provider addresses in their "
              "modern form, flatmap objects in their structured form, sensitivity marks or private data)")
        return 0
    head = (f"would accept {what} as v{accepting.to_serial}" if args.dry_run
            else f"accepted {what} as v{written.serial if written else accepting.to_serial}")
    print(f"{args.name}: {head}: {len(accepting.accepted)} object(s); Terraform reads it on its next plan or apply")
    for d in accepting.accepted:
        print(f"  {accept.describe(d)}")
    if hidden and args.dry_run:
        print(f"ignore rules hide the drift of {len(hidden)} of them: accepted as observed all the same (the rules "
              "hide drift from reports, not from Terraform's state)", file=sys.stderr)
    return 0


def _difference_json(d: Any) -> dict[str, Any]:
    return {"address": d.address, "deposed": d.deposed or None, "kind": "deleted" if d.gone else "changed",
            "ignored": d.ignored}
