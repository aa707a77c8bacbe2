"""A database connection that breaks inside a write's transaction behind PgBouncer (transaction
pooling, issue 13): psycopg reports it on its own COMMIT as InternalError("received 2 results
from command 'COMMIT'"), without SQLSTATE. Plain commands and `kl refresh` must say "lost the
database connection" in one line and exit 1, not report an internal error; nothing is
half-written, a refresh's audit row ends finished (or findable with `kl runs --stale`), and a
message never claims a write failed when it may have landed.

The break is injected with kit.breakcommit (the write holds its transaction open just before its
COMMIT while the test kills the server connection under it: pg_terminate_backend of that backend,
or a PostgreSQL restart)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kit import breakcommit, pgbouncer
from kit.fleet import add_states, own_cluster, q, runs_of, wait_for
from kit.paths import REPO
from kit.states import build_state


def _pooled(template: str, db_url: str) -> str:
    return template.format(dbname=psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]) + " kl_pooler=transaction"


def _start_broken(pooled: str, tmp_path: Path, *args: str, at: str = breakcommit.WRITES,
                  ) -> tuple[subprocess.Popen[bytes], int, Path]:
    """kl ARGS through the pooler with its next write AT (a kilolock.store function) held before
    COMMIT: (process, the server pid of the held transaction, the file that lets it go on)."""
    arm, held, go = tmp_path / "arm", tmp_path / "held", tmp_path / "go"
    arm.touch()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "KL_DATABASE_URL": pooled,
           breakcommit.ARM: str(arm), breakcommit.HELD: str(held), breakcommit.GO: str(go), breakcommit.AT: at}
    env.pop("KL_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "kit.breakcommit", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    return proc, breakcommit.wait_held(held, proc), go


def _terminate(db_url: str, pid: int) -> None:
    q(db_url, "SELECT pg_terminate_backend(%s)", (pid,))
    wait_for("the server connection to end", lambda: q(
        db_url, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)) == [(0,)])


def _finish(proc: subprocess.Popen[bytes], go: Path) -> tuple[int, str]:
    go.touch()
    _out, err = proc.communicate(timeout=120)
    return proc.returncode, err.decode()


def _assert_one_line(err: str) -> None:
    assert err.count("\n") == 1 and err.startswith("kl: "), err
    assert "internal error" not in err and "Traceback" not in err, err


def _without_heartbeat_warning(err: str) -> str:
    """ERR without the run's heartbeat warning: when the outage outlasts a beat (3 s; a loaded
    machine restarts PostgreSQL slower), the heartbeat says once that it cannot write, beside the
    run's own line."""
    return "".join(line for line in err.splitlines(keepends=True)
                   if not line.startswith("WARNING kilolock.store.refresh_runs: refresh run heartbeat"))


def test_a_plain_command_whose_commit_breaks_says_lost_connection_and_outcome_unknown(bouncer, db_url, tmp_path):
    pooled = _pooled(bouncer, db_url)
    src = tmp_path / "s.tfstate"
    src.write_bytes(build_state(1, {"a": {"id": "a", "triggers": None}}, lineage="lin-import"))
    proc, pid, go = _start_broken(pooled, tmp_path, "state", "import", "imp/a", str(src))
    _terminate(db_url, pid)
    code, err = _finish(proc, go)
    assert code == 1, err
    _assert_one_line(err)
    # The break came on COMMIT: the write may have landed, so the message must not say it failed.
    assert err.startswith("kl: lost the database connection: received 2 results from command 'COMMIT'"), err
    assert "whether the write was committed is unknown" in err and "kl state versions" in err, err
    # (It did not land here: the server connection died before COMMIT reached it.)
    assert q(db_url, "SELECT count(*) FROM state_versions") == [(0,)]


def test_a_refresh_whose_commit_lock_breaks_is_one_line_and_recorded_failed(bouncer, db_url, tmp_path):
    """The break on COMMIT of the state lock the refresh's commit takes (a row committed on its
    own): the refresh settles on a fresh connection (releases the lock if it landed, looks for
    the version), says nothing was committed, and finishes its audit row."""
    pooled = _pooled(bouncer, db_url)
    add_states(db_url, ["brk/a"], instances=3, legacy_address=True)  # so --commit has a version to write
    proc, pid, go = _start_broken(pooled, tmp_path, "refresh", "brk/a", "--commit", at="locks.acquire")
    _terminate(db_url, pid)
    code, err = _finish(proc, go)
    assert code == 1, err
    _assert_one_line(err)
    assert err.startswith("kl: refresh failed: lost the database connection during the commit (received 2 results "
                          "from command 'COMMIT'); nothing committed"), err
    assert q(db_url, "SELECT v.serial FROM state_versions v") == [(1,)]
    assert q(db_url, "SELECT count(*) FROM state_locks") == [(0,)]
    [(status, _started, finished, summary)] = runs_of(db_url, "brk/a")
    assert status == "failed" and finished is not None and "nothing committed" in summary, summary


def test_a_refresh_whose_audit_row_breaks_finishes_it_on_a_new_connection(bouncer, db_url, tmp_path):
    """The break on COMMIT of the run's finish (after v1.1 was recorded): the row is finished again
    on a fresh connection (the lost attempt did not land; had it, finishing is a no-op), and the
    refresh reports what it did."""
    pooled = _pooled(bouncer, db_url)
    add_states(db_url, ["brk/f"], instances=3)
    proc, pid, go = _start_broken(pooled, tmp_path, "refresh", "brk/f", at="refresh_runs.finish")
    _terminate(db_url, pid)
    code, err = _finish(proc, go)
    assert code == 0 and "internal error" not in err, err
    assert _versions(db_url) == [(1, "import", "terraform"), (1, "refresh", "observation")]
    [(status, _started, finished, _summary)] = runs_of(db_url, "brk/f")
    assert status == "succeeded" and finished is not None


def _versions(db_url: str) -> list[tuple]:
    """(serial, source, kind) of every version, in the order written: a refresh records an observation."""
    return q(db_url, "SELECT v.serial, v.source, v.kind FROM state_versions v ORDER BY v.seq")


def test_a_refresh_whose_observation_breaks_is_one_line_and_recorded_failed(bouncer, db_url, tmp_path):
    """The break on COMMIT of the observation the refresh records (no lock taken): a fresh
    connection looks for it, finds it did not land, and the run says nothing was recorded and
    finishes its audit row failed."""
    pooled = _pooled(bouncer, db_url)
    add_states(db_url, ["brk/o"], instances=3)
    proc, pid, go = _start_broken(pooled, tmp_path, "refresh", "brk/o", at="writes.record_observation")
    _terminate(db_url, pid)
    code, err = _finish(proc, go)
    assert code == 1, err
    _assert_one_line(err)
    assert err.startswith("kl: refresh failed: lost the database connection while recording the observation "
                          "(received 2 results from command 'COMMIT'); nothing recorded"), err
    assert _versions(db_url) == [(1, "import", "terraform")]
    assert q(db_url, "SELECT count(*) FROM state_locks") == [(0,)]
    [(status, _started, finished, summary)] = runs_of(db_url, "brk/o")
    assert status == "failed" and finished is not None and "nothing recorded" in summary, summary


def _break_again(db_url: str, tmp_path: Path, proc: subprocess.Popen[bytes], pid: int) -> int:
    """Break the held transaction (server pid PID) and arm the next armed write, the recovery's on
    its new connection: the server pid of that one, held in turn."""
    arm, held, go = tmp_path / "arm", tmp_path / "held", tmp_path / "go"
    _terminate(db_url, pid)
    held.unlink()
    arm.touch()
    go.touch()
    return breakcommit.wait_held(held, proc)


def test_a_refresh_whose_commit_breaks_and_its_settling_breaks_too_says_the_outcome_is_unknown(bouncer, db_url, tmp_path):
    """The break on COMMIT of the commit's state lock, then on the new connection that settles it
    (releasing the lock breaks the same way): the second break is a lost connection too, in one
    line saying the outcome is unknown and what to look at, not "nothing committed" (which the
    refresh could no longer know) nor an internal error."""
    pooled = _pooled(bouncer, db_url)
    add_states(db_url, ["brk/s2"], instances=3, legacy_address=True)
    proc, pid, go = _start_broken(pooled, tmp_path, "refresh", "brk/s2", "--commit", at="locks.acquire,locks.release")
    pid = _break_again(db_url, tmp_path, proc, pid)
    _terminate(db_url, pid)
    code, err = _finish(proc, go)
    assert code == 1, err
    _assert_one_line(err)
    assert err.startswith("kl: refresh failed: lost the database connection during the commit (received 2 results "
                          "from command 'COMMIT'), and the new connection to settle it failed too ("), err
    assert "); whether v2 was written is unknown" in err, err
    assert "kl state versions brk/s2" in err and "nothing committed" not in err, err
    assert q(db_url, "SELECT v.serial FROM state_versions v") == [(1,)]
    [(status, _started, finished, _summary)] = runs_of(db_url, "brk/s2")
    assert status == "failed" and finished is not None  # the audit row, on a third connection


def test_a_refresh_whose_audit_row_breaks_twice_says_what_to_run(bouncer, db_url, tmp_path):
    """The run's finish breaks on COMMIT, and again on the new connection that finishes it: one
    line with the run's outcome and `kl runs --stale`, the row left for it to finish."""
    pooled = _pooled(bouncer, db_url)
    add_states(db_url, ["brk/f2"], instances=3)
    proc, pid, go = _start_broken(pooled, tmp_path, "refresh", "brk/f2", at="refresh_runs.finish")
    pid = _break_again(db_url, tmp_path, proc, pid)
    _terminate(db_url, pid)
    code, err = _finish(proc, go)
    assert code == 1, err
    _assert_one_line(err)
    assert err.startswith("kl: refresh succeeded"), err
    assert ("could not be finished (received 2 results from command 'COMMIT'): run `kl runs brk/f2 --stale` "
            "once the database is back") in err, err
    assert _versions(db_url) == [(1, "import", "terraform"), (1, "refresh", "observation")]
    [(status, _started, finished, _summary)] = runs_of(db_url, "brk/f2")
    assert status == "running" and finished is None  # what `kl runs --stale` finishes


def _query_quietly(url: str) -> None:
    with contextlib.suppress(psycopg.Error), psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")


def _pooler_log(template: str) -> str:
    base = Path(str(psycopg.conninfo.conninfo_to_dict(template.format(dbname="x"))["host"]))
    return (base / "pgbouncer.log").read_text(errors="replace")


@pytest.fixture
def restartable() -> Iterator[tuple[Any, str]]:
    with own_cluster("kl-lostrs-") as cluster_and_url:
        yield cluster_and_url


def test_a_refresh_whose_commit_meets_a_postgresql_restart_leaves_nothing_running_for_good(restartable, tmp_path):
    """PostgreSQL restarts under the commit: PgBouncer then refuses every new client for its
    server_login_retry (15 s), so the refresh can neither settle its commit nor finish its audit
    row. One line says what is unknown and what to run; the row is found stale once its beats have
    stopped, and `kl runs --stale` finishes it and releases the lock the commit took."""
    from kilolock.store.refresh_runs import HEARTBEAT_STALE_S

    cluster, url = restartable
    pgbouncer.require()
    add_states(url, ["brk/r"], instances=3, legacy_address=True)
    with pgbouncer.pgbouncer(url) as template:
        pooled = template.format(dbname="fleet") + " kl_pooler=transaction"
        proc, _pid, go = _start_broken(pooled, tmp_path, "refresh", "brk/r", "--commit", at="locks.acquire")
        cluster.stop()
        # A client that needs a server meanwhile: PgBouncer's server login fails, and it refuses
        # every new client for server_login_retry from then on (what busy pooled fleets meet).
        # The client's query waits in PgBouncer's queue, so it runs in a thread of its own.
        client = threading.Thread(target=_query_quietly, args=(pooled.replace(" kl_pooler=transaction", ""),),
                                  daemon=True)
        client.start()
        wait_for("PgBouncer's server login to fail", lambda: "server login has been failing" in _pooler_log(template)
                 or "connect failed" in _pooler_log(template), timeout=20)
        cluster.ensure_running()
        code, err = _finish(proc, go)
        client.join(timeout=60)
    assert code == 1, err
    _assert_one_line(_without_heartbeat_warning(err))
    assert "lost the database connection" in err and "kl runs brk/r --stale" in err, err
    # It could not look whether the write landed, nor release the lock: it says so, with what to run.
    assert "whether v2 was written is unknown" in err and "nothing committed" not in err, err
    assert q(url, "SELECT v.serial FROM state_versions v") == [(1,)]  # nothing half-written
    env = {**os.environ, "PYTHONPATH": str(REPO), "KL_DATABASE_URL": url}
    env.pop("KL_DEBUG", None)

    def stale() -> bool:
        r = subprocess.run([sys.executable, "-m", "kilolock", "runs", "brk/r", "--stale"], env=env,
                           capture_output=True, timeout=60)
        return "1 stale run(s)" in r.stderr.decode()
    wait_for("the run to be found stale", stale, timeout=HEARTBEAT_STALE_S + 20, every=1.0)
    assert [r[0] for r in runs_of(url, "brk/r")] == ["failed"]
    assert q(url, "SELECT count(*) FROM state_locks") == [(0,)]


def test_a_heartbeat_outage_is_said_once_not_at_every_beat(monkeypatch, caplog):
    """A pooled kl refresh beats every few seconds on a connection of its own and logs to stderr:
    an outage of two minutes printed 40 warning lines before its one-line error. Now one when the
    beats start failing, one when they beat again."""
    import logging
    from types import SimpleNamespace

    from kilolock.store import refresh_runs
    from kit.kl import NO_DATABASE

    monkeypatch.setattr(refresh_runs, "HEARTBEAT_S", 0.02)
    beats = refresh_runs._Heartbeats()
    caplog.set_level(logging.WARNING, logger="kilolock.store.refresh_runs")
    class Unopened:  # a connection kl did not open (db.url_of falls back to its dsn); weakly referable, as one is
        info = SimpleNamespace(dsn=NO_DATABASE, password=None)

    beats.add(Unopened(), "run-1")  # type: ignore[arg-type]
    time.sleep(0.5)  # some 25 beats, each failing
    beats.remove("run-1")
    wait_for("the heartbeat thread to stop", lambda: beats._thread is None, timeout=5)
    said = [r.getMessage() for r in caplog.records if "refresh run heartbeat" in r.getMessage()]
    assert len(said) == 1 and "retrying every" in said[0], said
