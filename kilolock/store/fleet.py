"""The fleet's schedules, job queue and workers (migration 0010): every claim, lease and heartbeat.
A schedule and its jobs are of a kind (migration 0026): 'refresh' (the states a glob matches) or
'discover' (one discovery scope, run as `kl discover` runs it).

Each call is one short transaction and relies on no session state, so a worker's claim lives in
its row (``lease_expires_at``), not in a connection. Claims use FOR UPDATE SKIP LOCKED: workers on
many hosts never wait for each other's rows, and no job is claimed twice.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

import psycopg
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from kilolock.globs import sql_regex
from kilolock.store import locks, provider_limits, refresh_runs

REFRESH, DISCOVER = "refresh", "discover"


@dataclass(frozen=True)
class Schedule:
    """A fleet schedule: which states (or which discovery), how often."""

    id: int
    states_glob: str | None  # None for a discover schedule
    every_s: float | None
    cron: str | None
    jitter_s: float
    paused: bool
    next_run_at: datetime
    last_run_at: datetime | None
    created_at: datetime
    created_by: str | None
    states: int  # how many states the glob matches now
    kind: str = REFRESH
    # A discover schedule's scope: {source, alias, state, type, list_config, limit}.
    discovery: dict[str, Any] | None = None


@dataclass(frozen=True)
class Job:
    """A due refresh of one state (or a due discovery), for a fleet worker to claim."""

    id: int
    state_id: str | None  # None for a discovery
    state: str  # a discovery's: what it lists ("discover SOURCE TYPE"), for messages
    due_at: datetime
    attempts: int
    kind: str = REFRESH
    discovery: dict[str, Any] | None = None


# States a fleet refreshes: those with a current version kl can read (an OpenTofu-encrypted one
# only with its encryption configured, and a state without versions has nothing to refresh).
_READABLE = ("(NOT cur.encrypted OR EXISTS (SELECT 1 FROM state_settings x "
             "WHERE x.state_id = s.id AND x.encryption IS NOT NULL))")
_REFRESHABLE = """
SELECT s.id::text AS id, s.name FROM states s
JOIN LATERAL (SELECT encrypted FROM state_versions v WHERE v.state_id = s.id AND v.kind = 'terraform'
              ORDER BY serial DESC LIMIT 1) cur ON true
WHERE s.name ~ %s AND """ + _READABLE + """
ORDER BY s.name
"""


def refreshable_states(conn: psycopg.Connection, glob: str) -> list[tuple[str, str]]:
    """(state id, name) of every refreshable state GLOB matches, by name."""
    return [(str(r[0]), str(r[1])) for r in conn.execute(_REFRESHABLE, (sql_regex(glob),)).fetchall()]


# ---------------------------------------------------------------- schedules

_SCHEDULE_COLS = """
sc.id, sc.states_glob, sc.every_s, sc.cron, sc.jitter_s, sc.paused, sc.next_run_at, sc.last_run_at, sc.created_at,
sc.created_by, (SELECT count(*) FROM states s WHERE s.name ~ sc.states_regex)::int AS states, sc.kind, sc.discovery
"""
# What a job is, said in messages and `kl fleet status`: its state, or what its discovery lists.
_JOB_LABEL = "coalesce(s.name, 'discover ' || (j.discovery ->> 'source') || ' ' || (j.discovery ->> 'type'))"


def add_schedule(conn: psycopg.Connection, glob: str, *, every_s: float | None, cron: str | None, jitter_s: float,
                 first_run_at: datetime, actor: str) -> int:
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO fleet_schedules (states_glob, states_regex, every_s, cron, jitter_s, next_run_at, created_by) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (glob, sql_regex(glob), every_s, cron, jitter_s, first_run_at, actor)).fetchone()
    assert row is not None
    return int(row[0])


def add_discovery_schedule(conn: psycopg.Connection, discovery: dict[str, Any], *, every_s: float | None,
                           cron: str | None, jitter_s: float, first_run_at: datetime, actor: str) -> int:
    """A schedule that queues one discovery (DISCOVERY: {source, alias, state, type, list_config,
    limit}) each time it fires."""
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO fleet_schedules (kind, discovery, every_s, cron, jitter_s, next_run_at, created_by) "
            "VALUES ('discover', %s, %s, %s, %s, %s, %s) RETURNING id",
            (Jsonb(discovery), every_s, cron, jitter_s, first_run_at, actor)).fetchone()
    assert row is not None
    return int(row[0])


def list_schedules(conn: psycopg.Connection) -> list[Schedule]:
    return conn.cursor(row_factory=class_row(Schedule)).execute(
        f"SELECT {_SCHEDULE_COLS} FROM fleet_schedules sc ORDER BY sc.id").fetchall()


def schedules_now(conn: psycopg.Connection) -> tuple[list[Schedule], int, datetime]:
    """``kl schedule list``: the schedules, the live workers (live_workers) and the database's
    clock, of one moment: a next run before that clock is overdue."""
    with conn.transaction():
        schedules = list_schedules(conn)
        live = live_workers(conn)
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return schedules, live, row[0]


def set_paused(conn: psycopg.Connection, schedule_id: int, paused: bool) -> bool:
    with conn.transaction():
        return conn.execute("UPDATE fleet_schedules SET paused = %s WHERE id = %s", (paused, schedule_id)).rowcount == 1


def remove_schedule(conn: psycopg.Connection, schedule_id: int) -> tuple[Schedule, int] | None:
    """Delete it; jobs it queued and not yet claimed go with it (running ones finish). (What was
    removed, the queued jobs dropped), or None when there is no such schedule."""
    with conn.transaction():
        found = conn.cursor(row_factory=class_row(Schedule)).execute(
            f"SELECT {_SCHEDULE_COLS} FROM fleet_schedules sc WHERE sc.id = %s FOR UPDATE", (schedule_id,)).fetchone()
        if found is None:
            return None
        dropped = conn.execute("DELETE FROM fleet_jobs WHERE schedule_id = %s AND status = 'queued'", (schedule_id,)).rowcount
        conn.execute("DELETE FROM fleet_schedules WHERE id = %s", (schedule_id,))
    return found, dropped


def get_schedule(conn: psycopg.Connection, schedule_id: int) -> Schedule | None:
    return conn.cursor(row_factory=class_row(Schedule)).execute(
        f"SELECT {_SCHEDULE_COLS} FROM fleet_schedules sc WHERE sc.id = %s", (schedule_id,)).fetchone()


def set_next_run(conn: psycopg.Connection, schedule_id: int, at: datetime) -> None:
    with conn.transaction():
        conn.execute("UPDATE fleet_schedules SET next_run_at = %s WHERE id = %s", (at, schedule_id))


# A state's offset inside the jitter window is fixed (a hash of schedule and state): the load
# spreads, and each state keeps its own rhythm from one period to the next.
_ENQUEUE = """
INSERT INTO fleet_jobs (state_id, schedule_id, due_at)
SELECT s.id, %(schedule)s,
       %(at)s + make_interval(secs => %(jitter)s * ((hashtextextended(s.name || '/' || %(schedule)s::text, 0) & 1048575) / 1048576.0))
FROM states s
JOIN LATERAL (SELECT encrypted FROM state_versions v WHERE v.state_id = s.id AND v.kind = 'terraform'
              ORDER BY serial DESC LIMIT 1) cur ON true
WHERE s.name ~ %(regex)s AND """ + _READABLE + """
ON CONFLICT (state_id) WHERE status IN ('queued', 'running') DO NOTHING
"""
# A discovery's offset inside the jitter window is fixed too (a hash of the schedule). A discovery
# still queued or running when its schedule fires again is not queued twice.
_ENQUEUE_DISCOVERY = """
INSERT INTO fleet_jobs (kind, discovery, schedule_id, due_at)
SELECT 'discover', sc.discovery, sc.id,
       %(at)s + make_interval(secs => sc.jitter_s * ((hashtextextended('discover/' || sc.id::text, 0) & 1048575) / 1048576.0))
FROM fleet_schedules sc WHERE sc.id = %(schedule)s
ON CONFLICT (schedule_id) WHERE kind = 'discover' AND status IN ('queued', 'running') DO NOTHING
"""


def enqueue_due_schedules(conn: psycopg.Connection, next_run: Callable[[Schedule, datetime], datetime]) -> int:
    """Queue a job for every state of every schedule that is due, and move each schedule to its next
    time after now (NEXT_RUN): however many times a schedule was missed, it runs once. One
    transaction, schedules locked with SKIP LOCKED: two workers never fire one schedule twice, and a
    worker that dies half way fires nothing. Returns the jobs queued (states already queued or
    running are not queued again)."""
    queued = 0
    with conn.transaction():
        due = conn.cursor(row_factory=class_row(Schedule)).execute(
            f"SELECT {_SCHEDULE_COLS} FROM fleet_schedules sc WHERE NOT sc.paused AND sc.next_run_at <= now() "
            "ORDER BY sc.next_run_at FOR UPDATE OF sc SKIP LOCKED").fetchall()
        if not due:
            return 0
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        now: datetime = row[0]
        for sc in due:
            if sc.kind == DISCOVER:
                queued += conn.execute(_ENQUEUE_DISCOVERY, {"schedule": sc.id, "at": now}).rowcount
            else:
                assert sc.states_glob is not None  # a refresh schedule's (migration 0026's check)
                queued += conn.execute(_ENQUEUE, {"schedule": sc.id, "at": now, "jitter": sc.jitter_s,
                                                  "regex": sql_regex(sc.states_glob)}).rowcount
            conn.execute("UPDATE fleet_schedules SET next_run_at = %s, last_run_at = %s WHERE id = %s",
                         (next_run(sc, now), now, sc.id))
    return queued


def enqueue_now(conn: psycopg.Connection, glob: str) -> tuple[int, int]:
    """``kl schedule run-now``: a job due now for every refreshable state GLOB matches; a state
    already queued is moved up to now. (matched, queued or moved up)."""
    with conn.transaction():
        states = refreshable_states(conn, glob)
        ids = [sid for sid, _ in states]
        if not ids:
            return 0, 0
        moved = conn.execute("UPDATE fleet_jobs SET due_at = now() WHERE state_id = ANY(%s::uuid[]) "
                             "AND status = 'queued' AND due_at > now()", (ids,)).rowcount
        added = conn.execute(
            "INSERT INTO fleet_jobs (state_id, due_at) SELECT unnest(%s::uuid[]), now() "
            "ON CONFLICT (state_id) WHERE status IN ('queued', 'running') DO NOTHING", (ids,)).rowcount
    return len(states), moved + added


# ---------------------------------------------------------------- workers

# How long `kl fleet status` still lists a worker that is gone: a stopped one, and a lost one (no
# heartbeat within its lease, whether it was running or draining). `kl fleet prune` deletes them.
SHOW_STOPPED = "1 hour"
SHOW_LOST = "1 day"
# A worker is alive while its last heartbeat is within its lease.
_ALIVE = "w.heartbeat_at + make_interval(secs => w.lease_s) >= now()"
# A lost worker's running job is taken over (and names it) only when some worker polls: until then
# the worker is shown and kept.
_HOLDS_A_JOB = "(SELECT 1 FROM fleet_jobs j WHERE j.claimed_by = w.id AND j.status = 'running')"


def register_worker(conn: psycopg.Connection, name: str | None, parallel_states: int, lease_s: float) -> tuple[int, str]:
    host, pid = socket.gethostname(), os.getpid()
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO fleet_workers (name, host, pid, parallel_states, lease_s) VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (name or f"{host}:{pid}", host, pid, parallel_states, lease_s)).fetchone()
    assert row is not None
    return int(row[0]), name or f"{host}:{pid}"


_HEARTBEAT_JOBS = """
UPDATE fleet_jobs j SET heartbeat_at = now(), lease_expires_at = now() + make_interval(secs => %(lease)s)
WHERE j.claimed_by = %(worker)s AND j.status = 'running' AND j.id = ANY(%(jobs)s)
RETURNING j.id
"""


def heartbeat(conn: psycopg.Connection, worker_id: int, lease_s: float, job_ids: list[int], status: str) -> set[int]:
    """Renew the worker's liveness and the leases of JOB_IDS (its running jobs). Returns the jobs still ours: a job missing from it was
    taken over (its lease expired first) and its run must stop."""
    with conn.transaction():
        conn.execute("UPDATE fleet_workers SET heartbeat_at = now(), status = %s WHERE id = %s", (status, worker_id))
        if not job_ids:
            return set()
        rows = conn.execute(_HEARTBEAT_JOBS, {"lease": lease_s, "worker": worker_id, "jobs": job_ids}).fetchall()
    return {int(r[0]) for r in rows}


def stop_worker(conn: psycopg.Connection, worker_id: int) -> None:
    with conn.transaction():
        conn.execute("UPDATE fleet_workers SET status = 'stopped', stopped_at = now(), heartbeat_at = now() "
                     "WHERE id = %s", (worker_id,))


# ---------------------------------------------------------------- jobs

_CLAIM = f"""
UPDATE fleet_jobs j SET status = 'running', claimed_by = %(worker)s, claimed_at = now(), heartbeat_at = now(),
    lease_expires_at = now() + make_interval(secs => %(lease)s), attempts = j.attempts + 1,
    refresh_run_id = NULL, discovery_run_id = NULL, finished_at = NULL
FROM fleet_jobs q LEFT JOIN states s ON s.id = q.state_id
WHERE q.id = j.id AND j.id IN (
    SELECT id FROM fleet_jobs WHERE status = 'queued' AND due_at <= now()
    ORDER BY due_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
RETURNING j.id, j.state_id::text AS state_id, {_JOB_LABEL} AS state, j.due_at, j.attempts, j.kind, j.discovery
"""


def claim(conn: psycopg.Connection, worker_id: int, n: int, lease_s: float) -> list[Job]:
    """Up to N due jobs, oldest due first, now leased to WORKER_ID for LEASE_S seconds."""
    with conn.transaction():
        return conn.cursor(row_factory=class_row(Job)).execute(
            _CLAIM, {"worker": worker_id, "lease": lease_s, "n": n}).fetchall()


def finish_job(conn: psycopg.Connection, job_id: int, worker_id: int, status: str, run_id: str | None,
               error: str | None) -> bool:
    """Record the outcome, if the job is still this worker's (False: its lease was taken over)."""
    with conn.transaction():
        return conn.execute(
            "UPDATE fleet_jobs SET status = %s, finished_at = now(), refresh_run_id = COALESCE(%s::uuid, refresh_run_id), "
            "error = %s WHERE id = %s AND claimed_by = %s AND status = 'running'",
            (status, run_id, error, job_id, worker_id)).rowcount == 1


def requeue(conn: psycopg.Connection, job_id: int, worker_id: int, delay_s: float, note: str | None) -> bool:
    """Put a claimed job back in the queue (the state was busy, or the worker is stopping), due
    after DELAY_S; the attempt does not count."""
    with conn.transaction():
        return conn.execute(
            "UPDATE fleet_jobs SET status = 'queued', due_at = now() + make_interval(secs => %s), claimed_by = NULL, "
            "claimed_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL, attempts = greatest(attempts - 1, 0), "
            "error = %s WHERE id = %s AND claimed_by = %s AND status = 'running'",
            (delay_s, note, job_id, worker_id)).rowcount == 1


_EXPIRED = """
SELECT j.id, j.kind, j.state_id::text AS state_id, j.claimed_at, j.heartbeat_at, j.attempts,
       j.refresh_run_id::text AS run_id, j.discovery_run_id::text AS discovery_run_id, coalesce(w.name, '?') AS worker
FROM fleet_jobs j LEFT JOIN fleet_workers w ON w.id = j.claimed_by
WHERE j.status = 'running' AND j.lease_expires_at < now()
ORDER BY j.lease_expires_at
FOR UPDATE OF j SKIP LOCKED
"""
# The dead worker's refresh run: the one the job is linked to, or (when it died before its first
# heartbeat after the run began) a run of the state begun since the claim whose process is gone.
# It ends no later than the last heartbeat: nothing is known to have happened after it.
_FAIL_DEAD_RUN = """
UPDATE refresh_runs rr SET status = 'failed',
    finished_at = greatest(rr.started_at, least(now(), %(heartbeat)s)),
    error_summary = 'worker ' || %(worker)s || ' stopped heartbeating (lease expired); its run was taken over'
WHERE rr.status = 'running' AND rr.state_id = %(state)s
  AND (rr.id = %(run)s::uuid
       OR (rr.started_at >= %(claimed)s AND pg_try_advisory_xact_lock(hashtextextended(rr.id::text, 7109))
           AND NOT coalesce(rr.heartbeat_at > now() - make_interval(secs => %(stale)s), false)))
RETURNING rr.id::text
"""
# A dead worker's discovery run, linked to its job as it began, ends at the job's last heartbeat.
_FAIL_DEAD_DISCOVERY = """
UPDATE discovery_runs SET status = 'failed', finished_at = greatest(started_at, least(now(), %(heartbeat)s)),
    error = 'worker ' || %(worker)s || ' stopped heartbeating (lease expired); its run was taken over'
WHERE id = %(run)s::uuid AND status = 'running'
"""


def recover_expired(conn: psycopg.Connection, max_attempts: int) -> list[tuple[int, str]]:
    """Take back every running job whose lease expired (its worker died or lost the database):
    finish its refresh run (or discovery run) as failed at the last heartbeat, release a state lock
    that run held, and queue the job again, due now, or fail it after MAX_ATTEMPTS claims. (job id, what was done)."""
    done: list[tuple[int, str]] = []
    with conn.transaction():
        expired = conn.cursor(row_factory=dict_row).execute(_EXPIRED).fetchall()
        for j in expired:
            if j["kind"] == DISCOVER:
                if j["discovery_run_id"] is not None:
                    conn.execute(_FAIL_DEAD_DISCOVERY, {"heartbeat": j["heartbeat_at"], "worker": j["worker"],
                                                        "run": j["discovery_run_id"]})
                runs: list[str] = []
            else:
                runs = [str(r[0]) for r in conn.execute(_FAIL_DEAD_RUN, {
                    "heartbeat": j["heartbeat_at"], "worker": j["worker"], "state": j["state_id"], "run": j["run_id"],
                    "claimed": j["claimed_at"], "stale": refresh_runs.HEARTBEAT_STALE_S}).fetchall()]
            for run_id in runs:
                locks.force_release(conn, j["state_id"], f"kl worker (lease of {j['worker']} expired)",
                                    only_info=refresh_runs.lock_note(run_id))
            note = f"worker {j['worker']} stopped heartbeating during attempt {j['attempts']}"
            if j["attempts"] >= max_attempts:
                conn.execute("UPDATE fleet_jobs SET status = 'failed', finished_at = now(), error = %s, "
                             "refresh_run_id = COALESCE(%s::uuid, refresh_run_id) WHERE id = %s",
                             (note + f"; gave up after {max_attempts} attempts", runs[0] if runs else None, j["id"]))
                done.append((int(j["id"]), "failed"))
            else:
                conn.execute("UPDATE fleet_jobs SET status = 'queued', due_at = now(), claimed_by = NULL, claimed_at = NULL, "
                             "heartbeat_at = NULL, lease_expires_at = NULL, refresh_run_id = NULL, discovery_run_id = NULL, "
                             "error = %s WHERE id = %s",
                             (note, j["id"]))
                done.append((int(j["id"]), "requeued"))
    return done


class RunningJob(TypedDict):
    id: int
    claimed_at: datetime
    run_id: str | None  # None until its run began
    worker: str  # its name, '?' when the worker row is gone


def running_job(conn: psycopg.Connection, state_id: str) -> RunningJob | None:
    """The live fleet job refreshing the state now (its lease not expired), with its worker."""
    return conn.cursor(row_factory=class_row(RunningJob)).execute(
        "SELECT j.id, j.claimed_at, j.refresh_run_id::text AS run_id, coalesce(w.name, '?') AS worker "
        "FROM fleet_jobs j LEFT JOIN fleet_workers w ON w.id = j.claimed_by "
        "WHERE j.state_id = %s AND j.status = 'running' AND j.lease_expires_at >= now()", (state_id,)).fetchone()


# Finished jobs are history for `kl fleet status` (lag, last errors); a day of it is kept.
KEEP_FINISHED = "1 day"


def prune(conn: psycopg.Connection) -> None:
    with conn.transaction():
        conn.execute(f"DELETE FROM fleet_jobs WHERE finished_at < now() - interval '{KEEP_FINISHED}' "
                     "AND status NOT IN ('queued', 'running')")
        conn.execute(f"DELETE FROM fleet_workers w WHERE heartbeat_at < now() - interval '{KEEP_FINISHED}' "
                     "AND NOT EXISTS (SELECT 1 FROM fleet_jobs j WHERE j.claimed_by = w.id)")


def live_workers(conn: psycopg.Connection) -> int:
    """Workers heartbeating within their lease (running or draining): without one, no schedule fires."""
    row = conn.execute(f"SELECT count(*) FROM fleet_workers w WHERE w.status <> 'stopped' AND {_ALIVE}").fetchone()
    return int(row[0]) if row else 0


_PRUNE_WORKERS = f"""
DELETE FROM fleet_workers w
WHERE NOT {_ALIVE} AND w.heartbeat_at < now() - make_interval(secs => %s)
  AND NOT EXISTS {_HOLDS_A_JOB}
RETURNING w.id, w.name, w.host, w.pid, w.status, w.heartbeat_at
"""


class PrunedWorker(TypedDict):
    id: int
    name: str
    host: str
    pid: int
    status: str
    heartbeat_at: datetime


def prune_workers(conn: psycopg.Connection, older_than_s: float) -> list[PrunedWorker]:
    """``kl fleet prune``: delete the workers that are gone (stopped, or no heartbeat within their
    lease) whose last heartbeat is older than OLDER_THAN_S, oldest first. A lost worker still
    holding a running job stays until a worker takes the job over: the take-over names it."""
    with conn.transaction():
        rows = conn.cursor(row_factory=class_row(PrunedWorker)).execute(_PRUNE_WORKERS, (older_than_s,)).fetchall()
    return sorted(rows, key=lambda r: (r["heartbeat_at"], r["id"]))


# ---------------------------------------------------------------- fleet status

_WORKERS = f"""
SELECT w.id, w.name, w.host, w.pid, w.status, w.parallel_states, w.lease_s, w.started_at, w.heartbeat_at,
       {_ALIVE} AS alive,
       coalesce((SELECT json_agg(json_build_object('state', {_JOB_LABEL}, 'since', j.claimed_at, 'job', j.id,
                                                    'run_id', coalesce(j.refresh_run_id, j.discovery_run_id))
                                  ORDER BY {_JOB_LABEL})
                 FROM fleet_jobs j LEFT JOIN states s ON s.id = j.state_id
                 WHERE j.claimed_by = w.id AND j.status = 'running'), '[]') AS running
FROM fleet_workers w
WHERE (w.status <> 'stopped' OR w.stopped_at > now() - interval '{SHOW_STOPPED}')
  AND ({_ALIVE} OR w.heartbeat_at > now() - interval '{SHOW_LOST}' OR EXISTS {_HOLDS_A_JOB})
ORDER BY w.started_at
"""
# A take-over fails the dead worker's run but queues its job again, which then succeeds: counted by
# the jobs' outcomes alone, those runs were missing from the last hour. Each claim that ended in a
# take-over is one attempt the job kept (a requeue for a busy state or a shutdown gives its attempt
# back): a queued job's attempts, and all but the current or last one of a claimed or finished job
# (a job failed by its last take-over counts among the failed jobs already). They are counted
# where the job's latest event (requeued, claimed, finished) falls in the hour; fleet_jobs alone
# is read, as /metrics reads these figures at every scrape.
_TAKEN_OVER = """coalesce(sum(CASE WHEN status = 'queued' THEN attempts ELSE attempts - 1 END)
    FILTER (WHERE attempts > 0 AND coalesce(finished_at, claimed_at, due_at) > now() - interval '1 hour'), 0)::int"""
_QUEUE = f"""
SELECT count(*) FILTER (WHERE status = 'queued' AND due_at <= now())::int AS due,
       count(*) FILTER (WHERE status = 'queued' AND due_at > now())::int AS upcoming,
       count(*) FILTER (WHERE status = 'running')::int AS running,
       extract(epoch FROM now() - min(due_at) FILTER (WHERE status = 'queued' AND due_at <= now()))::float AS lag_s,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - due_at))
        FROM fleet_jobs WHERE claimed_at > now() - interval '1 hour')::float AS claim_lag_p50_s,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - due_at))
        FROM fleet_jobs WHERE claimed_at > now() - interval '1 hour')::float AS claim_lag_p99_s,
       count(*) FILTER (WHERE status = 'succeeded' AND finished_at > now() - interval '1 hour')::int AS succeeded_1h,
       count(*) FILTER (WHERE status = 'failed' AND finished_at > now() - interval '1 hour')::int AS failed_jobs_1h,
       {_TAKEN_OVER} AS taken_over_1h
FROM fleet_jobs
"""

_ERRORS = f"""
SELECT {_JOB_LABEL} AS state, j.finished_at AS at, j.error, coalesce(j.refresh_run_id, j.discovery_run_id)::text AS run_id,
       coalesce(w.name, '-') AS worker
FROM fleet_jobs j LEFT JOIN states s ON s.id = j.state_id LEFT JOIN fleet_workers w ON w.id = j.claimed_by
WHERE j.status = 'failed'
ORDER BY j.finished_at DESC LIMIT %s
"""


class _QueueRow(TypedDict):
    due: int
    upcoming: int
    running: int
    lag_s: float | None  # since the oldest due job was due; None: none is due
    claim_lag_p50_s: float | None  # due to claimed, over the last hour
    claim_lag_p99_s: float | None
    succeeded_1h: int
    failed_jobs_1h: int
    taken_over_1h: int


class QueueFigures(_QueueRow):
    failed_1h: int


class WorkerRow(TypedDict):
    """A worker as `kl fleet status` shows it, with what it runs now (JSON: state, since, job, run_id)."""

    id: int
    name: str
    host: str
    pid: int
    status: str
    parallel_states: int
    lease_s: float
    started_at: datetime
    heartbeat_at: datetime
    alive: bool
    running: list[dict[str, Any]]


class FleetError(TypedDict):
    state: str  # the state, or the discovery a job ran
    at: datetime
    error: str | None
    run_id: str | None
    worker: str


class FleetStatus(TypedDict):
    now: datetime
    workers: list[WorkerRow]
    queue: QueueFigures
    errors: list[FleetError]
    provider_limits: list[dict[str, Any]]  # the limit, its slots and their holders, as printed


def queue_figures(conn: psycopg.Connection) -> QueueFigures:
    """Queue depth and lag, as `kl fleet status` shows them (and /metrics exports them). failed_1h
    counts the failed jobs and the runs failed by a take-over (taken_over_1h of them)."""
    row = conn.cursor(row_factory=class_row(_QueueRow)).execute(_QUEUE).fetchone()
    assert row is not None  # an aggregate: always one row
    return QueueFigures(**row, failed_1h=row["failed_jobs_1h"] + row["taken_over_1h"])


def status(conn: psycopg.Connection, errors: int = 10) -> FleetStatus:
    """What `kl fleet status` shows, from one snapshot: workers, queue, last errors, and each
    fleet-wide provider limit with the slots leased now and by whom."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        workers = conn.cursor(row_factory=class_row(WorkerRow)).execute(_WORKERS).fetchall()
        queue = queue_figures(conn)
        last_errors = conn.cursor(row_factory=class_row(FleetError)).execute(_ERRORS, (errors,)).fetchall()
        now_row = conn.execute("SELECT now()").fetchone()
        usage = provider_limits.usage(conn)
        held = provider_limits.holders(conn)
    assert now_row is not None
    limits = [{"source": u.source, "alias": u.alias, "max_in_flight": u.max_in_flight, "leased": u.held,
               "wanted": u.wanted,
               "holders": [{"holder": h.holder, "worker": h.worker, "slots": h.slots, "wanted": h.wanted,
                            "expires_at": h.expires_at}
                           for h in held if (h.source, h.alias) == (u.source, u.alias)]}
              for u in usage]
    return FleetStatus(now=now_row[0], workers=workers, queue=queue, errors=last_errors, provider_limits=limits)
