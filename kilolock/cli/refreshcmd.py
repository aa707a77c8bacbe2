"""``kl refresh``: parse flags, build factory + orchestrator, render the result (ADR 0006 layer 4)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from kilolock.cli import args as cli_args
from kilolock.cli import exitcodes, render

if TYPE_CHECKING:
    from kilolock.refresh.options import RefreshOptions
    from kilolock.store.settings import StateSettings

SHOWN_ADDRESSES = 25

EXAMPLE = """examples:
  kl refresh prod
  kl refresh prod --dry-run                             # what would change, attribute by attribute
  kl refresh prod --detailed-exitcode -q                # CI gate: exit 2 when drift is open after the run
  kl refresh prod --dry-run --format markdown >> "$GITHUB_STEP_SUMMARY\""""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLE
    parser.add_argument("state", type=cli_args.state_name, help="the state to refresh")
    parser.add_argument("--dry-run", action="store_true", help="read everything, commit nothing")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failing resource")
    parser.add_argument("--concurrency", type=cli_args.positive, help="provider groups at once (default: CPU count)")
    # The next four override the state's stored settings (kl state set) for this run.
    parser.add_argument("--provider-parallelism", type=cli_args.positive,
                        help="requests in flight per provider process (default: stored, else 10 as Terraform; 1 = serial)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who runs it (default: stored, else $USER@cli)")
    parser.add_argument("--provider-search-path", action="append", metavar="DIR",
                        help="where provider binaries are (repeatable; replaces the stored ones; before $KL_PROVIDER_PATH and the defaults)")
    parser.add_argument("--workdir", type=cli_args.utf8_text, metavar="DIR",
                        help="run providers in DIR, the Terraform configuration's directory ('.' allowed); "
                             "without one (here or stored) no deletion is committed")
    parser.add_argument("--lock-timeout", metavar="DURATION", default="0s",
                        help="wait this long for a lock someone else holds, as Terraform's -lock-timeout (default 0s)")
    # Durations stay text until the run starts (options_from_args): a bad one is reported in
    # parse_duration's words, and kilolock.refresh is not imported for --help.
    parser.add_argument("--timeout", metavar="DURATION", help="cancel after this long: 30s, 5m, 1h, 1d")
    parser.add_argument("--rpc-timeout", metavar="DURATION", default="10m",
                        help="fail a resource whose provider call takes longer than this (default 10m)")
    parser.add_argument("--always-upgrade", action="store_true", help="UpgradeResourceState before every read, as Terraform")
    parser.add_argument("--allow-mass-removal", action="store_true",
                        help="commit even when most of a provider's objects come back deleted")
    cli_args.add_format(parser, markdown=True)
    exitcodes.add_gate_arguments(parser, "after this run's commit; with --dry-run, what this run found")


def options_from_args(args: argparse.Namespace, stored: StateSettings | None = None) -> RefreshOptions:
    """The run's options: each flag given, else the state's stored setting, else kl's default."""
    import os

    from kilolock.durations import parse_duration
    from kilolock.refresh.options import RefreshOptions

    # Relative paths on the command line mean kl's directory; stored ones are absolute already.
    flag_paths = tuple(os.path.abspath(p) for p in args.provider_search_path or ())
    return RefreshOptions(
        dry_run=args.dry_run,
        fail_fast=args.fail_fast,
        concurrency=args.concurrency or os.cpu_count() or 1,
        provider_parallelism=args.provider_parallelism or (stored and stored.provider_parallelism) or 10,
        actor=args.actor or (stored and stored.actor) or cli_args.default_actor(),
        search_paths=flag_paths or (stored and stored.provider_search_paths) or (),
        workdir=os.path.abspath(args.workdir) if args.workdir else (stored.workdir if stored else None),
        lock_timeout=parse_duration(args.lock_timeout, allow_zero=True),
        timeout=parse_duration(args.timeout) if args.timeout else None,
        rpc_timeout=parse_duration(args.rpc_timeout),
        always_upgrade=args.always_upgrade,
        allow_mass_removal=args.allow_mass_removal,
    )


class _Progress:
    """instances done / total per provider, on one rewritten stderr line (TTY only), redrawn at
    most every INTERVAL seconds: thousands of fast reads must not flood a slow terminal."""

    INTERVAL = 0.1

    def __init__(self, clock: Any = None) -> None:
        import time

        self._clock = clock or time.monotonic
        self._state: dict[str, tuple[int, int]] = {}
        self._waited = False
        self._lock = threading.Lock()
        self._drawn_at: float | None = None

    def __call__(self, label: str, done: int, total: int) -> None:
        with self._lock:
            self._state[label] = (done, total)
            now = self._clock()
            if done < total and self._drawn_at is not None and now - self._drawn_at < self.INTERVAL:
                return  # a group's last instance is always drawn
            self._drawn_at = now
            text = "  ".join(f"{k.rsplit('/', 1)[-1]} {d}/{t}" for k, (d, t) in sorted(self._state.items()))
            sys.stderr.write(f"\r\x1b[Krefreshing: {text}")
            sys.stderr.flush()

    def lock_wait(self, holder: dict[str, Any], waited: float, timeout: float) -> None:
        from kilolock.durations import format_duration

        with self._lock:
            self._waited = True
            sys.stderr.write(f"\r\x1b[Kwaiting for the lock held by {holder.get('Who') or 'someone'} "
                             f"({holder.get('Operation') or '?'}, lock ID {holder.get('ID')}): "
                             f"{format_duration(waited)} of {format_duration(timeout)}")
            sys.stderr.flush()

    def end(self) -> None:
        if self._state or self._waited:
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
        "drift": result.drift,
        "failures": [_failure_json(f) for f in result.failures],
        "providers": result.providers,
        "error": result.error,
        "duration_s": result.duration_s,
    }


def _failure_json(f: Any) -> dict[str, Any]:
    if f.address is None:  # a provider group that could not start
        return {"address": None, "provider": f.provider, "addresses": f.addresses, "message": f.message}
    return {"address": f.address, "message": f.message}


def _failure_line(f: Any) -> str:
    if f.address is None:
        return f"{f.message} ({len(f.addresses)} instance(s))"
    return f"{f.address}: {f.message}"


def _committed(result: Any) -> bool:
    return result.to_serial is not None


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
    if result.drift:
        # kl drift shows the rest only of what was committed: a dry run or a refused commit has
        # nothing there, so point at what lists everything.
        where = f"see kl drift {result.state}" if _committed(result) else "--format json lists all"
        print("drift:" if _committed(result) else "drift (not committed):")
        for item in result.drift[:SHOWN_ADDRESSES]:
            deposed = f" (deposed {item['deposed']})" if item["deposed"] else ""
            print(f"  {item['address']}{deposed}: {item['kind']}")
            for c in item["changes"]:
                print(f"    {c['path']}: {show(c['before'])} → {show(c['after'])}")
        more = len(result.drift) - SHOWN_ADDRESSES
        if more > 0:
            print(f"  ... and {more} more ({where})")
    if result.failures:
        print("failures:")
        for f in result.failures[:SHOWN_ADDRESSES]:
            print(f"  {_failure_line(f)}")
        more = len(result.failures) - SHOWN_ADDRESSES
        if more > 0:
            print(f"  ... and {more} more (--format json lists all)")


def show(value: Any) -> str:
    from kilolock.drift import show as show_value

    return show_value(value)


def render_markdown(result: Any) -> None:
    """For CI step summaries and pull-request comments."""
    to = f"v{result.to_serial}" if _committed(result) else ("dry run, nothing committed" if result.dry_run
                                                            else "nothing committed")
    print(f"### Refresh of `{result.state}`: {result.status} (v{result.from_serial} → {to})")
    print()
    print(f"{result.checked} checked, {result.changed} changed, {result.failed} failed, in {result.duration_s:.2f}s.")
    if result.error:
        print(f"\n**Error:** {result.error}")
    for item in result.drift:
        deposed = f" (deposed `{item['deposed']}`)" if item["deposed"] else ""
        print(f"\n**`{item['address']}`**{deposed}: {item['kind']}")
        if item["kind"] == "deleted":
            print("\nThe object no longer exists.")
        if item["changes"]:
            print()
            print(render.markdown_changes(item["changes"]))
    if result.failures:
        print("\n**Failures:**\n")
        for f in result.failures:
            print(f"- {_failure_line(f)}")


def open_drift_after(result: Any, conn: Any) -> int:
    """What --detailed-exitcode gates on: open drift after this run's commit; for a dry run,
    what this run found; for a run that committed nothing, the drift already open."""
    if result.dry_run:
        return len(result.drift)
    from kilolock.store import drift as drift_store

    return drift_store.count_drift(conn, result.state)


def run(args: argparse.Namespace) -> int:
    from kilolock.refresh.factory import ProductionFactory
    from kilolock.refresh.orchestrator import Cancellation
    from kilolock.refresh.orchestrator import run as run_refresh
    from kilolock.store import db, settings, versions

    options_from_args(args)  # flag errors (a bad duration) before the database is opened
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
            options = options_from_args(args, settings.get(conn, sid))
            factory = ProductionFactory(conn, sid, options.search_paths, rpc_timeout=options.rpc_timeout,
                                        workdir=options.workdir)
            result = run_refresh(conn, args.state, factory, options, progress=progress, cancel=cancel,
                                 on_lock_wait=progress.lock_wait if progress else None)
            if factory.unavailable is not None:
                raise factory.unavailable  # grpc cannot load here: one line about that, not a provider failure
            open_drift = open_drift_after(result, conn) if args.detailed_exitcode and result.status == "succeeded" else 0
        if progress:
            progress.end()
            progress = None
        if args.format == "json":
            render.emit_json(result_json(result))
        elif args.quiet:
            pass
        elif args.format == "markdown":
            render_markdown(result)
        else:
            render_table(result)
    finally:
        if progress:
            progress.end()
        for s, h in previous.items():
            signal.signal(s, h)
    if result.status == "succeeded":
        return exitcodes.exit_code(detailed=args.detailed_exitcode, open_drift=open_drift)
    print(f"kl: refresh {result.status}: {result.error or 'see the output above'}", file=sys.stderr)
    return exitcodes.exit_code(detailed=args.detailed_exitcode, error=True, code=130 if interrupted["sigint"] else 1)
