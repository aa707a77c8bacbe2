"""``kl refresh``: parse the flags, run the refresh service (kilolock.refresh.service), render its result."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kilolock import gcpolicy  # the standard library's gc alone: no cost to import here
from kilolock.cli import args as cli_args
from kilolock.cli import exitcodes, render
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError, UsageError

if TYPE_CHECKING:
    import psycopg
    from typing_extensions import Self  # typing.Self needs 3.11

    from kilolock.redact import Redactor
    from kilolock.refresh.options import RefreshOverrides
    from kilolock.refresh.orchestrator import Cancellation
    from kilolock.refresh.prelaunch import Prelaunched
    from kilolock.refresh.result import Failure, Result

SHOWN_ADDRESSES = 25

EXAMPLE = """examples:
  kl refresh prod
  kl refresh prod --dry-run                             # what would change, attribute by attribute
  kl refresh prod --detailed-exitcode -q                # CI gate: exit 2 when drift is open after the run
  kl refresh prod --dry-run --format markdown >> "$GITHUB_STEP_SUMMARY"
  kl refresh --all --states 'team/**' --parallel-states 4   # many states, each with its stored settings\""""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLE
    parser.add_argument("state", nargs="?", type=cli_args.state_name, help="the state to refresh (or --all)")
    parser.add_argument("--dry-run", action="store_true", help="read everything, record nothing")
    parser.add_argument("--commit", action="store_true",
                        help="write what was read as Terraform's next version (serial+1, under the state lock), "
                             "not only as an observation; for states nothing but kl refreshes")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failing resource")
    parser.add_argument("--concurrency", type=cli_args.positive, help="provider groups at once (default: CPU count)")
    # The next four override the state's stored settings (kl state set) for this run.
    parser.add_argument("--provider-parallelism", type=cli_args.parallelism, metavar="auto|N",
                        help="requests in flight per provider process: auto adapts to the provider's latency and "
                             "throttling from 10 up; N fixes it (1 = serial) (default: stored, else auto)")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who runs it (default: stored, else $USER@cli)")
    parser.add_argument("--provider-search-path", action="append", metavar="DIR",
                        help="where provider binaries are (repeatable; replaces the stored ones; before $KL_PROVIDER_PATH and the defaults)")
    parser.add_argument("--workdir", type=cli_args.utf8_text, metavar="DIR",
                        help="run providers in DIR, the Terraform configuration's directory ('.' allowed); "
                             "without one (here or stored) no deletion is committed")
    parser.add_argument("--lock-timeout", metavar="DURATION", default="0s",
                        help="wait this long for a lock someone else holds, as Terraform's -lock-timeout (default 0s)")
    # Durations stay text until the run starts (overrides_from_args): a bad one is reported in
    # parse_duration's words, and kilolock.refresh is not imported for --help.
    parser.add_argument("--timeout", metavar="DURATION", help="cancel after this long: 30s, 5m, 1h, 1d")
    parser.add_argument("--rpc-timeout", metavar="DURATION", default="10m",
                        help="fail a resource whose provider call takes longer than this (default 10m)")
    parser.add_argument("--always-upgrade", action="store_true", help="UpgradeResourceState before every read, as Terraform")
    parser.add_argument("--allow-mass-removal", action="store_true",
                        help="commit even when most of a provider's objects come back deleted")
    cli_args.add_format(parser, markdown=True)
    exitcodes.add_gate_arguments(parser, "after this run's commit; with --dry-run, what this run found")
    parser.add_argument("--all", action="store_true",
                        help="refresh every state (or those --states matches), each as `kl refresh STATE` with its stored settings")
    parser.add_argument("--states", type=cli_args.state_glob, metavar="GLOB",
                        help="with --all: only the states this glob matches (* within a /-segment, ** across)")
    parser.add_argument("--parallel-states", type=cli_args.positive, metavar="N",
                        help="with --all: states refreshed at once (default 1)")


def overrides_from_args(args: argparse.Namespace) -> RefreshOverrides:
    """What the flags tell the run, over the state's stored settings (RefreshOptions.resolve)."""
    from kilolock.durations import parse_duration
    from kilolock.refresh.options import RefreshOverrides

    # Relative paths on the command line mean kl's directory; stored ones are absolute already.
    return RefreshOverrides(
        dry_run=args.dry_run,
        commit=args.commit,
        fail_fast=args.fail_fast,
        concurrency=args.concurrency,
        provider_parallelism=args.provider_parallelism,
        actor=args.actor,
        search_paths=tuple(os.path.abspath(p) for p in args.provider_search_path or ()),
        workdir=os.path.abspath(args.workdir) if args.workdir else None,
        lock_timeout=parse_duration(args.lock_timeout, allow_zero=True),
        timeout=parse_duration(args.timeout) if args.timeout else None,
        rpc_timeout=parse_duration(args.rpc_timeout),
        always_upgrade=args.always_upgrade,
        allow_mass_removal=args.allow_mass_removal,
        default_actor=cli_args.default_actor(),
    )


class _Progress:
    """instances done / total per provider, on one rewritten stderr line (TTY only), redrawn at
    most every INTERVAL seconds: thousands of fast reads must not flood a slow terminal."""

    INTERVAL = 0.1

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
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


def result_json(result: Result, counts: tuple[int, int] | None = None) -> dict[str, Any]:
    """``counts``: (open, ignored) from drift_counts, None when the run did not succeed."""
    return {
        "version": 1,
        "state": result.state,
        "run_id": result.run_id,
        "status": result.status,
        "dry_run": result.dry_run,
        "from_serial": result.from_serial,
        "to_serial": result.to_serial,
        "observation": result.observation,
        "base_moved": result.base_moved,
        "base_locked": result.base_locked,
        "resources_checked": result.checked,
        "resources_changed": result.changed,
        "resources_failed": result.failed,
        "changed_addresses": result.changed_addresses,
        "drift": result.drift,
        "open": counts[0] if counts else None,
        "ignored": counts[1] if counts else None,
        "failures": [_failure_json(f) for f in result.failures],
        "providers": result.providers,
        "concurrency": result.concurrency,
        "provider_addresses": [{"from": old, "to": new} for old, new in result.provider_addresses.items()],
        "upgraded_from_flatmap": result.reshaped,
        "error": result.error,
        "duration_s": result.duration_s,
    }


def concurrency_text(c: dict[str, Any]) -> str:
    """One provider group's requests in flight, in words, as `kl refresh` shows them."""
    label = c["provider"].rsplit("/", 1)[-1] + (f".{c['alias']}" if c.get("alias") else "")
    if c["mode"] == "fixed":
        text = f"requests in flight to {label}: fixed at {c['final']}"
    else:
        text = (f"requests in flight to {label}: adaptive, started at {c['start']}, reached {c['max']}, "
                f"ended at {c['final']}")
    return text + (f"; {c['throttled']} throttled (retried)" if c.get("throttled") else "")


def _failure_json(f: Any) -> dict[str, Any]:
    if f.address is None:  # a provider group that could not start
        return {"address": None, "provider": f.provider, "addresses": f.addresses, "message": f.message}
    return {"address": f.address, "message": f.message}


def _failure_line(f: Failure) -> str:
    if f.address is None:
        return f"{f.message} ({len(f.addresses)} instance(s))"
    return f"{f.address}: {f.message}"


def _committed(result: Result) -> bool:
    """Whether the run recorded what it read: an observation, or with --commit a Terraform version."""
    return result.to_serial is not None or result.observation is not None


def _serial_text(result: Result) -> str:
    if result.to_serial is not None:
        return f"v{result.from_serial} → v{result.to_serial}"
    if result.observation is not None:
        moved = "; Terraform wrote a newer version meanwhile, so it opens no drift" if result.base_moved else ""
        if result.base_locked:
            moved = "; the state was locked for a change meanwhile (an apply?), so it opens no drift"
        return f"v{result.from_serial} (Terraform's, unchanged), observed as {result.observation}{moved}"
    return f"v{result.from_serial} → " + ("(dry run)" if result.dry_run and result.status == "succeeded" else "(not committed)")


def _item_status(item: dict[str, Any]) -> str:
    if item["status"] == "ignored":
        from kilolock.cli.driftcmd import ignored_by

        return ", " + ignored_by(item["ignored_by"]["rules"])
    if item["status"] == "resolved":
        return ", back to what the last apply or import wrote (resolves its drift)"
    return ""


def _counts_line(result: Result, counts: tuple[int, int] | None) -> str | None:
    if counts is None or not (result.drift or counts[0] or counts[1]):
        return None
    open_count, ignored = counts
    rest = f" ({ignored} more ignored by rules)" if ignored else ""
    if result.dry_run:
        return f"open drift found: {open_count}{rest} (nothing committed)"
    return f"open drift now: {open_count}{rest} (kl drift {result.state}{' --all' if ignored else ''})"


def render_table(result: Result, counts: tuple[int, int] | None = None) -> None:
    render.key_values(
        [
            ("state", result.state),
            ("run id", result.run_id),
            ("status", result.status),
            ("serial", _serial_text(result)),
            ("checked", result.checked),
            ("changed", result.changed),
            ("failed", result.failed),
            ("duration", f"{result.duration_s:.2f}s"),
        ]
    )
    for p in result.providers:
        print(f"provider: {p}")
    for c in result.concurrency:
        print(concurrency_text(c))
    for upgrade in _upgrade_lines(result):
        print(upgrade)
    if result.error:
        print(f"error:    {result.error}")
    if result.drift:
        # kl drift shows the rest only of what was committed: a dry run or a refused commit has
        # nothing there, so point at what lists everything.
        where = f"see kl drift {result.state}" if _committed(result) else "--format json lists all"
        print("drift:" if _committed(result) else "drift (not committed):")
        for item in result.drift[:SHOWN_ADDRESSES]:
            deposed = f" (deposed {item['deposed']})" if item["deposed"] else ""
            print(f"  {item['address']}{deposed}: {item['kind']}{_item_status(item)}")
            for c in item["changes"]:
                print(f"    {c['path']}: {show(c['before'])} → {show(c['after'])}")
        more = len(result.drift) - SHOWN_ADDRESSES
        if more > 0:
            print(f"  ... and {more} more ({where})")
    line = _counts_line(result, counts)
    if line:
        print(line)
    if result.failures:
        print("failures:")
        for f in result.failures[:SHOWN_ADDRESSES]:
            print(f"  {_failure_line(f)}")
        more = len(result.failures) - SHOWN_ADDRESSES
        if more > 0:
            print(f"  ... and {more} more (--format json lists all)")


def _upgrade_lines(result: Result) -> list[str]:
    """What the commit writes in the modern form, as Terraform 0.13+ does (not drift)."""
    how = "written" if result.to_serial is not None else "to be written when accepted"
    lines = [f"provider address: {old} → {new} ({how})" for old, new in result.provider_addresses.items()]
    if result.reshaped:
        lines.append(f"flatmap: {len(result.reshaped)} instance(s) upgraded by their provider from attributes_flat to "
                     f"attributes ({how}; not drift), first: {result.reshaped[0]}")
    return lines


def show(value: Any) -> str:
    from kilolock.drift import show as show_value

    return show_value(value)


def render_markdown(result: Result, counts: tuple[int, int] | None = None) -> None:
    """For CI step summaries and pull-request comments."""
    what = (f"v{result.from_serial} → v{result.to_serial}" if result.to_serial is not None
            else f"v{result.from_serial}, observed as {result.observation}" if result.observation is not None
            else f"v{result.from_serial}, " + ("dry run, nothing recorded" if result.dry_run else "nothing recorded"))
    print(f"### Refresh of `{result.state}`: {result.status} ({what})")
    print()
    print(f"{result.checked} checked, {result.changed} changed, {result.failed} failed, in {result.duration_s:.2f}s.")
    if result.error:
        print(f"\n**Error:** {result.error}")
    upgrades = _upgrade_lines(result)
    if upgrades:
        print()
        for upgrade in upgrades:
            print(f"- {upgrade}")
    for item in result.drift:
        deposed = f" (deposed `{item['deposed']}`)" if item["deposed"] else ""
        print(f"\n**`{item['address']}`**{deposed}: {item['kind']}{_item_status(item)}")
        if item["kind"] == "deleted":
            print("\nThe object no longer exists.")
        if item["changes"]:
            print()
            print(render.markdown_changes(item["changes"]))
    line = _counts_line(result, counts)
    if line:
        print(f"\n{line[0].upper()}{line[1:]}.")
    if result.failures:
        print("\n**Failures:**\n")
        for f in result.failures:
            print(f"- {_failure_line(f)}")


def counts_used(args: argparse.Namespace) -> bool:
    """Whether the open/ignored drift counts are shown or gated on: -q (table or markdown) without
    --detailed-exitcode uses neither, and spares a small refresh their two queries."""
    return bool(args.format == "json" or not args.quiet or args.detailed_exitcode)


def drift_counts(result: Result, conn: psycopg.Connection) -> tuple[int, int]:
    """(open, ignored), after ignore rules: what --detailed-exitcode gates on (open). After this
    run's commit (or, when it committed nothing, now), kl drift's own counts; for a dry run, what
    this run found, as the drift records would count it once committed."""
    if result.dry_run:
        return (sum(1 for d in result.drift if d["status"] == "open"),
                sum(1 for d in result.drift if d["status"] == "ignored"))
    from kilolock.store import drift as drift_store

    found = drift_store.counts(conn, result.state)  # one statement: one snapshot, as kl drift reads it
    return found.open, found.ignored


class _Interrupts:
    """While the block runs, SIGINT and SIGTERM cancel the refresh rather than raise: the
    orchestrator stops every provider, shuts down those still busy after a short grace, and
    finishes the audit row as cancelled. A second signal (or one after a --timeout or fail-fast
    cancel) kills the providers at once. ``code`` is the exit code of a cancelled run: 128 + the
    first signal's number (130 for Ctrl-C, 143 for SIGTERM), else 1."""

    def __init__(self, cancel: Cancellation) -> None:
        self._cancel = cancel
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def code(self) -> int:
        return 128 + self.signum if self.signum is not None else 1

    def _on_signal(self, signum: int, _frame: Any) -> None:
        again = self._cancel.cancelled
        if self.signum is None:
            self.signum = signum
        self._cancel.cancel("interrupted (SIGINT)" if signum == signal.SIGINT else "terminated (SIGTERM)", at_once=again)
        if again:
            # Every plugin, also one still starting (not yet a client the orchestrator can reach);
            # from a thread, since the registry's lock may be held by the code this handler interrupted.
            threading.Thread(target=self._kill_all, name="kl-kill-all", daemon=True).start()

    def __enter__(self) -> Self:
        from kilolock.provider.process import kill_all  # here: no import from within the handler

        self._kill_all = kill_all
        self._previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    if args.all or args.states or args.parallel_states:
        return run_all(args, context)
    if args.state is None:
        raise UsageError("refresh: give a STATE, or --all [--states GLOB] for many")
    overrides = overrides_from_args(args)  # flag errors (a bad duration) before the database is opened
    gcpolicy.hold()  # until the state is loaded: see kilolock.gcpolicy
    from kilolock.redact import Redactor as RunSecrets
    from kilolock.refresh import prelaunch

    # The providers this state's last run used start now, while psycopg loads and the state is
    # read (kilolock.refresh.prelaunch); the run takes them only if they are what it needs.
    secrets = RunSecrets()
    early = prelaunch.start(args.state, secrets)
    used: list[tuple[str, str | None]] = []
    try:
        return _run_one(args, context, overrides, secrets, early, used)
    finally:
        early.finish(used)


def _run_one(args: argparse.Namespace, context: CommandContext, overrides: RefreshOverrides, secrets: Redactor,
             early: Prelaunched, used: list[tuple[str, str | None]]) -> int:
    from kilolock.refresh.orchestrator import Cancellation
    from kilolock.refresh.service import Launching, refresh_one
    from kilolock.store import db

    cancel = Cancellation()
    # The handlers stay until the result is printed: a signal after the commit must not kill kl
    # before it says what it committed.
    with _Interrupts(cancel) as interrupts:
        progress = _Progress() if sys.stderr.isatty() else None
        try:
            with context.open_store() as conn:
                launching = Launching(early)
                result = refresh_one(conn, args.state, overrides, factories=launching, progress=progress,
                                     cancel=cancel, secrets=secrets,
                                     on_lock_wait=progress.lock_wait if progress else None, on_loaded=gcpolicy.settled)
                factory = launching.factory
                assert factory is not None  # made before the run began, and the run returned
                used.extend(factory.used)
                if factory.unavailable is not None:
                    raise factory.unavailable  # the provider stack cannot load here: one line about that, not a provider failure
                counts = None
                if result.status == "succeeded" and counts_used(args):
                    if conn.closed:  # lost (during the reads, or after the commit): the run went on on a new one
                        with db.reconnect(conn) as fresh:
                            counts = drift_counts(result, fresh)
                    else:
                        counts = drift_counts(result, conn)
            if progress:
                progress.end()
                progress = None
            if args.format == "json":
                render.emit_json(result_json(result, counts))
            elif args.quiet:
                pass
            elif args.format == "markdown":
                render_markdown(result, counts)
            else:
                render_table(result, counts)
        finally:
            if progress:
                progress.end()
    if result.status == "succeeded":
        return exitcodes.exit_code(detailed=args.detailed_exitcode, open_drift=counts[0] if counts else 0)
    print(f"kl: refresh {result.status}: {result.error or 'see the output above'}", file=sys.stderr)
    return exitcodes.exit_code(detailed=args.detailed_exitcode, error=True, code=interrupts.code)


def _all_json(results: list[Any], open_drift: dict[str, int], code: int) -> dict[str, Any]:
    by_status = {k: sum(1 for r in results if r.status == k) for k in ("succeeded", "failed", "cancelled")}
    return {"version": 1, "states": len(results), **by_status,
            "open_drift_states": sum(1 for v in open_drift.values() if v),
            "states_with_open_drift": [name for name, n in open_drift.items() if n], "exit_code": code,
            "results": [result_json(r) for r in results]}


def run_all(args: argparse.Namespace, context: CommandContext) -> int:
    """``kl refresh --all``: every state --states matches, each as ``kl refresh STATE`` would,
    PARALLEL at a time; one line per state, a summary, one exit code for all."""
    from kilolock.fleet.many import refresh_many
    from kilolock.refresh.orchestrator import Cancellation
    from kilolock.store import fleet

    if args.state is not None:
        raise UsageError("refresh: give a STATE or --all, not both (--states GLOB picks states for --all)")
    if not args.all:
        raise UsageError("refresh: --states and --parallel-states go with --all")
    overrides = overrides_from_args(args)  # flag errors first
    cancel = Cancellation()

    lines = _StateLines() if args.format == "table" and not args.quiet else None
    with _Interrupts(cancel) as interrupts, context.open_store() as conn:
        names = [name for _, name in fleet.refreshable_states(conn, args.states or "**")]
        if not names:  # an error, not a passing gate: a mistyped glob must not look like "no drift"
            raise KlError(f"refresh --all: no refreshable state matches {args.states!r} (kl state list shows the states)"
                          if args.states else "refresh --all: there is no refreshable state")
        if lines is not None:
            lines.start(names)
        results = refresh_many(conn, names, overrides, args.parallel_states or 1, cancel, on_done=lines)
        open_drift: dict[str, int] = {}
        if args.detailed_exitcode:
            for r in results:
                if r.status == "succeeded":
                    open_drift[r.state] = drift_counts(r, conn)[0]
    errors = [r for r in results if r.status != "succeeded"]
    if errors:
        code = exitcodes.exit_code(detailed=args.detailed_exitcode, error=True, code=interrupts.code)
    else:
        code = exitcodes.exit_code(detailed=args.detailed_exitcode, open_drift=sum(open_drift.values()))
    ok = len(results) - len(errors)
    drifted = sum(1 for r in results if r.changed)
    summary = f"{len(results)} state(s): {ok} succeeded, {len(errors)} not; {drifted} with changes found"
    if args.format == "json":
        render.emit_json(_all_json(results, open_drift, code))
    elif not args.quiet:
        if args.format == "markdown":
            print(f"## Refresh of {len(results)} state(s): {ok} succeeded, {len(errors)} not; "
                  f"{sum(r.changed for r in results)} drifted object(s) in {drifted} state(s)")
            print()
            for r in results:
                render_markdown(r)
                print()
        print(summary)
    if errors:
        print(f"kl: refresh --all: {len(errors)} of {len(results)} state(s) did not succeed "
              f"(first: {errors[0].state}: {errors[0].error or errors[0].status})", file=sys.stderr)
    elif code == 2:  # the gate failed: say on what, as the error line does, -q or not
        with_drift = [f"{name} ({n})" for name, n in open_drift.items() if n]
        print(f"kl: refresh --all: open drift in {len(with_drift)} of {len(results)} state(s): {', '.join(with_drift)} "
              "(kl drift STATE lists it)", file=sys.stderr)
    return code


class _StateLines:
    """One line per state as it finishes, in columns: the state names are known before the first
    run ends, the other columns have fixed widths (a longer value only pushes its own line)."""

    SERIAL_WIDTH = len("v1234 → v1235")

    def __init__(self) -> None:
        self._name_width = 0
        self._lock = threading.Lock()

    def start(self, names: list[str]) -> None:
        self._name_width = max(len(n) for n in names)

    def __call__(self, result: Result) -> None:
        to = f"v{result.to_serial}" if result.to_serial is not None else result.observation or "-"
        frm = f"v{result.from_serial}" if result.from_serial is not None else "-"
        counts = f"checked {result.checked:>4}, changed {result.changed:>4}, failed {result.failed:>4}"
        text = (f"{result.state.ljust(self._name_width)}  {result.status.ljust(9)}  "
                f"{f'{frm} → {to}'.ljust(self.SERIAL_WIDTH)}  {counts}  {result.duration_s:>7.2f}s"
                + (f"  {result.error}" if result.error else ""))
        with self._lock:  # the states' threads finish at once: whole lines, never interleaved
            print(text, flush=True)
