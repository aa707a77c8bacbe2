"""The refresh audit trail, a refresh_runs row per run: begun before any work, always finished."""
from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from kilolock.errors import KlError
from kilolock.store import db, locks, notify

log = logging.getLogger("kilolock.store.refresh_runs")

STATUSES = ("running", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class RunRow:
    """A refresh run's audit row, as kl runs lists it."""

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
    # Requests in flight per provider group (migration 0011): {"provider", "alias", "mode",
    # "start", "max", "final", "throttled"}; None before 0011 or when no provider was opened.
    concurrency: list[dict[str, Any]] | None = field(default=None)
    observation: str | None = None  # the observation it recorded (v7.3), when it wrote no Terraform version


# A running refresh holds a session-level advisory lock keyed on its run id for as long as its
# connection lives. A `running` row whose lock can be taken therefore belongs to a process (or a
# connection) that is gone: that is what `kl runs --stale` finishes as failed. Behind a transaction
# pooler the run beats instead (heartbeat_at, below): dead = lock free and no recent beat.
_RUN_LOCK = "SELECT {fn}(hashtextextended(%s::text, 7109))"

_BEGIN = ("INSERT INTO refresh_runs (state_id, from_version_id, actor, heartbeat_at)"
          " VALUES (%s, %s, %s, CASE WHEN %s THEN now() END) RETURNING id::text")

# Behind a transaction pooler (kilolock.store.db.transaction_pooled) a run beats instead of holding
# the lock (migration 0017): every HEARTBEAT_S, and it counts as alive for HEARTBEAT_STALE_S after.
HEARTBEAT_S = 3.0
HEARTBEAT_STALE_S = 15.0
_FRESH = f"coalesce({{rr}}heartbeat_at > now() - interval '{HEARTBEAT_STALE_S:g} seconds', false)"
# A run is dead when its lock is free and it has no recent heartbeat (a probe's xact lock ends
# with its transaction).
_DEAD = "SELECT pg_try_advisory_xact_lock(hashtextextended(id::text, 7109)) AND NOT " + _FRESH.format(rr="") + \
        " FROM refresh_runs WHERE id = %s"
_ALIVE_SQL = "(NOT pg_try_advisory_xact_lock(hashtextextended(rr.id::text, 7109)) OR " + _FRESH.format(rr="rr.") + ")"
_BEAT = "UPDATE refresh_runs SET heartbeat_at = now() WHERE id = ANY(%s::uuid[]) AND status = 'running'"
_RUNNING = "SELECT id::text FROM refresh_runs WHERE state_id = %s AND status = 'running'"
# A fleet worker's run ends at its job's last heartbeat: nothing is known to have happened after it.
_FAIL_STALE = """
UPDATE refresh_runs rr SET status = 'failed',
    finished_at = greatest(rr.started_at, least(now(), coalesce(
        (SELECT max(j.heartbeat_at) FROM fleet_jobs j WHERE j.refresh_run_id = rr.id), now()))),
    error_summary = 'stale: the run never finished (its process or database connection died); marked failed by ' || %s
WHERE rr.id = %s AND rr.status = 'running'
"""
_FINISH = """
UPDATE refresh_runs SET status = %s, finished_at = now(), resources_checked = %s,
    resources_changed = %s, resources_failed = %s, error_summary = %s, to_version_id = %s, concurrency = %s
WHERE id = %s AND status = 'running'
"""
# (`AND status = 'running'`: a run a fleet worker took over after its lease expired was already
# finished as failed; the late outcome of its old process must not overwrite that.)


def lock_note(run_id: str | None) -> str:
    """The LockInfo `Info` of the state lock a run takes for its commit: how a stale run's lock is
    recognised once its process is gone."""
    return f"kl refresh run {run_id}"


class StateBusy(locks.StateLocked):
    """Another run of the state is in progress (a fleet worker's, or a live ``kl refresh``):
    two runs of one state never overlap across the fleet."""

    def __init__(self, name: str, holder: dict[str, Any], hint: str | None = None) -> None:
        KlError.__init__(self, f"state {name!r} is being refreshed now by {holder.get('Who')} "
                               f"(since {holder.get('Created')})" + (f"; {hint}" if hint else ""))
        self.name = name
        self.holder = holder


# A fleet worker marks the connection it runs a job's refresh on with the job's id: begin() below
# reads it to link the run to its job and to check for overlap atomically.
_SERIALIZE_BEGIN = "SELECT pg_advisory_xact_lock(hashtextextended(%s::text, 7110))"
_RUNNING_JOB = """
SELECT j.id, j.claimed_at, coalesce(w.name, '?') AS worker, s.name AS state
FROM fleet_jobs j JOIN states s ON s.id = j.state_id LEFT JOIN fleet_workers w ON w.id = j.claimed_by
WHERE j.state_id = %s AND j.status = 'running' AND j.lease_expires_at >= now()
"""
_LIVE_RUN = f"""
SELECT rr.id::text, rr.actor, rr.started_at, s.name FROM refresh_runs rr JOIN states s ON s.id = rr.state_id
WHERE rr.state_id = %s AND rr.status = 'running' AND {_ALIVE_SQL}
ORDER BY rr.started_at LIMIT 1
"""
# Beginning the run is a sign of life too: a run that dies before the next heartbeat still ends
# (at the job's last heartbeat) no earlier than it began. Recorded as a heartbeat, it renews the
# lease as a heartbeat does (the claiming worker's lease_s), or the job would be taken over less
# than a lease after its last heartbeat. greatest(): a beat the worker's heartbeat thread committed
# while this transaction waited for the state's begin lock is never moved back.
_LINK_JOB = """
UPDATE fleet_jobs j SET refresh_run_id = %(run)s, heartbeat_at = greatest(j.heartbeat_at, now()),
    lease_expires_at = greatest(j.lease_expires_at,
                                now() + (SELECT make_interval(secs => w.lease_s) FROM fleet_workers w WHERE w.id = j.claimed_by))
WHERE j.id = %(job)s AND j.status = 'running'
"""


# Kept in this process, not as a session setting: behind a transaction pooler the next transaction
# may run on another server connection.
_fleet_job_of: weakref.WeakKeyDictionary[psycopg.Connection, int] = weakref.WeakKeyDictionary()


def mark_fleet_job(conn: psycopg.Connection, job_id: int | None) -> None:
    """Runs begun on CONN from now on are fleet job JOB_ID's (None: a plain kl refresh again)."""
    if job_id is None:
        _fleet_job_of.pop(conn, None)
    else:
        _fleet_job_of[conn] = job_id


class _Heartbeats:
    """The runs of this process that beat (transaction pooling), renewed by one daemon thread on a
    connection of its own: when the process dies, the beats stop and the runs are found dead."""

    def __init__(self) -> None:
        self._runs: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._dsn = ""

    def add(self, conn: psycopg.Connection, run_id: str) -> None:
        with self._lock:
            self._runs.add(run_id)
            if self._thread is None or not self._thread.is_alive():
                self._dsn = db.url_of(conn)
                self._thread = threading.Thread(target=self._run, name="kl-run-heartbeat", daemon=True)
                self._thread.start()

    def remove(self, run_id: str) -> None:
        with self._lock:
            self._runs.discard(run_id)

    def _run(self) -> None:
        beat_conn: psycopg.Connection | None = None
        failing = False  # an outage is said once, not at every beat (a kl refresh prints its log to stderr)
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                runs = sorted(self._runs)
                if not runs:
                    self._thread = None
                    break
            try:
                if beat_conn is None or beat_conn.closed:
                    beat_conn = db.connect(self._dsn)
                beat_conn.execute(_BEAT, (runs,))
                if failing:
                    log.warning("refresh run heartbeat: beating again")
                    failing = False
            except (KlError, psycopg.Error) as exc:
                if not failing:
                    log.warning("refresh run heartbeat: %s (retrying every %gs)", db.first_line(exc), HEARTBEAT_S)
                    failing = True
                if beat_conn is not None:
                    beat_conn.close()
                beat_conn = None
        if beat_conn is not None:
            beat_conn.close()


_heartbeats = _Heartbeats()


def live_run(conn: psycopg.Connection, state_id: str) -> StateBusy | None:
    """Why a new run of the state may not start now: a live run of it (a ``kl refresh`` whose
    process holds its liveness lock, or a fleet worker's), or None."""
    live = conn.execute(_LIVE_RUN, (state_id,)).fetchone()
    if live is None:
        return None
    return StateBusy(live[3], {"Who": f"run {live[0]} ({live[1]})", "Created": live[2], "ID": live[0]},
                     "--lock-timeout DURATION waits for it")


def _refuse_overlap(conn: psycopg.Connection, state_id: str, job: int | None) -> None:
    """No run starts beside a live run of the state, and a plain run does not start beside a fleet
    worker's job either (its run may not have begun yet). Called with the state's begin
    serialised, so the check and the insert are one."""
    if job is None:
        running = conn.execute(_RUNNING_JOB, (state_id,)).fetchone()
        if running is not None:
            raise StateBusy(running[3], {"Who": f"worker {running[2]} (fleet job {running[0]})", "Created": running[1]},
                            "--lock-timeout DURATION waits for it")
    busy = live_run(conn, state_id)
    if busy is not None:
        raise busy


def begin(conn: psycopg.Connection, state_id: str, from_version_id: str, actor: str | None) -> str:
    """The run's audit row, with its liveness lock held on CONN; StateBusy when the run would
    overlap another (see _refuse_overlap)."""
    pooled = db.transaction_pooled()
    job = _fleet_job_of.get(conn)
    with conn.transaction():
        conn.execute(_SERIALIZE_BEGIN, (state_id,))
        _refuse_overlap(conn, state_id, job)
        row = conn.execute(_BEGIN, (state_id, from_version_id, actor, pooled)).fetchone()
        assert row is not None  # INSERT … RETURNING
        run_id = str(row[0])
        if not pooled:
            conn.execute(_RUN_LOCK.format(fn="pg_advisory_lock"), (run_id,))
        if job is not None:
            conn.execute(_LINK_JOB, {"run": run_id, "job": job})
    if pooled:
        _heartbeats.add(conn, run_id)
    return run_id


def resume(conn: psycopg.Connection, run_id: str) -> None:
    """Carry run RUN_ID on CONN, a new connection after the one it began on was lost (the database
    failed over or restarted while the run read): its liveness lock is taken again (behind a pooler
    it beats on as it did). KlError when the run was finished meanwhile: with its lock gone it
    looked dead, and `kl runs --stale` or a worker's take-over may have finished it."""
    if not db.transaction_pooled():
        # Before the check: a probe that found the run dead holds this lock until it has finished
        # the run, so once it is ours, the row says for good whether the run may go on.
        conn.execute(_RUN_LOCK.format(fn="pg_advisory_lock"), (run_id,)).fetchone()
    if not still_running(conn, run_id):
        if not db.transaction_pooled():
            conn.execute(_RUN_LOCK.format(fn="pg_advisory_unlock"), (run_id,)).fetchone()
        raise KlError(f"run {run_id} was finished meanwhile by someone else (its database connection was lost, so it "
                      "looked dead to `kl runs --stale` or a fleet worker's take-over)")


def dead_runs(conn: psycopg.Connection, state_id: str) -> list[str]:
    """The `running` runs of the state whose process is gone (what ``finish_stale`` would finish);
    read-only: the probe's lock ends with its transaction."""
    dead: list[str] = []
    for run_id in [str(r[0]) for r in conn.execute(_RUNNING, (state_id,)).fetchall()]:
        with conn.transaction():
            free = conn.execute(_DEAD, (run_id,)).fetchone()
        if free and free[0]:
            dead.append(run_id)
    return dead


def finish_stale(conn: psycopg.Connection, state_id: str, actor: str | None) -> list[str]:
    """Mark as failed every `running` run of the state whose refresh is no longer alive."""
    done: list[str] = []
    running = [str(r[0]) for r in conn.execute(_RUNNING, (state_id,)).fetchall()]
    for run_id in running:
        with conn.transaction():
            free = conn.execute(_DEAD, (run_id,)).fetchone()
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
    concurrency: list[dict[str, Any]] | None = None,
    guarded: bool = False,
) -> None:
    """Finish the run's row and, in the same transaction, write the notification events it makes
    (refresh.failed, and refresh.guarded when the mass-removal guard refused its commit)."""
    if status not in STATUSES[1:]:
        raise ValueError(f"a finished run's status is one of {STATUSES[1:]}")
    try:
        with conn.transaction():
            updated = conn.execute(_FINISH, (status, checked, changed, failed, error_summary, to_version_id,
                                             Jsonb(concurrency) if concurrency is not None else None, run_id)).rowcount
            if updated:  # not when another process already finished it (a worker's take-over)
                notify.record_run_events(conn, run_id, failed=status == "failed", guarded=guarded)
    finally:
        # Beats stop with the attempt to finish, written or not: a row left `running` by a lost
        # connection must be found dead, as its session lock would be gone with the connection.
        _heartbeats.remove(run_id)
    if db.transaction_pooled():
        return
    # Released explicitly; harmless when this is a fresh connection that never held it.
    conn.execute(_RUN_LOCK.format(fn="pg_advisory_unlock"), (run_id,)).fetchone()


_SELECT = """
SELECT rr.id::text AS id, s.name AS state, rr.status, f.serial AS from_serial, CASE WHEN t.kind = 'terraform' THEN t.serial END AS to_serial, CASE WHEN t.kind = 'observation' THEN 'v' || t.serial || '.' || t.observation_number END AS observation, rr.started_at,
       rr.finished_at, rr.resources_checked, rr.resources_changed, rr.resources_failed, rr.error_summary, rr.actor,
       rr.concurrency
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
