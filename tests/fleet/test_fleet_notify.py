"""A worker sends what its runs notify while it keeps running (not only when it exits): a real worker
process, a real webhook receiver, real refreshes that fail (no provider where the state says)."""
from __future__ import annotations

from pathlib import Path

from kit.fleet import add_states, q, runs_of, start_worker, stop, wait_for
from kit.kl import run_kl
from kit.webhook import Receiver


def test_a_running_worker_delivers_its_runs_notifications(db_url: str, tmp_path: Path) -> None:
    receiver = Receiver()
    try:
        empty = tmp_path / "no-providers"
        empty.mkdir()
        add_states(db_url, ["team/a", "team/b"], instances=2, search_path=empty)
        r = run_kl("notify", "add", "ops", "--webhook", receiver.url, "--events", "refresh.failed")
        assert r.returncode == 0, r.stderr
        worker = start_worker(db_url, "w1")
        try:
            r = run_kl("schedule", "run-now", "--states", "team/*")
            assert r.returncode == 0, r.stderr
            got = receiver.wait_for(2, timeout=60)
            assert worker.poll() is None, "delivered by the worker while it runs, not at its exit"
        finally:
            code, out = stop(worker)
        assert code == 0, out
        assert sorted(e.json["state"] for e in got) == ["team/a", "team/b"]
        assert {e.json["event"] for e in got} == {"refresh.failed"}
    finally:
        receiver.close()


def test_a_job_that_meets_an_applys_lock_is_queued_again_not_failed(db_url: str, tmp_path: Path) -> None:
    # An apply holds the lock when the worker takes the job: its objects may be changing, so no
    # observation is made now; the job comes back once the apply is over. A failed run instead
    # would tell a channel with --failed-after 1 of every ordinary apply.
    import psycopg

    from kilolock.store import locks, states

    receiver = Receiver()
    try:
        add_states(db_url, ["team/a"], instances=2)
        r = run_kl("notify", "add", "ops", "--webhook", receiver.url, "--events", "refresh.failed", "--failed-after", "1")
        assert r.returncode == 0, r.stderr
        with psycopg.connect(db_url, autocommit=True) as conn:
            sid = states.state_id(conn, "team/a")
            held = locks.lock_info("OperationTypeApply", "alice", "1.8.5")
            locks.acquire(conn, sid, "team/a", held, "alice")
            worker = start_worker(db_url, "w1", log=tmp_path / "w1.log")
            try:
                r = run_kl("schedule", "run-now", "--states", "team/a")
                assert r.returncode == 0, r.stderr
                wait_for("the job queued again", lambda: q(
                    db_url, "SELECT 1 FROM fleet_jobs WHERE status = 'queued' AND error LIKE %s", ("%alice%",)))
                assert runs_of(db_url, "team/a") == []  # no run began
                locks.release(conn, sid, held["ID"], "alice")
                wait_for("a run once the apply is over", lambda: [r for r in runs_of(db_url, "team/a") if r[0] == "succeeded"])
            finally:
                code, _ = stop(worker)
        assert code == 0, (tmp_path / "w1.log").read_text()
        assert "locked by alice (OperationTypeApply" in (tmp_path / "w1.log").read_text()
        assert [r[0] for r in runs_of(db_url, "team/a")] == ["succeeded"]
        assert receiver.events() == []  # the worker delivers what is due before it exits: nothing was
    finally:
        receiver.close()
