"""The refresh orchestrator: what to refresh, in what order, and whether to commit.

run() loads Terraform's current version, groups managed instances by (provider source, alias),
reads every instance through one client per group (refresh/reads.py, refresh/instance.py), and
records what it read as an observation, or with --commit as Terraform's next version, only when
commit_decision() says so (refresh/policy.py; refresh/commit.py writes it). The refresh_runs row
is begun before any work and finished on every path.

Each run has its own secrets (a kilolock.redact.Redactor): what it learns is secret is masked in
its providers' logs and in its failure messages, and never in another run's.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from kilolock import drift as attribute_drift
from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.provider import transport
from kilolock.redact import Redactor
from kilolock.refresh import whyfailed
from kilolock.refresh.cancel import STOP_GRACE_S as STOP_GRACE_S  # noqa: PLC0414 - callers know them from here
from kilolock.refresh.cancel import Cancellation as Cancellation  # noqa: PLC0414
from kilolock.refresh.cancel import stop_grace
from kilolock.refresh.client import ClientFactory
from kilolock.refresh.commit import commit_refresh, finish_audit, record_observation, resumed_after_reads
from kilolock.refresh.findings import drift_of, judge_drift, with_read_back
from kilolock.refresh.instance import Entry
from kilolock.refresh.lockwait import LockWaitCancelled, LockWaitFn, wait_for_lock
from kilolock.refresh.options import RefreshOptions
from kilolock.refresh.policy import check_workdir, commit_decision, mass_removal, refuse_if_locked, unplaced_removal
from kilolock.refresh.reads import ASYNC_MIN_INSTANCES as ASYNC_MIN_INSTANCES  # noqa: PLC0414
from kilolock.refresh.reads import GroupReads, group_instances, read_path
from kilolock.refresh.reads import ProgressFn as ProgressFn  # noqa: PLC0414
from kilolock.refresh.result import Failure as Failure  # noqa: PLC0414 - run() returns them: its callers know them from here
from kilolock.refresh.result import Result as Result  # noqa: PLC0414
from kilolock.refresh.splice import build_refreshed_state
from kilolock.store import db, history, refresh_runs, states, versions
from kilolock.store.db import first_line

if TYPE_CHECKING:
    from kilolock.encryption import Keys

log = logging.getLogger("kilolock.refresh")


def run(
    conn: psycopg.Connection,
    name: str,
    factory: ClientFactory,
    options: RefreshOptions,
    *,
    state_id: str | None = None,
    progress: ProgressFn | None = None,
    cancel: Cancellation | None = None,
    secrets: Redactor | None = None,
    on_lock_wait: LockWaitFn | None = None,
    on_loaded: Callable[[], None] | None = None,
) -> Result:
    """Refresh state NAME; ``state_id``: its id, when the caller looked it up already. ``secrets``:
    the run's redactor (a new, empty one unless given); ``on_lock_wait`` hears about every retry
    while waiting for someone else's lock; ``on_loaded`` is called once the state is loaded and
    indexed, before any read (kilolock.gcpolicy)."""
    started = time.monotonic()
    cancel = cancel or Cancellation()
    secrets = Redactor() if secrets is None else secrets
    result = Result(state=name, dry_run=options.dry_run)
    # A mistyped environment variable is the user's mistake, not a failed run: refused before the
    # audit row (which `kl runs` would list and a channel would be notified of).
    read_path()
    transport.chosen()  # KL_PROVIDER_TRANSPORT
    grace = stop_grace()

    try:
        sid = state_id or states.state_id(conn, name)
        current = versions.current_version(conn, sid)
        if current is None:
            raise KlError(f"state {name!r} has no versions to refresh")
        parser = tfstate.ExactJSON()
        # Parsed a piece at a time: the whole text is never built next to the document.
        doc = versions.load_document(conn, name, current.serial, parser.loads, terraform_version_id=current.id)
        result.from_serial = current.serial
        result.run_id = refresh_runs.begin(conn, sid, current.id, options.actor)
    except psycopg.Error as exc:
        if not db.lost(exc, conn):
            raise
        # Before the audit row exists (or while it is being written: `kl runs --stale` finishes it).
        raise KlError(f"lost the database connection ({first_line(exc)}); nothing was refreshed") from None

    to_version_id: str | None = None
    keys: Keys | None = None
    own: psycopg.Connection | None = None  # the run's new connection when CONN was lost during the reads
    try:
        if isinstance(doc, dict) and tfstate.is_encrypted_envelope(doc):
            doc, keys = _decrypted(name, current, doc, parser, options, secrets)
        state = tfstate.parse_state(doc, origin=f"state {name!r} v{current.serial}")
        check_workdir(name, options)  # before any provider starts
        if not options.dry_run:  # a dry run writes nothing, so no lock concerns it
            wait_for_lock(lambda: refuse_if_locked(conn, sid, name, options.commit), options.lock_timeout,
                          sleep=cancel.wait, on_wait=on_lock_wait)

        # An encrypted state's index may hold its sensitive values masked: its document is the prior.
        stored = versions.open_attributes(conn, sid, len(state.instances)) if keys is None else {}
        groups = {k: [Entry(i, stored.get((i.address, i.deposed))) for i in insts] for k, insts in group_instances(state).items()}
        del stored
        if on_loaded is not None:
            on_loaded()
        shared = GroupReads(factory, options, progress, cancel, secrets)
        timer = None
        if options.timeout:
            timer = threading.Timer(options.timeout, cancel.cancel, args=(f"timed out after {options.timeout:g}s",))
            timer.daemon = True
            timer.start()
        try:
            with cf.ThreadPoolExecutor(options.concurrency, thread_name_prefix="kl-group") as pool:
                futures = [pool.submit(shared.run_group, k, entries, result.providers) for k, entries in groups.items()]
                stopped_at: float | None = None
                pending = set(futures)
                while pending:
                    # Returns the moment the last group ends (a poll of the cancel flag alone
                    # would add up to its interval to every run); a cancel is seen within it.
                    _, pending = cf.wait(pending, timeout=0.05)
                    if not cancel.cancelled or not pending:
                        continue
                    if stopped_at is None:
                        stopped_at = time.monotonic()
                        log.info("run cancelled (%s): StopProvider to its providers; those still busy %gs later are "
                                 "shut down", cancel.reason, grace)
                        shared.stop_all(stopped_at + grace)  # StopProvider first; each group then closes its process
                    if cancel.at_once or time.monotonic() - stopped_at >= grace:
                        shared.shut_down_all(at_once=cancel.at_once)  # what Stop did not end
                for f in futures:
                    f.result()
        finally:
            if timer:
                timer.cancel()
        own = resumed_after_reads(conn, result.run_id)
        if own is not None:
            log.info("%s: the database connection was lost during the reads; the run goes on on a new one", name)
            conn = own

        entries = [e for es in groups.values() for e in es]
        result.checked = sum(1 for e in entries if e.read)
        result.failures = sorted(shared.group_failures, key=lambda f: f.provider or "") + sorted(
            (Failure(e.inst.address, e.error) for e in entries if e.error and e.read), key=lambda f: f.address or "")
        result.failed = sum(1 for e in entries if e.error)
        result.concurrency = sorted(shared.concurrency, key=lambda c: (c["provider"], c["alias"] or ""))
        for e in entries:  # what an unchanged object was and read back is needed no more
            if e.update is None or not e.update.changed:
                e.prior_json = None
        changed = sorted({e.inst.address for e in entries if e.update is not None and e.update.changed})
        result.changed_addresses, result.changed = changed, len(changed)
        drifted = [e for e in sorted(entries, key=lambda e: (e.inst.address, e.inst.deposed))
                   if e.update is not None and e.update.changed]
        schemas = history.cached_schemas(conn, attribute_drift.schema_keys(  # cached by the run's providers
            {"provider": e.inst.provider, "mode": e.inst.mode, "type": e.inst.type} for e in drifted))
        result.drift = [drift_of(e, schemas) for e in drifted]
        judge_drift(conn, name, sid, drifted, result.drift)
        result.drift = with_read_back(conn, sid, entries, result.drift)
        result.reshaped = sorted({e.inst.address for e in entries
                                  if e.update is not None and e.update.reshaped and not e.update.removed})
        modern_doc, result.provider_addresses, rewritten = tfstate.modern_provider_addresses(doc)

        removal = mass_removal(groups, options)
        commit, why_not = commit_decision(result, options, removal, cancel.cancelled,
                                          unplaced_removal(name, entries, options))
        # The guard's refusal, as commit_decision orders its reasons: not a cancelled or failed
        # run, and not a dry run (which commits nothing anyway).
        result.guarded = bool(removal and not options.allow_mass_removal and not cancel.cancelled
                              and not result.failed and not options.dry_run)
        if cancel.cancelled:
            result.status, result.error = "cancelled", cancel.reason
        elif why_not:
            result.status, result.error = "failed", why_not
        else:
            result.status = "succeeded"
        if commit:
            updates = {(e.inst.resource_index, e.inst.instance_index): e.update for e in entries if e.update is not None}
            if result.provider_addresses:
                # Terraform 0.13+ writes the modern address: the rewritten resources hold the same
                # objects, so the index only changes its provider.
                state = tfstate.State(raw=modern_doc, instances=[
                    dataclasses.replace(i, provider=result.provider_addresses.get(i.provider, i.provider))
                    for i in state.instances])
            # In place: drift is computed, and nothing reads the prior document after the commit.
            # An observation keeps its base's serial: Terraform's serial moves only with a version of its own.
            spliced = build_refreshed_state(state, updates, serial=current.serial, parser=parser, in_place=True)
            new_state = spliced.state
            by_position = {(i.resource_index, i.instance_index): (i.address, i.deposed) for i in state.instances}
            touched = {by_position[p] for p in spliced.touched | rewritten}
            same_resources = spliced.same_resources and not result.provider_addresses  # a rewrite may touch no object
            # The reads' bookkeeping is done with: free it before the commit serialises the document.
            del updates, by_position, entries, groups, state, doc, modern_doc, spliced
            # --commit writes Terraform's next version only where what was read differs from it: a
            # version that repeats its predecessor would still make every saved plan stale.
            if options.commit and not same_resources:
                new_state.raw["serial"] = current.serial + 1
                to_version_id, result.to_serial = commit_refresh(
                    conn, name, sid, new_state, parser, current, options.actor, result.run_id, touched,
                    lock_timeout=options.lock_timeout, sleep=cancel.wait,
                    on_lock_wait=on_lock_wait, keys=keys)
            else:
                observed = record_observation(conn, name, sid, new_state, parser, current, options.actor, result.run_id,
                                              touched, same_as_base=same_resources, keys=keys)
                to_version_id, result.observation = observed.version.id, observed.version.label
                if observed.locked_by is not None:
                    result.base_locked = True
                    log.info("%s: the state is locked by %s (%s) since this refresh began; what it read may be that "
                             "operation's work, so %s opens no drift", name, observed.locked_by.get("Who") or "someone",
                             observed.locked_by.get("Operation") or "?", observed.version.label)
                elif not observed.on_current:
                    result.base_moved = True
                    log.info("%s: Terraform wrote a newer version while this refresh read %s; its observation is kept "
                             "against %s and opens no drift", name, observed.version.label, f"v{current.serial}")
    except KeyboardInterrupt:
        result.status, result.error = "cancelled", "interrupted"
        raise
    except LockWaitCancelled:
        result.status, result.error = "cancelled", cancel.reason
    except KlError as exc:
        result.status, result.error = "failed", secrets.redact(str(exc))
    except Exception as exc:
        if db.lost(exc, conn):
            # The database went away (restart, a cut connection; behind PgBouncer also an
            # InternalError on a broken connection): a fault to report, not a bug. Only
            # commit_refresh writes a version, and it settles its own outcome, so nothing was committed.
            result.status, result.error = "failed", f"lost the database connection ({first_line(exc)}); nothing committed"
        else:  # a bug: still finish the audit row, then let the CLI report it
            result.status, result.error = "failed", secrets.redact(f"internal error: {type(exc).__name__}: {exc}")
            raise
    finally:
        result.duration_s = round(time.monotonic() - started, 3)
        try:
            _finish(conn, result, to_version_id)
        finally:
            if own is not None:
                own.close()
    return result


def _decrypted(name: str, current: versions.VersionRow, doc: dict[str, Any], parser: tfstate.ExactJSON,
               options: RefreshOptions, secrets: Redactor) -> tuple[Any, Keys]:
    """The state inside envelope DOC, and the keys that opened it (the commit seals with them):
    from the state's stored encryption configuration, its passphrases made secrets of the run."""
    if options.encryption is None:
        raise KlError(f"state {name!r} is OpenTofu-encrypted and has no encryption configured, so kl cannot read it: "
                      f"`kl state set {name} --encryption-config FILE` (OpenTofu's encryption block as JSON)")
    from kilolock import encryption

    keys = encryption.keys_for(dict(options.encryption), options.store_decrypted_attributes, f"state {name!r}", secrets)
    opened = encryption.open_envelope(doc, keys, f"state {name!r} v{current.serial}")
    return parser.loads(opened.plaintext), keys


def _finish(conn: psycopg.Connection, result: Result, to_version_id: str | None) -> None:
    if result.run_id is None:
        return
    summary = whyfailed.audit_summary(result)
    finish_audit(conn, result.run_id, result.state, f"refresh {result.status}: {result.error or summary}",
                 status=result.status if result.status != "running" else "failed", checked=result.checked,
                 changed=result.changed, failed=result.failed, error_summary=summary, to_version_id=to_version_id,
                 concurrency=result.concurrency or None, guarded=result.guarded)
