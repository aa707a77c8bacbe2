"""``kl refresh``: parse flags, build factory + orchestrator, render the result (ADR 0006 layer 4)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from kilolock.cli import render
from kilolock.cli.statecmd import default_actor
from kilolock.refresh.options import RefreshOptions, parse_duration

SHOWN_ADDRESSES = 25


def options_from_args(args: argparse.Namespace) -> RefreshOptions:
    import os

    return RefreshOptions(
        dry_run=args.dry_run,
        fail_fast=args.fail_fast,
        concurrency=args.concurrency or os.cpu_count() or 1,
        provider_parallelism=args.provider_parallelism,
        actor=args.actor or default_actor(),
        search_paths=tuple(args.provider_search_path or ()),
        timeout=parse_duration(args.timeout) if args.timeout else None,
        rpc_timeout=parse_duration(args.rpc_timeout),
        always_upgrade=args.always_upgrade,
        allow_mass_removal=args.allow_mass_removal,
    )


class _Progress:
    """instances done / total per provider, on one rewritten stderr line (TTY only)."""

    def __init__(self) -> None:
        self._state: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str, done: int, total: int) -> None:
        with self._lock:
            self._state[label] = (done, total)
            text = "  ".join(f"{k.rsplit('/', 1)[-1]} {d}/{t}" for k, (d, t) in sorted(self._state.items()))
            sys.stderr.write(f"\r\x1b[Krefreshing: {text}")
            sys.stderr.flush()

    def end(self) -> None:
        if self._state:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def result_json(result: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "state": result.state,
        "run_id": result.run_id,
        "status": result.status,
        "dry_run": result.dry_run,
        "from_serial": result.from_serial,
        "to_serial": result.to_serial,
        "resources_checked": result.checked,
        "resources_changed": result.changed,
        "resources_failed": result.failed,
        "changed_addresses": result.changed_addresses,
        "failures": [{"address": f.address, "message": f.message} for f in result.failures],
        "providers": result.providers,
        "error": result.error,
        "duration_s": result.duration_s,
    }


def render_table(result: Any) -> None:
    to = f"v{result.to_serial}" if result.to_serial is not None else ("(dry run)" if result.dry_run and result.status == "succeeded" else "(not committed)")
    render.key_values(
        [
            ("state", result.state),
            ("run id", result.run_id),
            ("status", result.status),
            ("serial", f"v{result.from_serial} → {to}"),
            ("checked", result.checked),
            ("changed", result.changed),
            ("failed", result.failed),
            ("duration", f"{result.duration_s:.2f}s"),
        ]
    )
    for p in result.providers:
        print(f"provider: {p}")
    if result.error:
        print(f"error:    {result.error}")
    if result.changed_addresses:
        print("drift addresses:")
        for addr in result.changed_addresses[:SHOWN_ADDRESSES]:
            print(f"  {addr}")
        more = len(result.changed_addresses) - SHOWN_ADDRESSES
        if more > 0:
            print(f"  ... and {more} more (see kl drift {result.state})")
    if result.failures:
        print("failures:")
        for f in result.failures[:SHOWN_ADDRESSES]:
            print(f"  {f.address}: {f.message}")
        more = len(result.failures) - SHOWN_ADDRESSES
        if more > 0:
            print(f"  ... and {more} more (--format json lists all)")


def cmd_refresh(args: argparse.Namespace) -> int:
    from kilolock.refresh.factory import ProductionFactory
    from kilolock.refresh.orchestrator import Cancellation, run
    from kilolock.store import db, versions

    options = options_from_args(args)
    cancel = Cancellation()
    interrupted = {"sigint": False}

    def on_signal(signum: int, _frame: Any) -> None:
        # Cancel rather than raise: the orchestrator stops every provider, closes them, and
        # finishes the audit row as cancelled.
        if signum == signal.SIGINT:
            interrupted["sigint"] = True
        cancel.cancel("interrupted (SIGINT)" if signum == signal.SIGINT else "terminated (SIGTERM)")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    progress = _Progress() if sys.stderr.isatty() else None
    # The handlers stay until the result is printed: a signal after the commit must not kill kl
    # before it says what it committed.
    try:
        with db.open_store() as conn:
            sid = versions.state_id(conn, args.state)
            factory = ProductionFactory(conn, sid, options.search_paths, rpc_timeout=options.rpc_timeout)
            result = run(conn, args.state, factory, options, progress=progress, cancel=cancel)
        if progress:
            progress.end()
            progress = None
        if args.format == "json":
            render.emit_json(result_json(result))
        else:
            render_table(result)
    finally:
        if progress:
            progress.end()
        for s, h in previous.items():
            signal.signal(s, h)
    if result.status == "succeeded":
        return 0
    print(f"kl: refresh {result.status}: {result.error or 'see the output above'}", file=sys.stderr)
    return 130 if interrupted["sigint"] else 1
