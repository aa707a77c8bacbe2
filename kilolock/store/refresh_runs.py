"""The refresh audit trail (ADR 0006 refresh_runs): begun before any work, always finished."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from kilolock.store import locks

STATUSES = ("running", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class RunRow:
    id: str
    state: str
    status: str
    from_serial: int
    to_serial: int | None
    started_at: datetime
    finished_at: datetime | None
    resources_checked: int | None
    resources_changed: int | None
    resources_failed: int | None
    error_summary: str | None
    actor: str | None


# A running refresh holds a session-level advisory lock keyed on its run id for as long as its
# connection lives. A `running` row whose lock can be taken therefore belongs to a process (or a
# connection) that is gone: that is what `kl runs --stale` finishes as failed.
_RUN_LOCK = "SELECT {fn}(hashtextextended(%s::text, 7109))"

_BEGIN = "INSERT INTO refresh_runs (state_id, from_version_id, actor) VALUES (%s, %s, %s) RETURNING id::text"
_RUNNING = "SELECT id::text FROM refresh_runs WHERE state_id = %s AND status = 'running'"
_FAIL_STALE = """
UPDATE refresh_runs SET status = 'failed', finished_at = now(),
    error_summary = 'stale: the run never finished (its process or database connection died); marked failed by ' || %s
WHERE id = %s AND status = 'running'
"""
_FINISH = """
UPDATE refresh_runs SET status = %s, finished_at = now(), resources_checked = %s,
    resources_changed = %s, resources_failed = %s, error_summary = %s, to_version_id = %s
WHERE id = %s AND status = 'running'
"""
# (`AND status = 'running'`: a run a fleet worker took over after its lease expired was already
# finished as failed; the late outcome of its old process must not overwrite that.)


def lock_note(run_id: str | None) -> str:
    """The LockInfo `Info` of the state lock a run takes for its commit: how a stale run's lock is
    recognised once its process is gone."""
    return f"kl refresh run {run_id}"


def begin(conn: psycopg.Connection, state_id: str, from_version_id: str, actor: str | None) -> str:
    with conn.transaction():
        row = conn.execute(_BEGIN, (state_id, from_version_id, actor)).fetchone()
        assert row is not None  # INSERT … RETURNING
        run_id = str(row[0])
        conn.execute(_RUN_LOCK.format(fn="pg_advisory_lock"), (run_id,))
    return run_id


def dead_runs(conn: psycopg.Connection, state_id: str) -> list[str]:
    """The `running` runs of the state whose process is gone (what ``finish_stale`` would finish);
    read-only: the probe's lock ends with its transaction."""
    dead: list[str] = []
    for run_id in [str(r[0]) for r in conn.execute(_RUNNING, (state_id,)).fetchall()]:
        with conn.transaction():
            free = conn.execute(_RUN_LOCK.format(fn="pg_try_advisory_xact_lock"), (run_id,)).fetchone()
        if free and free[0]:
            dead.append(run_id)
    return dead


def finish_stale(conn: psycopg.Connection, state_id: str, actor: str | None) -> list[str]:
    """Mark as failed every `running` run of the state whose refresh is no longer alive."""
    done: list[str] = []
    running = [str(r[0]) for r in conn.execute(_RUNNING, (state_id,)).fetchall()]
    for run_id in running:
        with conn.transaction():
            free = conn.execute(_RUN_LOCK.format(fn="pg_try_advisory_xact_lock"), (run_id,)).fetchone()
            if not (free and free[0]):
                continue  # its process still holds the lock: it is running
            updated = conn.execute(_FAIL_STALE, (actor or "kl", run_id)).rowcount
            if updated:
                # A run killed inside its commit leaves the state lock it took (a row committed on
                # its own), refusing every apply and refresh; its process is gone, so release it here.
                locks.force_release(conn, state_id, actor or "kl", only_info=lock_note(run_id))
        if updated:
            done.append(run_id)
    return done


def finish(
    conn: psycopg.Connection,
    run_id: str,
    *,
    status: str,
    checked: int,
    changed: int,
    failed: int,
    error_summary: str | None,
    to_version_id: str | None,
) -> None:
    if status not in STATUSES[1:]:
        raise ValueError(f"a finished run's status is one of {STATUSES[1:]}")
    with conn.transaction():
        conn.execute(_FINISH, (status, checked, changed, failed, error_summary, to_version_id, run_id))
    # Released explicitly; harmless when this is a fresh connection that never held it.
    conn.execute(_RUN_LOCK.format(fn="pg_advisory_unlock"), (run_id,)).fetchone()


_SELECT = """
SELECT rr.id::text AS id, s.name AS state, rr.status, f.serial AS from_serial, t.serial AS to_serial, rr.started_at,
       rr.finished_at, rr.resources_checked, rr.resources_changed, rr.resources_failed, rr.error_summary, rr.actor
FROM refresh_runs rr
JOIN states s ON s.id = rr.state_id
JOIN state_versions f ON f.id = rr.from_version_id
LEFT JOIN state_versions t ON t.id = rr.to_version_id
"""
_GET = _SELECT + "WHERE rr.id = %s"
_LIST = _SELECT + "WHERE rr.state_id = %s ORDER BY rr.started_at DESC LIMIT %s"


def still_running(conn: psycopg.Connection, run_id: str) -> bool:
    row = conn.execute("SELECT status = 'running' FROM refresh_runs WHERE id = %s", (run_id,)).fetchone()
    return bool(row and row[0])


def get(conn: psycopg.Connection, run_id: str) -> RunRow | None:
    return conn.cursor(row_factory=class_row(RunRow)).execute(_GET, (run_id,)).fetchone()


def list_runs(conn: psycopg.Connection, state_id: str, limit: int = 50) -> list[RunRow]:
    return conn.cursor(row_factory=class_row(RunRow)).execute(_LIST, (state_id, limit)).fetchall()
