"""A worker sends what its runs notify while it keeps running (not only when it exits): a real worker
process, a real webhook receiver, real refreshes that fail (no provider where the state says)."""
from __future__ import annotations

from pathlib import Path

from kit.fleet import add_states, start_worker, stop
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
