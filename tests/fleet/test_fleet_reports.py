"""What the fleet's reports say (against the real test PostgreSQL and real providers): a failed run's
first cause and its fix on every surface, `kl refresh --all` naming the states its gate failed on,
workers that are gone expiring from `kl fleet status` and `kl fleet prune`, the last hour counting
runs failed by a take-over, `kl schedule list|remove`, and the words of the in-flight line."""
from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from kit.fleet import add_states, q
from kit.kl import kl_cmd, kl_env
from kit.paths import PLUGIN_CACHE
from kit.procs import assert_no_new_providers, provider_pids
from kit.states import build_state

NOTHING_FOUND = "no binary for provider registry.terraform.io/hashicorp/null for "


@pytest.fixture(autouse=True)
def no_orphan_providers() -> Iterator[None]:
    before = provider_pids()
    yield
    assert_no_new_providers(before)


def _isolated(tmp_path: Path) -> dict[str, str]:
    """No provider binary anywhere discovery looks: HOME, the plugin cache and $KL_PROVIDER_PATH
    lead nowhere (the state's own search path is a missing directory)."""
    return {"HOME": str(tmp_path), "KL_PROVIDER_PATH": "", "TF_PLUGIN_CACHE_DIR": ""}


def _cause_line(text: str) -> str:
    [line] = [x for x in text.splitlines() if "resource(s) failed" in x]
    return line


def test_a_failed_runs_first_cause_and_its_fix_are_in_every_report(run_kl, db_url, tmp_path):
    add_states(db_url, ["team/lost"], instances=3, search_path=tmp_path / "nowhere")
    env = _isolated(tmp_path)
    expected = ("3 resource(s) failed (first: null_resource.n0: " + NOTHING_FOUND)
    fix = "; fix: `kl state set team/lost --workdir DIR` (the directory terraform init ran in) or --provider-search-path DIR"

    r = run_kl("refresh", "team/lost", env=env, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    error = _cause_line(r.stdout.decode())
    assert error.startswith(f"error:    {expected}") and error.endswith(fix), error
    assert "looked in" not in error and len(error) < 400, error  # one readable line: the directory list is cut
    assert r.stderr.decode() == f"kl: refresh failed: {error.removeprefix('error:    ')}\n"
    summary = error.removeprefix("error:    ")

    runs = run_kl("runs", "team/lost").stdout.decode().splitlines()
    assert runs[0].split()[-1] == "ERROR" and runs[1].endswith(summary), runs
    [run] = json.loads(run_kl("runs", "team/lost", "--format", "json").stdout)["runs"]
    # The audit row keeps the whole cause (the directories looked in) after what the reports show.
    assert run["error_summary"].startswith(f"{summary}; the first cause in full: provider registry.terraform.io/"
                                           f"hashicorp/null: {NOTHING_FOUND}"), run
    assert f"looked in: {tmp_path / 'nowhere'}/" in run["error_summary"], run

    r = run_kl("refresh", "--all", "--states", "team/*", env=env, cwd=tmp_path)
    assert r.returncode == 1 and _cause_line(r.stdout.decode()).endswith(summary), r.stdout

    assert run_kl("schedule", "run-now", "--states", "team/lost").returncode == 0
    worker = subprocess.run(kl_cmd("worker", "--once", "--name", "w1", "--poll", "200ms"), capture_output=True,
                            env=kl_env(KL_DATABASE_URL=db_url, **env), cwd=tmp_path, timeout=120)
    assert worker.returncode == 1 and _cause_line(worker.stdout.decode()).endswith(summary), worker.stdout
    status = run_kl("fleet", "status").stdout.decode()
    assert _cause_line(status).endswith(f"(worker w1): {summary}"), status

    # With a workdir stored, the binaries belong in its .terraform/providers.
    assert run_kl("state", "set", "team/lost", "--workdir", str(tmp_path)).returncode == 0
    r = run_kl("refresh", "team/lost", env=env, cwd=tmp_path)
    assert r.returncode == 1 and _cause_line(r.stdout.decode()).endswith(
        f"; fix: run terraform init in {tmp_path}, or `kl state set team/lost --provider-search-path DIR`"), r.stdout


def _drifted_states(db_url: str, drifted: list[str], clean: list[str]) -> None:
    """Null states refreshed by the real provider; DRIFTED ones have open drift already: a refresh
    version that changed a trigger since the last apply (the null provider reads back what is stored,
    so the drift stays open after another refresh)."""
    from kilolock import tfstate
    from kilolock.store import settings, states, writes

    with psycopg.connect(db_url, autocommit=True) as conn:
        for name in drifted + clean:
            history = [(1, "1", "apply")] + ([(2, "2", "refresh")] if name in drifted else [])
            for serial, trigger, source in history:
                raw = build_state(serial, {"a": {"id": f"{name}-a", "triggers": {"t": trigger}}}, lineage=f"l-{name}")
                writes.store_document(conn, name, tfstate.parse_state(raw), raw, source=source, actor="test")
            settings.update(conn, states.state_id(conn, name),
                            settings.Changes({"provider_search_paths": [str(PLUGIN_CACHE)]}), "test")


def test_refresh_all_names_the_states_its_gate_fails_on_in_aligned_lines(run_kl, db_url, tmp_path):
    _drifted_states(db_url, ["t/drifted", "t/also-drifted-long-name"], ["t/ok"])
    env = _isolated(tmp_path)

    r = run_kl("refresh", "--all", "--states", "t/*", "--detailed-exitcode", env=env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode() == ("kl: refresh --all: open drift in 2 of 3 state(s): t/also-drifted-long-name (1), "
                                 "t/drifted (1) (kl drift STATE lists it)\n")
    lines = [x for x in r.stdout.decode().splitlines() if x.startswith("t/")]
    assert sorted(x.split()[0] for x in lines) == ["t/also-drifted-long-name", "t/drifted", "t/ok"], lines
    for column in ("succeeded", "v", "checked", "changed", "failed"):  # each column starts at one offset on every line
        assert len({re.search(rf"(?<= ){column}", x).start() for x in lines}) == 1, (column, lines)  # type: ignore[union-attr]
    r = run_kl("refresh", "--all", "--states", "t/*", "--detailed-exitcode", "-q", "--format", "json",
               env=env, cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["open_drift_states"] == 2
    assert doc["states_with_open_drift"] == ["t/also-drifted-long-name", "t/drifted"]

    md = run_kl("refresh", "--all", "--states", "t/*", "--format", "markdown", env=env, cwd=tmp_path).stdout.decode()
    assert md.startswith("## Refresh of 3 state(s): 3 succeeded, 0 not; 0 drifted object(s) in 0 state(s)\n\n### "), md

    table = run_kl("refresh", "t/ok", env=env, cwd=tmp_path).stdout.decode()
    [line] = [x for x in table.splitlines() if "in flight" in x]
    assert re.fullmatch(r"requests in flight to null: adaptive, started at 10, reached \d+, ended at \d+", line), line


def _status(run_kl) -> dict:
    r = run_kl("fleet", "status", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_gone_workers_expire_from_fleet_status_and_fleet_prune_removes_them(run_kl, conn):
    from kilolock.store import fleet

    ids = {name: fleet.register_worker(conn, name, 1, 60.0)[0]
           for name in ("alive", "stopped-old", "lost-old", "draining-lost", "lost-busy", "stopped-new")}
    fleet.stop_worker(conn, ids["stopped-old"])
    fleet.stop_worker(conn, ids["stopped-new"])
    conn.execute("UPDATE fleet_workers SET status = 'draining' WHERE name = 'draining-lost'")
    # Their clocks: two days without a heartbeat, or (draining-lost) two minutes: past its lease.
    conn.execute("UPDATE fleet_workers SET heartbeat_at = now() - interval '2 days', stopped_at = now() - interval '2 days' "
                 "WHERE name IN ('stopped-old', 'lost-old', 'lost-busy')")
    conn.execute("UPDATE fleet_workers SET heartbeat_at = now() - interval '2 minutes' WHERE name = 'draining-lost'")
    add_states(conn.info.dsn, ["busy"], instances=1)
    fleet.enqueue_now(conn, "busy")
    assert len(fleet.claim(conn, ids["lost-busy"], 1, 60.0)) == 1
    conn.execute("UPDATE fleet_workers SET heartbeat_at = now() - interval '2 days' WHERE name = 'lost-busy'")

    shown = {w["name"]: w["state"] for w in _status(run_kl)["workers"]}
    # Lost for more than a day: hidden, except one still holding a job (its take-over is pending).
    assert shown == {"alive": "alive", "draining-lost": "lost", "lost-busy": "lost", "stopped-new": "stopped"}, shown
    table = run_kl("fleet", "status").stdout.decode()
    assert re.search(r"^draining-lost .* lost ", table, re.MULTILINE), table

    r = run_kl("fleet", "prune", "--older-than", "1d")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().splitlines()
    assert len(out) == 3 and out[-1] == "2 worker(s) removed (stopped or lost, no heartbeat for 1d00h)", out
    assert re.fullmatch(r"removed worker stopped-old \(.+, pid \d+, stopped, last heartbeat .+\)", out[0]), out
    assert re.fullmatch(r"removed worker lost-old \(.+, pid \d+, lost, last heartbeat .+\)", out[1]), out
    left = {r[0] for r in q(conn.info.dsn, "SELECT name FROM fleet_workers")}
    assert left == {"alive", "draining-lost", "lost-busy", "stopped-new"}
    r = run_kl("fleet", "prune", "--older-than", "1m")
    assert r.returncode == 0 and r.stdout.decode().splitlines()[-1].startswith("1 worker(s) removed"), r.stdout
    assert "removed worker draining-lost (" in r.stdout.decode() and ", lost, " in r.stdout.decode()
    r = run_kl("fleet", "prune", "--older-than", "soon")
    assert r.returncode == 2 and len(r.stderr.decode().splitlines()) == 2 and "--older-than" in r.stderr.decode()


def test_the_last_hour_counts_a_run_failed_by_a_take_over(run_kl, conn):
    from kilolock.store import fleet, refresh_runs, states, versions

    add_states(conn.info.dsn, ["s"], instances=1)
    sid = states.state_id(conn, "s")
    fleet.enqueue_now(conn, "s")
    dead, _ = fleet.register_worker(conn, "dead", 1, 30.0)
    [job] = fleet.claim(conn, dead, 1, 30.0)
    current = versions.current_version(conn, sid)
    assert current is not None
    with psycopg.connect(conn.info.dsn, autocommit=True) as run_conn:  # the dead worker's run
        refresh_runs.mark_fleet_job(run_conn, job.id)
        refresh_runs.begin(run_conn, sid, current.id, "dead@worker")
    conn.execute("UPDATE fleet_jobs SET lease_expires_at = now() - interval '1 second'")
    assert fleet.recover_expired(conn, 3) == [(job.id, "requeued")]
    queue = _status(run_kl)["queue"]
    assert (queue["failed_1h"], queue["taken_over_1h"]) == (1, 1), queue

    alive, _ = fleet.register_worker(conn, "alive", 1, 30.0)  # the job runs again and succeeds
    [job] = fleet.claim(conn, alive, 1, 30.0)
    assert fleet.finish_job(conn, job.id, alive, "succeeded", None, None)
    queue = _status(run_kl)["queue"]
    assert (queue["succeeded_1h"], queue["failed_1h"], queue["taken_over_1h"]) == (1, 1, 1), queue
    assert "last hour: 1 succeeded, 1 failed (1 taken over from a worker that stopped heartbeating)" in \
        run_kl("fleet", "status").stdout.decode()
    failed = [r for r in json.loads(run_kl("runs", "s", "--format", "json").stdout)["runs"] if r["status"] == "failed"]
    assert len(failed) == 1  # the count is that run


def test_schedule_list_says_overdue_and_that_no_worker_runs_and_remove_says_what_it_removed(run_kl, conn):
    from kilolock.store import fleet

    add_states(conn.info.dsn, ["prod/a"], instances=1)
    assert run_kl("schedule", "set", "--states", "prod/*", "--every", "1h").returncode == 0
    assert run_kl("schedule", "set", "--states", "later/*", "--cron", "0 0 1 1 *").returncode == 0
    conn.execute("UPDATE fleet_schedules SET next_run_at = now() - interval '3 hours' WHERE states_glob = 'prod/*'")
    out = run_kl("schedule", "list").stdout.decode().splitlines()
    assert "(overdue)" in out[1] and "(overdue)" not in out[2], out
    assert out[-1] == "no live worker: schedules fire only while one runs (start one: kl worker; kl fleet status shows them)"
    doc = json.loads(run_kl("schedule", "list", "--format", "json").stdout)
    assert doc["live_workers"] == 0 and [s["overdue"] for s in doc["schedules"]] == [True, False]
    fleet.register_worker(conn, "w", 1, 60.0)
    out = run_kl("schedule", "list").stdout.decode().splitlines()
    assert "no live worker" not in out[-1], out

    fleet.enqueue_due_schedules(conn, lambda sc, now: now)
    r = run_kl("schedule", "remove", "1")
    assert r.returncode == 0 and r.stdout.decode() == (
        "removed schedule 1: --states 'prod/*', every 1h00m; 1 queued job(s) dropped (running ones finish)\n"), r.stdout
    r = run_kl("schedule", "remove", "1")
    assert r.returncode == 1 and r.stdout == b"" and r.stderr.decode() == "kl: no schedule 1 (kl schedule list shows them)\n"
