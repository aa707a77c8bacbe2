"""The refresh-run figures /metrics reads (each state's last runs in refresh_run_last, its duration
histogram in refresh_run_durations) are those a recount of refresh_runs gives, whichever statement
finished or removed the runs: kl refresh's finish, the stale-run cleanup, a worker's take-over,
rows written directly, a state deleted with its runs. Keeping them never waits on a state's row."""
from __future__ import annotations

import psycopg
import pytest

from kilolock import tfstate
from kilolock.store import fleet, metrics, refresh_runs, states, versions, writes
from kilolock.store.migrate import apply_migrations, bundled_migrations
from kit import upgrade as upgradekit
from kit.states import build_state

# What /metrics computed from refresh_runs at each scrape before the figures were kept.
_RECOUNT_STATES = """
SELECT s.name,
       (SELECT extract(epoch FROM x.finished_at)::float8 FROM refresh_runs x
        WHERE x.state_id = s.id AND x.status = 'succeeded' ORDER BY x.finished_at DESC LIMIT 1),
       (SELECT x.status = 'succeeded' FROM refresh_runs x
        WHERE x.state_id = s.id AND x.finished_at IS NOT NULL ORDER BY x.started_at DESC LIMIT 1)
FROM states s ORDER BY s.name
"""
_BUCKET = "CASE " + " ".join(f"WHEN y.took <= interval '{b} seconds' THEN {i}"
                             for i, b in enumerate(metrics.DURATION_BUCKETS)) + f" ELSE {len(metrics.DURATION_BUCKETS)} END"
_RECOUNT_DURATIONS = f"""
SELECT y.status, {_BUCKET} AS bucket, count(*) AS runs, extract(epoch FROM sum(y.took))::float8 AS seconds
FROM (SELECT rr.status, rr.finished_at - rr.started_at AS took FROM refresh_runs rr WHERE rr.finished_at IS NOT NULL) y
GROUP BY 1, 2 ORDER BY 1, 2
"""


def _state(conn: psycopg.Connection, name: str) -> str:
    raw = build_state(1, {"a": {"id": "a", "triggers": None}}, lineage=f"l-{name}")
    writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="test")
    return states.state_id(conn, name)


def _assert_kept_as_recounted(conn: psycopg.Connection) -> None:
    figures = metrics.store_figures(conn)
    assert [(s.name, s.last_success, s.last_succeeded) for s in figures.states] == \
        conn.execute(_RECOUNT_STATES).fetchall()
    kept = conn.execute("SELECT status, bucket, sum(runs), extract(epoch FROM sum(took))::float8 FROM refresh_run_durations "
                        "GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert kept == conn.execute(_RECOUNT_DURATIONS).fetchall()
    assert not conn.execute("SELECT * FROM refresh_run_durations WHERE runs <= 0").fetchall()
    # Nothing kept for a state that has no finished run (or no longer exists).
    assert not conn.execute("""SELECT state_id FROM refresh_run_last UNION SELECT state_id FROM refresh_run_durations
                               EXCEPT SELECT state_id FROM refresh_runs WHERE finished_at IS NOT NULL""").fetchall()


def _dead_run(db_url: str, sid: str, job_id: int | None = None) -> str:
    """A run begun by a process that died before finishing it (its connection closed)."""
    with psycopg.connect(db_url, autocommit=True) as gone:
        current = versions.current_version(gone, sid)
        assert current is not None
        refresh_runs.mark_fleet_job(gone, job_id)
        return refresh_runs.begin(gone, sid, current.id, "gone")


def test_kept_figures_equal_a_recount_after_runs_of_every_outcome(conn, db_url):
    sids = {name: _state(conn, name) for name in ("ok", "broken", "stopped", "stale", "taken", "gone", "never")}
    _assert_kept_as_recounted(conn)  # no run yet: no figures
    for name, outcome in (("ok", "succeeded"), ("ok", "succeeded"), ("broken", "succeeded"), ("broken", "failed"),
                          ("stopped", "cancelled"), ("stale", "succeeded"), ("taken", "succeeded"),
                          ("gone", "failed")):
        current = versions.current_version(conn, sids[name])
        assert current is not None
        run = refresh_runs.begin(conn, sids[name], current.id, "test")
        _assert_kept_as_recounted(conn)  # a running run counts nowhere yet
        refresh_runs.finish(conn, run, status=outcome, checked=1, changed=0, failed=int(outcome == "failed"),
                            error_summary=None if outcome == "succeeded" else outcome, to_version_id=None)
        _assert_kept_as_recounted(conn)

    # The stale-run cleanup (kl runs --stale) finishes a dead process's run as failed.
    stale = _dead_run(db_url, sids["stale"])
    conn.execute("UPDATE refresh_runs SET started_at = now() - interval '45 seconds' WHERE id = %s", (stale,))
    assert refresh_runs.finish_stale(conn, sids["stale"], "test") == [stale]
    _assert_kept_as_recounted(conn)

    # A worker's take-over finishes the dead worker's run as failed at its last heartbeat, earlier
    # than the runs of that state begun before it ended.
    fleet.enqueue_now(conn, "taken")
    worker, _ = fleet.register_worker(conn, "dead", 1, 30.0)
    [job] = fleet.claim(conn, worker, 1, 30.0)
    taken = _dead_run(db_url, sids["taken"], job.id)
    conn.execute("UPDATE refresh_runs SET started_at = now() - interval '400 seconds' WHERE id = %s", (taken,))
    conn.execute("UPDATE fleet_jobs SET heartbeat_at = now() - interval '100 seconds', "
                 "lease_expires_at = now() - interval '10 seconds'")
    assert fleet.recover_expired(conn, 3) == [(job.id, "requeued")]
    assert conn.execute("SELECT status FROM refresh_runs WHERE id = %s", (taken,)).fetchone() == ("failed",)
    _assert_kept_as_recounted(conn)
    # The dead process's late outcome changes nothing: the take-over's finish stands.
    refresh_runs.finish(conn, taken, status="succeeded", checked=1, changed=0, failed=0, error_summary=None,
                        to_version_id=None)
    _assert_kept_as_recounted(conn)

    # Runs written or rewritten by any statement, several at once, and a state deleted with its runs.
    conn.execute("""INSERT INTO refresh_runs (state_id, from_version_id, started_at, finished_at, status)
                    SELECT v.state_id, v.id, now() - t.took, now(), t.status FROM state_versions v,
                    (VALUES (interval '0.5 seconds', 'failed'), (interval '1 day', 'succeeded'),
                            (interval '0.500001 seconds', 'cancelled')) t(took, status)""")
    _assert_kept_as_recounted(conn)
    conn.execute("UPDATE refresh_runs SET finished_at = finished_at + interval '7 seconds' WHERE status = 'failed'")
    _assert_kept_as_recounted(conn)
    conn.execute("UPDATE refresh_runs SET status = 'succeeded' WHERE status = 'cancelled'")
    _assert_kept_as_recounted(conn)
    states.delete_state(conn, sids["broken"])
    _assert_kept_as_recounted(conn)
    conn.execute("DELETE FROM refresh_runs")
    _assert_kept_as_recounted(conn)
    assert conn.execute("SELECT (SELECT count(*) FROM refresh_run_last), (SELECT count(*) FROM refresh_run_durations)"
                        ).fetchone() == (0, 0)


@pytest.mark.parametrize("position", range(len(metrics.DURATION_BUCKETS)))
def test_the_schemas_buckets_are_duration_buckets(conn, position):
    """A run exactly as long as a bound counts in that bound, one a microsecond longer in the next."""
    bound = metrics.DURATION_BUCKETS[position]
    assert conn.execute("SELECT kl_refresh_duration_bucket(make_interval(secs => %s)), "
                        "kl_refresh_duration_bucket(make_interval(secs => %s) + interval '1 microsecond')",
                        (bound, bound)).fetchone() == (position, position + 1)


def test_the_migration_counts_the_runs_recorded_before_it(empty_db_url):
    """A database as schema 0029 left it (finished runs of both outcomes, one left running) gets
    the figures a recount gives."""
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        apply_migrations(conn, upgradekit.released_migrations("0029"))
        upgradekit.load(conn, (upgradekit.FIXTURES / "schema-0029.sql").read_text(encoding="utf-8"))
        apply_migrations(conn, bundled_migrations())
        assert conn.execute("SELECT count(DISTINCT status) FROM refresh_runs WHERE finished_at IS NOT NULL").fetchone() == (2,)
        _assert_kept_as_recounted(conn)


@pytest.mark.parametrize("first", [True, False], ids=["first-finish", "later-finish"])
def test_finishing_a_run_never_waits_on_its_states_row(conn, db_url, first):
    """A commit holds its state's row FOR UPDATE; when its connection is cut, PostgreSQL may hold
    that lock until it notices the dead client. Recording the run's failure meanwhile must not
    wait on it: keeping the figures (the state's first finished run, or a later one) takes no lock
    on the state's row."""
    sid = _state(conn, "held")
    current = versions.current_version(conn, sid)
    assert current is not None
    if not first:
        earlier = refresh_runs.begin(conn, sid, current.id, "test")
        refresh_runs.finish(conn, earlier, status="succeeded", checked=1, changed=0, failed=0, error_summary=None,
                            to_version_id=None)
    run = refresh_runs.begin(conn, sid, current.id, "test")
    with psycopg.connect(db_url) as committing:
        committing.execute("SELECT id FROM states WHERE id = %s FOR UPDATE", (sid,))
        conn.execute("SET lock_timeout = '5s'")
        try:
            refresh_runs.finish(conn, run, status="failed", checked=1, changed=0, failed=1, error_summary="cut",
                                to_version_id=None)
        finally:
            conn.execute("RESET lock_timeout")
        committing.rollback()
    _assert_kept_as_recounted(conn)
