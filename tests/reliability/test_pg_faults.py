"""PostgreSQL faults during `kl refresh`: the connection cut between reads, cut while the commit
waits inside its transaction, and the server restarted mid-run. The fake provider's slow reads
(FAKE_EVENT_LOG says when they are in flight) hold the run open while the test breaks the database.

After every fault: no partial version, lifecycle rows equal a re-index of the stored versions,
no state lock left behind, the audit row finished (or left `running` and then finished by
`kl runs --stale`), one clear error line and a non-zero exit, and no provider process left."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
import pytest

from kit.faults import fake_state, last_run, newest_run, observations, serials
from kit.invariants import (
    event_count,
    kl_backends,
    reindex_mismatches,
    running_runs,
    state_locks,
    terminate_kl_backends,
    version_problems,
    wait_for,
)
from kit.kl import kl_cmd, kl_env
from kit.procs import marked_pids, session_mark, settle_orphans


@pytest.fixture(autouse=True)
def no_orphan_providers():
    before = marked_pids(session_mark())
    yield
    left = settle_orphans(before, session_mark())
    assert not left, f"provider processes outlived the test: {sorted(left)}"


def _start_refresh(cache: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(kl_cmd("refresh", "prod", "--provider-search-path", str(cache), "--format", "json", *extra),
                            env=kl_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, dict | None, str]:
    out, err = proc.communicate(timeout=timeout)
    try:
        doc = json.loads(out) if out.strip() else None
    except ValueError:
        doc = None
    return proc.returncode, doc, err.decode()


def _one_clear_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kl: "), f"want one 'kl: ...' line on stderr, got:\n{stderr}"
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    return lines[0]


def _assert_consistent(db_url: str, before: list[int]) -> None:
    after = serials(db_url)
    assert after == before or after == before + [before[-1] + 1], (before, after)
    assert version_problems(db_url, "prod") == []
    assert reindex_mismatches(db_url, "prod") == []
    assert state_locks(db_url) == [], "a refresh left the state locked"


def test_connection_cut_between_reads_is_carried_on_a_new_one(run_kl, db_url, fake_cache):
    """Nothing was sent on the connection since the run began, so nothing of it is uncertain: the
    run goes on on a new connection, its liveness taken there, and records what it read."""
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="3")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow", "fake_slow"])).returncode == 0
    before = serials(db_url)
    proc = _start_refresh(cache)
    wait_for(lambda: event_count(events, "read") >= 2, 30, "the reads to be in flight")
    assert kl_backends(db_url), "kl holds no database connection while it reads"
    assert terminate_kl_backends(db_url) >= 1
    code, doc, err = _finish(proc)
    assert code == 0 and "Traceback" not in err, err
    assert doc is not None and doc["status"] == "succeeded" and doc["observation"] == f"v{before[-1]}.1", doc
    status, summary, to_version, finished = last_run(db_url)
    assert status == "succeeded" and to_version is not None and finished is not None, summary
    _assert_consistent(db_url, before)
    assert serials(db_url) == before and observations(db_url) == [f"v{before[-1]}.1"]


def test_a_run_finished_as_stale_while_its_connection_was_lost_does_not_go_on(run_kl, db_url, fake_cache):
    """The run's connection is cut during its reads and, its liveness lock gone with it, `kl runs
    --stale` finishes it meanwhile: the run must not go on on a new connection and record on top
    of that (the state would have two outcomes of one run); it says why, in one line."""
    make, events = fake_cache
    # Reads long enough for the cut and `kl runs --stale` to come first on a loaded machine.
    cache = make(FAKE_SLOW_SECONDS="10")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow"])).returncode == 0
    before = serials(db_url)
    proc = _start_refresh(cache)
    wait_for(lambda: event_count(events, "read") >= 2, 30, "the reads to be in flight")
    assert terminate_kl_backends(db_url) >= 1
    wait_for(lambda: not kl_backends(db_url), 30, "the run's connection to end")
    r = run_kl("runs", "prod", "--stale")
    assert r.returncode == 0 and "1 stale run(s)" in r.stderr.decode(), r.stderr
    code, doc, err = _finish(proc)
    line = _one_clear_line(err)
    assert code == 1 and "was finished meanwhile by someone else" in line, line
    assert doc is not None and doc["status"] == "failed", doc
    status, summary, to_version, _ = last_run(db_url)
    assert (status, to_version) == ("failed", None) and summary.startswith("stale:"), summary  # the stale finish stands
    _assert_consistent(db_url, before)
    assert serials(db_url) == before and observations(db_url) == []


def _wait_blocked(db_url: str) -> str:
    """The statement kl's backend is waiting on a lock with (the commit blocked by the test)."""
    def blocked():
        with psycopg.connect(db_url, autocommit=True) as c:
            row = c.execute("SELECT query FROM pg_stat_activity WHERE datname = current_database()"
                            " AND application_name = 'kilolock' AND wait_event_type = 'Lock'").fetchone()
        return row[0] if row else None
    return wait_for(blocked, 30, "kl's commit to block on the test's lock")


# Where the commit is held: before its version row is written (the state row lock that
# every write of a version takes FOR UPDATE; FOR NO KEY UPDATE still lets the lock row's foreign key through),
# and after it (the lifecycle table, which the index updates once the version row is inserted).
BLOCKERS = {
    "before-version-row": ("SELECT 1 FROM states WHERE name = 'prod' FOR NO KEY UPDATE", "FOR UPDATE"),
    "after-version-row": ("LOCK TABLE resources IN SHARE MODE", "resources"),
}


@pytest.mark.parametrize("where", sorted(BLOCKERS))
def test_connection_cut_inside_the_commit(run_kl, db_url, fake_cache, where):
    """`kl refresh --commit`: the write of serial+1 under the state lock, cut while it waits."""
    blocker, blocked_on = BLOCKERS[where]
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="2")
    # fake_gone changes the state, so the commit has lifecycle rows to close.
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow", "fake_gone"])).returncode == 0
    assert run_kl("state", "set", "prod", "--workdir", str(cache)).returncode == 0  # a deletion commits only with one
    before = serials(db_url)
    proc = _start_refresh(cache, "--commit")
    wait_for(lambda: event_count(events, "read") >= 1, 30, "the reads to be in flight")
    with psycopg.connect(db_url) as holder:  # one open transaction holding the lock
        holder.execute(blocker)
        query = _wait_blocked(db_url)
        assert blocked_on in query, query
        with psycopg.connect(db_url, autocommit=True) as c:  # kl holds the state lock while it waits
            assert c.execute("SELECT operation FROM state_locks").fetchall() == [("OperationTypeRefresh",)]
        assert terminate_kl_backends(db_url) >= 1
        code, doc, err = _finish(proc)
        holder.rollback()
    line = _one_clear_line(err)
    assert code == 1 and "lost the database connection during the commit" in line and "nothing committed" in line, line
    assert doc is not None and doc["status"] == "failed" and doc["to_serial"] is None, doc
    status, summary, to_version, finished = last_run(db_url)
    assert (status, to_version) == ("failed", None) and finished is not None, summary
    _assert_consistent(db_url, before)
    assert serials(db_url) == before
    # The lock kl took for the commit was released on a fresh connection, as the audit trail shows.
    with psycopg.connect(db_url) as c:
        assert [e for (e,) in c.execute("SELECT event FROM lock_events ORDER BY created_at")] == ["lock", "unlock"]
    assert observations(db_url) == []
    # And the state is writable again: the next refresh commits.
    make(FAKE_SLOW_SECONDS="0")
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--allow-mass-removal", "--commit")
    assert r.returncode == 0, r.stderr
    assert serials(db_url) == before + [before[-1] + 1]
    assert reindex_mismatches(db_url, "prod") == []


# Where recording an observation is held: the state row it locks FOR UPDATE to read Terraform's
# current version and number the observation, and the observed objects it writes once its row is in.
OBSERVATION_BLOCKERS = {
    "before-observation-row": ("SELECT 1 FROM states WHERE name = 'prod' FOR NO KEY UPDATE", "FOR UPDATE"),
    "after-observation-row": ("LOCK TABLE observed_objects IN SHARE MODE", "observed_objects"),
}


@pytest.mark.parametrize("where", sorted(OBSERVATION_BLOCKERS))
def test_connection_cut_while_recording_the_observation(run_kl, db_url, fake_cache, where):
    """A refresh records an observation without the state lock; cut while it waits, nothing is
    recorded (a fresh connection looks), the run ends failed, and the next run records one."""
    blocker, blocked_on = OBSERVATION_BLOCKERS[where]
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="2")
    # fake_gone changes the state, so the observation has observed objects to write.
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow", "fake_gone"])).returncode == 0
    assert run_kl("state", "set", "prod", "--workdir", str(cache)).returncode == 0  # a deletion is recorded only with one
    before = serials(db_url)
    proc = _start_refresh(cache, "--allow-mass-removal")
    wait_for(lambda: event_count(events, "read") >= 1, 30, "the reads to be in flight")
    with psycopg.connect(db_url) as holder:
        holder.execute(blocker)
        query = _wait_blocked(db_url)
        assert blocked_on in query, query
        with psycopg.connect(db_url, autocommit=True) as c:  # an observation takes no state lock
            assert c.execute("SELECT operation FROM state_locks").fetchall() == []
        assert terminate_kl_backends(db_url) >= 1
        code, doc, err = _finish(proc)
        holder.rollback()
    line = _one_clear_line(err)
    assert code == 1 and "lost the database connection while recording the observation" in line, line
    assert "nothing recorded" in line, line
    assert doc is not None and doc["status"] == "failed" and (doc["to_serial"], doc["observation"]) == (None, None), doc
    status, summary, to_version, finished = last_run(db_url)
    assert (status, to_version) == ("failed", None) and finished is not None, summary
    _assert_consistent(db_url, before)
    assert serials(db_url) == before and observations(db_url) == []
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM observed_objects").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM drift_records").fetchone() == (0,)
    make(FAKE_SLOW_SECONDS="0")
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--allow-mass-removal", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["observation"] == f"v{before[-1]}.1"
    assert serials(db_url) == before and observations(db_url) == [f"v{before[-1]}.1"]
    assert reindex_mismatches(db_url, "prod") == []


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A PostgreSQL cluster of this module's own, which the tests stop and start (never the
    session's shared server)."""
    import os
    import shutil
    import tempfile

    from kilolock.store.embedded import EmbeddedCluster, EmbeddedError

    base = Path(tempfile.mkdtemp(prefix="kl-pgrestart-"))  # short: the unix socket path has a length limit
    os.chmod(base, 0o755)
    cluster = EmbeddedCluster(base / "pg")
    try:
        cluster.ensure_running()
    except EmbeddedError as exc:
        pytest.fail(f"cannot start a PostgreSQL cluster for the restart tests: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def restart_db(own_cluster):
    """A fresh migrated database on the module's own cluster; (cluster, url)."""
    import uuid

    name = f"kl_restart_{uuid.uuid4().hex[:10]}"
    own_cluster.ensure_running()
    with psycopg.connect(own_cluster.url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = own_cluster.url(name)
    r = subprocess.run(kl_cmd("db", "migrate"), env=kl_env(KL_DATABASE_URL=url), capture_output=True)
    assert r.returncode == 0, r.stderr
    yield own_cluster, url
    own_cluster.ensure_running()
    with psycopg.connect(own_cluster.url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _kl(url: str, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(kl_cmd(*args), env=kl_env(KL_DATABASE_URL=url), input=input, capture_output=True, timeout=120)


def test_server_restarted_during_the_reads(restart_db, fake_cache):
    cluster, url = restart_db
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="6")
    assert _kl(url, "state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow", "fake_slow"])).returncode == 0
    before = serials(url)
    proc = subprocess.Popen(kl_cmd("refresh", "prod", "--provider-search-path", str(cache), "--format", "json"),
                            env=kl_env(KL_DATABASE_URL=url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: event_count(events, "read") >= 2, 30, "the reads to be in flight")
    cluster.stop()
    cluster.ensure_running()
    assert proc.poll() is None, "the refresh ended before the restart finished; the reads were meant to outlast it"
    code, doc, err = _finish(proc)
    # The run goes on on a new connection to the restarted server (nothing of it was uncertain).
    assert code == 0 and "Traceback" not in err, err
    assert doc is not None and doc["status"] == "succeeded" and doc["observation"] == f"v{before[-1]}.1", doc
    status, summary, to_version, finished = last_run(url)
    assert status == "succeeded" and to_version is not None and finished is not None, summary
    _assert_consistent(url, before)
    assert running_runs(url) == []
    # The restarted server serves the next refresh as if nothing happened.
    make(FAKE_SLOW_SECONDS="0")
    assert _kl(url, "refresh", "prod", "--provider-search-path", str(cache)).returncode == 0
    assert serials(url) == before and observations(url) == [f"v{before[-1]}.1", f"v{before[-1]}.2"]
    assert reindex_mismatches(url, "prod") == [] and version_problems(url, "prod") == []


def test_server_down_at_the_end_leaves_a_running_row_that_runs_stale_finishes(restart_db, fake_cache):
    cluster, url = restart_db
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="2")
    assert _kl(url, "state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow"])).returncode == 0
    before = serials(url)
    # No waiting for the server to come back (KL_DATABASE_RECONNECT_WAIT): it stays down until kl gave up.
    proc = subprocess.Popen(kl_cmd("refresh", "prod", "--provider-search-path", str(cache), "--format", "json"),
                            env=kl_env(KL_DATABASE_URL=url, KL_DATABASE_RECONNECT_WAIT="0s"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: event_count(events, "read") >= 1, 30, "the reads to be in flight")
    cluster.stop()
    try:
        code, _, err = _finish(proc)  # the server stays down until kl has given up
    finally:
        cluster.ensure_running()
    line = _one_clear_line(err)
    assert code == 1 and "lost the database connection" in line and "kl runs prod --stale" in line, line
    assert len(running_runs(url)) == 1, "the audit row should be left running: nothing could finish it"
    r = _kl(url, "runs", "prod", "--stale", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert running_runs(url) == []
    status, summary, to_version, finished = last_run(url)
    assert (status, to_version) == ("failed", None) and finished is not None and summary.startswith("stale:"), summary
    _assert_consistent(url, before)
    assert serials(url) == before


def test_refresh_killed_inside_the_commit_is_recovered_by_runs_stale(run_kl, db_url, fake_cache):
    """SIGKILL while the commit (`--commit`) waits: the process cannot clean up, so its lock row and
    its `running` audit row stay; `kl runs --stale` finishes the row and releases that run's lock."""
    import signal

    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="1")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow"])).returncode == 0
    before = serials(db_url)
    proc = _start_refresh(cache, "--commit")
    wait_for(lambda: event_count(events, "read") >= 1, 30, "the reads to be in flight")
    with psycopg.connect(db_url) as holder:
        holder.execute(BLOCKERS["before-version-row"][0])
        _wait_blocked(db_url)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        holder.rollback()
    # The orphaned backend notices its client is gone once the blocker lets it run.
    wait_for(lambda: not kl_backends(db_url), 30, "the killed kl's backend to end")
    assert len(running_runs(db_url)) == 1 and len(state_locks(db_url)) == 1
    r = run_kl("runs", "prod", "--stale")
    assert r.returncode == 0 and "1 stale run(s) marked failed" in r.stderr.decode(), r.stderr
    assert running_runs(db_url) == [] and state_locks(db_url) == [], "the dead run's lock still blocks every writer"
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT event, actor IS NOT NULL FROM lock_events ORDER BY created_at").fetchall()[-1] == ("force_unlock", True)
    _assert_consistent(db_url, before)
    assert serials(db_url) == before
    make(FAKE_SLOW_SECONDS="0")
    assert run_kl("refresh", "prod", "--provider-search-path", str(cache), "--commit").returncode == 0
    assert serials(db_url) == before + [before[-1] + 1]


def test_connection_cut_while_kl_opens_the_store(run_kl, db_url, fake_cache):
    """The first queries of every command check the schema; a cut there is reported as such."""
    make, _ = fake_cache
    cache = make()
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo"])).returncode == 0
    before = serials(db_url)
    with psycopg.connect(db_url) as holder:
        holder.execute("LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE")
        proc = _start_refresh(cache)
        assert "schema_migrations" in _wait_blocked(db_url)
        assert terminate_kl_backends(db_url) >= 1
        code, doc, err = _finish(proc)
        holder.rollback()
    line = _one_clear_line(err)
    assert code == 1 and "lost the database connection" in line, line
    assert doc is None and running_runs(db_url) == [] and newest_run(db_url) is None
    _assert_consistent(db_url, before)


def test_reconnect_after_a_cut_keeps_the_password(db_url):
    """The fresh connection that finishes the audit row and settles a cut commit is made from the
    dead one; psycopg's dsn omits the password, which a password-checking server would need."""
    from psycopg.conninfo import make_conninfo

    from kilolock.store import db

    conn = db.connect(make_conninfo(db_url, password="pw-for-the-server"))
    try:
        assert terminate_kl_backends(db_url) == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        assert conn.closed or conn.broken
        with db.reconnect(conn) as fresh:
            assert fresh.execute("SELECT 1").fetchone() == (1,)
            assert fresh.info.password == "pw-for-the-server"
    finally:
        conn.close()


def test_a_commit_whose_answer_was_lost_is_settled_from_the_database(db_url):
    """The connection can die after the server committed but before kl heard so. The refresh then
    asks on a fresh connection whether its exact bytes are at serial+1, and frees its lock either
    way. (In-process: no fault injection can lose exactly the answer to COMMIT.)"""
    from kilolock import tfstate
    from kilolock.errors import KlError
    from kilolock.refresh.commit import settle_lost_commit
    from kilolock.store import db, locks, states, versions, writes

    with db.connect(db_url) as setup:
        writes.store_document(setup, "prod", tfstate.parse_state(fake_state(["fake_echo"])), fake_state(["fake_echo"]),
                              source="import", actor="t")
        sid = states.state_id(setup, "prod")
        raw = fake_state(["fake_echo"], serial=2)
        for attempt, landed in (("landed", True), ("lost", False)):
            info = locks.lock_info("OperationTypeRefresh", "t", "kl", info="kl refresh run x")
            locks.acquire(setup, sid, "prod", info, "t")
            if landed:  # what the cut transaction did before its answer was lost
                writes.store_document(setup, "prod", tfstate.parse_state(raw), raw, source="refresh", actor="t")
            dead = db.connect(db_url)
            setup.execute("SELECT pg_terminate_backend(%s)", (dead.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError) as cut:
                dead.execute("SELECT 1")
            if landed:
                vid, serial = settle_lost_commit(dead, "prod", sid, info["ID"], "t", 2, raw, None, cut.value)
                found = versions.find_version(setup, sid, 2, versions.content_hash(raw))
                assert serial == 2 and found is not None and vid == found.id
            else:  # serial 3 with these bytes was never written
                with pytest.raises(KlError, match="during the commit .*; nothing committed"):
                    settle_lost_commit(dead, "prod", sid, info["ID"], "t", 3, raw, None, cut.value)
            dead.close()
            assert locks.current(setup, sid) is None, attempt


def test_a_connection_lost_in_any_commands_own_query_is_one_line(monkeypatch, capsys):
    from kilolock import cli
    from kilolock.cli import statuscmd

    def lost(_args, _context):
        raise psycopg.OperationalError("terminating connection due to administrator command\nSSL SYSCALL error: EOF detected")

    monkeypatch.setattr(statuscmd, "run", lost)
    assert cli.main(["status", "prod"]) == 1
    assert capsys.readouterr().err == "kl: lost the database connection: terminating connection due to administrator command\n"
