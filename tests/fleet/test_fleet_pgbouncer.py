"""The fleet through a real PgBouncer in transaction pooling mode (issue 13), told so with
`kl_pooler=transaction`: no prepared statement, no session advisory lock, no session setting is
relied on; a run's liveness is its heartbeat. Three pooled server connections for every client,
so consecutive transactions of one kl process land on different server connections."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from kit import breakcommit, pgbouncer
from kit.faults import install_fake
from kit.fleet import (
    LEASE,
    add_fake_state,
    add_states,
    assert_no_overlap,
    own_cluster,
    q,
    restart,
    runs_of,
    start_worker,
    stop,
    wait_for,
)
from kit.invariants import reindex_mismatches, version_problems
from kit.kl import kl_cmd, kl_env
from kit.procs import assert_no_new_providers, provider_pids


@pytest.fixture(autouse=True)
def no_orphan_providers() -> Iterator[None]:
    before = provider_pids()
    yield
    assert_no_new_providers(before)


@pytest.fixture
def pooled_url(bouncer: str, db_url: str) -> str:
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    return bouncer.format(dbname=dbname) + " kl_pooler=transaction"


def kl_pooled(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(kl_cmd(*args), env=kl_env(KL_DATABASE_URL=url), capture_output=True, timeout=timeout)


def test_workers_and_refreshes_through_a_transaction_pooler(db_url, pooled_url, tmp_path):
    names = [f"pool/s{n:02d}" for n in range(12)]
    add_states(db_url, names, instances=5)
    cache = install_fake(tmp_path, tmp_path / "events.log", FAKE_SLOW_SECONDS="4")
    add_fake_state(db_url, "slow/victim", cache)

    # Plain commands (each runs its queries more than psycopg's prepare threshold): no prepared
    # statement survives a transaction here, so one would fail with "prepared statement does not exist".
    for _ in range(3):
        r = kl_pooled(pooled_url, "refresh", "pool/s00")
        assert r.returncode == 0, r.stderr.decode()
    r = kl_pooled(pooled_url, "refresh", "--all", "--states", "pool/s0*", "--parallel-states", "3")
    assert r.returncode == 0, r.stderr.decode()

    workers = {n: start_worker(pooled_url, n, "--parallel-states", "2") for n in ("w1", "w2", "w3")}
    outputs: dict[str, str] = {}
    try:
        assert kl_pooled(pooled_url, "schedule", "run-now", "--states", "pool/*").returncode == 0
        wait_for("every job to succeed", lambda: q(
            db_url, "SELECT count(*) FROM fleet_jobs WHERE status = 'succeeded'")[0][0] == 12, timeout=90)

        # A worker's run of the slow state: a manual refresh is refused (the run is linked to its
        # job without a session setting), --stale leaves it alone (its heartbeat says it is alive).
        assert kl_pooled(pooled_url, "schedule", "run-now", "--states", "slow/victim").returncode == 0
        row = wait_for("the slow run to start", lambda: q(
            db_url, "SELECT w.name, j.id FROM fleet_jobs j JOIN fleet_workers w ON w.id = j.claimed_by "
                    "JOIN states s ON s.id = j.state_id WHERE s.name = 'slow/victim' AND j.status = 'running' "
                    "AND j.refresh_run_id IS NOT NULL"))
        victim, job_id = row[0]
        r = kl_pooled(pooled_url, "refresh", "slow/victim")
        assert r.returncode == 1 and f"worker {victim}" in r.stderr.decode(), r.stderr.decode()
        r = kl_pooled(pooled_url, "runs", "slow/victim", "--stale")
        assert r.returncode == 0 and "0 stale run(s)" in r.stderr.decode(), r.stderr.decode()

        # SIGKILL it: another worker takes the job over once the lease runs out.
        workers[victim].kill()
        outputs[victim] = workers.pop(victim).communicate()[0].decode()
        done = wait_for("the slow job to complete on another worker", lambda: q(
            db_url, "SELECT w.name FROM fleet_jobs j JOIN fleet_workers w ON w.id = j.claimed_by "
                    "WHERE j.id = %s AND j.status = 'succeeded'", (job_id,)), timeout=30 + LEASE)
        assert done[0][0] != victim
        assert [r[0] for r in runs_of(db_url, "slow/victim")] == ["failed", "succeeded"]
    finally:
        for name, w in workers.items():
            code, outputs[name] = stop(w)
            assert code == 0, outputs[name]
    assert_no_overlap(db_url)
    # Every run beat instead of holding a session lock, and none is left running.
    assert q(db_url, "SELECT count(*) FROM refresh_runs WHERE heartbeat_at IS NULL")[0][0] == 0
    assert q(db_url, "SELECT count(*) FROM refresh_runs WHERE status = 'running'")[0][0] == 0


def test_a_killed_pooled_refresh_is_stale_only_once_its_heartbeats_stop(db_url, pooled_url, tmp_path):
    from kilolock.store.refresh_runs import HEARTBEAT_STALE_S

    cache = install_fake(tmp_path, tmp_path / "events.log", FAKE_SLOW_SECONDS="60")
    add_fake_state(db_url, "slow/manual", cache)
    proc = subprocess.Popen(kl_cmd("refresh", "slow/manual"), env=kl_env(KL_DATABASE_URL=pooled_url),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for("the run to begin", lambda: runs_of(db_url, "slow/manual"))
        wait_for("a heartbeat", lambda: q(db_url, "SELECT 1 FROM refresh_runs WHERE heartbeat_at > started_at"))
        for _ in range(5):  # whichever server connection the probe lands on, the run is alive
            r = kl_pooled(pooled_url, "runs", "slow/manual", "--stale")
            assert "0 stale run(s)" in r.stderr.decode(), r.stderr.decode()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    r = kl_pooled(pooled_url, "runs", "slow/manual", "--stale")
    assert "0 stale run(s)" in r.stderr.decode()  # its last beat is recent
    wait_for("the run to be found stale", lambda: "1 stale run(s)" in kl_pooled(
        pooled_url, "runs", "slow/manual", "--stale").stderr.decode(), timeout=HEARTBEAT_STALE_S + 15, every=1.0)
    # Not before HEARTBEAT_STALE_S past its last beat, both read on the database's clock (the run
    # is marked failed in the transaction that finds it stale): the time since the kill, on this
    # process's clock, depends on when the last beat happened to come before it.
    [(status, stale_after)] = q(db_url, "SELECT rr.status, rr.finished_at - rr.heartbeat_at FROM refresh_runs rr "
                                        "JOIN states s ON s.id = rr.state_id WHERE s.name = 'slow/manual'")
    assert status == "failed" and stale_after >= timedelta(seconds=HEARTBEAT_STALE_S), stale_after


def test_a_bad_pooler_value_is_one_line(db_url, pooled_url):
    r = kl_pooled(pooled_url.replace("kl_pooler=transaction", "kl_pooler=statement"), "state", "list")
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1
    assert "kl_pooler= in the connection string: 'statement' is not one of transaction, none" in r.stderr.decode()


@pytest.mark.parametrize("error", ["DuplicatePreparedStatement", "InvalidSqlStatementName"])
def test_an_undeclared_transaction_pooler_is_named_with_what_to_change(monkeypatch, capsys, error):
    """What psycopg's prepared statements run into behind an undeclared transaction pooler (two
    clients' statements meet on one server connection, or one's is gone from the next)."""
    from kilolock import cli
    from kilolock.cli import statecmd

    def broken(_args: object, _context: object) -> int:
        raise getattr(psycopg.errors, error)('prepared statement "_pg3_0" already exists')

    monkeypatch.setattr(statecmd, "run_list", broken)
    assert cli.main(["state", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "transaction pooler" in err and "kl_pooler=transaction" in err, err


def test_a_pooled_run_beats_instead_of_locking_and_stops_beating_when_its_finish_fails(db_url, monkeypatch):
    from kilolock.store import db, refresh_runs, states

    add_states(db_url, ["beat/a"], instances=1)
    monkeypatch.setenv(db.POOLER_ENV, "transaction")
    conn = db.connect(db_url)
    sid = states.state_id(conn, "beat/a")
    version = q(db_url, "SELECT id FROM state_versions WHERE state_id = %s", (sid,))[0][0]
    run_id = refresh_runs.begin(conn, sid, str(version), "test")
    assert q(db_url, "SELECT heartbeat_at IS NOT NULL FROM refresh_runs WHERE id = %s", (run_id,))[0][0]
    assert q(db_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0] == 0  # no session lock
    assert run_id in refresh_runs._heartbeats._runs
    assert refresh_runs.dead_runs(conn, sid) == []  # alive: its beat is fresh
    conn.close()  # the connection is lost before the run can finish
    with pytest.raises(psycopg.OperationalError):
        refresh_runs.finish(conn, run_id, status="failed", checked=0, changed=0, failed=0, error_summary="x",
                            to_version_id=None)
    assert run_id not in refresh_runs._heartbeats._runs  # found dead once its last beat is old


@pytest.fixture
def pooled_cluster() -> Iterator[tuple[object, str]]:
    with own_cluster("kl-pgbrs-") as cluster_and_url:
        yield cluster_and_url


def _output(logs: list[Path]) -> list[str]:
    return [p.read_text(errors="replace") for p in logs]


def test_pooled_workers_go_on_after_a_postgresql_restart(pooled_cluster, tmp_path):
    """With PgBouncer's default server_login_retry (15 s): a server login fails while PostgreSQL
    restarts, and PgBouncer then refuses every client for 15 s. Each worker goes on within that
    window plus its retry backoff's cap once PostgreSQL is back."""
    from kilolock.fleet.worker import DB_RETRY_MAX_S

    cluster, url = pooled_cluster
    pgbouncer.require()
    names = [f"rs/s{n}" for n in range(10)]
    add_states(url, names, instances=3)
    logs = [tmp_path / f"w{n}.log" for n in (1, 2, 3)]
    with pgbouncer.pgbouncer(url) as template:
        pooled = template.format(dbname="fleet") + " kl_pooler=transaction"
        assert kl_pooled(pooled, "schedule", "set", "--states", "rs/*", "--every", "3s").returncode == 0
        workers = [start_worker(pooled, log.stem, "--parallel-states", "2", log=log) for log in logs]
        try:
            def refreshed_since(since: datetime) -> bool:
                rows = q(url, "SELECT count(DISTINCT state_id) FROM refresh_runs WHERE status = 'succeeded' "
                              "AND started_at > %s", (since,))
                return bool(rows[0][0] == len(names))
            wait_for("a first round", lambda: refreshed_since(datetime(2000, 1, 1, tzinfo=timezone.utc)), timeout=60)
            # Mid-fleet: runs are open and PgBouncer's server connections all die under it.
            wait_for("a run in flight", lambda: q(url, "SELECT count(*) FROM refresh_runs WHERE status = 'running'")[0][0] > 0,
                     timeout=20, every=0.02)
            restart(cluster)
            back = datetime.now(timezone.utc)
            # Every worker claims and finishes a job again: the pooler's refusal window, the
            # backoff's cap, and room for a run or two on a busy machine (not a measurement).
            bound = pgbouncer.DEFAULT_SERVER_LOGIN_RETRY + DB_RETRY_MAX_S + 20
            wait_for("every worker to finish a job again", lambda: q(
                url, "SELECT count(DISTINCT claimed_by) FROM fleet_jobs WHERE status = 'succeeded' AND claimed_at > %s",
                (back,))[0][0] == len(workers), timeout=bound, every=0.3)
            wait_for("every state refreshed again after the restart", lambda: refreshed_since(back), timeout=60, every=0.3)
            assert all(w.poll() is None for w in workers), "a worker exited on the restart"
        finally:
            codes = [stop(w, signal.SIGTERM)[0] for w in workers]
    outputs = _output(logs)
    assert codes == [0, 0, 0], outputs
    assert not any("Traceback" in out or "internal error" in out for out in outputs), outputs
    assert q(url, "SELECT count(*) FROM refresh_runs WHERE status = 'running'") == [(0,)], outputs
    assert q(url, "SELECT count(*) FROM fleet_jobs WHERE status = 'running'") == [(0,)], outputs
    assert_no_overlap(url)
    for name in names:  # nothing half-written: every version parses and the lifecycle index matches it
        assert version_problems(url, name) == [] and reindex_mismatches(url, name) == []


@pytest.mark.parametrize("outage", ["postgresql stopped", "pooler hung"])
def test_pooled_workers_obey_sigterm_while_the_database_is_unreachable(pooled_cluster, tmp_path, outage):
    """SIGTERM with runs in flight and no database: PostgreSQL stopped (PgBouncer refuses every
    client), or PgBouncer itself not answering (SIGSTOP: what a network cut without a reset looks
    like; every database call hangs). Each worker exits 0 within its grace period plus the
    worker's exit budget; its runs are found dead and finished as failed once the database is back."""
    from kilolock.fleet.worker import EXIT_BUDGET_S

    cluster, url = pooled_cluster
    pgbouncer.require()
    cache = install_fake(tmp_path, tmp_path / "events.log", FAKE_SLOW_SECONDS="6")
    for n in range(4):
        add_fake_state(url, f"slow/s{n}", cache)
    grace = 2.0
    logs = [tmp_path / f"w{n}.log" for n in (1, 2)]
    with pgbouncer.pgbouncer(url) as template:
        pooled = template.format(dbname="fleet") + " kl_pooler=transaction"
        workers = [start_worker(pooled, log.stem, "--parallel-states", "2", "--grace", f"{grace:g}s", log=log)
                   for log in logs]
        stopped_pooler = False
        try:
            assert kl_pooled(pooled, "schedule", "run-now", "--states", "slow/*").returncode == 0
            wait_for("a run in flight on each worker", lambda: q(
                url, "SELECT count(DISTINCT claimed_by) FROM fleet_jobs WHERE status = 'running' "
                     "AND refresh_run_id IS NOT NULL")[0][0] == 2, timeout=60)
            if outage == "pooler hung":
                os.kill(pgbouncer.pid(template), signal.SIGSTOP)
                stopped_pooler = True
            else:
                cluster.stop()
            time.sleep(1.0)  # the workers' next calls meet the outage
            sent = time.monotonic()
            for w in workers:
                w.send_signal(signal.SIGTERM)
            codes = []
            for w in workers:  # a bound, not a measurement: a busy machine gets 20 s more
                codes.append(w.wait(timeout=max(1.0, sent + grace + EXIT_BUDGET_S + 20 - time.monotonic())))
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
            if stopped_pooler:
                os.kill(pgbouncer.pid(template), signal.SIGCONT)
    outputs = _output(logs)
    assert codes == [0, 0], outputs
    assert not any("Traceback" in out or "internal error" in out for out in outputs), outputs
    assert all("stopped (" in out for out in outputs), outputs
    if outage == "pooler hung":
        assert all("the database did not answer" in out for out in outputs), outputs
    if outage == "postgresql stopped":
        cluster.ensure_running()
    # Nothing half-written: the next worker finds the runs dead (their jobs' leases ran out) and
    # finishes them as failed, then refreshes the states again.
    cleaner = start_worker(url, "cleaner", "--parallel-states", "4")
    try:
        wait_for("the abandoned runs to be finished and the states refreshed", lambda: q(
            url, "SELECT count(*) FILTER (WHERE status = 'running'), count(DISTINCT state_id) "
                 "FILTER (WHERE status = 'succeeded') FROM refresh_runs") == [(0, 4)], timeout=90, every=0.3)
    finally:
        code, out = stop(cleaner)
    assert code == 0, out
    assert_no_overlap(url)
    for n in range(4):
        assert version_problems(url, f"slow/s{n}") == [] and reindex_mismatches(url, f"slow/s{n}") == []


def test_a_connection_broken_inside_a_transaction_behind_the_pooler_counts_as_lost(bouncer, db_url):
    """PgBouncer tells a client whose server connection died mid-transaction so and closes: psycopg's
    next own command (here SAVEPOINT) reads that error and the end of the stream at once and raises
    InternalError("received 2 results ..."), not OperationalError. kl must take it for a lost
    connection (a worker retries), not for a bug (it ended a worker with an internal error)."""
    from kilolock.store import db

    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(bouncer.format(dbname=dbname), autocommit=True, prepare_threshold=None) as conn:
        conn.execute("BEGIN")
        server_pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert server_pid is not None
        q(db_url, "SELECT pg_terminate_backend(%s)", server_pid)
        time.sleep(0.5)
        with pytest.raises(psycopg.Error) as caught, conn.transaction():
            conn.execute("SELECT 1")
        assert isinstance(caught.value, psycopg.InternalError) and "results from command" in str(caught.value)
        assert conn.broken and db.lost(caught.value, conn)
    with psycopg.connect(db_url, autocommit=True) as healthy:  # a query's own error is not a lost connection
        with pytest.raises(psycopg.Error) as failed:
            healthy.execute("SELECT 1/0")
        assert not db.lost(failed.value, healthy)


def test_a_bug_s_record_whose_new_connection_breaks_too_is_said_and_the_worker_goes_on(bouncer, db_url, tmp_path,
                                                                                       monkeypatch):
    """A run that ended in a bug is recorded on its job on a new connection. When that one breaks
    too (behind PgBouncer: InternalError "received 2 results" on its COMMIT, the same lost
    connection as an OperationalError), the worker says the error and goes on, the job left to its
    lease; the InternalError used to escape and end the run's thread with a traceback."""
    import threading

    from kilolock.fleet.worker import Worker, WorkerConfig
    from kilolock.refresh.options import RefreshOverrides
    from kilolock.store import db
    from kilolock.store import fleet as store_fleet

    arm, held, go = tmp_path / "arm", tmp_path / "held", tmp_path / "go"
    for var, path in ((breakcommit.ARM, arm), (breakcommit.HELD, held), (breakcommit.GO, go)):
        monkeypatch.setenv(var, str(path))
    monkeypatch.setattr(store_fleet, "finish_job", breakcommit.breaking(store_fleet.finish_job))
    monkeypatch.setenv(db.POOLER_ENV, "transaction")  # what kl_pooler= says, without setting it for the process
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    said: list[str] = []
    errors: list[BaseException] = []
    with db.connect(bouncer.format(dbname=dbname)) as conn:
        worker = Worker(conn, WorkerConfig(warm_providers=0), RefreshOverrides(), say=said.append)
        job = store_fleet.Job(id=1, state_id="00000000-0000-0000-0000-000000000000", state="bug/s",
                              due_at=datetime.now(timezone.utc), attempts=1)

        def record() -> None:
            try:
                worker._record_internal_error(job, "internal error: RuntimeError: boom")
            except BaseException as exc:  # noqa: BLE001 - what the run's thread would die of
                errors.append(exc)

        arm.touch()
        recorder = threading.Thread(target=record, daemon=True)
        recorder.start()
        pid = int(wait_for("the job's record to be held before its COMMIT", lambda: held.exists() and held.read_text()))
        q(db_url, "SELECT pg_terminate_backend(%s)", (pid,))
        wait_for("its server connection to end",
                 lambda: q(db_url, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == [(0,)])
        go.touch()
        recorder.join(timeout=60)
    assert not recorder.is_alive()
    assert errors == [], errors
    assert said == ["kl worker : bug/s: internal error: RuntimeError: boom"], said
