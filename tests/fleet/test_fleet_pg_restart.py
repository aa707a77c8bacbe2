"""Workers across a PostgreSQL restart (issue 13): they reconnect and go on, with nothing half-written.
On a cluster of this module's own, never the session's shared server."""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from kit.fleet import add_states, assert_no_overlap, own_cluster, q, start_worker, stop, wait_for
from kit.invariants import reindex_mismatches, version_problems
from kit.kl import kl_cmd, kl_env


@pytest.fixture
def restart_db() -> Iterator[tuple[object, str]]:
    with own_cluster("kl-fleetpg-") as cluster_and_url:
        yield cluster_and_url


def test_workers_reconnect_after_a_postgresql_restart(restart_db):
    cluster, url = restart_db
    names = [f"r/s{n}" for n in range(8)]
    add_states(url, names, instances=3)
    r = subprocess.run(kl_cmd("schedule", "set", "--states", "r/*", "--every", "3s"), env=kl_env(KL_DATABASE_URL=url),
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    workers = [start_worker(url, f"w{n}", "--parallel-states", "2") for n in (1, 2)]
    outputs: list[str] = []
    try:
        def refreshed_since(since: datetime) -> bool:
            rows = q(url, "SELECT count(DISTINCT state_id) FROM refresh_runs WHERE status = 'succeeded' AND started_at > %s",
                     (since,))
            return rows[0][0] == len(names)
        wait_for("a first round", lambda: refreshed_since(datetime(2000, 1, 1, tzinfo=timezone.utc)), timeout=40)
        cluster.stop()
        time.sleep(1.0)
        cluster.ensure_running()
        back = datetime.now(timezone.utc)
        wait_for("every state refreshed again after the restart", lambda: refreshed_since(back), timeout=40, every=0.3)
        assert all(w.poll() is None for w in workers), "a worker exited on the restart"
    finally:
        for w in workers:
            outputs.append(stop(w, signal.SIGTERM)[1])
    assert all(w.returncode == 0 for w in workers), outputs
    assert not any("Traceback" in out or "internal error" in out for out in outputs), outputs
    assert q(url, "SELECT count(*) FROM refresh_runs WHERE status = 'running'") == [(0,)], outputs
    assert q(url, "SELECT count(*) FROM fleet_jobs WHERE status = 'running'") == [(0,)], outputs
    assert_no_overlap(url)
    for name in names:  # nothing half-written: every version parses and the lifecycle index matches it
        assert version_problems(url, name) == [] and reindex_mismatches(url, name) == []
