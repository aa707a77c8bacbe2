"""A fleet of small states (issue 13), ratios measured in one run, real null provider, real processes:

- one `kl worker --once` (warm providers, the default --parallel-states 1) against a shell loop of
  `kl refresh STATE` over the same states: the worker must be at least WORKER_GATE x faster (the
  issue's target: 5x; quick mode gates a little below). Also reported: the same worker with
  --warm-providers 0 (what the warm pool alone buys) and with --parallel-states 4.
- 1 against 2 workers (separate processes, --once, --parallel-states 1): the scaling is reported
  (two cores shared with the database and the providers: no gate).
- schedule lag with 3 workers under load: a schedule firing every EVERY over all states, jittered,
  for LAG_SECONDS; p50/p99 of claimed_at - due_at over the jobs claimed, reported, and gated only
  on the fleet keeping up (p99 below the schedule's period).

Full: 200 states x 20 null instances; KL_BENCH_QUICK=1: 24 x 20.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from kit.fleet import add_states, q
from kit.kl import kl_cmd, kl_env

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
STATES = 24 if QUICK else 200
INSTANCES = 20
# Quick mode on a quiet machine (CI of 2026-11-30): 3.5x (138 ms a state against 477 ms); a
# loaded machine slows the loop's process starts more than the worker (7.6x there). Full size on the
# idle machine (2026-12-01): 6.6x (100 ms a state against 663 ms; the worker's first states pay its
# provider launches and schema fetches, which the quick run's 24 states amortise less).
WORKER_GATE = 3.0 if QUICK else 5.0
EVERY = 20.0 if QUICK else 30.0
LAG_SECONDS = 30.0 if QUICK else 90.0


@pytest.fixture
def db_url(bench_db: str) -> str:
    return bench_db


def _enqueue(db_url: str) -> None:
    subprocess.run(kl_cmd("schedule", "run-now", "--states", "bench/**"), env=kl_env(KL_DATABASE_URL=db_url),
                   check=True, capture_output=True)


def _succeeded(db_url: str) -> int:
    return int(q(db_url, "SELECT count(*) FROM refresh_runs WHERE status = 'succeeded'")[0][0])


def _workers(db_url: str, count: int, *extra: str) -> float:
    """Seconds for COUNT `kl worker --once` processes to drain the queue of every bench state."""
    _enqueue(db_url)
    before = _succeeded(db_url)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(kl_cmd("worker", "--once", "--name", f"bench-{n}", "--poll", "200ms", *extra),
                              env=kl_env(KL_DATABASE_URL=db_url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for n in range(count)]
    outs = [p.communicate(timeout=3600)[0].decode() for p in procs]
    took = time.perf_counter() - t0
    assert all(p.returncode == 0 for p in procs), outs
    assert _succeeded(db_url) - before == STATES, outs
    return took


def _shell_loop(db_url: str, names: list[str]) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as fh:
        cmd = " ".join(f'"{c}"' for c in kl_cmd("refresh"))
        fh.write("set -e\nfor s in " + " ".join(names) + f"; do {cmd} -q \"$s\"; done\n")
        script = fh.name
    try:
        before = _succeeded(db_url)
        t0 = time.perf_counter()
        r = subprocess.run(["sh", script], env=kl_env(KL_DATABASE_URL=db_url), capture_output=True, timeout=7200)
        took = time.perf_counter() - t0
    finally:
        Path(script).unlink()
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert _succeeded(db_url) - before == len(names)
    return took


def test_fleet_worker_vs_refresh_loop_scaling_and_schedule_lag(db_url: str, bench_summary: list[str]) -> None:
    names = [f"bench/s{n:03d}" for n in range(STATES)]
    add_states(db_url, names, instances=INSTANCES)
    _workers(db_url, 1)  # warm-up: schemas cached, page cache, first versions written by refresh

    loop = _shell_loop(db_url, names)
    worker = _workers(db_url, 1)
    cold_worker = _workers(db_url, 1, "--warm-providers", "0")
    wide_worker = _workers(db_url, 1, "--parallel-states", "4")
    two_workers = _workers(db_url, 2)
    per = 1000.0 / STATES
    bench_summary.append(f"fleet {STATES} states x {INSTANCES} null: shell loop of kl refresh {loop:.1f}s "
                         f"({loop * per:.0f} ms/state); one kl worker (warm) {worker:.1f}s ({worker * per:.0f} ms/state) "
                         f"= {loop / worker:.1f}x faster (gate {WORKER_GATE}x)")
    bench_summary.append(f"fleet: worker --warm-providers 0 {cold_worker:.1f}s (warm pool alone: {cold_worker / worker:.1f}x); "
                         f"--parallel-states 4 {wide_worker:.1f}s ({loop / wide_worker:.1f}x the loop)")
    bench_summary.append(f"fleet: 1 worker {worker:.1f}s, 2 workers {two_workers:.1f}s: scaling {worker / two_workers:.2f}x "
                         f"(2 cores shared with PostgreSQL and the providers)")

    # Schedule lag under load: three workers, every state on one jittered schedule.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM fleet_jobs")
        since = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    subprocess.run(kl_cmd("schedule", "set", "--states", "bench/**", "--every", f"{EVERY:g}s", "--jitter", f"{EVERY / 2:g}s"),
                   env=kl_env(KL_DATABASE_URL=db_url), check=True, capture_output=True)
    procs = [subprocess.Popen(kl_cmd("worker", "--name", f"lag-{n}", "--poll", "1s"), env=kl_env(KL_DATABASE_URL=db_url),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for n in range(3)]
    try:
        time.sleep(LAG_SECONDS)
    finally:
        for p in procs:
            p.terminate()
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    lags = sorted(float(r[0]) for r in q(db_url, "SELECT extract(epoch FROM claimed_at - due_at) FROM fleet_jobs "
                                                 "WHERE claimed_at IS NOT NULL AND due_at >= %s", (since,)))
    assert len(lags) >= STATES, f"only {len(lags)} jobs claimed in {LAG_SECONDS:g}s"
    p50 = statistics.median(lags)
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    bench_summary.append(f"fleet: schedule lag with 3 workers, {STATES} states every {EVERY:g}s (jitter {EVERY / 2:g}s), "
                         f"{len(lags)} jobs in {LAG_SECONDS:g}s: p50 {p50:.2f}s, p99 {p99:.2f}s")

    assert loop / worker >= WORKER_GATE, f"one warm worker is only {loop / worker:.1f}x the refresh loop"
    assert p99 < EVERY, f"the fleet does not keep up: p99 lag {p99:.1f}s with a {EVERY:g}s schedule"
