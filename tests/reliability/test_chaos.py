"""scripts/chaos.sh in CI: a short seeded run must find every invariant holding; and the invariant
checks it relies on must catch the breakage they exist for."""
from __future__ import annotations

import json
import subprocess

import psycopg

from kit.faults import fake_state
from kit.invariants import reindex_mismatches, running_runs, state_locks, version_problems
from kit.paths import REPO
from kit.pg import one_row


def test_chaos_script_short_run_holds_every_invariant(tmp_path, db_url):
    # db_url: the chaos run gets a fresh database on the session's server, not a cluster of its own.
    import os

    server = os.environ.get("KL_TEST_DATABASE_URL") or db_url
    summary = tmp_path / "chaos.json"
    r = subprocess.run(["bash", str(REPO / "scripts" / "chaos.sh"), "--runs", "10", "--seed", "7",
                        "--database-url", server, "--json", str(summary)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 2, f"chaos.sh lacks something it needs: {r.stderr}"
    assert r.returncode == 0, f"chaos.sh found violations:\n{r.stdout}\n{r.stderr[-3000:]}"
    doc = json.loads(summary.read_text())
    assert doc["ok"] and doc["runs"] == 10 and not doc["violations"], doc
    assert sum(sum(v.values()) for k, v in doc["outcomes"].items() if k != "recovery") == 10, doc["outcomes"]
    assert all(problems == [] for problems in doc["invariants"].values()), doc["invariants"]
    assert "chaos: OK" in r.stdout and "outcomes per fault" in r.stdout


def test_invariant_checks_catch_what_they_guard(run_kl, db_url):
    """The checks are only worth something if they fail: break each thing they guard, directly."""
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_echo"])).returncode == 0
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo"], serial=2)).returncode == 0
    assert reindex_mismatches(db_url, "prod") == [] and version_problems(db_url, "prod") == []
    with psycopg.connect(db_url) as c:
        # A lifecycle row whose attributes differ from its version's, and one that was never closed.
        c.execute("UPDATE resources SET attributes = '{\"id\": \"forged\"}' WHERE address = 'fake_echo.r0' AND delete_serial IS NULL")
        c.execute("UPDATE resources SET delete_serial = NULL, closed_by_version_id = NULL WHERE address = 'fake_echo.r1'")
    problems = reindex_mismatches(db_url, "prod")
    assert any("fake_echo.r0" in p for p in problems) and any("fake_echo.r1" in p for p in problems), problems
    with psycopg.connect(db_url) as c:
        # A version whose JSON is not a state, stored out of order; a run left running; a lock left.
        sid = one_row(c, "SELECT id FROM states WHERE name = 'prod'")[0]
        c.execute("""INSERT INTO state_versions (state_id, serial, lineage, source, raw_state, content_hash, created_at)
                     VALUES (%s, 0, 'x', 'apply', '{"version": 4, "serial": "zero"}', 'h', now() + interval '1 hour')""", (sid,))
        v = one_row(c, "SELECT id FROM state_versions WHERE serial = 2")[0]
        c.execute("INSERT INTO refresh_runs (state_id, from_version_id) VALUES (%s, %s)", (sid, v))
        c.execute("INSERT INTO state_locks (state_id, lock_id, operation, who, info) VALUES (%s, 'l', 'OperationTypeRefresh', 'w', '{}')", (sid,))
        # An observation that does not carry its base's serial (its document is its base's).
        c.execute("""INSERT INTO state_versions (state_id, serial, lineage, source, content_hash, kind, base_version_id,
                                                 observation_number)
                     VALUES (%s, 7, 'fake-lineage', 'refresh', 'h', 'observation', %s, 1)""", (sid, v))
    vp = version_problems(db_url, "prod")
    assert any("serial 0 stored after serial 2" in p for p in vp) and any("v0 does not parse" in p for p in vp), vp
    assert any("v7.1 is based on terraform v2" in p for p in vp) and any("v7.1 holds serial 2" in p for p in vp), vp
    assert len(running_runs(db_url)) == 1 and len(state_locks(db_url)) == 1
