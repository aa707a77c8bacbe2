"""A refresh run's writes, and their recovery when the database connection dies under them.

The orchestrator decides whether to commit; this module does it: the observation of what was
read (no lock: Terraform reads none of it), or, with --commit, the compare-and-swap write of
serial+1 under the state lock, the settling of a commit whose answer was lost (did it land? the
lock row must not outlive it), and finishing the run's audit row even on a fresh connection.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import psycopg

import kilolock
from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.refresh.lockwait import LockWaitFn, SleepFn, wait_for_lock
from kilolock.store import db, history, locks, observations, refresh_runs, versions, writes
from kilolock.store.db import first_line, reconnected

if TYPE_CHECKING:
    from kilolock.encryption import Keys


def commit_refresh(conn: psycopg.Connection, name: str, sid: str, state: tfstate.State, parser: tfstate.ExactJSON,
                   start: versions.VersionRow, actor: str, run_id: str | None,
                   touched: set[tuple[str, str]], *, lock_timeout: float = 0.0,
                   sleep: SleepFn | None = None, on_lock_wait: LockWaitFn | None = None,
                   keys: Keys | None = None) -> tuple[str, int]:
    """Write serial+1 on the same lineage under the state lock, if the state did not move meanwhile.
    A lock held by someone else is waited for up to ``lock_timeout`` seconds (lockwait).
    ``touched``: the objects that may differ from ``start`` (writes.commit_delta). ``keys``: an OpenTofu-encrypted state's, to write it encrypted as
    OpenTofu would, with what kl may index of it.
    Returns the new version's (id, serial)."""
    info = locks.lock_info("OperationTypeRefresh", actor, f"kl {kilolock.__version__}", info=refresh_runs.lock_note(run_id))
    # Compact, not Terraform's pretty layout: jsonb keeps neither, and `kl state pull` lays
    # any stored version out as Terraform does. A str: the store sends its UTF-8 a slice at a
    # time, so the bytes (and libpq's copy of them as a parameter) never exist whole beside it.
    raw: str | bytes = parser.dumps_compact(state.raw)
    sealed = _sealed(conn, name, state, raw, keys) if keys is not None and isinstance(raw, str) else None
    if sealed is not None:
        raw = sealed[0]  # what is stored, and what a lost commit is looked for by
    # A connection that died during the reads fails here, before anything is sent, so that case is
    # a plain "nothing committed" rather than the uncertain outcome of a commit cut half way.
    db.ping(conn)
    landed: tuple[str, int] | None = None
    try:
        try:
            wait_for_lock(lambda: locks.acquire(conn, sid, name, info, actor), lock_timeout, sleep=sleep,
                          on_wait=on_lock_wait)
        except locks.StateLocked as exc:
            raise KlError(f"{exc}; refresh not committed") from None
        try:
            # Fencing: a fleet worker cut off past its lease has had this run finished as failed
            # and its job taken over; it must not commit on top of the run that replaced it.
            if run_id is not None and not refresh_runs.still_running(conn, run_id):
                raise KlError(f"run {run_id} was finished meanwhile by someone else (a fleet worker took its job "
                              "over after its lease expired); refresh not committed")
            if sealed is not None:
                written = writes.store_envelope(conn, name, sealed[0], tfstate.EnvelopeIds(state.serial, state.lineage),
                                                source="refresh", actor=actor, index=sealed[1],
                                                expect=(start.serial, start.lineage))
            else:
                written = writes.commit_delta(conn, name, state, raw, expect_serial=start.serial,
                                              expect_lineage=start.lineage, touched=touched, actor=actor)
            landed = written.version.id, written.version.serial
        finally:
            locks.release(conn, sid, info["ID"], actor)
    except psycopg.Error as exc:
        if not db.lost(exc, conn):  # behind PgBouncer a break can surface as an InternalError too
            raise
        landed = settle_lost_commit(conn, name, sid, info["ID"], actor, start.serial + 1, raw, landed, exc)
    return landed


def resumed_after_reads(conn: psycopg.Connection, run_id: str | None) -> psycopg.Connection | None:
    """None when CONN is still there after the reads; else a new connection the run goes on with,
    CONN closed. Nothing was sent on CONN since the run began, so nothing of it is uncertain: a
    failover or a restart during the reads costs the run nothing but the wait for a primary
    (db.reconnect_wait). The run's liveness is taken on the new connection, unless the run was
    finished meanwhile (refresh_runs.resume)."""
    if not db.dropped_while_idle(conn):
        return None  # or gone without a word (a host lost): the next statement says so, nothing committed
    conn.close()  # ends its session, the run's liveness lock with it, should the server still hold it
    try:
        fresh = db.reconnect(conn, db.reconnect_wait())
    except KlError as exc:
        raise KlError(f"lost the database connection during the reads, and no new one could be had "
                      f"({first_line(exc)}); nothing committed") from None
    try:
        if run_id is not None:
            refresh_runs.resume(fresh, run_id)
    except BaseException:
        fresh.close()
        raise
    return fresh


def _sealed(conn: psycopg.Connection, name: str, state: tfstate.State, text: str,
            keys: Keys) -> tuple[bytes, writes.DecryptedIndex]:
    """The refreshed document encrypted with the state's primary key, and what kl indexes of it
    (masked by the schemas the run's providers cached). Done before the lock is taken: the key
    derivation takes a moment."""
    from kilolock import encryption

    plaintext = text.encode("utf-8")
    index_text, index = encryption.index_text(plaintext, keys, f"state {name!r}",
                                              functools.partial(history.cached_schemas, conn))
    return (keys.seal(plaintext, state.serial, state.lineage),
            writes.DecryptedIndex(index, index_text, masked=not keys.store_decrypted_attributes))


def record_observation(conn: psycopg.Connection, name: str, sid: str, state: tfstate.State, parser: tfstate.ExactJSON,
                       base: versions.VersionRow, actor: str, run_id: str | None, touched: set[tuple[str, str]], *,
                       same_as_base: bool, keys: Keys | None = None) -> writes.Observation:
    """Record STATE (the base's document with what the refresh read) as an observation of BASE
    (writes.record_observation); ``keys``: an OpenTofu-encrypted state's, to keep the observation
    encrypted as OpenTofu would write it. When the connection dies in the middle, a fresh one says
    whether it was recorded."""
    raw: str | bytes = parser.dumps_compact(state.raw)
    sealed = None
    if keys is not None and not same_as_base and isinstance(raw, str):
        envelope, index = _sealed(conn, name, state, raw, keys)
        raw, sealed = envelope, index
    # Outside the try, as commit_refresh's ping: a connection that died during the reads is a plain failure.
    before = observations.last_number(conn, base.id)
    try:
        # Fencing, as for a commit: a worker cut off past its lease must not record on top of the run that replaced it.
        if run_id is not None and not refresh_runs.still_running(conn, run_id):
            raise KlError(f"run {run_id} was finished meanwhile by someone else (a fleet worker took its job "
                          "over after its lease expired); observation not recorded")
        return writes.record_observation(conn, name, state, raw, base=base, touched=touched, same_as_base=same_as_base,
                                         actor=actor, sealed=sealed)
    except psycopg.Error as exc:
        if not db.lost(exc, conn):
            raise
        why = first_line(exc)
        expect = base.content_hash if same_as_base else versions.content_hash(raw)
        try:
            with reconnected(conn) as fresh:
                found = observations.recorded_after(fresh, base.id, before, expect, actor)
                current = versions.current_version(fresh, sid)
        except KlError as again:
            raise KlError(f"lost the database connection while recording the observation ({why}), and the new "
                          f"connection failed too ({first_line(again)}); whether it was recorded is unknown: see "
                          f"`kl state versions {name}` once the database is back") from None
        if found is None:
            raise KlError(f"lost the database connection while recording the observation ({why}); nothing recorded") from None
        return writes.Observation(state_id=sid, version=found,
                                  on_current=current is not None and current.id == base.id, found=0)


def settle_lost_commit(conn: psycopg.Connection, name: str, sid: str, lock_id: str, actor: str, serial: int,
                       raw: bytes | str, landed: tuple[str, int] | None, exc: psycopg.Error) -> tuple[str, int]:
    """The connection died inside the commit. Its transaction may or may not have committed (the
    answer to COMMIT can be what was lost), and the lock row, committed on its own, would block
    every writer: ask the database on a fresh connection, and release the lock there."""
    why = first_line(exc)
    try:
        with reconnected(conn) as fresh:
            locks.release(fresh, sid, lock_id, actor)
            if landed is None:
                found = versions.find_version(fresh, sid, serial, versions.content_hash(raw))
                landed = (found.id, found.serial) if found else None
    except KlError as again:  # no new connection, or it broke too
        raise KlError(f"lost the database connection during the commit ({why}), and the new connection to settle it "
                      f"failed too ({first_line(again)}); whether v{serial} "
                      f"was written is unknown and the state may still be locked by this run (lock {lock_id}): "
                      f"see `kl state versions {name}` and `kl status {name}` once the database is back") from None
    if landed is None:
        raise KlError(f"lost the database connection during the commit ({why}); nothing committed")
    return landed


def finish_audit(conn: psycopg.Connection, run_id: str, name: str, outcome: str, *, status: str, checked: int,
                 changed: int, failed: int, error_summary: str | None, to_version_id: str | None,
                 concurrency: list[dict[str, Any]] | None = None, guarded: bool = False) -> None:
    """Finish the run's refresh_runs row (and write its notification events), on a fresh connection
    when this one died mid-run. ``outcome`` says how the run ended, for the error raised when no
    database can be reached at all; ``guarded``: the mass-removal guard refused the commit."""
    def write(on: psycopg.Connection) -> None:
        refresh_runs.finish(on, run_id, status=status, checked=checked, changed=changed, failed=failed,
                            error_summary=error_summary, to_version_id=to_version_id, concurrency=concurrency,
                            guarded=guarded)

    try:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        write(conn)
    except psycopg.Error as lost:
        if not db.lost(lost, conn):
            raise
        try:
            with reconnected(conn) as fresh:
                write(fresh)
        except KlError as exc:  # no new connection, or it broke too
            # No database to write to: the row stays `running`, its advisory lock gone with the
            # connection, which is exactly what `kl runs --stale` finishes later.
            raise KlError(f"{outcome}; the audit row of run {run_id} could not be finished ({first_line(exc)}): "
                          f"run `kl runs {name} --stale` once the database is back") from None
