"""The fleet's queue in the store (kilolock.store.fleet), in process against real PostgreSQL: leases,
take-over of a dead worker's job, fencing of its late commit, and schedule firing."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.fleet.worker import next_run
from kilolock.refresh.commit import commit_refresh, record_observation
from kilolock.store import fleet, locks, refresh_runs, states, versions, writes
from kit.states import build_state


def _state(conn: psycopg.Connection, name: str) -> str:
    raw = build_state(1, {"a": {"id": "a", "triggers": None}}, lineage=f"l-{name}")
    writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="test")
    return states.state_id(conn, name)


def test_a_dead_workers_job_is_taken_over_and_its_run_ends_at_the_last_heartbeat(conn, db_url):
    sid = _state(conn, "s")
    fleet.enqueue_now(conn, "s")
    worker, _ = fleet.register_worker(conn, "dead", 1, 30.0)
    [job] = fleet.claim(conn, worker, 5, 30.0)
    with psycopg.connect(db_url, autocommit=True) as run_conn:  # the worker's run, then its process dies
        current = versions.current_version(run_conn, sid)
        assert current is not None
        refresh_runs.mark_fleet_job(run_conn, job.id)  # as the worker does: begin() links the run to the job
        run_id = refresh_runs.begin(run_conn, sid, current.id, "dead@worker")
        assert fleet.heartbeat(conn, worker, 30.0, [job.id], "running") == {job.id}
    assert conn.execute("SELECT refresh_run_id::text FROM fleet_jobs").fetchone() == (run_id,)
    assert fleet.recover_expired(conn, 3) == []  # the lease has not run out
    # Time passes: the run began a minute ago, the last heartbeat was 40 s ago, the lease ran out.
    conn.execute("UPDATE refresh_runs SET started_at = now() - interval '60 seconds'")
    conn.execute("UPDATE fleet_jobs SET heartbeat_at = now() - interval '40 seconds', "
                 "lease_expires_at = now() - interval '10 seconds'")
    beat = conn.execute("SELECT heartbeat_at FROM fleet_jobs").fetchone()[0]
    assert fleet.recover_expired(conn, 3) == [(job.id, "requeued")]
    status, finished, error = conn.execute("SELECT status, finished_at, error_summary FROM refresh_runs WHERE id = %s",
                                           (run_id,)).fetchone()
    assert status == "failed" and finished == beat
    assert error.startswith("worker dead stopped heartbeating")
    assert conn.execute("SELECT status, attempts, claimed_by FROM fleet_jobs").fetchall() == [("queued", 1, None)]
    # The dead process's late outcome does not overwrite what the take-over wrote.
    refresh_runs.finish(conn, run_id, status="succeeded", checked=1, changed=0, failed=0, error_summary=None,
                        to_version_id=None)
    assert conn.execute("SELECT status FROM refresh_runs WHERE id = %s", (run_id,)).fetchone() == ("failed",)
    # The third claim that dies too fails the job rather than looping forever.
    for _ in range(2):
        [job] = fleet.claim(conn, worker, 5, 30.0)
        conn.execute("UPDATE fleet_jobs SET lease_expires_at = now() - interval '1 second'")
        fleet.recover_expired(conn, 3)
    assert conn.execute("SELECT status, attempts FROM fleet_jobs").fetchall() == [("failed", 3)]


def _shift_job(conn: psycopg.Connection, seconds: int) -> None:
    """Move the job's heartbeat and lease by SECONDS: time passing (negative), or a beat to come."""
    conn.execute("UPDATE fleet_jobs SET heartbeat_at = heartbeat_at + make_interval(secs => %(s)s), "
                 "lease_expires_at = lease_expires_at + make_interval(secs => %(s)s)", {"s": seconds})


def test_beginning_the_run_renews_the_lease_with_the_heartbeat_it_records(conn, db_url):
    """The run's begin counts as the job's heartbeat: the job is taken over a whole lease after it,
    never sooner, whatever was left of the lease before; and a later beat is never moved back."""
    sid = _state(conn, "s")
    current = versions.current_version(conn, sid)
    assert current is not None
    fleet.enqueue_now(conn, "s")
    worker, _ = fleet.register_worker(conn, "w", 1, 30.0)
    [job] = fleet.claim(conn, worker, 1, 30.0)
    _shift_job(conn, -20)  # claimed 20 s ago: 10 s of the lease left when the run begins
    with psycopg.connect(db_url, autocommit=True) as run_conn:
        refresh_runs.mark_fleet_job(run_conn, job.id)
        run_id = refresh_runs.begin(run_conn, sid, current.id, "w")
    beat, expires, started = conn.execute(
        "SELECT j.heartbeat_at, j.lease_expires_at, rr.started_at FROM fleet_jobs j "
        "JOIN refresh_runs rr ON rr.id = j.refresh_run_id").fetchone()
    assert (beat, expires) == (started, started + timedelta(seconds=30))
    _shift_job(conn, -15)  # 15 s since the run began, no heartbeat since: half the lease left
    assert fleet.recover_expired(conn, 3) == []

    # A heartbeat committed after the begin's transaction started (it waited for the state's begin
    # lock) stays as it is.
    refresh_runs.finish(conn, run_id, status="succeeded", checked=1, changed=0, failed=0, error_summary=None,
                        to_version_id=None)
    _shift_job(conn, 60)
    later = conn.execute("SELECT heartbeat_at, lease_expires_at FROM fleet_jobs").fetchone()
    with psycopg.connect(db_url, autocommit=True) as run_conn:
        refresh_runs.mark_fleet_job(run_conn, job.id)
        refresh_runs.begin(run_conn, sid, current.id, "w")
    assert conn.execute("SELECT heartbeat_at, lease_expires_at FROM fleet_jobs").fetchone() == later


def test_a_fleet_run_and_a_plain_run_of_one_state_never_begin_together(conn, db_url):
    sid = _state(conn, "s")
    current = versions.current_version(conn, sid)
    assert current is not None
    with psycopg.connect(db_url, autocommit=True) as plain:
        plain_run = refresh_runs.begin(plain, sid, current.id, "first@cli")  # a live kl refresh
        fleet.enqueue_now(conn, "s")
        worker, _ = fleet.register_worker(conn, "w", 1, 30.0)
        [job] = fleet.claim(conn, worker, 1, 30.0)
        with psycopg.connect(db_url, autocommit=True) as work:
            refresh_runs.mark_fleet_job(work, job.id)
            with pytest.raises(refresh_runs.StateBusy, match=f"run {plain_run}"):
                refresh_runs.begin(work, sid, current.id, "w")  # the worker's run beside it: refused
    with psycopg.connect(db_url, autocommit=True) as work:  # the plain run's process is gone: no longer live
        refresh_runs.mark_fleet_job(work, job.id)
        worker_run = refresh_runs.begin(work, sid, current.id, "w")
        with pytest.raises(refresh_runs.StateBusy, match="being refreshed now by worker w"):
            refresh_runs.begin(conn, sid, current.id, "someone@cli")  # a plain run beside the worker's: refused
    assert conn.execute("SELECT refresh_run_id::text FROM fleet_jobs").fetchone() == (worker_run,)


def test_two_plain_runs_of_one_state_never_begin_together(conn, db_url):
    sid = _state(conn, "s")
    current = versions.current_version(conn, sid)
    assert current is not None
    with psycopg.connect(db_url, autocommit=True) as first:
        first_run = refresh_runs.begin(first, sid, current.id, "first@cli")
        with pytest.raises(refresh_runs.StateBusy, match=f"being refreshed now by run {first_run} \\(first@cli\\)"):
            refresh_runs.begin(conn, sid, current.id, "second@cli")
        assert refresh_runs.live_run(conn, sid) is not None
    # The first run's process is gone (its liveness lock with it, once its backend has exited):
    # the next run may begin.
    deadline = time.monotonic() + 10
    while refresh_runs.live_run(conn, sid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert refresh_runs.live_run(conn, sid) is None
    refresh_runs.begin(conn, sid, current.id, "second@cli")
    assert conn.execute("SELECT count(*) FROM refresh_runs WHERE state_id = %s", (sid,)).fetchone() == (2,)


def test_a_taken_over_run_does_not_commit(conn):
    """Fencing: a worker cut off past its lease comes back and tries to commit."""
    sid = _state(conn, "s")
    current = versions.current_version(conn, sid)
    assert current is not None
    run_id = refresh_runs.begin(conn, sid, current.id, "zombie")
    conn.execute("UPDATE refresh_runs SET status = 'failed', finished_at = now() WHERE id = %s", (run_id,))
    parser = tfstate.ExactJSON()
    doc = parser.loads(versions.raw_state_text(conn, "s"))
    doc["serial"] = 2
    with pytest.raises(KlError, match="finished meanwhile"):
        commit_refresh(conn, "s", sid, tfstate.parse_state(doc), parser, current, "zombie", run_id, set())
    assert [v.serial for v in versions.list_versions(conn, "s")] == [1]
    assert locks.current(conn, sid) is None


@pytest.mark.parametrize("same_as_base", [True, False], ids=["confirmation", "difference"])
def test_a_taken_over_run_records_no_observation(conn, same_as_base):
    """Fencing, for what a refresh writes by default: a worker cut off past its lease comes back and
    tries to record its observation (one that found nothing different, or one that did)."""
    sid = _state(conn, "s")
    current = versions.current_version(conn, sid)
    assert current is not None
    run_id = refresh_runs.begin(conn, sid, current.id, "zombie")
    conn.execute("UPDATE refresh_runs SET status = 'failed', finished_at = now() WHERE id = %s", (run_id,))
    parser = tfstate.ExactJSON()
    doc = parser.loads(versions.raw_state_text(conn, "s"))
    touched = set()
    if not same_as_base:
        doc["resources"][0]["instances"][0]["attributes"]["triggers"] = {"changed": "out of band"}
        touched = {("null_resource.a", "")}
    with pytest.raises(KlError, match="finished meanwhile .*; observation not recorded"):
        record_observation(conn, "s", sid, tfstate.parse_state(doc), parser, current, "zombie", run_id, touched,
                           same_as_base=same_as_base)
    assert [(v.serial, v.kind) for v in versions.list_versions(conn, "s")] == [(1, "terraform")]
    assert conn.execute("SELECT count(*) FROM observed_objects").fetchone() == (0,)
    assert locks.current(conn, sid) is None
    # The run that is still its own records it.
    live = refresh_runs.begin(conn, sid, current.id, "alive")
    observed = record_observation(conn, "s", sid, tfstate.parse_state(doc), parser, current, "alive", live, touched,
                                  same_as_base=same_as_base)
    assert (observed.version.kind, observed.version.label) == ("observation", "v1.1")


def test_a_schedule_missed_many_times_fires_once_and_keeps_its_grid(conn, db_url):
    _state(conn, "a")
    _state(conn, "b")
    start = datetime.now(timezone.utc) - timedelta(hours=10, minutes=20)
    sched = fleet.add_schedule(conn, "*", every_s=3600.0, cron=None, jitter_s=0.0, first_run_at=start, actor="t")
    assert fleet.enqueue_due_schedules(conn, next_run) == 2
    [sc] = fleet.list_schedules(conn)
    assert sc.id == sched and start + timedelta(hours=11) == sc.next_run_at  # the first grid point after now
    assert fleet.enqueue_due_schedules(conn, next_run) == 0  # not due again
    # Fired again while both are still queued: nothing doubles.
    conn.execute("UPDATE fleet_schedules SET next_run_at = now() - interval '1 second'")
    assert fleet.enqueue_due_schedules(conn, next_run) == 0
    assert conn.execute("SELECT count(*) FROM fleet_jobs").fetchone() == (2,)


def test_two_workers_firing_at_once_queue_each_state_once(conn, db_url):
    for n in range(20):
        _state(conn, f"s{n}")
    fleet.add_schedule(conn, "**", every_s=60.0, cron=None, jitter_s=0.0,
                       first_run_at=datetime.now(timezone.utc) - timedelta(seconds=1), actor="t")
    with psycopg.connect(db_url, autocommit=True) as other:
        with conn.transaction():  # one worker holds the schedule row mid-firing...
            conn.execute("SELECT 1 FROM fleet_schedules FOR UPDATE")
            assert fleet.enqueue_due_schedules(other, next_run) == 0  # ...the other skips it, does not wait
        assert fleet.enqueue_due_schedules(conn, next_run) == 20
        assert fleet.enqueue_due_schedules(other, next_run) == 0
    worker_a, _ = fleet.register_worker(conn, "a", 8, 30.0)
    worker_b, _ = fleet.register_worker(conn, "b", 8, 30.0)
    got = fleet.claim(conn, worker_a, 8, 30.0) + fleet.claim(conn, worker_b, 8, 30.0) + fleet.claim(conn, worker_a, 8, 30.0)
    assert len(got) == 20 and len({j.id for j in got}) == 20


def test_kl_runs_stale_ends_a_dead_workers_run_at_its_last_heartbeat(conn, db_url):
    sid = _state(conn, "s")
    current = versions.current_version(conn, sid)
    assert current is not None
    fleet.enqueue_now(conn, "s")
    worker, _ = fleet.register_worker(conn, "w", 1, 30.0)
    [job] = fleet.claim(conn, worker, 1, 30.0)
    with psycopg.connect(db_url, autocommit=True) as work:  # the worker's run; then its process dies
        refresh_runs.mark_fleet_job(work, job.id)
        run_id = refresh_runs.begin(work, sid, current.id, "w")
    conn.execute("UPDATE refresh_runs SET started_at = now() - interval '30 seconds'")
    conn.execute("UPDATE fleet_jobs SET heartbeat_at = now() - interval '20 seconds'")
    assert refresh_runs.finish_stale(conn, sid, "t") == [run_id]
    assert conn.execute("SELECT rr.finished_at = j.heartbeat_at FROM refresh_runs rr JOIN fleet_jobs j "
                        "ON j.refresh_run_id = rr.id").fetchone() == (True,)


@pytest.mark.parametrize("error", ["bug", "lost"])
def test_a_worker_tells_a_bug_in_a_run_from_a_lost_database(conn, monkeypatch, error) -> None:
    """A psycopg error without SQLSTATE is a bug (a wrong query, a misused adapter) unless the
    connection is broken. The worker judged it after closing the job's connection, when any
    connection looks lost, and so reported bugs as a lost database and recorded nothing."""
    from datetime import datetime, timezone

    import psycopg

    from kilolock.fleet import worker as fleet_worker
    from kilolock.fleet.worker import Worker, WorkerConfig, _InFlight
    from kilolock.refresh.options import RefreshOverrides
    from kilolock.store import fleet as store_fleet

    def failing(job_conn, *args, **kwargs):
        if error == "lost":
            job_conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        raise psycopg.ProgrammingError("the query has 2 placeholders but 1 parameters were passed")

    monkeypatch.setattr(fleet_worker, "refresh_or_fail", failing)
    said: list[str] = []
    recorded: list[str] = []
    worker = Worker(conn, WorkerConfig(warm_providers=0), RefreshOverrides(), say=said.append)
    monkeypatch.setattr(worker, "_record_internal_error", lambda job, message: recorded.append(message))
    job = store_fleet.Job(id=1, state_id="00000000-0000-0000-0000-000000000000", state="s",
                          due_at=datetime.now(timezone.utc), attempts=1)
    worker._run_job(_InFlight(job))
    assert worker.failed == 1
    if error == "bug":
        assert recorded == ["internal error: ProgrammingError: the query has 2 placeholders but 1 parameters were passed"]
        assert not said
    else:
        assert not recorded and len(said) == 1 and said[0].startswith("kl worker ") and ": s: " in said[0], said


def test_a_signal_during_the_main_threads_own_event_set_cannot_deadlock_the_worker(conn):
    # A second SIGTERM ran its handler inside the first one's Event.set() on the main thread, and
    # the handler's own set() waited for the lock that thread already held: the worker never exited.
    # The handler now only notes the request; here another thread stands in for the reentry.
    import threading

    from kilolock.fleet.worker import Worker, WorkerConfig
    from kilolock.refresh.options import RefreshOverrides

    worker = Worker(conn, WorkerConfig(name="reentry", warm_providers=0), RefreshOverrides(), say=lambda _t: None)
    noted = threading.Event()

    def handler() -> None:
        worker.request_stop("SIGTERM")
        noted.set()

    with worker._stopping._cond, worker._wake._cond:  # type: ignore[attr-defined] # as inside Event.set() of the main thread
        threading.Thread(target=handler, daemon=True).start()
        assert noted.wait(5), "request_stop waited for a lock a signal handler may already hold"
    assert worker._stop_requested == "SIGTERM" and not worker._stopping.is_set()
