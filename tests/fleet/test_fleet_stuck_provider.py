"""A worker's SIGTERM drain when its run is stuck in a provider read that StopProvider cannot end
(the real local provider reading a FIFO, kit.stuck): after --grace the run is cancelled, its
provider shut down after the stop grace, its job queued again, and the worker records its stop
and exits 0, with no word of a database that did not answer (the database was fine)."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kit.fleet import q, runs_of, start_worker, stop
from kit.procs import assert_no_new_providers, provider_pids
from kit.stuck import add_fifo_state, reads_stuck

DEADLINE = 60.0  # for the worker's exit: far beyond --grace, the stop grace and the shutdown after them


@pytest.fixture(autouse=True)
def no_orphan_providers() -> Iterator[None]:
    before = provider_pids()
    yield
    assert_no_new_providers(before)


def test_sigterm_ends_a_worker_whose_run_is_stuck_in_a_provider_read(run_kl, db_url, tmp_path):
    fifos = add_fifo_state(db_url, "stuck/a", tmp_path / "ws", ["a"])
    assert run_kl("schedule", "run-now", "--states", "stuck/*").returncode == 0
    proc = start_worker(db_url, "w1", "--grace", "1s")
    try:
        with reads_stuck(fifos):
            code, out = stop(proc, timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, out
    assert "database did not answer" not in out, out
    assert "stuck/a: cancelled at shutdown; queued again" in out and "w1: stopped (" in out, out
    [(status, _, finished, summary)] = runs_of(db_url, "stuck/a")
    assert (status, "grace period of 1s over" in summary) == ("cancelled", True) and finished is not None
    assert q(db_url, "SELECT status FROM fleet_jobs") == [("queued",)]
    assert q(db_url, "SELECT serial FROM state_versions") == [(1,)]
    workers = json.loads(run_kl("fleet", "status", "--format", "json").stdout)["workers"]
    assert [(w["name"], w["status"], w["state"]) for w in workers] == [("w1", "stopped", "stopped")], workers
