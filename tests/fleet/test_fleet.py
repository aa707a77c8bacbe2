"""The fleet end to end (issue 13): `kl refresh --all`, schedules, `kl worker` processes with leases,
`kl fleet status`, against real PostgreSQL and the real null provider (the fault-injecting fake
only where a run must be slow enough to be killed or raced)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from datetime import timedelta

import pytest

from kit.faults import install_fake
from kit.fleet import LEASE, add_fake_state, add_states, assert_no_overlap, q, runs_of, start_worker, stop, wait_for
from kit.kl import kl_cmd, kl_env
from kit.procs import assert_no_new_providers, provider_pids


@pytest.fixture(autouse=True)
def no_orphan_providers() -> Iterator[None]:
    before = provider_pids()
    yield
    assert_no_new_providers(before)


# ---------------------------------------------------------------- kl refresh --all

def test_refresh_all_runs_each_state_as_refresh_does_and_combines_exit_codes(run_kl, db_url, tmp_path):
    add_states(db_url, ["team/a", "team/b", "team/c", "other/x"], instances=3)
    add_states(db_url, ["team/lost"], instances=2, search_path=tmp_path / "nowhere")  # its provider is not found
    env = {"HOME": str(tmp_path), "KL_PROVIDER_PATH": "", "TF_PLUGIN_CACHE_DIR": ""}

    r = run_kl("refresh", "--all", "--states", "team/*", "--parallel-states", "3", "--format", "json", env=env, cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["exit_code"] == 1, r.stderr
    assert (doc["version"], doc["states"], doc["succeeded"], doc["failed"]) == (1, 4, 3, 1)
    by_state = {x["state"]: x for x in doc["results"]}
    assert sorted(by_state) == ["team/a", "team/b", "team/c", "team/lost"]  # other/x not matched
    for name in ("team/a", "team/b", "team/c"):  # each with its own audit row and observation
        assert (by_state[name]["status"], by_state[name]["from_serial"], by_state[name]["to_serial"],
                by_state[name]["observation"]) == ("succeeded", 1, None, "v1.1")
        assert by_state[name]["resources_checked"] == 3 and by_state[name]["run_id"]
    assert by_state["team/lost"]["status"] == "failed" and by_state["team/lost"]["to_serial"] is None
    assert by_state["team/lost"]["observation"] is None
    assert "did not succeed" in r.stderr.decode() and "team/lost" in r.stderr.decode()
    assert len(q(db_url, "SELECT 1 FROM refresh_runs")) == 4

    r = run_kl("refresh", "--all", "--states", "team/[abc]", env=env, cwd=tmp_path)  # matches nothing
    assert r.returncode == 1 and "no refreshable state matches" in r.stderr.decode()
    r = run_kl("refresh", "--all", "--states", "team/?", "--detailed-exitcode", "-q", env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == b"", r.stderr  # three states, no drift
    r = run_kl("refresh", "--all", "--states", "team/?", env=env, cwd=tmp_path)
    text = r.stdout.decode()
    # Terraform's v1 still, observed a third time (after the JSON run and the -q one).
    assert r.returncode == 0 and "team/a  succeeded  v1 → v1.3" in text and "3 state(s): 3 succeeded, 0 not" in text, text
    assert q(db_url, "SELECT max(v.serial) FROM state_versions v JOIN states s ON s.id = v.state_id"
                     " WHERE s.name = 'team/a' AND v.kind = 'terraform'") == [(1,)]
    r = run_kl("refresh", "prod", "--all")
    assert r.returncode == 2 and "not both" in r.stderr.decode()
    r = run_kl("refresh")
    assert r.returncode == 2 and "give a STATE, or --all" in r.stderr.decode()


# ---------------------------------------------------------------- schedules

def test_schedule_commands(run_kl, db_url):
    add_states(db_url, ["prod/a", "prod/b"], instances=1)
    r = run_kl("schedule", "set", "--states", "prod/*", "--every", "6h", "--jitter", "30m")
    assert r.returncode == 0, r.stderr
    first = int(r.stdout)
    r = run_kl("schedule", "set", "--states", "nothing/**", "--cron", "15 */4 * * mon-fri")
    assert r.returncode == 0 and "matches no refreshable state now" in r.stderr.decode()
    second = int(r.stdout)
    listed = json.loads(run_kl("schedule", "list", "--format", "json").stdout)["schedules"]
    assert [(s["id"], s["states"], s["matching_states"], s["every_s"], s["cron"], s["paused"]) for s in listed] == [
        (first, "prod/*", 2, 21600.0, None, False), (second, "nothing/**", 0, None, "15 */4 * * mon-fri", False)]
    assert listed[1]["cron_time_zone"] == "UTC" and listed[1]["next_run_at"].endswith("+00:00")
    text = run_kl("schedule", "list").stdout.decode()
    assert "cron 15 */4 * * mon-fri (UTC)" in text and "every 6h00m" in text
    assert run_kl("schedule", "pause", str(first)).returncode == 0
    assert "(paused)" in run_kl("schedule", "list").stdout.decode()
    assert run_kl("schedule", "resume", str(first)).returncode == 0
    assert run_kl("schedule", "remove", str(second)).returncode == 0
    r = run_kl("schedule", "remove", str(second))
    assert r.returncode == 1 and r.stderr.decode().strip() == f"kl: no schedule {second} (kl schedule list shows them)"
    r = run_kl("schedule", "set", "--states", "prod/*", "--cron", "61 * * * *")
    assert r.returncode == 2 and "minute 61 is out of range 0-59" in r.stderr.decode() and "Traceback" not in r.stderr.decode()
    r = run_kl("schedule", "set", "--states", "prod/*", "--every", "1h", "--cron", "@daily")
    assert r.returncode == 2
    r = run_kl("schedule", "run-now", "--states", "nope/*")
    assert r.returncode == 1 and "no refreshable state matches" in r.stderr.decode()
    r = run_kl("schedule", "run-now", "--states", "prod/**")
    assert r.returncode == 0 and r.stdout.decode().startswith("2 of 2 state(s) queued")
    assert len(q(db_url, "SELECT 1 FROM fleet_schedules")) == 1


def test_worker_once_refreshes_exactly_what_is_due_and_a_missed_schedule_runs_once(run_kl, db_url):
    add_states(db_url, ["due/a", "due/b", "later/a", "none/a"], instances=2)
    assert run_kl("schedule", "set", "--states", "due/*", "--every", "1h").returncode == 0
    assert run_kl("schedule", "set", "--states", "later/*", "--cron", "0 0 1 1 *").returncode == 0  # next 1 January
    # Downtime: the every-hour schedule last fired 50 hours ago and missed 49 times since.
    q(db_url, "UPDATE fleet_schedules SET next_run_at = now() - interval '49 hours' WHERE states_glob = 'due/*'")
    before = q(db_url, "SELECT next_run_at FROM fleet_schedules WHERE states_glob = 'due/*'")[0][0]

    r = run_kl("worker", "--once", "--name", "ci")
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    refreshed = q(db_url, "SELECT s.name, rr.status FROM refresh_runs rr JOIN states s ON s.id = rr.state_id ORDER BY 1")
    assert refreshed == [("due/a", "succeeded"), ("due/b", "succeeded")]  # once each: not 49 times
    nxt = q(db_url, "SELECT next_run_at, now() FROM fleet_schedules WHERE states_glob = 'due/*'")[0]
    assert nxt[1] < nxt[0] <= nxt[1] + timedelta(hours=1)  # the next time on its grid, after now
    assert (nxt[0] - before) % timedelta(hours=1) == timedelta(0)
    jobs = q(db_url, "SELECT status, attempts FROM fleet_jobs ORDER BY id")
    assert jobs == [("succeeded", 1), ("succeeded", 1)]

    r = run_kl("worker", "--once")  # nothing due now: nothing refreshed
    assert r.returncode == 0 and len(q(db_url, "SELECT 1 FROM refresh_runs")) == 2
    status = json.loads(run_kl("fleet", "status", "--format", "json").stdout)
    assert status["queue"]["due"] == 0 and status["queue"]["succeeded_1h"] == 2
    assert [w["name"] for w in status["workers"]][:1] == ["ci"] and status["workers"][0]["state"] == "stopped"


# ---------------------------------------------------------------- workers

def test_manual_refresh_waits_for_or_refuses_a_workers_run(run_kl, db_url, tmp_path):
    events = tmp_path / "events.log"
    cache = install_fake(tmp_path, events, FAKE_SLOW_SECONDS="3")
    add_fake_state(db_url, "slow/x", cache)
    worker = start_worker(db_url, "w1")
    try:
        assert run_kl("schedule", "run-now", "--states", "slow/x").returncode == 0
        wait_for("the worker's run", lambda: q(db_url, "SELECT 1 FROM refresh_runs WHERE status = 'running'"))
        r = run_kl("refresh", "slow/x")
        err = r.stderr.decode()
        assert r.returncode == 1 and "is being refreshed now by worker w1" in err and "--lock-timeout" in err, err
        r = run_kl("refresh", "slow/x", "--lock-timeout", "30s", "--format", "json")
        assert r.returncode == 0, r.stderr
        # Observed after the worker's run, the next observation of the same Terraform version.
        assert (json.loads(r.stdout)["to_serial"], json.loads(r.stdout)["observation"]) == (None, "v1.2")
    finally:
        code, out = stop(worker)
    assert code == 0, out
    assert [s for s, *_ in runs_of(db_url, "slow/x")] == ["succeeded", "succeeded"]
    assert_no_overlap(db_url)


def test_a_second_manual_refresh_waits_for_or_refuses_the_first(run_kl, db_url, tmp_path):
    events = tmp_path / "events.log"
    cache = install_fake(tmp_path, events, FAKE_SLOW_SECONDS="3")
    add_fake_state(db_url, "slow/y", cache)
    first = subprocess.Popen(kl_cmd("refresh", "slow/y"), env=kl_env(KL_DATABASE_URL=db_url),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for("the first run", lambda: q(db_url, "SELECT 1 FROM refresh_runs WHERE status = 'running'"))
        r = run_kl("refresh", "slow/y", "--dry-run")
        err = r.stderr.decode()
        assert r.returncode == 1 and "is being refreshed now by run" in err and "--lock-timeout" in err, err
        r = run_kl("refresh", "slow/y", "--lock-timeout", "30s", "--format", "json")
        assert r.returncode == 0, r.stderr
        # Observed after the first run's v1.1, the next observation of the same Terraform version.
        assert (json.loads(r.stdout)["to_serial"], json.loads(r.stdout)["observation"]) == (None, "v1.2")
    finally:
        _, err_first = first.communicate(timeout=60)
    assert first.returncode == 0, err_first
    assert [s for s, *_ in runs_of(db_url, "slow/y")] == ["succeeded", "succeeded"]
    assert_no_overlap(db_url)


def test_three_workers_refresh_a_fleet_on_time_survive_a_sigkill_and_drain_on_sigterm(run_kl, db_url, tmp_path):
    names = [f"fleet/s{n:02d}" for n in range(30)]
    add_states(db_url, names, instances=5)
    events = tmp_path / "events.log"
    cache = install_fake(tmp_path, events, FAKE_SLOW_SECONDS="3")
    add_fake_state(db_url, "slow/victim", cache)
    every = 6.0
    assert run_kl("schedule", "set", "--states", "fleet/**", "--every", f"{every:g}s", "--jitter", "2s").returncode == 0
    workers = {n: start_worker(db_url, n, "--parallel-states", "2") for n in ("w1", "w2", "w3")}
    outputs: dict[str, str] = {}
    try:
        # Every state refreshed, twice: the first round and the next one, on time.
        def two_rounds() -> bool:
            rows = q(db_url, "SELECT s.name, count(*) FROM refresh_runs rr JOIN states s ON s.id = rr.state_id "
                             "WHERE rr.status = 'succeeded' AND s.name LIKE 'fleet/%%' GROUP BY 1")
            return len(rows) == 30 and all(c >= 2 for _, c in rows)
        wait_for("two rounds over 30 states", two_rounds, timeout=60)

        # SIGKILL the worker running the slow state, mid-run.
        assert run_kl("schedule", "run-now", "--states", "slow/victim").returncode == 0
        row = wait_for("the slow run to start", lambda: q(
            db_url, "SELECT w.name, j.id FROM fleet_jobs j JOIN fleet_workers w ON w.id = j.claimed_by "
                    "JOIN states s ON s.id = j.state_id WHERE s.name = 'slow/victim' AND j.status = 'running' "
                    "AND j.refresh_run_id IS NOT NULL"))
        victim, job_id = row[0]
        workers[victim].kill()
        outputs[victim] = workers.pop(victim).communicate()[0].decode()
        # FOR UPDATE: a beat whose COMMIT the worker had sent before it died is still committed by its
        # server process, maybe after a plain read here; the beat's row lock makes this read wait for it.
        last_beat = q(db_url, "SELECT heartbeat_at FROM fleet_jobs WHERE id = %s FOR UPDATE", (job_id,))[0][0]

        done = wait_for("the slow state's job to complete on another worker", lambda: q(
            db_url, "SELECT w.name, j.claimed_at, j.attempts FROM fleet_jobs j JOIN fleet_workers w ON w.id = j.claimed_by "
                    "WHERE j.id = %s AND j.status = 'succeeded'", (job_id,)), timeout=30)
        new_worker, claimed_at, attempts = done[0]
        assert new_worker != victim and attempts == 2
        # Taken over once the lease ran out (plus a poll or two), not sooner.
        assert last_beat + timedelta(seconds=LEASE) <= claimed_at <= last_beat + timedelta(seconds=LEASE + 5)
        runs = runs_of(db_url, "slow/victim")
        assert [r[0] for r in runs] == ["failed", "succeeded"], runs
        assert runs[0][2] <= last_beat and "stopped heartbeating" in runs[0][3]

        status = json.loads(run_kl("fleet", "status", "--format", "json").stdout)
        if os.environ.get("KL_FLEET_REPORT"):
            print("fleet status queue:", status["queue"])
        states = {w["name"]: w["state"] for w in status["workers"]}
        assert states[victim] == "lost" and sum(1 for s in states.values() if s == "alive") == 2
        text = run_kl("fleet", "status").stdout.decode()
        assert "2 alive, 1 lost" in text and "p50" in text

        # SIGTERM with runs in flight: they finish, nothing is left running.
        wait_for("runs in flight", lambda: q(db_url, "SELECT 1 FROM fleet_jobs WHERE status = 'running'"), timeout=20,
                 every=0.02)
        for name, proc in list(workers.items()):
            code, outputs[name] = stop(proc)
            assert code == 0, outputs[name]
            assert "claiming nothing more" in outputs[name] and "stopped (" in outputs[name]
        workers.clear()
    finally:
        for name, proc in workers.items():
            outputs[name] = stop(proc, signal.SIGKILL)[1]
    assert q(db_url, "SELECT count(*) FROM refresh_runs WHERE status = 'running'") == [(0,)], outputs
    assert q(db_url, "SELECT count(*) FROM fleet_jobs WHERE status = 'running'") == [(0,)]
    assert q(db_url, "SELECT count(*) FROM fleet_workers WHERE status <> 'stopped' AND name <> %s", (victim,)) == [(0,)]
    # The only runs that did not succeed were the killed worker's (it ran two states at once).
    unsuccessful = q(db_url, "SELECT status, error_summary FROM refresh_runs WHERE status <> 'succeeded' "
                             "AND state_id IN (SELECT id FROM states WHERE name LIKE 'fleet/%%')")
    assert all(status == "failed" and error.startswith(f"worker {victim} stopped heartbeating")
               for status, error in unsuccessful), (unsuccessful, outputs)
    assert_no_overlap(db_url)
    # On time: no scheduled job waited a whole period past its due time before a worker took it.
    late = q(db_url, "SELECT s.name, j.claimed_at - j.due_at FROM fleet_jobs j JOIN states s ON s.id = j.state_id "
                     "WHERE j.schedule_id IS NOT NULL AND j.claimed_at - j.due_at > make_interval(secs => %s)", (every,))
    assert late == [], late
    # Never doubled: each schedule firing queued each state at most once (one pending job per state).
    assert q(db_url, "SELECT count(*) FROM (SELECT state_id FROM fleet_jobs WHERE status IN ('queued', 'running') "
                     "GROUP BY state_id HAVING count(*) > 1) x") == [(0,)]
    if os.environ.get("KL_FLEET_REPORT"):
        print(outputs)
