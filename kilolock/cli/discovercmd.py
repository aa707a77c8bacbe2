"""``kl discover SOURCE --type TYPE``: the objects a provider lists of a type, each matched against
every state's open instances (managed, unmanaged, managed twice); ``kl discover --results``: what
the recorded runs found."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kilolock import jsondoc
from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError, UsageError

if TYPE_CHECKING:
    from kilolock.store.discovery_results import RunRow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", type=cli_args.utf8_text,
                        help="the provider: NAMESPACE/TYPE or HOST/NAMESPACE/TYPE (with --results: only its runs)")
    parser.add_argument("--type", dest="type_", metavar="TYPE", type=cli_args.utf8_text,
                        help="the resource type to list, e.g. aws_s3_bucket")
    parser.add_argument("--list-config", metavar="JSON", type=cli_args.utf8_text, default="{}",
                        help="the list block's own configuration, a JSON object (default: {})")
    parser.add_argument("--state", type=cli_args.state_name,
                        help="configure the provider as this state's refresh does (default: as `kl provider configure` stores it for all states)")
    parser.add_argument("--alias", type=cli_args.utf8_text, default="", help="the provider configuration's alias (default: none)")
    parser.add_argument("--limit", type=cli_args.positive, metavar="N", help="ask the provider for at most N objects")
    parser.add_argument("--provider-search-path", action="append", metavar="DIR",
                        help="look for provider binaries here first (repeatable)")
    parser.add_argument("--rpc-timeout", type=cli_args.duration, metavar="DURATION",
                        help="how long the provider may take to answer one call (default: no limit)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="recorded as who ran the discovery (default: $USER@host)")
    parser.add_argument("--results", action="store_true",
                        help="show what the latest recorded run found (of SOURCE and --type when given) instead of listing")
    parser.add_argument("--run", metavar="ID", type=_run_id, help="show what this run found (implies --results)")
    cli_args.add_format(parser)


def _run_id(text: str) -> str:
    import uuid

    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a run id (kl discover --results --format json shows one)") from None


def _list_config(text: str) -> dict[str, Any]:
    try:
        config = jsondoc.load(text.encode())
    except jsondoc.NotStorable as exc:
        raise UsageError(f"--list-config: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError("--list-config must be a JSON object (the list block's attributes)")
    return config


def run(args: argparse.Namespace, context: CommandContext) -> int:
    if args.results or args.run:
        return _results(args, context)
    from kilolock.cli.providercmd import normalize_source
    from kilolock.store import discovery_results
    from kilolock.store.discovery_runs import Scope
    from kilolock.unmanaged import service

    if not args.source or not args.type_:
        raise UsageError("kl discover needs SOURCE and --type TYPE (or --results)")
    scope = Scope(normalize_source(args.source), args.alias, args.state, args.type_, _list_config(args.list_config))
    req = service.Request(scope, limit=args.limit, actor=args.actor or cli_args.default_actor(),
                          search_paths=tuple(os.path.abspath(p) for p in args.provider_search_path or ()),
                          rpc_timeout=args.rpc_timeout)
    with context.open_store() as conn:
        with _terminate_as_interrupt():
            outcome = service.discover(conn, req)
        row = _run_row(conn, outcome.run_id)
        objects = discovery_results.objects(conn, outcome.run_id)
    _show(args, row, objects)
    return 0


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (systemd, docker stop, a CI timeout) ends the run as Ctrl-C does, and is said as
    SIGTERM: the listing is cancelled, the provider ended, the run recorded as cancelled (exit 143)."""
    import signal

    from kilolock.unmanaged.service import Terminated

    raised = False

    def on_term(_signum: int, _frame: Any) -> None:
        nonlocal raised
        if not raised:  # once: a second one must not interrupt the recording of the first
            raised = True
            raise Terminated

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_row(conn: Any, run_id: str) -> RunRow:
    from kilolock.store import discovery_results

    row = discovery_results.get(conn, run_id)
    if row is None:
        raise KlError(f"no discovery run {run_id} (kl discover --results lists the latest)")
    return row


def _results(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.cli.providercmd import normalize_source
    from kilolock.store import discovery_results

    source = normalize_source(args.source) if args.source else None
    with context.open_store() as conn:
        if args.run:
            row = _run_row(conn, args.run)
        else:
            rows = discovery_results.latest(conn, source, args.type_, limit=1)
            if not rows:
                what = " of " + " ".join(x for x in (source, args.type_) if x) if source or args.type_ else ""
                raise KlError(f"no discovery run{what} is recorded (kl discover SOURCE --type TYPE runs one)")
            row = rows[0]
        objects = discovery_results.objects(conn, row.id)
    _show(args, row, objects)
    return 0


def _claimed_by(claims: list[dict[str, str]]) -> str:
    # A claim by the id attribute alone is weaker evidence: said.
    return ", ".join(f"{c['state']}:{c['address']}" + (f" (deposed {c['deposed']})" if c.get("deposed") else "")
                     + (" (by id)" if c.get("evidence") == "id" else "") for c in claims) or "-"


def _show(args: argparse.Namespace, row: RunRow, objects: list[Any]) -> None:
    if args.format == "json":
        render.emit_json({"version": 1, "run": {
            "id": row.id, "source": row.source, "alias": row.alias or None, "state": row.state, "type": row.type,
            "list_config": row.list_config, "limit": row.list_limit, "status": row.status, "started_at": row.started_at,
            "finished_at": row.finished_at, "error": row.error, "actor": row.actor,
            "counts": {"listed": row.listed, "managed": row.managed, "unmanaged": row.unmanaged,
                       "managed_twice": row.managed_twice, "new_unmanaged": row.new_unmanaged}},
            "objects": [{"identity": o.identity, "display_name": o.display_name, "match": o.match, "claims": o.claims,
                         "new": o.is_new} for o in objects]})
        return
    if objects:
        render.table(["match", "object", "identity", "claimed by"],
                     [(o.match + (" (new)" if o.is_new else ""), o.display_name or "-",
                       json.dumps(o.identity, sort_keys=True, ensure_ascii=False), _claimed_by(o.claims)) for o in objects])
    status = "" if row.status == "succeeded" else f" ({row.status}: {row.error})"
    print(f"{row.source} {row.type}: {row.listed or 0} listed: {row.managed or 0} managed, {row.unmanaged or 0} unmanaged "
          f"({row.new_unmanaged or 0} new), {row.managed_twice or 0} managed twice{status} [run {row.id}]")
